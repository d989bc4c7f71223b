"""bird reply parsing and the policy compiler against the specs' own examples."""
import struct

import pytest

from rlbcommon.constants import MAX_BANDWIDTH
from rlbfabric.policy import pathbw
from rlbfabric.bird.ctl import BirdError, BirdPath, parse_protocols, parse_reply, parse_routes
from rlbfabric.policy.compiler import compile_all, compile_prefix, homing

# Raw lines of `show route all` from a bird 2.0.12 run in namespaces (shared/notes)
RAW = [
    "1007-Table master6:",
    " fc00:1:1:1::/64      unicast [s1 01:53:50.840] * (100/12) [AS65001i]",
    " \tvia fe80::3c50:faff:fe72:3244 on eth-s1",
    "1008-\tType: BGP univ",
    "1012-\tBGP.origin: IGP",
    " \tBGP.as_path: 65000 65001",
    " \tBGP.next_hop: :: fe80::3c50:faff:fe72:3244",
    " \tBGP.local_pref: 100",
    " \tBGP.ext_community: (generic, 0x30b0000, 0x1)",
    " \tBGP.aigp: 11",
    "1007-                     unicast [s2 01:53:51.613] (100) [AS65001i]",
    " \tvia fe80::f867:69ff:fefb:2803 on eth-s2",
    "1008-\tType: BGP univ",
    "1012-\tBGP.origin: IGP",
    " \tBGP.as_path: 65000 65001",
    " \tBGP.ext_community: (generic, 0x30b0000, 0x1) (generic, 0x88fde8, 0x4e6e6b28)",
    "1007-fc00:1:2:1::/64      unicast [direct1 01:53:27.874] * (240)",
    " \tdev eth-h2",
    "1008-\tType: device univ",
    "0000 ",
]


def test_parse_show_route_all():
    paths = parse_routes(parse_reply(iter(RAW)))
    assert [(p.net, p.proto, p.best) for p in paths] == [
        ("fc00:1:1:1::/64", "s1", True), ("fc00:1:1:1::/64", "s2", False), ("fc00:1:2:1::/64", "direct1", True)]
    s1, s2, direct = paths
    assert (s1.via, s1.iface, s1.source, s1.as_path, s1.aigp, s1.local_pref, s1.colours) == (
        "fe80::3c50:faff:fe72:3244", "eth-s1", "BGP", [65000, 65001], 11, 100, [1])
    assert s2.aigp is None and s2.colours == [1]
    assert s2.path_bandwidth() == pytest.approx(1e9)      # 0x4e6e6b28 = 1e9 as float32
    assert direct.iface == "eth-h2" and direct.source == "device" and direct.via is None


def test_parse_as_specific_community_as_bird_prints_it():
    # a line from a spine of the namespace fabric: FARE path bandwidth, type 0x00 sub-type 0x88
    rows = parse_reply(iter(["1007-fc00:1:1:2::/64      unicast [l1_1 04:08:52.017] * (100) [AS65001i]",
                             " \tvia fe80::1 on eth-l1", "1008-\tType: BGP univ",
                             " \tBGP.ext_community: (unknown 0x88, 65001, 2139081118) (generic, 0x30b0000, 0x2)",
                             "0000 "]))
    p = parse_routes(rows)[0]
    assert p.ext_communities == [(0x0088FDE9, 2139081118), (0x030B0000, 2)]
    assert p.path_bandwidth() == pytest.approx(3.4e38, rel=1e-6) and p.colours == [2]
    assert p.path_bandwidth(transitive=False) is None


def test_parse_protocols_short_time_format():
    rows = parse_reply(iter(["2002-Name       Proto      Table      State  Since         Info",
                             "1002-s1         BGP        ---        up     04:08:50.825  Established   ",
                             " s2         BGP        ---        start  04:08:50.980  Active        Socket: Connection refused",
                             "0000 "]))
    got = parse_protocols(rows)
    assert got[0]["info"] == "Established" and got[1]["state"] == "start"
    assert got[1]["info"].startswith("Active")


def test_parse_protocols():
    rows = parse_reply(iter(["2002-Name       Proto      Table      State  Since         Info",
                             "1002-device1    Device     ---        up     2026-11-22 01:53:27  ",
                             " s1         BGP        ---        up     2026-11-22 01:53:50  Established   ",
                             "0000 "]))
    assert parse_protocols(rows)[1] == {"name": "s1", "proto": "BGP", "state": "up", "info": "Established"}


@pytest.mark.parametrize("lines,msg", [
    (["9001 syntax error, unexpected CF_SYM_UNDEFINED"], "syntax error"),
    (["8001 Network not found"], "Network not found"),
    (["1007-Table master6:", " fc00::/64 unicast [s1"], "ended without"),
    (["garbage"], "malformed reply line"),
    (["1007-Table master6:", "1007-nonsense here", "0000 "], "unparsed route line"),
])
def test_malformed_replies_raise(lines, msg):
    with pytest.raises(BirdError, match=msg):
        parse_routes(parse_reply(iter(lines)))


def bgp(net, spine, aigp=None, colour=None, pathbw=None, origin=65001, best=False):
    ecs = [(0x030B0000, colour)] if colour else []
    if pathbw is not None:
        ecs.append((0x00880000 | 65000, int.from_bytes(struct.pack(">f", pathbw), "big")))
    return BirdPath(net, f"s{spine}", best, f"fe80::{spine}", f"eth-s{spine}", "BGP",
                    [65000, origin], ecs, aigp, 100)


def test_juniper_fig8_remote_leaf_pins_prefix_k_to_spine_k():
    """Table 2: prefix k carries AIGP only via spine k; stripe2-leaf1 receives four copies of each
    and must pick spine k (AIGP 1 beats no AIGP), keeping the other three as DLB backups."""
    paths = [bgp(f"fc00:1:1:{k}::/64", s, aigp=1 if s == k else None, colour=k, best=(s == 1))
             for k in range(1, 5) for s in range(1, 5)]
    out = compile_all(paths, lambda net: "dpf", lambda i: 1.25e9)
    for k in range(1, 5):
        r = out[f"fc00:1:1:{k}::/64"].route
        assert r.mode == "pinned" and r.nexthops[0].ifname == f"eth-s{k}"
        assert sorted(b.ifname for b in r.backups) == [f"eth-s{s}" for s in range(1, 5) if s != k]


def test_juniper_fig13_lost_pinned_path_falls_back_to_dlb():
    """Spine 4's path (the AIGP one) withdrawn: the prefix goes to DLB over the other three."""
    paths = [bgp("fc00:1:1:4::/64", s, colour=4, best=(s == 1)) for s in (1, 2, 3)]
    c = compile_prefix("fc00:1:1:4::/64", paths, "dpf", lambda i: 1.25e9)
    assert c.route.mode == "dlb" and sorted(h.ifname for h in c.route.nexthops) == ["eth-s1", "eth-s2", "eth-s3"]
    single = compile_prefix("fc00:1:1:4::/64", paths[:1], "dpf", lambda i: 1.25e9)
    assert single.route.mode == "pinned"          # one path: nothing to balance


def test_a_spine_that_drops_aigp_still_gets_its_prefixes_pinned_by_colour():
    """An FRR 8.4 spine (or any without AIGP) on s2: prefix 2 arrives with its colour on every
    path and AIGP on none. The leaf's uplink of colour 2 is eth-s2: pinned there, the others its
    backups. With s2's path gone too: DLB (the pinned path really is lost). Where a path carries
    AIGP, AIGP decides as before."""
    ports = {k: f"eth-s{k}" for k in range(1, 5)}
    paths = [bgp("fc00:1:1:2::/64", s, colour=2, best=(s == 1)) for s in range(1, 5)]
    c = compile_prefix("fc00:1:1:2::/64", paths, "dpf", lambda i: 1.25e9, colour_port=ports.get)
    assert c.route.mode == "pinned" and c.route.nexthops[0].ifname == "eth-s2"
    assert sorted(b.ifname for b in c.route.backups) == ["eth-s1", "eth-s3", "eth-s4"] and "by colour 2" in c.why
    gone = [p for p in paths if p.iface != "eth-s2"]
    lost = compile_prefix("fc00:1:1:2::/64", gone, "dpf", lambda i: 1.25e9, colour_port=ports.get)
    assert lost.route.mode == "dlb" and len(lost.route.nexthops) == 3
    aigp = [bgp("fc00:1:1:2::/64", s, colour=2, aigp=1 if s == 3 else None) for s in range(1, 5)]
    assert compile_prefix("fc00:1:1:2::/64", aigp, "dpf", lambda i: 1.25e9,
                          colour_port=ports.get).route.nexthops[0].ifname == "eth-s3"
    # without a colour rule (a spine's own routes): DLB as before
    assert compile_prefix("fc00:1:1:2::/64", paths, "dpf", lambda i: 1.25e9).route.mode == "dlb"


def test_a_leaf_pins_by_colour_through_its_uplink_of_that_colour():
    """compile_for_node on a leaf of the lab's 4-spine fabric: colour k is the uplink to spine
    k (the port the originating leaf gives AIGP); a 2x2 fabric folds colours 3 and 4 onto its
    two spines as port_id does."""
    from pathlib import Path
    from rlbfabric.fabric import load
    from rlbfabric.policy.compiler import colour_ports
    lab = Path(__file__).resolve().parent.parent / "lab"
    fab = load(lab / "fabric.toml")
    leaf = fab.leaves[0]
    port = colour_ports(fab, leaf)
    assert [port(k) for k in range(1, 5)] == [p.ifname for p in fab.ports_up(leaf)]
    assert [fab.spine_for_path(leaf, k).name for k in range(1, 5)] == [p.peer.name for p in fab.ports_up(leaf)]
    small = load(lab / "fabric-2x2.toml")
    sp = colour_ports(small, small.leaves[0])
    assert [sp(k) for k in range(1, 5)] == [sp(1), sp(2), sp(1), sp(2)] and sp(1) != sp(2)


def test_fare_3_stage_weights_follow_the_slower_link():
    """§4.1: L8 weights each spine's route by min(link to that spine, path bandwidth)."""
    gbps = 1.25e8
    links = {"eth-s1": 10 * gbps, "eth-s2": 5 * gbps, "eth-s3": 10 * gbps, "eth-s4": 10 * gbps}
    paths = [bgp("fc00:1:1:1::/64", s, pathbw=10 * gbps) for s in range(1, 5)]
    c = compile_prefix("fc00:1:1:1::/64", paths, "fare", links.__getitem__)
    assert c.route.mode == "weighted"
    assert [h.weight for h in c.route.nexthops] == [10000, 5000, 10000, 10000]


def test_fare_multi_homed_prefix_divides_path_bandwidth():
    gbps = 1.25e8
    # prefix homed on leaves AS 65001 and 65002; each spine readvertises 2 x 10G = 20G and
    # sends its best path only, so the remote leaf cannot see the homing: the fabric file says 2
    paths = [bgp("fc00:9::/64", s, pathbw=20 * gbps, origin=65001) for s in (1, 2)]
    assert homing(paths) == 1
    c = compile_prefix("fc00:9::/64", paths, "fare", lambda i: 40 * gbps, homes=2)
    assert {h.weight for h in c.route.nexthops} == {10000}    # 20G / 2 homing leaves, not 20G
    assert "homed on 2" in c.why


def test_fare_needs_every_path_to_carry_the_community():
    paths = [bgp("fc00:1::/64", 1, pathbw=1e9), bgp("fc00:1::/64", 2)]
    c = compile_prefix("fc00:1::/64", paths, "fare", lambda i: 1e9)
    assert c.route.mode == "ecmp" and "not every path" in c.why


def test_spray_policy_weights_packets_by_path_bandwidth():
    """draft-fare-scale-up §3.2: the same FARE weights, per packet; equal without the community."""
    gbps = 1.25e8
    links = {"eth-s1": 10 * gbps, "eth-s2": 5 * gbps}
    paths = [bgp("fc00:1:1:1::/64", s, pathbw=10 * gbps) for s in (1, 2)]
    c = compile_prefix("fc00:1:1:1::/64", paths, "spray", links.__getitem__)
    assert c.route.mode == "spray" and [h.weight for h in c.route.nexthops] == [10000, 5000]
    c = compile_prefix("fc00:1:1:1::/64", [bgp("fc00:1::/64", 1), bgp("fc00:1::/64", 2)], "spray",
                       links.__getitem__)
    assert c.route.mode == "spray" and {h.weight for h in c.route.nexthops} == {1}


def test_fare_5_stage_values():
    """§4.2 with L1@PoD-1 -> S1@PoD-1 -> SS1..4@Plane-1 -> S1@PoD-8 -> L1@PoD-8."""
    gbps = 1.25e8
    origin = MAX_BANDWIDTH
    # S1@PoD-1: one route from L1 over a 10G link: weight 10G, readvertised 10G
    s1_pod1 = pathbw.readvertised([10 * gbps], [origin])
    assert s1_pod1 == 10 * gbps
    # super-spines keep the transitive value; non-transitive = their link to S1@PoD-1
    nts = [pathbw.superspine_nontransitive(bw) for bw in (10 * gbps, 10 * gbps, 5 * gbps, 10 * gbps)]
    # S1@PoD-8: links to SS1..4 all 10G: weights min(link, non-transitive)
    assert pathbw.remote_pod_spine_weights([10 * gbps] * 4, nts) == [10 * gbps, 10 * gbps, 5 * gbps, 10 * gbps]
    assert pathbw.remote_pod_spine_weights([10 * gbps] * 4, nts[:3] + [None]) is None   # -> ECMP
    # L1@PoD-8: routes from S1..S4@PoD-8 carry the transitive 10G set by S1@PoD-1; one link is 2.5G
    assert pathbw.weights([10 * gbps, 10 * gbps, 2.5 * gbps, 10 * gbps], [s1_pod1] * 4) == \
        [10 * gbps, 10 * gbps, 2.5 * gbps, 10 * gbps]


def test_ecmp_and_dlb_policies_and_connected_routes_skipped():
    paths = [bgp("fc00:1::/64", s) for s in (1, 2, 3)] + [
        BirdPath("fc00:5::/64", "direct1", True, None, "eth-h1", "device")]
    ecmp = compile_all(paths, lambda n: "ecmp", lambda i: 1e9)
    assert set(ecmp) == {"fc00:1::/64"} and ecmp["fc00:1::/64"].route.mode == "ecmp"
    assert compile_all(paths, lambda n: "dlb", lambda i: 1e9)["fc00:1::/64"].route.mode == "dlb"


def test_spine_readvertises_fare_path_bandwidth_from_its_leaves():
    """§4.1 on a spine: a prefix of its own leaf, received with the leaf's maximum, goes on with
    min(link, received) summed over the routes; a prefix from elsewhere is not the spine's to set."""
    from rlbfabric.fabric import load
    from pathlib import Path
    fab = load(Path(__file__).resolve().parent.parent / "lab" / "fabric-2x2.toml")
    s2 = fab.node("s2")
    link = {"eth-l1": 0.625e9, "eth-l2": 1.25e9}           # l1-s2 at 5 Gb/s, l2-s2 at 10
    paths = [BirdPath("fc00:1:1:1::/64", "l1_1", True, "fe80::1", "eth-l1", "BGP", [65001],
                      [(0x00880000 | 65001, int.from_bytes(struct.pack(">f", MAX_BANDWIDTH), "big"))]),
             BirdPath("fc00:2:1:1::/64", "l2_1", True, "fe80::2", "eth-l2", "BGP", [65002], [])]
    assert pathbw.node_values(fab, s2, paths, link.__getitem__) == {"fc00:1:1:1::/64": pytest.approx(0.625e9)}


def test_poison_from_a_peer_spoils_one_path_not_the_table():
    """An AIGP attribute without a metric, a NaN or -inf path bandwidth: that path is flagged (and
    left out by the agent), the rest of the table parses and compiles."""
    lines = RAW[:-1] + [
        "1007-fc00:9::/64         unicast [s1 01:53:50.840] * (100/12) [AS65009i]",
        " \tvia fe80::1 on eth-s1",
        "1008-\tType: BGP univ",
        " \tBGP.aigp: ?",
        "1007-fc00:8::/64         unicast [s1 01:53:50.840] * (100) [AS65008i]",
        " \tvia fe80::1 on eth-s1",
        "1008-\tType: BGP univ",
        " \tBGP.ext_community: (unknown 0x88, 65000, 4286578688)",          # -inf as a float
        "0000 ",
    ]
    paths = parse_routes(parse_reply(iter(lines)))
    by_net = {p.net: p for p in paths}
    assert by_net["fc00:9::/64"].check() == ["AIGP '?'"] and by_net["fc00:9::/64"].aigp is None
    bad = by_net["fc00:8::/64"]
    assert bad.path_bandwidth() is None and bad.check() == ["path bandwidth -inf"]
    nan = BirdPath("fc00:7::/64", "s1", True, "fe80::1", "eth-s1", "BGP", [65000], [(0x00880000 | 65000, 0x7FC00000)])
    assert nan.path_bandwidth() is None and nan.check() == ["path bandwidth nan"]
    good = [p for p in paths if not p.check()]
    compiled = compile_all(good, lambda n: "fare", lambda i: 1.25e9)
    assert "fc00:1:1:1::/64" in compiled and "fc00:9::/64" not in compiled and "fc00:8::/64" not in compiled
