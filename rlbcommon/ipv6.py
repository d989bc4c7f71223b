"""IPv6 addresses as text, read fast: a collective's reports name tens of thousands of them, and
ipaddress's own parser costs about 15 us each against inet_pton's 1 us."""
from __future__ import annotations

import ipaddress
import socket


def ipv6_packed(text: str) -> bytes:
    """The address's 16 bytes (ValueError as ipv6_int's when it is not one)."""
    try:
        return socket.inet_pton(socket.AF_INET6, text)
    except (OSError, TypeError):
        return ipv6_int(text).to_bytes(16, "big")


def ipv6_int(text: str) -> int:
    """The address as an integer; ValueError (ipaddress's, which says why) when it is not one."""
    if not isinstance(text, str):              # ipaddress would take a number as an address
        raise ValueError(f"{text!r} is not an IPv6 address (not text)")
    try:
        return int.from_bytes(socket.inet_pton(socket.AF_INET6, text), "big")
    except OSError:                            # inet_pton is strict and terse: ipaddress explains
        a = ipaddress.IPv6Address(text)
        if a.scope_id:                         # a zone names a link, not a host of the fabric
            raise ValueError(f"{text!r}: a scoped address") from None
        return int(a)


class Net(ipaddress.IPv6Network):
    """An IPv6Network that computes its hash once: a switch's route model keys several tables by
    each prefix (ipaddress computes it from two integers on every lookup). Equal to, and hashed
    as, the IPv6Network of the same prefix."""

    def __hash__(self):
        try:
            return self._hash
        except AttributeError:
            self._hash = h = super().__hash__()
            return h

    def __repr__(self):
        return f"IPv6Network('{self}')"


def ipv6_network(text: str) -> Net:
    """ipaddress.IPv6Network(text), strict, at a third of its cost for the usual "addr/len" form
    (a leaf's table is tens of thousands of prefixes); anything else, and every error, is
    ipaddress's own."""
    addr, slash, length = text.partition("/") if isinstance(text, str) else ("", "", "")
    if slash and length.isascii() and length.isdigit() and len(length) <= 3:
        try:
            return Net((ipv6_int(addr), int(length)))
        except ValueError:
            pass
    return Net(text)


def network_text(net: ipaddress.IPv6Network) -> str:
    """str(net) at a tenth of its cost: inet_ntop writes the same RFC 5952 text, except for the
    IPv4-embedded forms (the first 80 bits zero), which are left to ipaddress."""
    packed = net.network_address.packed
    if not packed.startswith(bytes(10)):
        return f"{socket.inet_ntop(socket.AF_INET6, packed)}/{net.prefixlen}"
    return str(net)
