"""The switch data-plane API: attach the XDP program, program routes, report state.

All state lives in pinned maps under /sys/fs/bpf/rlb/<instance>/switch, so any process (the
CLI, the agent, a restarted agent) can pick it up, and forwarding never depends on a process
being alive. Changes are make-before-break: a new group is written under a fresh id, the route
is switched to it in one map update, and only then is the old group freed."""
from __future__ import annotations

import contextlib
import ipaddress
import logging
import os
import random
import socket
import subprocess
from dataclasses import dataclass


from rlbcommon.constants import ROCE_PORT
from rlbcommon.filelock import Tenure
from rlbcommon.maps import checked_set
from rlbcommon.nlmsg import link_up
from rlbcommon.pinnedstate import PinnedState
from rlbfabric.routes import NextHop, Route

from . import abi, dlbscan
from .abi import (C, MODE_IDS, MODE_NAMES, NH_RESOLVED, NH_STATIC, NH_VALID, OWNER_NAMES, POLICE, REASONS,
                  SOURCE, mac_bytes, mac_str)
from .tables import SwitchTables, describe

log = logging.getLogger(__name__)

XDP_FLAGS_SKB_MODE, XDP_FLAGS_DRV_MODE = 1 << 1, 1 << 2
# Neighbour states whose MAC can be used: REACHABLE STALE DELAY PROBE NOARP PERMANENT
NUD_USABLE = 0x02 | 0x04 | 0x08 | 0x10 | 0x40 | 0x80

DEFAULTS = {"flowlet_timeout_ns": 256_000, "load_halflife_ns": 100_000, "roce_port": ROCE_PORT}
# The slow path's rates, packets/s and burst per CPU, in the spirit of SONiC's and Junos's
# control-plane policing defaults: the fabric's own control traffic (BGP, BFD at 3 x 20/s per
# session, ND) far above what it needs, a host's punts well below what the kernel can take.
# Traffic to a neighbour not resolved yet, and what the kernel forwards when no member is
# usable (a failover's first milliseconds), is legitimate at a flow's start: those buckets take
# a flow's first burst (a test lost 293 of 400 packets to a new host at burst 100).
# Per port since each port has buckets of its own. A new neighbour (an address not being resolved)
# costs the kernel an entry for seconds (pending 3 s, then failed until collected): 50/s a port
# and CPU (burst 20) keeps a flood to a few hundred entries, where a host port has a handful.
POLICE_DEFAULTS = {"fabric_control": (20000, 2000), "edge_control": (2000, 200), "hop_limit": (500, 50),
                   "neigh_miss": (20000, 5000), "other": (10000, 1000), "neigh_new": (50, 20)}
DEFAULT_SPEED_MBPS = 10_000
OWNER_WAIT_S = 10.0       # a write waits this long for another writer's command to finish


class DataplaneError(RuntimeError):
    """An operation the data plane cannot do; the message is for the operator."""


def band_bytes(speed_mbps: int, halflife_ns: int) -> int:
    """Bytes of decayed load per quality band: a port at full rate settles near
    rate * halflife / ln 2 bytes, which is split into the bands."""
    full = speed_mbps * 1e6 / 8 * halflife_ns * 1e-9 / 0.6931
    return max(1, int(full / C["RLB_LOAD_BANDS"]))


@dataclass
class PortInfo:
    ifname: str
    ifindex: int
    up: bool
    tx_slot: int
    mac: str
    speed_mbps: int = 0
    mtu: int = 0


class SwitchDataplane(PinnedState):
    component, source, marker = "switch", SOURCE, "routes"
    error = DataplaneError
    hint = "run 'rlbswitch attach IFACE' first"

    def __init__(self, instance: str | None = None):
        super().__init__(instance)
        self.prog_fd = None
        self._names: dict[int, str] = {}   # ifindex -> name, for listings and scrapes
        # a port forwards while its carrier is up and its neighbour answers heartbeats
        # (heartbeat.py): the two are kept apart so that neither undoes the other
        self._carrier: dict[int, bool] = {}
        self._silent: set[int] = set()
        self._tables = None
        self._owner: Tenure | None = None         # made on first use: its file is in RUN_DIR

    @property
    def tables(self):
        """The routing model: the only writer of routes, groups and next hops (in the process
        that owns them: see claim)."""
        # the model's collaborators: the maps, and this object as the ports, the neighbour
        # resolver and the one-writer lock (tables.py's protocols)
        return self._once("_tables", lambda: SwitchTables(self.maps, ports=self, neighbours=self, writer=self))

    # ---- one writer -------------------------------------------------------------------
    # The routing maps (routes, groups, next hops, the /64 table) and the settings have one
    # writer at a time: the process holding the switch's owner lock. The agent holds it for its
    # life; a CLI command holds it for the command when no agent runs and otherwise asks the
    # agent (control.py). A model never goes stale under its owner: nothing to reload.
    def claim(self, timeout: float = OWNER_WAIT_S) -> bool:
        """Become the writer of this switch's tables, for this object's life (close lets go);
        True when this call made it so. Waits at most timeout seconds for the holder."""
        owner = self._tenure()
        if owner.held:
            return False
        if not owner.take(timeout):
            raise DataplaneError(f"the tables of switch {self.instance} are written by another process "
                                 f"(pid {owner.holder()}, its agent or a command): "
                                 "`rlbswitch` commands go through a running agent")
        return True

    def _tenure(self) -> Tenure:
        return self._once("_owner", lambda: Tenure(f"{self.instance}-switch.owner"))

    def owns(self) -> bool:
        return self._owner is not None and self._owner.held

    def owner_pid(self) -> int | None:
        """Who writes the tables now: this process or another; None when nobody does."""
        return self._tenure().holder()

    def disown(self):
        """Stop being the writer (another process may then claim the tables)."""
        if self._owner is not None:
            self._owner.release()
        self._tables = None

    def load(self):
        """Compile and load the program; its maps are created or adopted from the pins."""
        if self.prog_fd is not None:
            return self.prog_fd
        widths = dlbscan.to_try()
        for scan in widths:
            self.compile([f"-DRLB_DLB_SCAN={scan}"])
            try:
                self.prog_fd = self.bpf.load_func(b"rlb_switch", self.bpf.XDP).fd
                break
            except Exception as e:       # bcc raises a bare Exception with the kernel's words
                if dlbscan.REFUSED not in str(e) or scan == widths[-1]:
                    raise
                log.warning("this kernel's verifier refused the switch program scanning %d DLB members "
                            "(%s): building it for fewer", scan, e)
                self.bpf.cleanup()
        if scan != dlbscan.MAX_MEMBERS:
            log.warning("DLB, spray and pinned backups scan at most %d members on this kernel (%s); "
                        "wider groups are refused", scan, os.uname().release)
        dlbscan.record(scan)
        self._fn = self.bpf.funcs[b"rlb_switch"]
        self._init_config()
        self._init_police()
        return self.prog_fd

    # ---- the slow path's policer ------------------------------------------------------
    def _init_police(self):
        if not any(v.interval_ns for v in self.maps["police_cfg"].array_values() if v is not None):
            for name, (rate, burst) in POLICE_DEFAULTS.items():
                self.set_police(name, rate, burst)
            log.info("slow path policed per CPU: %s", ", ".join(
                f"{n} {r}/s (burst {b})" for n, (r, b) in POLICE_DEFAULTS.items()))

    def set_police(self, bucket: str, rate: int, burst: int):
        """A bucket's packets per second and burst, per CPU; rate 0 turns its policing off."""
        ids = {v: k for k, v in POLICE.items()}
        if bucket not in ids:
            raise DataplaneError(f"no policer bucket {bucket!r} (have {', '.join(ids)})")
        if not 0 <= rate <= 100_000_000 or not 1 <= burst <= 1_000_000:
            raise DataplaneError(f"{bucket}: rate 0-100000000 packets/s and burst 1-1000000 packets")
        m = self.maps["police_cfg"]
        v = m.leaf_type()
        v.interval_ns = 10**9 // rate if rate else 0
        v.tolerance_ns = v.interval_ns * burst
        m.set(ids[bucket], v)

    def police(self, by_port: dict | None = None) -> dict[str, dict]:
        """Per bucket: rate and burst per CPU and port, packets dropped (summed over CPUs and
        ports; `by_port`: a police_by_port() already read)."""
        by_port = self.police_by_port() if by_port is None else by_port
        out = {}
        for bid, name in POLICE.items():
            c = self.maps["police_cfg"].get(bid)
            if c is None:                      # a bucket the pinned map predates
                continue
            rate = 10**9 // c.interval_ns if c.interval_ns else 0
            out[name] = {"rate": rate, "burst": c.tolerance_ns // c.interval_ns if c.interval_ns else 0,
                         "dropped": sum(d.get(name, 0) for d in by_port.values())}
        return out

    def police_by_port(self) -> dict[str, dict[str, int]]:
        """{port: {bucket: packets dropped}} of the registered ports (summed over CPUs)."""
        m, n = self.maps["police_port"], C["RLB_P_MAX"]
        out = {}
        for ifindex, (slot, _) in self.port_slots().items():
            out[self.ifname(ifindex)] = {name: sum(r.dropped for r in m.get_percpu(slot * n + bid))
                                         for bid, name in POLICE.items()}
        return out

    def set_port_class(self, ifindex: int, edge: bool | None, slot: int | None = None):
        """A host port's punts are policed apart from the fabric's own control traffic (edge None:
        the class it has); the entry also names the port's slot, whose buckets its punts spend."""
        m = self.maps["port_class"]
        key = m.key_type(ifindex)
        if edge is None:
            old = m.get(key)
            cls = (old.value & C["RLB_CLASS_MASK"]) if old is not None else C["RLB_PORT_FABRIC"]
        else:
            cls = C["RLB_PORT_EDGE"] if edge else C["RLB_PORT_FABRIC"]
        if slot is None:
            found = self.port_slot(ifindex)
            slot = found[0] if found is not None else -1
        m.set(key, m.leaf_type(cls | (slot + 1) << C["RLB_CLASS_SLOT_SHIFT"]))

    def port_is_edge(self, ifindex: int) -> bool:
        v = self.maps["port_class"].get(ifindex)
        return v is not None and (v.value & C["RLB_CLASS_MASK"]) == C["RLB_PORT_EDGE"]

    def close(self):
        super().close()
        self.prog_fd = None
        self.disown()

    def _init_config(self):
        cfg_map = self.maps["config"]
        cfg = cfg_map.get(0)
        if cfg.flowlet_timeout_ns == 0:   # first load: defaults and a random seed
            cfg.flowlet_timeout_ns = DEFAULTS["flowlet_timeout_ns"]
            cfg.load_halflife_ns = DEFAULTS["load_halflife_ns"]
            cfg.roce_port = DEFAULTS["roce_port"]
            cfg.hash_seed = random.getrandbits(32)
            cfg.default_band_bytes = band_bytes(DEFAULT_SPEED_MBPS, cfg.load_halflife_ns)
            cfg_map.set(0, cfg)
            log.info("initialised config: seed %#x, flowlet timeout %d us", cfg.hash_seed,
                     cfg.flowlet_timeout_ns // 1000)

    def config(self) -> dict:
        cfg = self.maps["config"].get(0)
        return {f: getattr(cfg, f) for f, _ in cfg._fields_}

    def set_config(self, **values):
        self.claim()
        with self.locked():
            cfg = self.maps["config"].get(0)
            for k, v in values.items():
                if v is None:
                    continue
                if not hasattr(cfg, k):
                    raise DataplaneError(f"unknown setting {k}")
                if k == "flowlet_timeout_ns" and not 0 < v <= C["RLB_FLOWLET_MAX_TIMEOUT_NS"]:
                    raise DataplaneError(f"flowlet timeout {v} ns is out of range "
                                         f"(1 ns .. {C['RLB_FLOWLET_MAX_TIMEOUT_NS'] // 10**9} s)")
                checked_set(cfg, k, v, DataplaneError)
            self.maps["config"].set(0, cfg)

    def set_gtsm(self, on: bool):
        """BGP to a link-local address only at hop limit 255, dropped in XDP otherwise (the
        fabric's ttl_security; bird alone lets a passive session's first segments through)."""
        with self.locked():
            cfg = self.maps["config"].get(0)
            cfg.flags = (cfg.flags | C["RLB_CFG_GTSM"]) if on else (cfg.flags & ~C["RLB_CFG_GTSM"])
            self.maps["config"].set(0, cfg)

    # ---- ports ----------------------------------------------------------------------
    def ifname(self, ifindex: int) -> str:
        """Interface name, remembered per index: a route listing or a scrape asks for the same
        few ports many times. Renames are rare; an unknown index just asks netlink again."""
        name = self._names.get(ifindex)
        if name is None:
            try:
                name = self._names[ifindex] = socket.if_indextoname(ifindex)   # one ioctl, as ifindex()
            except OSError:              # gone
                return f"if{ifindex}"
        return name

    def _speed_mbps(self, ifname: str) -> int:
        try:
            out = subprocess.run(["ethtool", ifname], capture_output=True, text=True).stdout
        except FileNotFoundError:
            return DEFAULT_SPEED_MBPS
        for line in out.splitlines():
            line = line.strip()
            if line.startswith("Speed:") and line.endswith("Mb/s"):
                return int(line[6:-4])
        return DEFAULT_SPEED_MBPS

    def attach(self, ifname: str, generic: bool = False, speed_mbps: int | None = None,
               edge: bool | None = None):
        """Attach the XDP program to a port (replacing any older version atomically); edge: the
        port faces a host (its punts are policed apart), None leaves its class as it is."""
        from bcc import BPF
        ifindex = self.ifindex(ifname)   # before anything is loaded or pinned
        self.load()
        flags = XDP_FLAGS_SKB_MODE if generic else XDP_FLAGS_DRV_MODE
        try:
            BPF.attach_xdp(ifname.encode(), self._fn, flags)
        except Exception as e:
            if generic:
                raise DataplaneError(f"attaching XDP to {ifname} failed: {e}") from e
            raise DataplaneError(f"native XDP on {ifname} failed ({e}); the driver may not "
                                 f"support it: retry with --generic (slower, a fallback)") from e
        if generic:
            log.warning("%s: generic (skb) XDP: correct but slow; use a driver with native XDP", ifname)
        self.register_port(ifindex, speed_mbps, edge)
        log.info("attached to %s (ifindex %d, %s%s)", ifname, ifindex, "generic" if generic else "native",
                 ", a host port" if edge else "")

    def port_slots(self) -> dict[int, tuple[int, object]]:
        """{ifindex: (slot, port entry)} of the registered ports (one batch read of the array)."""
        out = {}
        for slot, p in enumerate(self.maps["ports"].array_values()):
            if p is not None and p.ifindex:
                out[p.ifindex] = (slot, p)
        return out

    def port_slot(self, ifindex: int) -> tuple[int, object] | None:
        return self.port_slots().get(ifindex)

    def register_port(self, ifindex: int, speed_mbps: int | None = None, edge: bool | None = None):
        """Make a port usable as ingress and egress: port state, devmap slot, counters.
        speed_mbps overrides what ethtool reports (veths claim 10 Gb/s whatever they carry);
        it sizes the port's DLB quality bands. Without it a re-registration keeps the bands.
        edge: its class (set_port_class; None keeps the one it has)."""
        self.claim()               # before the locks: a writer finishing a step needs them
        with self.locked(), self.locked_part("ports"):
            ports = self.maps["ports"]
            slots = self.port_slots()
            if ifindex in slots:
                slot, port = slots[ifindex]
            else:
                used = {s for s, _ in slots.values()}
                free = [s for s in range(C["RLB_MAX_PORTS"]) if s not in used]
                if not free:
                    raise DataplaneError(f"all {C['RLB_MAX_PORTS']} port slots are in use")
                slot, port = free[0], ports.leaf_type()
                port.ifindex = ifindex
                self.maps["port_stats"].zero(slot)
                self.maps["port_load"].zero(slot)
            with self.netlink() as ipr:
                link = ipr.get_links(ifindex)[0]
            ifname = link.get_attr("IFLA_IFNAME")
            port.up = int(self._link_up(link))
            port.mtu = link.get_attr("IFLA_MTU") or 0
            port.mac[:] = mac_bytes(link.get_attr("IFLA_ADDRESS"))
            if speed_mbps or not port.band_bytes:
                speed = speed_mbps or self._speed_mbps(ifname)
                port.band_bytes = band_bytes(speed, self.config()["load_halflife_ns"])
                port.speed_mbps = speed
            self.maps["tx_ports"].set(slot, self.maps["tx_ports"].leaf_type(ifindex))
            ports.set(slot, port)
            self.set_port_class(ifindex, edge, slot)    # its punts spend this slot's buckets
            if ifindex not in slots:
                self.tables.port_moved(ifindex, slot)   # next hops made before it was (re)attached

    @staticmethod
    def _link_up(link) -> bool:
        return link_up(link["flags"])

    def set_port_up(self, ifindex: int, up: bool, mtu: int | None = None) -> bool:
        """Liveness (and MTU) from netlink; returns True when the liveness changed. Under the
        port map's own lock only: a carrier loss must not wait for a route-model reload."""
        with self.locked_part("ports"):
            self._carrier[ifindex] = up
            return self._write_up(ifindex, up and ifindex not in self._silent, mtu)

    def tables_fill(self) -> dict[str, tuple[int, int]]:
        """{table: (entries, capacity)} of every bounded table: the routing model's counts (no
        map walk), the neighbours' map walked (directly connected hosts: small)."""
        t = self.tables
        return {"routes": (len(t.routes), C["RLB_MAX_ROUTES"]),
                "nexthops": (len(t.nh_by_id), C["RLB_MAX_NEXTHOPS"] - 1),       # id 0 is "none"
                "groups": (len(t.group_by_id), C["RLB_MAX_GROUPS"] - 1),
                "neighbours": (sum(1 for _ in self.maps["neighbors"].keys()), C["RLB_MAX_NEIGHBORS"]),
                "ports": (len(self.port_slots()), C["RLB_MAX_PORTS"]),
                # /64 routes beyond it are answered by the trie: slower, not lost
                "exact64": (len(t.exact), (1 << C["RLB_EXACT_BITS"]) * C["RLB_EXACT_WAYS"])}

    def set_port_silent(self, ifindex: int, silent: bool) -> bool:
        """Whether the neighbour on a port has stopped answering heartbeats (a switch that keeps
        carrier but forwards nothing): a silent port is taken out of forwarding as a carrier loss
        is, and given back when the neighbour answers again. Returns True when the port's
        liveness changed."""
        with self.locked_part("ports"):
            (self._silent.add if silent else self._silent.discard)(ifindex)
            found = self.port_slot(ifindex)
            if found is None:
                return False
            carrier = self._carrier.get(ifindex, bool(found[1].up) or not silent)
            return self._write_up(ifindex, carrier and not silent, None)

    def silent_ports(self) -> set[int]:
        return set(self._silent)

    def _write_up(self, ifindex: int, up: bool, mtu: int | None) -> bool:
        found = self.port_slot(ifindex)
        if found is None:
            return False
        slot, port = found
        changed = bool(port.up) != up
        if not changed and (not mtu or mtu == port.mtu):
            return False
        port.up = int(up)
        if mtu:
            port.mtu = mtu
        self.maps["ports"].set(slot, port)
        return changed

    def remove_port(self, ifindex: int) -> bool:
        """The interface is gone: its slot is freed, so nothing is ever sent to it again."""
        with self.locked_part("ports"):
            found = self.port_slot(ifindex)
            if found is None:
                return False
            slot, _ = found
            self.maps["ports"].zero(slot)
            self.maps["tx_ports"].delete(slot)
            return True

    def ports(self, slots: dict | None = None) -> list[PortInfo]:
        """The registered ports; `slots` is a port_slots() the caller already read."""
        slots = self.port_slots() if slots is None else slots
        out = [PortInfo(self.ifname(i), i, bool(p.up), slot, mac_str(p.mac), p.speed_mbps, p.mtu)
               for i, (slot, p) in slots.items()]
        return sorted(out, key=lambda p: p.tx_slot)

    def detach(self, ifname: str):
        from bcc import BPF
        ifindex = self.ifindex(ifname)
        for mode in (XDP_FLAGS_DRV_MODE, XDP_FLAGS_SKB_MODE):
            with contextlib.suppress(Exception):
                BPF.remove_xdp(ifname.encode(), mode)
        self.remove_port(ifindex)
        log.info("detached from %s", ifname)

    def destroy(self) -> list[str]:
        """Detach from every port and remove all pinned state; the ports detached."""
        gone = []
        if self.exists():
            for p in self.ports():
                with contextlib.suppress(DataplaneError):
                    self.detach(p.ifname)
                    gone.append(p.ifname)
        self.remove_pins()
        return gone

    # ---- neighbours -------------------------------------------------------------------
    def lookup_neighbour(self, ifindex: int, gateway: str) -> str | None:
        with self.netlink() as ipr:
            neighbours = ipr.get_neighbours(family=socket.AF_INET6, ifindex=ifindex)
        for n in neighbours:
            if n.get_attr("NDA_DST") == gateway and n["state"] & NUD_USABLE and n.get_attr("NDA_LLADDR"):
                return n.get_attr("NDA_LLADDR")
        return None

    def solicit(self, ifname: str, gateway: str):
        """Make the kernel resolve a neighbour: send it one datagram (discard port). The kernel
        refuses it from a port that is down or has no link-local address yet (the watcher asks
        again when that address comes): logged."""
        try:
            with socket.socket(socket.AF_INET6, socket.SOCK_DGRAM) as s:
                scope = socket.if_nametoindex(ifname) if ipaddress.IPv6Address(gateway).is_link_local else 0
                s.sendto(b"", (gateway, 9, 0, scope))
        except OSError as e:
            log.debug("cannot solicit %s%%%s yet: %s", gateway, ifname, e.strerror)

    def update_neighbour(self, ifindex: int, address: str, mac: str | None) -> int:
        """Neighbour table change: fix next hops and connected hosts. Returns entries changed."""
        changed = self.tables.update_neighbour(ifindex, address, mac)
        with self.locked():
            neigh = self.maps["neighbors"]
            key = neigh.key_type()
            key.addr[:] = ipaddress.IPv6Address(address).packed
            if mac and self._connected_port(address) == ifindex:
                val = neigh.leaf_type()
                val.ifindex = ifindex
                val.dmac[:] = mac_bytes(mac)
                neigh.set(key, val)
                changed += 1
            elif not mac and neigh.delete(key):
                changed += 1
        return changed

    def _connected_port(self, address: str) -> int | None:
        rt = self.maps["routes"].get(self.lpm_key(ipaddress.IPv6Network(f"{address}/128")))
        if rt is not None and rt.mode == MODE_IDS["connected"]:
            return rt.ifindex
        return None

    def sync_neighbours(self) -> int:
        """Full resync from the kernel's neighbour table (agent start-up)."""
        changed = 0
        with self.netlink() as ipr:
            neighbours = ipr.get_neighbours(family=socket.AF_INET6)
        for n in neighbours:
            dst = n.get_attr("NDA_DST")
            if not dst or ipaddress.IPv6Address(dst).is_multicast:
                continue
            usable = n["state"] & NUD_USABLE and n.get_attr("NDA_LLADDR")
            changed += self.update_neighbour(n["ifindex"], dst, n.get_attr("NDA_LLADDR") if usable else None)
        return changed

    # ---- routes (written by the model in tables.py) ----------------------------------------
    def lpm_key(self, prefix: ipaddress.IPv6Network):
        return abi.lpm_key(self.maps["routes"], prefix)

    def add_route(self, route: Route, owner: str = "operator"):
        """Install or replace one route, make-before-break."""
        ch = self.tables.apply([route], merge=True, owner=owner)
        if route.mode == "connected":
            self.sync_neighbours()
        if ch:
            log.info("route %s %s", route.prefix, self.describe(route))

    def apply_routes(self, routes: list[Route], scope=None, merge: bool = False, keep_going: bool = False,
                     owner: str = "operator", only_own: bool = False):
        """Make the table equal to `routes` (see SwitchTables.apply); returns the changes."""
        ch = self.tables.apply(routes, scope, merge, keep_going, owner, only_own)
        if any(r.mode == "connected" for r in routes) and ch:
            self.sync_neighbours()
        return ch

    describe = staticmethod(describe)

    def del_route(self, prefix) -> bool:
        prefix = ipaddress.IPv6Network(prefix)
        if not self.tables.delete(prefix):
            return False
        log.info("route %s removed", prefix)
        return True

    def _nexthop_spec(self, nh, weight: int = 1) -> NextHop:
        ifname = self.ifname(nh.ifindex)
        if nh.flags & NH_STATIC:
            return NextHop(ifname, mac=mac_str(nh.dmac), weight=weight)
        return NextHop(ifname, gateway=str(ipaddress.IPv6Address(bytes(nh.gateway))), weight=weight)

    def routes(self) -> list[dict]:
        """Programmed routes with their next hops' ids and state, for show and the agent. Each
        map is read once (next hops and ports whole, each group once), under the lock: a route
        read after the next hops must not name one written in between."""
        with self.locked():
            return self._routes()

    def _routes(self) -> list[dict]:
        nhs = self.maps["nexthops"].array_values()
        ports = {i: p for i, (_, p) in self.port_slots().items()}
        groups: dict[int, object] = {}
        out = []
        for k, r in self.maps["routes"].items():
            prefix = ipaddress.IPv6Network((bytes(k.addr), k.prefixlen))
            mode = MODE_NAMES.get(r.mode, f"mode{r.mode}")
            entry = {"prefix": str(prefix), "mode": mode, "owner": OWNER_NAMES.get(r.owner, "unknown")}
            if mode == "connected":
                entry["dev"] = self.ifname(r.ifindex)
            if r.nexthop:
                entry["nexthop"] = self._nh_state(nhs, ports, r.nexthop)
            if r.group:
                g = groups.get(r.group)
                if g is None:
                    g = groups[r.group] = self.maps["groups"].get(r.group)
                counts = [0] * g.n_members
                for s in g.slot:
                    counts[s] += 1
                members = []
                for i in range(g.n_members):
                    st = self._nh_state(nhs, ports, g.member_nh[i], g.weight[i])
                    st["slots"] = counts[i]
                    members.append(st)
                entry["backups" if mode == "pinned" else "members"] = members
                entry["group"] = r.group
            out.append(entry)
        return sorted(out, key=lambda e: ipaddress.IPv6Network(e["prefix"]))

    def _nh_state(self, nhs, ports, nh_id: int, weight: int | None = None) -> dict:
        nh = nhs[nh_id]
        port = ports.get(nh.ifindex)
        d = {"id": nh_id, "via": str(self._nexthop_spec(nh)), "mac": mac_str(nh.dmac),
             "resolved": bool(nh.flags & NH_RESOLVED), "port_up": bool(port and port.up)}
        if weight is not None:
            d["weight"] = weight
        return d

    def route_spec(self, prefix) -> Route | None:
        """The Route object that would reproduce what is programmed for prefix."""
        prefix = str(ipaddress.IPv6Network(prefix))
        for e in self.routes():
            if e["prefix"] == prefix:
                return Route.from_json(e)
        return None

    # ---- counters -------------------------------------------------------------------
    def _rx_counters(self) -> dict[int, dict]:
        """Received, per ifindex, is the kernel's count (it sees every frame before XDP does):
        one link dump for all ports."""
        out = {}
        with self.netlink() as ipr:
            links = ipr.get_links()
        for link in links:
            st = link.get_attr("IFLA_STATS64")
            if st is not None:
                out[link["index"]] = {"rx_packets": st["rx_packets"], "rx_bytes": st["rx_bytes"]}
        return out

    def port_tx(self, slots: dict | None = None) -> dict[str, dict[str, int]]:
        """{interface: its tx_packets and tx_bytes}: what the program forwarded into each port
        (port_stats, summed over CPUs), nothing the kernel sent."""
        return {p.ifname: _percpu_sum(self.maps["port_stats"], p.tx_slot, ("tx_packets", "tx_bytes"))
                for p in self.ports(slots)}

    def stats(self) -> dict:
        slots, rx, no_rx = self.port_slots(), self._rx_counters(), {"rx_packets": 0, "rx_bytes": 0}
        tx = self.port_tx(slots)
        ports = []
        for p in self.ports(slots):
            s = tx[p.ifname]
            ports.append({"interface": p.ifname, "ifindex": p.ifindex, "up": p.up,
                          "speed_mbps": p.speed_mbps, "mtu": p.mtu, **rx.get(p.ifindex, no_rx), **s})
        nexthops = []
        nhs = self.maps["nexthops"].array_values()
        port_map = {i: p for i, (_, p) in slots.items()}
        for i, nh in enumerate(nhs):
            if i and nh is not None and nh.flags & NH_VALID:
                s = _percpu_sum(self.maps["nh_stats"], i, ("packets", "bytes"))
                nexthops.append({**self._nh_state(nhs, port_map, i), **s})
        reasons = {}
        for rid, name in REASONS.items():
            if name == "max":
                continue
            reasons[name] = sum(r.value for r in self.maps["reasons"].get_percpu(rid))   # [] past a pinned map's end
        reasons["forwarded"] = sum(p["tx_packets"] for p in ports)   # counted once, per port
        by_port = self.police_by_port()
        return {"ports": ports, "nexthops": nexthops, "reasons": reasons, "police": self.police(by_port),
                "police_by_port": by_port}


def _percpu_sum(m, key, fields) -> dict[str, int]:
    """A per-CPU map's entry, each field summed over the CPUs."""
    rows = m.get_percpu(key)
    return {f: sum(getattr(r, f) for r in rows) for f in fields}
