"""Addresses mode: a NIC's paths are its global /64 addresses (one SLAAC address a fabric
path), each at a stable index (a QP's entry names the index)."""
from __future__ import annotations

import ipaddress
import logging
import socket

from rlbfabric import addrplan

from .abi import MAX_PATHS, WEIGHT_SCALE, HostError, Path_

log = logging.getLogger("rlbhost.dataplane")

IFA_F_TEMPORARY, IFA_F_DADFAILED, IFA_F_DEPRECATED, IFA_F_TENTATIVE = 0x01, 0x08, 0x20, 0x40   # if_addr.h
# what makes an address no path: DAD not done or failed, a temporary (privacy) address, deprecated
UNUSABLE = IFA_F_TENTATIVE | IFA_F_DADFAILED | IFA_F_TEMPORARY | IFA_F_DEPRECATED


def unusable_flags(msg) -> int:
    """The flags of an address message (netlink's) that keep it from being a path."""
    return (msg.get_attr("IFA_FLAGS") or msg["flags"]) & UNUSABLE


class Paths:
    """(HostDataplane's) paths from addresses."""

    def global_addresses(self, ifname: str) -> list[ipaddress.IPv6Interface]:
        """Usable global addresses of an interface: DAD finished, not a temporary (privacy)
        address, not deprecated (a prefix being withdrawn): neither can be a path."""
        out = []
        with self.netlink() as ipr:
            addrs = ipr.get_addr(family=socket.AF_INET6, index=self.ifindex(ifname))
        for a in addrs:
            addr = ipaddress.IPv6Address(a.get_attr("IFA_ADDRESS"))
            if addr.is_link_local or addr.is_multicast or unusable_flags(a):
                continue
            out.append(ipaddress.IPv6Interface(f"{addr}/{a['prefixlen']}"))
        return out

    def sync_paths(self, ifname: str, path_field: int | None = None, base_value: int | None = None,
                   allowed: list[ipaddress.IPv6Network] | None = None) -> bool:
        """Paths from the interface's /64s (only those in `allowed`, this host's prefixes in the
        fabric file, when given: another prefix on the port is not a fabric path); returns True
        when the set changed."""
        addrs = [a for a in self.global_addresses(ifname) if a.network.prefixlen == 64
                 and (allowed is None or a.network in allowed)]
        cfg = self.maps["config"].get(0)
        field = path_field if path_field is not None else addrplan.detect_field(a.network for a in addrs)
        if field is None:
            field = cfg.field
        by_value: dict[int, str] = {}
        for a in sorted(addrs, key=lambda a: a.ip):
            by_value.setdefault(addrplan.field_value(a.ip, field), str(a.ip))
        if len(by_value) > MAX_PATHS:
            raise HostError(f"{len(by_value)} paths on {ifname}; at most {MAX_PATHS}")
        return self.set_paths(by_value, field, base_value)

    def set_paths(self, by_value: dict[int, str], field: int, base_value: int | None = None) -> bool:
        """Program paths {path field value: our address}. Indexes stay stable across changes
        (a QP's entry names an index); a vanished path is invalidated and its QPs released."""
        with self.locked():
            before = self._before()
            pm = self.maps["paths"]
            current = {i: p for i, p in enumerate(pm.array_values()) if p is not None}
            index_of = {p.value: i for i, p in current.items()}
            changed = False
            free = [i for i in range(MAX_PATHS) if i not in current]
            for value, addr in sorted(by_value.items()):
                i = index_of.get(value)
                if i is None:
                    if not free:
                        free = self._reclaim_index(current, index_of, set(by_value))
                    if not free:
                        raise HostError(f"path table full: {MAX_PATHS} paths in use")
                    # path k at index k-1 where free: the rotation of ties runs in path order
                    i = value - 1 if value - 1 in free else free[0]
                    free.remove(i)
                    index_of[value] = i
                p = current.get(i) or pm.leaf_type()
                new = (1, value, ipaddress.IPv6Address(addr).packed)
                if (p.valid, p.value, bytes(p.addr)) != new:
                    p.valid, p.value = 1, value
                    p.addr[:] = new[2]
                    pm.set(i, p)
                    changed = True
                    log.info("path %d: %s (index %d)", value, addr, i)
            for value, i in index_of.items():
                if value not in by_value and current.get(i) is not None and current[i].valid:
                    p = current[i]
                    p.valid = 0
                    pm.set(i, p)
                    changed = True
                    log.info("path %d (index %d) is gone", value, i)
            cfg = self.maps["config"].get(0)
            values = sorted(by_value)
            if values:
                # the lowest path, as applications take it: a NIC whose addresses come back one
                # by one (a link flap) returns to it once it is there, not to whichever came first
                base = base_value if base_value is not None else values[0]
                if base not in index_of or base not in by_value:
                    raise HostError(f"base path {base} is not among the paths {values}")
                if cfg.base != index_of[base] or cfg.field != field:
                    cfg.base, cfg.field = index_of[base], field
                    self.maps["config"].set(0, cfg)
                    changed = True
            if self.maps["weights"].get(self._wkey("::/0")) is None:
                self._set_weights_locked("::/0", {}, False)
        if changed:
            self.rebalance(release=True, before=before)
        return changed

    def _reclaim_index(self, current: dict, index_of: dict, wanted: set[int]) -> list[int]:
        """An index whose path is gone (invalid, its value not wanted now) made free for a new
        path: its QPs' entries were released when it went; what still names it (a weight, an
        idle conntrack entry, a placement) is reset, so the new path starts as new. Otherwise
        prefixes that come and go (renumbering, temporary addresses) filled the table for good."""
        stale = sorted(i for i, p in current.items() if not p.valid and p.value not in wanted)
        if not stale:
            return []
        i = stale[0]
        old = current.pop(i)
        index_of.pop(old.value, None)
        self.maps["paths"].zero(i)
        wm = self.maps["weights"]
        for k, v in list(wm.items()):
            if v.weight[i] != WEIGHT_SCALE:
                v.weight[i] = WEIGHT_SCALE
                wm.set(k, v)
        ct = self.maps["conntrack"]
        for k, v in list(ct.items()):
            if v.path == i and ct.delete(k):
                self._adjust(v.wid, v.path, -1)
        pl = self.maps["placed"]
        for k, v in list(pl.items()):
            if v.value == i:
                pl.delete(k)
        log.info("path index %d (path %d, gone) reused", i, old.value)
        return [i]

    def paths(self) -> list[Path_]:
        out = []
        for i, p in enumerate(self.maps["paths"].array_values()):
            if p is not None:
                out.append(Path_(i, p.value, str(ipaddress.IPv6Address(bytes(p.addr))), bool(p.valid),
                                 p.ifindex))
        return out
