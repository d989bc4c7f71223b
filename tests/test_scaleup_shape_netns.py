"""The scale-up scenarios on another shape of fabric (lab/scaleup-small.toml: 3 planes, 3 GPUs,
2 sub-ports each, the last GPU spraying): their expected figures follow from the fabric file,
so the same scenario code must pass here with other numbers — a half plane's share is 1/5, a
sender's sub-cable moves its 10 or 11 QPs (64 over 6 sub-ports), a receiver's about 64/3 - 64/5."""
from __future__ import annotations

from pathlib import Path

import pytest

from .conftest import fabric_lab, scenario_passes

# exact fewest-move counts under probes and a software plane switch: run with the machine to
# itself, after make test's parallel part (docs/results.md, "The suite's time")
pytestmark = pytest.mark.alone

FABRIC = Path(__file__).resolve().parent.parent / "lab" / "scaleup-small.toml"


@pytest.fixture(scope="module")
def lab():
    with fabric_lab(FABRIC, "rlbs3", timeout=180) as lab:
        yield lab


def test_split_follows_the_fabric(lab):
    checks = scenario_passes("scaleup-3.1-split", lab)
    assert checks[2].expected.startswith("{1: 0.2, 2: 0.4, 3: 0.4}")     # a half plane of three


def test_sub_cable_moves_follow_the_fabric(lab):
    checks = scenario_passes("scaleup-3.1-subcable", lab)
    (sender, per_plane), (receiver, _) = checks[0].measured, checks[2].measured
    assert sorted(per_plane) == [1, 2, 3]
    assert sender >= 64 // 6 and 1 <= receiver <= 64 // 3     # a dead sub-port's QPs, a part of a plane's


def test_spray_follows_the_fabric(lab):
    checks = scenario_passes("scaleup-3.2-planes", lab)
    assert checks[0].measured == {1: 10.0, 2: 20.0, 3: 20.0}
