"""What the verbs library costs an application: QPs moved to RTR against the stand-in libibverbs
(tests/verbs/), without the library and with it, side by side, on two hosts in namespaces whose
agents (`rlbhost attach eth0`) answer for real and agree with each other over UDP.

    serial:      one process per host, N QPs each, RTR one after another; the rendezvous's end
                 (h1: its agent asks h2's whether the QP takes part) and the other end (h2: its
                 agent asks h1's for the decision) are timed apart
    concurrent:  P processes per host at once, N/P QPs each: the agents get N questions at once
                 from each side

Per QP: the RTR call's duration in the application (median, 99th percentile, worst); how many QPs
were placed and how many kept the application's addresses (and why). The library has no per-packet
part: it wraps ibv_modify_qp, ibv_destroy_qp, ibv_create_ah and ibv_destroy_ah only (the posting and
polling verbs are inline calls into the provider that no symbol interposition reaches).

    .venv/bin/python bench/verbs_bench.py [--qps 1000] [--procs 50] [--timeout-ms 20] [--loss 10]

With --loss, the agents' UDP loses that share of datagrams each way in a second run of every case
with the library: what matters there is that no QP's two ends are apart (the agents' count of
disagreements, and what the devices got), then how many were still placed and at what cost."""
from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from rlbcommon.constants import VERBS_PORT  # noqa: E402
from rlbhost.verbs.paths import socket_path  # noqa: E402
from rlblab import topo  # noqa: E402
from rlblab.hostlab import HostLab  # noqa: E402
from tests.verbs_tools import agent_env, app_env, app_lines, build_all, fake_sysfs, rtrs  # noqa: E402


def start(lab, built, sysfs, gid, host, n, qpn, dest, preload, timeout_ms, log):
    args = [str(built.linked), str(n), str(gid[host][1]), lab.addresses(3 - host)[1], hex(dest), "sync", "hold"]
    env = app_env(built, sysfs[host], log, qpn, socket_path(lab.h[host]), preload,
                  RLB_VERBS_TIMEOUT_MS=str(timeout_ms))
    p = subprocess.Popen(["ip", "netns", "exec", lab.h[host], *args], env=env, stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    assert p.stdout.readline().strip() == "READY"
    return p


def go(procs, n_each) -> list[dict]:
    for p in procs:
        p.stdin.write("go\n")
        p.stdin.flush()
    return [ln for p in procs for ln in app_lines("".join(p.stdout.readline() for _ in range(n_each)))]


def close(procs):
    for p in procs:
        p.stdin.close()
    for p in procs:
        p.wait(timeout=60)


def figures(lines: list[dict]) -> dict:
    ms = sorted(ln["ns"] / 1e6 for ln in lines)
    return {"n": len(ms), "median": statistics.median(ms), "p99": ms[int(0.99 * (len(ms) - 1))], "max": ms[-1]}


def run(lab, built, sysfs, gid, tmp, n, procs, preload, timeout_ms, order):
    """procs processes per host, n QPs in all per host; order: which host's RTRs go first
    ("together": both at once). Returns ({host: [per-QP lines]}, placed per host)."""
    each = n // procs
    apps, logs = {1: [], 2: []}, {1: [], 2: []}
    for i in range(procs):
        for host, (qpn, dest) in {1: (0x1000 + i * each, 0x200000 + i * each),
                                  2: (0x200000 + i * each, 0x1000 + i * each)}.items():
            log = tmp / f"h{host}-{i}-{time.monotonic_ns()}.log"
            logs[host].append(log)
            apps[host].append(start(lab, built, sysfs, gid, host, each, qpn, dest, preload, timeout_ms, log))
    lines = {}
    if order == "together":
        for host in (1, 2):
            for p in apps[host]:
                p.stdin.write("go\n")
                p.stdin.flush()
        for host in (1, 2):
            lines[host] = [ln for p in apps[host] for ln in app_lines("".join(p.stdout.readline()
                                                                              for _ in range(each)))]
    else:
        for host in order:
            lines[host] = go(apps[host], each)
    close(apps[1] + apps[2])
    ends = {h: {q: idx for log in logs[h] for q, (idx, _) in rtrs(log).items()} for h in (1, 2)}
    return lines, ends


def counts(lab, host) -> tuple[int, dict]:
    """(QP ends placed, kept by reason and disagreements) so far, as the host's agent counts them."""
    s = json.loads(lab.cli(host, "verbs", "status", "--json"))["service"]
    return s["counters"]["placed_rtr"], {**s["kept"], "DISAGREEMENTS": s["counters"]["disagreements"]}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--qps", type=int, default=1000)
    ap.add_argument("--procs", type=int, default=50, help="processes per host in the concurrent run")
    ap.add_argument("--timeout-ms", type=float, default=20)
    ap.add_argument("--loss", type=float, default=0, help="percent of the agents' UDP datagrams the router "
                    "drops at random: every case with the library runs without, then with, this loss")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="rlb-verbs-bench-"))
    built = build_all(tmp / "build")
    lab = HostLab("rlbvb")
    rows, agree = [], {}
    try:
        lab.up()
        sysfs = {k: tmp / f"sys-h{k}" for k in (1, 2)}
        gid = {k: fake_sysfs(sysfs[k], lab.addresses(k)) for k in (1, 2)}
        for k in (1, 2):
            lab.start_agent(k, env=agent_env(sysfs[k]))
        n = args.qps
        cases = [("without the library", False, 1, (1, 2), 0)]
        for loss in ([0, args.loss] if args.loss else [0]):
            at = f", {loss:g} % lost" if loss else ""
            cases += [(f"library, rendezvous end first{at}", True, 1, (1, 2), loss),
                      (f"library, other end first{at}", True, 1, (2, 1), loss),
                      (f"library, {args.procs} processes per host at once{at}", True, args.procs, "together", loss)]
        for name, preload, procs, order, loss in cases:
            topo.lossy_udp(lab.r, VERBS_PORT, loss)
            time.sleep(1.5)         # the agents write their status every second
            before = {h: counts(lab, h) for h in (1, 2)}
            lines, ends = run(lab, built, sysfs, gid, tmp, n, procs, preload, args.timeout_ms, order)
            # what each end's device got: the same path at both ends, or not (path 1 is the base:
            # a QP kept and one placed on path 1 look alike, and agree)
            peer_of = {q: q - 0x1000 + 0x200000 for q in ends[1]}
            both = [(ends[1][q] // 2, ends[2].get(peer_of[q], 0) // 2) for q in ends[1]]
            agree[name] = (sum(a == b for a, b in both), sum(a == b != 1 for a, b in both), len(both))
            time.sleep(1.5)
            for host in (1, 2):
                placed, kept = counts(lab, host)
                kept = {k: v - before[host][1].get(k, 0) for k, v in kept.items() if v - before[host][1].get(k, 0)}
                role = "rendezvous" if host == 1 else "other end"
                rows.append((name, f"h{host} ({role})", figures(lines[host]), placed - before[host][0], kept))
    finally:
        lab.down()
        shutil.rmtree(tmp, ignore_errors=True)        # the built library and every application's log
    print(f"\nRTR of {n} QPs per host against the stub libibverbs; library timeout {args.timeout_ms:g} ms")
    print(f"{'case':<56}{'end':<16}{'QPs':>6}{'median ms':>11}{'p99 ms':>9}{'max ms':>9}{'placed':>8}  "
          "kept (and disagreements, if any)")
    base = {}
    for name, end, f, placed, kept in rows:
        if name.startswith("without"):
            base[end] = f
        print(f"{name:<56}{end:<16}{f['n']:>6}{f['median']:>11.3f}{f['p99']:>9.3f}{f['max']:>9.3f}{placed:>8}  "
              f"{kept or '-'}")
    print("\nboth ends of each QP, as their devices got them:")
    for name, (same, off_base, total) in agree.items():
        print(f"  {name:<56} {same} of {total} on the same path ({off_base} off the base path), "
              f"{total - same} on different paths")
    print("\nadded by the library per QP (median, worst), against the run without it:")
    for name, end, f, _, _ in rows:
        if not name.startswith("without"):
            b = base[end]
            print(f"  {name:<56}{end:<16} +{f['median'] - b['median']:.3f} ms, +{f['max'] - b['max']:.3f} ms")


if __name__ == "__main__":
    main()
