"""How fast a change in bird2 reaches the XDP maps, on the 2x2 lab fabric with real bird2 and
agents, printed against the targets:

1. a leaf's BGP session to spine 2 disabled: time until the leaf's pinned route for the prefix of
   colour 2 points at its backup (bird change -> XDP maps; target median < 10 ms);
2. spine 2's link to the remote leaf fails (only the spine sees it; the source leaf learns by
   BGP): time until the source leaf's maps move that prefix off spine 2, and the packets a QP on
   it loses at 10 kpps (target 20 ms);
3. the leaf agent's CPU while nothing changes (target < 1 % of a core).

    .venv/bin/python bench/bird_reaction.py [--trials 10]"""
from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from rlbcommon import netns  # noqa: E402
from rlblab import topo  # noqa: E402
from rlblab.fabriclab import FabricLab  # noqa: E402
from rlblab.traffic import Flow, QpReceiver, open_raw, send  # noqa: E402
from rlbfabric.bird.ctl import BirdClient  # noqa: E402
from rlbswitch.dataplane import SwitchDataplane  # noqa: E402

FABRIC = Path(__file__).resolve().parent.parent / "lab" / "fabric-2x2.toml"
PREFIX = "fc00:2:1:2::/64"          # l2's host prefix of colour 2: pinned at l1 through s2


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def wait_for(pred, timeout=30.0, step=0.0005) -> float:
    t0 = time.perf_counter()
    while not pred():
        if time.perf_counter() - t0 > timeout:
            raise TimeoutError
        time.sleep(step)
    return time.perf_counter() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trials", type=int, default=10)
    args = ap.parse_args()
    lab = FabricLab(FABRIC, "rlbbr", coordinator=False)
    session, link, lost, idle = [], [], [], None
    try:
        lab.up()
        lab.wait_converged(60)
        bird = BirdClient(str(lab.work / "l1.ctl"))
        with netns.inside(lab.ns("l1")):
            dp = SwitchDataplane(lab.ns("l1"))

            def via() -> str:
                r = dp.maps["routes"].get(dp._lpm_key(__import__("ipaddress").IPv6Network(PREFIX)))
                return "" if r is None else dp.ifname(dp.maps["nexthops"].get(r.nexthop).ifindex) if r.nexthop else "dlb"

            def settled():
                wait_for(lambda: via() == "eth-s2", 60, 0.05)
                time.sleep(1.0)

            settled()
            for _ in range(args.trials):                         # 1: a session disabled in bird
                t0 = time.perf_counter()
                bird.command("disable s2")
                wait_for(lambda: via() != "eth-s2")
                session.append(time.perf_counter() - t0)
                bird.command("enable s2")
                settled()
            agent = lab.agents["l1"].pid                           # 3: idle CPU
            c0, t0 = cpu_seconds(agent), time.monotonic()
            time.sleep(10)
            idle = (cpu_seconds(agent) - c0) / (time.monotonic() - t0)
            rnd = random.Random(1)
            a, b = lab.host_addresses("h1")[1], lab.host_addresses("h2")[1]
            dmac, smac = topo.mac(lab.ns("l1"), "eth-h1"), topo.mac(lab.ns("h1"), "eth0")
            for _ in range(args.trials):                         # 2: spine 2 loses its link to l2
                flows = [Flow(a, b, rnd.randrange(49152, 65536), rnd.getrandbits(24)) for _ in range(2)]
                rx = QpReceiver(lab.ns("h2"))
                sock = open_raw(lab.ns("h1"), "eth0")
                sent = {}
                t = threading.Thread(target=lambda: sent.setdefault("n", send(
                    sock, flows, 10000, dmac, smac, 64, rate_pps=10000, burst=2)))
                t.start()
                time.sleep(0.5)
                t0 = time.perf_counter()
                netns.run(lab.ns("s2"), "ip", "link", "set", "eth-l2", "down")
                wait_for(lambda: via() != "eth-s2")
                link.append(time.perf_counter() - t0)
                t.join()
                time.sleep(0.2)
                rx.close()
                sock.close()
                lost.append(sent["n"] - len(rx.seen))
                netns.run(lab.ns("s2"), "ip", "link", "set", "eth-l2", "up")
                settled()
            dp.close()
    finally:
        lab.down()
    ms = lambda xs: (statistics.median(xs) * 1000, max(xs) * 1000)   # noqa: E731
    print(f"bird2 -> XDP maps on the 2x2 fabric, {args.trials} trials each; push (netlink route events "
          f"from bird's kernel export), full resync every 1 s")
    print(f"{'':<58}{'median':>10}{'worst':>10}{'target':>10}")
    print(f"{'session to s2 disabled in bird -> maps (ms)':<58}{ms(session)[0]:>10.1f}{ms(session)[1]:>10.1f}{'< 10':>10}")
    print(f"{'s2 loses its link to l2 -> l1 moves the prefix (ms)':<58}{ms(link)[0]:>10.1f}{ms(link)[1]:>10.1f}{'< 20':>10}")
    print(f"{'  packets the QP via s2 lost (10 kpps, 5 per QP)':<58}{statistics.median(lost):>10.0f}{max(lost):>10.0f}")
    print(f"{'idle leaf agent (share of one core)':<58}{idle * 100:>9.2f}%{'':>10}{'< 1 %':>10}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
