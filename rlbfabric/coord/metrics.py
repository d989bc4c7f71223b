"""The coordinator's Prometheus metrics, read from its status at scrape time."""
from __future__ import annotations

from prometheus_client import generate_latest
from prometheus_client.registry import CollectorRegistry

from rlbcommon.metrics import counter, gauge

from .hregistry import HRegistry
from .service import Coordinator


class CoordinatorCollector:
    def __init__(self, coord: Coordinator):
        self.coord = coord

    def collect(self):
        s = self.coord.status()
        hosts = gauge("rlb_coord_hosts", "hosts reporting QPs", [])
        hosts.add_metric([], len(s["hosts"]))
        qps = gauge("rlb_coord_qps", "QPs known: crossing the fabric, within one leaf, and of the "
                    "fabric's the newest generation (active now)", ["kind"])
        for kind, n in s["qps"].items():
            qps.add_metric([kind], n)
        link = gauge("rlb_coord_link_qps", "QPs placed on each leaf uplink (up) and downlink into "
                     "the leaf (down), by colour (uplink 1..n)", ["leaf", "side", "colour"])
        for leaf, v in s["links"].items():
            for side in ("up", "down"):
                for c, n in enumerate(v[side], start=1):
                    link.add_metric([leaf, side, str(c)], n)
        bal = gauge("rlb_coord_balance", "worst leaf's max/mean of placed QPs per link, and the best "
                    "possible for the same QPs", ["side", "of"])
        for side in ("up", "down"):
            bal.add_metric([side, "placed"], s["balance"][side])
            bal.add_metric([side, "best"], s["balance"][f"best_{side}"])
        bal_new = gauge("rlb_coord_balance_newest", "the same for the newest generation alone (QPs "
                        "active now, placed as if older idle ones did not exist)", ["side", "of"])
        for side in ("up", "down"):
            bal_new.add_metric([side, "placed"], s["balance_newest"][side])
            bal_new.add_metric([side, "best"], s["balance_newest"][f"best_{side}"])
        over = gauge("rlb_coord_links_over_target", "QPs above their link's share, summed", [])
        over.add_metric([], s["over_target"])
        dead = gauge("rlb_coord_dead_links", "leaf uplinks reported down", [])
        dead.add_metric([], len(s["dead_links"]))
        c = s["counters"]
        reports = counter("rlb_coord_reports", "reports by result", ["result"])
        for result, key in (("ok", "reports"), ("refused", "refused"), ("bad", "bad")):
            reports.add_metric([result], c[key])
        links = counter("rlb_coord_link_reports", "link state reports from leaves", [])
        links.add_metric([], c["link_reports"])
        moves = counter("rlb_coord_moves", "QPs given a new placement", [])
        moves.add_metric([], c["moves"])
        solve = counter("rlb_coord_solve_seconds", "time spent placing", [])
        solve.add_metric([], c["solve_seconds"])
        solves = counter("rlb_coord_solves", "placements computed", [])
        solves.add_metric([], c["solves"])
        expired = counter("rlb_coord_hosts_expired", "hosts forgotten after falling silent", [])
        expired.add_metric([], c["hosts_expired"])
        yield from (hosts, qps, link, bal, bal_new, over, dead, reports, links, moves, solve, solves, expired)


class RegistryCollector:
    """A rail-only fabric's h-scores (rlbfabric/coord/hregistry.py)."""

    def __init__(self, registry):
        self.registry = registry

    def collect(self):
        s = self.registry.status()
        h = gauge("rlb_coord_hscore", "h-score of each rail and domain (1 = idle at line rate)",
                  ["element", "id"])
        for part, element in (("rails", "rail"), ("domains", "domain")):
            for k, v in s[part].items():
                h.add_metric([element, k], v)
        gpus = gauge("rlb_coord_gpus_reporting", "GPUs whose link rates are fresh", [])
        gpus.add_metric([], len(s["reporting"]))
        reports = counter("rlb_coord_reports", "reports by result", ["result"])
        for result in ("reports", "refused", "bad"):
            reports.add_metric(["ok" if result == "reports" else result], s["counters"][result])
        yield from (h, gpus, reports)


def exposition(coord):
    """A function returning the Prometheus text for /metrics: of the Coordinator of a
    leaf-spine fabric, or of a rail-only fabric's HRegistry."""
    registry = CollectorRegistry()
    registry.register((RegistryCollector if isinstance(coord, HRegistry) else CoordinatorCollector)(coord))
    return lambda: generate_latest(registry)
