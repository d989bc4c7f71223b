"""The seeds' scenarios on Juniper's example fabric (4 spines, 2 leaves, 2 GPU hosts per leaf, 4
prefixes per host port), with real bird2, XDP, rlbhost and traffic, judged by spine counters."""
from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from rlbcommon import netns
from rlbcommon.netns import run
from rlbhost.dataplane import HostDataplane
from rlblab.fabriclab import FabricLab, balance

from .conftest import fabric_lab

pytestmark = pytest.mark.netns
FABRIC = Path(__file__).resolve().parent.parent / "lab" / "fabric.toml"
SEEDS = range(6)


@pytest.fixture(scope="module")
def rlb():
    with fabric_lab(FABRIC, "rlbsc") as lab:
        yield lab


def qps_per_link(r: dict, n: int) -> dict[str, int]:
    total = sum(r["links"].values())
    return {k: round(v / total * n) for k, v in r["links"].items()}


def test_fig10_kernel_ecmp_collides_in_some_runs():
    lab = FabricLab(FABRIC, "rlbsb", mode="baseline")
    try:
        lab.up()
        lab.wait_converged(120)
        runs = [balance(lab.run_qps("h1", "h3", 4, 50, seed)["links"]) for seed in SEEDS]
    finally:
        lab.down()
    print("\nkernel ECMP, 4 QPs, max/mean per run:", [round(b["max_mean"], 2) for b in runs])
    assert any(b["max_mean"] >= 1.5 for b in runs)            # two QPs on one spine, at least once
    assert all(b["links_used"] <= 1.0 for b in runs)


def test_fig11_rlb_puts_exactly_one_qp_per_spine(rlb):
    for seed in SEEDS:
        r = rlb.run_qps("h1", "h3", 4, 50, seed)
        assert balance(r["links"])["max_mean"] <= 1.02, r
        assert qps_per_link(r, 4) == {"s1": 1, "s2": 1, "s3": 1, "s4": 1}


def test_table2_fig8_remote_leaf_reaches_prefix_k_through_spine_k(rlb):
    routes = rlb.routes("l2")
    for port in (1, 2):
        for k in range(1, 5):
            r = routes[f"fc00:1:{port}:{k}::/64"]
            assert r["mode"] == "pinned" and r["nexthop"]["via"].endswith(f"%eth-s{k}"), r
    # and traffic the other way round uses l2's uplinks one QP each
    r = rlb.run_qps("h3", "h1", 4, 50, seed=7)
    assert qps_per_link(r, 4) == {"s1": 1, "s2": 1, "s3": 1, "s4": 1}


def test_fig13_uplink_failure_spreads_prefix_4_by_dlb_and_pinning_returns(rlb):
    """12 QPs (3 per path). l1's uplink to s4 fails: path 4's QPs go to s1-s3 by DLB, the other
    QPs stay where they were; the link comes back: s4 carries path 4 again."""
    res = {}

    def traffic():
        res["r"] = rlb.run_qps("h1", "h3", 12, 400, seed=3, rate_pps=4000)

    before = rlb.run_qps("h1", "h3", 12, 20, seed=3)
    assert qps_per_link(before, 12) == {"s1": 3, "s2": 3, "s3": 3, "s4": 3}
    t = threading.Thread(target=traffic)
    t.start()
    try:
        time.sleep(0.4)
        run(rlb.ns("l1"), "ip", "link", "set", "eth-s4", "down")
        t.join()
        during = rlb.run_qps("h1", "h3", 12, 20, seed=3)
        q = qps_per_link(during, 12)
        assert q["s4"] == 0 and sum(q.values()) == 12
        assert all(q[s] >= 3 for s in ("s1", "s2", "s3"))     # nobody lost their own QPs
        deadline = time.time() + 10                          # bird withdraws: DLB, not a new pin
        while rlb.routes("l1")["fc00:2:1:4::/64"]["mode"] != "dlb" and time.time() < deadline:
            time.sleep(0.2)
        assert rlb.routes("l1")["fc00:2:1:4::/64"]["mode"] == "dlb"
    finally:
        t.join()
        run(rlb.ns("l1"), "ip", "link", "set", "eth-s4", "up")
    deadline = time.time() + 30
    while time.time() < deadline:
        r = rlb.routes("l1")["fc00:2:1:4::/64"]
        if r["mode"] == "pinned" and r["nexthop"]["via"].endswith("%eth-s4") and r["nexthop"]["port_up"]:
            break
        time.sleep(0.3)
    after = rlb.run_qps("h1", "h3", 12, 20, seed=3)
    assert qps_per_link(after, 12) == {"s1": 3, "s2": 3, "s3": 3, "s4": 3}


def test_scale_up_3_1_degraded_host_path_moves_the_minimum(rlb):
    """8 QPs (2 per path); h1's path 4 at half weight: 8 x (1,1,1,0.5)/3.5 -> 3,2,2,1 by largest
    remainder, so exactly one QP moves, from path 4 to path 1; recovery moves it back."""
    rlb.cli("h1", "config", "--expiry-ms", "60000")       # keep QPs active across the change
    try:
        first = qps_per_link(rlb.run_qps("h1", "h3", 8, 20, seed=5), 8)
        assert first == {"s1": 2, "s2": 2, "s3": 2, "s4": 2}
        out = rlb.cli("h1", "weights", "set", "4=0.5")
        assert "1 QPs moved" in out
        degraded = qps_per_link(rlb.run_qps("h1", "h3", 8, 20, seed=5), 8)
        assert degraded == {"s1": 3, "s2": 2, "s3": 2, "s4": 1}
        out = rlb.cli("h1", "weights", "set", "4=1")
        assert "1 QPs moved" in out
        assert qps_per_link(rlb.run_qps("h1", "h3", 8, 20, seed=5), 8) == first
    finally:
        rlb.cli("h1", "weights", "set", "4=1")
        rlb.cli("h1", "config", "--expiry-ms", "200")
    with netns.inside(rlb.ns("h1")):
        hd = HostDataplane(rlb.ns("h1"))
        assert hd.stats()["reasons"]["ev_released"] >= 2
        hd.close()
