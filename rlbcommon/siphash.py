"""SipHash-2-4 (Aumasson and Bernstein, 2012): a keyed MAC short enough to compute inside a BPF
program, which is why the plane probes use it (bpf/lib/siphash.h computes the same function). A
64-bit tag over a few words: what a probe answer needs to prove it came from a kernel that holds
the fabric's key, not a cryptographic signature."""
from __future__ import annotations

import struct

M64 = (1 << 64) - 1


def siphash24(key: bytes, msg: bytes) -> int:
    """The rounds are written out with local names only: a GPU agent checks every probe answer
    (1400 a second in the 8-GPU lab), and calls per rotation tripled the cost (60 us -> 20)."""
    if len(key) != 16:
        raise ValueError("SipHash takes a 16-byte key")
    k0, k1 = struct.unpack("<QQ", key)
    v0, v1 = k0 ^ 0x736F6D6570736575, k1 ^ 0x646F72616E646F6D
    v2, v3 = k0 ^ 0x6C7967656E657261, k1 ^ 0x7465646279746573
    full = len(msg) // 8 * 8
    words = [m for (m,) in struct.iter_unpack("<Q", msg[:full])]
    words.append((len(msg) & 0xFF) << 56 | int.from_bytes(msg[full:], "little"))
    # each message word: 2 rounds between xors into v3 and v0; then the finalisation: 4 rounds
    # after v2 ^= 0xFF (None below). One copy of the round, with local names only
    for m, n in [*((m, 2) for m in words), (None, 4)]:
        if m is None:
            v2 ^= 0xFF
        else:
            v3 ^= m
        for _ in range(n):
            v0 = (v0 + v1) & M64; v1 = ((v1 << 13) | (v1 >> 51)) & M64 ^ v0             # noqa: E702
            v0 = ((v0 << 32) | (v0 >> 32)) & M64                                          # noqa: E702
            v2 = (v2 + v3) & M64; v3 = ((v3 << 16) | (v3 >> 48)) & M64 ^ v2             # noqa: E702
            v0 = (v0 + v3) & M64; v3 = ((v3 << 21) | (v3 >> 43)) & M64 ^ v0             # noqa: E702
            v2 = (v2 + v1) & M64; v1 = ((v1 << 17) | (v1 >> 47)) & M64 ^ v2             # noqa: E702
            v2 = ((v2 << 32) | (v2 >> 32)) & M64                                          # noqa: E702
        if m is not None:
            v0 ^= m
    return v0 ^ v1 ^ v2 ^ v3
