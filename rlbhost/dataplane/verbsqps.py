"""QPs placed by the verbs library (rlbhost/verbs/): the NIC builds their packets, so the TC
programs only leave them alone and count them; the agent is their only writer and keeps a
mirror of the map."""
from __future__ import annotations

import ipaddress
import struct
import time
from collections import Counter

from .abi import C, MAX_PATHS, VerbsQp, packed_addr


class VerbsQps:
    """(HostDataplane's) verbs QPs."""

    def active_counts(self, wid: int) -> list[int]:
        """Active QPs per path index under one weight entry (TC-seen and verbs QPs), as the data
        plane reads them (its count plus user space's, never below 0): two syscalls."""
        dp = struct.unpack(f"{MAX_PATHS}i", self.maps["active"].array_slice(wid * MAX_PATHS, MAX_PATHS))
        adj = struct.unpack(f"{MAX_PATHS}i", self.maps["active_adj"].array_slice(wid * MAX_PATHS, MAX_PATHS))
        return [max(0, a + b) for a, b in zip(dp, adj)]

    def _verbs_key(self, peer: str, qpn: int, direction: int):
        k = self.maps["verbs"].key_type()
        k.peer[:] = packed_addr(peer)
        k.qpn, k.dir = qpn, direction
        return k

    def verbs_put(self, q: VerbsQp):
        """Record a verbs QP (its TX entry, and for a QP its RX entry, which ingress must leave
        alone) and count it on its path at once, so the next QP placed sees it."""
        with self.verbs_lock:
            self._verbs_put(q)

    def _verbs_put(self, q: VerbsQp):
        m = self.maps["verbs"]
        v = m.leaf_type()
        v.created_ns = q.created_ns or time.clock_gettime_ns(time.CLOCK_MONOTONIC)
        v.peer_base[:] = packed_addr(q.peer_base)
        v.path, v.wid, v.local_qpn, v.remote_qpn, v.pid, v.flags = (
            q.path, q.wid, q.local_qpn, q.remote_qpn, q.pid, q.flags)
        mirror = self._verbs_mirror()
        old = mirror.get((q.peer_addr, q.remote_qpn))
        m.set(self._verbs_key(q.peer_addr, q.remote_qpn, C["RLBH_V_TX"]), v)
        if not q.is_ah:
            m.set(self._verbs_key(q.peer_addr, q.local_qpn, C["RLBH_V_RX"]), v)
        mirror[(q.peer_addr, q.remote_qpn)] = q
        counts = self._verbs_counts
        if old is not None:
            counts[(old.wid, old.path)] -= 1
            self._adjust(old.wid, old.path, -1)
        counts[(q.wid, q.path)] += 1
        self._adjust(q.wid, q.path, +1)

    def verbs_drop(self, q: VerbsQp) -> bool:
        m = self.maps["verbs"]
        with self.verbs_lock:
            gone = m.delete(self._verbs_key(q.peer_addr, q.remote_qpn, C["RLBH_V_TX"]))
            if not q.is_ah:
                m.delete(self._verbs_key(q.peer_addr, q.local_qpn, C["RLBH_V_RX"]))
            was = self._verbs_mirror().pop((q.peer_addr, q.remote_qpn), None)
            if was is not None:
                self._verbs_counts[(was.wid, was.path)] -= 1
            if gone:
                self._adjust(q.wid, q.path, -1)
        return bool(gone)

    def verbs_clear(self):
        """Forget every verbs QP (the map and this process's mirror of it)."""
        with self.verbs_lock:
            self.maps["verbs"].clear()
            self._verbs = {}
            self._verbs_counts = Counter()

    def _verbs_mirror(self) -> dict[tuple[str, int], VerbsQp]:
        with self.verbs_lock:
            if self._verbs is None:
                self._verbs = {(q.peer_addr, q.remote_qpn): q for q in self._verbs_from_map()}
                self._verbs_counts = Counter((q.wid, q.path) for q in self._verbs.values())
            return self._verbs

    def verbs_counts(self) -> dict[tuple[int, int], int]:
        """Verbs QPs per (weight entry, path index), kept with the mirror: the sweep adds them to
        the table's count without walking every QP (a server's thousands, each NIC, every sweep)."""
        with self.verbs_lock:
            self._verbs_mirror()
            return {k: n for k, n in self._verbs_counts.items() if n}

    def _verbs_from_map(self) -> list[VerbsQp]:
        out = []
        for k, v in self.maps["verbs"].items():
            if k.dir == C["RLBH_V_TX"]:
                out.append(VerbsQp(str(ipaddress.IPv6Address(bytes(v.peer_base))),
                                   str(ipaddress.IPv6Address(bytes(k.peer))), v.local_qpn, v.remote_qpn,
                                   v.path, v.wid, v.pid, v.flags, v.created_ns))
        return out

    def verbs_qps(self) -> list[VerbsQp]:
        """The QPs placed through verbs (read from the map once per process: the agent writes
        them all through verbs_put and verbs_drop)."""
        with self.verbs_lock:
            return list(self._verbs_mirror().values())

    def verbs_rows(self) -> list[dict]:
        """Every QP (and UD address handle) placed through verbs, for `rlbhost qps`."""
        now = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
        return [{"peer": q.peer_base, "peer_address": q.peer_addr, "qp": q.local_qpn, "peer_qp": q.remote_qpn,
                 "path": q.path, "pid": q.pid, "kind": "ah" if q.is_ah else "qp",
                 "decided": "here" if q.decided_here else "peer", "age_s": (now - q.created_ns) / 1e9}
                for q in self.verbs_qps()]
