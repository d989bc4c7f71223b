"""What HTTPS with machine certificates costs a coordinator over HTTP, side by side with plain
HTTP in the same run: the coordinator (a child process, its CPU read from /proc) takes N reports
of one host (8 QPs each) over loopback, plain, over TLS with a full handshake per report, and over
TLS resuming the last session (what rlbcommon/coordapi.call does).

    .venv/bin/python bench/coord_tls_bench.py [--reports 400]

Prints, per mode, the time a report takes and the CPU it costs the coordinator and the host, and
the ratio to plain HTTP. Reports come one after another (one host): the coordinator's CPU per
report is what bounds how many hosts one coordinator serves at --report-ms."""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
import resource
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from rlbcommon import coordapi  # noqa: E402
from rlbcoord import etcdtls, keys  # noqa: E402
from rlbfabric.fabric import load  # noqa: E402

FABRIC = ROOT / "lab" / "fabric.toml"
SERVER = r'''
import sys
from pathlib import Path
from rlbcommon.tls import server_context
from rlbcoord import etcdtls
from rlbcoord.service import Coordinator, make_server
from rlbfabric.fabric import load
d, tls = Path(sys.argv[2]), sys.argv[3] == "1"
c = Coordinator(load(Path(sys.argv[1])), host_timeout_s=60)
srv = make_server(c, "::1", 0, tls=server_context(etcdtls.coordinator_file(d), etcdtls.ca_file(d)) if tls else None)
srv.limiter.rate = 1e9                      # one client sends as fast as it can: no rate limit here
print(srv.server_address[1], flush=True)
srv.serve_forever()
'''


class NoSessions(dict):
    """coordapi's session cache that keeps nothing: every report a full handshake."""

    def __setitem__(self, key, value):
        pass


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def body(fabric) -> dict:
    leaf, port = fabric.leaf_of_host("h1")
    nets = fabric.host_prefixes(leaf, port)
    peer = fabric.host_prefixes(*fabric.leaf_of_host("h3"))[0].network_address + 3
    return {"paths": {str(k + 1): str(n.network_address + 1) for k, n in enumerate(nets)},
            "weights": [{"prefix": "::/0", "weights": {str(k + 1): 1 for k in range(len(nets))}}],
            "qps": [{"peer": str(peer), "sport": 50000 + i, "qp": i + 1, "path": 1, "bytes": 1000} for i in range(8)]}


def run(mode: str, pki: Path, n: int, fabric) -> tuple[float, float, float]:
    tls = mode != "http"
    proc = subprocess.Popen([sys.executable, "-c", SERVER, str(FABRIC), str(pki), "1" if tls else "0"],
                            stdout=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        url = coordapi.url_for("::1", int(proc.stdout.readline()), https=tls)
        ctx = coordapi.client_tls(url, etcdtls.ca_file(pki), etcdtls.client_file(pki, keys.host_user("h1"))) if tls else None
        saved = coordapi._sessions
        if mode == "https-full":
            coordapi._sessions = NoSessions()
        try:
            report = body(fabric)
            coordapi.call(url, coordapi.REPORT.format("h1"), report, tls=ctx)
            s0, r0, t0 = cpu_s(proc.pid), resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
            for _ in range(n):
                coordapi.call(url, coordapi.REPORT.format("h1"), report, tls=ctx)
            wall = time.perf_counter() - t0
            s1, r1 = cpu_s(proc.pid), resource.getrusage(resource.RUSAGE_SELF)
        finally:
            coordapi._sessions = saved
        host = r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime
        return wall / n * 1e3, (s1 - s0) / n * 1e3, host / n * 1e3
    finally:
        proc.kill()
        proc.wait()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reports", type=int, default=400)
    args = ap.parse_args()
    fabric = load(FABRIC)
    with tempfile.TemporaryDirectory() as tmp:
        pki = Path(tmp)
        etcdtls.issue(fabric, pki, ["::1"])
        etcdtls.issue_coordinator(pki, ["::1"])
        rows = {mode: run(mode, pki, args.reports, fabric) for mode in ("http", "https-full", "https-resumed")}
    base = rows["http"]
    print(f"{args.reports} reports of 8 QPs, one after another, over loopback")
    print(f"{'mode':<15}{'ms a report':>12}{'coordinator CPU ms':>20}{'host CPU ms':>13}{'coordinator x http':>20}")
    for mode, (wall, coord, host) in rows.items():
        print(f"{mode:<15}{wall:>12.2f}{coord:>20.2f}{host:>13.2f}{coord / base[1]:>20.1f}")
    per_core = 1e3 / rows["https-resumed"][1]
    print(f"one coordinator core takes about {per_core:.0f} HTTPS reports a second: at --report-ms 250, "
          f"{per_core / 4:.0f} NICs (plain HTTP: {1e3 / base[1] / 4:.0f})")


if __name__ == "__main__":
    main()
