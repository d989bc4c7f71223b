"""Netlink follower: port liveness, neighbour MACs and connected/local routes, in milliseconds.

Liveness has its own netlink socket and thread: on a carrier loss the kernel first flushes
the port's neighbours, and a link event must not wait behind that work. The watcher keeps
no state of its own; each event is applied to the pinned maps, so a restarted watcher
resynchronises from the kernel and carries on."""
from __future__ import annotations

import ipaddress
import logging
import socket
import threading

from pyroute2 import IPRoute
from pyroute2.netlink.rtnl import RTMGRP_IPV6_IFADDR, RTMGRP_LINK, RTMGRP_NEIGH

from rlbcommon.health import Health

from .dataplane import NUD_USABLE, SwitchDataplane
from rlbfabric.routes import Route

log = logging.getLogger(__name__)


class Watcher:
    def __init__(self, dp: SwitchDataplane, health: Health | None = None):
        self.dp = dp
        self.health = health or Health()
        self.stop = threading.Event()
        self.events = 0
        self.errors = 0

    def resync(self):
        """Bring the maps in line with the kernel: links, addresses, neighbours."""
        for p in self.dp.ports():
            try:
                links = self.dp.ipr.get_links(p.ifindex)
            except Exception:       # ENODEV: removed while we were not looking
                links = []
            if not links:
                if self.dp.remove_port(p.ifindex):
                    log.warning("port %s (ifindex %d) is gone: removed", p.ifname, p.ifindex)
                continue
            up = self.dp._link_up(links[0])
            if self.dp.set_port_up(p.ifindex, up, links[0].get_attr("IFLA_MTU")):
                log.info("port %s is %s", p.ifname, "up" if up else "down")
        self.sync_addresses()
        self.dp.sync_neighbours()
        for p in self.dp.ports():
            if p.up:
                self.resolve(p.ifindex)    # next hops whose neighbour a flap flushed

    def sync_addresses(self):
        """A global address on an attached port means: its prefix is connected there and the
        address itself is local (the kernel answers it)."""
        ports = {p.ifindex: p.ifname for p in self.dp.ports()}
        want: dict[str, Route] = {}
        for a in self.dp.ipr.get_addr(family=socket.AF_INET6):
            if a["index"] not in ports:
                continue
            addr = ipaddress.IPv6Address(a.get_attr("IFA_ADDRESS"))
            if addr.is_link_local or addr.is_multicast:
                continue
            net = ipaddress.IPv6Network(f"{addr}/{a['prefixlen']}", strict=False)
            want[f"{addr}/128"] = Route(f"{addr}/128", "local")
            if net.prefixlen < 128:
                want[str(net)] = Route(net, "connected", dev=ports[a["index"]])
        routes = {e["prefix"]: e for e in self.dp.routes()}
        for prefix, route in want.items():
            e = routes.get(prefix)
            if e is not None and e["mode"] not in ("connected", "local"):
                continue  # an operator route of another mode owns this prefix
            if e is None or e["mode"] != route.mode or e.get("dev") != route.dev:
                self.dp.add_route(route, owner="kernel")
        for prefix, e in routes.items():
            if e["mode"] in ("connected", "local") and prefix not in want:
                self.dp.del_route(prefix)

    def on_link(self, msg):
        if msg["event"] == "RTM_DELLINK":
            if self.dp.remove_port(msg["index"]):
                log.warning("port %s is gone: removed, its next hops unusable",
                            msg.get_attr("IFLA_IFNAME"))
            return
        up = self.dp._link_up(msg)
        if self.dp.set_port_up(msg["index"], up, msg.get_attr("IFLA_MTU")):
            log.info("port %s is %s", msg.get_attr("IFLA_IFNAME"), "up" if up else "down")
            if up:      # carrier loss flushed its neighbours: resolve the next hops again now
                self.resolve(msg["index"])

    def resolve(self, ifindex: int, gateways: list[str] | None = None):
        ifname = self.dp.ifname(ifindex)
        for gw in gateways if gateways is not None else self.dp.tables.gateways(ifindex):
            self.dp.solicit(ifname, gw)

    def on_other(self, msg):
        event = msg["event"]
        if event in ("RTM_NEWNEIGH", "RTM_DELNEIGH"):
            dst = msg.get_attr("NDA_DST")
            if not dst or msg["family"] != socket.AF_INET6:
                return
            mac = msg.get_attr("NDA_LLADDR")
            usable = event == "RTM_NEWNEIGH" and msg["state"] & NUD_USABLE and mac
            if self.dp.update_neighbour(msg["ifindex"], dst, mac if usable else None):
                log.debug("neighbour %s on %d: %s", dst, msg["ifindex"], mac if usable else "gone")
                if event == "RTM_DELNEIGH" and dst in self.dp.tables.gateways(msg["ifindex"]):
                    self.resolve(msg["ifindex"], [dst])    # a next hop needs it: ask again
        elif event in ("RTM_NEWADDR", "RTM_DELADDR"):
            self.sync_addresses()

    def _follow(self, groups: int, handler, ready: threading.Event, name: str):
        """Apply netlink events as they come. If the socket fails (ENOBUFS: events were dropped
        in a storm), bind a new one and resynchronise from the kernel, so nothing is missed."""
        while not self.stop.is_set():
            try:
                with IPRoute() as mon:
                    mon.bind(groups=groups)
                    if ready.is_set():
                        self.resync()          # after a failure: whatever was missed
                    ready.set()
                    while not self.stop.is_set():
                        for msg in mon.get():
                            self.events += 1
                            try:
                                handler(msg)
                            except Exception as e:  # one bad event must not stop the watcher
                                self.health.failed(name, e, log, ())
                        self.health.ok(name)
            except Exception as e:     # the socket itself (ENOBUFS): rebind and resynchronise
                self.errors += 1
                self.health.failed(name, e, log)
                self.stop.wait(0.05)

    def run(self):
        """Follow netlink until stop is set (liveness in a thread of its own)."""
        ready = threading.Event()
        links = threading.Thread(target=self._follow, args=(RTMGRP_LINK, self.on_link, ready, "liveness"),
                                 name="liveness", daemon=True)
        links.start()
        ready.wait()
        bound = threading.Event()
        rest = threading.Thread(target=self._follow, name="neighbours",
                                args=(RTMGRP_NEIGH | RTMGRP_IPV6_IFADDR, self.on_other, bound, "neighbours"),
                                daemon=True)
        rest.start()
        bound.wait()
        self.resync()   # after binding, so nothing that changes meanwhile is missed
        log.info("following links, neighbours and addresses")
        while not self.stop.is_set() and links.is_alive() and rest.is_alive():
            self.stop.wait(0.5)
        return self.stop.is_set()       # False: a follower died, which must not pass unnoticed
