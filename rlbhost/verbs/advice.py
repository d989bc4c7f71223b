"""The coordinator's view of the fabric, for the path of a new verbs QP.

A QP placed through verbs keeps its path for life (its address vector is fixed at RTR), so the
coordinator cannot move it later as it moves an idle TC-seen QP: its say has to come when the QP
is placed. Each report's answer carries the loads the coordinator has placed on this host's leaf
uplinks and on the downlinks into its peers' leaves (rlbcoord/service.py); the rendezvous
keeps, of the paths both ends can use, those whose two links would be the least loaded for their
capacity after this QP (max of the two, as the coordinator's colouring weighs them), counting the
QPs it placed since its last report as well, and the local rule breaks the ties. Without an
answer younger than STALE_S the local rule decides alone, as without a coordinator."""
from __future__ import annotations

import ipaddress
import threading
import time

from rlbfabric.kinds.clos import ClosFabric

STALE_S = 3.0


class FabricView:
    def __init__(self, fabric: ClosFabric, node: str, clock=time.monotonic):
        self.fabric, self.node, self.clock = fabric, node, clock
        self.leaf = fabric.leaf_of_host(node)[0].name
        lf0 = fabric.leaves[0]
        self.colour = {k: fabric.port_id(k, lf0) - 1 for k in range(1, fabric.paths + 1)}
        self.host_of = fabric.host_of_prefix()
        self.lock = threading.Lock()
        self.links: dict | None = None
        self.at = 0.0
        self.pending: list[tuple[float, str, int]] = []   # (when, peer leaf, colour) placed since
        self.peers: dict[str, float] = {}                  # peer address -> last asked about

    # ---- fed by the coordinator client ------------------------------------------------------
    def peer_list(self) -> list[str]:
        """Peers to ask the downlink loads of (asked about in the last minute)."""
        now = self.clock()
        with self.lock:
            for p in [p for p, t in self.peers.items() if now - t > 60]:
                del self.peers[p]
            return sorted(self.peers)

    def answered(self, links: dict | None, sent_at: float):
        """A report sent at sent_at was answered with these link loads: what was placed before it
        was sent is in them now."""
        with self.lock:
            self.links, self.at = links, self.clock()
            self.pending = [p for p in self.pending if p[0] >= sent_at]

    # ---- used by the rendezvous -----------------------------------------------------------------
    def leaf_of(self, address: str) -> str | None:
        host = self.host_of.get(ipaddress.IPv6Network(f"{address}/64", strict=False))
        return self.fabric.leaf_of_host(host)[0].name if host else None

    def best(self, peer: str, values: set[int]) -> set[int] | None:
        """Of the path values, those the coordinator's loads make best for one more QP towards
        peer; None when there is no fresh answer (or the peer is on this host's leaf)."""
        with self.lock:
            self.peers[peer] = self.clock()
            links, fresh = self.links, self.clock() - self.at < STALE_S
            pending = list(self.pending)
        dst = self.leaf_of(peer)
        if not links or not fresh or dst is None or dst == self.leaf or links.get("leaf") != self.leaf:
            return None
        up, down = links["up"], links["down"].get(dst)
        score = {}
        for k in values:
            c = self.colour.get(k)
            if c is None:
                continue
            extra_up = sum(1 for _, _, pc in pending if pc == c)
            extra_down = sum(1 for _, leaf, pc in pending if pc == c and leaf == dst)
            parts = [_fill(up["load"][c] + extra_up, up["cap"][c])]
            if down is not None:
                parts.append(_fill(down["load"][c] + extra_down, down["cap"][c]))
            score[k] = None if None in parts else max(parts)
        live = {k: s for k, s in score.items() if s is not None}
        if not live:
            return None
        low = min(live.values())
        return {k for k, s in live.items() if s <= low + 1e-9}

    def placed(self, peer: str, value: int):
        """This host put a QP towards peer on path value: counted until the coordinator has it."""
        dst, c = self.leaf_of(peer), self.colour.get(value)
        if dst is not None and c is not None:
            with self.lock:
                self.pending.append((self.clock(), dst, c))


def _fill(load: int, cap: float) -> float | None:
    """How full a link would be with one QP more (None: a dead link)."""
    return None if cap <= 0 else (load + 1) / cap
