"""QPs of named hosts placed on paths: the fabric file turns hosts into leaves and paths into
colours (uplinks) for the leaf-level algorithm (placement.py), and its answer back into a path per
QP. This is the coordinator's model; simulations drive it directly.

Active first. Hosts report QPs that carry traffic now and QPs they remember (idle, perhaps gone):
a collective's QPs return burst after burst, but a job that ended leaves QPs that never will. The
QPs are grouped into generations by when they last carried traffic: the QPs active now and those
idle QPs whose last packets came within `gap_s` of them, then the next such cluster further back,
and so on. Each generation is placed as if the older ones did not exist (the newest first, at the
best possible for the current matrix), each older one in the room the newer ones leave (a base
load for its Placement). A remembered QP that returns joins the newest generation with the path it
took; if that path unbalances the active QPs it is placed again at once."""
from __future__ import annotations

import ipaddress
import math
from dataclasses import dataclass
from typing import Hashable

from rlbcommon.ipv6 import ipv6_int

from ..kinds.clos import ClosFabric
from .placement import DOWN, UP, Placement, add_loads


@dataclass
class QpInfo:
    src: str                      # sending host
    dst: str                      # receiving host
    path: int | None              # path value (k) it is on now, as its host reported
    weights: dict[int, float]     # path value -> the sender's weight for this peer (0: not usable)
    bytes: int = 0
    fixed: bool = False           # placed through verbs: it stays on its path (weights allow only it)
    last: float | None = None     # when it last carried traffic (the coordinator's clock); None: now


TIERS = 3                 # generations placed apart: the newest, the one before, all older ones
GENERATION_GAP_S = 0.1    # idle QPs whose last packets are this much apart belong to different ones
BUCKET_S = 0.02           # last-packet times are grouped at this resolution (work per solve)
_UNFILED = object()       # a QP in no bucket yet (None is a bucket: the QPs active now)
SHAPES = 8192             # weights tables whose allowed paths and colour weights are kept


class QpPlacer:
    """Keeps every known QP with its placed path; changes are incremental."""

    def __init__(self, fabric: ClosFabric, gap_s: float = GENERATION_GAP_S):
        self.fabric = fabric
        self.leaf_index = {lf.name: i for i, lf in enumerate(fabric.leaves)}
        self.leaf_of_host = {h: self.leaf_index[fabric.leaf_of_host(h)[0].name] for h in fabric.hosts}
        self.n_colours = fabric.colours()
        self.paths = list(range(1, fabric.paths + 1))
        # path k -> colour (0-based uplink) is the same on every leaf (port_id depends on the pod's size)
        lf0 = fabric.leaves[0]
        self.colour_of_path = {k: fabric.port_id(k, lf0) - 1 for k in self.paths}
        self.host_nets: dict[str, list] = {}        # host -> its /64 per path (path k at k-1)
        for leaf, port, _, net in fabric.all_prefixes():
            self.host_nets.setdefault(leaf.hosts[port - 1], []).append(net)
        # {a host /64's upper 64 bits: host}: looked up per QP peer, so as integers
        self.prefix_host = {int(net.network_address) >> 64: h for h, nets in self.host_nets.items() for net in nets}
        self.tiers = [Placement(len(fabric.leaves), self.n_colours) for _ in range(TIERS)]
        self.gap_s = gap_s
        self.tier_of: dict[Hashable, int] = {}
        self.bucket_of: dict[Hashable, int | None] = {}     # None: active now
        self.buckets: dict[int | None, set] = {}
        self.bucket_tier: dict[int | None, int] = {}
        self.qps: dict[Hashable, QpInfo] = {}
        self.local: dict[Hashable, QpInfo] = {}      # QPs inside one leaf: no fabric link to place
        self.by_host: dict[str, set] = {}            # sending host -> its fabric-crossing QPs
        self.link_up: dict[tuple[int, int], bool] = {}
        self.last_changed: set = set()               # keys whose colour the last solve changed
        self._shapes: dict[int, tuple] = {}          # id(weights) -> (weights, allowed, per colour)
        # QPs placed by others (coord/shards.py), per generation: what each of ours is placed
        # above besides our own newer ones; and their newest, for the loads hosts are given
        self.outside: list | None = None
        self.outside_newest: list | None = None
        for lf in fabric.leaves:
            self._apply_caps(self.leaf_index[lf.name])

    # ---- the fabric's links -----------------------------------------------------------
    def link_mbps(self, leaf: int, colour: int) -> float:
        lf = self.fabric.leaves[leaf]
        spine = self.fabric.pod_spines(lf.pod)[colour // self.fabric.parallel]
        return float(self.fabric.link_mbps_between(lf.name, spine.name))

    def _apply_caps(self, leaf: int):
        caps = [self.link_mbps(leaf, c) if self.link_up.get((leaf, c), True) else 0.0
                for c in range(self.n_colours)]
        # a leaf-spine link carries the leaf's uplink and the downlink into it: both die together
        for t in self.tiers:
            t.set_capacity(leaf, UP, caps)
            t.set_capacity(leaf, DOWN, caps)

    def set_link(self, leaf: str, colour: int, up: bool) -> bool:
        """A leaf's uplink (0-based colour) went up or down; True if that changed anything."""
        i = self.leaf_index[leaf]
        if self.link_up.get((i, colour), True) == up:
            return False
        self.link_up[(i, colour)] = up
        self._apply_caps(i)
        return True

    def dead_links(self) -> list[tuple[str, int]]:
        return sorted((self.fabric.leaves[i].name, c) for (i, c), up in self.link_up.items() if not up)

    # ---- QPs ----------------------------------------------------------------------------
    def host_of(self, address: str) -> str | None:
        """The host whose /64 holds an address (ValueError: not an IPv6 address)."""
        return self.host_at(ipv6_int(address))

    def host_at(self, address: int | ipaddress.IPv6Address) -> str | None:
        """The same for an address already read (not parsed again)."""
        return self.prefix_host.get(int(address) >> 64)

    def _shape(self, weights: dict[int, float]) -> tuple[frozenset, tuple[float, ...]]:
        """(the paths allowed, the weights per colour: the best path of each colour when paths >
        uplinks) of a weights table. A host's QPs towards one peer share one table (the
        coordinator looks it up once per peer) and nobody changes a table in place (new weights:
        a new QpInfo), so both are worked out once per table, found again by its identity (the
        entry holds the table, so the identity cannot pass to another while it is there)."""
        got = self._shapes.get(id(weights))
        if got is not None and got[0] is weights:
            return got[1], got[2]
        out = [0.0] * self.n_colours
        for k, w in weights.items():
            c = self.colour_of_path.get(k)
            if c is not None:
                out[c] = max(out[c], w)
        got = (weights, frozenset(k for k, w in weights.items() if w > 0), tuple(out))
        if len(self._shapes) >= SHAPES:             # bounded: tables come and go with reports
            self._shapes.clear()
        self._shapes[id(weights)] = got
        return got[1], got[2]

    def add(self, key: Hashable, qp: QpInfo):
        if key in self.qps or key in self.local:
            self.remove(key)
        a, b = self.leaf_of_host[qp.src], self.leaf_of_host[qp.dst]
        if a == b:
            self.local[key] = qp
            return
        self.qps[key] = qp
        self.by_host.setdefault(qp.src, set()).add(key)
        allowed, per_colour = self._shape(qp.weights)
        colour = self.colour_of_path.get(qp.path) if qp.path in allowed else None
        bucket = self._bucket(qp)
        tier = self.bucket_tier.get(bucket, 0)
        self._file(key, bucket)
        self.tier_of[key] = tier
        self.tiers[tier].add(key, a, b, colour=colour, weights=per_colour)

    def remove(self, key: Hashable) -> bool:
        if self.local.pop(key, None) is not None:
            return True
        qp = self.qps.pop(key, None)
        if qp is None:
            return False
        self.by_host[qp.src].discard(key)
        self.tiers[self.tier_of.pop(key)].remove(key)
        self._file(key, None, drop=True)
        return True

    # ---- generations ------------------------------------------------------------------
    @staticmethod
    def _bucket(qp: QpInfo) -> int | None:
        return None if qp.last is None or qp.fixed else math.floor(qp.last / BUCKET_S)

    def _file(self, key, bucket, drop: bool = False):
        old = self.bucket_of.pop(key, _UNFILED)
        if old is not _UNFILED:
            members = self.buckets[old]
            members.discard(key)
            if not members:
                del self.buckets[old]
        if not drop:
            self.bucket_of[key] = bucket
            self.buckets.setdefault(bucket, set()).add(key)

    def _move_tier(self, key, tier: int):
        old = self.tier_of[key]
        if old == tier:
            return
        qp = self.qps[key]
        colour = self.tiers[old].colour(key)
        self.tiers[old].remove(key)
        self.tiers[tier].add(key, self.leaf_of_host[qp.src], self.leaf_of_host[qp.dst], colour=colour,
                             weights=self._shape(qp.weights)[1])
        self.tier_of[key] = tier

    def _regroup(self, now: float | None):
        """Each bucket of last-packet times its generation (tier): the active bucket and the idle
        ones chained to it within gap_s form the newest, then the next chain, ... Every QP
        sits in its bucket's tier, so only the QPs of buckets whose tier changes move."""
        now_b = math.inf if now is None else math.floor(now / BUCKET_S)
        times = sorted((((now_b if b is None else b), b) for b in self.buckets), key=lambda tb: tb[0])
        tier, prev, gap = 0, None, self.gap_s / BUCKET_S
        for t, b in reversed(times):
            if prev is not None and prev - t > gap + 1:
                tier = min(TIERS - 1, tier + 1)
            prev = t if t != math.inf else None
            if self.bucket_tier.get(b, 0) != tier:
                for key in self.buckets[b]:
                    self._move_tier(key, tier)
            self.bucket_tier[b] = tier
        for b in [b for b in self.bucket_tier if b not in self.buckets]:
            del self.bucket_tier[b]

    def update(self, key: Hashable, qp: QpInfo):
        """A QP seen again: only its bytes and current path change; its placement stays unless its
        peer or its host's weights changed. Then it starts again from the path its host put it
        on (a host releases QPs from a degraded path at once; the placement follows from there)."""
        old = self.qps.get(key) or self.local.get(key)
        if old is None or (old.dst, old.weights) != (qp.dst, qp.weights):
            self.add(key, qp)
            return
        old.bytes, old.path = qp.bytes, qp.path
        if qp.last is None or old.last is None or abs(qp.last - old.last) > BUCKET_S:
            old.last = qp.last        # (an idle QP's last packet, re-derived each report, jitters)
        if key in self.qps:
            bucket = self._bucket(old)
            if self.bucket_of.get(key) != bucket:
                # every QP sits in its bucket's tier (a new bucket's is 0 until the next regroup)
                self._file(key, bucket)
                self._move_tier(key, self.bucket_tier.get(bucket, 0))

    def __len__(self) -> int:
        return len(self.qps) + len(self.local)

    def solve(self, now: float | None = None) -> int:
        """Regroup the QPs by generation (`now` on the clock of QpInfo.last), then bring each
        generation to its targets, the newest first, each older one above the loads of those
        before it; returns how many QPs got a new colour."""
        self._regroup(now)
        moved = 0
        self.last_changed: set = set()
        for k, t in enumerate(self.tiers):
            if k and not len(t):
                continue          # no QP of this generation: its room is worked out once it has one
            if k or self.outside is not None:
                base = self.loads(tiers=k)         # the newer generations, as just placed
                if self.outside is not None:       # ... and what others placed before us
                    add_loads(base, self.outside[k])
                for side in (UP, DOWN):
                    for v in range(len(self.fabric.leaves)):
                        t.set_base(v, side, base[side][v])
            changed = t.solve()
            moved += len(changed)
            self.last_changed |= changed
        return moved

    def colour(self, key: Hashable) -> int | None:
        return self.tiers[self.tier_of[key]].colour(key)

    def generation(self, key: Hashable) -> int | None:
        """0: placed with the QPs active now; 1, 2: in the room the newer ones left."""
        return self.tier_of.get(key)

    def path(self, key: Hashable) -> int | None:
        """The path value placed for a QP (None: within a leaf, or no usable path)."""
        qp = self.qps.get(key)
        if qp is None:
            return None
        c = self.colour(key)
        if c is None:
            return None
        allowed = self._shape(qp.weights)[0]
        if qp.path in allowed and self.colour_of_path.get(qp.path) == c:
            return qp.path          # where it is already: nothing to change
        # several paths share a colour when paths > uplinks: the lowest allowed one
        return min(k for k in allowed if self.colour_of_path.get(k) == c)

    def placements(self, host: str) -> dict[Hashable, int]:
        out = {}
        for key in self.by_host.get(host, ()):
            p = self.path(key)
            if p is not None:
                out[key] = p
        return out

    # ---- reading ------------------------------------------------------------------------
    def loads(self, tiers: int = TIERS) -> list[list[list[int]]]:
        """QPs placed per [side][leaf][colour], of the newest `tiers` generations (0: none)."""
        out = self.tiers[0].loads()
        if not tiers:
            return [[[0] * len(r) for r in side] for side in out]
        for t in self.tiers[1:tiers]:
            add_loads(out, t.loads())
        return out

    def tier_loads(self) -> list[list[list[list[int]]]]:
        """Each generation's loads apart, the newest first (what a shard publishes)."""
        return [t.loads() for t in self.tiers]

    def set_outside(self, before: list | None, newest: list | None):
        """Others' QPs (coord/shards.py): per generation, the loads ours are placed above; and
        their newest generation. None: nobody else places in this fabric."""
        self.outside, self.outside_newest = before, newest
        if before is None:                 # the room is ours again (older generations' bases are set each solve)
            for side in (UP, DOWN):
                for v in range(len(self.fabric.leaves)):
                    self.tiers[0].set_base(v, side, [0] * self.n_colours)

    def fabric_loads(self) -> list[list[list[int]]]:
        """The newest generation's loads, others' included: what a new QP joins."""
        out = self.loads(tiers=1)
        if self.outside_newest is not None:
            add_loads(out, self.outside_newest)
        return out

    @property
    def cap(self) -> list[list[list[float]]]:
        return self.tiers[0].cap

    def link_loads(self, tiers: int = TIERS) -> dict[str, dict[str, list[int]]]:
        """{leaf: {"up": QPs per colour, "down": QPs per colour}} as placed (the newest
        `tiers` generations; all by default)."""
        loads = self.loads(tiers)
        return {lf.name: {"up": loads[UP][i], "down": loads[DOWN][i]}
                for i, lf in enumerate(self.fabric.leaves)}

    def active(self) -> list[Hashable]:
        """The QPs of the newest generation (placed as if no other existed)."""
        return [k for k, t in self.tier_of.items() if t == 0]

    def caps(self, leaf: str) -> list[float]:
        return self.tiers[0].cap[UP][self.leaf_index[leaf]]

    def excess(self) -> int:
        return sum(t.excess() for t in self.tiers)
