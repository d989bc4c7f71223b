"""A leaf-spine fabric in network namespaces, built from a fabric description file: bird2 in every
switch (rendered by rlbswitch), `rlbswitch run` on every switch, GPU hosts with real SLAAC from
the leaves' RAs and, optionally, `rlbhost` on them.

    leaf L port eth-S  <-> spine S port eth-L      leaf L port eth-H <-> host H eth0
    leaf L port eth-A  <-> server A port gpuN_eth  (a GPU server: one namespace, a NIC per rail leaf)
Namespace names: <lab>-<node>; a server's NICs are hosts of the fabric (<server>-<nic>) in the
server's namespace."""
from __future__ import annotations

import json
import random
import secrets
import shutil
import subprocess
import sys
import time
from pathlib import Path

from rlbcommon import coordapi, netns
from rlbcommon.coordapi import url_for
from rlbcommon.etcd import Etcd
from rlbcommon.netns import run
from rlbfabric.bird.conf import initial_includes, render
from rlbcoord import etcdauth, etcdtls, keys
from rlbcoord.shards import Shard
from rlbdeploy.units import AGENT_CAPS, COORDINATOR_CAPS, confined
from rlbfabric.fabric import Fabric, load
from rlbfabric.frr.conf import render_spine as render_frr_spine
from rlbdeploy.scrape import scrape_config
from rlbhost.dataplane import HostDataplane
from rlbswitch.dataplane import SwitchDataplane
from rlbmonitor.alerts import write as write_rules

from . import topo
from .bird import Bird
from .frr import Frr, stop_all as frr_stop_all
from .etcdserver import EtcdServer, data_dir
from .traffic import Flow, QpRun, open_raw, send
from .workdir import lab_dir


class FabricLab:
    KIND = "clos"
    OPTIONS = ("hosts_agent", "mode", "shape", "monitor", "coordinator", "etcd", "shards",    # what open_lab passes on
               "coordinator_tls")
    ETCD_PORT = 2379
    MGMT = "fd00:99::"
    HOST_IF = "eth0"      # where rlbhost is attached on a host

    def __init__(self, fabric_file: str | Path, name: str = "rlbf", hosts_agent: bool = True,
                 mode: str = "rlb", shape: bool = False, monitor: bool = False, coordinator: bool = True,
                 etcd: bool = False, shards: int = 1, coordinator_tls: bool = False):
        """mode "rlb": XDP switches fed by bird, rlbhost on hosts. mode "baseline": the same
        fabric as people run it today: bird merges equal paths into kernel ECMP routes, the
        kernel forwards with fib_multipath_hash_policy=1, no XDP, no rlbhost.
        shape: tbf on every fabric link at its fabric-file rate (real bandwidth for kernel
        forwarding; XDP-redirected frames bypass qdiscs).
        coordinator (rlb mode): rlbcoord in <lab>-mon on the management network, host agents
        reporting to it, leaves telling it their uplinks; without it hosts use the local rule.
        etcd (with the coordinator): an etcd member in <lab>-mon, every host, leaf and the
        coordinators an etcd user of their own (rlbfabric etcd-users), two coordinators of which
        one leads; hosts and leaves write there instead of reporting over HTTP. As a site runs
        it: TLS only, each machine with a client certificate of the lab's CA (rlbfabric
        etcd-tls), its password its identity.
        shards (with etcd): placement split over that many shards of the leaves (rlbcoord run
        --shard K/N), two coordinators each, one of which leads its shard.
        coordinator_tls (over HTTP): HTTPS, each host and leaf showing its machine certificate
        of the lab's CA (rlbfabric etcd-tls --coordinator), so each reports for itself alone."""
        if mode not in ("rlb", "baseline"):
            raise ValueError(f"mode {mode!r}: rlb or baseline")
        self.fabric_file = Path(fabric_file).resolve()
        self.fabric: Fabric = load(self.fabric_file)
        self.fabric.bgp.password = secrets.token_hex(16)     # TCP MD5 on every session of the lab
        self.name, self.mode, self.shape, self.monitor = name, mode, shape, monitor
        self.hosts_agent = hosts_agent and mode == "rlb"
        self.coordinator = coordinator and self.hosts_agent
        self.etcd = etcd and self.coordinator
        self.coordinator_tls = coordinator_tls and self.coordinator and not self.etcd
        if self.coordinator_tls and monitor:
            raise ValueError("coordinator_tls with monitor: the lab's Prometheus scrapes the coordinator over http")
        if shards != 1 and not self.etcd:
            raise ValueError("shards of placement need the coordinator on etcd")
        self.shards = shards
        if shards > 1:
            Shard(1, shards).leaves(self.fabric)     # more shards than leaves: refused here
        # with etcd: two coordinators a shard, c1 c2 ... dealt to the shards in turn
        self.coordinators = [f"c{i}" for i in range(1, 2 * shards + 1)]
        self.work = lab_dir(name)
        self.birds: dict[str, Bird] = {}
        self.frrs: dict[str, Frr] = {}     # spines of another make (daemon = "frr")
        self.agents: dict[str, subprocess.Popen] = {}

    def ns(self, node: str) -> str:
        return f"{self.name}-{node}"

    @property
    def switches(self):
        return self.fabric.switches

    @property
    def hosts(self) -> list[str]:
        """Where QPs start and end: one-NIC hosts and each NIC of a server (<server>-<nic>)."""
        return self.fabric.hosts

    @property
    def machines(self) -> list[str]:
        """One namespace and one agent each: one-NIC hosts and servers."""
        return self.fabric.machines

    def host_ns(self, host: str) -> str:
        """The namespace a host (a server's NIC: its server's) lives in."""
        return self.ns(self.fabric.machine_of(host))

    def host_if(self, host: str) -> str:
        """A host's fabric interface: eth0 on a one-NIC host, the NIC's own name on a server."""
        return self.fabric.host_port(host) if self.fabric.machine_of(host) != host else self.HOST_IF

    def leaf_port(self, host: str) -> tuple[str, str]:
        """(leaf, the leaf's port towards the host)."""
        leaf, port = self.fabric.leaf_of_host(host)
        return leaf.name, self.fabric.host_ports(leaf)[port - 1][2]

    def host_dataplane(self, host: str):
        """The host's data plane as its agent keeps it (a server's: its NIC's own)."""
        nic = self.host_if(host) if self.fabric.machine_of(host) != host else None
        return HostDataplane(self.host_ns(host), nic)

    @property
    def mgmt(self) -> bool:
        """A management network exists for Prometheus and the coordinator."""
        return self.monitor or self.coordinator

    @property
    def coordinator_url(self) -> str:
        """The coordinator's API (with etcd: the first one's; leader_url() finds the leader)."""
        return url_for(f"{self.MGMT}1", https=self.coordinator_tls)

    @property
    def coord_creds(self) -> Path:
        """With coordinator_tls: the lab's CA, the machines' and the coordinator's certificates."""
        return self.work / "coord-creds"

    @property
    def coordinator_ca(self) -> Path | None:
        return etcdtls.ca_file(self.coord_creds) if self.coordinator_tls else None

    def coordinator_args(self, user: str) -> list[str]:
        """What an agent reporting over HTTP as `user` is given."""
        args = ["--coordinator", self.coordinator_url]
        if self.coordinator_tls:
            args += ["--coordinator-ca", str(self.coordinator_ca),
                     "--coordinator-cert", str(etcdtls.client_file(self.coord_creds, user))]
        return args

    def coordinator_urls(self) -> dict[str, str]:
        if not self.etcd:
            return {"coordinator": self.coordinator_url}
        return {f"coordinator-{c}": url_for(f"{self.MGMT}1", coordapi.DEFAULT_PORT + i)
                for i, c in enumerate(self.coordinators)}

    def shard_of(self, coordinator: str) -> Shard:
        """The shard a coordinator (c1, c2, ...) places."""
        return Shard(self.coordinators.index(coordinator) % self.shards + 1, self.shards)

    @property
    def etcd_url(self) -> str:
        return f"https://[{self.MGMT}1]:{self.ETCD_PORT}"

    @property
    def etcd_creds(self) -> Path:
        """Passwords, and the CA and certificates (etcdtls.py): what a site copies to each machine."""
        return self.work / "etcd-creds"

    def etcd_args(self, user: str) -> list[str]:
        """What an agent running as etcd `user` is given."""
        return ["--etcd", self.etcd_url,
                "--etcd-password-file", str(etcdauth.password_file(self.etcd_creds, user)),
                "--etcd-ca", str(etcdtls.ca_file(self.etcd_creds)),
                "--etcd-cert", str(etcdtls.client_file(self.etcd_creds, user))]

    def etcd_client(self, user: str, timeout: float = 2.0) -> Etcd:
        """An etcd client as `user`, as its agent connects."""
        return etcdauth.client(self.etcd_url, user, etcdauth.password_file(self.etcd_creds, user),
                               etcdtls.ca_file(self.etcd_creds), etcdtls.client_file(self.etcd_creds, user),
                               timeout=timeout)

    def namespaces(self) -> list[str]:
        return [self.ns(n.name) for n in self.switches] + [self.ns(h) for h in self.machines] + [self.ns("mon")]

    def mgmt_addr(self, node: str) -> str:
        """Management address: agents' metrics bind here, Prometheus (in <lab>-mon) scrapes it."""
        names = [n.name for n in self.switches] + self.machines
        return f"{self.MGMT}{names.index(node) + 2:x}"

    def _mgmt_network(self):
        mon = self.ns("mon")
        topo.add_ns(mon)
        run(mon, "ip", "link", "add", "br-mgmt", "type", "bridge")
        run(mon, "ip", "addr", "add", f"{self.MGMT}1/64", "dev", "br-mgmt", "nodad")
        run(mon, "ip", "link", "set", "br-mgmt", "up")
        for node in [n.name for n in self.switches] + self.machines:
            topo.link(self.ns(node), "mgmt0", mon, f"m-{node}")
            run(mon, "ip", "link", "set", f"m-{node}", "master", "br-mgmt")
            run(self.ns(node), "ip", "addr", "add", f"{self.mgmt_addr(node)}/64", "dev", "mgmt0", "nodad")

    # ---- lifecycle ------------------------------------------------------------------
    def up(self, timeout: float = 60.0):
        self._namespaces_up()
        if self.etcd:
            self.start_etcd()
        if self.coordinator:
            self.start_coordinator()
        for sw in self.switches:
            topo.sysctl(self.ns(sw.name), "net.ipv6.conf.all.forwarding", "1")
            if self.mode == "baseline":
                topo.sysctl(self.ns(sw.name), "net.ipv6.fib_multipath_hash_policy", "1")
        for node in self.fabric.leaves + self.fabric.spines:
            for port in self.fabric.ports_up(node):
                up = port.peer
                topo.link(self.ns(node.name), port.ifname, self.ns(up.name), port.peer_ifname)
                if self.shape:
                    mbps = self.fabric.link_mbps_between(node.name, up.name)
                    for ns, ifname in ((self.ns(node.name), port.ifname), (self.ns(up.name), port.peer_ifname)):
                        run(ns, "tc", "qdisc", "add", "dev", ifname, "root", "tbf", "rate", f"{mbps}mbit",
                            "burst", "64kb", "latency", "50ms")
        for leaf in self.fabric.leaves:
            for port, host, ifname in self.fabric.host_ports(leaf):
                topo.link(self.ns(leaf.name), ifname, self.host_ns(host), self.host_if(host))
                for net in self.fabric.host_prefixes(leaf, port):
                    run(self.ns(leaf.name), "ip", "addr", "add", f"{net.network_address + 1}/64",
                        "dev", ifname, "nodad")
        for server, nics in self.fabric.servers.items():
            if len(nics) > 1:          # what a NIC originates leaves through it (rlb-net does the same)
                for i, h in enumerate(nics):
                    for cmd in self.fabric.nic_routing(h, i):
                        run(self.ns(server), *cmd)
        for sw in self.switches:
            if self.fabric.node(sw.name).daemon == "frr":
                self.start_frr(sw.name)
                continue
            for inc, body in initial_includes(self.fabric, sw, self.work).items():
                inc.write_text(body)   # overwritten: an earlier lab's neighbours are stale
            bird = Bird(self.ns(sw.name), render(self.fabric, sw.name, self.work, self.mode == "baseline"),
                        self.work, name=sw.name)
            bird.start()
            self.birds[sw.name] = bird
            self.start_agent(sw.name)
        if self.hosts_agent:
            self.wait_slaac(timeout)
            for m in self.machines:
                self.start_host_agent(m)
        return self

    def start_frr(self, node: str):
        """A spine of another make: FRR with the configuration rlbfabric renders for it; the kernel
        forwards, nothing of RLB runs there."""
        frr = Frr(self.ns(node), self.name, node, bfd=self.fabric.bfd)
        frr.write(render_frr_spine(self.fabric, self.fabric.node(node), frr.log))
        frr.start()
        self.frrs[node] = frr

    def _namespaces_up(self, keep_addr_on_down: bool = False):
        """A clean start: every namespace, DAD off (fast restore on link-up), the management
        network if there is one."""
        self.down()
        self.work.mkdir(parents=True, exist_ok=True)
        for ns in self.namespaces():
            topo.add_ns(ns)
            for key in ("all", "default"):
                topo.sysctl(ns, f"net.ipv6.conf.{key}.accept_dad", "0")
                if keep_addr_on_down:
                    topo.sysctl(ns, f"net.ipv6.conf.{key}.keep_addr_on_down", "1")
        if self.mgmt:
            self._mgmt_network()

    def ports(self, node: str) -> list[str]:
        return self.fabric.switch_ports(self.fabric.node(node))

    def _spawn(self, key: str, cmd: list[str], ready: str, timeout: float = 30.0):
        self._await(key, *self._launch(key, cmd), ready, timeout)

    def _launch(self, key: str, cmd: list[str]) -> tuple[Path, int]:
        """Start an agent logging to <work>/agent-<key>.log; returns the log and where this run's
        lines start in it."""
        log = self.work / f"agent-{key}.log"
        start = log.stat().st_size if log.exists() else 0
        with open(log, "a") as f:   # own session: a lab outlives the command that started it
            self.agents[key] = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT,
                                                start_new_session=True)
        return log, start

    def _await(self, key: str, log: Path, start: int, ready: str, timeout: float):
        """Until the agent logs `ready` (or dies, or the time is up: then its log's end is raised)."""
        deadline = time.time() + timeout
        while ready not in log.read_text()[start:]:
            if self.agents[key].poll() is not None or time.time() > deadline:
                raise RuntimeError(f"agent {key} did not start: {log.read_text()[-1500:]}")
            time.sleep(0.1)

    def wait_for(self, cond, timeout: float, what: str):
        deadline = time.time() + timeout
        while not cond():
            if time.time() > deadline:
                raise TimeoutError(f"waited {timeout:g} s for {what}")
            time.sleep(0.2)

    def start_agent(self, node: str, extra: tuple[str, ...] = ()):
        """A switch's agent; `extra`: more `rlbswitch run` options (a test's)."""
        cmd = [*confined([sys.executable], AGENT_CAPS), "-m", "rlbswitch", "--netns", self.ns(node), "run", *self.ports(node),
               "--fabric", str(self.fabric_file), "--node", node, "--run-dir", str(self.work),
               "--speed-mbps", str(self.fabric.link_mbps), *extra]
        if self.mode == "baseline":
            cmd += ["--control-only"]
        if self.monitor:
            cmd += ["--metrics-addr", self.mgmt_addr(node)]
        if self.etcd and self.fabric.node(node).role == "leaf":
            cmd += self.etcd_args(keys.switch_user(node))
        elif self.coordinator and self.fabric.node(node).role == "leaf":
            cmd += self.coordinator_args(keys.switch_user(node))
        self._spawn(node, cmd, "following links")

    def start_host_agent(self, host: str):
        """The agent of a host, or of a server (every NIC the fabric file gives it)."""
        nics = [] if self.fabric.is_server(host) else [self.HOST_IF]
        cmd = [*confined([sys.executable], AGENT_CAPS), "-m", "rlbhost", "--netns", self.ns(host), "attach",
               *nics, "--fabric", str(self.fabric_file), "--node", host]
        if self.monitor:
            cmd += ["--metrics-addr", self.mgmt_addr(host)]
        if self.etcd:
            cmd += [*self.etcd_args(keys.host_user(host)), "--report-ms", "100"]
        elif self.coordinator:
            cmd += self.coordinator_args(keys.host_user(host))
        self._spawn(host, cmd, "following addresses")

    def start_etcd(self):
        """One etcd member in <lab>-mon on the management network (a fresh store: an earlier
        lab's users and keys would linger), its CA and certificates first, then a user per host,
        leaf and coordinator."""
        shutil.rmtree(self.etcd_creds, ignore_errors=True)
        etcdtls.issue(self.fabric, self.etcd_creds, [f"{self.MGMT}1"])
        server = EtcdServer(self.work, f"{self.MGMT}1", self.ETCD_PORT, self.ETCD_PORT + 1,
                            netns=self.ns("mon"), fast=True, tls=self.etcd_creds)
        shutil.rmtree(server.data, ignore_errors=True)
        with netns.inside(self.ns("mon")):
            server.start()
            self.agents["etcd"] = server.proc
            etcdauth.issue(self.fabric, [self.etcd_url], self.etcd_creds, tls=server.client_tls())
        self.etcd_server = server

    def start_coordinator(self, which: str | None = None):
        """rlbcoord in <lab>-mon, listening on the management network's first address, with the
        capabilities its unit gives it (none). With etcd: each of the coordinators (or `which`) on
        a port of its own, following etcd as the coordinators' user."""
        for key, url in self.coordinator_urls().items():
            name = key.split("-", 1)[-1]
            if which is not None and name != which:
                continue
            args = [sys.executable, "-m", "rlbcoord.cli", "run", "--fabric", str(self.fabric_file),
                    "--listen", f"{self.MGMT}1", "--port", url.rsplit(":", 1)[1]]
            if self.etcd:
                args += [*self.etcd_args(keys.COORDINATOR_USER), "--name", name, "--lease-ttl-s", "1"]
                if self.shards > 1:
                    args += ["--shard", str(self.shard_of(name))]
            elif self.coordinator_tls:
                if not etcdtls.coordinator_file(self.coord_creds).exists():
                    etcdtls.issue(self.fabric, self.coord_creds, [f"{self.MGMT}1"])
                    etcdtls.issue_coordinator(self.coord_creds, [f"{self.MGMT}1"])
                args += ["--tls-cert", str(etcdtls.coordinator_file(self.coord_creds)),
                         "--tls-ca", str(self.coordinator_ca)]
            self._spawn(key, ["ip", "netns", "exec", self.ns("mon"), *confined(args, COORDINATOR_CAPS)],
                        "listening on")

    def coordinator_status(self, key: str | None = None) -> dict:
        """The coordinator's status (with etcd: the leader's, or `key`'s)."""
        with netns.inside(self.ns("mon")):
            urls = self.coordinator_urls()
            tls = coordapi.client_tls(self.coordinator_url, self.coordinator_ca)
            if key is not None:
                return coordapi.call(urls[key], coordapi.STATUS, tls=tls)
            statuses = []
            for k, url in urls.items():
                try:
                    statuses.append(coordapi.call(url, coordapi.STATUS, timeout=1.0, tls=tls))
                except coordapi.CoordinatorError:
                    continue
            if not statuses:
                raise coordapi.CoordinatorError(f"no coordinator of lab {self.name} answers")
            return next((s for s in statuses if s.get("etcd", {}).get("leading")), statuses[0])

    def leading_coordinator(self) -> str | None:
        """With etcd: the key (coordinator-c1, ...) of the one leading now (of some shard)."""
        return next(iter(self.leading_coordinators()), None)

    def leading_coordinators(self) -> list[str]:
        """With etcd: the keys of those leading now, one a shard when all is well."""
        out = []
        for key in self.coordinator_urls():
            try:
                if self.coordinator_status(key).get("etcd", {}).get("leading"):
                    out.append(key)
            except coordapi.CoordinatorError:
                continue
        return out

    def start_prometheus(self, port: int = 9090):
        """A real Prometheus (Debian's) in <lab>-mon scraping every agent every second; its API
        is on 127.0.0.1:<port> inside that namespace. Called again, it starts afresh (one
        Prometheus per lab: a second would find the port taken)."""
        self.kill_agent("prometheus")
        targets = {n.name: (self.mgmt_addr(n.name), n.role) for n in self.switches}
        if self.hosts_agent:
            targets.update({h: (self.mgmt_addr(h), "host") for h in self.machines})
        if self.coordinator:                    # with etcd, each: the leader and the standby
            targets.update({key: (f"{self.MGMT}1", "coordinator", int(url.rsplit(":", 1)[1]))
                            for key, url in self.coordinator_urls().items()})
        conf = self.work / "prometheus.yml"
        conf.write_text(scrape_config(targets, rule_files=[str(write_rules(self.work))]))
        shutil.rmtree(self.work / "prometheus", ignore_errors=True)   # an earlier lab's series would linger
        cmd = ["ip", "netns", "exec", self.ns("mon"), "prometheus", f"--config.file={conf}",
               f"--storage.tsdb.path={self.work / 'prometheus'}", f"--web.listen-address=127.0.0.1:{port}"]
        self._spawn("prometheus", cmd, "Server is ready to receive web requests")

    def kill_agent(self, key: str):
        p = self.agents.pop(key, None)
        if p and p.poll() is None:
            p.kill()
            p.wait()

    def stop_agent(self, key: str, timeout: float = 10.0):
        """Stopped as `systemctl stop` does: SIGTERM, and the agent exits on its own."""
        p = self.agents.pop(key, None)
        if p and p.poll() is None:
            p.terminate()
            p.wait(timeout)

    def down(self):
        for key in list(self.agents):
            self.kill_agent(key)
        for b in self.birds.values():
            b.stop()
        self.birds = {}
        frr_stop_all(self.name)           # also an earlier process's: FRR's daemons run detached
        self.frrs = {}
        for b in self.work.glob("*.ctl") if self.work.exists() else []:
            b.unlink(missing_ok=True)
        # etcd's store and the lab's keys have no use once it is down (the next up makes fresh
        # ones), and etcd's WAL alone is 64 MB of /run's memory; the logs stay, to read what happened
        for d in (data_dir(self.work), self.etcd_creds, self.coord_creds):
            shutil.rmtree(d, ignore_errors=True)
        existing = set(topo.list_ns())
        for sw in self.switches:
            if self.ns(sw.name) in existing:
                subprocess.run([sys.executable, "-m", "rlbswitch", "--netns", self.ns(sw.name), "detach", "--all"],
                               capture_output=True)
        for h in self.machines:
            if self.ns(h) in existing:
                subprocess.run([sys.executable, "-m", "rlbhost", "--netns", self.ns(h), "detach", "--all"],
                               capture_output=True)
        for ns in self.namespaces():
            topo.del_ns(ns)

    def __enter__(self):
        return self.up()

    def __exit__(self, *exc):
        self.down()

    # ---- state ----------------------------------------------------------------------
    def host_addresses(self, host: str) -> dict[int, str]:
        """{path: address} of a host (a server's NIC)."""
        out = json.loads(run(self.host_ns(host), "ip", "-6", "-j", "addr", "show", "dev", self.host_if(host),
                             "scope", "global"))
        addrs = {}
        for a in (out[0].get("addr_info", []) if out else []):
            if "local" in a and not a.get("tentative"):
                addrs[int(a["local"].split(":")[3], 16)] = a["local"]
        return addrs

    def wait_slaac(self, timeout: float = 60.0):
        deadline = time.time() + timeout
        while any(len(self.host_addresses(h)) < self.fabric.paths for h in self.hosts):
            if time.time() > deadline:
                raise TimeoutError({h: self.host_addresses(h) for h in self.hosts})
            time.sleep(0.2)

    def cli(self, node: str, *args: str) -> str:
        tool = "rlbhost" if node in self.machines else "rlbswitch"
        res = subprocess.run([sys.executable, "-m", tool, "--netns", self.ns(node), *args],
                             capture_output=True, text=True)
        if res.returncode:
            raise RuntimeError(f"{tool} {' '.join(args)}: {res.stderr.strip()}")
        return res.stdout

    def routes(self, node: str) -> dict[str, dict]:
        return {r["prefix"]: r for r in json.loads(self.cli(node, "route", "show", "--json"))}

    def wait_converged(self, timeout: float = 60.0):
        """Until every leaf has a pinned route for every remote host prefix."""
        want = {leaf.name: {str(net) for lf, _, _, net in self.fabric.all_prefixes() if lf is not leaf}
                for leaf in self.fabric.leaves}
        deadline = time.time() + timeout
        while True:
            missing = {leaf: sorted(nets - self._programmed(leaf)) for leaf, nets in want.items()}
            if not any(missing.values()):
                return
            if time.time() > deadline:
                raise TimeoutError(f"not converged: {missing}")
            time.sleep(0.3)

    def _programmed(self, leaf: str) -> set[str]:
        """Remote prefixes the leaf forwards: XDP routes (rlb), or kernel ECMP routes over every
        uplink (baseline)."""
        if self.mode == "rlb":
            return {p for p, r in self.routes(leaf).items() if r["mode"] != "connected"}
        n_up = len(self.fabric.uplinks(self.fabric.node(leaf)))
        out = set()
        for r in json.loads(run(self.ns(leaf), "ip", "-6", "-j", "route", "show", "proto", "bird")):
            if len(r.get("nexthops", [])) == n_up or (n_up == 1 and "gateway" in r):
                out.add(r["dst"])
        return out

    def xdp_forwards(self, node: str) -> bool:
        """The switch's packets are forwarded by rlbswitch's XDP program, not by its kernel."""
        return self.mode == "rlb" and self.fabric.node(node).daemon != "frr"

    def sent(self, node: str) -> dict[str, dict[str, int]]:
        """Per port of a switch, the data it sent into the link (tx_packets, tx_bytes). An XDP
        switch: its program's own per-port counters (SwitchDataplane.port_tx: every frame it
        forwarded, nothing else). Kernel counters would add the switch's control traffic (BGP,
        BFD, ND, RAs, heartbeats), whose share of a window moves with the machine's load: the CI
        runs' 221 packets where at most 220 were allowed, 1.01 for 1.00. Where the kernel
        forwards (baseline, FRR spines) there are no others: the kernel's, control traffic
        included."""
        ns = self.ns(node)
        if not self.xdp_forwards(node):
            return topo.link_counters(ns)
        dp = SwitchDataplane(ns)
        try:
            with netns.inside(ns):             # the ports' names are the namespace's
                return dp.port_tx()
        finally:
            dp.close()

    def dead_uplinks(self) -> set[tuple[str, int]]:
        """(leaf, colour) of every leaf-spine link down at either end (`fail-link`, a cable
        pulled): it carries nothing either way, so it has no share of the leaf's traffic."""
        state = {}

        def up(node: str, ifname: str) -> bool:
            if node not in state:
                state[node] = topo.links_up(self.ns(node))
            return state[node].get(ifname, False)
        return {(lf.name, c) for lf in self.fabric.leaves for c, p in enumerate(self.fabric.ports_up(lf))
                if not (up(lf.name, p.ifname) and up(p.peer.name, p.peer_ifname))}

    def spine_packets(self, from_leaf: str) -> dict[str, int]:
        """Data packets the leaf sent each spine of its pod (sent())."""
        leaf, out, got = self.fabric.node(from_leaf), self.sent(from_leaf), {}
        for p in self.fabric.ports_up(leaf):       # parallel links to a spine: their sum
            got[p.peer.name] = got.get(p.peer.name, 0) + out[p.ifname]["tx_packets"]
        return got

    # ---- traffic ----------------------------------------------------------------------
    def link_counts(self, leaf: str) -> dict[str, int]:
        """Data bytes each of the leaf's uplinks carried (sent()), keyed by spine, or spine-link
        with parallel links."""
        n, out = self.fabric.node(leaf), self.sent(leaf)
        return {p.peer.name + (f"-{p.link}" if self.fabric.parallel > 1 else ""): out[p.ifname]["tx_bytes"]
                for p in self.fabric.ports_up(n)}

    def qp_frames_sender(self, src_host: str):
        """A raw socket on the host's NIC: frames go out as a NIC would send them (through TC
        egress, so rlbhost sees them), carrying no socket hash for the leaf to reuse."""
        return open_raw(self.host_ns(src_host), self.host_if(src_host))

    def frame_macs(self, src_host: str) -> tuple[str, str]:
        """(destination, source) MACs of a host's frames: its leaf port's and its NIC's."""
        leaf, port = self.leaf_port(src_host)
        return topo.mac(self.ns(leaf), port), topo.mac(self.host_ns(src_host), self.host_if(src_host))

    def run_qps(self, src: str, dst: str, n_qps: int, packets: int, seed: int,
                payload_len: int = 512, rate_pps: float | None = None) -> QpRun:
        """n QPs between two GPUs (base addresses, UDP 4791, random source ports and QPs);
        links: per-uplink bytes of the source leaf, from kernel counters."""
        rnd = random.Random(seed)
        a, b = self.host_addresses(src)[1], self.host_addresses(dst)[1]
        flows = [Flow(a, b, rnd.randrange(49152, 65536), rnd.getrandbits(24)) for _ in range(n_qps)]
        leaf, port = self.fabric.leaf_of_host(src)
        sock = self.qp_frames_sender(src)
        try:
            before = self.link_counts(leaf.name)
            dmac, smac = self.frame_macs(src)
            sent = send(sock, flows, packets, dmac=dmac, smac=smac, payload_len=payload_len, rate_pps=rate_pps)
            time.sleep(0.3)
            after = self.link_counts(leaf.name)
        finally:
            sock.close()
        return QpRun(sent, {k: after[k] - before[k] for k in after}, flows=flows)


def balance(links: dict[str, int], noise_bytes: int = 2000) -> dict:
    """max/mean of per-link bytes and the share of links that carried traffic."""
    vals = list(links.values())
    mean = sum(vals) / len(vals) if vals else 0
    used = sum(1 for v in vals if v > noise_bytes)
    return {"max_mean": (max(vals) / mean) if mean else 0.0, "links_used": used / len(vals) if vals else 0.0}
