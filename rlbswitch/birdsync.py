"""The bird-fed part of the switch agent: bird's routes -> BPF maps, and back to bird what it
cannot compute itself (a leaf's discovered neighbours, a spine's FARE path bandwidth).

Bird has no push interface, but its kernel protocol exports every best route into the kernel:
a netlink route event from bird is the trigger, and only the prefixes it names are read back
(every path, not just the best) and compiled. A full read every resync_s catches what moves no
best path (a backup withdrawn, a path bandwidth changed). A dead socket or unparsable reply is
logged and retried; the last good state stays programmed.

One concern per module, this one runs them: birdwatch.py follows bird (its route events, its
restarts, which paths to trust), discovery.py finds a leaf's peers, rlbfabric's policy computes
(routes, FARE path bandwidth), routesync.py programs the maps and includes.py tells bird."""
from __future__ import annotations

import logging
import time
from pathlib import Path

from rlbcommon import failpoints
from rlbcommon.runtime import AgentRuntime
from rlbfabric.base import SwitchedFabric
from rlbfabric.bird.conf import neighbors_file, pathbw_file, render_neighbors, render_pathbw
from rlbfabric.bird.ctl import BirdClient, BirdError
from rlbfabric.policy import pathbw as pbw

from .birdwatch import RestartHold, RouteEvents, TrustedPaths
from .dataplane import SwitchDataplane
from .discovery import NeighbourDiscovery
from .includes import BirdIncludes
from .routesync import RouteProgrammer

log = logging.getLogger(__name__)


class BirdSync:
    def __init__(self, dp: SwitchDataplane, fabric: SwitchedFabric, node: str, socket_path: str, run_dir: Path,
                 runtime: AgentRuntime, resync_s: float = 1.0, program: bool = True):
        self.program = program   # False: only feed bird (discovery, path bandwidth); no XDP
        self.runtime, self.health, self.stop = runtime, runtime.health, runtime.stop
        self.dp, self.fabric, self.node = dp, fabric, fabric.node(node)
        self.bird = BirdClient(socket_path)
        self.run_dir, self.resync_s = run_dir, resync_s
        self.table: dict[str, list] = {}        # prefix -> bird's paths, as last read
        self.last_table = None
        self.stats = {"syncs": 0, "errors": 0, "last_sync_seconds": 0.0, "sessions": {},
                      "events": 0, "partial_syncs": 0, "bad_paths": 0, "holding": 0, "bird_restarts": 0,
                      "refused": {}}
        self._refused_seen: dict[str, int] = {}     # bird's filtered count per session, last read
        self._next_sessions = 0.0
        self._resync_now = False
        self.trusted = TrustedPaths(fabric, self.stats)
        self.events = RouteEvents(self._events_lost, self.stats)
        self.hold = RestartHold(self.bird, dp, fabric, self.node, program, self.stats)
        self.discovery = NeighbourDiscovery(dp, fabric, self.node)
        self.routes = RouteProgrammer(dp, fabric, self.node, self.trusted, self.link_bw, self.stats)
        self.includes = BirdIncludes(self.bird)

    @property
    def programmed(self) -> set[str]:
        return self.routes.programmed

    def link_bw(self, iface: str) -> float:
        """Bytes per second of a fabric port, from the fabric file."""
        port = self.fabric.port(self.node, iface)
        peer = port.peer.name if port else iface.removeprefix("eth-")
        return self.fabric.link_mbps_between(self.node.name, peer) * 1e6 / 8

    def _events_lost(self):
        self.last_table = None
        self._resync_now = True

    # ---- leaves: neighbours into bird ---------------------------------------------------
    def sync_neighbours(self):
        found = self.discovery.discover()
        self.includes.update(neighbors_file(self.run_dir, self.node.name),
                             render_neighbors(self.fabric, self.node, found), f"neighbours {found}")

    # ---- spines and super-spines: FARE path bandwidth back into bird --------------------
    def sync_pathbw(self, paths):
        values = pbw.node_values(self.fabric, self.node, self.trusted(paths), self.link_bw)
        self.includes.update(pathbw_file(self.run_dir, self.node.name),
                             render_pathbw(self.fabric, self.node, values),
                             f"path bandwidth for {len(values)} prefixes")

    # ---- reading bird -------------------------------------------------------------------
    def step(self):
        """A full read of bird's table (start, resync)."""
        self.hold.check(len(self.programmed))
        table = self.bird.routes()
        by_net: dict[str, list] = {}
        for p in table:
            by_net.setdefault(p.net, []).append(p)
        self.table = by_net
        key = repr(table)
        if self.hold.holding(key):
            return                          # neither path bandwidth nor routes from half a table
        if self.node.role in ("spine", "superspine"):
            self.sync_pathbw(table)
        # an operator's write (through this agent's control socket) may have taken or given
        # back a prefix bird has: routes are synced again after one
        if self.program and (key != self.last_table
                             or self.dp.tables.operator_writes != self.routes.synced_writes):
            if self.routes.sync(table):        # bird changed, or an operator changed the maps
                self.last_table = key
        if time.monotonic() >= self._next_sessions:   # metrics and discovery back-off: 1 s is enough
            self.stats["sessions"] = {p["name"]: p["info"] for p in self.bird.protocols() if p["proto"] == "BGP"}
            self.count_refused(self.bird.import_updates())
            self._next_sessions = time.monotonic() + 1.0

    def count_refused(self, updates: dict[str, dict[str, int]]):
        """Routes a peer sent that its session's import filter refused (a prefix that peer may
        not announce: a hijack or a broken neighbour), counted across session restarts, which
        reset bird's own counters; a log line each time a session's count grows."""
        seen = self._refused_seen
        for name, u in updates.items():
            now, before = u["filtered"], seen.get(name, 0)
            grew = now - before if now >= before else now          # a restart began again at 0
            if grew > 0:
                self.stats["refused"][name] = self.stats["refused"].get(name, 0) + grew
                log.warning("BGP %s: %d route(s) refused by the import filter (prefixes this peer may "
                            "not announce; %d so far)", name, grew, self.stats["refused"][name])
            seen[name] = now

    def changed(self, nets: set[str]):
        """bird changed these prefixes' best routes: read them back and program them now."""
        self.hold.check(len(self.programmed))
        for net in nets:
            paths = self.bird.routes(net)
            if paths:
                self.table[net] = paths
            else:
                self.table.pop(net, None)
        if self.hold.since is not None:
            return                          # the next full read decides when the hold ends
        paths = [p for net in nets for p in self.table.get(net, [])]
        if self.node.role in ("spine", "superspine"):
            self.sync_pathbw([p for ps in self.table.values() for p in ps])
        if self.program:
            self.routes.sync(paths, only=nets)
            self.last_table = None         # the next full read compares afresh
        self.stats["partial_syncs"] += 1

    def run(self):
        if self.program:
            self.routes.adopt()
        self.events.start(self.runtime).wait(5)
        next_discovery, next_resync = 0.0, 0.0
        self._resync_now = False
        failures = 0
        self.health.expect("bird")
        while not self.stop.is_set():
            failpoints.check("bird")
            try:
                uplinks = self.fabric.ports_up(self.node)
                if uplinks and time.time() >= next_discovery:
                    self.sync_neighbours()
                    up = [s for s, i in self.stats["sessions"].items()
                          if i.startswith("Established") and s in {u.bgp_name for u in uplinks}]
                    next_discovery = time.time() + (30 if len(up) >= len(uplinks) else 1)
                nets = self.events.take()
                self.events.wake.clear()
                if time.monotonic() >= next_resync or self._resync_now or len(nets) > 256:
                    self._resync_now = False
                    self.step()
                    next_resync = time.monotonic() + self.resync_s
                elif nets:
                    self.changed(nets)
                self.health.ok("bird")
                failures = 0
            except Exception as e:        # whatever it is, the last good state stays programmed
                self.stats["errors"] += 1
                failures += 1
                self.health.failed("bird", e, log, (BirdError, OSError))
                self.last_table = None
                self.stop.wait(min(2.0, 0.25 * 2 ** min(failures, 3)))    # back off, retry
            self.events.wake.wait(max(0.0, min(next_resync - time.monotonic(), 1.0)))
