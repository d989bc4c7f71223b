"""The host agent: follows the interface's addresses (an RA adds or withdraws a prefix -> a
path appears or disappears) and sweeps the connection-tracking table (idle QPs expire, the
active counts are re-derived, QPs are released or reinstated to match the weights)."""
from __future__ import annotations

import logging
import threading

from pyroute2 import IPRoute
from pyroute2.netlink.rtnl import RTMGRP_IPV6_IFADDR

from .dataplane import HostDataplane

log = logging.getLogger(__name__)


class HostAgent:
    def __init__(self, dp: HostDataplane, ifname: str, path_field: int | None = None,
                 base_value: int | None = None):
        self.dp, self.ifname = dp, ifname
        self.path_field, self.base_value = path_field, base_value
        self.stop = threading.Event()

    def sync(self):
        try:
            self.dp.sync_paths(self.ifname, self.path_field, self.base_value)
        except Exception:
            log.exception("syncing paths of %s", self.ifname)

    def _addresses(self, ready: threading.Event):
        with IPRoute() as mon:
            mon.bind(groups=RTMGRP_IPV6_IFADDR)
            ready.set()
            while not self.stop.is_set():
                msgs = mon.get()
                if any(m["event"] in ("RTM_NEWADDR", "RTM_DELADDR") for m in msgs):
                    self.sync()   # DAD completing also arrives as RTM_NEWADDR

    def run(self):
        ready = threading.Event()
        threading.Thread(target=self._addresses, args=(ready,), name="addresses", daemon=True).start()
        ready.wait()
        self.sync()
        log.info("following addresses of %s; %d paths", self.ifname,
                 sum(p.valid for p in self.dp.paths()))
        while not self.stop.is_set():
            period = max(0.05, self.dp.config()["expiry_ms"] / 2000)
            self.stop.wait(period)
            try:
                self.dp.rebalance()
            except Exception:
                log.exception("sweeping connection tracking")
