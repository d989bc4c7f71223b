"""One agent answering a GPU server's RDMA devices at once, against today's one device: two servers
of D NICs in namespaces (rlblab/hostlab.py, nics=D: NIC i of each on its own prefixes, a rail
each), one `rlbhost attach eth0 ... eth<D-1>` per server, a stand-in RDMA device on each NIC
(tests/verbs/: stub0 ... stub<D-1>, every one numbering its QPs from the same start, so QP numbers
collide across devices as Soft-RoCE's and ConnectX's do).

    one device:     one process per server on stub0, N QPs to RTR one after another (today's shape)
    D devices:      one process per device per server, all at once: D x N QPs, N per device

Per QP: the RTR call's duration in the application (median, 99th percentile, worst), and from
what each end's device was given, whether both ends of each QP are on the same path of their own
NICs (per device). The budget is 1 ms at the median and 5 ms at worst per QP.

Both servers share this machine's CPUs unless --cpu-per-server puts each (its agent and its
applications) on a CPU of its own, as two machines would be: the applications then compete with
their own server's agent only, not with the other server's as well.

    .venv/bin/python bench/verbs_devices_bench.py [--devices 8] [--qps 1000] [--timeout-ms 20] [--cpu-per-server]"""
from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.verbs_bench import counts, figures  # noqa: E402 - as the one-device bench reads them
from rlbhost.verbs import answertimes  # noqa: E402
from rlbhost.verbs.paths import socket_path  # noqa: E402
from rlblab.hostlab import HostLab  # noqa: E402
from tests.verbs_tools import agent_env, app_env, app_lines, build_all, fake_sysfs, rtrs  # noqa: E402

WIRE = ("messages_sent", "datagrams_sent", "resent", "peer_questions", "kept_unheard", "slow_rounds")
FIRST_QPN = {1: 0x1000, 2: 0x200000}        # every device of a server numbers from here


def start(lab, built, sysfs, gid, host, dev, n, timeout_ms, log, cpu=None):
    """verbs_app on one server's device `dev`, n QPs towards the other server's same NIC (on
    `cpu` alone, if given)."""
    peer = 3 - host
    args = [str(built.linked), str(n), str(gid[(host, dev)][1]), lab.addresses(peer, dev)[1],
            hex(FIRST_QPN[peer]), "sync", "hold"]
    env = app_env(built, sysfs[host], log, FIRST_QPN[host], socket_path(lab.h[host]),
                  STUB_DEVICE=f"stub{dev}", RLB_VERBS_TIMEOUT_MS=str(timeout_ms))
    pin = ["taskset", "-c", str(cpu)] if cpu is not None else []
    p = subprocess.Popen([*pin, "nice", "-n", "10", "ip", "netns", "exec", lab.h[host], *args], env=env, stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    assert p.stdout.readline().strip() == "READY"
    return p


def run(lab, built, sysfs, gid, tmp, devices: int, n: int, timeout_ms: float, cpus: dict[int, int] | None = None):
    """Both servers' processes (one a device) go at once; ({host: per-QP lines}, agreement per device)."""
    apps, logs = {1: [], 2: []}, {1: {}, 2: {}}
    for dev in range(devices):
        for host in (1, 2):
            log = tmp / f"h{host}-stub{dev}-{time.monotonic_ns()}.log"
            logs[host][dev] = log
            apps[host].append(start(lab, built, sysfs, gid, host, dev, n, timeout_ms, log, (cpus or {}).get(host)))
    for host in (1, 2):
        for p in apps[host]:
            p.stdin.write("go\n")
            p.stdin.flush()
    lines = {host: [ln for p in apps[host] for ln in app_lines("".join(p.stdout.readline() for _ in range(n)))]
             for host in (1, 2)}
    for p in apps[1] + apps[2]:
        p.stdin.close()
    for p in apps[1] + apps[2]:
        p.wait(timeout=120)
    agree = {}
    for dev in range(devices):
        e1, e2 = rtrs(logs[1][dev]), rtrs(logs[2][dev])
        path1 = {q: _path(gid[(1, dev)], idx) for q, (idx, _) in e1.items()}
        path2 = {q: _path(gid[(2, dev)], idx) for q, (idx, _) in e2.items()}
        pairs = [(path1[q], path2.get(q - FIRST_QPN[1] + FIRST_QPN[2], 0)) for q in path1]
        split = {k: sum(1 for a, _ in pairs if a == k) for k in sorted(gid[(1, dev)])}
        agree[dev] = (sum(a == b for a, b in pairs), len(pairs), split)
    return lines, agree


def peer_wire(lab, host) -> tuple[dict[str, int], dict]:
    """What the host's agent has sent its peers so far (messages, datagrams, copies sent again),
    and how long its libraries have waited for its answers (answertimes' snapshot)."""
    s = json.loads(lab.cli(host, "verbs", "status", "--json"))["service"]
    g = s.get("garbage", {})
    return ({**{k: s["counters"][k] for k in WIRE}, "gc_ms": g.get("collecting_ms", 0), "gc_full": g.get("full", 0),
             "gc_full_ms": g.get("full_ms", 0)}, s.get("answer_times", {}))


def idle_share(since: tuple[int, int] | None = None):
    """The machine's (idle, total) jiffies now; with `since`, the share idle in between."""
    f = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    now = (f[3] + f[4], sum(f[:8]))
    return now if since is None else (now[0] - since[0]) / max(1, now[1] - since[1])


def threads_s(pid: int) -> dict[str, float]:
    """CPU seconds (user and kernel) each named thread of a process has used so far."""
    out: dict[str, float] = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            name = (task / "comm").read_text().strip()
            f = (task / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        out[name] = out.get(name, 0.0) + (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")
    return out


def cpu_s(pid: int) -> tuple[float, float]:
    """CPU seconds a process has used so far: (in itself, in the kernel)."""
    f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(f[11]) / os.sysconf("SC_CLK_TCK"), int(f[12]) / os.sysconf("SC_CLK_TCK")


def py_spy() -> str | None:
    """py-spy on PATH, or beside this interpreter (a venv's)."""
    beside = Path(sys.executable).with_name("py-spy")
    return shutil.which("py-spy") or (str(beside) if beside.exists() else None)


def profile(lab, into: Path) -> list[subprocess.Popen]:
    """py-spy sampling each agent (every thread; not pausing it, which collapsed the 8-device case)."""
    into.mkdir(parents=True, exist_ok=True)
    return [subprocess.Popen([py_spy(), "record", "--pid", str(lab.agents[h].pid), "--threads", "--nonblocking",
                              "--rate", "250", "--format", "raw", "--output", str(into / f"a{h}.txt")],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for h in (1, 2)]


def _path(gids: dict[int, int], index: int) -> int:
    return next((k for k, i in gids.items() if i == index), 0)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--devices", type=int, default=8)
    ap.add_argument("--qps", type=int, default=1000, help="QPs per device per server")
    ap.add_argument("--timeout-ms", type=float, default=20)
    ap.add_argument("--profile", type=Path, metavar="DIR",
                    help="sample each agent's threads with py-spy during the several-device case and write "
                         "DIR/a<N>.txt (collapsed stacks, for flamegraph.pl or speedscope)")
    ap.add_argument("--cpu-per-server", action="store_true",
                    help="each server (its agent and applications) on a CPU of its own, as on two machines")
    args = ap.parse_args()
    cpus = {1: 0, 2: 1 % os.cpu_count()} if args.cpu_per_server else None
    if args.profile and not py_spy():
        ap.error("--profile needs py-spy (.venv/bin/pip install py-spy)")
    tmp = Path(tempfile.mkdtemp(prefix="rlb-verbs-devices-"))
    built = build_all(tmp / "build")
    lab = HostLab("rlbvd", nics=args.devices)
    out = []
    try:
        lab.up(timeout=120)
        sysfs = {k: tmp / f"sys-h{k}" for k in (1, 2)}
        gid = {(k, d): fake_sysfs(sysfs[k], lab.addresses(k, d), dev=f"stub{d}", netdev=lab.nic(d))
               for k in (1, 2) for d in range(args.devices)}
        for k in (1, 2):
            lab.start_agent(k, env=agent_env(sysfs[k]), timeout=300)
            if cpus:                                         # every thread, those started later too
                subprocess.run(["taskset", "-a", "-p", "-c", str(cpus[k]), str(lab.agents[k].pid)],
                               check=True, stdout=subprocess.DEVNULL)
        for devices in (1, args.devices):
            time.sleep(2)
            before = {h: counts(lab, h) for h in (1, 2)}
            wire0 = {h: peer_wire(lab, h) for h in (1, 2)}
            cpu0, t0 = {h: cpu_s(lab.agents[h].pid) for h in (1, 2)}, time.monotonic()
            th0 = {h: threads_s(lab.agents[h].pid) for h in (1, 2)}
            idle0 = idle_share()
            apps0 = resource.getrusage(resource.RUSAGE_CHILDREN)
            spies = profile(lab, args.profile) if args.profile and devices > 1 else []
            lines, agree = run(lab, built, sysfs, gid, tmp, devices, args.qps, args.timeout_ms, cpus)
            wall = time.monotonic() - t0
            idle = idle_share(idle0)
            apps1 = resource.getrusage(resource.RUSAGE_CHILDREN)     # the applications, waited for by run()
            apps = (apps1.ru_utime - apps0.ru_utime, apps1.ru_stime - apps0.ru_stime)
            for spy in spies:
                spy.send_signal(signal.SIGINT)      # py-spy writes what it sampled on SIGINT
                spy.wait(timeout=60)
            cpu = {h: tuple(b - a for a, b in zip(cpu0[h], cpu_s(lab.agents[h].pid))) for h in (1, 2)}
            th = {h: {k: v - th0[h].get(k, 0.0) for k, v in threads_s(lab.agents[h].pid).items()} for h in (1, 2)}
            cpu = {h: (*cpu[h], th[h]) for h in (1, 2)}
            time.sleep(1.5)              # the agents write their status every second
            kept, wire = {}, {}
            for h in (1, 2):
                placed, k = counts(lab, h)
                kept[h] = (placed - before[h][0], {r: v - before[h][1].get(r, 0) for r, v in k.items()
                                                   if v - before[h][1].get(r, 0)})
                now, waited = peer_wire(lab, h)
                wire[h] = {k: v - wire0[h][0][k] for k, v in now.items()}
                wire[h]["answered"] = answertimes.summary(answertimes.between(waited, wire0[h][1]))
            out.append((devices, {h: figures(lines[h]) for h in (1, 2)}, agree, kept, (wall, idle, apps), cpu, wire))
    finally:
        lab.down()
        shutil.rmtree(tmp, ignore_errors=True)        # the built library and every application's log
    print(f"\nRTR of {args.qps} QPs per device per server, stand-in libibverbs, library timeout {args.timeout_ms:g} ms; "
          f"{args.devices} NICs per server, one agent each; "
          + ("each server on a CPU of its own" if cpus else "both servers on all of this machine's CPUs"))
    print(f"{'case':<34}{'server':<8}{'QPs':>6}{'median ms':>11}{'p99 ms':>9}{'max ms':>9}{'placed':>8}  kept")
    for devices, figs, _, kept, *_ in out:
        name = "one device (today's shape)" if devices == 1 else f"{devices} devices at once"
        for h in (1, 2):
            f = figs[h]
            print(f"{name:<34}{'a' + str(h):<8}{f['n']:>6}{f['median']:>11.3f}{f['p99']:>9.3f}{f['max']:>9.3f}"
                  f"{kept[h][0]:>8}  {kept[h][1] or '-'}")
    print("\nthe same RTRs as the agent saw them: from the library's asking to the agent's answer (a path "
          "or a keep; questions the library found decided in the table are not asked), to a bucket's precision:")
    for devices, _, _, _, _, _, wire in out:
        name = "one device (today's shape)" if devices == 1 else f"{devices} devices at once"
        for h in (1, 2):
            a = wire[h]["answered"]
            print(f"  {name:<32}a{h}: {a['n']} answered, median {a['median_ms'] or 0:.2f} ms, "
                  f"p99 {a['p99_ms'] or 0:.2f} ms, {a['over_5ms']} over 5 ms")
    print("\nboth ends of each QP on the same path of their own NICs (per device; QPs per path on server 1):")
    for devices, _, agree, *_ in out:
        for dev, (same, total, split) in agree.items():
            print(f"  {devices} device(s), stub{dev}: {same} of {total}, per path {split}")
    print("\neach case's time, and each agent's CPU in it (user + kernel, and per QP end):")
    for devices, _, _, _, (wall, idle, apps), cpu, wire in out:
        n = devices * args.qps
        print(f"  {devices} device(s): {wall:.2f} s, the machine {idle:.0%} idle; the applications "
              f"{apps[0]:.2f} + {apps[1]:.2f} s ({sum(apps) / n / 2 * 1e3:.3f} ms a QP end); " + "; ".join(
            f"a{h} {cpu[h][0]:.2f} + {cpu[h][1]:.2f} s ({(cpu[h][0] + cpu[h][1]) / n * 1e3:.3f} ms a QP)" for h in (1, 2)))
        for h in (1, 2):
            busy = sorted(((v, k) for k, v in cpu[h][2].items() if v >= 0.01), reverse=True)
            print(f"    a{h}'s threads: " + ", ".join(f"{k} {v:.2f} s" for v, k in busy))
            w = wire[h]
            print(f"    a{h} to its peers: {w['messages_sent']} messages in {w['datagrams_sent']} datagrams "
                  f"({w['datagrams_sent'] / n:.2f} a QP end), {w['resent']} sent again; "
                  f"{w['peer_questions']} questions from peers; {w['kept_unheard']} of its QPs kept as their "
                  f"process's words may have been lost (its socket found half full); {w['slow_rounds']} "
                  f"rounds of its verbs thread over 50 ms (its log: what they spent it on); collecting garbage "
                  f"{w['gc_ms']:.0f} ms, of which {w['gc_full']} full collections {w['gc_full_ms']:.0f} ms")


if __name__ == "__main__":
    main()
