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
