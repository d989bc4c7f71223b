"""Weighted slot tables with minimal disruption (resilient hashing).

A group's table maps hash & (SLOTS-1) to a member. Each member owns a number of slots
proportional to its weight (largest-remainder rounding, so every share is within 1/SLOTS of
its weight). When members or weights change, a slot keeps its owner if that owner is still
present and still has a quota left; only the surplus slots move, which is the minimum that
any table honouring the new weights can move."""
from __future__ import annotations

from typing import Hashable, Sequence

from rlbcommon.weights import apportion

__all__ = ["apportion", "build_slots", "moved_fraction"]


def build_slots(members: Sequence[Hashable], weights: Sequence[int], nslots: int,
                previous: Sequence[Hashable] | None = None) -> list[int]:
    """Slot table (member index per slot) for members with weights.

    previous is the old table expressed as member identities (e.g. next-hop ids), so a
    rebuild after any change keeps every slot it can."""
    if len(members) != len(weights):
        raise ValueError("one weight per member")
    if len(set(members)) != len(members):
        raise ValueError("members must be distinct")
    quota = apportion(weights, nslots)
    index = {m: i for i, m in enumerate(members)}
    table: list[int | None] = [None] * nslots
    if previous is not None:
        if len(previous) != nslots:
            raise ValueError("previous table has a different size")
        for s, m in enumerate(previous):
            i = index.get(m)
            if i is not None and quota[i] > 0:
                table[s] = i
                quota[i] -= 1
    # Spread each member's remaining slots evenly over the free ones (stride order), which
    # keeps a fresh table interleaved rather than in blocks.
    needs = sorted(((k + 0.5) / q, i) for i, q in enumerate(quota) for k in range(q))
    free = [s for s, owner in enumerate(table) if owner is None]
    assert len(free) == len(needs)
    for s, (_, i) in zip(free, needs):
        table[s] = i
    return table  # type: ignore[return-value]


def moved_fraction(old: Sequence[Hashable], new: Sequence[Hashable]) -> float:
    """Share of slots whose owner differs between two tables (given as identities)."""
    return sum(a != b for a, b in zip(old, new)) / len(old)
