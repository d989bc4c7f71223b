"""5-stage with real bird2: pods joined by super-spines, DPF colours across five stages, and FARE
§4.2 (a super-spine's slower link reaches the remote leaf's weights)."""
from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from rlblab.traffic import QpReceiver, QpSender
from rlbfabric.bird.ctl import BirdClient

from .conftest import fabric_lab, scenario_passes

pytestmark = pytest.mark.netns
FABRIC = Path(__file__).resolve().parent.parent / "lab" / "fabric-5stage.toml"


@pytest.fixture(scope="module")
def lab():
    with fabric_lab(FABRIC, "rlb5t") as lab:
        yield lab


def test_colour_1_pinned_across_five_stages(lab):
    r = lab.routes("l2")["fc00:1:1:1::/64"]
    assert r["mode"] == "pinned" and r["nexthop"]["via"].endswith("%eth-s21")
    assert "AIGP 13" in r["why"]                       # 10 at l1, +1 per hop: s11, ss1, s21
    r = lab.routes("l1")["fc00:2:1:2::/64"]
    assert r["mode"] == "pinned" and r["nexthop"]["via"].endswith("%eth-s12")


def test_fare_5_stage_slow_superspine_link_reaches_the_remote_leaf(lab):
    [check] = scenario_passes("fare-4.2", lab)        # what `rlblab scenario fare-4.2` runs
    assert check.measured == {"eth-s21": 10000, "eth-s22": 5000}, check
    # what s22 heard from ss2: ss2's link towards s12 (5 Gb/s), one hop only
    paths = [p for p in BirdClient(str(lab.work / "s22.ctl")).routes() if p.net == "fc00:1:1:2::/64"]
    assert [p.path_bandwidth(0x89) for p in paths] == [pytest.approx(0.625e9)]
    leaf_view = [p for p in BirdClient(str(lab.work / "l2.ctl")).routes() if p.net == "fc00:1:1:2::/64"]
    assert all(p.path_bandwidth(0x89) is None for p in leaf_view)      # not past the spine


def forwarded(lab, switch: str, port: str) -> int:
    """Packets the switch's XDP program forwarded out of `port` (not what its kernel sent: BGP,
    BFD, heartbeats)."""
    ports = json.loads(lab.cli(switch, "status", "--json"))["ports"]
    return next(p["tx_packets"] for p in ports if p["interface"] == port)


def test_traffic_crosses_the_planes(lab):
    a, b = lab.host_addresses("h1"), lab.host_addresses("h2")
    before = {ss: forwarded(lab, s, f"eth-{ss}") for ss, s in (("ss1", "s11"), ("ss2", "s12"))}
    rx = QpReceiver(lab.ns("h2"))
    sender = QpSender(lab.ns("h1"), a[1], b[1], 2)
    try:
        sent = sender.send(100)
        time.sleep(0.3)
    finally:
        sender.close()
        rx.close()
    after = {ss: forwarded(lab, s, f"eth-{ss}") for ss, s in (("ss1", "s11"), ("ss2", "s12"))}
    assert len(rx.seen) == sent == 200
    for ss in ("ss1", "ss2"):                     # one QP per path, path k through plane k
        assert after[ss] - before[ss] == 100, (before, after)
