"""Placing QPs on fabric colours so that every leaf uplink and every spine->leaf downlink carries
its weighted share: the coordinator's algorithm, pure (no I/O, no clock).

The model. A colour is one of a leaf's uplinks (spine, link); a QP from a host on leaf a to a host
on leaf b that rides colour c loads leaf a's uplink c and the downlink c into leaf b (the address
plan pins colour c to the same spine at both ends). So the QPs are the edges of a bipartite
multigraph between source leaves (uplink side) and destination leaves (downlink side), and a
placement is an edge colouring. Each side of each leaf has a capacity per colour (0 = dead).

The target. As FARE weighs a path by its narrowest link, the QPs from leaf a to leaf b are due to
colour c in proportion to min(uplink a,c ; downlink c,b); a link's share is the sum of the shares
of the QPs that may cross it, and its load must lie between that share rounded down and rounded up
("within one QP"). With equal capacities a colouring meeting every target at once always exists
(de Werra's equitable edge colouring of bipartite multigraphs): every leaf's worst link then
carries exactly ceil(d/U) QPs, the best possible. With unequal capacities "rounded up" is not
enough: two QPs with shares 0.67, 0.67, 0.33, 0.33 over two full and two half-speed links must not
sit on a half-speed one. So only as many links as the fractional parts add up to may take their
extra QP, those whose utilisation stays lowest with it (water-filling): the smallest maximum
utilisation a rounding can reach. Where some pairs cannot use a colour their leaves have alive (a
link down at the other end, a host's zero weight), FARE's split is not the best: the pairs at those
leaves take spread.py's split instead, which leans the others onto that colour.

Base load. A Placement may carry loads it does not place (set_base): the links' QPs of a tier
placed before it (qpplacer.py places the QPs active now first, remembered idle ones in the room
left). Shares then fill the room above the base, and utilisation counts base and own QPs.

The method (de Werra's proof, made incremental). Keep the current colouring; place a new QP on the
colour least loaded at both ends; then, while some link is outside its target, find by
breadth-first search an alternating alpha/beta chain (a Kempe chain): recolour one QP at the
vertex from alpha to beta, which moves alpha to beta at the QP's other end too; if that end can
take it the chain stops, else one of its beta QPs turns alpha, and so on. Inner vertices keep their
loads, so every chain lowers the total distance to the targets by at least one: the search ends,
and moves are few. Dead links and per-QP restrictions can leave no two-colour chain; then a chain
may turn to a third colour where a vertex has room for it.

A QP may also carry weights of its own per colour (its host's view of each path: 0 = not allowed,
0.5 = half the capacity); they multiply its path weights.

Work is done on counts per (source leaf, destination leaf, QP weights) group, so a full
placement of 16 k QPs over 64 leaves costs a few thousand group operations, not per-QP searches."""
from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import Hashable, Iterable

from .spread import MAX_SWEEPS, Split, spread

UP, DOWN = 0, 1          # the two sides of a leaf: its uplinks, and the downlinks into it
EPS = 1e-9
NORM_CACHE = 4096        # distinct QP weight vectors remembered normalised
ESCAPE_TRIES = 32        # sideways steps tried per solve where no chain improves,
ESCAPE_WORK = 100_000    # ... and QP groups their chain searches may look at (about 20 ms of one core here)
LOCAL_SWEEPS = 3         # spread.py's sweeps after a change of QPs (up to its MAX_SWEEPS after one of capacities)


@dataclass
class _Group:
    """QPs from leaf a to leaf b with the same weights per colour, by colour."""
    a: int
    b: int
    weights: tuple[float, ...]
    mask: int
    members: list[list] = field(default_factory=list)    # per colour: QP keys (newest last)
    size: int = 0                                        # QPs in the group, placed or not
    frac: list[float] = field(default_factory=list)      # each colour's share of one QP
    restricted: bool = False          # barred from a colour that one of its leaves' links has alive

    @property
    def key(self) -> tuple:
        return self.a, self.b, self.weights

    def leaf(self, side: int) -> int:
        return self.a if side == UP else self.b


@dataclass
class _Qp:
    group: _Group
    colour: int | None


def add_loads(into: list[list[list[int]]], loads: list[list[list[int]]]):
    """Loads per [side][leaf][colour] (Placement.loads()) added into `into`."""
    for s0, s1 in zip(into, loads):
        for r0, r1 in zip(s0, s1):
            for c, x in enumerate(r1):
                r0[c] += x


def _viol(load: int, lo: int, hi: int) -> int:
    return max(0, load - hi) + max(0, lo - load)


def _round_up(share: list[float], d: int, cap: list[float], base: list[int]) -> list[int]:
    """Upper targets: every link its share rounded down, and the extra QPs the fractions add up
    to on the links where one more QP leaves the utilisation (base + QPs over capacity) lowest;
    links tied at that level may all take one."""
    hi = [math.floor(x + EPS) for x in share]
    need = d - sum(hi)
    frac = [c for c, x in enumerate(share) if x - hi[c] > EPS and cap[c] > 0]
    if need <= 0 or not frac:
        return hi
    if need >= len(frac):
        for c in frac:
            hi[c] += 1
        return hi
    level = sorted(((base[c] + hi[c] + 1) / cap[c], c) for c in frac)
    cut = level[need - 1][0]
    for lvl, c in level:
        if lvl <= cut + EPS:
            hi[c] += 1
    return hi


def _fill(d: int, cap: list[float], base: list[int]) -> list[float] | None:
    """Shares of d QPs over links already carrying `base`, filling the lowest utilisation
    first (water-filling: the level L with sum of max(0, L*cap - base) = d); None if no link
    is alive."""
    live = [c for c, x in enumerate(cap) if x > 0]
    if not live:
        return None
    order = sorted(live, key=lambda c: base[c] / cap[c])
    share = [0.0] * len(cap)
    # raise the level across the links it has reached until the QPs are used up
    room, i, level = float(d), 0, base[order[0]] / cap[order[0]]
    while i < len(order):
        j = i + 1
        while j < len(order) and base[order[j]] / cap[order[j]] <= level + EPS:
            j += 1
        width = sum(cap[c] for c in order[:j])
        nxt = base[order[j]] / cap[order[j]] if j < len(order) else math.inf
        if room <= (nxt - level) * width + EPS:
            level += room / width
            break
        room -= (nxt - level) * width
        level, i = nxt, j
    for c in live:
        share[c] = max(0.0, level * cap[c] - base[c])
    return share


class Placement:
    """Colours for QPs across a fabric of n_leaves leaves with n_colours uplinks each.

    add()/remove() change the demand, set_capacity() the links; solve() brings the colouring back
    to the targets with few moves and returns the keys whose colour changed."""

    def __init__(self, n_leaves: int, n_colours: int, lean: bool = True):
        """lean False: every pair's share is FARE's split even where a link is down (spread.py's
        is not taken), as before 2026-12-01: the baseline bench/dead_links.py compares with."""
        if n_leaves < 1 or not 1 <= n_colours <= 64:
            raise ValueError("need at least one leaf and 1-64 colours")
        self.n_leaves, self.n_colours = n_leaves, n_colours
        self.lean = lean
        self.cap = [[[1.0] * n_colours for _ in range(n_leaves)] for _ in (UP, DOWN)]
        self.top = [[1.0] * n_leaves for _ in (UP, DOWN)]         # each link set's fastest link
        self.load = [[[0] * n_colours for _ in range(n_leaves)] for _ in (UP, DOWN)]
        self.lo = [[[0] * n_colours for _ in range(n_leaves)] for _ in (UP, DOWN)]
        self.hi = [[[0] * n_colours for _ in range(n_leaves)] for _ in (UP, DOWN)]
        self.share = [[[0.0] * n_colours for _ in range(n_leaves)] for _ in (UP, DOWN)]
        self.base = [[[0] * n_colours for _ in range(n_leaves)] for _ in (UP, DOWN)]
        self.groups: dict[tuple[int, int, int], _Group] = {}
        self.at: list[list[list[_Group]]] = [[[] for _ in range(n_leaves)] for _ in (UP, DOWN)]
        self.qps: dict[Hashable, _Qp] = {}
        self.all_colours = (1 << n_colours) - 1
        self.unplaced: dict = {}          # keys without a colour, in arrival order
        self._norm: dict[tuple, tuple] = {}   # a QP's weights as given -> as grouped (read per QP added)
        self._caps_changed = False
        self._dirty: set[tuple[int, int]] = set()     # vertices whose targets need recomputing
        # per vertex, what its QPs ask for: [QPs, share per colour, path capacity per colour or
        # None]; dropped when its QPs or any capacity change, kept when only its base does (the
        # other shards' loads change it often: coord/shards.py)
        self._demand: dict[tuple[int, int], list] = {}
        self._touched: set[tuple[int, int]] = set()   # vertices whose loads changed since solve()
        self._unsettled: set[tuple[int, int]] = set() # vertices solve() left outside their targets
        self._restricted: set[tuple] = set()   # groups barred from a colour alive at one of their leaves
        self._spread: set[tuple] = set()       # groups whose shares are spread.py's, not FARE's split
        self._stuck_at: int | None = None   # the state (loads, targets) no sideways step improved
        self._work = 0                     # groups the chain searches looked at (bounds the sideways steps)

    # ---- demand and capacity ------------------------------------------------------------
    def set_capacity(self, leaf: int, side: int, caps: Iterable[float]):
        caps = [float(c) for c in caps]
        if len(caps) != self.n_colours or any(c < 0 or math.isnan(c) for c in caps):
            raise ValueError(f"{self.n_colours} non-negative capacities expected, got {caps}")
        if caps != self.cap[side][leaf]:
            self.cap[side][leaf] = caps
            self.top[side][leaf] = max(caps)
            self._caps_changed = True

    def set_base(self, leaf: int, side: int, loads: list[int]):
        """QPs on each colour of one link set that this placement does not move (a higher tier's)."""
        if len(loads) != self.n_colours:
            raise ValueError(f"{self.n_colours} base loads expected, got {loads}")
        if loads != self.base[side][leaf]:
            self.base[side][leaf] = list(loads)
            self._dirty.add((side, leaf))

    def add(self, key: Hashable, a: int, b: int, allowed: int | None = None, colour: int | None = None,
            weights: Iterable[float] | None = None):
        """A QP from leaf a to leaf b (a != b): the colours it may use as a bit mask (default all)
        or its own weight per colour (0: not allowed), and its current colour if it has one
        (kept when that colour is allowed and alive)."""
        if key in self.qps:
            raise KeyError(f"QP {key!r} is already placed")
        if a == b or not (0 <= a < self.n_leaves and 0 <= b < self.n_leaves):
            raise ValueError(f"QP {key!r}: leaves {a} -> {b}: must be two different leaves")
        if weights is None:
            mask = self.all_colours if allowed is None else allowed & self.all_colours
            w = tuple(1.0 if mask >> c & 1 else 0.0 for c in range(self.n_colours))
        else:
            given = tuple(weights)
            w = self._norm.get(given)
            if w is None:
                w = tuple(float(x) for x in given)
                if len(w) != self.n_colours or any(x < 0 or not math.isfinite(x) for x in w):
                    raise ValueError(f"QP {key!r}: {self.n_colours} finite non-negative weights expected, got {w}")
                top = max(w) or 1.0
                w = tuple(round(x / top, 6) for x in w)     # equal ratios share a group
                if len(self._norm) >= NORM_CACHE:           # hosts' weights vary little; bounded all the same
                    self._norm.clear()
                self._norm[given] = w
        g = self.groups.get((a, b, w))
        if g is None:
            mask = sum(1 << c for c, x in enumerate(w) if x > 0)
            g = self.groups[(a, b, w)] = _Group(a, b, w, mask, [[] for _ in range(self.n_colours)])
            self._weigh(g)
            self.at[UP][a].append(g)
            self.at[DOWN][b].append(g)
        g.size += 1
        self._dirty |= {(UP, a), (DOWN, b)}
        self._demand.pop((UP, a), None)
        self._demand.pop((DOWN, b), None)
        self.qps[key] = q = _Qp(g, None)
        if colour is not None and 0 <= colour < self.n_colours and self._usable(g, colour):
            self._set(key, q, colour)
        else:
            self.unplaced[key] = None

    def remove(self, key: Hashable) -> bool:
        q = self.qps.pop(key, None)
        if q is None:
            return False
        if q.colour is None:
            self.unplaced.pop(key, None)
        else:
            self._unset(key, q)
        g = q.group
        g.size -= 1
        self._dirty |= {(UP, g.a), (DOWN, g.b)}
        self._demand.pop((UP, g.a), None)
        self._demand.pop((DOWN, g.b), None)
        if g.size == 0:                 # freed: groups come and go with weights and leaf pairs
            del self.groups[g.key]
            self._restricted.discard(g.key)
            self._spread.discard(g.key)
            for side, v in ((UP, g.a), (DOWN, g.b)):
                self.at[side][v] = [x for x in self.at[side][v] if x is not g]
        return True

    def colour(self, key: Hashable) -> int | None:
        return self.qps[key].colour

    def __contains__(self, key) -> bool:
        return key in self.qps

    def __len__(self) -> int:
        return len(self.qps)

    # ---- bookkeeping --------------------------------------------------------------------
    def _set(self, key, q: _Qp, c: int):
        g = q.group
        q.colour = c
        g.members[c].append(key)
        self.load[UP][g.a][c] += 1
        self.load[DOWN][g.b][c] += 1
        self._touched |= {(UP, g.a), (DOWN, g.b)}

    def _unset(self, key, q: _Qp):
        g, c = q.group, q.colour
        g.members[c].remove(key)
        self.load[UP][g.a][c] -= 1
        self.load[DOWN][g.b][c] -= 1
        self._touched |= {(UP, g.a), (DOWN, g.b)}
        q.colour = None

    def _move_one(self, g: _Group, frm: int, to: int):
        key = g.members[frm][-1]          # the newest QP of the group on that colour moves
        q = self.qps[key]
        self._unset(key, q)
        self._set(key, q, to)
        return key

    def _usable(self, g: _Group, c: int) -> bool:
        return bool(g.mask >> c & 1) and self.cap[UP][g.a][c] > 0 and self.cap[DOWN][g.b][c] > 0

    def _weigh(self, g: _Group):
        """A path's weight is its narrowest link (FARE), capped by the QP's own weight for it
        (both relative to their largest: a host whose weights already follow the links' speeds
        is not counted twice); one QP's share of each colour."""
        path = [min(self.cap[UP][g.a][c], self.cap[DOWN][g.b][c]) for c in range(self.n_colours)]
        top = max(path)
        w = [min(x / top, g.weights[c]) if top > 0 else 0.0 for c, x in enumerate(path)]
        total = sum(w)
        g.frac = [x / total for x in w] if total > 0 else [0.0] * self.n_colours
        g.restricted = any(not f and (self.cap[UP][g.a][c] > 0 or self.cap[DOWN][g.b][c] > 0)
                           for c, f in enumerate(g.frac))
        if g.restricted:
            self._restricted.add(g.key)
        else:
            self._restricted.discard(g.key)
        self._spread.discard(g.key)

    # ---- targets ------------------------------------------------------------------------
    def _retarget(self):
        self._touched |= self._dirty
        full = False
        if self._caps_changed:
            for g in self.groups.values():
                self._weigh(g)
            self._dirty = {(s, v) for s in (UP, DOWN) for v in range(self.n_leaves)}
            self._touched |= self._dirty
            self._demand = {}
            self._caps_changed = False
            full = True
        if self.lean and self._dirty and (self._restricted or self._spread):
            self._respread(full or not self._spread or not self._restricted)
        for side, v in self._dirty:
            d, share = self._vertex_demand(side, v)
            share = list(share)
            base = self.base[side][v]
            if d and any(base):   # the room left, by the paths' narrowest links as the shares are
                demand = self._demand[(side, v)]
                if demand[2] is None:
                    demand[2] = self._path_caps(side, v, d)
                share = _fill(d, demand[2], base) or share
            self.share[side][v] = share
            self.lo[side][v] = [math.floor(x + EPS) for x in share]
            self.hi[side][v] = _round_up(share, d, self.cap[side][v], base)
        self._dirty = set()

    def _vertex_demand(self, side: int, v: int) -> tuple[int, list[float]]:
        """A link set's QPs and their shares per colour (cached until its QPs or capacities change;
        _respread keeps the cached shares up to date as it moves groups' splits)."""
        demand = self._demand.get((side, v))
        if demand is None:
            share, d = [0.0] * self.n_colours, 0
            for g in self.at[side][v]:
                if g.size:
                    d += g.size
                    for c, f in enumerate(g.frac):
                        share[c] += g.size * f
            demand = self._demand[(side, v)] = [d, share, None]
        return demand[0], demand[1]

    def _respread(self, full: bool):
        """Where some groups cannot use every colour their leaves have alive, the groups at those
        leaves take spread.py's split instead of FARE's: all of them when capacities change (and
        groups no longer next to a restricted one go back to FARE's split), else those at the
        link sets whose QPs changed, a few sweeps from their last split (a QP's arrival costs a few
        milliseconds at 64 leaves, not a re-solve of the fabric: bench/dead_links.py). Their
        links' targets are recomputed."""
        region = set()
        for key in self._restricted:
            g = self.groups[key]
            region |= {(UP, g.a), (DOWN, g.b)}
        around = region if full else region & self._dirty
        groups = {g.key: g for side, v in around for g in self.at[side][v] if g.size}
        # spread groups no longer next to a restricted one: all of them, or those where QPs changed
        stale = self._spread if full else {g.key for side, v in self._dirty - region for g in self.at[side][v]}
        links = set()
        for key in (stale & self._spread) - groups.keys():
            g = self.groups.get(key)
            if g is not None:
                self._weigh(g)                   # FARE's split again
                links |= {(UP, g.a), (DOWN, g.b)}
        for link in links:
            self._demand.pop(link, None)
        for g in groups.values():
            links |= {(UP, g.a), (DOWN, g.b)}
        loads, inverse = {}, {}
        for side, v in links:
            share, cap = self._vertex_demand(side, v)[1], self.cap[side][v]
            row = loads[(side, v)] = [x + b for x, b in zip(share, self.base[side][v])]
            # each link set's utilisation relative to its own mean: a leaf with few QPs is as
            # uneven at 2 of 2 on one link as a busy one is at 20 of 20, as the figures see it
            mean = sum(row) / (sum(cap) or 1.0)
            scale = 1.0 / (mean * mean) if mean > EPS else 1.0
            inverse[(side, v)] = [scale / x if x > 0 else 0.0 for x in cap]
        splits = {key: Split((UP, g.a), (DOWN, g.b), [c for c in range(self.n_colours) if self._usable(g, c)],
                             [g.size * f for f in g.frac]) for key, g in groups.items()}
        spread(list(splits.values()), loads, inverse, MAX_SWEEPS if full else LOCAL_SWEEPS)
        for key, sp in splits.items():
            g = groups[key]
            g.frac = [x / g.size for x in sp.x]
        for side, v in links:            # the cached shares, as the splits left them
            share = self._demand[(side, v)][1]
            for c, b in enumerate(self.base[side][v]):
                share[c] = loads[(side, v)][c] - b
        self._spread = (self._spread & self.groups.keys()) | set(groups)
        self._dirty |= links
        self._touched |= links

    def _path_caps(self, side: int, v: int, d: int) -> list[float]:
        """Per colour, the capacity of the paths v's d QPs may take (their narrowest link),
        averaged by group size: what an older generation's room is filled by."""
        path = [0.0] * self.n_colours
        for g in self.at[side][v]:
            if g.size:
                for c in range(self.n_colours):
                    if g.mask >> c & 1:
                        path[c] += g.size * min(self.cap[UP][g.a][c], self.cap[DOWN][g.b][c])
        return [x / d for x in path]

    def targets(self) -> tuple[list, list]:
        """(lo, hi)[side][leaf][colour]: each link's share rounded down and up."""
        self._retarget()
        return self.lo, self.hi

    def violation(self) -> int:
        """How many QPs, summed over all links, lie outside the targets (0: all met)."""
        self._retarget()
        return sum(_viol(self.load[s][v][c], self.lo[s][v][c], self.hi[s][v][c])
                   for s in (UP, DOWN) for v in range(self.n_leaves) for c in range(self.n_colours))

    def excess(self) -> int:
        """QPs above the targets' upper bounds, summed over all links."""
        self._retarget()
        return sum(max(0, self.load[s][v][c] - self.hi[s][v][c])
                   for s in (UP, DOWN) for v in range(self.n_leaves) for c in range(self.n_colours))

    def _wv(self, side: int, v: int, c: int, load: int) -> float:
        """A link's violation as the repairs weigh it: a QP over the target counts by how much of
        the link it takes (a half-speed link twice), so where the targets of both ends cannot all
        be met the excess lands on the fastest links; a QP under the target counts one."""
        lo, hi, cap = self.lo[side][v][c], self.hi[side][v][c], self.cap[side][v][c]
        over = max(0, load - hi)
        if over and cap > 0:
            over *= self.top[side][v] / cap
        return over + max(0, lo - load)

    def _dv(self, side: int, v: int, gain: int, shed: int) -> float:
        """Change of v's (weighed) violation when one of its QPs turns from shed to gain: _wv's
        steps written out (the search's innermost call)."""
        ld, lo, hi, cap = self.load[side][v], self.lo[side][v], self.hi[side][v], self.cap[side][v]
        top = self.top[side][v]
        g, s = ld[gain], ld[shed]
        d = 0.0
        if g >= hi[gain]:                     # one more over the target
            d += top / cap[gain] if cap[gain] > 0 else 1.0
        if g < lo[gain]:                      # one fewer under it
            d -= 1.0
        if s > hi[shed]:
            d -= top / cap[shed] if cap[shed] > 0 else 1.0
        if s <= lo[shed]:
            d += 1.0
        return d

    # ---- solving ------------------------------------------------------------------------
    def solve(self) -> set:
        """Colour every QP that can be coloured and bring every link within its target where a
        chain of recolourings can; returns the keys whose colour changed (new ones included)."""
        changed: set = set()
        if self._caps_changed:      # QPs on a colour that died lose it first
            for g in self.groups.values():
                for c in range(self.n_colours):
                    while g.members[c] and not self._usable(g, c):
                        key = g.members[c][-1]
                        self._unset(key, self.qps[key])
                        self.unplaced[key] = None
        self._retarget()
        for key in list(self.unplaced):
            q = self.qps[key]
            c = self._greedy(q.group)
            if c is not None:
                self._set(key, q, c)
                self.unplaced.pop(key, None)
                changed.add(key)
        # Only links whose load or target changed, or that were left outside their targets, can
        # be outside them now. A round repairs what it can; the links its chains touched, and the
        # stuck ones (a chain may have made the room they lacked), are looked at again.
        todo = self._touched | self._unsettled
        self._touched = set()
        unsettled = self._settle(todo, changed)
        # Where no chain lowers the violation, one move that does not (a step sideways) may open
        # one: tried at stuck links, kept only if the repairs after it end lower than before.
        if unsettled and self._signature() != self._stuck_at:
            budget = [ESCAPE_TRIES]
            self._work = 0
            while unsettled and budget[0] > 0:
                moves = self._escape(unsettled, budget)
                if moves is None:
                    self._stuck_at = self._signature()
                    break
                changed |= {key for _, _, _, key in moves}
                unsettled = self._settle(self._touched | unsettled, changed)
        self._unsettled = unsettled
        return changed

    def _settle(self, todo: set, changed: set, moves: list | None = None) -> set:
        """The repair rounds from the links in todo; returns those left outside their targets.
        Every move is recorded in `moves` (to be undone) when given: a sideways step's trial,
        whose repairs are two-colour chains only (the three-colour search, tried on every stuck
        link, would cost a trial seconds on a large fabric)."""
        unsettled: set = set()
        while todo:
            moved = False
            for side, v in sorted(todo):
                for c in range(self.n_colours):
                    while _viol(self.load[side][v][c], self.lo[side][v][c], self.hi[side][v][c]):
                        chain = self._repair(side, v, c, deep=moves is None)
                        if chain is None:
                            unsettled.add((side, v))
                            break
                        for g, frm, to in chain:
                            key = self._move_one(g, frm, to)
                            changed.add(key)
                            if moves is not None:
                                moves.append((g, frm, to, key))
                        moved = True
            todo = (self._touched | unsettled) if moved else set()
            self._touched = set()
            if moved:
                unsettled = set()
        return unsettled

    def _weighed(self, links) -> float:
        return sum(self._wv(s, v, c, self.load[s][v][c]) for s, v in links for c in range(self.n_colours))

    def _signature(self) -> int:
        return hash((tuple(tuple(r) for side in self.load for r in side),
                     tuple(tuple(r) for side in self.hi for r in side),
                     tuple(tuple(r) for side in self.lo for r in side)))

    def _escape(self, unsettled: set, budget: list) -> list | None:
        """A sideways step out of a state no chain improves: one QP at a stuck link moved off its
        over-target colour (or onto its under-target one), whatever that costs its other end,
        then the usual repairs. The first whose repairs leave the weighed violation of the links
        they touched lower is kept (its moves returned); each other is undone. `budget` bounds
        the steps tried, ESCAPE_WORK what their chain searches look at: on a large fabric a stuck
        state's steps cost tens of milliseconds each."""
        for side, v in sorted(unsettled):
            ld, lo, hi = self.load[side][v], self.lo[side][v], self.hi[side][v]
            for c in range(self.n_colours):
                if ld[c] > hi[c]:
                    steps = [(g, c, z) for g in self.at[side][v] if g.members[c]
                             for z in range(self.n_colours) if z != c and self._usable(g, z)]
                elif ld[c] < lo[c]:
                    steps = [(g, z, c) for g in self.at[side][v] if self._usable(g, c)
                             for z in range(self.n_colours) if z != c and g.members[z]]
                else:
                    continue
                for g, frm, to in steps:
                    if budget[0] <= 0 or self._work > ESCAPE_WORK:
                        return None
                    budget[0] -= 1
                    moves = [(g, frm, to, self._move_one(g, frm, to))]
                    self._settle(set(self._touched), set(), moves)     # the step's two ends, and on from there
                    links = {x for mg, *_ in moves for x in ((UP, mg.a), (DOWN, mg.b))}
                    after = self._weighed(links)
                    for mg, mfrm, mto, _ in reversed(moves):     # back to where it was
                        self._move_one(mg, mto, mfrm)
                    self._touched = set()
                    if after < self._weighed(links) - EPS:
                        for mg, mfrm, mto, _ in moves:          # the same QPs again (newest last)
                            self._move_one(mg, mfrm, mto)
                        return moves
        return None

    def _greedy(self, g: _Group) -> int | None:
        """The usable colour that keeps both ends within their targets and nearest their exact
        shares (2 QPs over a 10 and a 5 Gb/s path: one each, not both on the faster), then the
        least loaded for its capacity (QPs that may use one colour only, such as those placed
        through verbs, raise that colour's share without leaving room in it)."""
        best, best_key = None, None
        up, dn = self.load[UP][g.a], self.load[DOWN][g.b]
        hu, hd = self.hi[UP][g.a], self.hi[DOWN][g.b]
        su, sd = self.share[UP][g.a], self.share[DOWN][g.b]
        for c in range(self.n_colours):
            if not self._usable(g, c):
                continue
            k = (max(0, up[c] + 1 - hu[c]) + max(0, dn[c] + 1 - hd[c]),
                 max(up[c] + 1 - su[c], dn[c] + 1 - sd[c]),
                 max((self.base[UP][g.a][c] + up[c] + 1) / self.cap[UP][g.a][c],
                     (self.base[DOWN][g.b][c] + dn[c] + 1) / self.cap[DOWN][g.b][c]))
            if best_key is None or k < best_key:
                best, best_key = c, k
        return best

    def _repair(self, side: int, v: int, c: int, deep: bool = True):
        """A chain that fixes one unit of v's violation on colour c, or None."""
        over = self.load[side][v][c] > self.hi[side][v][c]
        others = [x for x in range(self.n_colours) if x != c and self.cap[side][v][x] > 0]
        # v sheds c and gains another colour when over target, the reverse when under
        pairs = [(c, x) if over else (x, c) for x in others]
        pairs = [(a, b) for a, b in pairs if self._dv(side, v, b, a) < -EPS]
        ld, hi = self.load[side][v], self.hi[side][v]
        pairs.sort(key=lambda ab: ld[ab[1]] - hi[ab[1]])          # the most room first
        for alpha, beta in pairs:
            chain = self._chain(side, v, alpha, beta)
            if chain is not None:
                return chain
        if over and deep:
            return self._chain_any(side, v, c)
        return None

    @staticmethod
    def _unwind(parent, x) -> list:
        chain = []
        while parent[x] is not None:
            prev, grp, frm, to = parent[x][:4]
            chain.append((grp, frm, to))
            x = prev
        return chain

    def _chain(self, side: int, v: int, alpha: int, beta: int):
        """Breadth-first search for an alternating alpha/beta chain from v (a Kempe chain):
        [(group, from, to), ...]. Inner vertices gain and shed the same colour."""
        base = self._dv(side, v, beta, alpha)
        start = (side, v)
        parent = {start: None}
        queue = deque([start])
        while queue:
            s, u = node = queue.popleft()
            shed, gain = (alpha, beta) if s == side else (beta, alpha)
            self._work += len(self.at[s][u])
            for g in self.at[s][u]:
                if not g.members[shed] or not self._usable(g, gain):
                    continue
                w = (1 - s, g.leaf(1 - s))
                if w in parent:
                    continue
                parent[w] = (node, g, shed, gain)
                if base + self._dv(w[0], w[1], gain, shed) < -EPS:
                    return self._unwind(parent, w)
                queue.append(w)
        return None

    def _chain_any(self, side: int, v: int, alpha: int):
        """The fallback where dead links or per-QP restrictions leave no two-colour chain: each
        step may turn to a third colour. A vertex entered by a step that freed colour x and added
        y sheds y again by recolouring one of its y QPs to z; its own violation may not grow
        (z == x leaves it as it was). The chain ends where the total violation has dropped."""
        start = (side, v, alpha)
        parent = {start: None}
        queue = deque([(start, None, 0)])     # (vertex and colour to shed, colour freed, change so far)
        while queue:
            state, x, so_far = queue.popleft()
            s, u, y = state
            on_path = {(p[0], p[1]) for p in self._path_states(parent, state)}
            for g in self.at[s][u]:
                if not g.members[y]:
                    continue
                wv = (1 - s, g.leaf(1 - s))
                if wv in on_path:
                    continue
                for z in range(self.n_colours):
                    if z == y or not self._usable(g, z):
                        continue
                    here = 0 if z == x else (self._dv(s, u, z, alpha) if x is None else self._dv(s, u, z, x))
                    if here > EPS or (x is None and here > -EPS):
                        continue
                    w = (*wv, z)
                    if w in parent:
                        continue
                    parent[w] = (state, g, y, z)
                    if so_far + here + self._dv(wv[0], wv[1], z, y) < -EPS:
                        return self._unwind(parent, w)
                    queue.append((w, y, so_far + here))
        return None

    @staticmethod
    def _path_states(parent, x):
        while x is not None:
            yield x
            x = parent[x][0] if parent[x] is not None else None

    # ---- reading --------------------------------------------------------------------------
    def loads(self) -> list[list[list[int]]]:
        return [[list(r) for r in side] for side in self.load]

