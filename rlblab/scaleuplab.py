"""A scale-up fabric (rlbfabric/scaleup.py) in network namespaces: one namespace per plane switch
(bird2 + `rlbswitch run`, XDP) and per GPU (bird2 as a BGP speaker, `rlbhost attach rlb0` in
ports mode, health probes), m veths between every GPU and every plane.

    GPU G eth-P-i  <->  plane switch P eth-G-i        (switch side fe80::1, GPU side fe80::2)
Namespace names: <lab>-<node>."""
from __future__ import annotations

import json
import random
import sys
import time
from pathlib import Path

from rlbfabric.bird.conf import initial_includes, render
from rlbfabric.scaleup import LOOPBACK_DEVICE, add_loopback_device, net_commands

from rlbcommon import netns
from rlbfabric.constants import ROCE_PORT

from . import topo
from .bird import Bird
from .fabriclab import FabricLab
from .traffic import SocketReader


class ScaleupLab(FabricLab):
    HOST_IF = LOOPBACK_DEVICE

    def __init__(self, fabric_file: str | Path, name: str = "rlbs", monitor: bool = False):
        super().__init__(fabric_file, name, hosts_agent=True, mode="rlb", monitor=monitor, coordinator=False)

    @property
    def switches(self):
        return self.fabric.planes

    @property
    def gpus(self) -> list[str]:
        return self.fabric.hosts

    # ---- lifecycle ----------------------------------------------------------------------
    def up(self, timeout: float = 60.0):
        self._namespaces_up(keep_addr_on_down=True)   # global loopbacks survive a flap
        for g in self.gpus:
            for port in self.fabric.gpu_ports(g):
                topo.link(self.ns(g), port.ifname, self.ns(port.plane.name), port.switch_ifname)
            add_loopback_device(LOOPBACK_DEVICE, self.ns(g))
        for node in [*self.gpus, *(p.name for p in self.fabric.planes)]:   # what rlb-net.service runs
            topo.run_commands(self.ns(node), net_commands(self.fabric, node))
        for p in self.fabric.planes:
            for inc, body in initial_includes(self.fabric, p, self.work).items():
                inc.write_text(body)
            self._bird(p.name)
            self.start_agent(p.name)
        for g in self.gpus:
            for inc, body in initial_includes(self.fabric, g, self.work).items():
                inc.write_text(body)
            self._bird(g)
            self.start_host_agent(g)
        return self

    def _bird(self, node: str):
        bird = Bird(self.ns(node), render(self.fabric, node, self.work), self.work, name=node)
        bird.start()
        self.birds[node] = bird

    def start_host_agent(self, gpu: str):
        cmd = [sys.executable, "-m", "rlbhost", "--netns", self.ns(gpu), "attach", LOOPBACK_DEVICE,
               "--fabric", str(self.fabric_file), "--node", gpu, "--run-dir", str(self.work)]
        cmd += ["--metrics-addr", self.mgmt_addr(gpu)] if self.monitor else ["--metrics-port", "0"]
        self._spawn(gpu, cmd, "following planes")

    # ---- state --------------------------------------------------------------------------
    def weights(self, gpu: str) -> dict[str, dict[int, float]]:
        """{peer loopback /128: {path value: weight}} as programmed on a GPU."""
        return {w["prefix"]: {int(k): v for k, v in w["all_weights"].items()}
                for w in json.loads(self.cli(gpu, "weights", "show", "--json"))}

    def plane_weights(self, src: str, dst: str, programmed: dict | None = None) -> dict[int, float]:
        """{plane number: weight} src gives towards dst (its sub-ports' weights summed), from
        `programmed` (src's weights(), read once for several peers) or read now."""
        w = (programmed if programmed is not None else self.weights(src)).get(f"{self.fabric.loopback(dst)}/128", {})
        out = {p.index: 0.0 for p in self.fabric.planes}
        for port in self.fabric.gpu_ports(src):
            out[port.plane.index] += w.get(port.value, 0.0)
        return out

    def full_planes(self) -> dict[int, float]:
        """{plane number: its weight (Gb/s) from a GPU with every sub-port live to a peer with the same}."""
        return {p.index: self.fabric.subports * self.fabric.sub_mbps(p.name) / 1000 for p in self.fabric.planes}

    def wait_converged(self, timeout: float = 120.0):
        """Until every GPU weights every peer on every plane at full bandwidth (scenarios
        start from here: a fault the last one cleared may still be travelling through BGP)."""
        full = self.full_planes()

        def converged(a):
            programmed = self.weights(a)
            return all(self.plane_weights(a, b, programmed) == full for b in self.gpus if b != a)
        self.wait_for(lambda: all(converged(a) for a in self.gpus), timeout,
                      "every GPU to weight every peer on every plane")

    # ---- traffic ------------------------------------------------------------------------
    def sub_port_bytes(self, src: str) -> dict[tuple[int, int], int]:
        """{(plane, sub-port): bytes} the plane switches received from src (their port counters)."""
        return {(p.plane.index, p.sub): topo.counters(self.ns(p.plane.name), p.switch_ifname)["rx_bytes"]
                for p in self.fabric.gpu_ports(src)}

    def run_qps(self, src: str, dst: str, n_qps: int, packets: int, seed: int,
                payload_len: int = 512, rate_pps: float | None = None) -> dict:
        """n QPs between two GPUs' loopbacks (UDP 4791, random source ports and QPs) sent from a
        raw socket on src's loopback device, through its TC program; per (plane, sub-port)
        bytes from the plane switches' counters."""
        from .traffic import Flow, open_raw, send
        rnd = random.Random(seed)
        a, b = self.fabric.loopback(src), self.fabric.loopback(dst)
        flows = [Flow(a, b, rnd.randrange(49152, 65536), rnd.getrandbits(24)) for _ in range(n_qps)]
        sock = open_raw(self.ns(src), LOOPBACK_DEVICE)
        try:
            before, sent_before = self.sub_port_bytes(src), self.sent_per_port(src)
            sent = send(sock, flows, packets, dmac="02:00:00:00:00:01", smac="02:00:00:00:00:02",
                        payload_len=payload_len, rate_pps=rate_pps)
            time.sleep(0.3)
            after, sent_after = self.sub_port_bytes(src), self.sent_per_port(src)
        finally:
            sock.close()
        return {"sent": sent, "ports": {k: after[k] - before[k] for k in after},
                "qp_packets": {k: sent_after[k] - sent_before[k] for k in sent_after}}

    def sent_per_port(self, gpu: str) -> dict[tuple[int, int], int]:
        """{(plane, sub-port): packets} the GPU's TC program sent on each path (its own counters:
        the switches' port counters also see BGP, BFD and the probes)."""
        s = json.loads(self.cli(gpu, "status", "--json"))
        by_value = {p["path"]: p["tx_packets"] for p in s["paths"]}
        return {(p.plane.index, p.sub): by_value.get(p.value, 0) for p in self.fabric.gpu_ports(gpu)}

    def receiver(self, gpu: str) -> "Receiver":
        """Counts the QP datagrams arriving at a GPU's loopback (port 4791): what was delivered,
        unlike the port counters, which also see BGP, BFD and the probes."""
        return Receiver(self.ns(gpu), self.fabric.loopback(gpu))

    def plane_shares(self, ports: dict[tuple[int, int], int]) -> dict[int, float]:
        total = sum(ports.values())
        out: dict[int, float] = {}
        for (plane, _), v in ports.items():
            out[plane] = out.get(plane, 0) + (v / total if total else 0)
        return {k: round(v, 4) for k, v in sorted(out.items())}


class Receiver(SocketReader):
    """A UDP socket on a GPU's loopback:4791 counting datagrams in a thread (use as a context:
    on exit it waits for stragglers, then stops)."""

    def __init__(self, ns: str, addr: str):
        import socket
        with netns.inside(ns):
            sock = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
            sock.bind((addr, ROCE_PORT))
        self.count = 0
        super().__init__(sock)

    def take(self):
        self.sock.recv(4096)
        self.count += 1

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        time.sleep(0.3)
        self.close()
