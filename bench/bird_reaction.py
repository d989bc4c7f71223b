"""How fast a change in bird2 reaches the XDP maps: disable a leaf's BGP session to spine 2 and
time until the leaf's pinned route for the prefix of colour 2 points at its backup (spine 1).
Real bird2, real agent, the 2x2 lab fabric. Printed against the agent's poll interval and the
100 ms target."""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from rlbcommon import netns  # noqa: E402
from rlblab.fabriclab import FabricLab  # noqa: E402
from rlbswitch.birdctl import BirdClient  # noqa: E402
from rlbswitch.dataplane import SwitchDataplane  # noqa: E402

FABRIC = Path(__file__).resolve().parent.parent / "lab" / "fabric-2x2.toml"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--trials", type=int, default=5)
    args = ap.parse_args()
    lab = FabricLab(FABRIC, "rlbbr", hosts_agent=False)
    samples = []
    try:
        lab.up()
        lab.wait_converged(60)
        bird = BirdClient(str(lab.work / "l1.ctl"))
        with netns.inside(lab.ns("l1")):
            dp = SwitchDataplane(lab.ns("l1"))

            def via() -> str:
                r = next((r for r in dp.routes() if r["prefix"] == "fc00:2:1:2::/64"), {})
                return r.get("nexthop", {}).get("via", "")

            for _ in range(args.trials):
                for cmd, want in (("disable s2", "%eth-s1"), ("enable s2", "%eth-s2")):
                    t0 = time.perf_counter()
                    bird.command(cmd)
                    while not via().endswith(want):
                        if time.perf_counter() - t0 > 30:
                            raise TimeoutError(cmd)
                        time.sleep(0.002)
                    if cmd.startswith("disable"):
                        samples.append(time.perf_counter() - t0)
                    else:
                        time.sleep(0.5)
            dp.close()
    finally:
        lab.down()
    ms = [s * 1000 for s in samples]
    print(f"bird session disabled -> pinned route on its backup in the XDP maps ({args.trials} trials)")
    print(f"{'':<22}{'median ms':>10}{'max ms':>10}")
    print(f"{'measured':<22}{statistics.median(ms):>10.1f}{max(ms):>10.1f}")
    print(f"{'agent poll interval':<22}{50.0:>10.1f}")
    print(f"{'target':<22}{100.0:>10.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
