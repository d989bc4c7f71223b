"""What one etcd request of each kind the agents make costs etcd's CPU (and the client's), in
clear and over TLS with client certificates, side by side on one member of Debian's etcd:
a lease keepalive (every host, every third of its lease), a read, a watch opened (every host
holds two; each opening over TLS is a handshake). The steady-state arithmetic of
docs/operations.md multiplies these by the fabric's hosts.

    .venv/bin/python bench/etcd_costs.py [--n 1000] [--watches 300]"""
from __future__ import annotations

import argparse
import os
import shutil
import socket
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from rlbcommon.etcd import Etcd, _b64, prefix_end, tls_context  # noqa: E402
from rlbcoord import etcdauth, etcdtls  # noqa: E402
from rlblab.etcdserver import EtcdServer  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def etcd_cpu(server: EtcdServer) -> float:
    with open(f"/proc/{server.proc.pid}/stat") as f:
        utime, stime = f.read().rsplit(")", 1)[1].split()[11:13]
    return (int(utime) + int(stime)) / os.sysconf("SC_CLK_TCK")


def per_call(server: EtcdServer, n: int, call) -> tuple[float, float]:
    """(etcd's, the client's) CPU milliseconds per call."""
    e0, c0 = etcd_cpu(server), time.process_time()
    for _ in range(n):
        call()
    return 1000 * (etcd_cpu(server) - e0) / n, 1000 * (time.process_time() - c0) / n


def measure(tls: bool, n: int, watches: int) -> dict[str, tuple[float, float]]:
    work = Path(tempfile.mkdtemp(prefix="rlb-etcdcost-"))
    pki = None
    if tls:
        pki = work / "pki"
        etcdtls.issue(None, pki, ["127.0.0.1"])
    server = EtcdServer(work, client_port=free_port(), peer_port=free_port(), tls=pki).start()
    try:
        ctx = tls_context(etcdtls.ca_file(pki), etcdtls.client_file(pki, etcdauth.ROOT_USER)) if pki else None
        client = Etcd(server.url, tls=ctx)
        client.put("/rlb/x", "1")
        lease = client.lease_grant(60)
        body = {"create_request": {"key": _b64("/rlb/"), "range_end": _b64(prefix_end("/rlb/")),
                                   "start_revision": "1"}}

        def watch_opened():
            stream = client._request("watch", body, stream=True)
            next(iter(stream))                         # etcd answered: the watch exists
            stream.close()
        return {"lease keepalive": per_call(server, n, lambda: client.lease_keepalive(lease)),
                "read": per_call(server, n, lambda: client.get("/rlb/x")),
                "watch opened": per_call(server, watches, watch_opened)}
    finally:
        server.stop()
        shutil.rmtree(work, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=1000, help="keepalives and reads measured")
    ap.add_argument("--watches", type=int, default=300, help="watches opened and closed")
    a = ap.parse_args()
    clear, tls = measure(False, a.n, a.watches), measure(True, a.n, a.watches)
    print(f"{'CPU ms per request: etcd / client':<36}{'in clear':>18}{'TLS, client cert':>20}{'etcd TLS/clear':>16}")
    for what in clear:
        (e0, c0), (e1, c1) = clear[what], tls[what]
        print(f"{what:<36}{e0:>10.3f} / {c0:.3f}{e1:>12.3f} / {c1:.3f}{e1 / e0 if e0 else 0:>15.2f}x")


if __name__ == "__main__":
    main()
