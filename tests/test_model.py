"""Route and next-hop input: what operators type, and the errors they get."""
import pytest

from rlbcommon.cheader import enum_names
from rlbfabric.routes import MODES, NextHop, Route, RouteError
from rlbswitch.abi import HEADER, MODE_IDS


def test_nexthop_forms():
    assert NextHop.parse("fe80::1%eth1") == NextHop("eth1", gateway="fe80::1")
    assert NextHop.parse("FE80::0001%eth1=3") == NextHop("eth1", gateway="fe80::1", weight=3)
    assert NextHop.parse("eth2@02:AA:00:00:00:01") == NextHop("eth2", mac="02:aa:00:00:00:01")
    assert str(NextHop.parse("fe80::1%eth1=3")) == "fe80::1%eth1=3"


@pytest.mark.parametrize("text,msg", [
    ("eth1", "use ADDRESS%IFACE"),
    ("zz::1%eth1", "not an IPv6 address"),
    ("fe80::1%eth1=x", "not a whole number"),
    ("fe80::1%eth1=0", "at least 1"),
    ("eth1@02:00", "not a MAC"),
    ("fe80::1%" + "x" * 20, "not an interface name"),
])
def test_nexthop_errors(text, msg):
    with pytest.raises(RouteError, match=msg):
        NextHop.parse(text)


def test_route_rules():
    a, b = NextHop.parse("fe80::1%e1"), NextHop.parse("fe80::2%e2=5")
    assert Route("fc00::/64", "ecmp", [a, b]).nexthops[1].weight == 1
    with pytest.raises(RouteError, match="exactly one"):
        Route("fc00::/64", "pinned", [a, b])
    with pytest.raises(RouteError, match="only for pinned"):
        Route("fc00::/64", "dlb", [a], [b])
    with pytest.raises(RouteError, match="needs --dev"):
        Route("fc00::/64", "connected")
    with pytest.raises(RouteError, match="choose one of"):
        Route("fc00::/64", "random", [a])
    with pytest.raises(RouteError, match="prefix"):
        Route("fc00::1/64", "dlb", [a])
    with pytest.raises(RouteError, match="twice"):
        Route("fc00::/64", "dlb", [a, a])


def test_the_modes_operators_name_are_the_programs_and_ecmp():
    """One list of forwarding modes: the program's enum rlb_mode (bpf/rlb_switch.h), which the
    switch's MODE_IDS is read from; an operator may also say ecmp (weighted, weights 1)."""
    program = {name for name in enum_names(HEADER, "RLB_MODE_").values() if name != "none"}
    assert set(MODE_IDS) == program and set(MODES) == program | {"ecmp"} and len(MODES) == len(set(MODES))

