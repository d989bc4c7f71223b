"""Spines of another make: Debian's FRR 8.4 (no AIGP) in place of bird on s1 of the default lab
(lab/fabric-frr.toml), the kernel forwarding, with the configuration rlbfabric renders for it.
Sessions come up the standard unnumbered way (each leaf's link-local address from its router
advertisements) with the fabric's MD5 password and GTSM; the colour passes FRR, AIGP does not,
and every prefix is still pinned as in the all-bird lab; the split, and the failure of the FRR
spine's link, as there (the registered scenarios frr-table2 and frr-fig13)."""
from __future__ import annotations

import time
from pathlib import Path

import pytest

from rlbcommon.constants import COLOUR_COMMUNITY
from rlbcommon.netns import run
from rlblab import frr

from .conftest import fabric_lab, scenario_passes

pytestmark = [pytest.mark.netns,
              pytest.mark.skipif(not frr.available(), reason="FRR is not installed (apt-get install frr)")]
LAB = Path(__file__).resolve().parent.parent / "lab"


@pytest.fixture(scope="module")
def mixed():
    with fabric_lab(LAB / "fabric-frr.toml", "rlbfr", coordinator=False) as lab:
        yield lab


def test_frr_spine_peers_unnumbered_by_router_advertisements(mixed):
    """FRR's `neighbor eth-lN interface` learnt each leaf's link-local address from the leaf's
    RAs (none was written into its configuration) and the sessions run with the password and
    GTSM: established on both sides."""
    s1 = mixed.frrs["s1"]
    deadline = time.time() + 30
    while not all(s1.established().values()) and time.time() < deadline:
        time.sleep(0.5)
    assert s1.established() == {"eth-l1": True, "eth-l2": True}
    conf = s1.conf.read_text()
    # no link-local address was written (the random hex password may itself contain "fe80")
    assert "fe80:" not in conf and "neighbor eth-l1 interface remote-as 65001" in conf
    assert f"neighbor eth-l1 password {mixed.fabric.bgp.password}" in conf and "ttl-security hops 1" in conf
    for leaf in ("l1", "l2"):
        ll = run(mixed.ns(leaf), "ip", "-6", "-br", "addr", "show", "dev", "eth-s1").split()[2].split("/")[0]
        peer = s1.json(f"show bgp neighbors eth-{leaf} json")[f"eth-{leaf}"]
        assert peer["bgpState"] == "Established" and peer["hostLocal"].startswith("fe80")
        assert peer["hostForeign"] == ll                     # the leaf's address, as its RAs gave it
        text = s1.vtysh(f"show bgp neighbors eth-{leaf}")
        assert "may be up to 1 hops away" in text and "BFD: Type: single hop" in text
    assert "up" in s1.vtysh("show bfd peers brief") and s1.vtysh("show bfd peers brief").count(" up ") == 2


def test_frr_passes_the_colour_and_drops_aigp_and_every_prefix_stays_pinned(mixed):
    """What FRR received from l1 it passes to l2 with the colour; AIGP is gone (FRR 8.4 has none).
    l2 still pins every one of l1's 8 prefixes, colour k to spine k: colour 1 by its colour
    through s1, the others by AIGP through bird spines."""
    shown = run(mixed.ns("l2"), "birdc", "-s", str(mixed.work / "l2.ctl"), "show", "route", "for",
                "fc00:1:1:1::/64", "all")
    via = {block.split(" on ")[1].split()[0]: block for block in shown.split("\tvia ")[1:]}
    colour = f"(generic, {COLOUR_COMMUNITY:#x}, 0x1)"
    assert set(via) == {"eth-s1", "eth-s2", "eth-s3", "eth-s4"}
    assert colour in via["eth-s1"] and "BGP.aigp" not in via["eth-s1"]       # through FRR: colour, no AIGP
    # FARE path bandwidth: passed unchanged by FRR (the originating leaf's AS), rewritten by bird spines
    assert "(unknown 0x88, 65001," in via["eth-s1"] and "(unknown 0x88, 65000," in via["eth-s2"]
    routes = mixed.routes("l2")
    for p in (1, 2):
        for k in range(1, 5):
            r = routes[f"fc00:1:{p}:{k}::/64"]
            assert r["mode"] == "pinned" and r["nexthop"]["via"].endswith(f"%eth-s{k}"), (p, k, r)
    why = routes["fc00:1:1:1::/64"].get("why", "")
    assert "by colour 1" in why, routes["fc00:1:1:1::/64"]


def test_frr_mixed_fabric_pins_and_balances_as_the_all_bird_one(mixed):
    scenario_passes("frr-table2", mixed)


def test_frr_spine_link_failure_is_handled_as_with_bird(mixed):
    """l1's link to the FRR spine fails under traffic, then l1's link to a bird spine (s4) in
    the same lab: the same checks pass for both, and both lose almost nothing (the leaf's data
    plane moves the QPs as carrier goes; 4800 packets sent at 4000/s each time)."""
    from rlblab.kinds.clos import fig13
    frr_checks = scenario_passes("frr-fig13", mixed)
    bird_checks = fig13(mixed, "s4")
    assert all(c.ok for c in bird_checks), bird_checks
    lost = {spine: next(c.measured for c in checks if c.what.startswith("packets lost"))
            for spine, checks in (("s1 (FRR)", frr_checks), ("s4 (bird)", bird_checks))}
    print(f"\npackets lost to l1's link failing, of 4800: {lost}")
    assert all(n < 48 for n in lost.values()), lost


def test_two_frr_spines():
    with fabric_lab(LAB / "fabric-frr2.toml", "rlbf2", coordinator=False) as lab:
        assert set(lab.frrs) == {"s1", "s3"}
        scenario_passes("frr2-table2", lab)
