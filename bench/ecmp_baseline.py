"""Does the lab's baseline measure the kernel? Kernel ECMP (fib_multipath_hash_policy=1) on the
default fabric, N QPs between two GPUs per trial, random source ports and a fresh hash seed per
trial; per-uplink QP counts from the spines' kernel counters. Printed next to balls-into-bins
(the same N QPs thrown uniformly at the uplinks, simulated) and the figures measured by a
separate harness on this machine kind (issue 5)."""
from __future__ import annotations

import argparse
import random
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from rlbcommon.netns import run  # noqa: E402
from rlblab.fabriclab import FabricLab  # noqa: E402

FABRIC = Path(__file__).resolve().parent.parent / "lab" / "fabric.toml"
REFERENCE = {4: (2.15, 0.68), 8: (1.75, 0.90), 16: (1.55, 0.99)}   # max/mean, links used


def bins(n_qps: int, links: int, trials: int, rnd: random.Random) -> tuple[float, float]:
    mm, used = [], []
    for _ in range(trials):
        c = [0] * links
        for _ in range(n_qps):
            c[rnd.randrange(links)] += 1
        mm.append(max(c) / (n_qps / links))
        used.append(sum(1 for x in c if x) / links)
    return statistics.mean(mm), statistics.mean(used)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--trials", type=int, default=300)
    ap.add_argument("--qps", type=int, nargs="+", default=[4, 8, 16])
    args = ap.parse_args()
    lab = FabricLab(FABRIC, "rlbeb", mode="baseline")
    rows = []
    try:
        lab.up()
        lab.wait_converged(90)
        leaf = lab.fabric.leaf_of_host("h1")[0].name
        rnd = random.Random(1)
        for n in args.qps:
            mm, used = [], []
            for t in range(args.trials):
                run(lab.ns(leaf), "sysctl", "-qw", f"net.ipv4.fib_multipath_hash_seed={rnd.getrandbits(31)}")
                r = lab.run_qps("h1", "h3", n, 2, seed=rnd.getrandbits(32), payload_len=1000)
                links = r.links
                total = sum(links.values())
                qps = [round(v / total * n) for v in links.values()]     # bytes -> QPs
                mm.append(max(qps) / (n / len(qps)))
                used.append(sum(1 for q in qps if q) / len(qps))
            rows.append((n, statistics.mean(mm), statistics.mean(used),
                         *bins(n, len(links), args.trials, random.Random(n))))
    finally:
        lab.down()
    print(f"kernel ECMP, policy 1, fresh seed per trial, {args.trials} trials, 4 uplinks")
    print(f"{'QPs':>4}{'lab max/mean':>14}{'lab used':>10}{'bins max/mean':>15}{'bins used':>11}"
          f"{'ref max/mean':>14}{'ref used':>10}")
    for n, mm, used, bmm, bused in rows:
        ref = REFERENCE.get(n, (float('nan'), float('nan')))
        print(f"{n:>4}{mm:>14.2f}{used:>10.0%}{bmm:>15.2f}{bused:>11.0%}{ref[0]:>14.2f}{ref[1]:>10.0%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
