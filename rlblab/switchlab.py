"""The smallest lab that shows the switch data plane: a source host, one XDP switch and N
parallel links towards a destination.

    [src] eth0 --- h1 [sw] up1..upN ===== sw1..swN [dst]

The switch runs the real agent (`rlbswitch run`) as its own process; routes are programmed
through the same data-plane API the CLI uses; results come from kernel interface counters."""
from __future__ import annotations

import contextlib
import datetime
import logging
import os
import subprocess
import sys
import time

from rlbcommon import netns
from rlbdeploy.units import AGENT_CAPS, confined
from rlbswitch.dataplane import SwitchDataplane

from . import topo
from .traffic import Flow, open_raw, send
from .workdir import lab_dir

log = logging.getLogger(__name__)

SRC_MAC = "02:00:00:00:aa:01"


class SwitchLab:
    def __init__(self, name: str = "rlbd", links: int = 4, speed_mbps: int | None = None):
        self.name, self.n, self.speed = name, links, speed_mbps
        self.src, self.sw, self.dst = f"{name}-src", f"{name}-sw", f"{name}-dst"
        self.agent: subprocess.Popen | None = None
        self.log_path = lab_dir(name) / "agent.log"
        self._sock = None

    # ---- lifecycle ------------------------------------------------------------------
    def up(self):
        self.down(quiet=True)
        self.log_path.unlink(missing_ok=True)
        for ns in (self.src, self.sw, self.dst):
            topo.add_ns(ns)
            topo.sysctl(ns, "net.ipv6.conf.all.accept_dad", "0")
            topo.sysctl(ns, "net.ipv6.conf.default.accept_dad", "0")
        topo.sysctl(self.sw, "net.ipv6.conf.all.forwarding", "1")
        topo.link(self.src, "eth0", self.sw, "h1", mac_a=SRC_MAC)
        for k in self.uplinks():
            topo.link(self.sw, f"up{k}", self.dst, f"sw{k}")
        self.start_agent()
        return self

    def uplinks(self):
        return range(1, self.n + 1)

    def start_agent(self, timeout: float = 30.0, extra: tuple[str, ...] = (), env: dict | None = None):
        """Start `rlbswitch run` (attaching every port; `extra` arguments, `env` added to the
        environment) and wait until it follows netlink."""
        ports = ["h1"] + [f"up{k}" for k in self.uplinks()]
        cmd = [*confined([sys.executable], AGENT_CAPS), "-m", "rlbswitch", "--netns", self.sw, "run", *ports,
               "--metrics-port", "9471"] + (["--speed-mbps", str(self.speed)] if self.speed else []) + list(extra)
        start = self.log_path.stat().st_size if self.log_path.exists() else 0
        with open(self.log_path, "a") as log_file:
            self.agent = subprocess.Popen(cmd, stdout=log_file, stderr=subprocess.STDOUT,
                                          env={**os.environ, **(env or {})})
        deadline = time.time() + timeout
        while time.time() < deadline:
            if "following links" in self.log_path.read_text()[start:]:
                return
            if self.agent.poll() is not None:
                raise RuntimeError(f"agent exited: {self.log_path.read_text()[-2000:]}")
            time.sleep(0.1)
        raise TimeoutError(f"agent did not start: {self.log_path.read_text()[-2000:]}")

    def logged_at(self, text: str, after: float = 0.0) -> float | None:
        """The wall-clock time of the agent's first log line containing `text` stamped at or
        after `after` (its log stamps are local time, to the millisecond); None if none is."""
        for line in self.log_path.read_text().splitlines():
            if text not in line:
                continue
            try:
                stamp = datetime.datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()
            except ValueError:
                continue
            if stamp >= after - 0.001:
                return stamp
        return None

    def kill_agent(self):
        if self.agent and self.agent.poll() is None:
            self.agent.kill()
            self.agent.wait()
        self.agent = None

    def down(self, quiet: bool = False):
        self.kill_agent()
        if self._sock:
            self._sock.close()
            self._sock = None
        if self.sw in topo.list_ns():
            with netns.inside(self.sw):
                SwitchDataplane(self.sw).destroy()
        for ns in (self.src, self.sw, self.dst):
            topo.del_ns(ns)

    def __enter__(self):
        return self.up()

    def __exit__(self, *exc):
        self.down()

    # ---- programming ----------------------------------------------------------------
    @contextlib.contextmanager
    def dataplane(self):
        with netns.inside(self.sw):
            dp = SwitchDataplane(self.sw)
            try:
                yield dp
            finally:
                dp.close()

    def cli(self, *args: str) -> str:
        res = subprocess.run([sys.executable, "-m", "rlbswitch", "--netns", self.sw, *args],
                             capture_output=True, text=True)
        if res.returncode:
            raise RuntimeError(f"rlbswitch {' '.join(args)}: {res.stderr.strip()}")
        return res.stdout

    def nexthop(self, k: int, weight: int = 1) -> str:
        ll = topo.link_local(self.dst, f"sw{k}")
        return f"{ll}%up{k}" + (f"={weight}" if weight != 1 else "")

    def wait_resolved(self, timeout: float = 10.0):
        """Until every next hop has a MAC (the agent learns them from netlink)."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            with self.dataplane() as dp:
                nhs = dp.stats()["nexthops"]
            if nhs and all(n["resolved"] for n in nhs):
                return
            time.sleep(0.05)
        raise TimeoutError(f"next hops unresolved: {nhs}")

    # ---- traffic and counters -------------------------------------------------------
    def link_packets(self) -> dict[int, int]:
        return {k: topo.counters(self.dst, f"sw{k}")["rx_packets"] for k in self.uplinks()}

    def send(self, flows: list[Flow], packets_per_flow: int, **kw) -> int:
        if self._sock is None:
            self._sock = open_raw(self.src, "eth0")
        return send(self._sock, flows, packets_per_flow, dmac=topo.mac(self.sw, "h1"),
                    smac=SRC_MAC, **kw)

    def measure(self, flows: list[Flow], packets_per_flow: int, settle: float = 0.2, **kw):
        """Send and return per-link packet deltas (kernel counters on the far side)."""
        before = self.link_packets()
        sent = self.send(flows, packets_per_flow, **kw)
        time.sleep(settle)
        after = self.link_packets()
        return sent, {k: after[k] - before[k] for k in self.uplinks()}


def qp_flows(n: int, dst_prefix: str = "fc00:2::", src: str = "fc00:1::1", base_port: int = 49152,
             same_dst: bool = True) -> list[Flow]:
    """n QPs between two GPUs: same addresses and port 4791, random-ish source ports and QPs."""
    import random
    rnd = random.Random(n)
    return [Flow(src, f"{dst_prefix}1" if same_dst else f"{dst_prefix}{i + 1:x}",
                 base_port + rnd.randrange(16384), rnd.randrange(1, 1 << 24)) for i in range(n)]

