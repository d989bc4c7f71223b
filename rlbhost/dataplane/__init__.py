"""The host data-plane API: TC programs on one interface, paths from its addresses, weights,
and the connection-tracking table's releases and reinstatements.

State lives in pinned maps under /sys/fs/bpf/rlb/<instance>/host; a restarted agent reloads the
programs against the same maps and replaces the TC filters in place, so QPs keep their paths.
A server with several fabric NICs has one such data plane per NIC, each with its own paths,
weights, QP table and counters, under /sys/fs/bpf/rlb/<instance>/host-<nic>.

One object over one NIC's maps, its concerns in rooms of their own: hooks.py where the programs
run, paths.py and ports.py what a path is (an address, or a port), weights.py the weight
entries, qptable.py the QP table and its sweep, verbsqps.py the QPs the verbs library placed;
abi.py what the programs and user space agree on."""
from __future__ import annotations

import threading
from collections import Counter

from rlbcommon.constants import ROCE_PORT
from rlbcommon.paths import pin_dir
from rlbcommon.pinnedstate import PinnedState
from rlbfabric import addrplan

from ..gids import GidTable
from .abi import C, ECHO, MAX_PATHS, PORTS_MODE, REASONS, SOURCE, HostError, Path_, PortPath, VerbsQp
from .hooks import Hooks
from .paths import Paths
from .ports import PortsMode
from .qptable import QpTable, sweep_period
from .verbsqps import VerbsQps
from .weights import Weights

__all__ = ["C", "MAX_PATHS", "REASONS", "HostDataplane", "HostError", "Path_", "PortPath", "VerbsQp",
           "sweep_period"]

DEFAULT_EXPIRY_MS = 200
DEFAULT_ROCE_PORT = ROCE_PORT
NIC_PREFIX = "host-"


def _nic_component(nic: str) -> str:
    """A NIC's pin directory: bpffs refuses dots in names, which interface names (VLANs: eth0.100)
    may have, and ':' no interface name has."""
    return NIC_PREFIX + nic.replace(".", ":")


class HostDataplane(Hooks, Paths, PortsMode, Weights, QpTable, VerbsQps, PinnedState):
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
        # who hears of the QPs each sweep removes as idle (on_idle): nobody, without a coordinator
        self._idle_sinks: list = []
        # {weight entry id: the effective weights its QPs were last balanced to} (rebalance)
        self._laid_out: dict[int, list[int]] = {}
        # {conntrack key: the path it held when the layout last held still}, and when the
        # weights last changed (rebalance: a change taken back soon moves the same QPs back)
        self._homes: dict[bytes, int] = {}
        self._changed_ns = 0
        # the verbs service's choose-and-count and the sweep's recount of the active counters
        # exclude each other, so a QP placed through verbs is never counted out of a burst
        self.verbs_lock = threading.RLock()
        # the verbs map's QPs as this process last wrote or read them: the agent, their only
        # writer, counts and reports them without walking the map (2 entries a QP) each time
        self._verbs: dict[tuple[str, int], VerbsQp] | None = None
        self._verbs_counts: Counter = Counter()      # (entry, path) -> QPs of _verbs on it

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

    def stats(self) -> dict:
        rows = {}
        for p in self.paths():
            per_cpu = self.maps["path_stats"].get_percpu(p.index)
            rows[p.index] = {f: sum(getattr(r, f) for r in per_cpu)
                             for f in ("tx_packets", "tx_bytes", "rx_packets", "rx_bytes")}
        reasons = {name: sum(r.value for r in self.maps["reasons"].get_percpu(rid))
                   for rid, name in REASONS.items() if name != "max"}
        return {"paths": rows, "reasons": reasons}

    def status(self) -> dict:
        qps = self.qps()
        stats = self.stats()
        down = self.ports_down()
        default = next((w for w in self.weights() if w["prefix"] == "::/0"), {"weights": {}})
        verbs = Counter()                # verbs QPs per path index, from the tally kept as they come and go
        for (_, path), n in self.verbs_counts().items():
            verbs[path] += n
        paths = []
        for p in self.paths():
            on = verbs[p.index]
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
                  "verbs": (2 * sum(verbs.values()), C["RLBH_VERBS_ENTRIES"]),   # a send and a receive entry each
                  "echo_keys": (sum(1 for _ in self.maps["echo_keys"].keys()), C["RLBH_ECHO_KEYS"])}
        return {"config": self.config(), "paths": paths, "weights": weights,
                "reasons": stats["reasons"], "tables": tables}

    def paths_with_gids(self) -> list[dict]:
        """Path index, address and, where an RDMA device has it, its RoCE v2 GID index (what the
        verbs library gives a QP on that path)."""
        gids = GidTable().by_address()
        return [{"index": p.index, "path": p.value, "address": p.address, "valid": p.valid,
                 "gids": gids.get(p.address, [])} for p in self.paths()]
