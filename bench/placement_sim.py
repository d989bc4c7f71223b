"""The coordinator's placement at fabric scale, by simulation (no namespaces): a modelled fabric of
64 leaves x 32 hosts x 8 spines, NCCL-like traffic matrices, and per matrix the worst leaf's
max/mean on uplinks and downlinks for: the best possible (computed), ECMP (every QP hashed
uniformly onto an uplink), RLB's local rule (the hosts alone, QPs arriving in random order) and
the coordinator (starting from where the local rule put them, as in a live fabric). Then the
coordinator's decision time: a full placement of 2048 hosts x 8 QPs from nothing, and incremental
ones (one QP appears, one QP ends); then hosts reporting in turn on links a quarter at half speed,
where solves can end stuck (the cost of placement.py's sideways steps).

With --etcd, the same modelled fabric with a real etcd in the loop instead (bench/etcd_placement.py:
the coordinator following etcd, simulated hosts writing their QPs and watching their placements,
next to the HTTP coordinator); every option after --etcd is that bench's.

    .venv/bin/python bench/placement_sim.py [--leaves 64 --hosts 32 --spines 8 --trials 3]
    .venv/bin/python bench/placement_sim.py --etcd --leaves 128 --hosts 32 --collective 64,512"""
from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from rlbfabric import balance, workloads
from rlbfabric.policy import localrule  # noqa: E402
from rlbfabric.fabric import uniform_clos  # noqa: E402
from rlbfabric.policy.placement import DOWN, UP  # noqa: E402
from rlbfabric.policy.qpplacer import QpInfo, QpPlacer  # noqa: E402

ETCD_BENCH = Path(__file__).resolve().parent / "etcd_placement.py"   # it imports model_fabric from here


model_fabric = uniform_clos           # (etcd_placement.py imports it from here)


def matrices(fabric, rnd: random.Random, qps_per_host: int) -> dict[str, list[tuple[str, str]]]:
    """Each matrix gives every host about qps_per_host QPs."""
    hosts = fabric.hosts
    q = qps_per_host
    out = {
        f"ring x{q}": workloads.connections("ring", hosts) * q,
        f"tree x{max(1, q // 3)}": workloads.connections("tree", hosts) * max(1, q // 3),
        f"permutation x{q}": workloads.connections("permutation", hosts, rnd) * q,
        "moe (8 random peers)": workloads.connections("moe", hosts, rnd, fanout=q),
    }
    # all-to-all inside groups of q+1 hosts taken across leaves (expert-parallel groups)
    per = len(hosts) // (q + 1)
    groups = [hosts[i::per][:q + 1] for i in range(per)]
    out[f"all-to-all, groups of {q + 1}"] = [c for g in groups for c in workloads.connections("all-to-all", g)]
    return out


def ecmp(fabric, qps, rnd):
    n = fabric.colours()
    return [(s, d, rnd.randrange(n)) for s, d in qps]


def local(fabric, qps, rnd):
    order = list(range(len(qps)))
    rnd.shuffle(order)
    paths = localrule.simulate(fabric, [qps[i] for i in order])
    colour = {k: fabric.port_id(k, fabric.leaves[0]) - 1 for k in range(1, fabric.paths + 1)}
    out = [None] * len(qps)
    for i, p in zip(order, paths):
        out[i] = (*qps[i], None if p is None else colour[p + 1])
    return out


def coordinated(fabric, qps, start):
    placer = QpPlacer(fabric)
    every = {k: 1.0 for k in range(1, fabric.paths + 1)}
    for i, ((s, d), (_, _, c)) in enumerate(zip(qps, start)):
        placer.add(i, QpInfo(s, d, None if c is None else c + 1, every))
    t = time.perf_counter()
    moved = placer.solve()
    dt = time.perf_counter() - t
    colour = {k: fabric.port_id(k, fabric.leaves[0]) - 1 for k in range(1, fabric.paths + 1)}
    placed = [(s, d, None if placer.path(i) is None else colour[placer.path(i)]) for i, (s, d) in enumerate(qps)]
    return placed, dt, moved, placer


def timing(fabric, rnd, qps_per_host: int):
    """Full placement from nothing, then incremental changes on the placed fabric."""
    hosts = fabric.hosts
    every = {k: 1.0 for k in range(1, fabric.paths + 1)}
    conns = workloads.connections("moe", hosts, rnd, fanout=qps_per_host)
    placer = QpPlacer(fabric)
    for i, (s, d) in enumerate(conns):
        placer.add(i, QpInfo(s, d, None, every))
    t = time.perf_counter()
    placer.solve()
    full = time.perf_counter() - t
    adds, ends, moves = [], [], []
    for j in range(200):
        s, d = rnd.sample(hosts, 2)
        t = time.perf_counter()
        placer.add(("new", j), QpInfo(s, d, None, every))
        moves.append(placer.solve())
        adds.append(time.perf_counter() - t)
        victim = rnd.randrange(len(conns))
        if victim in placer.qps or victim in placer.local:
            t = time.perf_counter()
            placer.remove(victim)
            moves.append(placer.solve())
            ends.append(time.perf_counter() - t)
    return len(conns), full, adds, ends, moves, placer.excess()


def arrivals(fabric, rnd, qps_per_host: int, hosts_a_solve: int = 8, slow_share: float = 0.25):
    """Hosts reporting in turn (a solve every hosts_a_solve of them, as reports come in) on the same
    fabric with a share of its leaf-spine links at half speed: where the targets of a link's two
    ends can conflict and a solve can end stuck (placement.py's sideways steps). Returns the
    solves' times, how many ended stuck, and the violation left at the end."""
    placer = QpPlacer(fabric)
    for v in range(len(fabric.leaves)):
        caps = [5000.0 if rnd.random() < slow_share else 10000.0 for _ in range(fabric.colours())]
        for t in placer.tiers:
            t.set_capacity(v, UP, caps)
            t.set_capacity(v, DOWN, caps)
    every = {k: 1.0 for k in range(1, fabric.paths + 1)}
    by_host: dict[str, list] = {}
    for i, (s, d) in enumerate(workloads.connections("moe", fabric.hosts, rnd, fanout=qps_per_host)):
        by_host.setdefault(s, []).append((i, s, d))
    hosts = list(fabric.hosts)
    rnd.shuffle(hosts)
    times, stuck = [], 0
    for b in range(0, len(hosts), hosts_a_solve):
        for h in hosts[b:b + hosts_a_solve]:
            for i, s, d in by_host.get(h, []):
                placer.add(i, QpInfo(s, d, rnd.randint(1, fabric.paths), every))
        t = time.perf_counter()
        placer.solve()
        times.append(time.perf_counter() - t)
        stuck += bool(placer.tiers[0].violation())
    return times, stuck, placer.tiers[0].violation()


def report_cost(fabric, rnd, qps_per_host: int, rounds: int = 3) -> float:
    """Seconds the coordinator's model spends on one host's report (validation, update, solve,
    answer; no HTTP), every host reporting its QPs in turn as the agents do."""
    from rlbcoord.service import Coordinator
    coord = Coordinator(fabric)
    hosts = fabric.hosts
    iid = {h: i + 1 for i, h in enumerate(hosts)}

    def addr(h, k=1):
        leaf, port = fabric.leaf_of_host(h)
        return str(fabric.host_prefixes(leaf, port)[k - 1].network_address + iid[h])

    bodies = {}
    for h in hosts:
        peers = rnd.sample([x for x in hosts if x != h], qps_per_host)
        bodies[h] = {"paths": {str(k): addr(h, k) for k in range(1, fabric.paths + 1)},
                     "weights": [{"prefix": "::/0", "weights": {str(k): 1 for k in range(1, fabric.paths + 1)}}],
                     "qps": [{"peer": addr(p), "sport": 50000 + i, "qp": i, "path": 1 + i % fabric.paths, "bytes": 1}
                             for i, p in enumerate(peers)]}
    t = time.perf_counter()
    for _ in range(rounds):
        for h in hosts:
            coord.report(h, bodies[h])
    return (time.perf_counter() - t) / (rounds * len(hosts))


def main() -> int:
    if "--etcd" in sys.argv[1:]:       # that bench in this process's place, with its options
        os.execv(sys.executable, [sys.executable, str(ETCD_BENCH), *(a for a in sys.argv[1:] if a != "--etcd")])
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--etcd", action="store_true", help="with a real etcd in the loop (bench/etcd_placement.py; "
                    "its options follow, see --etcd --help)")
    ap.add_argument("--leaves", type=int, default=64)
    ap.add_argument("--hosts", type=int, default=32, help="hosts per leaf")
    ap.add_argument("--spines", type=int, default=8)
    ap.add_argument("--qps", type=int, default=8, help="QPs per host")
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    fabric = model_fabric(args.leaves, args.hosts, args.spines)
    rnd = random.Random(args.seed)
    print(f"modelled fabric: {args.leaves} leaves x {args.hosts} hosts x {args.spines} spines "
          f"({len(fabric.hosts)} hosts); worst leaf's max/mean, uplinks / downlinks, "
          f"mean of {args.trials} trials")
    print(f"{'matrix':<28}{'QPs':>7}{'best':>12}{'ECMP':>12}{'RLB local':>12}{'coordinated':>13}"
          f"{'moved':>7}{'time':>8}")
    rows: dict[str, dict[str, list]] = {}
    for _ in range(args.trials):
        for name, qps in matrices(fabric, rnd, args.qps).items():
            r = rows.setdefault(name, {"n": [], "best": [], "ecmp": [], "local": [], "coord": [], "moved": [], "t": []})
            loc = local(fabric, qps, rnd)
            placed, dt, moved, _ = coordinated(fabric, qps, loc)
            r["n"].append(len(qps))
            r["best"].append(balance.best_figures(fabric, qps))
            r["ecmp"].append(balance.figures(*balance.leaf_loads(fabric, ecmp(fabric, qps, rnd))))
            r["local"].append(balance.figures(*balance.leaf_loads(fabric, loc)))
            r["coord"].append(balance.figures(*balance.leaf_loads(fabric, placed)))
            r["moved"].append(moved)
            r["t"].append(dt)

    def pair(vals):
        return f"{statistics.mean(v[0] for v in vals):.2f}/{statistics.mean(v[1] for v in vals):.2f}"

    for name, r in rows.items():
        print(f"{name:<28}{round(statistics.mean(r['n'])):>7}{pair(r['best']):>12}{pair(r['ecmp']):>12}"
              f"{pair(r['local']):>12}{pair(r['coord']):>13}{round(statistics.mean(r['moved'])):>7}"
              f"{statistics.mean(r['t']) * 1000:>6.0f}ms")
    n, full, adds, ends, moves, excess = timing(fabric, rnd, args.qps)
    per_report = report_cost(fabric, rnd, args.qps)
    print(f"\ndecision time: full placement of {n} QPs from nothing {full * 1000:.0f} ms (target < 1000 ms); "
          f"incremental: a QP appears median {statistics.median(adds) * 1000:.2f} ms, max "
          f"{max(adds) * 1000:.2f} ms; a QP ends median {statistics.median(ends) * 1000:.2f} ms, max "
          f"{max(ends) * 1000:.2f} ms (target < 10 ms); QPs moved per change: mean "
          f"{statistics.mean(moves):.2f}, max {max(moves)}; links over target afterwards: {excess}")
    print(f"one host's report in the coordinator's model (validate, update, place, answer; no HTTP): "
          f"{per_report * 1000:.2f} ms, so {len(fabric.hosts)} hosts take {per_report * len(fabric.hosts):.2f} s "
          f"of one core per report round")
    times, stuck, left = arrivals(fabric, random.Random(7), args.qps)   # a draw where solves end stuck
    print(f"hosts reporting in turn, a quarter of the leaf-spine links at half speed: {len(times)} solves, "
          f"median {statistics.median(times) * 1000:.1f} ms, max {max(times) * 1000:.0f} ms, "
          f"{sum(times):.1f} s in all; {stuck} ended outside some target (stuck or not yet met), "
          f"{left} QPs off target at the end")
    return 0


if __name__ == "__main__":
    sys.exit(main())
