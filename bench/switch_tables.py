"""The switch's route programming at the size of a real fabric, next to the same operations on an
earlier version of this code (default: the commit before the routing model, db4dfdc), run from a
git worktree in its own pin directory:

- cold: 16384 pinned routes (a primary and three backups each, as a leaf's remote prefixes are)
  programmed into an empty switch;
- one change with them installed: a prefix pinned to another spine (median and worst of 200);
- a change that needs a new group (new weights on a weighted route);
- adoption: a restarted agent reading 16384 routes back;
- memory: what the kernel charges for each map (fdinfo memlock), per route.

    .venv/bin/python bench/switch_tables.py [--routes 16384] [--baseline db4dfdc]"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

MEASURE = r"""
import json, os, statistics, sys, time
from pathlib import Path
from rlbcommon import netns
from rlblab import topo
from rlbswitch.dataplane import SwitchDataplane
try:
    from rlbfabric.routes import NextHop, Route
except ImportError:                     # versions before the control plane moved to rlbfabric
    from rlbswitch.model import NextHop, Route

n_routes, instance = int(sys.argv[1]), sys.argv[2]
NH = [f"p{k}@02:00:00:00:01:0{k}" for k in range(4)]

def route(i, primary=None):
    p = i % 4 if primary is None else primary
    return Route(f"fc00:{i // 4096 + 2:x}:{i % 4096:x}:1::/64", "pinned", [NextHop.parse(NH[p])],
                 [NextHop.parse(NH[b]) for b in range(4) if b != p])

def memlock(dp):
    out = {}
    for name, m in dp.maps.items():
        for line in Path(f"/proc/self/fdinfo/{m.fd}").read_text().splitlines():
            if line.startswith("memlock:"):
                out[name] = int(line.split()[1])
    return out

res = {}
with netns.inside(instance):
    topo.veth_ports(4)
    dp = SwitchDataplane(instance)
    dp.load()
    for k in range(4):
        dp.register_port(dp.ifindex(f"p{k}"))
    mem0 = memlock(dp)
    batch = getattr(dp, "apply_routes", None)
    t = time.perf_counter()
    done = 0
    try:
        if batch:
            dp.apply_routes([route(i) for i in range(n_routes)])
            done = n_routes
        else:
            for i in range(n_routes):
                dp.add_route(route(i))
                done = i + 1
    except Exception as e:
        res["stopped"] = f"after {done} routes: {e}"
    res["cold_s"] = time.perf_counter() - t
    res["routes"] = done
    times = []
    for j in range(200 if done else 0):
        i = (j * 7919) % done
        t = time.perf_counter()
        try:
            dp.add_route(route(i, primary=(i + 1 + j) % 4))
        except Exception as e:
            res["change_error"] = str(e)
            break
        times.append(time.perf_counter() - t)
    if times:
        res["change_ms"] = [statistics.median(times) * 1000, max(times) * 1000]
    if done:
        w = Route("fc00:ffff::/64", "weighted", [NextHop.parse(NH[0] + "=3"), NextHop.parse(NH[1])])
        try:
            dp.add_route(w)
            t = time.perf_counter()
            dp.add_route(Route("fc00:ffff::/64", "weighted", [NextHop.parse(NH[0] + "=2"), NextHop.parse(NH[1])]))
            res["new_group_ms"] = (time.perf_counter() - t) * 1000
        except Exception as e:
            res["new_group_error"] = str(e)
    mem1 = memlock(dp)
    res["memlock"] = {k: [mem0.get(k, 0), mem1.get(k, 0)] for k in mem1}
    if hasattr(dp, "tables"):
        dp._tables = None
        t = time.perf_counter()
        dp.tables
        res["adopt_s"] = time.perf_counter() - t
    dp.destroy()
print(json.dumps(res))
"""


def measure(tree: Path, n: int, tag: str) -> dict:
    ns = f"rlbbt{tag}{os.getpid() % 10000}"
    subprocess.run(["ip", "netns", "add", ns], check=True)
    try:
        env = {**os.environ, "PYTHONPATH": str(tree), "RLB_BPF_DIR": str(tree / "bpf")}
        out = subprocess.run([sys.executable, "-c", MEASURE, str(n), ns], cwd=tree, env=env,
                             capture_output=True, text=True, timeout=3600)
        if out.returncode:
            return {"error": out.stderr.strip().splitlines()[-1] if out.stderr else "failed"}
        return json.loads(out.stdout.strip().splitlines()[-1])
    finally:
        subprocess.run(["ip", "netns", "del", ns])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--routes", type=int, default=16384)
    ap.add_argument("--baseline", default="db4dfdc", help="git revision to compare with")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp) / "base"
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(base), args.baseline],
                       check=True, capture_output=True)
        try:
            old = measure(base, args.routes, "o")
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(base)], capture_output=True)
    new = measure(ROOT, args.routes, "n")

    def col(r, key, fmt):
        v = r.get(key)
        return "-" if v is None else fmt(v)

    rows = [
        ("routes programmed", lambda r: str(r.get("routes", "-")) + (" (stopped)" if "stopped" in r else "")),
        ("cold: all of them (s)", lambda r: col(r, "cold_s", lambda v: f"{v:.2f}")),
        ("cold: routes per second", lambda r: f"{r['routes'] / r['cold_s']:.0f}" if r.get("cold_s") else "-"),
        ("one change, median (ms)", lambda r: col(r, "change_ms", lambda v: f"{v[0]:.2f}")),
        ("one change, worst (ms)", lambda r: col(r, "change_ms", lambda v: f"{v[1]:.2f}")),
        ("change needing a new group (ms)", lambda r: col(r, "new_group_ms", lambda v: f"{v:.2f}")),
        ("adoption of the table (s)", lambda r: col(r, "adopt_s", lambda v: f"{v:.2f}")),
    ]
    print(f"{args.routes} pinned routes (1 primary + 3 backups), 4 ports; this tree vs {args.baseline}")
    print(f"{'':<34}{args.baseline:>16}{'now':>16}")
    for label, f in rows:
        print(f"{label:<34}{f(old):>16}{f(new):>16}")
    for r, name in ((old, args.baseline), (new, "now")):
        if "stopped" in r:
            print(f"{name}: stopped {r['stopped']}")
        for key in ("error", "change_error", "new_group_error"):
            if key in r:
                print(f"{name}: {key.replace('_', ' ')}: {r[key]}")
    mem = new.get("memlock", {})
    if mem:
        print("\nkernel memory of the switch maps now (fdinfo memlock), empty -> with the routes:")
        total0 = total1 = 0
        for k, (a, b) in sorted(mem.items(), key=lambda kv: -kv[1][1]):
            total0, total1 = total0 + a, total1 + b
            if b >= 1 << 20 or b != a:
                print(f"  {k:<14}{a / 2**20:>9.1f} MiB{b / 2**20:>9.1f} MiB")
        per = (mem["routes"][1] - mem["routes"][0]) / max(1, new.get("routes", 1) + 1)
        print(f"  {'all maps':<14}{total0 / 2**20:>9.1f} MiB{total1 / 2**20:>9.1f} MiB; "
              f"routes map: {per:.0f} bytes per route")
    return 0


if __name__ == "__main__":
    sys.exit(main())
