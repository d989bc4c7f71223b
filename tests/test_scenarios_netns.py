"""The seeds' scenarios (rlblab/scenarios.py, what `rlblab scenario NAME` runs) on their labs,
with real bird2, XDP, rlbhost and traffic, judged by spine counters. Each test runs the same
function the CLI runs and asserts that every check passed."""
from __future__ import annotations

import subprocess
import sys

import pytest

from rlbcommon import netns
from rlbhost.dataplane import HostDataplane
from rlblab.scenarios import LAB_DIR, SCENARIOS

from .conftest import fabric_lab, scenario_passes as passes

pytestmark = pytest.mark.netns


@pytest.fixture(scope="module")
def rlb():
    with fabric_lab(LAB_DIR / "fabric.toml", "rlbsc") as lab:
        yield lab


def test_fig10_kernel_ecmp_collides_in_some_runs():
    with fabric_lab(LAB_DIR / "fabric.toml", "rlbsb", mode="baseline") as lab:
        passes("juniper-fig10", lab)


def test_fig11_rlb_puts_exactly_one_qp_per_spine(rlb):
    passes("juniper-fig11", rlb)


def test_table2_fig8_remote_leaf_reaches_prefix_k_through_spine_k(rlb):
    passes("juniper-table2", rlb)


def test_fig13_uplink_failure_spreads_prefix_4_by_dlb_and_pinning_returns(rlb):
    passes("juniper-fig13", rlb)


def test_scale_up_3_1_degraded_host_path_moves_the_minimum(rlb):
    passes("scaleup-3.1-host", rlb)
    with netns.inside(rlb.ns("h1")):
        hd = HostDataplane(rlb.ns("h1"))
        assert hd.stats()["reasons"]["ev_released"] >= 2
        hd.close()


def test_scale_up_3_2_one_qp_sprayed_per_packet_by_the_switches():
    with fabric_lab(LAB_DIR / "fabric-spray.toml", "rlbsp") as lab:
        checks = passes("scaleup-3.2-spray", lab)
        assert len(checks[1].measured) == 4                  # all four uplinks carried it
        assert lab.routes("l2")["fc00:1:1:1::/64"]["mode"] == "pinned"   # only fc00:2::/32 sprays


def test_scenario_cli_lists_every_scenario_and_refuses_unknown_names():
    out = subprocess.run([sys.executable, "-m", "rlblab", "scenario", "--list"], capture_output=True,
                         text=True, check=True).stdout
    assert [line.split()[0] for line in out.splitlines()] == list(SCENARIOS)
    bad = subprocess.run([sys.executable, "-m", "rlblab", "scenario", "nope"], capture_output=True, text=True)
    assert bad.returncode == 2 and "juniper-fig13" in bad.stderr
    none = subprocess.run([sys.executable, "-m", "rlblab", "scenario", "scaleup-silent", "--repeat", "0"],
                          capture_output=True, text=True)
    assert none.returncode == 2 and "--repeat" in none.stderr
