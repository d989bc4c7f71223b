"""A leaf tells the fabric coordinator which of its uplinks are up: at once when one changes, and
every few seconds anyway (a restarted coordinator learns the state within that time). The kernel's
view is followed (IFF_UP and carrier, from link events), so it holds whether or not XDP forwards.
It used to dump every link ten times a second: a tenth of a core per leaf, idle."""
from __future__ import annotations

import json
import logging
import ssl
import threading
from typing import Callable

from pyroute2 import IPRoute
from pyroute2.netlink.rtnl import RTM_DELLINK, RTM_NEWLINK, RTMGRP_LINK

from rlbcommon import coordapi
from rlbcommon.etcd import Etcd, EtcdError, EtcdUnavailable
from rlbcommon.nlmsg import link_up
from rlbcommon.runtime import AgentRuntime
from rlbfabric.kinds.clos import ClosFabric
from rlbcoord import keys

log = logging.getLogger(__name__)


class HttpUplinks:
    """The coordinator's HTTP API: every refresh is a report."""

    def __init__(self, url: str, node: str, tls: ssl.SSLContext | None = None):
        self.url, self.node, self.tls = url, node, tls

    def __call__(self, state: dict[str, bool]):
        coordapi.call(self.url, coordapi.LINKS.format(self.node), {"ports": state}, tls=self.tls)


class EtcdUplinks:
    """The fabric's etcd: the state under the leaf's own key and lease, written when it
    changes; a refresh only keeps the lease (a leaf's agent gone: its key ends with it)."""

    def __init__(self, etcd: Etcd, node: str, lease_ttl_s: int = 6):
        self.etcd, self.node, self.lease_ttl_s = etcd, node, lease_ttl_s
        self.lease, self.written = 0, None

    def __call__(self, state: dict[str, bool]):
        try:
            if self.lease and self.etcd.lease_keepalive(self.lease) <= 0:
                self.lease, self.written = 0, None
            if not self.lease:
                self.lease = self.etcd.lease_grant(self.lease_ttl_s)
            if state != self.written:
                self.etcd.put(keys.uplinks_key(self.node), json.dumps(state, sort_keys=True), lease=self.lease)
                self.written = dict(state)
        except (EtcdError, EtcdUnavailable) as e:
            raise coordapi.CoordinatorError(f"etcd: {e}") from None


class LinkReporter:
    def __init__(self, fabric: ClosFabric, node: str, publish: Callable[[dict], None], runtime: AgentRuntime,
                 refresh_s: float = 2.0, silent: Callable[[], set[str]] = set):
        """publish(state): HttpUplinks or EtcdUplinks (CoordinatorError when it cannot).
        silent(): uplinks whose spine keeps carrier but answers no heartbeat (reported down)."""
        n = fabric.node(node)
        if n.role != "leaf":
            raise ValueError(f"{node} is a {n.role}: only leaves report uplinks")
        self.node, self.publish, self.refresh_s, self.runtime = node, publish, refresh_s, runtime
        self.silent = silent
        self.ifnames = [p.ifname for p in fabric.ports_up(n)]
        self.up = {i: False for i in self.ifnames}      # the kernel's view, kept by the follower
        self.changed = threading.Event()                # wakes the sender at once
        self.sent: dict[str, bool] | None = None
        self.reachable = False

    def resync(self):
        """One dump of the links (at the start, and when the event socket was made anew)."""
        with IPRoute() as ipr:
            now = {link.get_attr("IFLA_IFNAME"): link_up(link["flags"]) for link in ipr.get_links()}
        self._set({i: now.get(i, False) for i in self.ifnames})

    def on_links(self, msgs: list) -> bool:
        """Applied from the events themselves; no dump needed."""
        new = dict(self.up)
        for m in msgs:
            name = m.get_attr("IFLA_IFNAME")
            if name in new:
                new[name] = m["header"]["type"] == RTM_NEWLINK and link_up(m["flags"])
            elif m["header"]["type"] == RTM_DELLINK:
                continue
        self._set(new)
        return False

    def _set(self, new: dict[str, bool]):
        if new != self.up:
            self.up = new
            self.changed.set()

    def send(self):
        """Tell the coordinator (a change, or the refresh). Unreachable: logged once, tried again
        at the next change or refresh."""
        self.changed.clear()      # what changes from here on wakes the next round
        silent = self.silent()
        state = {i: up and i not in silent for i, up in self.up.items()}
        try:
            self.publish(state)
        except coordapi.CoordinatorError as e:
            if self.reachable or self.sent is None:
                log.warning("coordinator: %s", e)
            self.reachable, self.sent = False, None
            return
        if state != self.sent:
            log.info("told the coordinator: %s", ", ".join(
                f"{i} {'up' if u else 'down'}" for i, u in state.items()))
        self.sent, self.reachable = state, True

    def start(self):
        ready = threading.Event()
        self.runtime.follow("uplinks-follower", RTMGRP_LINK, self.on_links, self.resync, ready=ready)
        ready.wait(5.0)          # the first report carries the kernel's state, not all-down
        self.runtime.every("uplinks", self.refresh_s, self.send, expected=(), wake=self.changed)
