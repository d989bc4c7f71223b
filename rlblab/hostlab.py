"""Two GPU hosts behind a plain kernel router that advertises one /64 per path to each by RA
(bird2 radv): real SLAAC, real TC programs, real kernel routing.

    [h1] eth0 --- eth-h1 [r] eth-h2 --- eth0 [h2]
    h1: fc00:1:1:<path>::/64      h2: fc00:1:2:<path>::/64

With nics=N each host is a GPU server of N NICs, NIC i (eth<i>) on router port e-h<k>-<i> with
prefixes fc00:<i+1>:<k>:<path>::/64 (the address plan's leaf i+1: a rail each), and what a NIC
sends from its addresses leaves through it (source routing, as rlbfabric renders for servers)."""
from __future__ import annotations

import ipaddress
import json
import os
import subprocess
import sys
import time

from rlbcommon.netns import run
from rlbdeploy.units import AGENT_CAPS, confined

from . import topo
from .bird import Bird, radv_config
from .workdir import lab_dir


class HostLab:
    def __init__(self, name: str = "rlbhl", paths: int = 4, nics: int = 1):
        self.name, self.n, self.nics = name, paths, nics
        self.r, self.h = f"{name}-r", {1: f"{name}-h1", 2: f"{name}-h2"}
        self.work = lab_dir(name)
        self.bird: Bird | None = None
        self.agents: dict[int, subprocess.Popen] = {}

    def nic(self, i: int) -> str:
        return f"eth{i}"

    def router_port(self, host: int, i: int) -> str:
        return f"eth-h{host}" if self.nics == 1 else f"e-h{host}-{i}"

    def up(self, timeout: float = 30.0):
        self.down()
        for ns in (self.r, *self.h.values()):
            topo.add_ns(ns)
        topo.sysctl(self.r, "net.ipv6.conf.all.forwarding", "1")
        for k, ns in self.h.items():
            topo.sysctl(ns, "net.ipv6.conf.default.accept_dad", "0")
            for i in range(self.nics):
                topo.link(ns, self.nic(i), self.r, self.router_port(k, i))
                for p in range(1, self.n + 1):
                    run(self.r, "ip", "addr", "add", f"fc00:{i + 1}:{k}:{p}::1/64", "dev", self.router_port(k, i),
                        "nodad")
                if self.nics > 1:
                    table = str(1000 + i)
                    run(ns, "ip", "-6", "route", "replace", "default", "via", f"fc00:{i + 1}:{k}:1::1", "dev",
                        self.nic(i), "onlink", "table", table)
                    run(ns, "ip", "-6", "rule", "add", "from", f"fc00:{i + 1}:{k}::/48", "table", table,
                        "priority", table)
        self.bird = Bird(self.r, radv_config([self.router_port(k, i) for k in self.h for i in range(self.nics)]),
                         self.work)
        self.bird.start()
        deadline = time.time() + timeout
        while any(len(self.addresses(k, i)) < self.n for k in self.h for i in range(self.nics)):
            if time.time() > deadline:
                raise TimeoutError(f"SLAAC incomplete: {[self.addresses(k) for k in self.h]}")
            time.sleep(0.2)
        return self

    def addresses(self, host: int, nic: int = 0) -> dict[int, str]:
        """{path: address} the host (its NIC `nic`) got by SLAAC (DAD finished)."""
        out = json.loads(run(self.h[host], "ip", "-6", "-j", "addr", "show", "dev", self.nic(nic), "scope", "global"))
        addrs = {}
        for a in (out[0].get("addr_info", []) if out else []):
            if a.get("tentative") or "local" not in a:   # ip -j also lists bare lifetime rows
                continue
            ip = ipaddress.IPv6Address(a["local"])
            addrs[int.from_bytes(ip.packed[6:8], "big")] = str(ip)
        return addrs

    def base(self, host: int, nic: int = 0) -> str:
        return self.addresses(host, nic)[1]

    def start_agent(self, host: int, *extra: str, timeout: float = 30.0, env: dict | None = None):
        log = self.work / f"agent-h{host}.log"
        start = log.stat().st_size if log.exists() else 0
        with open(log, "a") as f:
            self.agents[host] = subprocess.Popen(
                [*confined([sys.executable], AGENT_CAPS), "-m", "rlbhost", "--netns", self.h[host], "attach",
                 *(self.nic(i) for i in range(self.nics)), *extra],
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
