"""The rlblab command across separate invocations, as an operator uses it."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from rlblab import topo
from rlblab.workdir import lab_dir

pytestmark = pytest.mark.netns


def lab(*args: str) -> str:
    res = subprocess.run([sys.executable, "-m", "rlblab", *args, "--name", "rlbcl"],
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    return res.stdout


def uplinks_kb(traffic: str, leaf: str) -> list[float]:
    """A leaf's uplink kB from `rlblab traffic`'s table (2 spines: the first two numbers)."""
    row = next(line for line in traffic.splitlines() if line.startswith(leaf + " "))
    return [float(x) for x in row.split()[1:3]]


def test_up_status_traffic_fail_restore_down():
    try:
        out = lab("up", "--spines", "2", "--leaves", "2", "--hosts", "1")
        assert "up: rlbcl-s1" in out
        status = lab("status")                      # 2 spines, 2 leaves
        assert status.count("BGP 2 established") == 4
        l1 = next(line for line in status.splitlines() if line.split()[:2] == ["leaf", "l1"])
        assert "2 pinned" in l1
        js = json.loads(lab("status", "--json"))
        assert {n: e["bgp_established"] for n, e in js["switches"].items()} == {"s1": 2, "s2": 2, "l1": 2, "l2": 2}
        assert js["switches"]["l1"]["routes"]["pinned"] == 2 and js["mode"] == "rlb"
        traffic = lab("traffic", "--from", "h1", "--to", "h2", "--qps", "2", "--packets", "50")
        assert "uplinks 1.00 (best possible 1.00), downlinks 1.00 (best possible 1.00); 2 QPs" in traffic
        up = uplinks_kb(traffic, "l1")
        assert up[0] == pytest.approx(up[1], rel=0.05) and up[0] > 25   # 50 frames of ~570 B each
        assert "eth-s2 down" in lab("fail-link", "l1", "s2")
        traffic = lab("traffic", "--from", "h1", "--to", "h2", "--qps", "2", "--packets", "50")
        up = uplinks_kb(traffic, "l1")
        assert up[0] > 50 and up[1] < 2               # everything on s1 while s2's link is down
        # the link down is left out of the figures: all on l1's one live link is even there, and
        # the best there is into l2 as well (where both QPs must come in from s1)
        assert "down, left out of the figures: l1-s2" in traffic
        assert "uplinks 1.00 (best possible 2.00), downlinks 2.00 (best possible 2.00)" in traffic
        coord = lab("coordinator")                    # the lab's coordinators keep their state in etcd
        assert coord.startswith("2 hosts, ") and "dead uplinks: l1/2" in coord
        assert "eth-s2 up" in lab("restore-link", "l1", "s2")
    finally:
        lab("down")
    assert not [ns for ns in topo.list_ns() if ns.startswith("rlbcl-")]
    work = lab_dir("rlbcl")            # the logs stay; etcd's store (in /run's memory) and the keys go
    assert list(work.glob("agent-*.log")) and list(work.glob("etcd-*.log"))
    assert not list(work.glob("etcd-*.data")) and not (work / "etcd-creds").exists()


def test_errors_are_one_line():
    res = subprocess.run([sys.executable, "-m", "rlblab", "status", "--name", "nolab"],
                         capture_output=True, text=True)
    assert res.returncode != 0 and "no lab 'nolab' is up" in res.stderr
