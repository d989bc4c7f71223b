"""Balance under churn in the coordinator's model (no namespaces), side by side: one job's QPs run
and go idle; `gap` seconds later a new job starts on fresh QPs while the hosts still remember the
old ones (QP memory 3 s). The figure is the new job's worst leaf max/mean by utilisation (uplinks
and downlinks), placed by the coordinator after the new QPs' first report, minus the best possible
for the new job alone (found by trying every placement where there are at most 20000, else the
per-leaf bound). Columns: every remembered QP weighed with the living (one generation: the
coordinator before generations) and QPs placed by generation (now); rows per fabric and matrix,
on the lab's even fabrics and on uneven ones generated at random (spines, hosts per leaf,
half-speed links). The new QPs start where the local rule puts them, as in a live fabric.

    .venv/bin/python bench/churn_sim.py [--trials 20] [--gaps 0.2 0.6 2]      (about a minute)"""
from __future__ import annotations

import argparse
import math
import random
import statistics
import sys
import time
import tomllib
import zlib
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from rlbfabric import balance, workloads  # noqa: E402
from rlbfabric.fabric import load, parse  # noqa: E402
from rlbfabric.policy import localrule  # noqa: E402
from rlbfabric.policy.qpplacer import QpInfo, QpPlacer  # noqa: E402
from rlblab.fabricgen import make_fabric, random_fabric  # noqa: E402

LAB = Path(__file__).resolve().parent.parent / "lab"
MATRICES = ("pairs", "permutation", "all-to-all", "ring")
MEMORY_S = 3.0          # the hosts' QP memory (rlbhost/coordclient.py)
BURST_S = 0.3           # how long the new QPs have run at their first report


def fabrics(rnd: random.Random) -> dict[str, list]:
    uneven = [parse(tomllib.loads(random_fabric(rnd))) for _ in range(8)]
    return {"fabric.toml": [load(LAB / "fabric.toml")], "fabric-4x4.toml": [load(LAB / "fabric-4x4.toml")],
            "3 spines, leaves 3/2/1 hosts": [parse(tomllib.loads(make_fabric(3, 3, [3, 2, 1])))],
            "4x3, 2 links half speed": [parse(tomllib.loads(make_fabric(4, 3, 2, slow={(1, 2): 5000, (3, 4): 5000})))],
            "generated uneven (8)": uneven}


def start_paths(fab, qps) -> list[int | None]:
    """Where the local rule puts QPs arriving in this order (path values), as hosts do."""
    return [None if p is None else p + 1 for p in localrule.simulate(fab, qps)]


def figure(fab, pl, keys, qps) -> float:
    up, down = balance.leaf_loads(fab, [(s, d, pl.colour(k) if k in pl.qps else None) for k, (s, d) in zip(keys, qps)])
    caps = {lf.name: pl.caps(lf.name) for lf in fab.leaves}
    return max(balance.figures(up, down, caps))


def best(fab, pl, qps) -> float:
    """By trying every placement where that is quick, else the per-leaf bound (which uneven
    fabrics cannot always reach)."""
    caps = {lf.name: pl.caps(lf.name) for lf in fab.leaves}
    found = balance.searched_best(fab, qps, caps)
    return found if found is not None else max(balance.best_figures(fab, qps, caps))


def trial(fab, kind: str, per_conn: int, gap: float, rnd: random.Random, gap_s: float) -> float | None:
    """Excess of the new job over its best, for a coordinator grouping generations gap_s apart
    (math.inf: one generation)."""
    if kind == "pairs" and len(fab.hosts) % 2:
        return None
    every = {k: 1.0 for k in range(1, fab.paths + 1)}
    pl = QpPlacer(fab, gap_s=gap_s)
    old = workloads.connections(kind, fab.hosts, rnd) * per_conn
    new = workloads.connections(kind, fab.hosts, rnd) * per_conn
    if not any(pl.leaf_of_host[s] != pl.leaf_of_host[d] for s, d in new):
        return None
    t = 100.0
    for i, ((s, d), p) in enumerate(zip(old, start_paths(fab, old))):
        pl.add(("old", i), QpInfo(s, d, p, every))
    pl.solve(now=t)
    if gap + BURST_S < MEMORY_S:        # still remembered when the new QPs are first reported
        for i, (s, d) in enumerate(old):
            pl.update(("old", i), QpInfo(s, d, pl.path(("old", i)), every, last=t))
    else:
        for i in range(len(old)):
            pl.remove(("old", i))
    keys = [("new", i) for i in range(len(new))]
    for k, (s, d), p in zip(keys, new, start_paths(fab, new)):
        pl.add(k, QpInfo(s, d, p, every))
    pl.solve(now=t + gap + BURST_S)
    return figure(fab, pl, keys, new) - best(fab, pl, new)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trials", type=int, default=20, help="trials per row (per generated fabric: trials / 4)")
    ap.add_argument("--gaps", type=float, nargs="+", default=[0.2, 0.6, 2.0])
    ap.add_argument("--seed", type=int, default=28)
    args = ap.parse_args()
    t0 = time.time()
    rnd = random.Random(args.seed)
    print("new job's worst leaf max/mean by utilisation minus the best possible for it (mean / worst "
          f"trial); {args.trials} trials per row; hosts remember idle QPs {MEMORY_S:g} s")
    print(f"{'fabric':<30}{'matrix':<13}{'gap':>5}{'one generation':>18}{'by generation':>18}")
    for name, fabs in fabrics(rnd).items():
        for kind in MATRICES:
            for gap in args.gaps:
                cols = []
                for gap_s in (math.inf, 0.1):
                    vals = []
                    for n in range(args.trials):
                        fab = fabs[n % len(fabs)]
                        seed = zlib.crc32(f"{args.seed} {name} {kind} {gap} {n}".encode())
                        v = trial(fab, kind, 1 + n % 3, gap, random.Random(seed), gap_s)
                        if v is not None:
                            vals.append(v)
                    cols.append(f"{statistics.mean(vals):.2f} / {max(vals):.2f}" if vals else "-")
                print(f"{name:<30}{kind:<13}{gap:>5g}{cols[0]:>18}{cols[1]:>18}", flush=True)
    print(f"\ndone in {time.time() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
