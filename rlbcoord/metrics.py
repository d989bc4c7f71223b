"""The coordinator's Prometheus metrics, read from its status at scrape time."""
from __future__ import annotations

from prometheus_client.registry import CollectorRegistry

from rlbcommon.certs import CertCollector
from rlbcommon.metrics import counter, gauge, loop_health, one_at_a_time

from . import COLLECTORS
from .etcdrun import LINKS_EVERY_S, PLACE_EVERY_S
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
    """A rail-only fabric's h-scores (rlbcoord/hregistry.py)."""

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


class LoopCollector:
    """The coordinator's loops, as every agent's: errors, age of the last round, hung, restarts."""

    def __init__(self, health, name: str):
        self.health, self.name = health, name

    def collect(self):
        yield from loop_health(self.health, "rlb_coord", self.name)


class EtcdCollector:
    """A coordinator on etcd (etcdrun.EtcdCoordination.status): whether it leads, and the work
    and refusals of following the tree and writing placements."""

    COUNTERS = (("batches", "rlb_coord_etcd_batches", "batches of changes placed (one solve each, at least "
                 f"{PLACE_EVERY_S * 1000:g} ms apart while changes keep coming)"),
                ("placements_written", "rlb_coord_etcd_placements_written",
                 "placement keys written (a host's placements: one key per 1024 QPs)"),
                ("placements_deleted", "rlb_coord_etcd_placements_deleted", "placement keys deleted"),
                ("links_written", "rlb_coord_etcd_link_loads_written", "leaves' link-load keys written "
                 f"(every host watches them: at most every {LINKS_EVERY_S:g} s)"),
                ("takeovers", "rlb_coord_etcd_takeovers", "times this coordinator became the leader"),
                ("fenced", "rlb_coord_etcd_fenced", "placement writes refused because another leads"),
                ("refused", "rlb_coord_etcd_unreadable_keys", "keys under the fabric's tree that no "
                 "agent writes like that (ignored)"),
                ("etcd_refusals", "rlb_coord_etcd_refusals", "reads etcd refused (authentication, "
                 "permission)"),
                ("follow_cpu_s", "rlb_coord_etcd_follow_cpu_seconds", "CPU spent following the tree"),
                ("place_cpu_s", "rlb_coord_etcd_place_cpu_seconds", "CPU spent placing (solving, and "
                 "comparing with what etcd holds)"),
                ("hosts_over", "rlb_coord_etcd_hosts_dropped", "times a host's QP keys were dropped from "
                 "the coordinator's copy of etcd for holding more QPs than --host-qps-max"))

    def __init__(self, status):
        self.status = status

    def collect(self):
        s = self.status()
        # by shard (rlbcoord run --shard K/N; 1/1: the whole fabric): each shard needs a leader
        leading = gauge("rlb_coord_etcd_leading", "1 while this coordinator leads its shard", ["shard"])
        leading.add_metric([s.get("shard", "1/1")], 1 if s["leading"] else 0)
        hosts = gauge("rlb_coord_etcd_hosts", "hosts with keys in etcd (their leases alive)", [])
        hosts.add_metric([], s["hosts_in_etcd"])
        leaderless = gauge("rlb_coord_etcd_other_shards_without_leader", "the other shards of this "
                           "coordinator's count that no coordinator leads (their hosts' QPs are not placed)", [])
        leaderless.add_metric([], len(s.get("other_shards_without_leader", ())))
        over = gauge("rlb_coord_etcd_hosts_over", "hosts whose QP keys hold more QPs than a host may "
                     "have placed (--host-qps-max): counted, not kept or placed, until within again", [])
        over.add_metric([], len(s.get("hosts_over", ())))
        yield from (leading, hosts, leaderless, over)
        for key, name, doc in self.COUNTERS:
            c = counter(name, doc, [])
            c.add_metric([], s["counters"][key])
            yield c


def exposition(coord, etcd_status=None, health=None, name: str = ""):
    """A function returning the Prometheus text for /metrics: of the Coordinator of a
    leaf-spine fabric, or of a rail-only fabric's HRegistry; with etcd_status (a coordinator
    on etcd), its leadership and work too; with health, its loops' (as the agents', node `name`)."""
    registry = CollectorRegistry()
    if health is not None:
        registry.register(LoopCollector(health, name))
    registry.register(COLLECTORS.of(coord.fabric)(coord))
    registry.register(CertCollector())         # the etcd TLS files it uses, when they expire
    if etcd_status is not None:
        registry.register(EtcdCollector(etcd_status))
    return one_at_a_time(registry)
