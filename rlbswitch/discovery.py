"""A leaf's neighbour discovery: the link-local address of the peer on each uplink, found by an
echo request to all-nodes on the port and the source of the reply that comes back on that port
(not whatever the neighbour table holds); a peer that ignores echoes to a multicast address (a
switch of another make, net.ipv6.icmp.echo_ignore_multicast) is found as the standard unnumbered
BGP does, by its router advertisement, asked for with a router solicitation. bird2's BGP on
link-local needs it (one active side with a known neighbour address)."""
from __future__ import annotations

import contextlib
import logging
import os
import socket
import struct
import time

from rlbfabric.base import Node, SwitchedFabric

from .dataplane import DataplaneError, SwitchDataplane

log = logging.getLogger("rlbswitch.birdsync")


def echo_peer(ifname: str, ifindex: int, own: set[str], timeout: float = 0.3) -> str | None:
    """Who else answers an ICMPv6 echo request to all-nodes on this port (its link-local source),
    or None. Our own answer (multicast loopback) is not a peer."""
    ident = os.getpid() & 0xFFFF
    with socket.socket(socket.AF_INET6, socket.SOCK_RAW, socket.IPPROTO_ICMPV6) as s:
        s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_MULTICAST_LOOP, 0)
        with contextlib.suppress(OSError):
            s.setsockopt(socket.SOL_SOCKET, socket.SO_BINDTODEVICE, ifname.encode())
        s.settimeout(timeout)
        try:
            s.sendto(struct.pack("!BBHHH", 128, 0, 0, ident, 1), ("ff02::1", 0, 0, ifindex))
        except OSError:
            return None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                data, (src, _, _, scope) = s.recvfrom(1500)
            except (socket.timeout, OSError):
                return None
            src = src.split("%")[0]
            if (len(data) >= 8 and data[0] == 129 and struct.unpack("!H", data[4:6])[0] == ident
                    and scope == ifindex and src.lower().startswith("fe80:") and src not in own):
                return src
    return None


ICMP6_RS, ICMP6_RA = 133, 134
IPV6_RECVHOPLIMIT, IPV6_HOPLIMIT = 51, 52       # linux/in6.h (not in Python's socket module)


def router_peer(ifname: str, ifindex: int, own: set[str], timeout: float = 0.5) -> str | None:
    """Who sends a router advertisement on this port when asked (a router solicitation to
    all-routers): its link-local source, or None. RFC 4861 both ways: the solicitation leaves with
    hop limit 255 and an advertisement counts only if it arrived with 255 (it was not routed)."""
    with socket.socket(socket.AF_INET6, socket.SOCK_RAW, socket.IPPROTO_ICMPV6) as s:
        s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_MULTICAST_LOOP, 0)
        s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_MULTICAST_HOPS, 255)
        s.setsockopt(socket.IPPROTO_IPV6, IPV6_RECVHOPLIMIT, 1)
        with contextlib.suppress(OSError):
            s.setsockopt(socket.SOL_SOCKET, socket.SO_BINDTODEVICE, ifname.encode())
        s.settimeout(timeout)
        try:
            s.sendto(struct.pack("!BBHI", ICMP6_RS, 0, 0, 0), ("ff02::2", 0, 0, ifindex))
        except OSError:
            return None
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            s.settimeout(left)
            try:
                data, anc, _, (src, _, _, scope) = s.recvmsg(1500, socket.CMSG_SPACE(4))
            except (socket.timeout, OSError):
                return None
            hops = next((struct.unpack("i", d[:4])[0] for level, kind, d in anc
                         if level == socket.IPPROTO_IPV6 and kind == IPV6_HOPLIMIT), None)
            src = src.split("%")[0]
            if (len(data) >= 16 and data[0] == ICMP6_RA and hops == 255 and scope == ifindex
                    and src.lower().startswith("fe80:") and src not in own):
                return src
    return None


class NeighbourDiscovery:
    def __init__(self, dp: SwitchDataplane, fabric: SwitchedFabric, node: Node):
        self.dp, self.fabric, self.node = dp, fabric, node
        self.found: dict[str, str] = {}          # uplink's BGP name -> the peer that answered on it

    def discover(self) -> dict[str, str]:
        """The peer on each uplink; a port with no answer keeps what was found before."""
        for port in self.fabric.ports_up(self.node):
            try:
                ifindex = self.dp.ifindex(port.ifname)
            except DataplaneError:
                continue
            with self.dp.netlink() as ipr:
                own = {a.get_attr("IFA_ADDRESS") for a in ipr.get_addr(family=socket.AF_INET6, index=ifindex)}
            addr, how = echo_peer(port.ifname, ifindex, own), "answered an echo"
            if not addr and port.bgp_name not in self.found:
                addr, how = router_peer(port.ifname, ifindex, own), "advertised itself as a router"
            if addr and self.found.get(port.bgp_name) != addr:
                log.info("%s: peer %s %s on %s", port.bgp_name, addr, how, port.ifname)
                self.found[port.bgp_name] = addr
        return dict(self.found)
