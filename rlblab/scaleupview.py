"""What the scale-up scenarios read and do on a lab, whatever runs its fabric: namespaces on this
machine (rlblab.scaleuplab) or VMs (rlblab.vm.scaleup). A lab provides five primitives (cli,
wait_for, port_rx_bytes, send_flows, set_port) and lists this view first among its bases;
everything the scenarios measure is built on them here, once, so the same scenario code checks
both labs."""
from __future__ import annotations

import json
import random
import time

from .traffic import Flow, QpRun

# the raw frames' MACs: the GPU's TC program rewrites both before the frame leaves a sub-port
FRAME_DMAC, FRAME_SMAC = "02:00:00:00:00:01", "02:00:00:00:00:02"


class ScaleupView:
    fabric: object
    SETTLE_S = 15.0        # a fault to the GPUs' weights (BFD, BGP, the agent)
    CONVERGE_S = 60.0      # the whole fabric to full weights

    # ---- the primitives a lab provides (and cli(node, *args), wait_for(cond, timeout, what)) ----
    def port_rx_bytes(self, node: str, ifnames: list[str]) -> dict[str, int]:
        """{ifname: bytes received} of a node's ports."""
        raise NotImplementedError

    def send_flows(self, src: str, flows: list, packets: int, payload_len: int, rate_pps: float | None) -> int:
        """Send the flows' frames from a raw socket on src's loopback device (through its TC
        program); returns the packets sent."""
        raise NotImplementedError

    def set_port(self, node: str, ifname: str, up: bool):
        """A port (and so its link) down or up, with the addresses it had when it comes back."""
        raise NotImplementedError

    # ---- built on them ------------------------------------------------------------------
    @property
    def gpus(self) -> list[str]:
        return self.fabric.hosts

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

    def wait_converged(self, timeout: float | None = None):
        """Until every GPU weights every peer on every plane at full bandwidth (scenarios
        start from here: a fault the last one cleared may still be travelling through BGP)."""
        full = self.full_planes()
        behind = [""]      # the pair that held the last look back (a look stops at the first)

        def converged(a):
            programmed = self.weights(a)
            for b in self.gpus:
                if b != a and (w := self.plane_weights(a, b, programmed)) != full:
                    behind[0] = f"{a}->{b} {w}"
                    return False
            return True
        try:
            self.wait_for(lambda: all(converged(a) for a in self.gpus), timeout or self.CONVERGE_S,
                          "every GPU to weight every peer on every plane")
        except TimeoutError as e:
            raise TimeoutError(f"{e}: last seen {behind[0]} (full: {full})") from None

    def sub_port_bytes(self, src: str) -> dict[tuple[int, int], int]:
        """{(plane, sub-port): bytes} the plane switches received from src (their port counters)."""
        out = {}
        for plane in self.fabric.planes:
            ports = [p for p in self.fabric.gpu_ports(src) if p.plane.name == plane.name]
            rx = self.port_rx_bytes(plane.name, [p.switch_ifname for p in ports])
            out.update({(p.plane.index, p.sub): rx[p.switch_ifname] for p in ports})
        return out

    def sent_per_port(self, gpu: str) -> dict[tuple[int, int], int]:
        """{(plane, sub-port): packets} the GPU's TC program sent on each path (its own counters:
        the switches' port counters also see BGP, BFD and the probes)."""
        s = json.loads(self.cli(gpu, "status", "--json"))
        by_value = {p["path"]: p["tx_packets"] for p in s["paths"]}
        return {(p.plane.index, p.sub): by_value.get(p.value, 0) for p in self.fabric.gpu_ports(gpu)}

    def run_qps(self, src: str, dst: str, n_qps: int, packets: int, seed: int,
                payload_len: int = 512, rate_pps: float | None = None) -> QpRun:
        """n QPs between two GPUs' loopbacks (UDP 4791, random source ports and QPs) sent
        through src's TC program, in rounds of one packet per QP; per (plane, sub-port) bytes
        from the plane switches' counters and packets from src's own, the flows and the
        seconds the sending took."""
        rnd = random.Random(seed)
        a, b = self.fabric.loopback(src), self.fabric.loopback(dst)
        flows = [Flow(a, b, rnd.randrange(49152, 65536), rnd.getrandbits(24)) for _ in range(n_qps)]
        before, sent_before = self.sub_port_bytes(src), self.sent_per_port(src)
        t0 = time.perf_counter()
        sent = self.send_flows(src, flows, packets, payload_len, rate_pps)
        seconds = time.perf_counter() - t0
        time.sleep(0.3)
        after, sent_after = self.sub_port_bytes(src), self.sent_per_port(src)
        return QpRun(sent, {k: after[k] - before[k] for k in after},
                     {k: sent_after[k] - sent_before[k] for k in sent_after}, flows, seconds)

    def plane_shares(self, ports: dict[tuple[int, int], int]) -> dict[int, float]:
        total = sum(ports.values())
        out: dict[int, float] = {}
        for (plane, _), v in ports.items():
            out[plane] = out.get(plane, 0) + (v / total if total else 0)
        return {k: round(v, 4) for k, v in sorted(out.items())}
