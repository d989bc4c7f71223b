"""A leaf's neighbour discovery: the link-local address of the peer on each uplink, found by an
echo request to all-nodes on the port and the source of the reply that comes back on that port
(not whatever the neighbour table holds). bird2's BGP on link-local needs it (one active side
with a known neighbour address)."""
from __future__ import annotations

import contextlib
import logging
import os
import socket
import struct
import time

from rlbfabric.base import Fabric, Node

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


class NeighbourDiscovery:
    def __init__(self, dp: SwitchDataplane, fabric: Fabric, node: Node):
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
            addr = echo_peer(port.ifname, ifindex, own)
            if addr and self.found.get(port.bgp_name) != addr:
                log.info("%s: peer %s answered on %s", port.bgp_name, addr, port.ifname)
                self.found[port.bgp_name] = addr
        return dict(self.found)
