"""The host data-plane API: TC programs on one interface, paths from its addresses, weights,
and the connection-tracking table's releases and reinstatements.

State lives in pinned maps under /sys/fs/bpf/rlb/<instance>/host; a restarted agent reloads the
programs against the same maps and replaces the TC filters in place, so QPs keep their paths.
A server with several fabric NICs has one such data plane per NIC, each with its own paths,
weights, QP table and counters, under /sys/fs/bpf/rlb/<instance>/host-<nic>."""
from __future__ import annotations

import contextlib
import functools
import ipaddress
import math
import logging
import socket
import struct
import threading
import time
from collections import Counter
from dataclasses import dataclass
from typing import Callable


from rlbcommon.constants import ROCE_PORT, U32_MAX
from rlbfabric import addrplan
from rlbcommon.paths import pin_dir
from rlbcommon.pinnedstate import PinnedState
from rlbcommon.cheader import constants, enum_names

from .gids import GidTable
from .rebalance import LiveQp, moves

log = logging.getLogger(__name__)

SOURCE, HEADER = "rlb_host.c", "rlb_host.h"
C = constants(HEADER)
REASONS = enum_names(HEADER, "RLBH_R_")
MAX_PATHS = C["RLBH_MAX_PATHS"]
SPRAY = C["RLBH_W_SPRAY"]
PORTS_MODE = C["RLBH_F_PORTS"]
TC_EGRESS, TC_INGRESS = 0xFFFFFFF3, 0xFFFFFFF2
TC_PRIO, TC_HANDLE = 0xC0DE, 0x1
IFA_F_TEMPORARY, IFA_F_DADFAILED, IFA_F_DEPRECATED, IFA_F_TENTATIVE = 0x01, 0x08, 0x20, 0x40   # if_addr.h
DEFAULT_EXPIRY_MS = 200


def sweep_period(expiry_ms: float) -> float:
    """Seconds between sweeps (an idle QP leaves its path within an expiry and a sweep): half
    the expiry, at least 50 ms and at most 1 s, so that an expiry lowered at run time is seen
    within a second (half of a 60 s expiry kept a minute's idle QPs counted for 30 s more)."""
    return min(1.0, max(0.05, expiry_ms / 2000))
SWEPT_MAX = 65536     # idle QPs kept for the coordinator client between two of its reports
DEFAULT_ROCE_PORT = ROCE_PORT
WEIGHT_SCALE = 1000   # weights are stored as integers: 0.5 -> 500


@functools.lru_cache(maxsize=65536)
def _packed(addr: str) -> bytes:
    """An address's 16 bytes (the same peers come again and again: a verbs QP writes three)."""
    return ipaddress.IPv6Address(addr).packed


@functools.lru_cache(maxsize=65536)
def _text(packed: bytes) -> str:
    return str(ipaddress.IPv6Address(packed))


class HostError(RuntimeError):
    """An operation the host data plane cannot do; the message is for the operator."""


@dataclass
class Path_:
    index: int
    value: int
    address: str
    valid: bool
    ifindex: int = 0              # ports mode


@dataclass(frozen=True)
class PortPath:
    """Ports mode: one path is one egress port (a plane's sub-port) and the switch's MAC on it."""
    value: int                    # (plane - 1) x sub-ports + sub-port: stored at index value - 1
    ifname: str
    dmac: str | None              # None until the switch's MAC is known: the path is unusable
    up: bool                      # carrier


@dataclass(frozen=True)
class VerbsQp:
    """A QP (or UD address handle) whose addresses the verbs library chose: the packets carry
    peer_addr, the peer's address on the path at index `path`."""
    peer_base: str
    peer_addr: str
    local_qpn: int
    remote_qpn: int
    path: int
    wid: int
    pid: int
    flags: int = 0
    created_ns: int = 0

    @property
    def decided_here(self) -> bool:
        return bool(self.flags & C["RLBH_VF_DECIDED"])

    @property
    def is_ah(self) -> bool:
        return bool(self.flags & C["RLBH_VF_AH"])


ECHO = "rlb_host_echo"        # ports mode: on each port's ingress, answers the plane probes


def _is_ours(tc_filter, echo: bool = True) -> bool:
    """One of this program's filters (echo=False: not the ports' probe echo)."""
    opts = tc_filter.get_attr("TCA_OPTIONS")
    name = (opts.get_attr("TCA_BPF_NAME") or "") if opts is not None else ""
    return tc_filter["handle"] == TC_HANDLE and name.startswith("rlb_host_") and (echo or name != ECHO)


NIC_PREFIX = "host-"


def _nic_component(nic: str) -> str:
    """A NIC's pin directory: bpffs refuses dots in names, which interface names (VLANs: eth0.100)
    may have, and ':' no interface name has."""
    return NIC_PREFIX + nic.replace(".", ":")


class HostDataplane(PinnedState):
    component, source, marker = "host", SOURCE, "paths"
    error = HostError
    hint = "run 'rlbhost attach IFACE' first"

    def __init__(self, instance: str | None = None, nic: str | None = None):
        # one NIC (every host before servers of several): the pins at host/, as they always were
        self.nic = nic
        if nic is not None:
            self.component = _nic_component(nic)
        super().__init__(instance)
        self.fns = {}
        # QPs the sweep removed as idle, for whoever keeps their memory (the coordinator client,
        # which drains it at each report): a short burst can go idle and be swept between two of
        # its reads. None while nobody reads it; never more than SWEPT_MAX (a reader that stalls
        # loses the memory of the oldest idle QPs, not the host's memory)
        self.swept: dict[tuple[str, int, int], dict] | None = None
        # the verbs service's choose-and-count and the sweep's recount of the active counters
        # exclude each other, so a QP placed through verbs is never counted out of a burst
        self.verbs_lock = threading.RLock()
        # the verbs map's QPs as this process last wrote or read them: the agent, their only
        # writer, counts and reports them without walking the map (2 entries a QP) each time
        self._verbs: dict[tuple[str, int], VerbsQp] | None = None

    @classmethod
    def pinned(cls, instance: str | None = None) -> list[str | None]:
        """The NICs with pinned state in this instance: None for the one-NIC state (host/), then
        each NIC's name (host-<nic>/)."""
        root = pin_dir(cls.component, instance).parent
        try:
            names = sorted(p.name for p in root.iterdir())
        except OSError:
            return []
        out: list[str | None] = [None] if cls.component in names and (root / cls.component / cls.marker).exists() else []
        return out + [n[len(NIC_PREFIX):].replace(":", ".") for n in names
                      if n.startswith(NIC_PREFIX) and (root / n / cls.marker).exists()]

    @property
    def label(self) -> str:
        """The NIC's name where the host has several, else ''."""
        return self.nic or ""

    def load(self):
        if self.bpf is None:
            self.compile()
            for name in ("rlb_host_egress", "rlb_host_ingress", ECHO):
                self.fns[name] = self.bpf.load_func(name.encode(), self.bpf.SCHED_CLS)
            self._init_config()
        return self.fns

    def prog_fd(self, direction: str) -> int:
        return self.load()[f"rlb_host_{direction}"].fd

    def close(self):
        super().close()
        self.fns = {}

    def _init_config(self):
        cfg = self.maps["config"].get(0)
        if cfg.expiry_ns == 0:
            cfg.expiry_ns = DEFAULT_EXPIRY_MS * 1_000_000
            cfg.field = addrplan.PATH_FIELD
            cfg.roce_ports[0] = DEFAULT_ROCE_PORT
            self.maps["config"].set(0, cfg)

    def config(self) -> dict:
        cfg = self.maps["config"].get(0)
        return {"expiry_ms": cfg.expiry_ns / 1e6, "path_field": cfg.field, "base_index": cfg.base,
                "roce_ports": [p for p in cfg.roce_ports if p], "rotation": cfg.rotation,
                "mode": "ports" if cfg.flags & PORTS_MODE else "addresses"}

    def set_config(self, expiry_ms: float | None = None, roce_ports: list[int] | None = None,
                   rotation: int | None = None):
        with self.locked():
            cfg = self.maps["config"].get(0)
            if expiry_ms is not None:
                if not 0 < expiry_ms <= 3_600_000:     # the map holds nanoseconds in 64 bits
                    raise HostError("expiry must be positive, at most an hour (ms)")
                cfg.expiry_ns = int(expiry_ms * 1_000_000)
            if roce_ports is not None:
                if not 1 <= len(roce_ports) <= C["RLBH_ROCE_PORTS"]:
                    raise HostError(f"give 1 to {C['RLBH_ROCE_PORTS']} RoCE ports")
                bad = [p for p in roce_ports if isinstance(p, bool) or not isinstance(p, int) or not 1 <= p <= 65535]
                if bad:      # the map field is 16 bits: 70000 would be stored as 4464
                    raise HostError(f"RoCE ports are UDP ports, 1 to 65535: not {bad}")
                for i in range(C["RLBH_ROCE_PORTS"]):
                    cfg.roce_ports[i] = roce_ports[i] if i < len(roce_ports) else 0
            if rotation is not None:
                if not 0 <= rotation < MAX_PATHS:
                    raise HostError(f"rotation is a path index, 0 to {MAX_PATHS - 1}")
                cfg.rotation = rotation
            self.maps["config"].set(0, cfg)

    # ---- interface ------------------------------------------------------------------
    def attach(self, ifname: str, path_field: int | None = None, base_value: int | None = None):
        """TC programs on clsact egress and ingress (replaced in place if already there)."""
        idx = self.ifindex(ifname)
        fns = self.load()
        with self.netlink() as ipr:
            with contextlib.suppress(Exception):   # EEXIST: clsact is shared with others
                ipr.tc("add", "clsact", idx)
            for name, parent in (("rlb_host_egress", TC_EGRESS), ("rlb_host_ingress", TC_INGRESS)):
                fn = fns[name]
                ipr.tc("replace-filter", "bpf", idx, handle=TC_HANDLE, prio=TC_PRIO, fd=fn.fd,
                       name=fn.name, parent=parent, classid=1, direct_action=True)
        self.sync_paths(ifname, path_field, base_value)
        log.info("attached to %s (TC egress and ingress)", ifname)

    def prepare(self, ifname: str, path_field: int | None = None, base_value: int | None = None):
        """The maps and the paths of ifname without TC programs on it (hosts whose RDMA NICs
        build the packets: QPs are placed through the verbs library only)."""
        self.ifindex(ifname)
        self.load()
        self.sync_paths(ifname, path_field, base_value)
        log.info("following %s without TC programs (verbs only)", ifname)

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
        fn = fns["rlb_host_egress"]
        with self.netlink() as ipr:
            with contextlib.suppress(Exception):
                ipr.tc("add", "clsact", idx)
            ipr.tc("replace-filter", "bpf", idx, handle=TC_HANDLE, prio=TC_PRIO, fd=fn.fd,
                   name=fn.name, parent=TC_EGRESS, classid=1, direct_action=True)
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
                with contextlib.suppress(Exception):
                    ipr.tc("add", "clsact", idx)
                ipr.tc("replace-filter", "bpf", idx, handle=TC_HANDLE, prio=TC_PRIO, fd=fn.fd,
                       name=fn.name, parent=TC_INGRESS, classid=1, direct_action=True)

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

    def attached_interfaces(self, echo: bool = False) -> list[str]:
        """Interfaces that carry this program (either TC hook; echo: also the ports that carry
        only the probe echo), found in the kernel, not in a record that could be stale. A NIC's
        data plane is on that NIC only (the others carry the same program with their own maps)."""
        if self.nic is not None:
            return [self.nic] if self._has_ours(self.nic, echo) else []
        out = []
        with self.netlink() as ipr:
            for link in ipr.get_links():
                for parent in (TC_EGRESS, TC_INGRESS):
                    try:
                        filters = ipr.get_filters(link["index"], parent=parent)
                    except Exception:      # no clsact on this link
                        continue
                    if any(_is_ours(f, echo) for f in filters):
                        out.append(link.get_attr("IFLA_IFNAME"))
                        break
        return out

    def _has_ours(self, ifname: str, echo: bool) -> bool:
        try:
            idx = self.ifindex(ifname)
        except HostError:
            return False
        with self.netlink() as ipr:
            for parent in (TC_EGRESS, TC_INGRESS):
                try:
                    if any(_is_ours(f, echo) for f in ipr.get_filters(idx, parent=parent)):
                        return True
                except Exception:          # no clsact on this link
                    continue
        return False

    def detach(self, ifname: str):
        """Remove the programs from ifname (the ports-mode device: also the echo from its
        ports); the pinned state stays, so attaching again adopts it (QPs keep their paths)."""
        idx = self.ifindex(ifname)
        hooks = [(idx, TC_EGRESS), (idx, TC_INGRESS)]
        ports = self._port_ifindexes()
        if ports and idx not in ports:
            hooks += [(p, TC_INGRESS) for p in sorted(ports)]
        with self.netlink() as ipr:
            for i, parent in hooks:
                with contextlib.suppress(Exception):   # a hook without our filter
                    ipr.tc("del-filter", "bpf", i, handle=TC_HANDLE, prio=TC_PRIO, parent=parent)
        log.info("detached from %s%s; pinned state kept", ifname,
                 f" and the probe echo from {len(hooks) - 2} ports" if len(hooks) > 2 else "")

    def _port_ifindexes(self) -> set[int]:
        """Ports mode: the ports' ifindexes, as the paths map has them (none otherwise)."""
        if not self.exists() or not self.maps["config"].get(0).flags & PORTS_MODE:
            return set()
        return {p.ifindex for p in self.paths() if p.ifindex}

    def destroy(self) -> list[str]:
        """Remove the programs from every interface that has them, and every pinned map."""
        gone = self.attached_interfaces(echo=True)
        for ifname in gone:
            self.detach(ifname)
        self.remove_pins()
        log.info("detached%s; pinned state removed", f" from {', '.join(gone)}" if gone else "")
        return gone

    def global_addresses(self, ifname: str) -> list[ipaddress.IPv6Interface]:
        """Usable global addresses of an interface: DAD finished, not a temporary (privacy)
        address, not deprecated (a prefix being withdrawn): neither can be a path."""
        out = []
        with self.netlink() as ipr:
            addrs = ipr.get_addr(family=socket.AF_INET6, index=self.ifindex(ifname))
        for a in addrs:
            flags = a.get_attr("IFA_FLAGS") or a["flags"]
            addr = ipaddress.IPv6Address(a.get_attr("IFA_ADDRESS"))
            if addr.is_link_local or addr.is_multicast or flags & (
                    IFA_F_TENTATIVE | IFA_F_DADFAILED | IFA_F_TEMPORARY | IFA_F_DEPRECATED):
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

    # ---- weights --------------------------------------------------------------------
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

    # ---- connection tracking --------------------------------------------------------
    def _effective_all(self) -> dict[int, tuple[object, list[int]]]:
        """{weight entry id: (entry, effective weights: 0 on unusable paths)}; the paths are read
        once for all entries."""
        valid = {p.index for p in self.paths() if p.valid}
        return {v.id: (v, [v.weight[i] if i in valid else 0 for i in range(MAX_PATHS)])
                for _, v in self.maps["weights"].items()}

    def _before(self) -> dict[int, list[int]]:
        """What a release compares the new weights with: {entry id: effective weights}."""
        return {wid: eff for wid, (_, eff) in self._effective_all().items()}

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
            for k, v in flows_now:
                if now - v.last_ns >= expiry or v.wid not in entries:
                    if ct.delete(k):      # idle: re-assigned on its next packet anyway
                        self._adjust(v.wid, v.path, -1)
                    if self.swept is not None and len(self.swept) < SWEPT_MAX:
                        self.swept[self._qp_id(k)] = {"path": v.path, "bytes": v.bytes, "last_ns": v.last_ns}
                    continue
                live[v.wid].append((k, v))
            for wid, (entry, eff) in entries.items():
                flows = live[wid]
                if not balance or entry.flags & SPRAY or not flows or not any(eff):
                    continue
                qps = [LiveQp(k, v.path, v.created_ns, placed.get(self._qp_id(k)) == v.path) for k, v in flows]
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
            self._recount(entries, live, window)
            if moved:
                self._count_event("ev_released", moved)
        if moved:
            log.info("released %d QPs to match the weights", moved)
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
            for q in self.verbs_qps():     # placed through verbs: active until destroyed
                counts[(q.wid, q.path)] += 1
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

    # ---- QPs placed by the verbs library (rlbhost/verbs/) -------------------------------
    def weights_for(self, peer: str) -> tuple[int, list[int]] | None:
        """(weight entry id, effective weight per path index: 0 where the path is unusable)
        for destination peer, as the data plane would find them; None without an entry."""
        k = self.maps["weights"].key_type()
        k.prefixlen = 128
        k.addr[:] = _packed(peer)
        w = self.maps["weights"].get(k)
        if w is None:
            return None
        valid = {p.index for p in self.paths() if p.valid}
        return w.id, [w.weight[i] if i in valid else 0 for i in range(MAX_PATHS)]

    def active_counts(self, wid: int) -> list[int]:
        """Active QPs per path index under one weight entry (TC-seen and verbs QPs), as the data
        plane reads them (its count plus user space's, never below 0): two syscalls."""
        dp = struct.unpack(f"{MAX_PATHS}i", self.maps["active"].array_slice(wid * MAX_PATHS, MAX_PATHS))
        adj = struct.unpack(f"{MAX_PATHS}i", self.maps["active_adj"].array_slice(wid * MAX_PATHS, MAX_PATHS))
        return [max(0, a + b) for a, b in zip(dp, adj)]

    def _verbs_key(self, peer: str, qpn: int, direction: int):
        k = self.maps["verbs"].key_type()
        k.peer[:] = _packed(peer)
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
        v.peer_base[:] = _packed(q.peer_base)
        v.path, v.wid, v.local_qpn, v.remote_qpn, v.pid, v.flags = (
            q.path, q.wid, q.local_qpn, q.remote_qpn, q.pid, q.flags)
        mirror = self._verbs_mirror()
        old = mirror.get((q.peer_addr, q.remote_qpn))
        m.set(self._verbs_key(q.peer_addr, q.remote_qpn, C["RLBH_V_TX"]), v)
        if not q.is_ah:
            m.set(self._verbs_key(q.peer_addr, q.local_qpn, C["RLBH_V_RX"]), v)
        mirror[(q.peer_addr, q.remote_qpn)] = q
        if old is not None:
            self._adjust(old.wid, old.path, -1)
        self._adjust(q.wid, q.path, +1)

    def verbs_drop(self, q: VerbsQp) -> bool:
        m = self.maps["verbs"]
        with self.verbs_lock:
            gone = m.delete(self._verbs_key(q.peer_addr, q.remote_qpn, C["RLBH_V_TX"]))
            if not q.is_ah:
                m.delete(self._verbs_key(q.peer_addr, q.local_qpn, C["RLBH_V_RX"]))
            self._verbs_mirror().pop((q.peer_addr, q.remote_qpn), None)
            if gone:
                self._adjust(q.wid, q.path, -1)
        return bool(gone)

    def verbs_clear(self):
        """Forget every verbs QP (the map and this process's mirror of it)."""
        with self.verbs_lock:
            self.maps["verbs"].clear()
            self._verbs = {}

    def _verbs_mirror(self) -> dict[tuple[str, int], VerbsQp]:
        with self.verbs_lock:
            if self._verbs is None:
                self._verbs = {(q.peer_addr, q.remote_qpn): q for q in self._verbs_from_map()}
            return self._verbs

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

    # ---- coordinator placements -------------------------------------------------------
    @staticmethod
    def _qp_id(k) -> tuple[str, int, int]:
        return (_text(bytes(k.peer)), k.sport, k.qp)

    def _ct_key(self, peer: str, sport: int, qp: int):
        k = self.maps["conntrack"].key_type()
        k.peer[:] = _packed(peer)
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

    # ---- reporting ------------------------------------------------------------------
    def stats(self) -> dict:
        rows = {}
        for p in self.paths():
            per_cpu = self.maps["path_stats"].get_percpu(p.index)
            rows[p.index] = {f: sum(getattr(r, f) for r in per_cpu)
                             for f in ("tx_packets", "tx_bytes", "rx_packets", "rx_bytes")}
        reasons = {name: sum(r.value for r in self.maps["reasons"].get_percpu(rid))
                   for rid, name in REASONS.items() if name != "max"}
        return {"paths": rows, "reasons": reasons}

    def ports_down(self) -> int:
        """Ports mode: the carrier watcher's mask, bit i = path i's port has no carrier."""
        return int(self.maps["port_down"].get(0).value)

    def status(self) -> dict:
        qps = self.qps()
        stats = self.stats()
        down = self.ports_down()
        default = next((w for w in self.weights() if w["prefix"] == "::/0"), {"weights": {}})
        verbs = self.verbs_qps()
        paths = []
        for p in self.paths():
            on = sum(1 for q in verbs if q.path == p.index)
            paths.append({"index": p.index, "path": p.value, "address": p.address, "valid": p.valid,
                          "carrier": not down >> p.index & 1,
                          "weight": default["weights"].get(p.value, 0.0),
                          "active_qps": sum(1 for q in qps if q["active"] and q["path"] == p.index) + on,
                          "verbs_qps": on, **stats["paths"][p.index]})
        weights = self.weights()
        # bounded tables, counted from what was read above (no walk of its own); the LRU ones
        # evict their oldest QP when full, the others refuse the next
        tables = {"conntrack": (len(qps), C["RLBH_CT_ENTRIES"]), "weights": (len(weights), C["RLBH_MAX_WEIGHTS"]),
                  "placements": (len(self.placements()), C["RLBH_PLACEMENTS"]),
                  "verbs": (2 * len(verbs), C["RLBH_VERBS_ENTRIES"]),      # a send and a receive entry each
                  "echo_keys": (sum(1 for _ in self.maps["echo_keys"].keys()), C["RLBH_ECHO_KEYS"])}
        return {"config": self.config(), "paths": paths, "weights": weights,
                "reasons": stats["reasons"], "tables": tables}

    def verbs_rows(self) -> list[dict]:
        """Every QP (and UD address handle) placed through verbs, for `rlbhost qps`."""
        now = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
        return [{"peer": q.peer_base, "peer_address": q.peer_addr, "qp": q.local_qpn, "peer_qp": q.remote_qpn,
                 "path": q.path, "pid": q.pid, "kind": "ah" if q.is_ah else "qp",
                 "decided": "here" if q.decided_here else "peer", "age_s": (now - q.created_ns) / 1e9}
                for q in self.verbs_qps()]

    def paths_with_gids(self) -> list[dict]:
        """Path index, address and, where an RDMA device has it, its RoCE v2 GID index (what the
        verbs library gives a QP on that path)."""
        gids = GidTable().by_address()
        return [{"index": p.index, "path": p.value, "address": p.address, "valid": p.valid,
                 "gids": gids.get(p.address, [])} for p in self.paths()]
