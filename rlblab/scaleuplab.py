"""A scale-up fabric (rlbfabric/kinds/scaleup.py) in network namespaces: one namespace per plane switch
(bird2 + `rlbswitch run`, XDP) and per GPU (bird2 as a BGP speaker, `rlbhost attach rlb0` in
ports mode, health probes), m veths between every GPU and every plane.

    GPU G eth-P-i  <->  plane switch P eth-G-i        (switch side fe80::1, GPU side fe80::2)
Namespace names: <lab>-<node>."""
from __future__ import annotations

import secrets
import socket
import sys
import time
from pathlib import Path

from rlbcommon import netns
from rlbcommon.constants import ROCE_PORT
from rlbcommon.paths import write_private
from rlbdeploy import hostkeys
from rlbfabric.base import add_loopback_device
from rlbfabric.base import GPU_LL, LOOPBACK_DEVICE, SWITCH_LL
from rlbfabric.bird.conf import initial_includes, render
from rlbdeploy.units import AGENT_CAPS, confined

from . import topo
from .bird import Bird
from .fabriclab import FabricLab
from .scaleupview import FRAME_DMAC, FRAME_SMAC, ScaleupView
from .traffic import SocketReader
from .traffic import open_raw, send

SO_RCVBUFFORCE, SO_RXQ_OVFL = 33, 40


class ScaleupLab(ScaleupView, FabricLab):
    KIND, OPTIONS = "scaleup", ("monitor",)
    HOST_IF = LOOPBACK_DEVICE

    def __init__(self, fabric_file: str | Path, name: str = "rlbs", monitor: bool = False):
        super().__init__(fabric_file, name, hosts_agent=True, mode="rlb", monitor=monitor, coordinator=False)

    @property
    def switches(self):
        return self.fabric.planes

    # ---- lifecycle ----------------------------------------------------------------------
    def up(self, timeout: float = 60.0):
        self._namespaces_up(keep_addr_on_down=True)   # global loopbacks survive a flap
        for g in self.gpus:
            for port in self.fabric.gpu_ports(g):
                topo.link(self.ns(g), port.ifname, self.ns(port.plane.name), port.switch_ifname)
            add_loopback_device(LOOPBACK_DEVICE, self.ns(g))
        for node in [*self.gpus, *(p.name for p in self.fabric.planes)]:   # what rlb-net.service runs
            topo.run_commands(self.ns(node), self.fabric.net_commands(node))
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

    def probe_key(self, gpu: str) -> Path:
        """`gpu`'s key file: the keys it shares with each other GPU (rlbfabric host-keys, from a
        master key made once per lab), as an operator's fabric has them: written once."""
        path = self.work / "host-keys" / f"{gpu}.key"
        if not path.exists():
            master = self.work / "host-keys-master"
            if not master.exists():
                write_private(master, secrets.token_hex(32) + "\n")
            hostkeys.write(self.fabric, master, path.parent)
        return path

    def start_host_agent(self, gpu: str):
        cmd = [*confined([sys.executable], AGENT_CAPS), "-m", "rlbhost", "--netns", self.ns(gpu), "attach", LOOPBACK_DEVICE,
               "--fabric", str(self.fabric_file), "--node", gpu, "--run-dir", str(self.work),
               "--probe-key", str(self.probe_key(gpu))]
        cmd += ["--metrics-addr", self.mgmt_addr(gpu)] if self.monitor else ["--metrics-port", "0"]
        self._spawn(gpu, cmd, "following planes")

    # ---- the primitives of ScaleupView ----------------------------------------------------
    def port_rx_bytes(self, node: str, ifnames: list[str]) -> dict[str, int]:
        return {i: topo.counters(self.ns(node), i)["rx_bytes"] for i in ifnames}

    def send_flows(self, src: str, flows: list, packets: int, payload_len: int, rate_pps: float | None) -> int:
        sock = open_raw(self.ns(src), LOOPBACK_DEVICE)
        try:
            return send(sock, flows, packets, dmac=FRAME_DMAC, smac=FRAME_SMAC, payload_len=payload_len,
                        rate_pps=rate_pps)
        finally:
            sock.close()

    def set_port(self, node: str, ifname: str, up: bool):
        """`ip link set` on one end of a veth (its peer loses carrier too); up puts back its
        configured link-local (the kernel drops link-local addresses on down whatever
        keep_addr_on_down says), as a real host's network config does."""
        netns.run(self.ns(node), "ip", "link", "set", ifname, "up" if up else "down")
        if up:
            ll = GPU_LL if self.fabric.is_gpu(node) else SWITCH_LL
            netns.run(self.ns(node), "ip", "addr", "replace", f"{ll}/64", "dev", ifname, "nodad")

    def recreate_port(self, gpu: str, ifname: str):
        """Delete a GPU's sub-port (the veth: both ends go) and make it again with the same
        names and configuration, as a replaced cable or a re-created interface does: new ifindex
        and MACs at both ends."""
        port = next(p for p in self.fabric.gpu_ports(gpu) if p.ifname == ifname)
        netns.run(self.ns(gpu), "ip", "link", "del", ifname)
        topo.link(self.ns(gpu), ifname, self.ns(port.plane.name), port.switch_ifname)
        for node, name, ll in ((gpu, ifname, GPU_LL), (port.plane.name, port.switch_ifname, SWITCH_LL)):
            topo.run_commands(self.ns(node), [["ip", "link", "set", name, "up"],
                                              ["ip", "addr", "replace", f"{ll}/64", "dev", name, "nodad"],
                                              ["ethtool", "-K", name, "tx", "off"]])

    def receiver(self, gpu: str) -> "Receiver":
        """Counts the QP datagrams arriving at a GPU's loopback (port 4791): what was delivered,
        unlike the port counters, which also see BGP, BFD and the probes."""
        return Receiver(self.ns(gpu), self.fabric.loopback(gpu))


class Receiver(SocketReader):
    """A UDP socket on a GPU's loopback:4791 counting datagrams in a thread, in all and per
    source port (one per QP in the labs' traffic); use as a context: on exit it waits for
    stragglers, then stops. `dropped` is what the socket itself dropped (its buffer full while
    this process was busy): packets the fabric delivered, so a loss figure must not count them."""

    def __init__(self, ns: str, addr: str):
        with netns.inside(ns):
            sock = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
            sock.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, 8 << 20)   # not capped at rmem_max
            sock.setsockopt(socket.SOL_SOCKET, SO_RXQ_OVFL, 1)
            sock.bind((addr, ROCE_PORT))
        self.per_sport: dict[int, int] = {}
        self.dropped = 0
        super().__init__(sock)

    @property
    def count(self) -> int:
        return sum(list(self.per_sport.values()))    # a copy: the reader thread adds ports

    def take(self):
        _, anc, _, (_, sport, *_) = self.sock.recvmsg(4096, socket.CMSG_SPACE(4))
        for level, kind, data in anc:
            if level == socket.SOL_SOCKET and kind == SO_RXQ_OVFL and len(data) >= 4:
                self.dropped = int.from_bytes(data[:4], "little")     # the socket's total so far
        self.per_sport[sport] = self.per_sport.get(sport, 0) + 1

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        time.sleep(0.3)
        self.close()
