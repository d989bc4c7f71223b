"""Two links between each leaf and spine (Juniper's second case): colour k rides its own link,
so 4 QPs use 4 links of 2 spines, one each."""
from __future__ import annotations

from pathlib import Path

import pytest

from rlblab.fabriclab import balance

from .conftest import fabric_lab

pytestmark = pytest.mark.netns
FABRIC = Path(__file__).resolve().parent.parent / "lab" / "fabric-parallel.toml"
PORT_OF_COLOUR = {1: "eth-s1-1", 2: "eth-s1-2", 3: "eth-s2-1", 4: "eth-s2-2"}


@pytest.fixture(scope="module")
def lab():
    with fabric_lab(FABRIC, "rlbpl") as lab:
        yield lab


def test_remote_leaf_pins_colour_k_to_its_link(lab):
    routes = lab.routes("l2")
    for k, port in PORT_OF_COLOUR.items():
        r = routes[f"fc00:1:1:{k}::/64"]
        assert r["mode"] == "pinned" and r["nexthop"]["via"].endswith(f"%{port}"), (k, r)
        assert len(r["backups"]) == 3


def test_four_qps_one_per_link(lab):
    r = lab.run_qps("h1", "h2", 4, 50, seed=2)
    total = sum(r.links.values())
    assert {k: round(v / total * 4) for k, v in r.links.items()} == \
        {"s1-1": 1, "s1-2": 1, "s2-1": 1, "s2-2": 1}
    assert balance(r.links)["max_mean"] <= 1.02
