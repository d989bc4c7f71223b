"""How the QPs of each leaf pair should split over the colours when some pairs cannot use them all:
the fractional optimum the placement's targets are rounded from (placement.py).

Why. FARE's split gives each pair's QPs to its colours in proportion to their paths' bandwidth.
While every pair can use every colour that is the best split as well, but not once some cannot:
with leaf l2's link to spine s3 down, l1's QPs to l2 must share s1 and s2, and l1's QPs to l3 split
evenly over all three load s1 and s2 with a third more than s3 (an all-to-all over three leaves:
10/10/4 QPs on l1's uplinks, where 8/8/8 is possible). The pairs that can use s3 should lean on it.

How. The split minimising the sum over links of load^2 / capacity: at its optimum each pair uses
only the colours where its two links' utilisations add up to the least, which evens out every
leaf's links as far as the pairs' restrictions allow (with equal capacities and nothing restricted
that is FARE's even split). Found by block coordinate descent: each pair in turn takes the split
that is best given everyone else's (water-filling its QPs onto its colours by the sum of its two
links' utilisations), until no pair moves more than a small part of a QP. The objective is
convex and each step its exact minimum over one pair, so the sweeps converge; they start from the
previous split, so a change of a few QPs costs a sweep or two."""
from __future__ import annotations

from dataclasses import dataclass

TOLERANCE = 0.01        # a sweep in which no pair moves more than this part of a QP ends the descent
MAX_SWEEPS = 50


@dataclass
class Split:
    """One pair's QPs: their two link sets (keys of the loads), the colours they may use, and how
    many sit on each colour (fractional; updated in place)."""
    up: object
    down: object
    allowed: list[int]
    x: list[float]


def water_fill(size: float, allowed: list[int], level0: list[float], slope: list[float]) -> dict[int, float]:
    """size shared over the allowed colours minimising sum(level0[c] * x + slope[c] * x^2 / 2):
    x[c] = max(0, (L - level0[c]) / slope[c]) with the level L where they add up to size."""
    order = sorted(allowed, key=lambda c: level0[c])
    width = 0.0          # sum of 1/slope over the colours the level has reached
    reach = 0.0          # sum of level0/slope over them
    for i, c in enumerate(order):          # (allowed is never empty: the last colour ends the loop)
        width += 1.0 / slope[c]
        reach += level0[c] / slope[c]
        n = i + 1
        level = (size + reach) / width
        if i + 1 == len(order) or level <= level0[order[i + 1]]:
            break
    return {c: max(0.0, (level - level0[c]) / slope[c]) for c in order[:n]}


def spread(splits: list[Split], loads: dict, inverse: dict, max_sweeps: int = MAX_SWEEPS) -> int:
    """Moves every split towards the optimum; `loads` (link set -> load per colour, every split's
    share included, and any load that stays put) are kept up to date; `inverse` is 1 / capacity
    per colour (every allowed colour's links alive). Returns the sweeps made."""
    for sweep in range(1, max_sweeps + 1):
        moved = 0.0
        for s in splits:
            up, down, iu, idn = loads[s.up], loads[s.down], inverse[s.up], inverse[s.down]
            size = 0.0
            for c in s.allowed:
                size += s.x[c]
                up[c] -= s.x[c]
                down[c] -= s.x[c]
            level0 = [0.0] * len(s.x)
            slope = [0.0] * len(s.x)
            for c in s.allowed:
                level0[c] = up[c] * iu[c] + down[c] * idn[c]
                slope[c] = iu[c] + idn[c]
            new = water_fill(size, s.allowed, level0, slope) if size > 0 else {}
            for c in s.allowed:
                x = new.get(c, 0.0)
                moved = max(moved, abs(x - s.x[c]))
                s.x[c] = x
                up[c] += x
                down[c] += x
        if moved < TOLERANCE:
            return sweep
    return max_sweeps
