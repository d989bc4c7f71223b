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

from pyroute2.netlink.rtnl import RTMGRP_IPV6_IFADDR, RTMGRP_LINK, RTMGRP_NEIGH
from pyroute2.netlink.rtnl.ifaddrmsg import IFA_F_DADFAILED, IFA_F_TENTATIVE

from rlbcommon.health import Health
from rlbcommon.runtime import AgentRuntime

from .dataplane import NUD_USABLE, SwitchDataplane
from rlbfabric.routes import Route

log = logging.getLogger(__name__)


def usable_link_local(msg) -> bool:
    """An address event for an IPv6 link-local address the kernel will send from (DAD done)."""
    addr = msg.get_attr("IFA_ADDRESS")
    flags = msg.get_attr("IFA_FLAGS") or msg["flags"]
    return (msg["family"] == socket.AF_INET6 and bool(addr)
            and ipaddress.IPv6Address(addr).is_link_local
            and not flags & (IFA_F_TENTATIVE | IFA_F_DADFAILED))


class Watcher:
    def __init__(self, dp: SwitchDataplane, health: Health | None = None,
                 reattach: dict[str, dict] | None = None, runtime: AgentRuntime | None = None):
        """reattach: {port name: dp.attach options} of the ports the agent runs on: one removed
        and made again (a re-created link, a replaced NIC) gets the program back; without this
        it was removed for good. runtime: the agent's (its health and stop); else one of its own."""
        self.dp = dp
        self.reattach = reattach or {}
        self.runtime = runtime or AgentRuntime(log, health or Health())
        self.health, self.stop = self.runtime.health, self.runtime.stop
        self.events = 0

    def resync_links(self):
        """Bring port liveness in line with the kernel (the liveness follower's share): one dump
        of the links, read against every port."""
        with self.dp.netlink() as ipr:
            links = {link["index"]: link for link in ipr.get_links()}
        attached = {p.ifindex for p in self.dp.ports()}
        for index, link in links.items():
            if link.get_attr("IFLA_IFNAME") in self.reattach and index not in attached:
                self._reattach(link)
        for p in self.dp.ports():
            link = links.get(p.ifindex)
            if link is None:        # removed while we were not looking
                if self.dp.remove_port(p.ifindex):
                    log.warning("port %s (ifindex %d) is gone: removed", p.ifname, p.ifindex)
                continue
            up = self.dp._link_up(link)
            if self.dp.set_port_up(p.ifindex, up, link.get_attr("IFLA_MTU")):
                log.info("port %s is %s", p.ifname, "up" if up else "down")
            if up:      # a flap lost with the events still flushed its neighbours: ask again
                self.resolve(p.ifindex)

    def resync_neighbours(self):
        """Bring addresses and neighbours in line with the kernel (the neighbour follower's
        share). Only the thread that applies neighbour events may apply a snapshot of them: a
        snapshot applied from elsewhere can land after a newer event and undo it."""
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
        with self.dp.netlink() as ipr:
            addrs = ipr.get_addr(family=socket.AF_INET6)
        for a in addrs:
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
            # only what addresses made: an operator's own connected or local route stays
            if e["mode"] in ("connected", "local") and prefix not in want and e.get("owner") == "kernel":
                self.dp.del_route(prefix)

    def on_links(self, msgs: list):
        """One batch of link events. Liveness is a level, not an edge: only each port's last
        state is applied, so a storm costs one map write per port per batch, not per event.
        A down then up inside the batch still means the carrier loss flushed the port's
        neighbours, so its next hops are resolved again."""
        last, flapped = {}, set()
        for msg in msgs:
            if msg["event"] not in ("RTM_NEWLINK", "RTM_DELLINK"):
                continue
            if msg["event"] == "RTM_DELLINK" or not self.dp._link_up(msg):
                flapped.add(msg["index"])
            last[msg["index"]] = msg
        for index, msg in last.items():
            self.guarded("liveness", self.on_link, msg, index in flapped)

    def on_link(self, msg, flapped: bool = False):
        if msg["event"] == "RTM_DELLINK":
            if self.dp.remove_port(msg["index"]):
                log.warning("port %s is gone: removed, its next hops unusable",
                            msg.get_attr("IFLA_IFNAME"))
            return
        if msg.get_attr("IFLA_IFNAME") in self.reattach and self.dp.port_slot(msg["index"]) is None:
            self._reattach(msg)
            return
        up = self.dp._link_up(msg)
        changed = self.dp.set_port_up(msg["index"], up, msg.get_attr("IFLA_MTU"))
        if changed:
            log.info("port %s is %s", msg.get_attr("IFLA_IFNAME"), "up" if up else "down")
        if up and (changed or flapped):   # carrier loss flushed its neighbours: resolve again now
            self.resolve(msg["index"])

    def _reattach(self, link):
        name = link.get_attr("IFLA_IFNAME")
        self.dp.attach(name, **self.reattach[name])
        log.warning("port %s is back (ifindex %d): program attached again", name, link["index"])
        if self.dp._link_up(link):
            self.resolve(link["index"])

    def resolve(self, ifindex: int, gateways: list[str] | None = None):
        gateways = self.dp.tables.gateways(ifindex) if gateways is None else gateways
        if gateways:                # none on a port no next hop uses, or on no port at all
            ifname = self.dp.ifname(ifindex)
            for gw in gateways:
                self.dp.solicit(ifname, gw)

    def on_others(self, msgs: list):
        """One batch of neighbour and address events: each neighbour's last state, and the
        addresses read once if any changed (a storm of 500 neighbours is 500 writes at most).
        A port's link-local address becoming usable resolves its next hops again: the kernel
        gives a port that comes up its link-local address only after the carrier event, and
        until then it refuses to send from it (EADDRNOTAVAIL), so the solicitation made for
        the carrier event may have gone nowhere."""
        neighbours, addresses, sources = {}, False, set()
        for msg in msgs:
            if msg["event"] in ("RTM_NEWNEIGH", "RTM_DELNEIGH"):
                dst = msg.get_attr("NDA_DST")
                if dst and msg["family"] == socket.AF_INET6:
                    neighbours[(msg["ifindex"], dst)] = msg
            elif msg["event"] in ("RTM_NEWADDR", "RTM_DELADDR"):
                addresses = True
                if msg["event"] == "RTM_NEWADDR" and usable_link_local(msg):
                    sources.add(msg["index"])
        for msg in neighbours.values():
            self.guarded("neighbours", self.on_neighbour, msg)
        if addresses:
            self.guarded("neighbours", self.sync_addresses)
        for index in sources:
            self.guarded("neighbours", self.resolve, index)

    def on_neighbour(self, msg):
        event, dst = msg["event"], msg.get_attr("NDA_DST")
        mac = msg.get_attr("NDA_LLADDR")
        usable = event == "RTM_NEWNEIGH" and msg["state"] & NUD_USABLE and mac
        if self.dp.update_neighbour(msg["ifindex"], dst, mac if usable else None):
            log.debug("neighbour %s on %d: %s", dst, msg["ifindex"], mac if usable else "gone")
            if event == "RTM_DELNEIGH" and dst in self.dp.tables.gateways(msg["ifindex"]):
                self.resolve(msg["ifindex"], [dst])    # a next hop needs it: ask again

    def guarded(self, name: str, fn, *args):
        """One bad event must not stop the watcher: counted in the loop's health, logged."""
        try:
            fn(*args)
        except Exception as e:
            self.health.failed(name, e, log, ())

    def _counted(self, handler):
        """A follower's batch: counted, applied; the state is never read again for it (each
        handler applies what the messages say, and asks the kernel itself where it must)."""
        def changed(msgs) -> bool:
            self.events += len(msgs)
            handler(msgs)
            return False
        return changed

    def run(self):
        """Follow netlink until stop is set, each follower on the agent's runtime (its own
        socket and thread, liveness first: resolving needs it). Every (re)bind is followed by a
        resync of that follower's share from the kernel, in its thread, so a change made
        meanwhile arrives as an event and a snapshot cannot overtake a newer one; a socket that
        fails (ENOBUFS: events dropped in a storm) is bound again by the supervisor. Returns
        False when a follower cannot resume (the agent exits for a restart)."""
        followers = [(RTMGRP_LINK, self.on_links, self.resync_links, "liveness"),
                     (RTMGRP_NEIGH | RTMGRP_IPV6_IFADDR, self.on_others, self.resync_neighbours, "neighbours")]
        fatal = self.runtime.supervisor.fatal
        for groups, handler, resync, name in followers:
            ready = threading.Event()
            self.runtime.follow(name, groups, self._counted(handler), resync, ready)
            while not ready.wait(0.5):
                if fatal.is_set() or self.stop.is_set():
                    return self.stop.is_set()
        log.info("following links, neighbours and addresses")
        while not self.stop.is_set() and not fatal.is_set():
            self.stop.wait(0.5)
        return self.stop.is_set()       # False: a follower cannot resume, which must not pass unnoticed
