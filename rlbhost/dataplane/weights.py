"""Weights per path for destination prefixes (an LPM table: a host's own ::/0, the fabric
file's speeds, the coordinator's and the operator's entries); a QP's entry names its weight
entry, whose active QPs per path the data plane and user space count together."""
from __future__ import annotations

import ipaddress
import logging
import math
from typing import Callable

from rlbcommon.constants import U32_MAX

from .abi import C, MAX_PATHS, SPRAY, WEIGHT_SCALE, HostError, packed_addr

log = logging.getLogger("rlbhost.dataplane")


class Weights:
    """(HostDataplane's) weight entries."""

    @staticmethod
    def _net(prefix: str) -> ipaddress.IPv6Network:
        """An operator's prefix, or a HostError saying what is wrong with it."""
        try:
            return ipaddress.IPv6Network(prefix)
        except ValueError as e:
            raise HostError(f"prefix: {e}") from None

    def _wkey(self, prefix: str):
        net = self._net(prefix)
        k = self.maps["weights"].key_type()
        k.prefixlen = net.prefixlen
        k.addr[:] = net.network_address.packed
        return k

    def set_weights(self, weights: dict[int, float], prefix: str = "::/0", spray: bool = False):
        """Weights per path (by path field value; unnamed paths keep weight 1 at creation,
        0 means unusable) for destinations in prefix; then release or reinstate QPs."""
        self._net(prefix)
        with self.locked():
            before = self._before()
            with self.locked_part("weights"):
                self._set_weights_locked(prefix, weights, spray)
        self.rebalance(release=True, before=before)

    def _set_weights_locked(self, prefix: str, weights: dict[int, float], spray: bool,
                            present: bool | None = None, used: set[int] | None = None,
                            paths: dict[int, int] | None = None):
        """Write one entry. A caller writing many passes what it already knows: whether the
        prefix has an entry, the entry ids in use (taken ids are added) and {path value: index}."""
        wm = self.maps["weights"]
        key = self._wkey(prefix)
        if present is None:   # exactly this prefix: a trie lookup answers for a shorter one (::/0)
            present = any(k.prefixlen == key.prefixlen and bytes(k.addr) == bytes(key.addr) for k in wm.keys())
        entry = wm.get(key) if present else None
        if paths is None:
            paths = {p.value: p.index for p in self.paths()}
        unknown = set(weights) - set(paths)
        if unknown:
            raise HostError(f"no path with field value {sorted(unknown)}; paths are {sorted(paths)}")
        for value, w in weights.items():
            if not isinstance(w, (int, float)) or not math.isfinite(w) or w < 0:
                raise HostError(f"path {value}: weight {w!r} must be a finite number >= 0")
            if round(w * WEIGHT_SCALE) > U32_MAX:
                raise HostError(f"path {value}: weight {w} is too large (at most {U32_MAX // WEIGHT_SCALE}; "
                                f"only ratios matter)")
        if entry is None:
            if used is None:
                used = {v.id for _, v in wm.items()}
            entry = wm.leaf_type()
            entry.id = next((i for i in range(C["RLBH_MAX_WEIGHTS"]) if i not in used), -1)
            if entry.id < 0:
                raise HostError("weight table full")
            used.add(entry.id)
            for i in range(MAX_PATHS):
                entry.weight[i] = WEIGHT_SCALE
        for value, w in weights.items():
            entry.weight[paths[value]] = int(round(w * WEIGHT_SCALE))
        entry.flags = SPRAY if spray else 0
        wm.set(key, entry)
        log.info("weights for %s: %s%s", prefix,
                 {v: entry.weight[i] / WEIGHT_SCALE for v, i in sorted(paths.items())},
                 " (spray)" if spray else "")

    def apply_weights(self, want: dict[str, tuple[dict[int, float], bool]] | Callable[[], dict],
                      prune: bool = True, release: bool = True) -> bool:
        """Make the per-destination weights {prefix: (weights by path value, spray)} what is
        programmed, writing only the entries that differ (and, with prune, removing the other
        prefixes except ::/0); then one release/reinstate for all of them (release False: none,
        for a path going to zero, whose QPs the data plane moves itself). `want` may be a
        function: called under the weights' own lock, so it sees every probe verdict applied
        before it (and one after it writes after). Returns True when something changed."""
        with self.locked():
            before = self._before()
            paths = {p.value: p.index for p in self.paths()}
            with self.locked_part("weights"):      # a probe verdict's zero_paths waits only for this
                have = {w["prefix"]: w for w in self.weights()}
                changed = self._apply_weights_locked(want() if callable(want) else want, prune, have, paths)
        if changed and release:
            self.rebalance(release=True, before=before)
        return changed

    def _apply_weights_locked(self, want: dict, prune: bool, have: dict, paths: dict) -> bool:
        changed = False
        used = {w["id"] for w in have.values()}
        for prefix, (weights, spray) in want.items():
            prefix = str(ipaddress.IPv6Network(prefix))
            cur = have.get(prefix)
            full = {v: weights.get(v, 0.0) for v in paths}
            if cur is not None and cur["spray"] == spray and all(
                    round(cur["all_weights"].get(v, 0) * WEIGHT_SCALE) == round(w * WEIGHT_SCALE)
                    for v, w in full.items()):
                continue
            self._set_weights_locked(prefix, full, spray, cur is not None, used, paths)
            changed = True
        if prune:
            for prefix in set(have) - {str(ipaddress.IPv6Network(p)) for p in want} - {"::/0"}:
                self.maps["weights"].delete(self._wkey(prefix))
                changed = True
        return changed

    def zero_paths(self, prefix: str, values: set[int]) -> bool:
        """A probe verdict's fast path: paths `values` to weight 0 in prefix's own entry at
        once, waiting only for other weight writes, not for a step under locked() (a sweep on a
        busy host holds that for hundreds of ms). It only lowers weights and never the last
        non-zero one; False when it would, or prefix has no entry of its own: the agent's next
        step decides then."""
        wm = self.maps["weights"]
        key = self._wkey(prefix)
        with self.locked_part("weights"):
            if not any(k.prefixlen == key.prefixlen and bytes(k.addr) == bytes(key.addr) for k in wm.keys()):
                return False
            entry = wm.get(key)
            paths = self.paths()
            idx = {p.index for p in paths if p.value in values}
            left = [p.index for p in paths if p.valid and p.index not in idx and entry.weight[p.index]]
            if not idx or not left or not any(entry.weight[i] for i in idx):
                return False
            for i in idx:
                entry.weight[i] = 0
            wm.set(key, entry)
        log.info("weights for %s: paths %s to 0 (a probe verdict)", prefix, sorted(values))
        return True

    def del_weights(self, prefix: str) -> bool:
        if self._net(prefix).prefixlen == 0:
            raise HostError("the default weights (::/0) cannot be removed; set them instead")
        with self.locked():
            ok = self.maps["weights"].delete(self._wkey(prefix))
        self.rebalance(release=True)
        return ok

    def weights(self) -> list[dict]:
        paths = self.paths()
        out = []
        for k, v in self.maps["weights"].items():
            net = ipaddress.IPv6Network((bytes(k.addr), k.prefixlen))
            out.append({"prefix": str(net), "id": v.id, "spray": bool(v.flags & SPRAY),
                        "weights": {p.value: v.weight[p.index] / WEIGHT_SCALE for p in paths if p.valid},
                        "all_weights": {p.value: v.weight[p.index] / WEIGHT_SCALE for p in paths}})
        return sorted(out, key=lambda e: ipaddress.IPv6Network(e["prefix"]))

    def weights_for(self, peer: str) -> tuple[int, list[int]] | None:
        """(weight entry id, effective weight per path index: 0 where the path is unusable)
        for destination peer, as the data plane would find them; None without an entry."""
        k = self.maps["weights"].key_type()
        k.prefixlen = 128
        k.addr[:] = packed_addr(peer)
        w = self.maps["weights"].get(k)
        if w is None:
            return None
        valid = {p.index for p in self.paths() if p.valid}
        return w.id, [w.weight[i] if i in valid else 0 for i in range(MAX_PATHS)]

    def _effective_all(self) -> dict[int, tuple[object, list[int]]]:
        """{weight entry id: (entry, effective weights: 0 on unusable paths)}; the paths are read
        once for all entries."""
        valid = {p.index for p in self.paths() if p.valid}
        return {v.id: (v, [v.weight[i] if i in valid else 0 for i in range(MAX_PATHS)])
                for _, v in self.maps["weights"].items()}

    def _before(self) -> dict[int, list[int]]:
        """What a release compares the new weights with: {entry id: effective weights}, those the
        entry's QPs were last laid out for where this process balanced them since. Weights that
        no balancing followed (a probe verdict's zero_paths, answered again before a sweep) moved
        no QP: compared with them, a plane back from 0 made the others look degraded."""
        return {wid: self._laid_out.get(wid, eff) for wid, (_, eff) in self._effective_all().items()}
