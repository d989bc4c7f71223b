"""Balance of the whole fabric under many-to-many traffic, in one run: for each traffic matrix and
QPs per connection, the best possible max/mean (computed), kernel ECMP (mean and worst of the
trials), RLB's local rule alone (the coordinator stopped) and RLB coordinated, on the default
fabric (4 spines x 2 leaves x 2 hosts) and a wider one (4 spines x 4 leaves x 2 hosts).

Churn columns: the same matrix started on fresh QPs --churn-gap seconds after another job on the same
hosts ended (its QPs remembered by the hosts, idle): RLB coordinated (second burst) and the local
rule alone (first burst).

Every figure is the worst leaf's max/mean of bytes on its uplinks / on the downlinks into it,
from the spines' kernel counters, as QPs from every host of the matrix run at once (raw RoCEv2
frames, fresh source ports and QP numbers per trial). Coordinated figures are the second burst
of each trial: QPs appear in the first, take their placements while idle between bursts.

    .venv/bin/python bench/fabric_balance.py [--trials 5] [--fabrics fabric.toml fabric-4x4.toml]
(about 40 minutes with the defaults)"""
from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from rlbfabric import workloads  # noqa: E402
from rlblab.fabriclab import FabricLab  # noqa: E402
from rlblab.matrix import FORGET_S, run_matrix  # noqa: E402

LAB = Path(__file__).resolve().parent.parent / "lab"
MATRICES = ("pairs", "all-to-all", "ring", "permutation")


LATENCY: list[float] = []      # first packet -> every QP of the matrix placed (coordinated runs)


def trials(lab, kind: str, per_conn: int, n: int, bursts: int, pause: float,
           churn_gap: float | None = None, burst: int = -1) -> list[tuple[float, float]]:
    out = []
    for t in range(n):
        seed = 1000 * per_conn + 17 * t + MATRICES.index(kind)
        conns = workloads.connections(kind, lab.hosts, random.Random(seed))
        r = run_matrix(lab, conns, per_conn, packets=150, seed=seed, bursts=bursts, churn_gap_s=churn_gap)
        out.append(r.figures(burst))
        if r.placed_after_s is not None:
            LATENCY.append(r.placed_after_s)
        time.sleep(pause)
    return out


def best(lab, kind: str, per_conn: int, n: int) -> tuple[float, float]:
    from rlbfabric import balance
    vals = []
    for t in range(n):
        seed = 1000 * per_conn + 17 * t + MATRICES.index(kind)
        qps = workloads.connections(kind, lab.hosts, random.Random(seed)) * per_conn
        vals.append(balance.best_figures(lab.fabric, qps))
    return statistics.mean(v[0] for v in vals), statistics.mean(v[1] for v in vals)


def run_fabric(fabric: Path, n: int, qps: list[int], churn_gap: float, matrices=MATRICES) -> dict:
    results: dict = {}
    keys = [(m, c) for m in matrices for c in qps]
    base = FabricLab(fabric, "rlbbb", mode="baseline")
    try:
        base.up()
        base.wait_converged(180)
        for m, c in keys:
            print(f"  kernel ECMP: {m} x{c}", flush=True)
            results[(m, c)] = {"best": best(base, m, c, n), "ecmp": trials(base, m, c, n, 1, 0.2)}
    finally:
        base.down()
    lab = FabricLab(fabric, "rlbbr")
    try:
        lab.up()
        lab.wait_converged(180)
        for m, c in keys:
            print(f"  RLB coordinated: {m} x{c}", flush=True)
            results[(m, c)]["coord"] = trials(lab, m, c, n, 2, FORGET_S)
            print(f"  RLB coordinated, churn {churn_gap} s: {m} x{c}", flush=True)
            results[(m, c)]["coord_churn"] = trials(lab, m, c, n, 2, FORGET_S, churn_gap)
        lab.kill_agent("coordinator")
        time.sleep(4)           # hosts drop placements after 3 s without the coordinator
        for m, c in keys:
            print(f"  RLB local rule: {m} x{c}", flush=True)
            results[(m, c)]["local"] = trials(lab, m, c, n, 1, 0.5)
            print(f"  RLB local rule, churn {churn_gap} s: {m} x{c}", flush=True)
            results[(m, c)]["local_churn"] = trials(lab, m, c, n, 1, 0.5, churn_gap, burst=0)
    finally:
        lab.down()
    return results


def fmt(vals) -> str:
    return f"{statistics.mean(v[0] for v in vals):.2f}/{statistics.mean(v[1] for v in vals):.2f}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trials", type=int, default=5)
    ap.add_argument("--qps", type=int, nargs="+", default=[1, 2, 3], help="QPs per connection")
    ap.add_argument("--fabrics", nargs="+", default=["fabric.toml", "fabric-4x4.toml"])
    ap.add_argument("--matrices", nargs="+", default=list(MATRICES), choices=MATRICES)
    ap.add_argument("--churn-gap", type=float, default=0.6,
                    help="seconds between the last packet of a job that ends and the new QPs' first")
    args = ap.parse_args()
    t0 = time.time()
    tables = {}
    for f in args.fabrics:
        print(f"==> {f}", flush=True)
        tables[f] = run_fabric(LAB / f, args.trials, args.qps, args.churn_gap, args.matrices)
    print(f"\nworst leaf max/mean, uplinks/downlinks, kernel counters; mean of {args.trials} trials "
          f"(ECMP also the worst trial); churn: new QPs {args.churn_gap:g} s after a job ended")
    print(f"{'fabric':<17}{'matrix':<13}{'QPs':>4}{'best':>12}{'ECMP mean':>12}{'ECMP worst':>12}"
          f"{'RLB local':>12}{'RLB coord':>12}{'local churn':>12}{'coord churn':>12}")
    for f, res in tables.items():
        for (m, c), r in res.items():
            worst_ecmp = max(r["ecmp"], key=lambda v: max(v))
            print(f"{f:<17}{m:<13}{c:>4}{r['best'][0]:>7.2f}/{r['best'][1]:.2f}{fmt(r['ecmp']):>12}"
                  f"{worst_ecmp[0]:>7.2f}/{worst_ecmp[1]:.2f}{fmt(r['local']):>12}{fmt(r['coord']):>12}"
                  f"{fmt(r['local_churn']):>12}{fmt(r['coord_churn']):>12}")
    if LATENCY:
        print(f"\nplacements in effect (every QP of the matrix placed, from its first packet): median "
              f"{statistics.median(LATENCY):.2f} s, worst {max(LATENCY):.2f} s over {len(LATENCY)} matrices")
    print(f"\ndone in {time.time() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
