"""A leaf tells the fabric coordinator which of its uplinks are up: at once when one changes, and
every few seconds anyway (a restarted coordinator learns the state within that time). The kernel's
view is read (IFF_UP and carrier), so it holds whether or not XDP forwards."""
from __future__ import annotations

import logging
import threading
import time

from pyroute2 import IPRoute

from rlbcommon import coordapi
from rlbcommon.health import Health
from rlbfabric.clos import ClosFabric

log = logging.getLogger(__name__)
IFF_UP, IFF_LOWER_UP = 0x1, 0x10000


class LinkReporter:
    def __init__(self, fabric: ClosFabric, node: str, url: str, poll_s: float = 0.1, refresh_s: float = 2.0,
                 health: Health | None = None):
        n = fabric.node(node)
        if n.role != "leaf":
            raise ValueError(f"{node} is a {n.role}: only leaves report uplinks")
        self.node, self.url, self.poll_s, self.refresh_s = node, url, poll_s, refresh_s
        self.ifnames = [p.ifname for p in fabric.ports_up(n)]
        self.stop = threading.Event()
        self.reachable = False
        self.health = health or Health()

    def state(self, ipr: IPRoute) -> dict[str, bool]:
        up = {}
        for link in ipr.get_links():
            name = link.get_attr("IFLA_IFNAME")
            if name in self.ifnames:
                up[name] = bool(link["flags"] & IFF_UP and link["flags"] & IFF_LOWER_UP)
        return {i: up.get(i, False) for i in self.ifnames}

    def run(self):
        while not self.stop.is_set():
            try:
                self._run()
            except Exception as e:          # netlink itself failed: start over
                self.health.failed("uplinks", e, log)
                self.stop.wait(0.5)

    def _run(self):
        sent, last = None, 0.0
        with IPRoute() as ipr:
            while not self.stop.is_set():
                now = time.monotonic()
                state = self.state(ipr)
                if state != sent or now - last >= self.refresh_s:
                    try:
                        coordapi.call(self.url, coordapi.LINKS.format(self.node), {"ports": state})
                        if state != sent:
                            log.info("told the coordinator: %s", ", ".join(
                                f"{i} {'up' if u else 'down'}" for i, u in state.items()))
                        sent, last, self.reachable = state, now, True
                    except coordapi.CoordinatorError as e:
                        if self.reachable or sent is None:
                            log.warning("coordinator: %s", e)
                        self.reachable, sent, last = False, None, now
                self.health.ok("uplinks")
                self.stop.wait(self.poll_s)

    def start(self) -> threading.Thread:
        t = threading.Thread(target=self.run, name="links", daemon=True)
        t.start()
        return t
