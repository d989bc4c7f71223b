"""The connection-tracking table: each QP the TC programs see, on the path it was given until it
goes idle. The sweep drops idle QPs (handing them to whoever keeps their memory), moves the fewest
QPs when weights or paths change (rlbhost/rebalance.py), and keeps the active counters true; the
coordinator's placements are a map of their own, taken by new and idle QPs."""
from __future__ import annotations

import ipaddress
import logging
import struct
import time
from collections import Counter

from ..rebalance import LiveQp, moves
from .abi import MAX_PATHS, REASONS, SPRAY, HostError, addr_text, packed_addr

log = logging.getLogger("rlbhost.dataplane")


# A layout that stood this long without a change of weights is where its QPs belong (their home,
# rlbhost/rebalance.py): a change taken back sooner (a probe verdict, a flapping link), or made in
# steps closer together, moves back the QPs it moved rather than others. How many QPs move never
# depends on it, only which.
HOME_HOLD_NS = 5_000_000_000


def sweep_period(expiry_ms: float) -> float:
    """Seconds between sweeps (an idle QP leaves its path within an expiry and a sweep): half
    the expiry, at least 50 ms and at most 1 s, so that an expiry lowered at run time is seen
    within a second (half of a 60 s expiry kept a minute's idle QPs counted for 30 s more)."""
    return min(1.0, max(0.05, expiry_ms / 2000))


class QpTable:
    """(HostDataplane's) QP table, its sweep and the placements."""

    def on_idle(self, sink) -> None:
        """Call `sink({qp id: {"path", "bytes", "last_ns"}})` with the QPs each sweep removes as
        idle, outside the table's lock (the coordinator client: a burst shorter than its report
        period is swept before it reads the table). The table keeps none itself."""
        self._idle_sinks.append(sink)

    def rebalance(self, now_ns: int | None = None, release: bool = False,
                  before: dict[int, list[int]] | None = None, balance: bool = True) -> int:
        """Move the fewest QPs so each weight entry's live QPs match its weights (which ones:
        rlbhost/rebalance.py; release True after a change of capacity, `before` the previous
        effective weights per entry). A moved QP's coordinator placement is dropped (the
        coordinator starts again from where the host put it). Also drops idle entries and
        corrects the active counters from the table (balance False: only that, nothing moves).
        Returns the QPs moved."""
        now = now_ns or time.clock_gettime_ns(time.CLOCK_MONOTONIC)
        moved = 0
        how: Counter = Counter()      # (entry id, from path, to path): what moved, for the log
        idle: dict[tuple[str, int, int], dict] = {}
        with self.locked():
            ct = self.maps["conntrack"]
            cfg = self.maps["config"].get(0)
            expiry = cfg.expiry_ns
            entries = self._effective_all()
            # the data plane's counters before the table is read: a slot it touched meanwhile is
            # left for the next sweep (_recount)
            span = (max(entries) + 1) * MAX_PATHS if entries else 0
            window = self.maps["active"].array_slice(0, span) if span else b""
            flows_now = list(ct.items())
            # each map read once a sweep: a server's eight NICs sweep eight tables ten times a second
            placed = {self._qp_id(k): v.value for k, v in self.maps["placed"].items()} if flows_now else {}
            live: dict[int, list] = {wid: [] for wid in entries}
            # weights other than those last balanced to: a change, and homes wait for it to hold
            if release or any(self._laid_out.get(wid) != list(eff) for wid, (_, eff) in entries.items()):
                self._changed_ns = now
            homes = self._homes
            for k, v in flows_now:
                if now - v.last_ns >= expiry or v.wid not in entries:
                    if ct.delete(k):      # idle: re-assigned on its next packet anyway
                        self._adjust(v.wid, v.path, -1)
                    if self._idle_sinks:
                        idle[self._qp_id(k)] = {"path": v.path, "bytes": v.bytes, "last_ns": v.last_ns}
                    continue
                live[v.wid].append((k, v))
            for wid, (entry, eff) in entries.items():
                flows = live[wid]
                if not balance or entry.flags & SPRAY or not flows or not any(eff):
                    continue
                qps = [LiveQp(k, v.path, v.created_ns, self._qp_id(k) in placed,
                              homes.get(bytes(k), v.path)) for k, v in flows]
                values = {id(k): v for k, v in flows}
                for q, i in moves(qps, eff, release, cfg.group_size, cfg.rotation,
                                  (before or {}).get(wid)):
                    v = values[id(q.key)]
                    self._adjust(wid, v.path, -1)
                    self._adjust(wid, i, +1)
                    v.path = i
                    ct.set(q.key, v)
                    if self._qp_id(q.key) in placed:      # the host's own capacity rules
                        self.maps["placed"].delete(q.key)
                    moved += 1
                    how[(wid, q.path, i)] += 1
            if balance:         # each entry's QPs are now within one QP of these weights
                self._laid_out = {wid: list(eff) for wid, (_, eff) in entries.items()}
                # where each live QP belongs: where it is once the layout has held, else where it
                # was (a QP first seen: where it is); gone QPs are forgotten
                settled = now - self._changed_ns >= HOME_HOLD_NS
                self._homes = {kb: v.path if settled else homes.get(kb, v.path)
                               for flows in live.values() for kb, v in ((bytes(k), v) for k, v in flows)}
            self._recount(entries, live, window)
            if moved:
                self._count_event("ev_released", moved)
        if moved:
            # which entry and path indexes, and whether a change of capacity or the sweep moved
            # them: a move nobody expected is read from this line
            log.info("released %d QPs to match the weights (%s: %s)", moved, "release" if release else "sweep",
                     ", ".join(f"entry {w} index {a}->{b}" + (f" x{n}" if n > 1 else "")
                               for (w, a, b), n in sorted(how.items())))
        for sink in self._idle_sinks if idle else ():
            sink(idle)
        return moved

    def _recount(self, entries: dict, live: dict[int, list], before: bytes):
        """Correct the counters where they drifted from the table (entries the LRU evicted, an
        expiry the data plane and the sweep both saw): per slot, active_adj becomes the table's
        count (`live`, as the sweep left it) less the data plane's, but only for slots the data
        plane did not touch since `before` (read before the table was): otherwise its adds and
        this count disagree on which QPs they include, and the next sweep corrects that slot."""
        act = self.maps["active"]
        wids = set(entries)
        # only the slots of entries in use (ids are the lowest free: one span from 0): the
        # whole 65536-slot table three times per sweep cost an idle agent 20% of a core
        span = (max(wids) + 1) * MAX_PATHS if wids else 0
        if not span:
            return
        counts = Counter((v.wid, v.path) for flows in live.values() for _, v in flows)
        after = act.array_slice(0, span)
        dp_now = struct.unpack(f"{span}i", after)
        with self.verbs_lock:
            counts.update(self.verbs_counts())     # placed through verbs: active until destroyed
            adj = self.maps["active_adj"]
            adj_now = struct.unpack(f"{span}i", adj.array_slice(0, span))
            for wid in wids:
                for i in range(MAX_PATHS):
                    idx = wid * MAX_PATHS + i
                    if before[4 * idx:4 * idx + 4] != after[4 * idx:4 * idx + 4]:
                        continue
                    want = counts.get((wid, i), 0) - dp_now[idx]
                    if adj_now[idx] != want:
                        adj.set(idx, adj.leaf_type(want))

    def _adjust(self, wid: int, path: int, delta: int):
        """User space's part of a slot's count (active_adj: no one else writes it)."""
        adj = self.maps["active_adj"]
        idx = wid * MAX_PATHS + path
        with self.verbs_lock:
            adj.set(idx, adj.leaf_type(adj.get(idx).value + delta))

    def _count_event(self, name: str, n: int):
        """Events user space causes go to CPU 0's slot of the per-CPU reasons counter."""
        rid = {v: k for k, v in REASONS.items()}[name]
        m = self.maps["reasons"]
        rows = m.get_percpu(rid)
        rows[0] = m.leaf_type(rows[0].value + n)
        m.set_percpu(rid, rows)

    def qps(self) -> list[dict]:
        now = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
        expiry = self.maps["config"].get(0).expiry_ns
        out = []
        for k, v in self.maps["conntrack"].items():
            out.append({"peer": str(ipaddress.IPv6Address(bytes(k.peer))), "sport": k.sport, "qp": k.qp,
                        "path": v.path, "idle_ms": (now - v.last_ns) / 1e6,
                        "active": now - v.last_ns < expiry, "bytes": v.bytes})
        return out

    @staticmethod
    def _qp_id(k) -> tuple[str, int, int]:
        return (addr_text(bytes(k.peer)), k.sport, k.qp)

    def _ct_key(self, peer: str, sport: int, qp: int):
        k = self.maps["conntrack"].key_type()
        k.peer[:] = packed_addr(peer)
        k.sport, k.qp = sport, qp
        return k

    def placements(self) -> dict[tuple[str, int, int], int]:
        """{(peer, UDP source port, QP): path index} the coordinator asked for."""
        return {self._qp_id(k): v.value for k, v in self.maps["placed"].items()}

    def set_placements(self, want: dict[tuple[str, int, int], int]) -> tuple[int, int]:
        """Make the placement map exactly `want` ({(peer, sport, qp): path index}); new and idle
        QPs take them, QPs with packets in flight keep their path. Returns (written, deleted)."""
        m = self.maps["placed"]
        have = self.placements()
        written = deleted = 0
        for qp, path in want.items():
            if not 0 <= path < MAX_PATHS:
                raise HostError(f"placement of {qp}: path index {path} out of range")
            if have.get(qp) != path:
                m.set(self._ct_key(*qp), m.leaf_type(path))
                written += 1
        for qp in set(have) - set(want):
            m.delete(self._ct_key(*qp))
            deleted += 1
        return written, deleted
