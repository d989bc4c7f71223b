"""The address plan, all of it: one /64 per fabric path, the paths differing in one hextet (the
path field).

    <prefix>:<leaf>:<port>:<path>::/64     fc00:1:1:1::/64 .. fc00:1:1:4::/64 -> field 3, values 1..4

A host's address on path k is its base address with the path field set to k (SLAAC keeps the
interface ID), and so is its peer's. Leaf and port are written as decimal digits (read as hex
they stay distinct); the path is written in hex so that the field's value is the path number."""
from __future__ import annotations

import ipaddress
from typing import Iterable

IPv6 = ipaddress.IPv6Address
PATH_FIELD = 3            # the hextet that numbers the paths in this plan


def host_prefix(prefix: str, leaf: int, port: int, path: int) -> ipaddress.IPv6Network:
    """The /64 of path `path` on host port `port` of leaf `leaf` (all 1-based)."""
    return ipaddress.IPv6Network(f"{prefix}:{leaf}:{port}:{path:x}::/64")


def port_prefix(prefix: str, leaf: int, port: int) -> ipaddress.IPv6Network:
    """Every path's /64 of one host port (a NIC): what its addresses are sourced from."""
    return ipaddress.IPv6Network(f"{prefix}:{leaf}:{port}::/48")


def leaf_prefix(prefix: str, leaf: int) -> ipaddress.IPv6Network:
    """Every host prefix behind one leaf."""
    return ipaddress.IPv6Network(f"{prefix}:{leaf}::/32")


def hextets(addr) -> list[int]:
    b = IPv6(addr).packed
    return [int.from_bytes(b[i:i + 2], "big") for i in range(0, 16, 2)]


def field_value(addr, field: int) -> int:
    return hextets(addr)[field]


def with_field(addr, field: int, value: int) -> IPv6:
    h = hextets(addr)
    h[field] = value
    return IPv6(b"".join(x.to_bytes(2, "big") for x in h))


def detect_field(prefixes: Iterable[ipaddress.IPv6Network]) -> int | None:
    """The one hextet of the /64 prefixes that differs between them (None if fewer than two
    prefixes, ValueError if they differ in more than one hextet)."""
    nets = sorted({ipaddress.IPv6Network(p) for p in prefixes})
    if len(nets) < 2:
        return None
    first = hextets(nets[0].network_address)[:4]
    differing = {i for n in nets[1:] for i, (a, b) in enumerate(zip(first, hextets(n.network_address)[:4]))
                 if a != b}
    if len(differing) != 1:
        raise ValueError(f"prefixes {', '.join(map(str, nets))} differ in hextets {sorted(differing)}: "
                         "give the path field explicitly (--path-field)")
    return differing.pop()


def eui64(mac: str) -> str:
    """Interface ID from a MAC, as SLAAC builds it (U/L bit flipped, ff:fe inserted)."""
    b = bytearray(int(x, 16) for x in mac.split(":"))
    b[0] ^= 0x02
    iid = bytes(b[:3]) + b"\xff\xfe" + bytes(b[3:])
    return ":".join(iid[i:i + 2].hex() for i in range(0, 8, 2))
