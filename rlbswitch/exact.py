"""The exact /64 table in front of the LPM trie (bpf/rlb_switch.h, struct rlb_exact_set).

An array of sets indexed by a multiply-shift hash of the /64, each set RLB_EXACT_WAYS routes,
so the program's lookup is one multiply and one inlined array index. It is derived state: the
trie holds every route, and a /64 that finds no room in its set is simply answered by the trie
(slower, still right), until a way in its set frees up.

Array values are overwritten in place, so a way is rewritten in steps that each change only
bytes a concurrent reader cannot misuse: a way counts while route.mode is non-zero, so
    1. mode := 0                   (readers fall through to the trie, already updated),
    2. key and route, mode still 0 (nobody reads them yet),
    3. mode := the new mode        (one byte changes: the way is live, whole).
Each step is one map update of the whole set, but every other byte is written with the value
it already had. New /64s going into free ways can be deferred (defer() ... flush()): their step 2
for all of them in one batch update, then their step 3 in another (cold programming of a whole
table costs two syscalls, not two per route). Anything else flushes first, so the order of
every other change is kept.
"""
from __future__ import annotations

import ctypes as ct
import ipaddress
import sys

MASK64 = (1 << 64) - 1
_NONZERO = bytes([0] + [1] * 255)           # bytes.translate table: any non-zero byte -> 1


def key_of(net: ipaddress.IPv6Network) -> int:
    """The /64's first 8 bytes as the program loads them: a native-order u64."""
    return int.from_bytes(net.network_address.packed[:8], sys.byteorder)


class ExactTable:
    def __init__(self, pinned_map, consts: dict):
        self.map = pinned_map
        self.bits, self.ways = consts["RLB_EXACT_BITS"], consts["RLB_EXACT_WAYS"]
        self.mult = consts["RLB_EXACT_MULT"]
        self.sets: dict[int, object] = {}        # set index -> its value as last written
        self.where: dict[int, tuple[int, int]] = {}   # key -> (set, way) of live entries
        self.waiting: dict[int, dict[int, object]] = {}   # set -> {key: route} without room
        self._pending: list[tuple[int, int, int]] | None = None  # deferred (set, way, mode)
        self._reserved: set[tuple[int, int]] = set()

    def index(self, key: int) -> int:
        return ((key * self.mult) & MASK64) >> (64 - self.bits)

    @property
    def overflow(self) -> int:
        """/64 routes answered by the trie because their set is full."""
        return sum(len(w) for w in self.waiting.values())

    def __len__(self) -> int:
        return len(self.where)

    # ---- reading back (adoption) -------------------------------------------------------
    def load(self):
        """Adopt what the map holds: one batch read, and only the sets holding any non-zero
        byte are decoded. They are found at C speed (non-zero bytes translated to 1, then
        find() jumps from one used set to the next): the table is 8 MiB and mostly empty,
        and a reload runs under the lock that carrier changes also wait for."""
        self.sets, self.where, self.waiting = {}, {}, {}
        raw = self.map.array_bytes()
        size = ct.sizeof(self.map.leaf_type)
        flags = raw.translate(_NONZERO)
        used, pos = [], flags.find(1)
        while pos >= 0:
            idx = pos // size
            used.append(idx)
            pos = flags.find(1, (idx + 1) * size)
        for idx in used:
            s = self.map.leaf_type.from_buffer_copy(raw, idx * size)
            self.sets[idx] = s
            for w in range(self.ways):
                if s.way[w].route.mode:
                    if s.way[w].key in self.where or self.index(s.way[w].key) != idx:
                        self._set_mode(idx, w, 0)      # a duplicate or misplaced way: not ours
                    else:
                        self.where[s.way[w].key] = (idx, w)

    # ---- changes -------------------------------------------------------------------------
    def put(self, net: ipaddress.IPv6Network, route):
        """Make net's /64 answer with route (a ctypes struct rlb_route)."""
        key = key_of(net)
        if key in self.where:
            idx, w = self.where[key]
            if bytes(self.sets[idx].way[w].route) != bytes(route):
                self.flush()
                self._write_way(idx, w, key, route)
            return
        idx = self.index(key)
        w = self._free_way(idx)
        if w is None:
            self.waiting.setdefault(idx, {})[key] = route
            return
        if idx in self.waiting:
            self.waiting[idx].pop(key, None)
        self.where[key] = (idx, w)
        if self._pending is None:
            self._write_way(idx, w, key, route)
            return
        way = self._value(idx).way[w]             # a free way: only steps 2 and 3, later
        way.key = key
        ct.memmove(ct.addressof(way.route), ct.addressof(route), ct.sizeof(way.route))
        self._pending.append((idx, w, way.route.mode))
        self._reserved.add((idx, w))
        way.route.mode = 0

    def defer(self):
        """From now on new /64s are written by flush() (in two batches)."""
        if self._pending is None:
            self._pending = []

    def flush(self, stop: bool = False):
        """Write what defer() held back; keep deferring unless stop."""
        pending = self._pending
        self._pending = None if stop or pending is None else []
        if not pending:
            return
        sets = list(dict.fromkeys(idx for idx, _, _ in pending))
        self.map.update_batch([(i, bytes(self.sets[i])) for i in sets])     # 2. key and route
        for idx, w, mode in pending:
            self.sets[idx].way[w].route.mode = mode
        self._reserved.clear()
        self.map.update_batch([(i, bytes(self.sets[i])) for i in sets])     # 3. live

    def remove(self, net: ipaddress.IPv6Network):
        self.flush()
        key = key_of(net)
        idx = self.index(key)
        waiting = self.waiting.get(idx, {})
        if waiting.pop(key, None) is not None:
            if not waiting:
                del self.waiting[idx]
            return
        if key not in self.where:
            return
        idx, w = self.where.pop(key)
        self._set_mode(idx, w, 0)
        if waiting:                         # the freed way goes to one that was waiting
            k2 = next(iter(waiting))
            route = waiting.pop(k2)
            if not waiting:
                del self.waiting[idx]
            self._write_way(idx, w, k2, route)
            self.where[k2] = (idx, w)

    def sync(self, want: dict[ipaddress.IPv6Network, object]):
        """Make the table hold exactly `want` (net -> route): entries already right stay
        untouched, so adoption after a restart writes nothing."""
        keys = {key_of(n): (n, r) for n, r in want.items()}
        for key in [k for k in self.where if k not in keys]:
            idx, w = self.where.pop(key)
            self._set_mode(idx, w, 0)
        self.waiting = {}
        self.defer()
        for key, (net, route) in keys.items():
            self.put(net, route)
        self.flush(stop=True)

    # ---- writing a way in safe steps ------------------------------------------------------
    def _set(self, idx: int):
        self.map.set(idx, self.sets[idx])

    def _value(self, idx: int):
        if idx not in self.sets:
            self.sets[idx] = self.map.leaf_type()
        return self.sets[idx]

    def _free_way(self, idx: int) -> int | None:
        ways = self._value(idx).way
        for w in range(self.ways):
            if not ways[w].route.mode and (idx, w) not in self._reserved:
                return w
        return None

    def _set_mode(self, idx: int, w: int, mode: int):
        s = self._value(idx)
        if s.way[w].route.mode != mode:
            s.way[w].route.mode = mode
            self._set(idx)

    def _write_way(self, idx: int, w: int, key: int, route):
        self._set_mode(idx, w, 0)                                   # 1. out of use
        way = self._value(idx).way[w]
        way.key = key
        ct.memmove(ct.addressof(way.route), ct.addressof(route), ct.sizeof(way.route))
        mode, way.route.mode = way.route.mode, 0
        self._set(idx)                                              # 2. key and route
        self._set_mode(idx, w, mode)                                # 3. live
