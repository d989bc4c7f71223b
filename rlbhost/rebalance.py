"""Which QPs move so one weight entry's live QPs match its weights: a pure function of the QPs
and the weights, which HostDataplane.rebalance applies to the maps under their lock."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Hashable, Sequence

from rlbcommon.weights import grouped_release_targets, share_bounds


@dataclass(frozen=True)
class LiveQp:
    key: Hashable
    path: int                   # path index it is on
    created_ns: int
    # the coordinator placed it: on this path, or on another it takes once idle (the coordinator
    # changed its mind while it was active). Either way the sweep leaves it where it is: moving
    # it to the host's share would reorder its packets and undo the coordinator's layout, which
    # leans pairs off their even split where a link is down (rlbfabric/policy/spread.py)
    coordinated: bool = False
    # the path it held when the layout last stood still (None: where it is). A QP away from it
    # was moved by a change not yet settled: it moves again first, and back home when it can, so
    # a change that comes in two steps, or is taken back, moves no QP the net change keeps still
    home: int | None = None

    @property
    def away(self) -> bool:
        return self.home is not None and self.home != self.path


def moves(qps: Sequence[LiveQp], eff: Sequence[int], release: bool, group_size: int = 1, rotation: int = 0,
          before: Sequence[int] | None = None) -> list[tuple[LiveQp, int]]:
    """[(QP, the path index it moves to)]. `eff`: the entry's effective weight per path index
    (0: unusable). The periodic sweep (release False) only takes QPs from paths above their share
    rounded up and gives them to paths below it rounded down, then rounded up: a split within one
    QP of the shares is the local rule's to decide; it leaves a QP the coordinator placed where
    it is unless its path became unusable. After a change of capacity (release True) each
    path gets a target within one QP of its share that moves the fewest (`before`: the previous
    effective weights), across planes first and then over a plane's sub-ports when paths are
    grouped (group_size > 1: the sweep keeps each plane within one QP of its share too, since the
    data plane places new QPs per sub-port). QPs away from home move first, then the newest; a
    path that takes QPs takes back its own first."""
    n = len(eff)
    on = {i: [q for q in qps if q.path == i] for i in range(n)}
    if release or group_size > 1:
        lo = hi = grouped_release_targets([len(on[i]) for i in range(n)], eff, max(1, group_size), rotation,
                                          before if release else None)
    else:
        lo, hi = share_bounds(eff, len(qps))
    surplus: list[LiveQp] = []      # the end first
    for i in range(n):
        movable = [q for q in on[i] if release or not eff[i] or not q.coordinated]
        extra = min(len(on[i]) - hi[i], len(movable))
        if extra > 0:
            surplus += sorted(movable, key=lambda q: (q.away, q.created_ns))[-extra:]
    by_home: dict[int, list[LiveQp]] = {}
    for q in surplus:
        if q.away:
            by_home.setdefault(q.home, []).append(q)
    count = {i: len(on[i]) for i in range(n)}
    out: list[tuple[LiveQp, int]] = []
    given: set[int] = set()

    def give(q: LiveQp, i: int):
        given.add(id(q))
        count[q.path] -= 1
        count[i] += 1
        out.append((q, i))

    for bound in (lo, hi):
        for i in range(n):          # a path's own QPs back first
            mine = by_home.get(i, [])
            while mine and count[i] < bound[i]:
                q = mine.pop()
                if id(q) not in given:
                    give(q, i)
        for i in range(n):
            while count[i] < bound[i]:
                while surplus and id(surplus[-1]) in given:
                    surplus.pop()
                if not surplus:
                    break
                give(surplus.pop(), i)
    return out
