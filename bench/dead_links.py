"""The coordinator's placement with leaf-spine links down, side by side: FARE's even split of each
pair over the colours it can use (the baseline, Placement(lean=False)) against the split that
leans the other pairs onto the colours the cut-off pairs cannot use (rlbfabric/policy/spread.py).
No namespaces: the placement alone, as the coordinator runs it.

Per case: the worst leaf's max/mean over its live links (uplinks, downlinks; 1.00 is even), next
to the per-leaf bound; the full solve's time; then QPs arriving and ending one at a time (a solve
after each): the median and 99th percentile of a solve, and the worst leaf after the churn.

    .venv/bin/python bench/dead_links.py [--seed 1] [--churn 200]"""
from __future__ import annotations

import argparse
import itertools
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from rlbfabric import balance  # noqa: E402
from rlbfabric.policy.placement import DOWN, UP, Placement  # noqa: E402

# (leaves, colours, QPs: "a2a:N" N per leaf pair or a random count, links down as (leaf, colour))
CASES = [(3, 3, "a2a:12", [(1, 2)]), (4, 4, "a2a:8", [(1, 3)]), (8, 4, "a2a:6", [(0, 1), (5, 2)]),
         (16, 8, "2000", []), (16, 8, "2000", [(3, 5)]), (64, 8, "16384", []), (64, 8, "16384", [(3, 5)]),
         (64, 8, "16384", [(3, 5), (40, 2), (41, 2)])]


def qps_of(leaves: int, spec: str, rnd: random.Random) -> list[tuple[int, int]]:
    if spec.startswith("a2a:"):
        return [p for p in itertools.permutations(range(leaves), 2) for _ in range(int(spec[4:]))]
    return [tuple(rnd.sample(range(leaves), 2)) for _ in range(int(spec))]


def worst(p: Placement, caps: list[list[float]]) -> tuple[float, float]:
    up, down = p.loads()
    return balance.figures(dict(enumerate(up)), dict(enumerate(down)), dict(enumerate(caps)))


def run(lean: bool, leaves: int, colours: int, spec: str, caps: list[list[float]], seed: int, churn: int) -> dict:
    rnd = random.Random(seed)
    p = Placement(leaves, colours, lean=lean)
    for v in range(leaves):
        p.set_capacity(v, UP, caps[v])
        p.set_capacity(v, DOWN, caps[v])
    for k, (a, b) in enumerate(qps_of(leaves, spec, rnd)):
        p.add(k, a, b)
    t = time.perf_counter()
    p.solve()
    full = time.perf_counter() - t
    first = worst(p, caps)
    times, moved = [], 0
    for j in range(churn):
        if rnd.random() < 0.5:
            p.add(("new", j), *rnd.sample(range(leaves), 2))
        else:
            p.remove(rnd.choice(list(p.qps)))
        t = time.perf_counter()
        moved += len(p.solve())
        times.append(time.perf_counter() - t)
    times.sort()
    return {"fig": first, "full_s": full, "med_ms": times[len(times) // 2] * 1e3 if times else 0,
            "p99_ms": times[int(len(times) * 0.99)] * 1e3 if times else 0, "after": worst(p, caps), "moved": moved}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--churn", type=int, default=200, help="QPs arriving or ending one at a time, after the full solve")
    args = ap.parse_args()
    print(f"{'leaves x colours, QPs, links down':<40}{'split':<7}{'worst leaf':>12}{'bound':>7}{'full s':>8}"
          f"{'solve ms (med/p99)':>20}{'after churn':>13}")
    for leaves, colours, spec, dead in CASES:
        caps = [[0.0 if (v, c) in dead else 1.0 for c in range(colours)] for v in range(leaves)]
        qps = qps_of(leaves, spec, random.Random(args.seed))
        per_leaf = [sum(1 for a, _ in qps if a == v) for v in range(leaves)] + \
                   [sum(1 for _, b in qps if b == v) for v in range(leaves)]
        bound = max(balance.best_max_over_mean(d, caps[i % leaves]) for i, d in enumerate(per_leaf) if d)
        name = f"{leaves}x{colours}, {spec.replace('a2a:', 'all-to-all x')}, {len(dead)} down"
        for lean in (False, True):
            r = run(lean, leaves, colours, spec, caps, args.seed, args.churn)
            print(f"{name if not lean else '':<40}{'lean' if lean else 'FARE':<7}{max(r['fig']):>12.3f}{bound:>7.3f}"
                  f"{r['full_s']:>8.2f}{r['med_ms']:>10.2f} /{r['p99_ms']:>7.1f}{max(r['after']):>13.3f}")


if __name__ == "__main__":
    main()
