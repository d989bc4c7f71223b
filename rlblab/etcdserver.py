"""A single etcd member for labs and tests (Debian's etcd-server), in a network namespace or
here: its data in a directory of the lab's, its log beside it, ready once it answers a read.
With `tls` (a directory of rlbfabric etcd-tls's certificates): https only, and only clients
with a certificate of that CA (--client-cert-auth), as an operator's cluster runs."""
from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

from rlbcommon.etcd import Etcd, EtcdError, EtcdUnavailable, tls_context
from rlbcoord import etcdauth, etcdtls

ETCD = "etcd"
NAME = "rlb"                       # a lab's one member


def data_dir(work: Path, name: str = NAME) -> Path:
    """Where the member named `name` keeps its store in the directory `work`."""
    return work / f"etcd-{name}.data"


class EtcdServer:
    def __init__(self, work: Path, host: str = "127.0.0.1", client_port: int = 2379, peer_port: int = 2380,
                 netns: str | None = None, name: str = NAME, fast: bool = False, tls: Path | None = None,
                 cluster: dict[str, str] | None = None):
        """fast: heartbeats every 50 ms and elections after 500 (etcd's defaults: 100 and 1000),
        so a lease can be as short as 1 s (etcd's floor is 1.5 election timeouts): a lab's
        coordinators then replace a dead leader within a second. One member on one machine
        can afford it; a real cluster's members keep the defaults. cluster: every member's peer
        URL by name (this one's included), for one member of several; start them all
        (start(wait=False)), then wait_ready() each: none answers before a quorum is up."""
        self.work, self.netns, self.name, self.fast, self.tls = work, netns, name, fast, tls
        h = f"[{host}]" if ":" in host else host
        self.url = f"{'https' if tls else 'http'}://{h}:{client_port}"
        self.peer_url = f"http://{h}:{peer_port}"       # alone: its peer port has no peers
        self.cluster = cluster or {name: self.peer_url}
        self.data = data_dir(work, name)
        self.log = work / f"etcd-{name}.log"
        self.proc: subprocess.Popen | None = None

    def start(self, timeout: float = 20.0, wait: bool = True) -> "EtcdServer":
        if shutil.which(ETCD) is None:
            raise RuntimeError("etcd is not installed (apt-get install etcd-server; `make setup` does)")
        cmd = [ETCD, "--name", self.name, "--data-dir", str(self.data),
               "--listen-client-urls", self.url, "--advertise-client-urls", self.url,
               "--listen-peer-urls", self.peer_url, "--initial-advertise-peer-urls", self.peer_url,
               "--initial-cluster", ",".join(f"{n}={u}" for n, u in self.cluster.items()),
               # a lab's: small, and quick to notice its own death
               "--quota-backend-bytes", str(512 << 20), "--auto-compaction-retention", "5m"]
        if self.fast:
            cmd += ["--heartbeat-interval", "50", "--election-timeout", "500"]
        if self.tls:
            cert, key = etcdtls.server_files(self.tls)
            cmd += ["--cert-file", str(cert), "--key-file", str(key),
                    "--trusted-ca-file", str(etcdtls.ca_file(self.tls)), "--client-cert-auth"]
        if self.netns:
            cmd = ["ip", "netns", "exec", self.netns, *cmd]
        self.work.mkdir(parents=True, exist_ok=True)
        with open(self.log, "a") as f:
            self.proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
        if wait:
            try:
                self.wait_ready(timeout)
            except BaseException:              # never ready: no member left behind by the caller
                self.stop()
                raise
        return self

    def client_tls(self, user: str = etcdauth.ROOT_USER):
        """How `user` speaks to this member (None: in clear)."""
        if not self.tls:
            return None
        return tls_context(etcdtls.ca_file(self.tls), etcdtls.client_file(self.tls, user))

    def wait_ready(self, timeout: float = 20.0):
        client = Etcd(self.url, timeout=1.0, tls=self.client_tls())
        deadline = time.monotonic() + timeout
        while True:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"etcd exited ({self.proc.returncode}): {self.log.read_text()[-1500:]}")
            try:
                client.get("/")
                return
            except EtcdUnavailable:
                pass
            except EtcdError:
                return                         # it answers (authentication on): up
            if time.monotonic() > deadline:
                raise RuntimeError(f"etcd at {self.url} not ready after {timeout:g} s: {self.log.read_text()[-1500:]}")
            time.sleep(0.1)

    def stop(self):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def kill(self):
        """As a crash would: no goodbye to anyone."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.proc = None
