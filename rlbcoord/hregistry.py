"""The h-score registry of a rail-only fabric, served by the coordinator (rlbcoord run on a
rail-only fabric file).

Every GPU agent reports, a few times a second, the rates on its two links (to its rail switch,
into its domain) in both directions: POST /v1/gpus/<gpu>/load {"rail": {"tx_bps", "rx_bps"},
"domain": {...}}. A link's utilisation is its busier direction over its speed; a rail's is its
busiest link's (every rail-switch port is one GPU's rail link), a domain's its busiest GPU link.
H = 1 - utilisation, smoothed by rlbfabric/hscore.HScores (time constant tau). A GPU that stops
reporting drops out after `stale_s`, and
an element nobody reports any more scores 0; a link its GPU reports dead scores as full. The answer to every report is the table of scores (GET
/v1/status adds who reports): each GPU's agent decides its own paths from it, with the rails sorted by H for
best-fit lookups in O(log K)."""
from __future__ import annotations

import threading
import time

from rlbfabric.hscore import HScores
from rlbfabric.kinds.railonly import RailOnlyFabric

from .service import BadRequest, Refused


def _rate(v, what: str) -> float:
    if not isinstance(v, (int, float)) or isinstance(v, bool) or not 0 <= v < 1e15:
        raise BadRequest(f"{what}: a rate in bits per second, not {v!r}")
    return float(v)


class HRegistry:
    def __init__(self, fabric: RailOnlyFabric, stale_s: float = 2.0, clock=time.monotonic):
        self.fabric, self.stale_s, self.clock = fabric, stale_s, clock
        self.scores = HScores(fabric.tau_s)
        self.lock = threading.Lock()
        self.latest: dict[tuple, dict[str, tuple[float, float]]] = {}   # element -> gpu -> (u, t)
        self.counters = {"reports": 0, "refused": 0, "bad": 0}

    def summary(self) -> str:
        f = self.fabric
        return f"h-scores of {f.rails} rails and {f.domains} domains (tau {f.tau_s:g} s)"

    def load(self, gpu: str, body: dict) -> dict:
        try:
            g = self.fabric.gpu(gpu)
        except Exception:
            self.counters["refused"] += 1
            raise Refused(f"{gpu!r} is not a GPU of this fabric") from None
        try:
            if not isinstance(body, dict):
                raise BadRequest("a JSON object expected")
            u = {}
            for part, mbps in (("rail", self.fabric.rail_mbps), ("domain", self.fabric.domain_mbps)):
                side = body.get(part)
                if not isinstance(side, dict):
                    raise BadRequest(f"{part}: an object with tx_bps and rx_bps")
                up = side.get("up", True)
                if not isinstance(up, bool):
                    raise BadRequest(f"{part}.up: true or false")
                # a dead link carries nothing: full, not idle (it read as the best rail)
                u[part] = 1.0 if not up else max(_rate(side.get("tx_bps"), f"{part}.tx_bps"),
                                                 _rate(side.get("rx_bps"), f"{part}.rx_bps")) / (mbps * 1e6)
        except BadRequest:
            self.counters["bad"] += 1
            raise
        now = self.clock()
        with self.lock:
            self.counters["reports"] += 1
            for element, util in ((("rail", g.rail), u["rail"]), (("domain", g.domain), u["domain"])):
                per = self.latest.setdefault(element, {})
                per[gpu] = (util, now)
                fresh = [x for x, t in per.values() if now - t <= self.stale_s]
                self.scores.sample(element, max(fresh), now)
            return self._table(now)

    def _table(self, now: float) -> dict:
        f = self.fabric
        return {"rails": {str(k): round(self.scores.h(("rail", k)), 4) for k in range(1, f.rails + 1)},
                "domains": {str(d): round(self.scores.h(("domain", d)), 4) for d in range(1, f.domains + 1)},
                "delta": f.delta, "tau_s": f.tau_s}

    def status(self) -> dict:
        """The table, and who reports (O(GPUs): for operators, not in every answer)."""
        with self.lock:
            now = self.clock()
            out = self._table(now)
            out["reporting"] = sorted({g for per in self.latest.values() for g, (_, t) in per.items()
                                       if now - t <= self.stale_s})
        out["counters"] = dict(self.counters)
        return out

    def expire(self):
        """Reporters silent for stale_s are forgotten; an element none of whose GPUs reports
        any more is scored full (H 0) at once, not left at its last score for good: its GPUs
        (which carry its traffic on a rail-only fabric) are gone or cut off."""
        now = self.clock()
        with self.lock:
            for element, per in self.latest.items():
                for gpu in [g for g, (_, t) in per.items() if now - t > self.stale_s]:
                    del per[gpu]
                if not per and self.scores.h(element) != 0.0:
                    self.scores.force(element, 1.0, now)


def for_rails(fabric: RailOnlyFabric, host_timeout_s: float, host_qps_max: int = 0) -> HRegistry:
    """The rail-only kind's coordinator (rlbcoord/kinds/railonly.py)."""
    return HRegistry(fabric)     # its GPUs' reports go stale on their own clock (stale_s); no QPs
