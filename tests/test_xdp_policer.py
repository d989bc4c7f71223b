"""The switch's slow path is policed in XDP (BPF_PROG_TEST_RUN, real program and maps): punts
are charged to a bucket by reason and by the class of the port they came in on, so a host's flood
is dropped before the kernel while the fabric's own BGP, BFD and ND keep their bucket."""
from __future__ import annotations

import pytest

from rlbcommon import packets as P
from rlbcommon.testrun import XdpMd, prog_test_run
from rlbswitch.abi import POLICE
from rlbswitch.dataplane import POLICE_DEFAULTS

XDP_DROP, XDP_PASS = 1, 2


def from_port(xdp, k: int, frame: bytes) -> int:
    ctx = XdpMd(data=0, data_end=len(frame), ingress_ifindex=xdp.ifindex[k])
    return prog_test_run(xdp.dp.prog_fd, frame, ctx=bytes(ctx)).retval


def ttl1(dst="fc00:9::1") -> bytes:
    return P.roce_frame("fc00:1::1", dst, 50000, 1, hop_limit=1)


def bgp_syn(src="fc00:1::1", dst="fc00:9::1") -> bytes:
    tcp = bytearray(20)
    tcp[0:2], tcp[2:4], tcp[12], tcp[13] = (40000).to_bytes(2, "big"), (179).to_bytes(2, "big"), 0x50, 0x02
    return P.ipv6_frame(src, dst, 6, bytes(tcp))


@pytest.fixture
def policed(fresh):
    fresh.dp.set_port_class(fresh.ifindex[1], edge=True)       # p1 faces a host
    fresh.dp.set_port_class(fresh.ifindex[0], edge=False)      # p0 another switch
    for name, (rate, burst) in POLICE_DEFAULTS.items():
        fresh.dp.set_police(name, rate, burst)
    fresh.dp.set_police("edge_control", 100, 10)
    fresh.dp.set_police("hop_limit", 100, 5)
    yield fresh
    fresh.police_off()


def dropped(xdp) -> dict:
    return {k: v["dropped"] for k, v in xdp.dp.police().items()}


def test_defaults_are_set_on_first_load_and_shown(xdp):
    from rlbswitch.dataplane import SwitchDataplane
    assert set(POLICE.values()) == set(POLICE_DEFAULTS)
    fresh_dp = SwitchDataplane(xdp.ns)          # what a new agent reads back
    try:
        got = fresh_dp.police()
    finally:
        fresh_dp.close()
    assert all(set(v) == {"rate", "burst", "dropped"} for v in got.values())


def test_a_hosts_flood_of_bgp_packets_is_cut_to_its_burst_and_the_fabrics_bgp_passes(policed):
    before = dropped(policed)
    edge = [from_port(policed, 1, bgp_syn()) for _ in range(200)]
    fabric = [from_port(policed, 0, bgp_syn(src="fe80::2", dst="fe80::1")) for _ in range(200)]
    # the flood: its burst (10) and the odd packet the rate refills while the loop runs
    assert 10 <= edge.count(XDP_PASS) <= 30 and edge.count(XDP_DROP) == 200 - edge.count(XDP_PASS)
    assert fabric.count(XDP_PASS) == 200          # the fabric's own control traffic: untouched
    after = dropped(policed)
    assert after["edge_control"] - before["edge_control"] == edge.count(XDP_DROP)
    assert after["fabric_control"] == before["fabric_control"]


def test_ttl_expiry_has_its_own_bucket(policed):
    before = dropped(policed)
    got = [from_port(policed, 1, ttl1()) for _ in range(100)]
    assert 5 <= got.count(XDP_PASS) <= 20
    assert dropped(policed)["hop_limit"] - before["hop_limit"] == got.count(XDP_DROP)
    # ND from the same host port: its own bucket still has room
    ns = P.ipv6_frame("fe80::99", "ff02::1:ff00:1", 58, bytes([135, 0, 0, 0]) + bytes(20), hop_limit=255)
    assert from_port(policed, 1, ns) == XDP_PASS


def test_rate_zero_turns_a_bucket_off_and_bad_settings_are_refused(policed):
    policed.dp.set_police("edge_control", 0, 1)
    assert all(from_port(policed, 1, bgp_syn()) == XDP_PASS for _ in range(100))
    from rlbswitch.dataplane import DataplaneError
    with pytest.raises(DataplaneError, match="no policer bucket"):
        policed.dp.set_police("bgp", 10, 1)
    with pytest.raises(DataplaneError, match="burst"):
        policed.dp.set_police("other", 10, 0)


@pytest.mark.parametrize("gtsm, hops, want", [(True, 254, XDP_DROP), (True, 255, XDP_PASS),
                                              (False, 254, XDP_PASS), (True, 64, XDP_DROP)])
def test_gtsm_drops_bgp_to_a_link_local_address_from_further_than_one_hop(fresh, gtsm, hops, want):
    from rlbcommon import packets as P
    fresh.dp.set_gtsm(gtsm)
    try:
        tcp = bytearray(20)
        tcp[0:2], tcp[2:4], tcp[12], tcp[13] = (40000).to_bytes(2, "big"), (179).to_bytes(2, "big"), 0x50, 0x02
        frame = P.ipv6_frame("fe80::2", "fe80::1", 6, bytes(tcp), hop_limit=hops)
        before = fresh.reasons().get("drop_gtsm", 0)
        assert from_port(fresh, 0, frame) == want
        assert fresh.reasons().get("drop_gtsm", 0) - before == (want == XDP_DROP)
    finally:
        fresh.dp.set_gtsm(False)
