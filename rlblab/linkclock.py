"""When the kernel told netlink that interfaces went down, read in their own namespaces.

A link fault in a lab has two moments: the fault itself (an interface set down: the kernel
announces it at once, under the same lock that takes the carrier away) and the moment a switch
could know (its port's carrier loss, which the kernel announces later, from its link-watch work
under the routing lock, so a busy machine can hold it back). Loss between the two is the kernel's;
loss after the second is the agent's. A test that judges the agent's failover measures both."""
from __future__ import annotations

import select
import threading
import time

from pyroute2.netlink.rtnl import RTMGRP_LINK

from rlbcommon import netns
from rlbcommon.netlinkevents import NetlinkEvents
from rlbcommon.nlmsg import link_up


class LinkDownClock:
    """`with LinkDownClock({netns: [ifname, ...]}) as clock:` ... `clock.when(netns, ifname)`:
    the wall-clock time of the first event that showed the interface down (not up, or no
    carrier) after the block began."""

    def __init__(self, watch: dict[str, list[str]]):
        self.watch = {ns: set(names) for ns, names in watch.items()}
        self.seen: dict[tuple[str, str], float] = {}
        self._events: dict[str, NetlinkEvents] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._follow, name="link-clock", daemon=True)

    def __enter__(self):
        for ns in self.watch:
            with netns.inside(ns):         # a socket stays in the namespace it was made in
                self._events[ns] = NetlinkEvents(RTMGRP_LINK, rcvbuf=1 << 20)
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        for ev in self._events.values():
            ev.close()
        return False

    def _follow(self):
        by_fd = {ev.fileno(): (ns, ev) for ns, ev in self._events.items()}
        while not self._stop.is_set():
            ready, _, _ = select.select(list(by_fd), [], [], 0.05)
            now = time.time()
            for fd in ready:
                ns, ev = by_fd[fd]
                for msg in ev.batch(timeout=0):
                    name = msg.get_attr("IFLA_IFNAME")
                    if not link_up(msg["flags"]) and name in self.watch[ns]:
                        self.seen.setdefault((ns, name), now)

    def when(self, ns: str, ifname: str, timeout: float = 5.0) -> float:
        """When the interface was first seen down; waits for it (TimeoutError after timeout)."""
        deadline = time.monotonic() + timeout
        while (ns, ifname) not in self.seen:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{ns}/{ifname} was not seen going down in {timeout:g} s")
            time.sleep(0.01)
        return self.seen[(ns, ifname)]
