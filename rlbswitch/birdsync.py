"""The bird-fed part of the switch agent: bird's routes -> BPF maps, and back to bird what it
cannot compute itself (a leaf's discovered neighbours, a spine's FARE path bandwidth).

Bird has no push interface, but its kernel protocol exports every best route into the kernel:
a netlink route event from bird is the trigger, and only the prefixes it names are read back
(every path, not just the best) and compiled. A full read every resync_s catches what moves no
best path (a backup withdrawn, a path bandwidth changed). A dead socket or unparsable reply is
logged and retried; the last good state stays programmed."""
from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import struct
import threading
import time
from datetime import datetime
from pathlib import Path

from rlbcommon.health import Health
from rlbcommon.paths import RUN_DIR, write_atomic

from rlbfabric.bird.conf import neighbors_file, pathbw_file, render_neighbors, render_pathbw
from rlbfabric.bird.ctl import BirdClient, BirdError
from rlbfabric.base import Fabric
from rlbfabric.policy import pathbw as pbw
from rlbfabric.policy.compiler import compile_for_node

from .dataplane import DataplaneError, SwitchDataplane

log = logging.getLogger(__name__)
RTPROT_BIRD = 12        # rtnetlink protocol id of routes bird installs


def why_file(instance: str) -> Path:
    """Why each route is programmed as it is (prefix -> reason), for `rlbswitch route show`."""
    return RUN_DIR / f"{instance}-switch-routes.json"


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


def restarted(before: str, now: str, slack_s: float = 1.0) -> bool:
    """Whether bird's start time moved on: a new bird (restarted or replaced). bird derives the
    time it prints from its monotonic clock and the wall clock, so the same bird's start time
    drifts by milliseconds whenever the wall clock is slewed (NTP; under emulation, every few
    reads): only a later start, by more than slack_s, is a new bird."""
    try:
        return (datetime.fromisoformat(now) - datetime.fromisoformat(before)).total_seconds() > slack_s
    except ValueError:                  # not a time bird printed: any change is a new bird
        return now != before


class BirdSync:
    def __init__(self, dp: SwitchDataplane, fabric: Fabric, node: str, socket_path: str, run_dir: Path,
                 resync_s: float = 1.0, program: bool = True, health: Health | None = None):
        self.program = program   # False: only feed bird (discovery, path bandwidth); no XDP
        self.health = health or Health()
        self.dp, self.fabric, self.node = dp, fabric, fabric.node(node)
        self.bird = BirdClient(socket_path)
        self.run_dir, self.resync_s = run_dir, resync_s
        self.stop = threading.Event()
        self.wake = threading.Event()
        self.dirty: set[str] = set()            # prefixes whose kernel route bird changed
        self.dirty_lock = threading.Lock()
        self.table: dict[str, list] = {}        # prefix -> bird's paths, as last read
        self.last_table = None
        self._synced_loads = -1
        self.programmed: set[str] = set()          # prefixes this agent owns (bird's routes)
        self.explain: dict[str, str] = {}
        self.stats = {"syncs": 0, "errors": 0, "last_sync_seconds": 0.0, "sessions": {},
                      "events": 0, "partial_syncs": 0, "bad_paths": 0, "holding": 0, "bird_restarts": 0,
                      "refused": {}}
        self._refused_seen: dict[str, int] = {}     # bird's filtered count per session, last read
        self.boot: str | None = None            # bird's start time, as last seen
        self.hold_since: float | None = None    # a restarted bird is converging since
        self._hold_table, self._hold_stable_since = None, None
        self._reported: set = set()
        self._found: dict[str, str] = {}          # uplink -> the peer that answered on it
        self._written: dict[Path, str] = {}
        self._pending: set[Path] = set()        # includes written but not yet configured
        self._next_sessions = 0.0

    # ---- helpers --------------------------------------------------------------------
    def link_bw(self, iface: str) -> float:
        """Bytes per second of a fabric port, from the fabric file."""
        port = self.fabric.port(self.node, iface)
        peer = port.peer.name if port else iface.removeprefix("eth-")
        return self.fabric.link_mbps_between(self.node.name, peer) * 1e6 / 8

    def _write(self, path: Path, text: str) -> bool:
        if path not in self._pending and (self._written.get(path) == text
                                          or (path.exists() and path.read_text() == text)):
            self._written[path] = text
            return False
        write_atomic(path, text)
        self._written[path] = text
        return True

    def _configure(self, why: str, path: Path):
        """Tell bird to read its includes again. If that fails, the include counts as not yet
        given to bird, so the next round writes and configures again (the loop backs off)."""
        try:
            reply = self.bird.configure()
        except Exception:
            self._written.pop(path, None)
            self._pending.add(path)
            raise
        self._pending.discard(path)
        log.info("bird reconfigured (%s): %s", why, reply.strip())

    # ---- leaves: neighbour discovery --------------------------------------------------
    def discover(self) -> dict[str, str]:
        """The link-local address of the peer on each uplink: an echo request to all-nodes on the
        port, and the source of the echo reply that comes back on that port (not whatever the
        neighbour table holds). A port with no answer keeps what was found before."""
        for port in self.fabric.ports_up(self.node):
            try:
                ifindex = self.dp.ifindex(port.ifname)
            except DataplaneError:
                continue
            with self.dp.netlink() as ipr:
                own = {a.get_attr("IFA_ADDRESS") for a in ipr.get_addr(family=socket.AF_INET6, index=ifindex)}
            addr = echo_peer(port.ifname, ifindex, own)
            if addr and self._found.get(port.bgp_name) != addr:
                log.info("%s: peer %s answered on %s", port.bgp_name, addr, port.ifname)
                self._found[port.bgp_name] = addr
        return dict(self._found)

    def sync_neighbours(self):
        found = self.discover()
        text = render_neighbors(self.fabric, self.node, found)
        if self._write(neighbors_file(self.run_dir, self.node.name), text):
            self._configure(f"neighbours {found}", neighbors_file(self.run_dir, self.node.name))

    # ---- spines and super-spines: FARE path bandwidth back into bird --------------------
    def sync_pathbw(self, paths):
        values = pbw.node_values(self.fabric, self.node, self.usable(paths), self.link_bw)
        text = render_pathbw(self.fabric, self.node, values)
        if self._write(pathbw_file(self.run_dir, self.node.name), text):
            self._configure(f"path bandwidth for {len(values)} prefixes", pathbw_file(self.run_dir, self.node.name))

    # ---- routes -> data plane ---------------------------------------------------------
    def sync_routes(self, paths, only: set[str] | None = None) -> bool:
        """Program bird's routes (compiled by policy) in one batch; routes this agent did not
        program (connected, local, an operator's) are left alone. With `only`, paths are those
        prefixes' (after an event) and nothing else is touched. False if some route could not
        be programmed yet (it is retried)."""
        t0 = time.perf_counter()
        compiled = self.compile(paths)
        tables = self.dp.tables
        tables.refresh()                           # owners as they are now, not as last loaded
        if only is None:
            self._synced_loads = tables.loads      # a full sync has seen every writer's change
        for net in [n for n in compiled if tables.owner(n) not in (None, "agent")]:
            if ("owner", net) not in self._reported:
                self._reported.add(("owner", net))
                log.warning("%s is the %s's route: bird's is not programmed over it", net, tables.owner(net))
            del compiled[net]
        scope = (set(self.programmed) | set(compiled)) if only is None else only
        ch = self.dp.apply_routes([c.route for c in compiled.values()], keep_going=True, owner="agent",
                                  scope=lambda net: str(net) in scope and tables.owner(net) in (None, "agent"),
                                  only_own=True)
        for net in ch.yielded:          # an operator's route written since the check above
            compiled.pop(net, None)
            log.warning("%s is the %s's route: bird's is not programmed over it", net, tables.owner(net))
        for net, why in ch.failed.items():
            log.warning("cannot program %s: %s (retrying)", net, why)
        if only is None:
            self.programmed = set(compiled)          # failed ones too: still bird's, retried
            self.explain = {net: c.why for net, c in compiled.items()}
        else:
            self.programmed = (self.programmed - only) | set(compiled)
            for net in only:
                self.explain.pop(net, None)
            self.explain.update({net: c.why for net, c in compiled.items()})
        if ch:
            log.info("routes from bird%s: %s", f" ({len(only)} changed)" if only is not None else "", ch.summary())
        self.stats["last_sync_seconds"] = time.perf_counter() - t0
        self.stats["syncs"] += 1
        self._write(why_file(self.dp.instance), json.dumps(self.explain))
        return not ch.failed

    def usable(self, paths):
        """Paths whose attributes can be trusted; each bad one is logged once and left out."""
        subtypes = (self.fabric.pathbw_subtype, self.fabric.linkbw_subtype)
        out = []
        for p in paths:
            problems = p.check(subtypes)
            if not problems:
                out.append(p)
                continue
            key = (p.net, p.proto, tuple(problems))
            if key not in self._reported:
                self._reported.add(key)
                log.warning("%s via %s from %s ignored: %s", p.net, p.iface, p.proto, "; ".join(problems))
            self.stats["bad_paths"] += 1
        return out

    def compile(self, paths):
        return compile_for_node(self.fabric, self.node, self.usable(paths), self.link_bw)

    def adopt(self):
        """A restarted agent takes over what the previous one programmed (the routes recorded as
        the agent's; an operator's stay theirs); the first sync then changes only what bird's
        table says differently."""
        self.programmed = self.dp.tables.owned_by("agent")

    # ---- a restarted bird ------------------------------------------------------------
    def bird_boot(self) -> str:
        """bird's own start time, as `show status` says it."""
        for _, text in self.bird.command("show status"):
            if text.startswith("Last reboot on "):
                return text[len("Last reboot on "):].strip()
        return ""

    def _expected_sessions_up(self) -> bool:
        """Every fabric port whose link is up has an Established session again (a spine's
        dynamic sessions are named <port>_<n>)."""
        sessions = {p["name"]: p["info"] for p in self.bird.protocols() if p["proto"] == "BGP"}
        self.stats["sessions"] = sessions
        links = {p.ifname: p.up for p in self.dp.ports()} if self.program else {}
        for port in self.fabric.ports_up(self.node) + self.fabric.ports_down(self.node):
            if links and not links.get(port.ifname, False):
                continue                        # a dead link has no session to wait for
            names = [n for n in sessions if n == port.bgp_name or n.startswith(port.bgp_name + "_")]
            if not any(sessions[n].startswith("Established") for n in names):
                return False
        return True

    def holding(self, table_key: str | None = None) -> bool:
        """After bird restarted, keep everything programmed (stale) until its sessions are back
        and its table has stopped changing for a second, or the restart time is over."""
        if self.hold_since is None:
            return False
        now = time.monotonic()
        if table_key is not None and table_key != self._hold_table:
            self._hold_table, self._hold_stable_since = table_key, now
        waited = now - self.hold_since
        if waited >= self.fabric.graceful_restart_s:
            log.warning("bird restarted %.0f s ago and has not converged: programming what it has", waited)
        elif not (self._expected_sessions_up() and self._hold_stable_since is not None
                  and now - self._hold_stable_since >= 1.0):
            return True
        else:
            log.info("bird has recovered after %.1f s: programming its table", waited)
        self.hold_since = None
        self.stats["holding"] = 0
        return False

    def _check_bird(self):
        boot = self.bird_boot()
        if self.boot is not None and restarted(self.boot, boot):
            self.hold_since = time.monotonic()
            self._hold_table, self._hold_stable_since = None, None
            self.stats["holding"] = 1
            self.stats["bird_restarts"] += 1
            log.warning("bird restarted (%s): holding %d programmed routes until it has converged "
                        "(at most %d s)", boot, len(self.programmed), self.fabric.graceful_restart_s)
        self.boot = boot

    # ---- reading bird -------------------------------------------------------------------
    def step(self):
        """A full read of bird's table (start, resync)."""
        self._check_bird()
        table = self.bird.routes()
        by_net: dict[str, list] = {}
        for p in table:
            by_net.setdefault(p.net, []).append(p)
        self.table = by_net
        key = repr(table)
        if self.holding(key):
            return                          # neither path bandwidth nor routes from half a table
        if self.node.role in ("spine", "superspine"):
            self.sync_pathbw(table)
        # Another writer's change may have been read in by someone else (a neighbour update
        # reloads the model too): what counts is whether routes were synced since that read.
        tables = self.dp.tables
        if self.program and (key != self.last_table or tables.changed_elsewhere()
                             or tables.loads != self._synced_loads):
            if self.sync_routes(table):        # bird changed, or somebody else changed the maps
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
        self._check_bird()
        for net in nets:
            paths = self.bird.routes(net)
            if paths:
                self.table[net] = paths
            else:
                self.table.pop(net, None)
        if self.hold_since is not None:
            return                          # the next full read decides when the hold ends
        paths = [p for net in nets for p in self.table.get(net, [])]
        if self.node.role in ("spine", "superspine"):
            self.sync_pathbw([p for ps in self.table.values() for p in ps])
        if self.program:
            self.sync_routes(paths, only=nets)
            self.last_table = None         # the next full read compares afresh
        self.stats["partial_syncs"] += 1

    def on_route_event(self, msg):
        """Netlink: bird (proto 12) added, changed or removed a kernel route."""
        if msg["proto"] != RTPROT_BIRD or msg["family"] != socket.AF_INET6:
            return
        dst = msg.get_attr("RTA_DST")
        if not dst:
            return
        with self.dirty_lock:
            self.dirty.add(f"{dst}/{msg['dst_len']}")
        self.stats["events"] += 1
        self.wake.set()

    def _follow_routes(self, ready: threading.Event):
        from pyroute2 import IPRoute
        from pyroute2.netlink.rtnl import RTMGRP_IPV6_ROUTE
        while not self.stop.is_set():
            try:
                with IPRoute() as mon:
                    mon.bind(groups=RTMGRP_IPV6_ROUTE)
                    ready.set()
                    while not self.stop.is_set():
                        for msg in mon.get():
                            self.on_route_event(msg)
            except Exception as e:   # ENOBUFS in a storm: events were lost, so read everything
                self.health.failed("bird-events", e, log)
                self.last_table = None
                self._resync_now = True
                self.wake.set()
                self.stop.wait(0.1)

    def run(self):
        if self.program:
            self.adopt()
        ready = threading.Event()
        threading.Thread(target=self._follow_routes, args=(ready,), name="bird-routes", daemon=True).start()
        ready.wait(5)
        next_discovery, next_resync = 0.0, 0.0
        self._resync_now = False
        failures = 0
        while not self.stop.is_set():
            try:
                uplinks = self.fabric.ports_up(self.node)
                if uplinks and time.time() >= next_discovery:
                    self.sync_neighbours()
                    up = [s for s, i in self.stats["sessions"].items()
                          if i.startswith("Established") and s in {u.bgp_name for u in uplinks}]
                    next_discovery = time.time() + (30 if len(up) >= len(uplinks) else 1)
                with self.dirty_lock:
                    nets, self.dirty = self.dirty, set()
                self.wake.clear()
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
            self.wake.wait(max(0.0, min(next_resync - time.monotonic(), 1.0)))
