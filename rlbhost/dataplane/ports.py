"""Ports mode (scale-up GPUs and rail-only servers): a path is an egress port (a plane's
sub-port) and the switch's MAC on it, flipped at once on carrier changes; on each port's ingress
the probe echo answers the planes' probes, signed."""
from __future__ import annotations

import ipaddress
import logging
import struct

from .abi import C, ECHO, MAX_PATHS, PORTS_MODE, HostError, PortPath
from .hooks import TC_EGRESS, TC_INGRESS, replace_filter

log = logging.getLogger("rlbhost.dataplane")


class PortsMode:
    """(HostDataplane's) ports as paths."""

    def attach_ports(self, device: str, loopback: str, ports: list[PortPath], group_size: int = 1,
                     echo: bool = False):
        """Ports mode: TC egress on `device` (where the kernel routes the peers' loopbacks), each
        path one of `ports`; with echo (scale-up GPUs, which probe their planes) the probe echo
        on every port's ingress, replaced in place: a newer program takes over. A host is in
        one mode: switching needs a detach first."""
        idx = self.ifindex(device)
        fns = self.load()
        with self.locked():
            cfg = self.maps["config"].get(0)
            if not cfg.flags & PORTS_MODE and any(p.valid for p in self.paths()):
                raise HostError("this host's paths are addresses: 'rlbhost detach --all' first")
            cfg.flags |= PORTS_MODE
            cfg.base = 0
            cfg.group_size = group_size
            self.maps["config"].set(0, cfg)
        with self.netlink() as ipr:
            replace_filter(ipr, idx, fns["rlb_host_egress"], TC_EGRESS)
        self.set_port_paths(loopback, ports, echo)
        if echo:
            self._attach_echo({self.ifindex(p.ifname) for p in ports})
        log.info("attached to %s (TC egress, ports mode, loopback %s%s)", device, loopback,
                 f"; probe echo on {len(ports)} ports" if echo else "")

    def set_echo(self, loopback: str, key: bytes | None, pairs: list[tuple[ipaddress.IPv6Network, bytes]] = ()):
        """The probe echo answers only probes to this GPU's loopback and signs an answer with the
        key shared with the prober (`pairs`: (prober's prefix, key), the first key of a prefix
        listed twice), else with `key` (16 bytes; None: unsigned). The pair table is made what
        `pairs` says, writing only the entries that differ."""
        want: dict[ipaddress.IPv6Network, bytes] = {}
        for net, k in [*pairs, *([(None, key)] if key is not None else [])]:
            if len(k) != 16:
                raise HostError("a probe key is 16 bytes")
            if net is not None:
                want.setdefault(ipaddress.IPv6Network(net), k)
        if len(want) > C["RLBH_ECHO_KEYS"]:
            raise HostError(f"{len(want)} probers with keys of their own: the echo holds {C['RLBH_ECHO_KEYS']}")
        km = self.maps["echo_keys"]
        have = {ipaddress.IPv6Network((bytes(k.addr), k.prefixlen)): struct.pack("<QQ", v.k0, v.k1)
                for k, v in km.items()}
        for net in set(have) - set(want):
            km.delete(self._lpm_key(km, net))
        for net, k in want.items():
            if have.get(net) != k:
                v = km.leaf_type()
                v.k0, v.k1 = struct.unpack("<QQ", k)
                km.set(self._lpm_key(km, net), v)
        m = self.maps["echo_cfg"]
        v = m.leaf_type()
        v.addr[:] = ipaddress.IPv6Address(loopback).packed
        v.flags = C["RLBH_ECHO_OWN_ADDR"]
        if key is not None:
            v.k0, v.k1 = struct.unpack("<QQ", key)
            v.flags |= C["RLBH_ECHO_SIGN"]
        m.set(0, v)

    @staticmethod
    def _lpm_key(m, net: ipaddress.IPv6Network):
        k = m.key_type()
        k.prefixlen = net.prefixlen
        k.addr[:] = net.network_address.packed
        return k

    def _attach_echo(self, ifindexes):
        fn = self.load()[ECHO]
        with self.netlink() as ipr:
            for idx in ifindexes:
                replace_filter(ipr, idx, fn, TC_INGRESS)

    def set_port_paths(self, loopback: str, ports: list[PortPath], echo: bool = False) -> bool:
        """Program the ports as paths (path value v at index v - 1, so a QP's entry keeps naming
        the same port); a port not given, down, or without a known switch MAC is unusable and
        its QPs are released; with echo, a port made anew gets the probe echo again (attach_ports
        puts it on the others). Returns True when something changed."""
        if not 0 < len(ports) <= MAX_PATHS or any(not 1 <= p.value <= MAX_PATHS for p in ports):
            raise HostError(f"ports mode takes 1 to {MAX_PATHS} ports valued 1 to {MAX_PATHS}")
        lo = ipaddress.IPv6Address(loopback).packed
        changed, remade = False, set()
        with self.locked(), self.locked_part("ports"):
            before = self._before()
            pm = self.maps["paths"]
            current = pm.array_values()
            given = {p.value - 1: p for p in ports}
            for i in range(MAX_PATHS):
                old = current[i]
                port = given.get(i)
                if port is None:
                    if old is not None and old.valid:
                        old.valid = 0
                        pm.set(i, old)
                        changed = True
                    continue
                try:
                    ifindex = self.ifindex(port.ifname)
                except HostError:
                    # a port that does not exist (removed, not created yet) is unusable; the
                    # others are programmed all the same (one missing port froze them all)
                    if old is not None and old.valid:
                        old.valid = 0
                        pm.set(i, old)
                        changed = True
                        log.warning("path %d: port %s does not exist (unusable)", port.value, port.ifname)
                    continue
                if echo and old is not None and old.ifindex != ifindex:
                    remade.add(ifindex)
                smac = self._mac(ifindex)
                dmac = bytes.fromhex(port.dmac.replace(":", "")) if port.dmac else bytes(6)
                valid = int(port.up and bool(port.dmac))
                new = (valid, port.value, lo, ifindex, dmac, smac)
                if old is None or (old.valid, old.value, bytes(old.addr), old.ifindex, bytes(old.dmac),
                                   bytes(old.smac)) != new:
                    e = pm.leaf_type()
                    e.valid, e.value, e.ifindex = valid, port.value, ifindex
                    e.addr[:], e.dmac[:], e.smac[:] = lo, dmac, smac
                    pm.set(i, e)
                    changed = True
                    log.info("path %d: %s -> %s%s", port.value, port.ifname, port.dmac or "(switch MAC unknown)",
                             "" if valid else " (unusable)")
            if self.maps["weights"].get(self._wkey("::/0")) is None:
                self._set_weights_locked("::/0", {}, False)
        if remade:
            self._attach_echo(remade)
        if changed:
            self.rebalance(release=True, before=before)
        return changed

    def set_port_up(self, ifname: str, up: bool) -> list[int]:
        """Carrier changed: flip the paths of that port at once, nothing else (the agent's own
        fast path, behind the carrier watcher's mask: it takes only the ports lock, never waits
        behind a rebalance). Returns their values."""
        try:
            ifindex = self.ifindex(ifname)
        except HostError:
            return []
        out = []
        with self.locked_part("ports"):
            pm = self.maps["paths"]
            for i, e in enumerate(pm.array_values()):
                if e is None or e.ifindex != ifindex:
                    continue
                valid = int(up and any(e.dmac))
                if e.valid != valid:
                    e.valid = valid
                    pm.set(i, e)
                out.append(e.value)
        return out

    def _mac(self, ifindex: int) -> bytes:
        with self.netlink() as ipr:
            link = ipr.get_links(ifindex)[0]
        return bytes.fromhex(link.get_attr("IFLA_ADDRESS").replace(":", ""))

    def ports_down(self) -> int:
        """Ports mode: the carrier watcher's mask, bit i = path i's port has no carrier."""
        return int(self.maps["port_down"].get(0).value)
