"""The route path as an operator meets it: `rlbswitch route apply FILE` of N pinned routes (a
primary and three backups each, as a leaf's remote prefixes are) into a freshly attached scratch
namespace, end to end (process start, JSON, the model, the maps), beside the floor of the same
process doing nothing (`rlbswitch --help`) measured in the same run.

    .venv/bin/python bench/route_cli.py [--routes 1024,16384] [--runs 3]"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from rlbcommon import netns  # noqa: E402
from rlblab import topo  # noqa: E402

NH = [f"p{k}@02:00:00:00:01:0{k}" for k in range(4)]


def routes_file(n: int, directory: Path) -> Path:
    path = directory / f"routes-{n}.json"
    path.write_text(json.dumps([{"prefix": f"fc00:{i // 4096 + 2:x}:{i % 4096:x}:1::/64", "mode": "pinned",
                                 "nexthops": [NH[i % 4]], "backups": [NH[b] for b in range(4) if b != i % 4]}
                                for i in range(n)]))
    return path


def rlbswitch(*args: str) -> float:
    """Wall seconds of one CLI run (it must succeed)."""
    t = time.perf_counter()
    subprocess.run([sys.executable, "-m", "rlbswitch", *args], check=True, cwd=ROOT,
                   stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    return time.perf_counter() - t


def apply_once(path: Path) -> float:
    ns = f"rlbrc{uuid.uuid4().hex[:6]}"
    topo.add_ns(ns)
    try:
        with netns.inside(ns):
            topo.veth_ports(4)
        rlbswitch("--netns", ns, "attach", "--once", "p0", "p1", "p2", "p3")
        return rlbswitch("--netns", ns, "route", "apply", str(path))
    finally:
        subprocess.run([sys.executable, "-m", "rlbswitch", "--netns", ns, "detach", "--all"], cwd=ROOT,
                       capture_output=True)
        topo.del_ns(ns)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--routes", default="1024,16384", help="route counts, comma-separated")
    ap.add_argument("--runs", type=int, default=3, help="runs per count (median and spread shown)")
    args = ap.parse_args()
    try:
        counts = [int(x) for x in args.routes.split(",")]
    except ValueError:
        ap.error("--routes: comma-separated whole numbers")
    if os.geteuid():
        ap.error("run as root (namespaces, XDP)")
    floor = [rlbswitch("--help") for _ in range(args.runs)]
    print(f"rlbswitch route apply, pinned routes (1 primary + 3 backups), 4 ports; {args.runs} runs")
    print(f"{'':<28}{'median s':>10}{'min-max s':>14}")
    print(f"{'process start (--help)':<28}{statistics.median(floor):>10.2f}{min(floor):>7.2f}-{max(floor):.2f}")
    with tempfile.TemporaryDirectory() as tmp:
        for n in counts:
            path = routes_file(n, Path(tmp))
            t = [apply_once(path) for _ in range(args.runs)]
            print(f"{f'{n} routes':<28}{statistics.median(t):>10.2f}{min(t):>7.2f}-{max(t):.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
