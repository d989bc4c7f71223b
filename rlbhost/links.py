"""What a GPU agent reads of its own links through netlink (sysfs shows the namespace it was
mounted in, not necessarily the agent's): carrier, and the MAC of the next hop on a port."""
from __future__ import annotations

import contextlib
import socket

from pyroute2 import IPRoute

SO_BINDTODEVICE = 25


def has_carrier(link) -> bool:
    """A link message (RTM_NEWLINK, or get_links()): up and with carrier."""
    return link.get_attr("IFLA_CARRIER") == 1 and bool(link["flags"] & 1)


def neighbour_macs(want: dict, live: dict[str, bool]) -> dict:
    """{key: MAC} for want = {key: (port, IPv6 address of the next hop on it)}, from the
    neighbour table; an address not there yet is asked for (a datagram to it out of that port
    makes the kernel solicit it) when the port is live, and is found on a later call."""
    if not want:
        return {}
    with IPRoute() as ipr:
        index = {name: (ipr.link_lookup(ifname=name) or [None])[0] for name, _ in want.values()}
        table = {(n.get_attr("NDA_DST"), n["ifindex"]): n.get_attr("NDA_LLADDR")
                 for n in ipr.get_neighbours(family=socket.AF_INET6) if n.get_attr("NDA_LLADDR")}
    out = {}
    for key, (port, addr) in want.items():
        mac = table.get((addr, index.get(port)))
        if mac:
            out[key] = mac
        elif live.get(port):
            with socket.socket(socket.AF_INET6, socket.SOCK_DGRAM) as s, contextlib.suppress(OSError):
                s.setsockopt(socket.SOL_SOCKET, SO_BINDTODEVICE, port.encode())
                s.sendto(b"", (f"{addr}%{port}" if addr.startswith("fe80:") else addr, 9))
    return out
