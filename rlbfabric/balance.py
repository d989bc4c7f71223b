"""How evenly a fabric's links are loaded, and how evenly they could be.

The figure for a side (uplinks or downlinks) is, per leaf, the most loaded link over the mean of
that leaf's links (by utilisation when capacities differ), then the worst leaf: the slowest link
is what a collective waits for. Leaves that carry nothing on that side are left out."""
from __future__ import annotations

import itertools
import math
import random
import statistics
from typing import Sequence


def max_over_mean(loads: Sequence[float], caps: Sequence[float] | None = None) -> float | None:
    """Most utilised link over the mean utilisation of one leaf's live links; None if idle."""
    caps = caps or [1.0] * len(loads)
    live = [(x, c) for x, c in zip(loads, caps) if c > 0]
    total, cap = sum(x for x, _ in live), sum(c for _, c in live)
    if total <= 0 or not live:
        return None
    return max(x / c for x, c in live) / (total / cap)


def worst(per_leaf: Sequence[float | None]) -> float:
    vals = [v for v in per_leaf if v is not None]
    return max(vals) if vals else 1.0


def best_max_over_mean(d: int, caps: Sequence[float]) -> float:
    """The lowest max/mean a leaf's links can have carrying d equal QPs (whole QPs per link):
    the smallest utilisation lambda with sum(floor(lambda * cap)) >= d, over d / (total cap).
    With equal capacities this is ceil(d / n) / (d / n)."""
    live = [c for c in caps if c > 0]
    if not d or not live:
        return 1.0
    lo, hi = 0.0, d / min(live)
    for _ in range(60):                     # bisection on lambda; the step function is monotone
        mid = (lo + hi) / 2
        if sum(math.floor(mid * c + 1e-9) for c in live) >= d:
            hi = mid
        else:
            lo = mid
    # snap to the exact candidate k / cap just at or above the bisection's answer
    lam = min(math.ceil(hi * c - 1e-9) / c for c in live if math.ceil(hi * c - 1e-9) / c >= hi - 1e-9)
    return lam / (d / sum(live))


def link_caps(fabric) -> dict[str, list[float]]:
    """Every leaf's uplinks' speed (Mb/s) in colour order, from the fabric file; a leaf-spine
    link's downlink has the same."""
    return {lf.name: [float(fabric.link_mbps_between(lf.name, fabric.pod_spines(lf.pod)[c // fabric.parallel].name))
                      for c in range(fabric.colours())] for lf in fabric.leaves}


def leaf_loads(fabric, placed) -> tuple[dict[str, list[int]], dict[str, list[int]]]:
    """QPs per uplink and per downlink of every leaf from (source, destination, colour or None)
    triples; QPs within a leaf (or unplaced) load no fabric link."""
    n = fabric.colours()
    leaf = {h: fabric.leaf_of_host(h)[0].name for h in fabric.hosts}
    up = {lf.name: [0] * n for lf in fabric.leaves}
    down = {lf.name: [0] * n for lf in fabric.leaves}
    for src, dst, c in placed:
        if c is None or leaf[src] == leaf[dst]:
            continue
        up[leaf[src]][c] += 1
        down[leaf[dst]][c] += 1
    return up, down


def figures(up: dict[str, list[float]], down: dict[str, list[float]],
            caps: dict[str, list[float]] | None = None, idle_below: float = 0) -> tuple[float, float]:
    """(uplinks, downlinks): the worst leaf's max/mean on each side. A leaf side carrying less than
    idle_below in all (measured bytes: routing protocols, neighbour discovery) counts as idle."""
    def side(loads):
        return worst([max_over_mean(v, caps.get(k) if caps else None) if sum(v) >= max(idle_below, 1e-12)
                      else None for k, v in loads.items()])
    return side(up), side(down)


def best_figures(fabric, qps: list[tuple[str, str]], caps: dict[str, list[float]] | None = None) -> tuple[float, float]:
    """The best (uplinks, downlinks) figures any placement of these QPs can reach: per leaf the
    bound of best_max_over_mean, which an equitable colouring meets on every leaf at once."""
    up, down = leaf_loads(fabric, [(s, d, 0) for s, d in qps])
    n = fabric.colours()

    def side(loads):
        return worst([best_max_over_mean(v[0], (caps or {}).get(k) or [1.0] * n) if v[0] else None
                      for k, v in loads.items()])
    return side(up), side(down)


def random_figures(fabric, qps: list[tuple[str, str]], samples: int = 2000, seed: int = 0,
                   caps: dict[str, list[float]] | None = None) -> tuple[float, float]:
    """The mean (uplinks, downlinks) figures when every QP takes a colour at random, as a hash
    over fresh source ports does (kernel ECMP's model; the benches measure the kernel itself)."""
    rnd = random.Random(seed)
    n = fabric.colours()
    got = [figures(*leaf_loads(fabric, [(s, d, rnd.randrange(n)) for s, d in qps]), caps) for _ in range(samples)]
    return statistics.mean(g[0] for g in got), statistics.mean(g[1] for g in got)


def searched_best(fabric, qps: list[tuple[str, str]], caps: dict[str, list[float]],
                  limit: int = 20000) -> float | None:
    """The lowest worst-leaf figure (uplinks and downlinks alike, by utilisation) of any
    placement of these QPs, by trying every one; None when there are more than `limit`. Unlike
    best_figures' per-leaf bound, this one is always reachable."""
    leaf = {h: fabric.leaf_of_host(h)[0].name for h in fabric.hosts}
    crossing = [(s, d) for s, d in qps if leaf[s] != leaf[d]]
    live = [[c for c in range(fabric.colours()) if caps[leaf[s]][c] > 0 and caps[leaf[d]][c] > 0]
            for s, d in crossing]
    if math.prod(len(x) for x in live) > limit:
        return None
    if not crossing:
        return 1.0
    return min(max(figures(*leaf_loads(fabric, [(s, d, c) for (s, d), c in zip(crossing, cols)]), caps))
               for cols in itertools.product(*live))
