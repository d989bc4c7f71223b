"""The host agent on a GPU of a rail-only fabric (outshift-hscore-rail-routing).

The host data plane runs in ports mode on the loopback device (rlbfabric/kinds/railonly.py): path 1
is the r-interface to the GPU's rail switch, path 1 + y the d-interface to GPU (d, y) of its
own domain, which relays. Every `period_s` the agent measures the rates on its two links,
reports them to the h-score registry (the coordinator) and gets back every rail's and domain's
H; then, per destination GPU, it takes the document's decision (rlbfabric/hscore.decide: d, r,
rd, dr, or drd over the best-fit remote rail or the rails of the delta window) and gives that
first hop (those first hops) the weight. The other usable first hops keep a weight of one
thousandth: a QP in flight on a path the decision left stays there (conntrack keeps a QP on any
path of non-zero weight) until it goes idle, while new and idle QPs take the decision.
Without the registry (not reachable, or not yet answered) every pair takes its direct path:
same rail r, same domain d, otherwise rd, as a rail-only cluster routes without scores.

`rlbhost why` shows the decisions with the numbers behind them (written to a file each pass)."""
from __future__ import annotations

import json
import logging
import ssl
import time
from pathlib import Path

from pyroute2 import IPRoute

from rlbcommon import coordapi
from rlbcommon.health import Health
from rlbcommon.runtime import AgentRuntime
from rlbcommon.paths import write_atomic
from rlbfabric.hscore import Decision, Gpu, SortedRails, decide, gamma, rail_only_beats_rail_optimised
from rlbfabric.kinds.railonly import (DOMAIN_IF, LOOPBACK_DEVICE, RAIL_IF, RAIL_PATH, SWITCH_LL,
                                RailOnlyFabric)

from ..assemble import HOST_AGENTS, Assembled, Options, apply_config, on_loopback_device
from ..dataplane import HostDataplane, HostError, PortPath
from ..links import has_carrier, neighbour_macs
from ..runfiles import why_file

log = logging.getLogger(__name__)

KEEP = 0.001          # the weight of a first hop the decision left: QPs in flight stay on it


def paths_of(d: Decision, dst: Gpu) -> list[int]:
    """The first hops (path values) a decision takes towards dst."""
    if d.kind == "d":
        return [RAIL_PATH + dst.rail]
    if d.kind in ("r", "rd"):
        return [RAIL_PATH]
    if d.kind == "dr":
        return [RAIL_PATH + dst.rail]
    return [RAIL_PATH + x for x in d.rails]


def direct(src: Gpu, dst: Gpu) -> Decision:
    """Without scores: the domain for the same domain, else the own rail (rd)."""
    if src.domain == dst.domain:
        return Decision("d", f"d->{dst}", [], None, why="same domain (no h-scores yet)")
    return Decision("r" if src.rail == dst.rail else "rd", "r", [], None,
                    why="own rail (no h-scores yet)")


class RailGpuAgent:
    def __init__(self, dp: HostDataplane, fabric: RailOnlyFabric, gpu: str, coordinator: str | None,
                 health: Health | None = None, period_s: float = 0.1, why_file: Path | None = None,
                 tls: ssl.SSLContext | None = None):
        self.dp, self.fabric, self.gpu, self.coordinator, self.tls = dp, fabric, gpu, coordinator, tls
        self.me = fabric.gpu(gpu)
        self.runtime = AgentRuntime(log, health)
        self.health, self.stop = self.runtime.health, self.runtime.stop
        self.period_s = period_s
        self.why_file = why_file
        self.hops = fabric.first_hops(gpu)
        self.peers = {n: fabric.gpu(n) for n in fabric.hosts if n != gpu}
        self.macs: dict[int, str] = {}                 # path value -> the next hop's MAC
        self.carrier: dict[str, bool] = {}
        self.table: dict | None = None                 # the registry's last answer
        self.table_at = 0.0
        self.decisions: dict[str, Decision] = {}
        self.last_weights: dict | None = None
        self._programmed: list[PortPath] | None = None
        self._counters: tuple[float, dict] | None = None
        self.rates: dict[str, dict[str, float]] = {}
        self._why_at = 0.0

    # ---- links ---------------------------------------------------------------------------
    def _links(self) -> dict[str, dict]:
        out = {}
        with IPRoute() as ipr:
            for link in ipr.get_links():
                name = link.get_attr("IFLA_IFNAME")
                if name in (RAIL_IF, DOMAIN_IF):
                    st = link.get_attr("IFLA_STATS64") or {}
                    out[name] = {"up": has_carrier(link),
                                 "tx": st.get("tx_bytes", 0), "rx": st.get("rx_bytes", 0)}
        return out

    def measure(self):
        """Carrier and rates (bit/s, each direction) of the two links since the last call."""
        now, links = time.monotonic(), self._links()
        self.carrier = {n: links.get(n, {}).get("up", False) for n in (RAIL_IF, DOMAIN_IF)}
        for h in self.hops:        # a link without carrier: its peers' MACs are learnt again on return
            if not self.carrier.get(h.ifname):
                self.macs.pop(h.value, None)
        if self._counters is not None:
            t0, prev = self._counters
            dt = max(1e-3, now - t0)
            self.rates = {n: {d: max(0, links[n][d] - prev[n][d]) * 8 / dt for d in ("tx", "rx")}
                          for n in links if n in prev}
        self._counters = (now, links)

    def learn_macs(self):
        """The rail switch's MAC (fe80::1 on the r-interface) and each domain peer's (its address
        on the d-interface) from the neighbour table; a missing one is asked for."""
        self.macs.update(neighbour_macs(
            {h.value: (h.ifname, SWITCH_LL if h.via == "rail" else self.fabric.address(h.via))
             for h in self.hops if h.value not in self.macs}, self.carrier))

    def port_paths(self) -> list[PortPath]:
        return [PortPath(h.value, h.ifname, self.macs.get(h.value), self.carrier.get(h.ifname, False))
                for h in self.hops]

    # ---- scores and decisions --------------------------------------------------------------
    def report(self):
        if not self.coordinator:
            return
        body = {part: {"tx_bps": self.rates.get(ifname, {}).get("tx", 0.0),
                       "rx_bps": self.rates.get(ifname, {}).get("rx", 0.0),
                       "up": bool(self.carrier.get(ifname, False))}
                for part, ifname in (("rail", RAIL_IF), ("domain", DOMAIN_IF))}
        try:
            self.table = coordapi.call(self.coordinator, coordapi.GPU_LOAD.format(self.gpu), body, timeout=0.5,
                                       tls=self.tls)
            self.table_at = time.monotonic()
            self.health.ok("registry")
        except coordapi.CoordinatorError as e:
            self.health.failed("registry", e, log, (coordapi.CoordinatorError,))

    def decide_all(self) -> dict[str, Decision]:
        t = self.table if self.table and time.monotonic() - self.table_at < 2.0 else None
        if t is None:
            return {n: direct(self.me, g) for n, g in self.peers.items()}
        rails = SortedRails({int(k): v for k, v in t["rails"].items()})
        domains = {int(k): v for k, v in t["domains"].items()}
        delta = t.get("delta") or None
        return {n: decide(rails, domains, self.me, g, delta) for n, g in self.peers.items()}

    def weights(self, decisions: dict[str, Decision]) -> dict[str, tuple[dict[int, float], bool]]:
        usable = {p.value for p in self.port_paths() if p.up and p.dmac}
        out = {}
        for name, d in decisions.items():
            dst = self.peers[name]
            w = {v: KEEP for v in usable}
            for v in paths_of(d, dst):
                if v in usable:
                    w[v] = 1.0
            if not any(x == 1.0 for x in w.values()):       # the chosen hop is down: direct
                for v in paths_of(direct(self.me, dst), dst):
                    if v in usable:
                        w[v] = 1.0
            out[f"{self.fabric.address(name)}/128"] = (w, False)
        return out

    def step(self):
        self.measure()
        self.learn_macs()
        ports = self.port_paths()
        if ports != self._programmed:
            self.dp.set_port_paths(self.fabric.address(self.gpu), ports)
            self._programmed = ports
        self.report()
        decisions = self.decide_all()
        changed = False
        for name, d in decisions.items():
            old = self.decisions.get(name)
            if old is None or (old.kind, old.rails) != (d.kind, d.rails):
                changed = True
                log.info("to %s: %s%s (%s)", name, d.kind,
                         f" via rail {', '.join(map(str, d.rails))}" if d.rails else "", d.why)
        self.decisions = decisions
        want = self.weights(decisions)
        if want != self.last_weights:
            self.dp.apply_weights({"::/0": ({}, False), **want}, release=False)
            self.last_weights = want
        if self.why_file and (changed or time.monotonic() - self._why_at >= 0.5):
            write_atomic(self.why_file, json.dumps(self.why()))      # a decision at once, scores twice a second
            self._why_at = time.monotonic()

    def why(self) -> dict:
        """Each decision with the numbers behind it, for `rlbhost why`."""
        t = self.table or {}
        h_rail = (t.get("rails") or {}).get(str(self.me.rail))
        h_dom = (t.get("domains") or {}).get(str(self.me.domain))
        g = None if h_rail is None or h_dom is None else gamma(h_rail, h_dom)
        out = {"gpu": self.gpu, "registry": bool(self.table), "rails": t.get("rails"),
               "domains": t.get("domains"), "delta": t.get("delta"),
               "gamma": None if g == float("inf") else g, "peers": {}}
        for name, d in sorted(self.decisions.items()):
            e = {"kind": d.kind, "first_hop": d.first_hop, "rails": d.rails, "paths": paths_of(d, self.peers[name]),
                 "h": d.h, "gamma_src": d.gamma_src, "gamma_dst": d.gamma_dst, "bound": d.bound, "why": d.why}
            if d.kind in ("rd", "dr", "drd") and h_rail is not None and h_dom is not None:
                # the document's last section: this pair on a rail-optimised fabric (a spine at
                # H(S) = 1, the best case for it) against rail-only's dr
                e["rail_only_beats_rail_optimised"] = rail_only_beats_rail_optimised(h_rail, h_dom, 1.0)
            out["peers"][name] = {k: (None if isinstance(v, float) and v == float("inf") else v)
                                  for k, v in e.items()}
        return out

    def run(self):
        log.info("rail-only GPU %s (domain %d, rail %d): %d first hops, registry %s", self.gpu,
                 self.me.domain, self.me.rail, len(self.hops), self.coordinator or "none")
        self.runtime.every("rails", self.period_s, self._round, (HostError, OSError), foreground=True)

    def _round(self):
        """A decision pass, then the sweep in the same thread (16 GPUs' agents share a host's
        cores in the lab: one wake-up per period each)."""
        try:
            self.step()
        finally:
            try:                    # idle QPs expire (none is moved: the decisions place QPs)
                self.dp.rebalance(balance=False)
                self.health.ok("sweep")
            except (HostError, OSError) as e:
                self.health.failed("sweep", e, log, (HostError, OSError))


def attach(dp: HostDataplane, fabric: RailOnlyFabric, gpu: str, coordinator: str | None, **kw) -> RailGpuAgent:
    fabric.gpu(gpu)
    agent = RailGpuAgent(dp, fabric, gpu, coordinator, **kw)
    agent.measure()
    agent.learn_macs()
    dp.attach_ports(LOOPBACK_DEVICE, fabric.address(gpu), agent.port_paths())
    agent._programmed = agent.port_paths()
    return agent


@HOST_AGENTS.register("rail-only")
def assemble(dp: HostDataplane, fabric: RailOnlyFabric, opts: Options, health: Health) -> Assembled:
    on_loopback_device(dp, opts)
    agent = attach(dp, fabric, opts.node, opts.coordinator, health=health, why_file=why_file(dp.instance),
                   tls=opts.coordinator_tls)
    apply_config(dp, opts)
    return Assembled(agent, f"attached to {opts.interface} (ports mode): rail-only: {len(agent.hops)} first hops, "
                     f"address {fabric.address(opts.node)}", {"rails": agent})

