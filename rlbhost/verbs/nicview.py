"""Each fabric NIC as the verbs service decides with it: its paths, weights and rotation as its
data plane has them (read at most every VIEW_S: a burst of questions reads them once), which of
its paths a QP on an RDMA port can use (a RoCE v2 GID for the path's address), and the choice of
one: the coordinator's best links first, then the local rule (rlbfabric/policy/localrule.py,
what the TC program does)."""
from __future__ import annotations

import functools
import ipaddress
import time
from dataclasses import dataclass, field

from rlbfabric import addrplan
from rlbfabric.policy import localrule

from ..dataplane import MAX_PATHS, HostDataplane
from ..gids import GidTable
from .advice import FabricView

VIEW_S = 0.05                  # the paths and weights are read at most this often


@dataclass
class View:
    """One NIC's paths as its data plane has them, read once per question."""
    field: int
    base_value: int
    base_addr: str
    index: dict[int, int]          # path value -> index (valid paths)
    addr: dict[int, str]           # path value -> this host's address on it
    rotation: int
    ports_mode: bool

    def peer_base(self, addr: str) -> str | None:
        """The peer's base address, if addr is one of a fabric host's path addresses."""
        if field_value(addr, self.field) not in self.index:
            return None
        return with_field(addr, self.field, self.base_value)


@dataclass
class NicState:
    """A fabric NIC as the service uses it: its data plane, and the coordinator's view from it."""
    ifname: str
    dp: HostDataplane
    advice: FabricView | None = None
    view_at: tuple[float, View] | None = None
    weights_at: dict[str, tuple[int, list[int]] | None] = field(default_factory=dict)
    placed: dict[str, int] = field(default_factory=lambda: {"rtr": 0, "ah": 0})


class NicViews:
    """The service's NICs, each viewed afresh at most every VIEW_S; `why` says why the last
    choice was made (for `rlbhost why`)."""

    def __init__(self, nics: dict[str, NicState], gids: GidTable):
        self.nics, self.gids = nics, gids
        self.by_base: dict[str, NicState] = {}      # a NIC's base address (as last viewed) -> it
        self.why: Why | str = ""

    def view(self, nic: NicState) -> View:
        """Read again when older than VIEW_S (a path gone in the meantime is the switches'
        failover's, as for any QP on it)."""
        now = time.monotonic()
        if nic.view_at is None or now - nic.view_at[0] > VIEW_S:
            cfg = nic.dp.config()
            paths = [p for p in nic.dp.paths() if p.valid]
            base = next((p for p in paths if p.index == cfg["base_index"]), None)
            nic.view_at = (now, View(cfg["path_field"], base.value if base else 0, base.address if base else "",
                                     {p.value: p.index for p in paths}, {p.value: p.address for p in paths},
                                     cfg["rotation"], cfg["mode"] == "ports"))
            nic.weights_at.clear()
            if base:
                self.by_base[base.address] = nic
        return nic.view_at[1]

    def of_base(self, base: str) -> NicState | None:
        """The NIC whose base address this is."""
        nic = self.by_base.get(base)
        if nic is None or self.view(nic).base_addr != base:
            for n in self.nics.values():       # a base moved or new: every view fresh (at most every VIEW_S)
                self.view(n)
            nic = self.by_base.get(base)
        return nic if nic is not None and nic.view_at[1].base_addr == base else None

    def weights(self, nic: NicState, peer: str) -> tuple[int, list[int]] | None:
        """dp.weights_for(peer), read once per view."""
        self.view(nic)
        if peer not in nic.weights_at:
            nic.weights_at[peer] = nic.dp.weights_for(peer)
        got = nic.weights_at[peer]
        return None if got is None else (got[0], list(got[1]))

    def usable(self, nic: NicState, v: View, peer: str, dev: str | None,
               port: int | None) -> tuple[int, list[int]] | None:
        """(weight entry, weight per path index) towards peer, 0 where this NIC cannot use the
        path (no weight, invalid, or no RoCE v2 GID for its address on dev/port)."""
        got = self.weights(nic, peer)
        if got is None:
            return None
        wid, eff = got
        if dev:
            for value, i in v.index.items():
                if eff[i] and self.gids.index_of(dev, port, v.addr[value]) is None:
                    eff[i] = 0
        return wid, eff

    @staticmethod
    def paths(v: View, usable: tuple[int, list[int]] | None) -> frozenset[int]:
        """The path values `usable` leaves open."""
        return frozenset(val for val, i in v.index.items() if usable and usable[1][i])

    def choose(self, nic: NicState, v: View, peer: str, wid: int, eff: list[int],
               allowed: frozenset[int]) -> int | None:
        """Of the paths both ends can use, those the coordinator's loads make best (all of them
        without a coordinator), then the local rule: a path value, or None. self.why says why."""
        usable = {value for value, i in v.index.items() if value in allowed and eff[i]}
        best = nic.advice.best(peer, usable) if nic.advice is not None and usable else None
        weights = [0] * MAX_PATHS
        for value in best or usable:
            weights[v.index[value]] = eff[v.index[value]]
        active = nic.dp.active_counts(wid)
        i = localrule.choose(active, weights, v.rotation)
        value = None if i is None else next(val for val, idx in v.index.items() if idx == i)
        if value is not None and nic.advice is not None:
            nic.advice.placed(peer, value)
        self.why = Why(nic.ifname if len(self.nics) > 1 else "", usable, best, active, eff, v.index, v.rotation)
        return value


class Why:
    """Why the local rule chose a path, put into words only when read (`rlbhost why`, the status
    file's last decisions): a server's thousands of choices a second are not all read."""
    __slots__ = ("lead", "nic", "usable", "best", "active", "eff", "index", "rotation", "_text")

    def __init__(self, nic: str, usable: set[int], best, active: list[int], eff: list[int],
                 index: dict[int, int], rotation: int, lead: str = ""):
        self.lead, self.nic, self.usable, self.best = lead, nic, usable, best
        self.active, self.eff, self.index, self.rotation = active, eff, index, rotation
        self._text = ""

    def said(self, lead: str) -> Why:
        """This choice, introduced by `lead` ("decided here")."""
        return Why(self.nic, self.usable, self.best, self.active, self.eff, self.index, self.rotation, f"{lead}: ")

    def __str__(self) -> str:
        if not self._text:                   # (the status file shows the last ones every second)
            shown = sorted(self.best or self.usable)
            counts = ", ".join(f"{k}: {self.active[self.index[k]]}" for k in shown)
            self._text = (self.lead + (f"{self.nic}: " if self.nic else "")
                          + f"paths both ends can use {sorted(self.usable)}"
                          + (f", of which the coordinator's link loads make {sorted(self.best)} best"
                             if self.best else "")
                          + f"; QPs on them {{{counts}}} for weights "
                          + f"{[self.eff[self.index[k]] / 1000 for k in shown]}, ties from path {self.rotation + 1}")
        return self._text


# Addresses repeat (a host's peers, their paths): the conversions are remembered.
@functools.lru_cache(maxsize=65536)
def field_value(addr: str, field: int) -> int:
    return addrplan.field_value(addr, field)


@functools.lru_cache(maxsize=65536)
def with_field(addr: str, field: int, value: int) -> str:
    return str(addrplan.with_field(addr, field, value))


@functools.lru_cache(maxsize=65536)
def addr_lt(a: str, b: str) -> bool:
    return ipaddress.IPv6Address(a).packed < ipaddress.IPv6Address(b).packed
