"""The XDP switch program under BPF_PROG_TEST_RUN: verdicts, rewritten bytes, splits, failover."""
from __future__ import annotations

import os
import random
import struct
import subprocess
import time

import pytest

from rlbcommon import packets as P
from rlbcommon.testrun import XDP_PASS, XDP_REDIRECT
from rlbfabric.routes import NextHop, Route
from rlbswitch import abi
from rlbswitch.exact import key_of
from rlbswitch.metrics import SwitchCollector

from .conftest import roce

SW_MAC = None  # the smac every forwarded frame must carry is the egress port's own MAC


def port_mac(xdp, k):
    return next(p.mac for p in xdp.dp.ports() if p.ifindex == xdp.ifindex[k])


def route(xdp, prefix, mode, nhs, backups=()):
    xdp.dp.add_route(Route(prefix, mode, [NextHop.parse(n) for n in nhs],
                           [NextHop.parse(b) for b in backups]))


def flows(n, seed=1):
    """n random RoCEv2 flows (addresses, source port, QP) as frames, built by patching bytes."""
    rnd = random.Random(seed)
    base = bytearray(roce())
    out = []
    for _ in range(n):
        f = bytearray(base)
        f[34:38] = rnd.getrandbits(32).to_bytes(4, "big")   # source address, low bits
        f[50:54] = rnd.getrandbits(32).to_bytes(4, "big")   # destination address, low bits
        f[54:56] = rnd.randrange(1024, 65536).to_bytes(2, "big")
        f[67:70] = rnd.getrandbits(24).to_bytes(3, "big")
        out.append(bytes(f))
    return out


def members(xdp, frames):
    out = []
    for f in frames:
        verdict, data = xdp.run(f)
        assert verdict == XDP_REDIRECT
        out.append(xdp.member_of(P.parse(data).dmac))
    return out


# ---- each mode forwards with the right MACs and hop limit ----------------------------

def test_pinned_forwards_to_primary_with_macs_and_hop_limit(fresh):
    xdp = fresh
    route(xdp, "fc00:2::/64", "pinned", [xdp.nh(2)], [xdp.nh(0), xdp.nh(1)])
    frame = roce(hop_limit=64)
    verdict, out = xdp.run(frame)
    assert verdict == XDP_REDIRECT
    p = P.parse(out)
    assert p.dmac == "02:00:00:00:01:02"
    assert p.smac == port_mac(xdp, 2)
    assert p.hop_limit == 63
    # nothing but the MACs and the hop limit changed
    assert out[12:21] == frame[12:21] and out[22:] == frame[22:]


def test_weighted_and_dlb_rewrite_the_same_way(fresh):
    xdp = fresh
    for mode in ("weighted", "dlb", "ecmp"):
        route(xdp, "fc00:2::/64", mode, [xdp.nh(1), xdp.nh(3)])
        verdict, out = xdp.run(roce(hop_limit=2))
        p = P.parse(out)
        assert verdict == XDP_REDIRECT, mode
        k = xdp.member_of(p.dmac)
        assert k in (1, 3) and p.smac == port_mac(xdp, k) and p.hop_limit == 1


def test_connected_host_forwarded_with_neighbour_mac_and_miss_goes_to_kernel(fresh):
    xdp = fresh
    xdp.dp.add_route(Route("fc00:9::/64", "connected", dev="p1"))
    verdict, out = xdp.run(roce(dst="fc00:9::77"))
    assert verdict == XDP_PASS and out[:12] == roce(dst="fc00:9::77")[:12]
    before = xdp.reasons()["pass_neigh_miss"]
    xdp.run(roce(dst="fc00:9::77"))
    assert xdp.reasons()["pass_neigh_miss"] == before + 1
    # the agent mirrors the kernel's neighbour table; do what it does on RTM_NEWNEIGH
    xdp.dp.update_neighbour(xdp.ifindex[1], "fc00:9::77", "02:00:00:00:09:77")
    verdict, out = xdp.run(roce(dst="fc00:9::77"))
    p = P.parse(out)
    assert verdict == XDP_REDIRECT and p.dmac == "02:00:00:00:09:77" and p.smac == port_mac(xdp, 1)
    xdp.dp.update_neighbour(xdp.ifindex[1], "fc00:9::77", None)
    assert xdp.run(roce(dst="fc00:9::77"))[0] == XDP_PASS


def test_longest_prefix_wins(fresh):
    xdp = fresh
    route(xdp, "fc00::/16", "pinned", [xdp.nh(0)])
    route(xdp, "fc00:2::/64", "pinned", [xdp.nh(1)])
    route(xdp, "fc00:2::5/128", "pinned", [xdp.nh(2)])
    assert xdp.member_of(P.parse(xdp.run(roce(dst="fc00:3::1"))[1]).dmac) == 0
    assert xdp.member_of(P.parse(xdp.run(roce(dst="fc00:2::1"))[1]).dmac) == 1
    assert xdp.member_of(P.parse(xdp.run(roce(dst="fc00:2::5"))[1]).dmac) == 2


# ---- weighted: shares and minimal disruption ------------------------------------------

def test_weighted_split_over_100k_flows_within_half_a_point(fresh):
    xdp = fresh
    weights = [4, 2, 1, 1]
    route(xdp, "fc00:2::/64", "weighted", [xdp.nh(k, w) for k, w in enumerate(weights)])
    got = members(xdp, flows(100_000))
    for k, w in enumerate(weights):
        share = got.count(k) / len(got)
        assert abs(share - w / sum(weights)) < 0.005, (k, share)


def test_hash_spreads_flows_that_differ_in_one_field_only(fresh):
    """What a fabric sends: QPs numbered in order, source ports in order, hosts in
    consecutive /64s. Each alone must spread over equal members as a fair coin would
    (4096 flows, 4 members: sigma 0.68 points, bound 3 points)."""
    xdp = fresh
    route(xdp, "fc00:2::/64", "ecmp", [xdp.nh(k) for k in range(4)])
    route(xdp, "fc00:2:0:1::/64", "ecmp", [xdp.nh(k) for k in range(4)])
    cases = {
        "qp": [roce(qp=q) for q in range(1, 4097)],
        "source port": [roce(sport=49152 + i) for i in range(4096)],
        "source /64": [P.roce_frame(f"fc00:1:{i >> 8:x}:{i & 0xff:x}::1", "fc00:2::1", 49152, 1)
                       for i in range(4096)],
        "destination host": [roce(dst=f"fc00:2:0:{i >> 12:x}::{i & 0xfff:x}") for i in range(4096)],
    }
    for name, frames in cases.items():
        got = members(xdp, frames)
        for k in range(4):
            assert abs(got.count(k) / len(got) - 0.25) < 0.03, (name, k, got.count(k))


def test_member_removal_moves_at_most_one_nth_plus_one_percent(fresh):
    xdp = fresh
    route(xdp, "fc00:2::/64", "ecmp", [xdp.nh(k) for k in range(4)])
    frames = flows(20_000, seed=2)
    before = members(xdp, frames)
    route(xdp, "fc00:2::/64", "ecmp", [xdp.nh(k) for k in (0, 1, 3)])
    after = members(xdp, frames)
    moved = sum(a != b for a, b in zip(before, after)) / len(frames)
    assert moved <= 1 / 4 + 0.01
    assert all(a == 2 for a, b in zip(before, after) if a != b)  # only member 2's flows moved
    assert 2 not in after


def test_weighted_member_down_falls_back_to_live_members(fresh):
    xdp = fresh
    route(xdp, "fc00:2::/64", "ecmp", [xdp.nh(k) for k in range(4)])
    frames = flows(2000, seed=3)
    before = members(xdp, frames)
    xdp.port_up(1, False)
    ev = xdp.reasons()["ev_weighted_fallback"]
    after = members(xdp, frames)
    assert 1 not in after
    assert all(a == b for a, b in zip(before, after) if a != 1)  # others keep their member
    assert xdp.reasons()["ev_weighted_fallback"] - ev == before.count(1)


# ---- spray: per packet, by weight (draft-fare-scale-up §3.2) ----------------------------

def test_spray_splits_one_flow_per_packet_by_weight(fresh):
    """One flow, 100k packets: every member gets its weight's share (within 1 point; the
    walk of the slot table makes it exact per 4096 packets and CPU), and consecutive packets
    go to different members."""
    xdp = fresh
    weights = [4, 2, 1, 1]
    route(xdp, "fc00:2::/64", "spray", [xdp.nh(k, w) for k, w in enumerate(weights)])
    frame = roce()
    got = members(xdp, [frame] * 100_000)
    for k, w in enumerate(weights):
        assert abs(got.count(k) / len(got) - w / sum(weights)) < 0.01, (k, got.count(k))
    assert len(set(got[:4])) >= 3                      # not a flow pinned to one member
    runs = sum(a == b for a, b in zip(got, got[1:])) / len(got)
    assert runs < 0.5                                  # mostly a different member each packet


def test_spray_member_down_sprays_over_the_live_ones(fresh):
    xdp = fresh
    route(xdp, "fc00:2::/64", "spray", [xdp.nh(k) for k in range(4)])
    xdp.port_up(2, False)
    ev = xdp.reasons()["ev_spray_fallback"]
    got = members(xdp, [roce()] * 4000)
    assert 2 not in got
    for k in (0, 1, 3):                                # per packet still: all live ones used
        assert abs(got.count(k) / len(got) - 1 / 3) < 0.05, (k, got.count(k))
    assert xdp.reasons()["ev_spray_fallback"] - ev == 1000   # the dead member's share
    xdp.port_up(2, True)
    assert members(xdp, [roce()] * 4096).count(2) == 1024


# ---- pinned: failover to the backup group ----------------------------------------------

def test_pinned_fails_over_to_backups_by_dlb_and_returns(fresh):
    xdp = fresh
    route(xdp, "fc00:2::/64", "pinned", [xdp.nh(3)], [xdp.nh(0), xdp.nh(1), xdp.nh(2)])
    frames = flows(300, seed=4)
    assert set(members(xdp, frames)) == {3}
    failovers = xdp.reasons()["ev_failover"]
    xdp.port_up(3, False)                      # what the agent does on carrier loss
    during = members(xdp, frames)
    assert 3 not in during
    assert set(during) == {0, 1, 2}           # spread over every backup
    assert xdp.reasons()["ev_failover"] - failovers == len(frames)
    xdp.port_up(3, True)
    assert set(members(xdp, frames)) == {3}   # pinning returns with the port


def test_pinned_unresolved_primary_is_never_used(fresh):
    xdp = fresh
    xdp.dp.add_route(Route("fc00:2::/64", "pinned", [NextHop("p2", gateway="fe80::99")],
                           [NextHop.parse(xdp.nh(0))]))
    assert set(members(xdp, flows(50))) == {0}


def test_no_live_next_hop_goes_to_kernel(fresh):
    xdp = fresh
    route(xdp, "fc00:2::/64", "pinned", [xdp.nh(3)], [xdp.nh(0)])
    xdp.port_up(3, False)
    xdp.port_up(0, False)
    before = xdp.reasons()["pass_no_nexthop"]
    frame = roce()
    verdict, out = xdp.run(frame)
    assert verdict == XDP_PASS and out == frame
    assert xdp.reasons()["pass_no_nexthop"] == before + 1


# ---- dlb: flowlets ---------------------------------------------------------------------

def test_dlb_sticks_within_timeout_and_moves_after_a_gap(fresh):
    xdp = fresh
    maps = xdp.dp.maps
    for k in range(4):   # tiny quality bands so a few packets make a port "busy"
        slot, port = xdp.dp.port_slot(xdp.ifindex[k])
        port.band_bytes = 200
        maps["ports"].set(slot, port)
    # load decays slowly (1 s half-life) so the gap below only ends the flowlet
    xdp.dp.set_config(flowlet_timeout_ns=20_000_000, load_halflife_ns=1_000_000_000)
    route(xdp, "fc00:2::/64", "dlb", [xdp.nh(k) for k in range(4)])
    frame = flows(1, seed=5)[0]
    ev0 = xdp.reasons()
    first = members(xdp, [frame] * 10)
    assert len(set(first)) == 1            # within the timeout: one member, though it got busy
    time.sleep(0.05)                       # gap > flowlet timeout
    second = members(xdp, [frame])[0]
    assert second != first[0]              # re-selected to a less loaded port
    ev1 = xdp.reasons()
    assert ev1["ev_dlb_assign"] - ev0["ev_dlb_assign"] == 1
    assert ev1["ev_dlb_reassign"] - ev0["ev_dlb_reassign"] == 1
    xdp.dp.set_config(flowlet_timeout_ns=256_000, load_halflife_ns=100_000)
    for k in range(4):
        slot, port = xdp.dp.port_slot(xdp.ifindex[k])
        port.band_bytes = 0
        maps["ports"].set(slot, port)


def test_a_cpus_bytes_reach_the_ports_shared_load_in_shares_of_its_band(fresh):
    """Forwarding writes nothing that other CPUs share on every packet: a CPU holds a port's
    bytes back (per CPU) and adds them to the port's load, which DLB reads, once they make a
    sixteenth of the port's quality band. The counters are exact all along."""
    xdp = fresh
    maps = xdp.dp.maps
    slot, port = xdp.dp.port_slot(xdp.ifindex[2])
    band = port.band_bytes
    port.band_bytes = 16 * 1000                      # a share of 1000 bytes
    maps["ports"].set(slot, port)
    route(xdp, "fc00:2::/64", "pinned", [xdp.nh(2)])
    frame = roce()
    n = 1000 // len(frame) + 1                       # the packet that makes the share
    cpu = min(os.sched_getaffinity(0))
    everywhere = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {cpu})                  # the hold is per CPU: one CPU runs them all
    try:
        maps["port_load"].zero(slot)
        maps["port_stats"].zero(slot)                # what earlier tests left held, too
        tx0 = xdp.dp.port_tx()["p2"]["tx_bytes"]
        for i in range(1, n + 1):
            assert xdp.run(frame)[0] == XDP_REDIRECT
            shared = maps["port_load"].get(slot).tx_bytes
            assert xdp.dp.port_tx()["p2"]["tx_bytes"] - tx0 == i * len(frame)
            assert shared == (n * len(frame) if i == n else 0), (i, shared)
        for _ in range(n):                               # and again, from nothing held
            xdp.run(frame)
        assert maps["port_load"].get(slot).tx_bytes == 2 * n * len(frame)
    finally:
        os.sched_setaffinity(0, everywhere)
        port.band_bytes = band
        maps["ports"].set(slot, port)


def test_dlb_moves_a_flow_off_a_dead_member_at_once(fresh):
    xdp = fresh
    xdp.dp.set_config(flowlet_timeout_ns=10_000_000_000)
    route(xdp, "fc00:2::/64", "dlb", [xdp.nh(k) for k in range(4)])
    frame = flows(1, seed=6)[0]
    k = members(xdp, [frame])[0]
    xdp.port_up(k, False)
    nxt = members(xdp, [frame] * 5)
    assert k not in nxt and len(set(nxt)) == 1
    xdp.dp.set_config(flowlet_timeout_ns=256_000)


def test_dlb_spreads_idle_flows_evenly(fresh):
    xdp = fresh
    xdp.dp.set_config(flowlet_timeout_ns=1)   # every packet is a new flowlet on idle ports
    route(xdp, "fc00:2::/64", "dlb", [xdp.nh(k) for k in range(4)])
    got = members(xdp, flows(8000, seed=7))
    for k in range(4):
        assert abs(got.count(k) / len(got) - 0.25) < 0.05
    xdp.dp.set_config(flowlet_timeout_ns=256_000)


# ---- QP-aware hashing ------------------------------------------------------------------

def test_qps_with_identical_five_tuple_spread_by_bth_qp(fresh):
    xdp = fresh
    route(xdp, "fc00:2::/64", "ecmp", [xdp.nh(k) for k in range(4)])
    qps = [roce(sport=50000, qp=q) for q in range(1, 401)]
    got = members(xdp, qps)
    for k in range(4):
        assert abs(got.count(k) / 400 - 0.25) < 0.07
    # the first 4 QPs of the same 5-tuple do not all share one link
    assert len(set(members(xdp, qps[:4]))) >= 2
    # to another UDP port the BTH is not looked at: same 5-tuple, same member
    other = [roce(sport=50000, qp=q, dport=5000) for q in range(1, 101)]
    assert len(set(members(xdp, other))) == 1


def test_hash_seed_changes_the_mapping(fresh):
    xdp = fresh
    route(xdp, "fc00:2::/64", "ecmp", [xdp.nh(k) for k in range(4)])
    frames = flows(500, seed=8)
    a = members(xdp, frames)
    xdp.dp.set_config(hash_seed=0xABCDEF)
    b = members(xdp, frames)
    xdp.dp.set_config(hash_seed=0x5EED1234)
    assert sum(x != y for x, y in zip(a, b)) > 250   # about 3/4 should move


# ---- what goes to the kernel -----------------------------------------------------------

SRC, DST = "fc00:1::1", "fc00:2::1"


def ipv4_frame():
    ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 28, 0, 0, 64, 17, 0, bytes([10, 0, 0, 1]), bytes([10, 0, 0, 2]))
    return P.ether("02:00:00:00:00:01", "02:00:00:00:00:02", P.ETH_P_IP, ip + bytes(8))


PASS_CASES = {
    "not_ipv6": (ipv4_frame(), "pass_not_ipv6"),
    "link_local_dst": (P.roce_frame(SRC, "fe80::1", 1000, 1), "pass_link_local"),
    "link_local_src": (P.roce_frame("fe80::1", DST, 1000, 1), "pass_link_local"),
    "multicast": (P.roce_frame(SRC, "ff02::1", 1000, 1), "pass_multicast"),
    "hop_limit_1": (P.roce_frame(SRC, DST, 1000, 1, hop_limit=1), "pass_hop_limit"),
    "hop_limit_0": (P.roce_frame(SRC, DST, 1000, 1, hop_limit=0), "pass_hop_limit"),
    "no_route": (P.roce_frame(SRC, "fd00::1", 1000, 1), "pass_no_route"),
    "neighbour_solicit": (P.ipv6_frame(SRC, DST, P.PROTO_ICMPV6, P.icmp6(SRC, DST, 135, body=bytes(20)), hop_limit=255), "pass_control"),
    "neighbour_advert": (P.ipv6_frame(SRC, DST, P.PROTO_ICMPV6, P.icmp6(SRC, DST, 136, body=bytes(20)), hop_limit=255), "pass_control"),
    "router_advert": (P.ipv6_frame(SRC, DST, P.PROTO_ICMPV6, P.icmp6(SRC, DST, 134, body=bytes(12)), hop_limit=255), "pass_control"),
    "bgp_to": (P.ipv6_frame(SRC, DST, P.PROTO_TCP, P.tcp6(SRC, DST, 40000, 179)), "pass_control"),
    "bgp_from": (P.ipv6_frame(SRC, DST, P.PROTO_TCP, P.tcp6(SRC, DST, 179, 40000)), "pass_control"),
    "hop_by_hop": (P.ipv6_frame(SRC, DST, 0, bytes(16)), "pass_control"),
    "local": (P.roce_frame(SRC, "fc00:2::aa", 1000, 1), "pass_local"),
    "truncated_ipv6": (P.roce_frame(SRC, DST, 1000, 1)[:40], "pass_malformed"),
    "truncated_udp": (P.roce_frame(SRC, DST, 1000, 1)[:58], "pass_malformed"),
    # the kernel's test run refuses frames shorter than an Ethernet header (so does any NIC)
    "ethernet_only": (P.roce_frame(SRC, DST, 1000, 1)[:14], "pass_malformed"),
}


@pytest.mark.parametrize("case", sorted(PASS_CASES))
def test_control_and_exceptions_go_to_the_kernel_untouched(fresh, case):
    xdp = fresh
    route(xdp, "fc00:2::/64", "ecmp", [xdp.nh(k) for k in range(4)])
    xdp.dp.add_route(Route("fc00:2::aa/128", "local"))
    frame, reason = PASS_CASES[case]
    before = xdp.reasons()[reason]
    verdict, out = xdp.run(frame)
    assert verdict == XDP_PASS
    assert out == frame
    assert xdp.reasons()[reason] == before + 1


def test_icmp_echo_and_tcp_are_forwarded(fresh):
    xdp = fresh
    route(xdp, "fc00:2::/64", "pinned", [xdp.nh(1)])
    echo = P.ipv6_frame(SRC, DST, P.PROTO_ICMPV6, P.icmp6(SRC, DST, 128))
    tcp = P.ipv6_frame(SRC, DST, P.PROTO_TCP, P.tcp6(SRC, DST, 40000, 80))
    for f in (echo, tcp):
        verdict, out = xdp.run(f)
        assert verdict == XDP_REDIRECT and P.parse(out).dmac == "02:00:00:00:01:01"


# ---- fuzz ------------------------------------------------------------------------------

def test_fuzzed_and_truncated_packets_never_redirected_wrongly(fresh):
    """10k mutated frames: whatever is redirected must be a well-formed IPv6 packet to a
    routed, non-link-local unicast destination, with a hop limit that was > 1 and is now one
    less, and MACs of the member the route allows; everything else must be passed unchanged."""
    import ipaddress
    xdp = fresh
    route(xdp, "fc00:2::/64", "ecmp", [xdp.nh(k) for k in range(4)])
    routed = ipaddress.IPv6Network("fc00:2::/64")
    rnd = random.Random(2024)
    templates = [roce(), roce(hop_limit=2),
                 P.ipv6_frame(SRC, DST, P.PROTO_ICMPV6, P.icmp6(SRC, DST, 128)),
                 P.ipv6_frame(SRC, DST, P.PROTO_TCP, P.tcp6(SRC, DST, 1, 2)), ipv4_frame()]
    redirected = passed = 0
    for i in range(10_000):
        f = bytearray(rnd.choice(templates))
        for _ in range(rnd.randint(0, 6)):
            pos = rnd.randrange(len(f))
            f[pos] = rnd.getrandbits(8) if rnd.random() < 0.7 else f[pos] ^ (1 << rnd.randrange(8))
        if rnd.random() < 0.3:
            f = f[:rnd.randrange(0, len(f) + 1)]
        if rnd.random() < 0.1:
            f = bytearray(rnd.getrandbits(8) for _ in range(rnd.randrange(0, 120)))
        frame = bytes(f)
        if len(frame) < 14:   # below an Ethernet header: test run (and any NIC) refuses it
            continue
        verdict, out = xdp.run(frame)
        if verdict == XDP_REDIRECT:
            redirected += 1
            assert len(frame) >= 54 and frame[12:14] == b"\x86\xdd" and frame[14] >> 4 == 6
            dst = ipaddress.IPv6Address(frame[38:54])
            src = ipaddress.IPv6Address(frame[22:38])
            assert dst in routed and not src.is_link_local
            assert frame[21] > 1 and out[21] == frame[21] - 1
            k = xdp.member_of(P.parse(out).dmac)
            assert out[:6] == bytes.fromhex(f"02000000010{k}") and k in range(4)
            assert out[12:21] == frame[12:21] and out[22:] == frame[22:]
        else:
            assert verdict == XDP_PASS
            assert out == frame
            passed += 1
    assert redirected > 1000 and passed > 1000   # both paths were really exercised


# ---- the exact /64 table in front of the trie ------------------------------------------

def exact64(xdp) -> dict:
    """What the program's exact table answers, read from the map itself (not the model)."""
    import ipaddress, sys
    out = {}
    for s in xdp.dp.maps["exact64"].array_values():
        for w in (s.way if s is not None else []):
            if w.route.mode:
                net = ipaddress.IPv6Network((w.key.to_bytes(8, sys.byteorder) + bytes(8), 64))
                assert str(net) not in out
                out[str(net)] = w.route.mode
    return out


def test_exact_64_entries_never_shadow_a_longer_prefix(fresh):
    xdp = fresh
    route(xdp, "fc00:2::/64", "pinned", [xdp.nh(0)])
    route(xdp, "fc00:3::/64", "pinned", [xdp.nh(1)])
    route(xdp, "fc00::/16", "pinned", [xdp.nh(3)])
    assert exact64(xdp) == {"fc00:2::/64": 1, "fc00:3::/64": 1}
    route(xdp, "fc00:2::5/128", "pinned", [xdp.nh(2)])        # a host route inside the /64
    route(xdp, "fc00:3::8000:0/97", "pinned", [xdp.nh(2)])
    assert exact64(xdp) == {}                                  # both /64s now go by the trie
    at = lambda dst: xdp.member_of(P.parse(xdp.run(roce(dst=dst))[1]).dmac)
    assert [at("fc00:2::5"), at("fc00:2::6"), at("fc00:3::8000:1"), at("fc00:3::1"), at("fc00:9::1")] == \
        [2, 0, 2, 1, 3]
    xdp.dp.del_route("fc00:2::5/128")
    assert exact64(xdp) == {"fc00:2::/64": 1} and at("fc00:2::5") == 0
    xdp.dp.del_route("fc00:3::8000:0/97")
    assert set(exact64(xdp)) == {"fc00:2::/64", "fc00:3::/64"} and at("fc00:3::8000:1") == 1
    # a changed /64 is changed in both tables; a removed one leaves both
    route(xdp, "fc00:2::/64", "pinned", [xdp.nh(1)])
    assert at("fc00:2::7") == 1
    xdp.dp.del_route("fc00:2::/64")
    assert "fc00:2::/64" not in exact64(xdp) and at("fc00:2::7") == 3


def test_exact_table_is_rebuilt_from_the_routes_on_adoption(fresh):
    import sys
    xdp = fresh
    route(xdp, "fc00:2::/64", "pinned", [xdp.nh(0)])
    m, table = xdp.dp.maps["exact64"], xdp.dp.tables.exact
    [(key, (idx, w))] = table.where.items()
    s = m.get(idx)
    s.way[w].route.mode = 0                       # our entry lost (a crash between steps)
    stray = int.from_bytes(bytes.fromhex("fc00000900000000"), sys.byteorder)
    s2i = table.index(stray)
    s2 = m.get(s2i)
    s2.way[3].key, s2.way[3].route.mode = stray, 1   # a stray entry (another writer)
    m.set(idx, s)
    m.set(s2i, s2)
    assert "fc00:9::/64" in exact64(xdp) and "fc00:2::/64" not in exact64(xdp)
    xdp.dp.tables.load()
    assert exact64(xdp) == {"fc00:2::/64": 1}


def test_exact_table_written_in_batches_by_one_apply(fresh):
    """A batch defers its new /64s (two batch writes at the end); a longer prefix inside one of
    them in the same batch, and a change of an existing /64, must still come out right."""
    xdp = fresh
    nh = lambda k: NextHop.parse(xdp.nh(k))
    route(xdp, "fc00:7::/64", "pinned", [xdp.nh(0)])
    many = [Route(f"fc00:5:0:{i:x}::/64", "pinned", [nh(i % 4)]) for i in range(300)]
    xdp.dp.apply_routes(many + [Route("fc00:6::/64", "pinned", [nh(1)]),
                                Route("fc00:6::5/128", "pinned", [nh(2)]),
                                Route("fc00:7::/64", "pinned", [nh(3)])], merge=True)
    got = exact64(xdp)
    assert len(got) == 301 and "fc00:6::/64" not in got and "fc00:7::/64" in got
    at = lambda dst: xdp.member_of(P.parse(xdp.run(roce(dst=dst))[1]).dmac)
    assert [at(f"fc00:5:0:{i:x}::9") for i in range(300)] == [i % 4 for i in range(300)]
    assert [at("fc00:6::5"), at("fc00:6::6"), at("fc00:7::1")] == [2, 1, 3]
    assert xdp.dp.tables.exact._pending is None            # nothing left deferred
    xdp.dp.del_route("fc00:6::5/128")                       # outside a batch: written at once
    assert "fc00:6::/64" in exact64(xdp)


def test_exact_table_full_set_falls_back_to_the_trie_until_a_way_frees(fresh):
    """More /64s hashing to one set than it has ways: the extra ones are answered by the trie
    (right, only slower), and take a way as soon as one frees up."""
    import ipaddress
    xdp = fresh
    table = xdp.dp.tables.exact
    ways = abi.C["RLB_EXACT_WAYS"]
    same, target = [], None
    for i in range(1, 400000):
        net = ipaddress.IPv6Network(f"fc00:{i >> 16:x}:{i & 0xffff:x}::/64")
        idx = table.index(key_of(net))
        if target is None:
            target = idx
        if idx == target:
            same.append(net)
            if len(same) == ways + 2:
                break
    assert len(same) == ways + 2
    for i, net in enumerate(same):
        route(xdp, str(net), "pinned", [xdp.nh(i % 4)])
    assert len(exact64(xdp)) == ways and table.overflow == 2
    at = lambda net: xdp.member_of(P.parse(xdp.run(roce(dst=str(net.network_address + 1)))[1]).dmac)
    assert [at(n) for n in same] == [i % 4 for i in range(len(same))]     # all forwarded right
    xdp.dp.del_route(str(same[0]))
    assert len(exact64(xdp)) == ways and table.overflow == 1
    assert str(same[0]) not in exact64(xdp)
    assert [at(n) for n in same[1:]] == [i % 4 for i in range(1, len(same))]
    # a changed route in a full set is changed in place (both tables agree)
    route(xdp, str(same[1]), "pinned", [xdp.nh(3)])
    assert at(same[1]) == 3


# ---- flowlets: tagged sets, kept across route rewrites --------------------------------

def clear_flowlets(xdp):
    m = xdp.dp.maps["flowlets"]
    for i in range(abi.C["RLB_FLOWLET_SETS"]):
        m.zero(i)


@pytest.fixture
def long_flowlets(fresh):
    """An empty flowlet table whose entries outlive the test (60 s timeout); cleaned after."""
    clear_flowlets(fresh)
    fresh.dp.set_config(flowlet_timeout_ns=60_000_000_000)
    yield fresh
    fresh.dp.set_config(flowlet_timeout_ns=256_000)
    clear_flowlets(fresh)


def test_flows_keep_their_member_when_the_flowlet_table_is_over_full(long_flowlets):
    """80 000 live flows for 65 536 entries: flows sharing a set never take each other's entry;
    those that find no room go by the slot table. Not one flow changes member."""
    xdp = long_flowlets
    route(xdp, "fc00:2::/64", "dlb", [xdp.nh(k) for k in range(4)])
    frames = flows(80_000, seed=21)
    ev0 = xdp.reasons()
    first = members(xdp, frames)
    ev1 = xdp.reasons()
    second = members(xdp, frames)
    ev2 = xdp.reasons()
    assert first == second
    assert ev1["ev_dlb_collision"] - ev0["ev_dlb_collision"] > 0
    assert ev1["ev_dlb_assign"] - ev0["ev_dlb_assign"] <= 65_536
    assert ev2["ev_dlb_reassign"] == ev1["ev_dlb_reassign"]
    assert sorted(set(first)) == [0, 1, 2, 3]


def test_a_route_rewrite_keeps_the_flows_of_members_that_stay(long_flowlets):
    xdp = long_flowlets
    route(xdp, "fc00:2::/64", "dlb", [xdp.nh(k) for k in range(3)])
    frames = flows(300, seed=22)
    before = members(xdp, frames)
    group = xdp.dp.routes()[0]["group"]
    route(xdp, "fc00:2::/64", "dlb", [xdp.nh(k) for k in range(4)])   # a member joins
    assert xdp.dp.routes()[0]["group"] != group
    assert members(xdp, frames) == before


# ---- ports that go away, frames that do not fit ----------------------------------------

def test_a_removed_port_is_never_selected_and_nothing_is_aborted(fresh):
    xdp = fresh
    route(xdp, "fc00:2::/64", "pinned", [xdp.nh(3)], [xdp.nh(1)])
    route(xdp, "fc00:4::/64", "pinned", [xdp.nh(3)])
    frame = roce()
    assert members(xdp, [frame]) == [3]
    try:
        assert xdp.dp.remove_port(xdp.ifindex[3])
        assert members(xdp, [frame]) == [1]                      # failed over, not aborted
        lone = roce(dst="fc00:4::1")
        before = xdp.reasons()["pass_no_nexthop"]
        assert xdp.run(lone) == (XDP_PASS, lone)                 # to the kernel, untouched
        assert xdp.reasons()["pass_no_nexthop"] == before + 1
    finally:
        xdp.dp.register_port(xdp.ifindex[3])                     # back, maybe in another slot
    assert members(xdp, [frame]) == [3]


def test_an_empty_devmap_slot_hands_the_frame_over_untouched(fresh):
    xdp = fresh
    route(xdp, "fc00:2::/64", "pinned", [xdp.nh(2)])
    slot, _ = xdp.dp.port_slot(xdp.ifindex[2])
    xdp.dp.maps["tx_ports"].delete(slot)          # what the kernel does when the device goes
    try:
        frame = roce()
        before = xdp.reasons()
        assert xdp.run(frame) == (XDP_PASS, frame)
        after = xdp.reasons()
        assert after["pass_no_port"] == before["pass_no_port"] + 1
        assert after["forwarded"] == before["forwarded"]
    finally:
        xdp.dp.register_port(xdp.ifindex[2])


def test_frames_over_the_egress_mtu_go_to_the_kernel(fresh):
    xdp = fresh
    route(xdp, "fc00:2::/64", "pinned", [xdp.nh(0)])
    from rlblab import topo
    topo.sh("ip", "link", "set", "p0", "mtu", "1280")
    try:
        xdp.dp.register_port(xdp.ifindex[0])
        assert xdp.dp.port_slot(xdp.ifindex[0])[1].mtu == 1280
        fits = roce(payload_len=1280 - 40 - 8 - 12)
        big = roce(payload_len=1281 - 40 - 8 - 12)
        assert xdp.run(fits)[0] == XDP_REDIRECT
        before = xdp.reasons()["pass_too_big"]
        assert xdp.run(big) == (XDP_PASS, big)
        assert xdp.reasons()["pass_too_big"] == before + 1
    finally:
        topo.sh("ip", "link", "set", "p0", "mtu", "1500")
        xdp.dp.register_port(xdp.ifindex[0])


# ---- inputs that do not fit a map field are refused, not truncated ---------------------

def test_out_of_range_inputs_are_refused(fresh):
    from rlbfabric.routes import RouteError
    from rlbswitch.dataplane import DataplaneError
    xdp = fresh
    with pytest.raises(RouteError, match="at most 4294967295"):
        NextHop.parse(f"{xdp.nh(0)}={2**32}")
    with pytest.raises(RouteError, match="4294967295"):
        Route("fc00:2::/64", "weighted", [NextHop("p0", mac="02:00:00:00:01:00", weight=2**32)])
    with pytest.raises(DataplaneError, match="out of range"):
        xdp.dp.set_config(hash_seed=2**32)
    with pytest.raises(DataplaneError, match="out of range"):
        xdp.dp.set_config(flowlet_timeout_ns=-1)
    assert xdp.dp.config()["hash_seed"] == 0x5EED1234


def test_the_address_follower_removes_only_the_routes_addresses_made(fresh):
    """An operator's connected route used to be deleted by the address follower's next sync as
    if an address had gone. Only routes the follower made (owner kernel) follow addresses."""
    from rlbcommon.health import Health
    from rlbswitch.watcher import Watcher
    dp = fresh.dp
    dp.add_route(Route("fc00:77::/64", "connected", dev="p1"))               # the operator's
    subprocess.run(["ip", "addr", "add", "fc00:88::1/64", "dev", "p2", "nodad"], check=True)
    w = Watcher(dp, Health())
    try:
        w.sync_addresses()
        owners = {r["prefix"]: r["owner"] for r in dp.routes()}
        assert owners["fc00:88::/64"] == "kernel" and owners["fc00:88::1/128"] == "kernel"
    finally:
        subprocess.run(["ip", "addr", "del", "fc00:88::1/64", "dev", "p2"], check=True)
    w.sync_addresses()
    owners = {r["prefix"]: r["owner"] for r in dp.routes()}
    assert "fc00:88::/64" not in owners and "fc00:88::1/128" not in owners
    assert owners["fc00:77::/64"] == "operator"


def test_a_port_removed_and_made_again_gets_the_program_back(fresh):
    """A re-created link (a replaced NIC, a GPU port deleted and made again) keeps its name but
    not its ifindex: the port used to be removed for good. The agent's ports are attached again
    when they come back, with their class (host port or not)."""
    import json
    from rlbcommon.health import Health
    from rlbswitch.watcher import Watcher
    dp = fresh.dp
    w = Watcher(dp, Health(), reattach={"p3": {"generic": False, "speed_mbps": None, "edge": True}})
    old = fresh.ifindex[3]
    subprocess.run(["ip", "link", "del", "p3"], check=True)
    w.resync_links()
    assert dp.port_slot(old) is None
    subprocess.run(["ip", "link", "add", "p3", "type", "veth", "peer", "name", "q3"], check=True)
    for dev in ("p3", "q3"):
        subprocess.run(["ip", "link", "set", dev, "up"], check=True)
    w.resync_links()
    new = dp.ifindex("p3")
    fresh.ifindex[3] = new                      # the harness's view, for the tests after this one
    assert new != old and dp.port_slot(new) is not None
    link = json.loads(subprocess.run(["ip", "-j", "link", "show", "p3"], capture_output=True, text=True,
                                     check=True).stdout)[0]
    assert link.get("xdp", {}).get("prog", {}).get("id") or link.get("xdp")
    assert dp.port_is_edge(new)                 # a host port still


def test_every_bounded_table_reports_its_fill(fresh):
    """Routes, next hops, groups, neighbours, ports and the exact table: entries against their
    capacity, as the metrics export them (alert RlbTableNearlyFull past 90 %)."""
    xdp = fresh
    nh = lambda k: NextHop.parse(xdp.nh(k))
    xdp.dp.apply_routes([Route(f"fc00:5:0:{i:x}::/64", "weighted", [nh(0), nh(1 + i % 3)]) for i in range(30)],
                        merge=True)
    fill = xdp.dp.tables_fill()
    assert fill["routes"] == (30, 262144) and fill["exact64"] == (30, 65536 * 4)
    assert fill["nexthops"][0] == 4 and fill["groups"][0] == 3 and fill["ports"] == (4, 256)
    assert fill["neighbours"][1] == 16384
    got = {(m.name, s.labels.get("table")): s.value for m in SwitchCollector(xdp.dp, "t").collect()
           for s in m.samples if m.name.startswith("rlb_switch_table")}
    assert got[("rlb_switch_table_entries", "routes")] == 30
    assert got[("rlb_switch_table_fill_ratio", "groups")] == 3 / 1023
