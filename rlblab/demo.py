"""The main demo: Juniper's example fabric (4 spines, 2 leaves, 2 GPU hosts per leaf, 4 prefixes
per host port) run twice, as today's fabrics run (kernel ECMP) and with RLB, the same QPs sent
through both, then a leaf-spine link failure during traffic. Every load figure comes from the
spines' kernel interface counters."""
from __future__ import annotations

import json
import random
import statistics
import threading
import time
import urllib.request
from pathlib import Path

from rlbcommon import netns
from rlbcommon.netns import run
from rlbcommon.paths import RUN_DIR
from rlbfabric import workloads
from rlbhost.dataplane import HostDataplane

from . import topo
from .chart import load_chart
from .fabriclab import FabricLab, balance
from .matrix import FORGET_S, run_matrix
from .traffic import Flow, QpReceiver, open_raw, send

FABRIC = Path(__file__).resolve().parent.parent / "lab" / "fabric.toml"
SEEDS = range(5)          # runs per scenario (different source ports and QP numbers)
SRC, DST = "h1", "h3"


def step(msg: str):
    print(f"==> {msg}", flush=True)


def measure(lab: FabricLab, n_qps: int) -> dict:
    runs = [lab.run_qps(SRC, DST, n_qps, 100, seed) for seed in SEEDS]
    b = [balance(r.links) for r in runs]
    return {"links": runs[0].links, "max_mean": statistics.mean(x["max_mean"] for x in b),
            "used": statistics.mean(x["links_used"] for x in b),
            "worst": max(x["max_mean"] for x in b)}


def failure(lab: FabricLab, rate: int = 2000, seconds: float = 3.0) -> dict:
    """4 QPs h1 -> h3 at `rate` packets/s; l1's uplink to s4 goes down half way."""
    rnd = random.Random(42)
    a, b = lab.host_addresses(SRC)[1], lab.host_addresses(DST)[1]
    flows = [Flow(a, b, rnd.randrange(49152, 65536), rnd.getrandbits(24)) for _ in range(4)]
    rx = QpReceiver(lab.ns(DST))
    sock = open_raw(lab.ns(SRC), "eth0")
    dmac, smac = topo.mac(lab.ns("l1"), f"eth-{SRC}"), topo.mac(lab.ns(SRC), "eth0")
    res = {}

    def sender():
        res["sent"] = send(sock, flows, int(rate * seconds / len(flows)), dmac=dmac, smac=smac,
                           payload_len=512, rate_pps=rate, burst=len(flows))

    c0 = lab.link_counts("l1")
    t = threading.Thread(target=sender)
    t.start()
    time.sleep(seconds / 2)
    with netns.inside(lab.ns(SRC)):          # which QP rides path 4 (spine 4)?
        hd = HostDataplane(lab.ns(SRC))
        on4 = {q["qp"] for q in hd.qps() if q["active"] and q["path"] == 3}
        hd.close()
    c1 = lab.link_counts("l1")
    t_fail = time.monotonic()
    run(lab.ns("l1"), "ip", "link", "set", "eth-s4", "down")
    t.join()
    time.sleep(0.3)
    c2 = lab.link_counts("l1")
    rx.close()
    sock.close()
    run(lab.ns("l1"), "ip", "link", "set", "eth-s4", "up")
    after = {k: c2[k] - c1[k] for k in c2}
    def longest_gap(affected: bool) -> float:
        times = [tm for tm, qp in rx.arrivals if (qp in on4) == affected]
        return max((b - a for a, b in zip(times, times[1:]) if b > t_fail - 0.1), default=0.0) * 1000

    return {"sent": res["sent"], "received": len(rx.seen), "before": {k: c1[k] - c0[k] for k in c1},
            "after": after, "gap_ms": longest_gap(True), "other_gap_ms": longest_gap(False),
            "interval_ms": 1000 * len(flows) / rate}


MANY = (("h1->h3 + h2->h4, 1 QP each", [("h1", "h3"), ("h2", "h4")], 1),
        ("h1->h3 + h2->h4, 2 QPs each", [("h1", "h3"), ("h2", "h4")], 2),
        ("all-to-all h1-h4, 1 QP per pair", "all-to-all", 1),
        ("all-to-all h1-h4, 3 QPs per pair", "all-to-all", 3))
MANY_SEEDS = range(3)


def many_to_many(lab: FabricLab) -> dict:
    """Every host of the matrix sends at once; the worst leaf's max/mean on uplinks and downlinks.
    RLB: the first burst is the hosts' local rule, the second the coordinator's placement."""
    out = {}
    for label, conns, per in MANY:
        if isinstance(conns, str):
            conns = workloads.connections(conns, lab.hosts)
        runs = []
        for seed in MANY_SEEDS:
            runs.append(run_matrix(lab, conns, per, packets=150, seed=seed, bursts=1 if lab.mode == "baseline" else 2))
            if lab.mode != "baseline":
                time.sleep(FORGET_S)
        worst = lambda b: statistics.mean(max(r.figures(b)) for r in runs)   # noqa: E731
        out[label] = {"best": max(runs[0].best(lab.fabric)), "first": worst(0), "last": worst(-1)}
    return out


def many_table(base: dict, rlb: dict) -> list[str]:
    out = [f"{'':<34}{'best':>6}{'kernel ECMP':>13}{'RLB local':>11}{'RLB coordinated':>17}"]
    for label in base:
        out.append(f"{label:<34}{base[label]['best']:>6.2f}{base[label]['first']:>13.2f}"
                   f"{rlb[label]['first']:>11.2f}{rlb[label]['last']:>17.2f}")
    return out


def table(results: dict) -> list[str]:
    spines = list(next(iter(results.values()))["links"])
    out = [f"{'':<22}" + "".join(f"{'to ' + s:>10}" for s in spines) + f"{'max/mean':>10}{'worst':>8}{'used':>7}"]
    for name, r in results.items():
        kb = "".join(f"{v / 1000:>10.0f}" for v in r["links"].values())
        out.append(f"{name:<22}{kb}{r['max_mean']:>10.2f}{r['worst']:>8.2f}{r['used']:>7.0%}")
    return out


def main(keep: bool = False, chart: Path | None = Path("rlb-demo.png")) -> int:
    t0 = time.time()
    results, many = {}, {}
    for mode, label in (("baseline", "kernel ECMP"), ("rlb", "RLB")):
        step(f"building the fabric as {label} ({'bird ECMP into the kernel, hash policy 1' if mode == 'baseline' else 'bird + XDP switches + rlbhost'})")
        lab = FabricLab(FABRIC, "rlbdemo", mode=mode, etcd=mode == "rlb")   # the coordinator on etcd
        lab.up()
        lab.wait_converged(120)
        for n in (4, 8):
            step(f"{label}: {n} QPs {SRC} -> {DST}, {len(SEEDS)} runs with different source ports")
            results[f"{label}, {n} QPs"] = measure(lab, n)
        step(f"{label}: every host sending at once ({len(MANY)} matrices, {len(MANY_SEEDS)} runs each)")
        many[mode] = many_to_many(lab)
        if mode == "baseline":
            lab.down()
    order = ["kernel ECMP, 4 QPs", "RLB, 4 QPs", "kernel ECMP, 8 QPs", "RLB, 8 QPs"]
    print("\nuplink load of leaf l1 (kB, first run), max/mean (mean and worst of the runs), links used")
    for line in table({k: results[k] for k in order}):
        print(line)
    print("\nmany-to-many: the worst leaf's max/mean over uplinks and downlinks (mean of the runs; "
          "RLB local = the hosts alone, first burst; coordinated = after one burst)")
    for line in many_table(many["baseline"], many["rlb"]):
        print(line)
    if chart:
        try:
            load_chart(results, chart, "Leaf l1 uplink load from the spines' kernel counters "
                       f"(bars: first run; max/mean: mean of {len(SEEDS)} runs)")
            print(f"chart: {chart.resolve()}")
        except ImportError:
            print("chart skipped: matplotlib is not installed (pip install 'rlb[lab]')")
    print()
    try:
        step("failing l1's uplink to s4 during traffic: 4 QPs at 2000 packets/s")
        f = failure(lab)
        moved = [s for s in ("s1", "s2", "s3") if f["after"][s] > f["before"][s] * 1.3]
        print(f"    before: {f['before']}\n    after:  {f['after']}")
        print(f"    the QP pinned to s4 moved to {', '.join(moved) or '?'} by DLB, the others stayed; "
              f"{f['sent'] - f['received']} of {f['sent']} packets lost")
        print(f"    longest gap after the failure: {f['gap_ms']:.1f} ms for that QP, {f['other_gap_ms']:.1f} ms "
              f"for the untouched QPs (the sender's own jitter; packets every {f['interval_ms']:.1f} ms)")
        step("metrics")
        with netns.inside(lab.ns("l1")):
            body = urllib.request.urlopen("http://127.0.0.1:9471/metrics", timeout=5).read().decode()
        n = sum(1 for line in body.splitlines() if line.startswith("rlb_switch_"))
        print(f"    {n} series at http://127.0.0.1:9471/metrics in each switch's namespace "
              f"(host agents on :9472), e.g. ip netns exec {lab.ns('l1')} curl -s 127.0.0.1:9471/metrics")
        print(f"\ndone in {time.time() - t0:.0f} s")
    finally:
        if keep:
            (RUN_DIR / "lab-rlbdemo.json").write_text(json.dumps({"fabric": str(FABRIC), "mode": "rlb", "shape": False}))
            print("lab kept: rlblab status --name rlbdemo; rlblab down --name rlbdemo")
        else:
            step("tearing down")
            lab.down()
    return 0
