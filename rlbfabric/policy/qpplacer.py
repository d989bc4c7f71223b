"""QPs of named hosts placed on paths: the fabric file turns hosts into leaves and paths into
colours (uplinks) for the leaf-level algorithm (placement.py), and its answer back into a path per
QP. This is the coordinator's model; simulations drive it directly."""
from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import Hashable

from ..fabric import Fabric
from .placement import DOWN, UP, Placement


@dataclass
class QpInfo:
    src: str                      # sending host
    dst: str                      # receiving host
    path: int | None              # path value (k) it is on now, as its host reported
    weights: dict[int, float]     # path value -> the sender's weight for this peer (0: not usable)
    bytes: int = 0

    @property
    def allowed(self) -> frozenset[int]:
        return frozenset(k for k, w in self.weights.items() if w > 0)


class QpPlacer:
    """Keeps every known QP with its placed path; changes are incremental."""

    def __init__(self, fabric: Fabric):
        self.fabric = fabric
        self.leaf_index = {lf.name: i for i, lf in enumerate(fabric.leaves)}
        self.leaf_of_host = {h: self.leaf_index[fabric.leaf_of_host(h)[0].name] for h in fabric.hosts}
        self.n_colours = fabric.colours()
        self.paths = list(range(1, fabric.paths + 1))
        # path k -> colour (0-based uplink) is the same on every leaf (port_id depends on the pod's size)
        lf0 = fabric.leaves[0]
        self.colour_of_path = {k: fabric.port_id(k, lf0) - 1 for k in self.paths}
        self.prefix_host = fabric.host_of_prefix()
        self.placement = Placement(len(fabric.leaves), self.n_colours)
        self.qps: dict[Hashable, QpInfo] = {}
        self.local: dict[Hashable, QpInfo] = {}      # QPs inside one leaf: no fabric link to place
        self.by_host: dict[str, set] = {}            # sending host -> its fabric-crossing QPs
        self.link_up: dict[tuple[int, int], bool] = {}
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
        self.placement.set_capacity(leaf, UP, caps)
        self.placement.set_capacity(leaf, DOWN, caps)

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
        net = ipaddress.IPv6Network(f"{address}/64", strict=False)
        return self.prefix_host.get(net)

    def colour_weights(self, weights: dict[int, float]) -> list[float]:
        """A QP's path weights per colour (the best path of each colour when paths > uplinks)."""
        out = [0.0] * self.n_colours
        for k, w in weights.items():
            c = self.colour_of_path.get(k)
            if c is not None:
                out[c] = max(out[c], w)
        return out

    def add(self, key: Hashable, qp: QpInfo):
        if key in self.qps or key in self.local:
            self.remove(key)
        a, b = self.leaf_of_host[qp.src], self.leaf_of_host[qp.dst]
        if a == b:
            self.local[key] = qp
            return
        self.qps[key] = qp
        self.by_host.setdefault(qp.src, set()).add(key)
        colour = self.colour_of_path.get(qp.path) if qp.path in qp.allowed else None
        self.placement.add(key, a, b, colour=colour, weights=self.colour_weights(qp.weights))

    def remove(self, key: Hashable) -> bool:
        if self.local.pop(key, None) is not None:
            return True
        qp = self.qps.pop(key, None)
        if qp is None:
            return False
        self.by_host[qp.src].discard(key)
        self.placement.remove(key)
        return True

    def update(self, key: Hashable, qp: QpInfo):
        """A QP seen again: only its bytes and current path change; its placement stays unless its
        peer or its host's weights changed. Then it starts again from the path its host put it
        on (a host releases QPs from a degraded path at once; the placement follows from there)."""
        old = self.qps.get(key) or self.local.get(key)
        if old is None or (old.dst, old.weights) != (qp.dst, qp.weights):
            self.add(key, qp)
            return
        old.bytes, old.path = qp.bytes, qp.path

    def __len__(self) -> int:
        return len(self.qps) + len(self.local)

    def solve(self) -> int:
        """Bring the placement to the targets; returns how many QPs got a new colour."""
        return len(self.placement.solve())

    def path(self, key: Hashable) -> int | None:
        """The path value placed for a QP (None: within a leaf, or no usable path)."""
        qp = self.qps.get(key)
        if qp is None:
            return None
        c = self.placement.colour(key)
        if c is None:
            return None
        if qp.path in qp.allowed and self.colour_of_path.get(qp.path) == c:
            return qp.path          # where it is already: nothing to change
        # several paths share a colour when paths > uplinks: the lowest allowed one
        return min(k for k in qp.allowed if self.colour_of_path.get(k) == c)

    def placements(self, host: str) -> dict[Hashable, int]:
        out = {}
        for key in self.by_host.get(host, ()):
            p = self.path(key)
            if p is not None:
                out[key] = p
        return out

    # ---- reading ------------------------------------------------------------------------
    def link_loads(self) -> dict[str, dict[str, list[int]]]:
        """{leaf: {"up": QPs per colour, "down": QPs per colour}} as placed."""
        loads = self.placement.loads()
        return {lf.name: {"up": loads[UP][i], "down": loads[DOWN][i]}
                for i, lf in enumerate(self.fabric.leaves)}

    def caps(self, leaf: str) -> list[float]:
        return self.placement.cap[UP][self.leaf_index[leaf]]

    def excess(self) -> int:
        return self.placement.excess()
