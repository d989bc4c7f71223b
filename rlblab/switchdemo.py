"""The switch demo: one XDP switch, four parallel links, the same QPs under each forwarding mode,
then a link failure during traffic. Every number printed comes from kernel interface
counters on the far side of the links, not from RLB's own counters."""
from __future__ import annotations

import json
import random
import threading
import time
import urllib.request

from rlbcommon import netns
from rlbcommon.netns import run

from .switchlab import SwitchLab
from .traffic import Flow

PACKETS = 400   # per QP per scenario


def step(msg: str):
    print(f"==> {msg}", flush=True)


def table_row(name: str, got: dict[int, int]) -> str:
    total = sum(got.values()) or 1
    mean = total / len(got)
    cells = "".join(f"{got[k]:>9}" for k in sorted(got))
    used = sum(1 for v in got.values() if v > PACKETS // 10)
    return (f"{name:<34}{cells}{max(got.values()) / mean:>10.2f}{used:>6}/{len(got)}")


def header(n: int) -> str:
    return f"{'scenario':<34}" + "".join(f"{'link' + str(k):>9}" for k in range(1, n + 1)) + \
        f"{'max/mean':>10}{'used':>8}"


def route(lab: SwitchLab, prefix: str, mode: str, vias: list[str], backups: list[str] = ()):
    args = ["route", "add", prefix, "-m", mode]
    for v in vias:
        args += ["--via", v]
    for b in backups:
        args += ["--backup", b]
    lab.cli(*args)


def clear(lab: SwitchLab):
    for r in json.loads(lab.cli("route", "show", "--json")):
        lab.cli("route", "del", r["prefix"])


def qps(n: int, dst: str, seed: int) -> list[Flow]:
    """n QPs between two GPUs: one address pair, UDP 4791, random source ports and QP numbers."""
    rnd = random.Random(seed)
    return [Flow("fc00:1::1", dst, rnd.randrange(49152, 65536), rnd.getrandbits(24)) for _ in range(n)]


def main(keep: bool = False, links: int = 4) -> int:  # noqa: C901 - a script of steps
    # veths claim 10 Gb/s; declare what this lab really carries so DLB's load bands mean something
    lab = SwitchLab("rlbdemo", links, speed_mbps=100)
    t0 = time.time()
    try:
        step(f"building the lab: source host, XDP switch, {links} parallel links, destination")
        lab.up()
        lab.cli("config", "--hash-seed", "1")
        up = list(lab.uplinks())
        rows = []

        step("ECMP (equal-weight slots, QP-aware hash): 4 and 8 QPs between two GPUs")
        route(lab, "fc00:2::/64", "ecmp", [lab.nexthop(k) for k in up])
        lab.wait_resolved()
        for n in (4, 8):
            rows.append(table_row(f"ecmp, {n} QPs", lab.measure(qps(n, "fc00:2::1", n), PACKETS)[1]))

        step("weighted 4:2:1:1 (FARE-style), 400 flows")
        route(lab, "fc00:2::/64", "weighted", [lab.nexthop(k, w) for k, w in zip(up, (4, 2, 1, 1))])
        rnd = random.Random(3)
        many = [Flow("fc00:1::1", f"fc00:2::{rnd.getrandbits(16):x}", rnd.randrange(1024, 65536),
                     rnd.getrandbits(24)) for _ in range(400)]
        sent, got = lab.measure(many, 10)
        rows.append(table_row("weighted 4:2:1:1, 400 flows", got))

        step("DLB (flowlets on port quality), 8 QPs")
        route(lab, "fc00:2::/64", "dlb", [lab.nexthop(k) for k in up])
        with lab.dataplane() as dp:
            ev0 = dp.stats()["reasons"]
        rows.append(table_row("dlb, 8 QPs", lab.measure(qps(8, "fc00:2::1", 8), PACKETS)[1]))
        with lab.dataplane() as dp:
            ev1 = dp.stats()["reasons"]
        dlb_note = (f"dlb: {ev1['ev_dlb_assign'] - ev0['ev_dlb_assign']} flowlets placed by port load, "
                    f"{ev1['ev_dlb_reassign'] - ev0['ev_dlb_reassign']} moved after a gap")

        step("pinned (BGP-DPF): prefix k pinned to link k, other links as DLB backups")
        clear(lab)
        for k in up:
            route(lab, f"fc00:2:0:{k}::/64", "pinned", [lab.nexthop(k)],
                  [lab.nexthop(b) for b in up if b != k])
        lab.wait_resolved()
        pinned = [Flow("fc00:1::1", f"fc00:2:0:{k}::1", 50000 + k, 100 + k) for k in up]
        rows.append(table_row("pinned, 4 QPs (one per prefix)", lab.measure(pinned, PACKETS)[1]))

        print()
        print(header(links))
        for r in rows:
            print(r)
        print(f"({dlb_note}; weighted is uneven by design: shares follow 4:2:1:1)")
        print()

        step(f"failing link {links} during traffic: 1 QP on prefixes 1-{links - 1}, 8 QPs on prefix {links}")
        flows = [Flow("fc00:1::1", f"fc00:2:0:{k}::1", 50000 + k, 100 + k) for k in up[:-1]]
        flows += [Flow("fc00:1::1", f"fc00:2:0:{links}::1", 53000 + q, 2000 + q) for q in range(8)]
        rate, seconds = 5000, 2.0
        rounds = int(rate * seconds / len(flows))
        before = lab.link_packets()
        res = {}
        th = threading.Thread(target=lambda: res.update(sent=lab.send(flows, rounds, rate_pps=rate,
                                                                      burst=len(flows))))
        th.start()
        time.sleep(seconds / 2)
        t_fail = time.time()
        run(lab.dst, "ip", "link", "set", f"sw{links}", "down")
        th.join()
        time.sleep(0.2)
        after = lab.link_packets()
        got = {k: after[k] - before[k] for k in up}
        lost = res["sent"] - sum(got.values())
        with lab.dataplane() as dp:
            ev = dp.stats()["reasons"]
        print(f"    sent {res['sent']} packets at {rate} pps; per link: "
              + ", ".join(f"link{k} {got[k]}" for k in up))
        print(f"    the {8} QPs of prefix {links} moved to links "
              f"{', '.join(str(k) for k in up[:-1] if got[k] > rounds * 1.2)} by DLB; "
              f"lost {lost} packets = {lost / rate * 1000:.1f} ms of traffic; "
              f"{ev['ev_failover']} packets took the failover path")
        run(lab.dst, "ip", "link", "set", f"sw{links}", "up")
        del t_fail

        step("metrics")
        with lab.dataplane():
            try:
                with netns.inside(lab.sw):
                    body = urllib.request.urlopen("http://127.0.0.1:9471/metrics", timeout=5).read().decode()
                lines = [line for line in body.splitlines() if line.startswith("rlb_switch_port_tx_bytes")]
                print(f"    Prometheus metrics at http://127.0.0.1:9471/metrics inside namespace {lab.sw}, e.g.")
                for line in lines[:5]:
                    print(f"      {line}")
            except OSError as e:
                print(f"    metrics not reachable: {e}")
        print(f"\ndone in {time.time() - t0:.0f} s")
        if keep:
            print(f"lab kept: namespaces {lab.src} {lab.sw} {lab.dst}; "
                  f"try: rlbswitch --netns {lab.sw} route show; remove with: rlblab down")
        return 0
    finally:
        if not keep:
            step("tearing down")
            lab.down()
