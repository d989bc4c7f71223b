"""SipHash-2-4 (Aumasson and Bernstein, 2012): a keyed MAC short enough to compute inside a BPF
program, which is why the plane probes use it (bpf/lib/siphash.h computes the same function). A
64-bit tag over a few words: what a probe answer needs to prove it came from a kernel that holds
the fabric's key, not a cryptographic signature."""
from __future__ import annotations

import struct

M64 = (1 << 64) - 1


def _rotl(x: int, b: int) -> int:
    return ((x << b) | (x >> (64 - b))) & M64


def siphash24(key: bytes, msg: bytes) -> int:
    if len(key) != 16:
        raise ValueError("SipHash takes a 16-byte key")
    k0, k1 = struct.unpack("<QQ", key)
    v0, v1 = k0 ^ 0x736F6D6570736575, k1 ^ 0x646F72616E646F6D
    v2, v3 = k0 ^ 0x6C7967656E657261, k1 ^ 0x7465646279746573

    def rounds(n):
        nonlocal v0, v1, v2, v3
        for _ in range(n):
            v0 = (v0 + v1) & M64; v1 = _rotl(v1, 13) ^ v0; v0 = _rotl(v0, 32)   # noqa: E702
            v2 = (v2 + v3) & M64; v3 = _rotl(v3, 16) ^ v2                       # noqa: E702
            v0 = (v0 + v3) & M64; v3 = _rotl(v3, 21) ^ v0                       # noqa: E702
            v2 = (v2 + v1) & M64; v1 = _rotl(v1, 17) ^ v2; v2 = _rotl(v2, 32)   # noqa: E702

    full = len(msg) // 8 * 8
    for (m,) in struct.iter_unpack("<Q", msg[:full]):
        v3 ^= m
        rounds(2)
        v0 ^= m
    b = (len(msg) & 0xFF) << 56 | int.from_bytes(msg[full:], "little")
    v3 ^= b
    rounds(2)
    v0 ^= b
    v2 ^= 0xFF
    rounds(4)
    return v0 ^ v1 ^ v2 ^ v3
