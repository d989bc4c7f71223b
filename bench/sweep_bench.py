"""The host agent's sweep over its QP table (HostDataplane.rebalance), timed: N live QPs written
into a GPU's conntrack map (ports mode, 4 planes x 2 sub-ports, in a scratch namespace), then the
median of 9 quiet sweeps (nothing moves) and of 6 releases (a plane's weight halved and restored).

Run it from a checkout's root; to compare two versions side by side, run it from a worktree of
each in turn (`git worktree add /tmp/wt-before <commit>` with the venv linked in):

    .venv/bin/python bench/sweep_bench.py --qps 20000"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path.cwd()))

from rlbcommon import netns  # noqa: E402
from rlbfabric.base import add_loopback_device  # noqa: E402
from rlbhost.dataplane import HostDataplane, PortPath  # noqa: E402

PEER = "fc00:0:ff::2"


def fill(dp: HostDataplane, n: int):
    """n live QPs to PEER, spread evenly over the 8 paths, all under its weight entry."""
    wid = next(w["id"] for w in dp.weights() if w["prefix"] == f"{PEER}/128")
    ct = dp.maps["conntrack"]
    now = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
    peer = bytes.fromhex("fc000000000000ff0000000000000002")
    for i in range(n):
        k, v = ct.key_type(), ct.leaf_type()
        k.peer[:], k.sport, k.qp = peer, 49152 + i % 16384, i
        v.last_ns, v.created_ns, v.path, v.wid = now, now + i, i % 8, wid
        ct.set(k, v)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--qps", type=int, default=20000, help="live QPs in the table")
    n = ap.parse_args().qps
    name = f"rlbsweep{os.getpid()}"
    subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        with netns.inside(name):
            ports = [f"eth-p{p}-{i}" for p in range(1, 5) for i in (1, 2)]
            for dev in ["rlb0", *ports]:
                add_loopback_device(dev)
            dp = HostDataplane(f"{name}-h")
            try:
                dp.attach_ports("rlb0", "fc00:0:ff::1", [PortPath(k + 1, dev, f"02:00:00:00:00:{k + 1:02x}", True)
                                                         for k, dev in enumerate(ports)], group_size=2)
                dp.apply_weights({f"{PEER}/128": ({v: 1 for v in range(1, 9)}, False)})
                dp.set_config(expiry_ms=600_000)
                fill(dp, n)
                dp.rebalance()
                quiet, release = [], []
                for _ in range(9):
                    t = time.perf_counter()
                    dp.rebalance()
                    quiet.append((time.perf_counter() - t) * 1000)
                for r in range(6):
                    w = {v: (0.5 if v in (1, 2) and r % 2 == 0 else 1) for v in range(1, 9)}
                    t = time.perf_counter()
                    dp.apply_weights({f"{PEER}/128": (w, False)})
                    release.append((time.perf_counter() - t) * 1000)
                print(f"{n} QPs: quiet sweep median {statistics.median(quiet):.1f} ms (min {min(quiet):.1f}); "
                      f"release median {statistics.median(release):.1f} ms (min {min(release):.1f})")
            finally:
                dp.destroy()
    finally:
        subprocess.run(["ip", "netns", "del", name], check=False)


if __name__ == "__main__":
    main()
