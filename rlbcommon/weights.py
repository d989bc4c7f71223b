"""Splitting a whole number of things (slots, QPs) by weights: one rule for both agents."""
from __future__ import annotations

from typing import Sequence


def apportion(weights: Sequence[float], total: int) -> list[int]:
    """Split total by weight, largest remainder first (ties to the lower index).
    Every share is within one unit of its exact value."""
    if any(w < 0 for w in weights):
        raise ValueError("weights must not be negative")
    wsum = sum(weights)
    if wsum == 0:
        raise ValueError("at least one member needs a positive weight")
    exact = [w * total / wsum for w in weights]
    counts = [int(x) for x in exact]
    order = sorted(range(len(weights)), key=lambda i: (-(exact[i] - counts[i]), i))
    for i in order[: total - sum(counts)]:
        counts[i] += 1
    return counts
