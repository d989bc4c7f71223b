"""The host's side of the coordinator: every report period it sends this host's paths, weights and
QPs (those seen within the QP memory, idle ones included: a collective's QPs come back burst
after burst), each marked active or idle since when, and writes the placements it gets into the
data plane, where new and idle QPs take them. QPs placed through verbs need no memory: the library
reports their destruction. While the coordinator cannot be reached the placements stay for fallback_s, then they are
dropped and the local rule decides alone; nothing in flight is ever moved."""
from __future__ import annotations

import logging
import ssl
import threading
import time

from rlbcommon import coordapi
from rlbcommon.health import Health
from rlbcommon.runtime import AgentRuntime

from .dataplane import HostDataplane
from .verbs.advice import FabricView

log = logging.getLogger(__name__)

IDLE_MAX = 65536    # idle QPs kept from the sweeps between two reports (a stalled report loses the rest)


class CoordinatorClient:
    def __init__(self, dp: HostDataplane, node: str, url: str, period_s: float = 0.25,
                 memory_s: float = 3.0, fallback_s: float = 3.0, health: Health | None = None,
                 view: FabricView | None = None, tls: ssl.SSLContext | None = None):
        self.dp, self.node, self.url, self.tls = dp, node, url, tls
        # the QPs the sweeps removed as idle since the last report (the sweep's thread adds them)
        self._idle: dict[tuple[str, int, int], dict] = {}
        self._idle_lock = threading.Lock()
        dp.on_idle(self._went_idle)
        self.view = view              # the coordinator's link loads, for new verbs QPs
        self.period_s, self.memory_s, self.fallback_s = period_s, memory_s, fallback_s
        self.memory: dict[tuple[str, int, int], dict] = {}
        self.stop = threading.Event()
        self.reachable = False
        self.last_ok = 0.0
        self.counters = {"reports": 0, "failures": 0, "fallbacks": 0}
        self.health = health or Health()
        self.loop = "coordinator"    # its loop's name in the health record (a server's: one a NIC)
        self._down_since: float | None = None

    def _went_idle(self, qps: dict) -> None:
        with self._idle_lock:
            for key, v in qps.items():
                if len(self._idle) >= IDLE_MAX:
                    break
                self._idle[key] = v

    def body(self) -> dict:
        now = time.monotonic()
        paths = {p.index: p for p in self.dp.paths() if p.valid}
        with self._idle_lock:
            swept, self._idle = self._idle, {}
        mono_ns = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
        for key, v in swept.items():          # gone idle since the last read
            if v["path"] in paths:
                self.memory[key] = {"path": paths[v["path"]].value, "bytes": v["bytes"], "active": False,
                                    "seen": now - (mono_ns - v["last_ns"]) / 1e9}
        for q in self.dp.qps():
            if q["path"] in paths:
                self.memory[(q["peer"], q["sport"], q["qp"])] = {
                    "path": paths[q["path"]].value, "bytes": q["bytes"], "active": q["active"],
                    "seen": now - q["idle_ms"] / 1000}
        for key in [k for k, v in self.memory.items() if now - v["seen"] > self.memory_s]:
            del self.memory[key]
        # QPs placed through verbs, by the end that decided them (one report per QP): fixed, as
        # their address vectors are, until the application destroys them
        verbs = [{"peer": q.peer_base, "sport": 0, "qp": q.remote_qpn, "path": paths[q.path].value,
                  "bytes": 0, "fixed": True}
                 for q in self.dp.verbs_qps() if q.decided_here and not q.is_ah and q.path in paths]
        return {"paths": {str(p.value): p.address for p in paths.values()},
                "weights": [{"prefix": w["prefix"], "weights": {str(k): v for k, v in w["weights"].items()}}
                            for w in self.dp.weights()],
                # active: a packet within the conntrack expiry; the coordinator places the QPs
                # active now first and the idle ones, by how long ago, in the room left
                "qps": [{"peer": k[0], "sport": k[1], "qp": k[2], "path": v["path"], "bytes": v["bytes"],
                         "active": v["active"], "idle_ms": round(max(0.0, now - v["seen"]) * 1000, 1)}
                        for k, v in self.memory.items()] + verbs,
                "peers": self.view.peer_list() if self.view else []}

    def report_once(self) -> int:
        """One round trip; returns the number of placements written."""
        sent = time.monotonic()
        reply = coordapi.call(self.url, coordapi.REPORT.format(self.node), self.body(), tls=self.tls)
        if self.view is not None:
            self.view.answered(reply.get("links"), sent)
        index = {p.value: p.index for p in self.dp.paths() if p.valid}
        want = {(p["peer"], p["sport"], p["qp"]): index[p["path"]]
                for p in reply.get("placements", []) if p.get("path") in index}
        with self.dp.locked():
            written, _ = self.dp.set_placements(want)
        return written

    def _failed(self, err: Exception):
        now = time.monotonic()
        self.counters["failures"] += 1
        if self._down_since is None:
            self._down_since = now
            log.warning("coordinator %s: %s; keeping its placements for %.0f s", self.url, err, self.fallback_s)
        self.reachable = False
        if now - self._down_since >= self.fallback_s and self.dp.placements():
            with self.dp.locked():
                self.dp.set_placements({})
            self.counters["fallbacks"] += 1
            log.warning("coordinator unreachable for %.1f s: placements dropped, deciding locally",
                        now - self._down_since)

    def round(self):
        """One report and its answer applied. A coordinator that cannot be reached is counted
        and, after fallback_s, fallen back from (_failed), not raised: reachability has its own
        metric and alert, and the loop itself did its round."""
        try:
            self.report_once()
        except coordapi.CoordinatorError as e:
            self._failed(e)
            return
        except Exception:
            self._failed(RuntimeError("internal error"))    # the fallback clock runs all the same
            raise                                            # the runtime logs, counts and resumes
        self.counters["reports"] += 1
        self.last_ok = time.monotonic()
        if not self.reachable:
            log.info("coordinator %s: reporting as %s", self.url, self.node)
        self.reachable, self._down_since = True, None

    def start(self, runtime: AgentRuntime):
        """Report every period on the agent's runtime (its health, hang watch and stop)."""
        self.stop = runtime.stop
        return runtime.every(self.loop, self.period_s, self.round, expected=())
