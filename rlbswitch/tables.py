"""The switch's routing state in user space (Katran's shape): typed shadows of routes, groups and
next hops with reference counts, and the only code that writes those maps.

- Next hops are keyed by (port, gateway) or (port, static MAC); groups by their sorted members
  and weights, so routes with identical member sets (a leaf's thousands of pinned prefixes have
  a handful of backup sets) share one group. Ids come from free lists.
- A change is a diff: the desired routes are compared with the shadows in canonical form (ECMP
  is weighted with weights 1, so an adopted ECMP route compares equal), and only what differs is
  written, in an order that never lets the data path see a half-written state: new next hops,
  then new groups, then the route entries (one map update each: the switch-over), then groups and
  next hops nobody references any more are zeroed and their ids freed.
- Adoption reads the pinned maps once. Whatever a crash left between those steps is an orphan
  (a group or next hop no route reaches) and is reclaimed then.
- One process writes the maps at a time, the owner (SwitchDataplane.claim: the agent, or a CLI
  command when no agent runs; with an agent the CLI asks it, control.py). A model becomes the
  writer on its first write and then reads the maps again, so it starts from what the last owner
  left; after that nothing else writes under it and it never reloads. A model that does not own
  the maps only reads them (a command's `status`)."""
from __future__ import annotations

import contextlib
import ipaddress
import logging
from dataclasses import dataclass, field
from typing import Any, ContextManager, Protocol

from rlbcommon.ipv6 import network_text

from rlbfabric.routes import NextHop, Route, RouteError
from . import abi, dlbscan
from .exact import ExactTable
from .slots import build_slots

log = logging.getLogger(__name__)

NhKey = tuple            # (ifindex, gateway bytes or b"", static MAC or "")
GroupKey = tuple         # ((NhKey, weight), ...) sorted
TRIE_BATCH = 8192         # new routes' trie entries per batch write
VALUES_MAX = 4096        # distinct route values remembered (each a next hop and group pair)


@dataclass
class _Nh:
    id: int
    key: NhKey
    refs: int = 0        # routes naming it as pinned primary + groups holding it


@dataclass
class _Group:
    id: int
    key: GroupKey
    members: list[int]   # next-hop ids, in slot-table order
    refs: int = 0        # routes using it
    generation: int = 1


@dataclass
class _Route:
    mode: str            # pinned | weighted | dlb | connected | local
    nexthop: int = 0
    group: int = 0
    ifindex: int = 0
    port: int = 0            # connected: the port's slot
    owner: str = "unknown"   # agent | operator | kernel: who may change or remove it


@dataclass
class Changes:
    added: list[str] = field(default_factory=list)
    changed: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    unchanged: int = 0
    failed: dict[str, str] = field(default_factory=dict)    # prefix -> why (left as it was)
    yielded: list[str] = field(default_factory=list)        # another owner's route: left alone

    def __bool__(self) -> bool:
        return bool(self.added or self.changed or self.removed)

    def summary(self) -> str:
        return (f"{len(self.added)} added, {len(self.changed)} changed, {len(self.removed)} removed, "
                f"{self.unchanged} unchanged" + (f", {len(self.failed)} failed" if self.failed else ""))


class _FreeIds:
    """Ids 1..n-1 (0 means none), lowest first."""

    def __init__(self, n: int, used: set[int]):
        self.free = sorted(set(range(1, n)) - used, reverse=True)

    def take(self, what: str) -> int:
        if not self.free:
            raise RouteError(f"{what} table full")
        return self.free.pop()

    def give(self, i: int):
        self.free.insert(0, i)  # reused last (take() pops the end): a freed id is not rewritten at once

    def __len__(self):
        return len(self.free)


class Ports(Protocol):
    """The switch's ports as the model needs them."""
    error: type[Exception]                       # what naming a port that is not there raises

    def ifindex(self, ifname: str) -> int: ...

    def port_slot(self, ifindex: int) -> tuple[int, Any] | None: ...   # (slot, struct rlb_port)


class Neighbours(Protocol):
    """The kernel's neighbour table: a gateway's MAC, and asking for one not known yet."""
    def lookup_neighbour(self, ifindex: int, gateway: str) -> str | None: ...

    def solicit(self, ifname: str, gateway: str) -> None: ...


class Writer(Protocol):
    """The one-writer rule (SwitchDataplane.claim) and the lock a write batch holds."""
    def locked(self) -> ContextManager: ...

    def owns(self) -> bool: ...

    def claim(self) -> bool: ...


def describe(route: Route) -> str:
    """A route in a line, as the operator wrote it."""
    if route.mode == "connected":
        return f"connected dev {route.dev}"
    via = " ".join(str(h) for h in route.nexthops)
    bk = f" backup {' '.join(str(b) for b in route.backups)}" if route.backups else ""
    return f"{route.mode} via {via}{bk}".rstrip()


class SwitchTables:
    def __init__(self, maps, ports: Ports, neighbours: Neighbours, writer: Writer):
        self.maps, self.ports, self.neighbours, self.writer = maps, ports, neighbours, writer
        self.batches = 0                    # write batches: a table applied again writes none
        self.operator_writes = 0            # of them, those for an operator (not for bird)
        self._keys: dict | None = None     # next hop -> key, within one batch
        self._sets: dict | None = None     # next-hop set -> (next hop, group), within one batch
        self._values: dict[tuple, object] = {}   # route fields -> map value (_route_value)
        self.dlb_scan = dlbscan.width()     # members the program scans for DLB, on this kernel
        with writer.locked():               # a snapshot: the owner writes a batch under this lock
            self.load()

    # ---- adoption -----------------------------------------------------------------------
    def load(self):
        """Read the pinned maps; as their writer, reclaim orphans (what a crash between steps
        left behind; to a reader, another writer's batch in progress looks the same)."""
        m = self.maps
        self.nh_by_id: dict[int, _Nh] = {}
        self.nh_by_key: dict[NhKey, _Nh] = {}
        for i, nh in enumerate(m["nexthops"].array_values()):
            if i and nh is not None and nh.flags & abi.NH_VALID:
                key = self._nh_key_of_entry(nh)
                n = _Nh(i, key)
                self.nh_by_id[i] = n
                self.nh_by_key.setdefault(key, n)
        self.group_by_id: dict[int, _Group] = {}
        self.group_by_key: dict[GroupKey, _Group] = {}
        for gid, g in enumerate(m["groups"].array_values()):
            if gid and g is not None and g.n_members:
                members = list(g.member_nh[:g.n_members])
                if not all(x in self.nh_by_id for x in members):
                    members = []          # points at freed next hops: an orphan, reclaimed below
                key = self._group_key(members, list(g.weight[:g.n_members])) if members else ("orphan", gid)
                grp = _Group(gid, key, members, 0, g.generation)
                self.group_by_id[gid] = grp
                if members:
                    self.group_by_key.setdefault(key, grp)
        self.routes: dict[ipaddress.IPv6Network, _Route] = {}
        for k, r in m["routes"].items():
            net = ipaddress.IPv6Network((bytes(k.addr), k.prefixlen))
            self.routes[net] = _Route(abi.MODE_NAMES.get(r.mode, f"mode{r.mode}"), r.nexthop, r.group,
                                      r.ifindex, r.port, abi.OWNER_NAMES.get(r.owner, "unknown"))
        for rt in self.routes.values():
            self._ref(rt, +1)
        self._fast_rebuild()
        for g in self.group_by_id.values():
            for nid in g.members:
                self.nh_by_id[nid].refs += 1
        self.free_nh = _FreeIds(abi.C["RLB_MAX_NEXTHOPS"], set(self.nh_by_id))
        self.free_group = _FreeIds(abi.C["RLB_MAX_GROUPS"], set(self.group_by_id))
        if not self.writer.owns():
            return 0, 0
        # orphans: what a crash left between writing and switching (or before freeing)
        orphans, lost = self._collect()
        if orphans or lost:
            log.info("adoption reclaimed %d orphan groups and %d orphan next hops", len(orphans), len(lost))
        return len(orphans), len(lost)

    def _nh_key_of_entry(self, nh) -> NhKey:
        if nh.flags & abi.NH_STATIC:
            return (nh.ifindex, b"", abi.mac_str(nh.dmac))
        return (nh.ifindex, bytes(nh.gateway), "")

    @staticmethod
    def _group_key(members: list, weights: list[int]) -> GroupKey:
        return tuple(sorted(zip(members, weights)))

    def _ref(self, rt: _Route, step: int):
        """A route's references to its primary next hop and group."""
        if rt.nexthop and rt.nexthop in self.nh_by_id:
            self.nh_by_id[rt.nexthop].refs += step
        if rt.group and rt.group in self.group_by_id:
            self.group_by_id[rt.group].refs += step

    # ---- the one writer ------------------------------------------------------------------
    def _own(self):
        """Before a write: this process becomes the maps' writer if it is not yet, and reads
        them again (whatever the last writer left, orphans reclaimed). Not under the maps' lock:
        the owner may need it to finish what it is doing."""
        if not self.writer.owns():
            self.writer.claim()
            with self.writer.locked():
                self.load()

    def _key(self, net: ipaddress.IPv6Network):
        return abi.lpm_key(self.maps["routes"], net)

    # ---- canonical form ------------------------------------------------------------------
    def _spec_key(self, h: NextHop) -> NhKey:
        spec = (h.ifname, h.gateway, h.mac)          # the weight is not part of it
        key = self._keys.get(spec) if self._keys is not None else None
        if key is None:
            ifindex = self.ports.ifindex(h.ifname)
            key = (ifindex, b"", h.mac.lower()) if h.mac else (ifindex, ipaddress.IPv6Address(h.gateway).packed, "")
            if self._keys is not None:
                self._keys[spec] = key
        return key

    def _canonical(self, route: Route) -> tuple:
        """What a route means in map terms, comparable with what is programmed."""
        mode = "weighted" if route.mode == "ecmp" else route.mode
        if mode == "connected":
            return (mode, None, None, self.ports.ifindex(route.dev))
        if mode == "local":
            return (mode, None, None, 0)
        if mode == "pinned":
            group = [(self._spec_key(b), b.weight) for b in route.backups]
            return (mode, self._spec_key(route.nexthops[0]), tuple(sorted(group)) or None, 0)
        group = [(self._spec_key(h), 1 if route.mode == "ecmp" else h.weight) for h in route.nexthops]
        return (mode, None, tuple(sorted(group)), 0)

    def _canonical_of(self, rt: _Route) -> tuple:
        nh = self.nh_by_id[rt.nexthop].key if rt.nexthop else None
        group = None
        if rt.group:
            g = self.group_by_id[rt.group]
            group = tuple(sorted((self.nh_by_id[nid].key, w) for nid, w in g.key))
        return (rt.mode, nh, group, rt.ifindex if rt.mode == "connected" else 0)

    # ---- writing ------------------------------------------------------------------------
    def _acquire_nh(self, key: NhKey, spec: NextHop) -> _Nh:
        n = self.nh_by_key.get(key)
        if n is not None:
            return n
        ifindex = key[0]
        found = self.ports.port_slot(ifindex)
        if found is None:
            raise self.ports.error(f"{spec.ifname} is not attached: run 'rlbswitch attach {spec.ifname}'")
        slot, port = found
        i = self.free_nh.take("next-hop")
        m = self.maps["nexthops"]
        e = m.leaf_type()
        e.ifindex, e.port, e.flags = ifindex, slot, abi.NH_VALID
        e.smac[:] = bytes(port.mac)
        if spec.mac:
            e.dmac[:] = abi.mac_bytes(spec.mac)
            e.flags |= abi.NH_RESOLVED | abi.NH_STATIC
        else:
            e.gateway[:] = key[1]
            mac = self.neighbours.lookup_neighbour(ifindex, spec.gateway)
            if mac:
                e.dmac[:] = abi.mac_bytes(mac)
                e.flags |= abi.NH_RESOLVED
            else:
                self.neighbours.solicit(spec.ifname, spec.gateway)
                log.info("next hop %s unresolved: asked the kernel to resolve it", spec)
        self.maps["nh_stats"].zero(i)
        m.set(i, e)
        n = _Nh(i, key)
        self.nh_by_id[i] = n
        self.nh_by_key[key] = n
        return n

    def _acquire_group(self, members: list[tuple[_Nh, int]], previous: int) -> _Group:
        if len(members) > abi.C["RLB_MAX_MEMBERS"]:
            raise RouteError(f"at most {abi.C['RLB_MAX_MEMBERS']} next hops per route")
        key = self._group_key([n.id for n, _ in members], [w for _, w in members])
        g = self.group_by_key.get(key)
        if g is not None:
            return g
        gid = self.free_group.take("group")
        # Members the previous group had keep their index (a DLB flowlet stores the index and
        # checks it), joiners go after them: a rewrite re-places only flows that must move.
        prev = self.group_by_id.get(previous)
        rank = {nid: i for i, nid in enumerate(prev.members)} if prev is not None else {}
        ordered = sorted(members, key=lambda m: (rank.get(m[0].id, len(rank)), m[0].id))
        ids, weights = [n.id for n, _ in ordered], [w for _, w in ordered]
        prev_table, generation = None, 1
        if prev is not None:
            old = self.maps["groups"].get(prev.id)
            prev_table = [old.member_nh[s] for s in old.slot]
            generation = prev.generation + 1
        table = build_slots(ids, weights, abi.C["RLB_SLOTS"], prev_table)
        m = self.maps["groups"]
        e = m.leaf_type()
        e.n_members, e.generation = len(ids), generation
        for i, (nid, w) in enumerate(zip(ids, weights)):
            e.member_nh[i], e.weight[i] = nid, w
        e.slot[:] = bytes(table)
        m.set(gid, e)
        g = _Group(gid, key, ids, 0, generation)
        for nid in ids:
            self.nh_by_id[nid].refs += 1
        self.group_by_id[gid] = g
        self.group_by_key[key] = g
        return g

    def _free_group(self, g: _Group):
        self.maps["groups"].zero(g.id)
        self.group_by_id.pop(g.id, None)
        if self.group_by_key.get(g.key) is g:
            del self.group_by_key[g.key]
        self.free_group.give(g.id)
        for nid in g.members:
            self.nh_by_id[nid].refs -= 1

    def _free_nh(self, n: _Nh):
        self.maps["nexthops"].zero(n.id)
        self.nh_by_id.pop(n.id, None)
        if self.nh_by_key.get(n.key) is n:
            del self.nh_by_key[n.key]
        self.free_nh.give(n.id)

    def _route_value(self, rt: _Route):
        """The map value of rt (struct rlb_route). Shared by every route of the same fields
        (thousands of prefixes name the same next hop and group): read-only to callers."""
        fields = (rt.mode, rt.nexthop, rt.group, rt.ifindex, rt.port, rt.owner)
        v = self._values.get(fields)
        if v is None:
            if len(self._values) >= VALUES_MAX:
                self._values.clear()
            v = self.maps["routes"].leaf_type()
            v.mode = abi.MODE_IDS[rt.mode]
            v.nexthop, v.group, v.ifindex, v.port = rt.nexthop, rt.group, rt.ifindex, rt.port
            v.owner = abi.OWNERS[rt.owner]
            self._values[fields] = v
        return v

    def _write_route(self, net: ipaddress.IPv6Network, rt: _Route):
        """The trie's entry; returns the value written (the exact table takes the same)."""
        value = self._route_value(rt)
        self.maps["routes"].set(self._key(net), value)
        return value

    # ---- the exact /64 table ---------------------------------------------------------------
    # exact64 holds a /64 route exactly when no longer prefix lies inside it: then the /64 is
    # the longest match for every address in it and one array probe answers for the trie.
    @staticmethod
    def _slash64(net: ipaddress.IPv6Network) -> ipaddress.IPv6Network | None:
        return net.supernet(new_prefix=64) if net.prefixlen > 64 else (net if net.prefixlen == 64 else None)

    def _fast_update(self, net: ipaddress.IPv6Network, delta: int, value=None):
        """After net was added (delta 1), changed (0) or removed (-1): bring its /64's exact
        entry in line. value: net's route value, when the caller has just built it."""
        n64 = self._slash64(net)
        if n64 is None:
            return
        if net.prefixlen > 64 and delta:
            self._longer[n64] = self._longer.get(n64, 0) + delta
            if self._longer[n64] <= 0:
                del self._longer[n64]
        rt = self.routes.get(n64)
        if rt is not None and n64 not in self._longer:
            self.exact.put(n64, value if value is not None and n64 is net else self._route_value(rt))
        else:
            self.exact.remove(n64)

    def _fast_rebuild(self):
        """Adoption: the exact table recomputed from the routes (it is derived state); entries
        already right are not rewritten."""
        self._longer: dict[ipaddress.IPv6Network, int] = {}
        for net in self.routes:
            if net.prefixlen > 64:
                n64 = net.supernet(new_prefix=64)
                self._longer[n64] = self._longer.get(n64, 0) + 1
        self.exact = ExactTable(self.maps["exact64"], abi.C)
        self.exact.load()
        self.exact.sync({n: self._route_value(rt) for n, rt in self.routes.items()
                         if n.prefixlen == 64 and n not in self._longer})

    def port_moved(self, ifindex: int, slot: int):
        """A port (re)registered in a new slot: next hops and connected routes through it follow."""
        self._own()
        with self.writer.locked():
            m = self.maps["nexthops"]
            for n in self.nh_by_id.values():
                if n.key[0] == ifindex:
                    e = m.get(n.id)
                    if e is not None and e.port != slot:
                        e.port = slot
                        m.set(n.id, e)
            for net, rt in self.routes.items():
                if rt.mode == "connected" and rt.ifindex == ifindex and rt.port != slot:
                    rt.port = slot
                    self._write_route(net, rt)
                    self._fast_update(net, 0)

    def _build(self, route: Route, previous: _Route | None) -> _Route:
        """Steps 1 and 2 for one route: its next hops and group exist (refs taken)."""
        mode = "weighted" if route.mode == "ecmp" else route.mode
        rt = _Route(mode)
        prev_group = previous.group if previous else 0
        if mode == "connected":
            rt.ifindex = self.ports.ifindex(route.dev)
            found = self.ports.port_slot(rt.ifindex)
            if found is None:
                raise self.ports.error(f"{route.dev} is not attached")
            rt.port = found[0]
        elif mode != "local":
            rt.nexthop, rt.group = self._next_hops_of(route, mode, prev_group)
        self._ref(rt, +1)
        return rt

    def _next_hops_of(self, route: Route, mode: str, prev_group: int) -> tuple[int, int]:
        """(primary next hop id, group id) for route, acquired; within a batch remembered per
        next-hop set (a leaf's thousands of prefixes name a handful), as long as both are
        still the ones acquired."""
        # by identity: hashing the frozen next hops costs more than the rest; the batch's routes
        # keep them alive, and equal hops that are distinct objects only miss the memory
        sig = (route.mode, tuple(map(id, route.nexthops)), tuple(map(id, route.backups)), prev_group)
        memo = self._sets.get(sig) if self._sets is not None else None
        if memo is not None:
            nh, g = memo
            if (nh is None or self.nh_by_id.get(nh.id) is nh) and (g is None or self.group_by_id.get(g.id) is g):
                return (nh.id if nh else 0), (g.id if g else 0)
        scanned = route.backups if mode == "pinned" else route.nexthops if mode in ("dlb", "spray") else ()
        if len(scanned) > self.dlb_scan:
            raise RouteError(f"{mode}: at most {self.dlb_scan} {'backups' if mode == 'pinned' else 'next hops'} "
                             f"on this kernel (its verifier takes the switch program's DLB scan no wider; "
                             f"{len(scanned)} given)")
        nh = g = None
        if mode == "pinned":
            nh = self._acquire_nh(self._spec_key(route.nexthops[0]), route.nexthops[0])
            if route.backups:
                members = [(self._acquire_nh(self._spec_key(b), b), b.weight) for b in route.backups]
                g = self._acquire_group(members, prev_group)
        else:
            members = [(self._acquire_nh(self._spec_key(h), h), 1 if route.mode == "ecmp" else h.weight)
                       for h in route.nexthops]
            g = self._acquire_group(members, prev_group)
        if self._sets is not None:
            self._sets[sig] = (nh, g)
        return (nh.id if nh else 0), (g.id if g else 0)

    def _release(self, rt: _Route):
        """Steps 4 and 5: drop a replaced or removed route's references; free what is unused."""
        self._ref(rt, -1)
        g = self.group_by_id.get(rt.group) if rt.group else None
        if g is not None and g.refs == 0:
            self._free_group(g)
        for nid in ([rt.nexthop] if rt.nexthop else []) + (g.members if g is not None and g.refs == 0 else []):
            n = self.nh_by_id.get(nid)
            if n is not None and n.refs == 0:
                self._free_nh(n)

    def owned_by(self, owner: str) -> set[str]:
        return {str(n) for n, rt in self.routes.items() if rt.owner == owner}

    def owner(self, prefix) -> str | None:
        rt = self.routes.get(ipaddress.IPv6Network(prefix))
        return None if rt is None else rt.owner

    def apply(self, desired: list[Route], scope=None, merge: bool = False, keep_going: bool = False,
              owner: str = "operator", only_own: bool = False) -> Changes:
        """Make the programmed routes equal to `desired`. Routes outside `scope` (a predicate on
        the prefix; default: all) are left alone, as are, with merge, routes not in `desired`.
        keep_going: a route that cannot be programmed (its port is not attached yet) stays as it
        was and is reported in Changes.failed; otherwise the first such error stops the batch.
        owner: recorded in each route written, so that a restarted agent knows which are its own.
        only_own: a route another owner holds is left alone (Changes.yielded), decided under the
        lock the write takes: the bird follower's check before it had a window in which an
        operator's route written meanwhile was overwritten as the agent's."""
        abi.OWNERS[owner]               # an unknown owner fails here, before anything is written
        want: dict[ipaddress.IPv6Network, Route] = {}
        for r in desired:
            if r.prefix in want:
                raise RouteError(f"{r.prefix} is given twice")
            want[r.prefix] = r
        ch = Changes()
        self._own()
        with self.writer.locked(), self._batch():
            todo = []
            for net, route in want.items():
                cur = self.routes.get(net)
                if only_own and cur is not None and cur.owner != owner:
                    ch.yielded.append(network_text(net))
                    continue
                if cur is not None and self._canonical_of(cur) == self._canonical(route):   # keeps its owner
                    ch.unchanged += 1
                    continue
                todo.append((net, route, cur))
            gone = [] if merge else [net for net in self.routes if net not in want
                                     and (scope is None or scope(net))]
            if not todo and not gone:
                return ch
            self.batches += 1
            if owner != "agent":
                self.operator_writes += 1
            self.exact.defer()             # new /64s written in two batches at the end
            new: list[tuple[ipaddress.IPv6Network, _Route]] = []
            try:
                routes_map = self.maps["routes"]
                # withdrawals first: they always apply, whatever the new routes meet (a full
                # table), and the room they free is there for the new ones
                for net in gone:
                    routes_map.delete(self._key(net))
                    old = self.routes.pop(net)
                    self._fast_update(net, -1)                       # before its group is freed
                    self._release(old)
                    ch.removed.append(network_text(net))
                for net, route, cur in todo:
                    try:
                        rt = self._build(route, cur)                  # steps 1, 2
                    except (RouteError, self.ports.error) as e:
                        if not keep_going:
                            raise
                        self._collect()
                        ch.failed[network_text(net)] = str(e)
                        continue
                    rt.owner = owner
                    if cur is None:        # nothing to switch over from: step 3 in a batch
                        new.append((net, rt))
                        if len(new) >= TRIE_BATCH:
                            self._add_new(new, ch, keep_going)
                        continue
                    try:
                        value = self._write_route(net, rt)             # step 3: the switch-over
                    except OSError as e:           # the route table is full: nothing of it stays
                        self._release(rt)
                        err = RouteError(f"{net}: route table full ({e.strerror or e})")
                        if not keep_going:
                            raise err from None
                        ch.failed[network_text(net)] = str(err)
                        continue
                    self.routes[net] = rt
                    self._fast_update(net, 0, value)
                    self._release(cur)                               # steps 4, 5
                    ch.changed.append(network_text(net))
                self._add_new(new, ch, keep_going)
            except Exception:
                self._add_new(new, ch, keep_going=True)   # what was built before the error goes in
                self._collect()      # what a failed route acquired and nobody references
                raise
            finally:
                self.exact.flush(stop=True)
        if log.isEnabledFor(logging.DEBUG):
            for p in ch.added + ch.changed:
                log.debug("route %s %s", p, describe(want[ipaddress.IPv6Network(p)]))
        return ch

    def _add_new(self, new: list, ch: Changes, keep_going: bool):
        """Step 3 for routes the trie does not have yet: their entries in one batch write. An
        entry the map refuses (the table full) takes nothing with it; without keep_going it
        stops the batch, and the entries after it are not written either. Empties new."""
        routes_map = self.maps["routes"]
        try:
            while new:
                values = [self._route_value(rt) for _, rt in new]
                raw = {id(v): bytes(v) for v in {id(v): v for v in values}.values()}   # shared: one copy each
                done, err = routes_map.put_many(b"".join(abi.lpm_key_bytes(net) for net, _ in new),
                                                b"".join(raw[id(v)] for v in values), len(new))
                for (net, rt), value in zip(new[:done], values):
                    self.routes[net] = rt
                    self._fast_update(net, 1, value)
                    ch.added.append(network_text(net))
                del new[:done]
                if err is None:
                    return
                net, rt = new.pop(0)
                self._release(rt)
                refused = RouteError(f"{net}: route table full ({err.strerror or err})")
                if not keep_going:
                    raise refused
                ch.failed[network_text(net)] = str(refused)
        finally:
            for _, rt in new:                # never written: nothing of them stays
                self._release(rt)
            new.clear()

    @contextlib.contextmanager
    def _batch(self):
        """Within one batch each distinct next hop is resolved to its key once."""
        self._keys, self._sets = {}, {}
        try:
            yield
        finally:
            self._keys = self._sets = None

    def delete(self, prefix) -> bool:
        net = ipaddress.IPv6Network(prefix)
        self._own()
        with self.writer.locked():
            rt = self.routes.pop(net, None)
            if rt is None:
                return False
            self.operator_writes += 1
            self.maps["routes"].delete(self._key(net))
            self._fast_update(net, -1)
            self._release(rt)
        return True

    def _collect(self) -> tuple[list, list]:
        """Free every group and next hop nobody references; returns them."""
        groups = [g for g in self.group_by_id.values() if g.refs == 0]
        for g in groups:
            self._free_group(g)                      # drops its members' references
        nhs = [n for n in self.nh_by_id.values() if n.refs == 0]
        for n in nhs:
            self._free_nh(n)
        return groups, nhs

    # ---- neighbours -----------------------------------------------------------------------
    def update_neighbour(self, ifindex: int, address: str, mac: str | None) -> int:
        """A neighbour's MAC appeared, changed or went: the next hops through it follow."""
        self._own()
        with self.writer.locked():
            n = self.nh_by_key.get((ifindex, ipaddress.IPv6Address(address).packed, ""))
            changed = 0
            if n is not None:
                m = self.maps["nexthops"]
                e = m.get(n.id)
                if mac:
                    e.dmac[:] = abi.mac_bytes(mac)
                    e.flags |= abi.NH_RESOLVED
                else:
                    e.flags &= ~abi.NH_RESOLVED
                m.set(n.id, e)
                changed = 1
            return changed

    def gateways(self, ifindex: int) -> list[str]:
        """Neighbours the next hops on a port go through (to resolve them again after a flap)."""
        keys = list(self.nh_by_key)         # one copy: the writer's thread may change it meanwhile
        return [str(ipaddress.IPv6Address(k[1])) for k in keys if k[0] == ifindex and k[1]]

    # ---- reading ----------------------------------------------------------------------------
    def usage(self) -> dict:
        return {"routes": len(self.routes), "groups": len(self.group_by_id), "nexthops": len(self.nh_by_id),
                "groups_free": len(self.free_group), "nexthops_free": len(self.free_nh)}
