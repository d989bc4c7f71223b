"""A scale-up fabric's Vagrant lab seen as the scale-up scenarios see a lab (rlblab.scaleupview):
the same scenario code that checks the namespace lab runs here against VMs. Commands go over
ssh; a "port down" is a pulled cable (both NICs lose carrier, from the host); QPs are the lab's
raw UDP QPs, sent by a Python process on the GPU VM through its TC program (GPU VMs have no
Soft-RoCE device: see rlblab.vm.node)."""
from __future__ import annotations

import json
import shlex
import time
from dataclasses import asdict

from rlbfabric.fabric import load
from rlbfabric.kinds.scaleup import LOOPBACK_DEVICE, ScaleupFabric

from ..scaleupview import FRAME_DMAC, FRAME_SMAC, ScaleupView
from .driver import VAGRANT_DIR, VagrantLab
from .node import VENV

# run on a GPU VM: argv = flows (JSON), packets per flow, payload length, rate (0: unpaced)
SENDER = f"""
import json, sys
from rlblab.traffic import Flow, open_raw, send
flows = [Flow(**f) for f in json.loads(sys.argv[1])]
sock = open_raw(None, {LOOPBACK_DEVICE!r})
print(send(sock, flows, int(sys.argv[2]), dmac={FRAME_DMAC!r}, smac={FRAME_SMAC!r},
           payload_len=int(sys.argv[3]), rate_pps=float(sys.argv[4]) or None))
"""


class VagrantScaleup(ScaleupView):
    # under TCG: BFD at 300 ms, bird and the agents on 13 VMs sharing the machine's cores
    SETTLE_S = 120.0
    CONVERGE_S = 900.0

    def __init__(self, lab: VagrantLab, venv: str = str(VENV)):
        self.lab, self.venv = lab, venv
        self.fabric = load(VAGRANT_DIR.parent / lab.fabric)
        if self.fabric.kind != ScaleupFabric.kind:
            raise ValueError(f"{lab.fabric} is not a scale-up fabric")

    def cli(self, node: str, *args: str) -> str:
        tool = "rlbhost" if self.fabric.is_gpu(node) else "rlbswitch"
        return self.lab.sh(node, f"{self.venv}/{tool} {shlex.join(args)}").stdout

    def wait_for(self, cond, timeout: float, what: str):
        self.lab.wait(what, cond, timeout=timeout, every=2)

    def port_rx_bytes(self, node: str, ifnames: list[str]) -> dict[str, int]:
        links = {l["ifname"]: l for l in self.lab.json(node, "ip -j -s link show")}
        return {i: links[i]["stats64"]["rx"]["bytes"] for i in ifnames}

    def send_flows(self, src: str, flows: list, packets: int, payload_len: int, rate_pps: float | None) -> int:
        args = [json.dumps([asdict(f) for f in flows]), str(packets), str(payload_len), str(rate_pps or 0)]
        out = self.lab.sh(src, f"{self.venv}/python -c {shlex.quote(SENDER)} {shlex.join(args)}", timeout=600).stdout
        return int(out.split()[-1])

    def set_port(self, node: str, ifname: str, up: bool):
        self.lab.set_port(node, ifname, up)
        time.sleep(0.2)
