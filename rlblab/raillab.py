"""A rail-only fabric (rlbfabric/kinds/railonly.py) in network namespaces: one per rail switch (the RLB
XDP switch with static routes: domain d's /64 to GPU (d, k)), one per domain interconnect (a
Linux bridge: the high-rate segment), one per GPU (`rlbhost attach rlb0` in ports mode choosing
each QP's first hop from the h-scores, the kernel relaying for its peers), and <lab>-mon with
the coordinator as the h-score registry.

    GPU (d, k) eth-rail  <->  rail switch r<k> eth-d<d>     (switch side fe80::1, GPU fe80::2)
    GPU (d, k) eth-dom   <->  dom<d> bridge port g<k>
Namespace names: <lab>-<node>."""
from __future__ import annotations

import json
import random
import sys
import threading
import time
from pathlib import Path

from rlbcommon import coordapi, netns
from rlbcommon.netns import run
from rlbcommon.constants import ROCE_PORT
from rlbfabric.kinds.railonly import (LOOPBACK_DEVICE, RAIL_IF, gpu_net_commands, rail_net_commands,
                                rail_routes)
from rlbdeploy.units import AGENT_CAPS, confined
from rlbfabric.base import add_loopback_device

from . import topo
from .fabriclab import FabricLab
from .traffic import QpRun, QpSender


class RailLab(FabricLab):
    KIND, OPTIONS = "rail-only", ("monitor",)
    HOST_IF = LOOPBACK_DEVICE

    def __init__(self, fabric_file: str | Path, name: str = "rlbr", monitor: bool = False):
        super().__init__(fabric_file, name, hosts_agent=True, mode="rlb", monitor=monitor, coordinator=True)

    @property
    def domains(self) -> list[str]:
        return [f"dom{d}" for d in range(1, self.fabric.domains + 1)]

    def namespaces(self) -> list[str]:
        return super().namespaces() + [self.ns(d) for d in self.domains]

    # ---- lifecycle ----------------------------------------------------------------------
    def up(self, timeout: float = 60.0):
        f = self.fabric
        self._namespaces_up(keep_addr_on_down=True)
        self.start_coordinator()
        for dom in self.domains:
            run(self.ns(dom), "ip", "link", "add", "br0", "type", "bridge")
            run(self.ns(dom), "ip", "link", "set", "br0", "up")
        for gpu in self.hosts:
            g = f.gpu(gpu)
            dom = self.ns(self.domains[g.domain - 1])
            topo.link(self.ns(gpu), "eth-dom", dom, f"g{g.rail}")
            run(dom, "ip", "link", "set", f"g{g.rail}", "master", "br0")
            topo.link(self.ns(gpu), RAIL_IF, self.ns(f"r{g.rail}"), f"eth-d{g.domain}")
            add_loopback_device(LOOPBACK_DEVICE, self.ns(gpu))
            topo.run_commands(self.ns(gpu), gpu_net_commands(f, gpu))
        macs = {gpu: topo.mac(self.ns(gpu), RAIL_IF) for gpu in self.hosts}
        for sw in self.switches:
            topo.run_commands(self.ns(sw.name), rail_net_commands(f, sw.name))
            ports = [p for p, _ in f.rail_ports(sw.index)]
            self.cli(sw.name, "attach", "--once", *ports, "--speed-mbps", str(f.rail_mbps))
            routes = self.work / f"routes-{sw.name}.json"
            routes.write_text(json.dumps(rail_routes(f, sw.name, macs)))
            self.cli(sw.name, "route", "apply", str(routes))
        started = {gpu: self._launch(gpu, self._agent_cmd(gpu)) for gpu in self.hosts}   # all at once:
        for gpu, (log, start) in started.items():                                     # each compiles
            self._await(gpu, log, start, "rail-only GPU", timeout=120)
        return self

    def _agent_cmd(self, gpu: str) -> list[str]:
        cmd = [*confined([sys.executable], AGENT_CAPS), "-m", "rlbhost", "--netns", self.ns(gpu), "attach",
               LOOPBACK_DEVICE, "--fabric", str(self.fabric_file), "--node", gpu, "--coordinator", self.coordinator_url]
        return cmd + (["--metrics-addr", self.mgmt_addr(gpu)] if self.monitor else ["--metrics-port", "0"])

    def restart_coordinator(self, fabric_file: str | Path | None = None):
        """The registry again (from another fabric file: another delta); scores start over at 1."""
        self.kill_agent("coordinator")
        saved = self.fabric_file
        self.fabric_file = Path(fabric_file or saved)
        try:
            self.start_coordinator()
        finally:
            self.fabric_file = saved

    # ---- state --------------------------------------------------------------------------
    def hscores(self) -> dict:
        with netns.inside(self.ns("mon")):
            return coordapi.call(self.coordinator_url, coordapi.STATUS)

    def why(self, gpu: str, peer: str | None = None) -> dict:
        return json.loads(self.cli(gpu, "why", *([peer] if peer else []), "--json"))

    def rail_rx(self, domain: int) -> dict[int, int]:
        """{rail: bytes} each rail switch received from domain `domain`'s GPU on it (port counters)."""
        return {sw.index: topo.counters(self.ns(sw.name), f"eth-d{domain}")["rx_bytes"] for sw in self.switches}

    def wait_converged(self, timeout: float = 60.0):
        """Until every GPU's agent has h-scores and the MACs of all its first hops."""
        def converged():
            return len(self.hscores()["reporting"]) == len(self.hosts) and all(
                all(p["valid"] for p in json.loads(self.cli(g, "status", "--json"))["paths"]) for g in self.hosts)
        self.wait_for(converged, timeout, "every GPU to report to the registry and know its first hops")

    # ---- traffic ------------------------------------------------------------------------
    def run_qps(self, src: str, dst: str, n_qps: int, packets: int, seed: int, payload_len: int = 256,
                rate_pps: float = 2000) -> QpRun:
        """n QPs from src's address to dst's (UDP 4791, kernel sockets through src's TC program)."""
        s = QpSender(self.ns(src), self.fabric.address(src), self.fabric.address(dst), n_qps,
                     port=ROCE_PORT, base_sport=49152 + random.Random(seed).randrange(0, 8000), seed=seed)
        try:
            return QpRun(s.send(packets, payload_len, rate_pps))
        finally:
            s.close()

    def load(self, src: str, dst: str, mbps: float, payload_len: int = 1000) -> "Load":
        """Background traffic at mbps from src to dst until stopped (a context manager)."""
        return Load(self, src, dst, mbps, payload_len)


class Load:
    def __init__(self, lab: RailLab, src: str, dst: str, mbps: float, payload_len: int):
        self.lab, self.src, self.dst = lab, src, dst
        self.pps = mbps * 1e6 / 8 / (payload_len + 78)      # UDP, IPv6, Ethernet, BTH
        self.payload_len = payload_len
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        s = QpSender(self.lab.ns(self.src), self.lab.fabric.address(self.src),
                     self.lab.fabric.address(self.dst), 1, port=ROCE_PORT + 1, base_sport=40000)
        try:
            start, sent = time.perf_counter(), 0
            while not self.stop.is_set():
                sent += s.send(1, self.payload_len)
                ahead = sent / self.pps - (time.perf_counter() - start)
                if ahead > 0:
                    time.sleep(ahead)
        finally:
            s.close()

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join()
