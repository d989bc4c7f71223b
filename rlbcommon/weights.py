"""Splitting a whole number of things (slots, QPs) by weights: one rule for both agents."""
from __future__ import annotations

import math
from typing import Sequence


def apportion(weights: Sequence[float], total: int, first: int = 0) -> list[int]:
    """Split total by weight, largest remainder first (ties to the member first met going round
    from index `first`). Every share is within one unit of its exact value."""
    if any(w < 0 for w in weights):
        raise ValueError("weights must not be negative")
    wsum = sum(weights)
    if wsum == 0:
        raise ValueError("at least one member needs a positive weight")
    exact = [w * total / wsum for w in weights]
    counts = [int(x) for x in exact]
    n = len(weights)
    order = sorted(range(n), key=lambda i: (-(exact[i] - counts[i]), (i - first) % n))
    for i in order[: total - sum(counts)]:
        counts[i] += 1
    return counts


def share_bounds(weights: Sequence[float], total: int) -> tuple[list[int], list[int]]:
    """Each member's share of total by weight, rounded down and up (a member at either bound is
    within one unit of its exact share). Zero weight: 0 and 0."""
    wsum = sum(w for w in weights if w > 0)
    if wsum <= 0:
        raise ValueError("at least one member needs a positive weight")
    exact = [w * total / wsum if w > 0 else 0.0 for w in weights]
    return [math.floor(x + 1e-9) for x in exact], [math.ceil(x - 1e-9) for x in exact]


def _fractions(weights: Sequence[float]) -> list[float]:
    wsum = sum(w for w in weights if w > 0)
    return [max(w, 0) / wsum if wsum > 0 else 0.0 for w in weights]


def release_targets(counts: Sequence[int], weights: Sequence[float], total: int, first: int = 0,
                    before: Sequence[float] | None = None) -> list[int]:
    """After a change of weights (from `before`), how many each member should hold so that as
    few as possible move (draft-fare-scale-up §3.1). A member whose share fell and that holds more
    than its new exact share releases the excess rounded up (keeps its share rounded down); any
    other member keeps what it holds if that is within one of its share, else the nearer bound;
    then the sum is made `total`, first where that means moving fewer, then by largest remainder,
    ties going round from `first`. Every target is within one of its exact share."""
    n = len(weights)
    lo, hi = share_bounds(weights, total)
    exact = [f * total for f in _fractions(weights)]
    if before is not None and sum(w for w in before if w > 0) > 0:
        old, new = _fractions(before), _fractions(weights)
        ceil = list(hi)
        degraded = [i for i in range(n) if new[i] < old[i] - 1e-12 and counts[i] > exact[i] + 1e-9]
        for i in degraded:
            hi[i] = lo[i]          # degraded: releases the proportional excess, rounded up
        # the units left over when every member holds at most its bound go back to degraded
        # members, largest remainder first
        for i in sorted(degraded, key=lambda i: -(exact[i] - lo[i])):
            if sum(hi) >= total:
                break
            hi[i] = ceil[i]
    t = [min(max(counts[i], lo[i]), hi[i]) for i in range(n)]
    rot = [(i - first) % n for i in range(n)]
    while sum(t) > total:   # one unit less: first where that means moving fewer in
        i = min((i for i in range(n) if t[i] > lo[i]),
                key=lambda i: (t[i] <= counts[i], exact[i] - lo[i], -rot[i]))
        t[i] -= 1
    while sum(t) < total:   # one unit more: first where that means moving fewer out
        i = min((i for i in range(n) if t[i] < hi[i]),
                key=lambda i: (t[i] >= counts[i], -(exact[i] - lo[i]), rot[i]))
        t[i] += 1
    return t


def grouped_release_targets(counts: Sequence[int], weights: Sequence[float], group_size: int,
                            first: int = 0, before: Sequence[float] | None = None) -> list[int]:
    """release_targets across groups of `group_size` consecutive members (a plane's sub-ports)
    by the groups' total weights, then within each group for its target: QPs split across planes
    by the planes' path bandwidth and evenly (by weight) over a plane's live members."""
    total = sum(counts)
    groups = [list(range(g, min(g + group_size, len(weights)))) for g in range(0, len(weights), group_size)]

    def gsum(ws, g):
        return sum(ws[i] for i in g if ws[i] > 0)
    gt = release_targets([sum(counts[i] for i in g) for g in groups], [gsum(weights, g) for g in groups],
                         total, first // group_size, [gsum(before, g) for g in groups] if before else None)
    out = [0] * len(weights)
    for g, target in zip(groups, gt):
        if target:
            sub = release_targets([counts[i] for i in g], [weights[i] for i in g], target,
                                  first - g[0] if first in g else 0,
                                  [before[i] for i in g] if before else None)
            for i, v in zip(g, sub):
                out[i] = v
    return out
