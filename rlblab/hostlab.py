"""Two GPU hosts behind a plain kernel router that advertises one /64 per path to each by RA
(bird2 radv): real SLAAC, real TC programs, real kernel routing.

    [h1] eth0 --- eth-h1 [r] eth-h2 --- eth0 [h2]
    h1: fc00:1:1:<path>::/64      h2: fc00:1:2:<path>::/64"""
from __future__ import annotations

import ipaddress
import json
import os
import subprocess
import sys
import time

from rlbcommon.netns import run
from rlbfabric.deploy import AGENT_CAPS, confined

from . import topo
from .bird import Bird, radv_config
from .workdir import lab_dir


class HostLab:
    def __init__(self, name: str = "rlbhl", paths: int = 4):
        self.name, self.n = name, paths
        self.r, self.h = f"{name}-r", {1: f"{name}-h1", 2: f"{name}-h2"}
        self.work = lab_dir(name)
        self.bird: Bird | None = None
        self.agents: dict[int, subprocess.Popen] = {}

    def up(self, timeout: float = 30.0):
        self.down()
        for ns in (self.r, *self.h.values()):
            topo.add_ns(ns)
        topo.sysctl(self.r, "net.ipv6.conf.all.forwarding", "1")
        for k, ns in self.h.items():
            topo.sysctl(ns, "net.ipv6.conf.default.accept_dad", "0")
            topo.link(ns, "eth0", self.r, f"eth-h{k}")
            for p in range(1, self.n + 1):
                run(self.r, "ip", "addr", "add", f"fc00:1:{k}:{p}::1/64", "dev", f"eth-h{k}", "nodad")
        self.bird = Bird(self.r, radv_config([f"eth-h{k}" for k in self.h]), self.work)
        self.bird.start()
        deadline = time.time() + timeout
        while any(len(self.addresses(k)) < self.n for k in self.h):
            if time.time() > deadline:
                raise TimeoutError(f"SLAAC incomplete: {[self.addresses(k) for k in self.h]}")
            time.sleep(0.2)
        return self

    def addresses(self, host: int) -> dict[int, str]:
        """{path: address} the host got by SLAAC (DAD finished)."""
        out = json.loads(run(self.h[host], "ip", "-6", "-j", "addr", "show", "dev", "eth0", "scope", "global"))
        addrs = {}
        for a in (out[0].get("addr_info", []) if out else []):
            if a.get("tentative") or "local" not in a:   # ip -j also lists bare lifetime rows
                continue
            ip = ipaddress.IPv6Address(a["local"])
            addrs[int.from_bytes(ip.packed[6:8], "big")] = str(ip)
        return addrs

    def base(self, host: int) -> str:
        return self.addresses(host)[1]

    def start_agent(self, host: int, *extra: str, timeout: float = 30.0, env: dict | None = None):
        log = self.work / f"agent-h{host}.log"
        start = log.stat().st_size if log.exists() else 0
        with open(log, "a") as f:
            self.agents[host] = subprocess.Popen(
                [*confined([sys.executable], AGENT_CAPS), "-m", "rlbhost", "--netns", self.h[host], "attach",
                 "eth0", *extra],
                stdout=f, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})})
        deadline = time.time() + timeout
        while "following addresses" not in log.read_text()[start:]:
            if self.agents[host].poll() is not None or time.time() > deadline:
                raise RuntimeError(f"rlbhost on h{host} did not start: {log.read_text()[-1500:]}")
            time.sleep(0.1)

    def kill_agent(self, host: int):
        p = self.agents.pop(host, None)
        if p and p.poll() is None:
            p.kill()
            p.wait()

    def cli(self, host: int, *args: str) -> str:
        res = subprocess.run([sys.executable, "-m", "rlbhost", "--netns", self.h[host], *args],
                             capture_output=True, text=True)
        if res.returncode:
            raise RuntimeError(f"rlbhost {' '.join(args)}: {res.stderr.strip()}")
        return res.stdout

    def detach(self, host: int):
        self.kill_agent(host)
        if self.h[host] in topo.list_ns():
            subprocess.run([sys.executable, "-m", "rlbhost", "--netns", self.h[host], "detach", "--all"],
                           capture_output=True)

    def down(self):
        for k in list(self.h):
            self.detach(k)
        if self.bird:
            self.bird.stop()
        for ns in (self.r, *self.h.values()):
            topo.del_ns(ns)

    def __enter__(self):
        return self.up()

    def __exit__(self, *exc):
        self.down()
