"""The host TC programs under BPF_PROG_TEST_RUN: rewritten bytes, checksums, QP placement,
releases and reinstatements, expiry, spray, and what is left untouched."""
from __future__ import annotations

import random
from collections import Counter
import shutil
import struct
import time

import pytest

from rlbfabric import addrplan
from rlbcommon import packets as P
from rlbcommon.paths import pin_dir
from rlbcommon.testrun import TC_ACT_OK, prog_test_run
from rlbfabric.policy import localrule
from rlbhost.dataplane import HostDataplane, HostError, VerbsQp

from .conftest import scratch_netns

A_IID, B_IID = "::a8c0:ffff:fe00:1", "::b8c0:ffff:fe00:2"
A = {k: f"fc00:1:1:{k}:a8c0:ffff:fe00:1" for k in range(1, 5)}   # host A, one address per path
B = {k: f"fc00:1:2:{k}:b8c0:ffff:fe00:2" for k in range(1, 5)}   # host B


class Host:
    def __init__(self, name, addrs):
        self.dp = HostDataplane(name)
        self.dp.load()
        self.dp.set_paths(addrs, field=3)

    def egress(self, frame):
        r = prog_test_run(self.dp.prog_fd("egress"), frame)
        assert r.retval == TC_ACT_OK
        return r.data

    def ingress(self, frame):
        r = prog_test_run(self.dp.prog_fd("ingress"), frame)
        assert r.retval == TC_ACT_OK
        return r.data

    def path_of(self, out: bytes) -> int:
        return addrplan.field_value(P.parse(out).src, 3)

    def reasons(self):
        return self.dp.stats()["reasons"]

    def reset(self):
        for w in self.dp.weights():
            if w["prefix"] != "::/0":
                self.dp.del_weights(w["prefix"])
        self.dp.set_weights({k: 1 for k in range(1, 5)}, spray=False)
        self.dp.set_config(expiry_ms=60_000, rotation=0)
        self.dp.set_placements({})
        self.dp.maps["conntrack"].clear()
        self.dp.maps["reverse"].clear()
        self.dp.verbs_clear()
        self.dp.rebalance()


@pytest.fixture(scope="module")
def hosts():
    with scratch_netns("rlbh") as ns:
        made = []
        try:
            made.append(Host(f"{ns}-a", A))
            made.append(Host(f"{ns}-b", B))
            yield made[0], made[1]
        finally:
            for h in made:
                h.dp.destroy()
            for name in (f"{ns}-a", f"{ns}-b"):   # a program that did not load: its maps were pinned
                shutil.rmtree(pin_dir("host", name).parent, ignore_errors=True)


@pytest.fixture
def ab(hosts):
    for h in hosts:
        h.reset()
    return hosts


def qp_frame(sport=50000, qp=1, src=A[1], dst=B[1], **kw):
    return P.roce_frame(src, dst, sport, qp, **kw)


def qp_frames(n, seed=1):
    rnd = random.Random(seed)
    return [qp_frame(sport=rnd.randrange(49152, 65536), qp=rnd.getrandbits(24)) for _ in range(n)]


# ---- bytes and checksums ---------------------------------------------------------------

def test_egress_rewrites_both_addresses_and_keeps_a_valid_checksum(ab):
    a, _ = ab
    a.dp.set_weights({1: 0, 2: 0, 3: 1, 4: 0})          # force path 3
    frame = qp_frame(qp=77)
    out = a.egress(frame)
    p = P.parse(out)
    assert p.src == A[3] and p.dst == B[3]
    assert P.udp_checksum_ok(out) and p.udp_checksum != 0
    # the checksum is exactly what a fresh computation gives
    fresh = P.roce_frame(A[3], B[3], 50000, 77)
    assert out == fresh
    # everything but the two addresses and the checksum is untouched
    assert out[:22] == frame[:22] and out[54:60] == frame[54:60] and out[62:] == frame[62:]


def test_zero_udp_checksum_stays_zero(ab):
    a, _ = ab
    a.dp.set_weights({1: 0, 2: 1, 3: 0, 4: 0})
    out = a.egress(qp_frame(zero_checksum=True))
    p = P.parse(out)
    assert (p.src, p.dst, p.udp_checksum) == (A[2], B[2], 0)


def test_egress_then_ingress_gives_back_the_original_packet(ab):
    a, b = ab
    for k in (1, 2, 3, 4):
        a.dp.set_weights({j: int(j == k) for j in range(1, 5)})
        a.dp.maps["conntrack"].clear()
        a.dp.rebalance()
        for zero in (False, True):
            frame = qp_frame(sport=40000 + k, qp=k, zero_checksum=zero)
            wire = a.egress(frame)
            assert P.parse(wire).dst == B[k]
            assert b.ingress(wire) == frame, (k, zero)


def test_ingress_restores_and_counts(ab):
    a, b = ab
    before = b.reasons()["restored"]
    wire = P.roce_frame(A[4], B[4], 50001, 9, hop_limit=60)
    out = b.ingress(wire)
    assert out == P.roce_frame(A[1], B[1], 50001, 9, hop_limit=60)
    assert b.reasons()["restored"] == before + 1
    assert b.dp.stats()["paths"][3]["rx_packets"] >= 1


# ---- QPs the verbs library placed ---------------------------------------------------------
def verbs_qp(host, peer_base, path_value, local_qpn, remote_qpn):
    """Record a verbs QP on host (as the agent does) towards peer on path path_value."""
    peer = addrplan.with_field(peer_base, 3, path_value)
    q = VerbsQp(str(peer_base), str(peer), local_qpn, remote_qpn, path_value - 1,
                host.dp.weights_for(peer_base)[0], 1)
    host.dp.verbs_put(q)
    return q


def test_ingress_leaves_a_verbs_qp_on_its_path_addresses_and_restores_the_rest(ab):
    """Its QP was given the path's addresses (the receiver checks them): restoring them would
    break it. Another QP from the same peer address is a TC-placed one: restored as ever."""
    a, b = ab
    verbs_qp(b, A[1], 3, local_qpn=0x300, remote_qpn=0x900)
    chose = b.reasons()["pass_app_chose"]
    wire = P.roce_frame(A[3], B[3], 50002, 0x300)             # A's packets to b's QP 0x300
    assert b.ingress(wire) == wire
    assert b.reasons()["pass_app_chose"] == chose + 1
    other = P.roce_frame(A[3], B[3], 50012, 0x301)
    assert b.ingress(other) == P.roce_frame(A[1], B[1], 50012, 0x301)
    # the path a TC-placed QP's peer chose is learnt; a verbs QP's packets teach nothing
    assert {k.sport for k, _ in b.dp.maps["reverse"].items()} == {50012}
    verbs = b.dp.verbs_qps()
    assert [(q.local_qpn, q.remote_qpn, q.path) for q in verbs] == [(0x300, 0x900, 2)]


def test_egress_leaves_a_verbs_qp_on_the_base_path_alone_and_places_the_rest(ab):
    """A verbs QP the agents put on the base path leaves with the base addresses: egress must not
    place it again (its peer's QP expects the base addresses)."""
    a, _ = ab
    a.dp.set_weights({1: 0, 2: 1, 3: 0, 4: 0})               # TC would put anything on path 2
    verbs_qp(a, B[1], 1, local_qpn=0x400, remote_qpn=0x500)
    frame = qp_frame(sport=50003, qp=0x500)                   # to B's QP 0x500, base addresses
    assert a.egress(frame) == frame
    assert a.dp.qps() == []                                   # not in the connection tracking
    other = qp_frame(sport=50003, qp=0x501)
    assert P.parse(a.egress(other)).src == A[2]
    # a verbs QP on a path is already on path addresses: passed, as an application's choice
    verbs_qp(a, B[1], 4, local_qpn=0x401, remote_qpn=0x502)
    onpath = P.roce_frame(A[4], B[4], 50004, 0x502)
    assert a.egress(onpath) == onpath


def test_verbs_qps_count_in_the_active_counters_and_leave_them_when_dropped(ab):
    a, _ = ab
    wid = a.dp.weights_for(B[1])[0]
    qs = [verbs_qp(a, B[1], k, 0x600 + i, 0x700 + i) for i, k in enumerate((1, 2, 2))]
    assert a.dp.active_counts(wid)[:4] == [1, 2, 0, 0]
    a.dp.rebalance()                                          # the sweep recounts them too
    assert a.dp.active_counts(wid)[:4] == [1, 2, 0, 0]
    # the next TC QP goes where the fewest are: path 3 (ties from the rotation, 0)
    assert a.path_of(a.egress(qp_frame(sport=50005, qp=0x800))) == 3
    for q in qs:
        assert a.dp.verbs_drop(q)
    a.dp.rebalance()
    assert a.dp.active_counts(wid)[:4] == [0, 0, 1, 0]
    # the counters are read one weight entry's slice at a time: the right slice, to the last one,
    # the data plane's count and user space's summed, never below 0
    act, adj, n = a.dp.maps["active"], a.dp.maps["active_adj"], 16
    for w in (1, act.max_entries // n - 1):
        for i in range(n):
            act.set(w * n + i, act.leaf_type(w + i))
            adj.set(w * n + i, adj.leaf_type(-1 if i % 2 else -(w + i) - 5))
        assert a.dp.active_counts(w) == [w + i - 1 if i % 2 else 0 for i in range(n)]
        for i in range(n):
            act.set(w * n + i, act.leaf_type(0))
            adj.set(w * n + i, adj.leaf_type(0))


def test_verbs_qps_per_path_are_counted_as_they_come_and_go_not_walked_by_every_sweep(ab):
    """The sweep adds verbs QPs to each slot's count from a tally kept by verbs_put and
    verbs_drop (walking every QP of every NIC each sweep took the GIL from the verbs thread at
    8 x 1000 QPs); the tally is what the QPs say, through a move, a drop, and a new process."""
    a, _ = ab
    wid = a.dp.weights_for(B[1])[0]
    qs = [verbs_qp(a, B[1], k, 0x620 + i, 0x720 + i) for i, k in enumerate((1, 2, 2, 4))]
    assert a.dp.verbs_counts() == {(wid, 0): 1, (wid, 1): 2, (wid, 3): 1}
    verbs_qp(a, B[1], 2, 0x621, 0x721)                       # the same entry put again: no more QPs
    assert a.dp.verbs_drop(qs[1])                             # moved 2 -> 3, as the agent moves one
    verbs_qp(a, B[1], 3, 0x621, 0x721)
    a.dp.verbs_drop(qs[3])
    want = {(wid, 0): 1, (wid, 1): 1, (wid, 2): 1}
    assert a.dp.verbs_counts() == want
    a.dp.rebalance()
    assert a.dp.active_counts(wid)[:4] == [1, 1, 1, 0]
    a.dp._verbs = None                                        # a new process: read from the map
    assert a.dp.verbs_counts() == want
    for q in a.dp.verbs_qps():
        a.dp.verbs_drop(q)
    assert a.dp.verbs_counts() == {}
    a.dp.rebalance()
    assert a.dp.active_counts(wid)[:4] == [0, 0, 0, 0]


def test_a_qp_the_data_plane_places_while_the_sweep_counts_is_not_lost(ab, monkeypatch):
    """The sweep recounts the active counters from the table; a QP placed after the table was
    read but before the counters were written used to vanish from them, and the next QPs all
    went onto its path (CI: 15 and 13 QPs on one plane's two sub-ports)."""
    a, _ = ab
    wid = a.dp.weights_for(B[1])[0]
    first = [a.path_of(a.egress(f)) for f in qp_frames(8, seed=5)]
    assert sorted(first) == [1, 1, 2, 2, 3, 3, 4, 4]
    assert a.dp.active_counts(wid)[:4] == [2, 2, 2, 2]
    ct, reads, late = a.dp.maps["conntrack"], [], []
    items = ct.items

    def read_then_a_qp_starts():
        rows = list(items())
        reads.append(len(rows))                 # the sweep reads the table once
        late.append(a.path_of(a.egress(qp_frame(sport=61000, qp=0x61))))
        return rows

    monkeypatch.setattr(ct, "items", read_then_a_qp_starts)
    a.dp.rebalance(balance=False)
    monkeypatch.undo()
    assert reads == [8] and late == [1]
    assert a.dp.active_counts(wid)[:4] == [3, 2, 2, 2]
    # the next sweep finds the table quiet and agrees
    a.dp.rebalance(balance=False)
    assert a.dp.active_counts(wid)[:4] == [3, 2, 2, 2]
    nxt = [a.path_of(a.egress(f)) for f in qp_frames(3, seed=6)]
    assert sorted(nxt) == [2, 3, 4]


def test_counters_drifted_from_the_table_are_corrected_by_the_sweep(ab):
    """Entries gone without the data plane seeing them (the LRU evicted them, or an operator
    cleared the table): the sweep's recount brings the counters back to the table."""
    a, _ = ab
    wid = a.dp.weights_for(B[1])[0]
    for f in qp_frames(8, seed=7):
        a.egress(f)
    ct = a.dp.maps["conntrack"]
    for k in list(ct.keys())[:3]:
        ct.delete(k)
    assert sum(a.dp.active_counts(wid)) == 8
    a.dp.rebalance(balance=False)
    left = Counter(v.path for _, v in ct.items())
    assert a.dp.active_counts(wid)[:4] == [left.get(i, 0) for i in range(4)] and sum(left.values()) == 5


# ---- placement, releases, reinstatements -----------------------------------------------

def paths_of(host, frames):
    return [host.path_of(host.egress(f)) for f in frames]


@pytest.mark.parametrize("weights", [{1: 1, 2: 1, 3: 1, 4: 1}, {1: 4, 2: 2, 3: 1, 4: 1}, {1: 3, 2: 0, 3: 1, 4: 1}])
def test_1000_qps_split_by_weights_exactly(ab, weights):
    a, _ = ab
    a.dp.set_weights(weights)
    got = paths_of(a, qp_frames(1000))
    total = sum(weights.values())
    for k, w in weights.items():
        assert abs(got.count(k) - 1000 * w / total) <= 1, (k, got.count(k))
    # a QP keeps its path on later packets
    assert paths_of(a, qp_frames(1000)) == got


def test_weight_drop_releases_the_minimum_and_recovery_reinstates(ab):
    a, _ = ab
    frames = qp_frames(1000, seed=2)
    before = paths_of(a, frames)
    assert [before.count(k) for k in range(1, 5)] == [250] * 4
    rel0 = a.reasons()["ev_released"]
    a.dp.set_weights({4: 0.5})                      # path 4 lost half its capacity
    after = paths_of(a, frames)
    counts = [after.count(k) for k in range(1, 5)]
    assert counts[3] == 142 and sum(counts) == 1000  # 1000 * 0.5 / 3.5 = 142.9
    moved = [(x, y) for x, y in zip(before, after) if x != y]
    assert len(moved) == 108                         # the excess 250 - 142.9, rounded up
    assert all(x == 4 for x, _ in moved)             # no QP of an unaffected path moved
    assert a.reasons()["ev_released"] - rel0 == 108
    a.dp.set_weights({4: 1})                          # recovered
    again = paths_of(a, frames)
    assert [again.count(k) for k in range(1, 5)] == [250] * 4
    back = [(x, y) for x, y in zip(after, again) if x != y]
    assert len(back) == 108 and all(y == 4 for _, y in back)


def test_unusable_path_releases_all_its_qps(ab):
    a, _ = ab
    frames = qp_frames(400, seed=3)
    before = paths_of(a, frames)
    a.dp.set_weights({2: 0})
    after = paths_of(a, frames)
    assert 2 not in after
    assert all(x == y for x, y in zip(before, after) if x != 2)


def test_vanished_path_releases_its_qps(ab):
    a, _ = ab
    frames = qp_frames(200, seed=4)
    before = paths_of(a, frames)
    a.dp.set_paths({k: A[k] for k in (1, 2, 3)}, field=3)     # RA withdrew prefix 4
    try:
        after = paths_of(a, frames)
        assert 4 not in after
        assert all(x == y for x, y in zip(before, after) if x != 4)
    finally:
        a.dp.set_paths(A, field=3)


def test_expired_entry_is_reassigned_by_current_weights(ab):
    a, _ = ab
    a.dp.set_config(expiry_ms=30)
    frame = qp_frame(sport=61000, qp=5)
    first = paths_of(a, [frame])[0]
    a.dp.set_weights({k: int(k != first) for k in range(1, 5)})   # nothing moves it now...
    ev = a.reasons()
    time.sleep(0.06)                                   # ...until it has been idle > expiry
    second = paths_of(a, [frame])[0]
    assert second != first
    assert a.reasons()["ev_assign"] - ev["ev_assign"] == 1


def test_peer_started_qp_is_answered_on_the_same_path(ab):
    a, b = ab
    wire = a.egress(qp_frame(sport=55555, qp=42))      # A starts a QP towards B
    k = a.path_of(wire)
    b.ingress(wire)                                    # B learns the path
    follow = b.reasons()["ev_follow_reverse"]
    reply = P.roce_frame(B[1], A[1], 55555, 4242)      # B's side of the QP, same UDP port
    out = b.egress(reply)
    assert P.parse(out).src == B[k] and P.parse(out).dst == A[k]
    assert b.reasons()["ev_follow_reverse"] == follow + 1


def test_per_destination_weights(ab):
    a, _ = ab
    a.dp.set_weights({1: 0, 2: 0, 3: 0, 4: 1}, prefix="fc00:1:2::/48")
    a.dp.set_weights({1: 1, 2: 0, 3: 0, 4: 0}, prefix="fc00:1:9::/48")
    assert set(paths_of(a, qp_frames(50))) == {4}
    far = [qp_frame(sport=50000 + i, dst="fc00:1:9:1::5") for i in range(50)]
    assert set(paths_of(a, far)) == {1}


def test_spray_follows_weights_per_packet(ab):
    a, _ = ab
    a.dp.set_weights({1: 4, 2: 3, 3: 2, 4: 1}, spray=True)
    frame = qp_frame(qp=3)
    got = paths_of(a, [frame] * 100_000)
    for k, w in {1: 0.4, 2: 0.3, 3: 0.2, 4: 0.1}.items():
        assert abs(got.count(k) / len(got) - w) < 0.01


# ---- the local rule's rotation and the coordinator's placements --------------------------

@pytest.mark.parametrize("rotation", [0, 1, 2, 3])
def test_ties_start_at_the_hosts_rotation(ab, rotation):
    a, _ = ab
    a.dp.set_config(rotation=rotation)
    got = paths_of(a, qp_frames(6, seed=10 + rotation))
    assert got == [(rotation + j) % 4 + 1 for j in range(6)]


def test_sweep_leaves_a_split_within_one_qp_of_the_shares_alone(ab):
    """6 QPs from rotation 2 land 3,4,1,2,3,4: every path within one QP of 1.5, so the agent's
    sweep must not move any (it once pulled them back towards path 1 every 100 ms)."""
    a, _ = ab
    a.dp.set_config(rotation=2)
    frames = qp_frames(6, seed=21)
    assert paths_of(a, frames) == [3, 4, 1, 2, 3, 4]
    assert a.dp.rebalance() == 0
    assert paths_of(a, frames) == [3, 4, 1, 2, 3, 4]


@pytest.mark.parametrize("weights", [[1, 1, 1, 1], [2, 1, 1, 1], [3, 0, 1, 2], [1, 2, 2, 1]])
def test_program_follows_the_local_rule_model(ab, weights):
    """bpf/rlb_host.c and rlbfabric.localrule.choose take the same decisions, QP by QP."""
    a, _ = ab
    a.dp.set_weights({k + 1: w for k, w in enumerate(weights)})
    a.dp.set_config(rotation=3)
    active = [0, 0, 0, 0]
    for frame in qp_frames(40, seed=sum(weights)):
        want = localrule.choose(active, weights, 3)
        assert a.path_of(a.egress(frame)) == want + 1
        active[want] += 1


def test_new_qp_takes_its_placement(ab):
    a, _ = ab
    a.dp.set_placements({(B[1], 50101, 7): 2})           # path index 2 = path value 3
    ev = a.reasons()["ev_placed"]
    assert a.path_of(a.egress(qp_frame(sport=50101, qp=7))) == 3
    assert a.reasons()["ev_placed"] == ev + 1
    assert a.dp.placements() == {(B[1], 50101, 7): 2}


def test_placement_waits_until_the_qp_is_idle(ab):
    """Never moved with packets in flight: an active QP keeps its path; once idle past the
    expiry, its next packet takes the placement."""
    a, _ = ab
    a.dp.set_config(expiry_ms=40)
    frame = qp_frame(sport=50102, qp=8)
    first = a.path_of(a.egress(frame))
    target = first % 4                                   # index of the next path
    a.dp.set_placements({(B[1], 50102, 8): target})
    for _ in range(5):
        assert a.path_of(a.egress(frame)) == first
        time.sleep(0.005)
    time.sleep(0.06)
    assert a.path_of(a.egress(frame)) == target + 1
    assert a.reasons()["ev_placed"] >= 1


def test_placement_on_an_unusable_path_is_ignored(ab):
    a, _ = ab
    a.dp.set_weights({1: 1, 2: 0, 3: 1, 4: 1})
    a.dp.set_placements({(B[1], 50103, 9): 1})            # path 2, weight 0
    assert a.path_of(a.egress(qp_frame(sport=50103, qp=9))) != 2


def test_sweep_keeps_placed_qps_where_the_coordinator_put_them(ab):
    a, _ = ab
    frames = qp_frames(4, seed=40)
    keys = [(B[1], P.parse(f).sport, P.parse(f).qp) for f in frames]
    a.dp.set_placements({k: 0 for k in keys})              # all four on path 1: unbalanced for this host
    assert paths_of(a, frames) == [1, 1, 1, 1]
    assert a.dp.rebalance() == 0
    assert paths_of(a, frames) == [1, 1, 1, 1]
    a.dp.set_weights({1: 0})                              # ...unless the path becomes unusable
    assert 1 not in paths_of(a, frames)


def test_sweep_leaves_an_active_qp_whose_placement_changed_until_it_is_idle(ab):
    """The coordinator moved its placements while the QPs were active (as it does when the QPs
    of a job's second burst report in): each keeps its path while active, the sweep does not
    hand it to the host's share instead (it did, mid-burst: the lab's links showed fractions
    of a QP), and once idle it takes the new placement."""
    a, _ = ab
    a.dp.set_config(expiry_ms=300)
    frames = qp_frames(4, seed=42)
    keys = [(B[1], P.parse(f).sport, P.parse(f).qp) for f in frames]
    a.dp.set_placements({k: 0 for k in keys})
    assert paths_of(a, frames) == [1, 1, 1, 1]
    a.dp.set_placements({k: 1 for k in keys})             # all four now due on path 2
    assert a.dp.rebalance() == 0
    assert paths_of(a, frames) == [1, 1, 1, 1]
    time.sleep(0.35)
    assert paths_of(a, frames) == [2, 2, 2, 2]


def test_a_capacity_drop_releases_placed_qps_too_and_drops_their_placements(ab):
    """The host's own capacity change is immediate (§3.1): placed or not, the proportional QPs
    leave the degraded path; the moved one loses its placement (the coordinator starts again
    from where the host put it)."""
    a, _ = ab
    frames = qp_frames(8, seed=41)
    keys = [(B[1], P.parse(f).sport, P.parse(f).qp) for f in frames]
    a.dp.set_placements({k: j % 4 for j, k in enumerate(keys)})   # 2 per path
    assert sorted(paths_of(a, frames)) == [1, 1, 2, 2, 3, 3, 4, 4]
    a.dp.set_weights({4: 0.5})                                     # 8 x (1,1,1,.5)/3.5: 3,2,2,1
    after = paths_of(a, frames)
    assert [after.count(k) for k in (1, 2, 3, 4)] == [3, 2, 2, 1]
    assert len(a.dp.placements()) == 7


def test_bytes_per_qp_are_counted(ab):
    a, _ = ab
    frame = qp_frame(sport=50104, qp=11, payload_len=100)
    for _ in range(3):
        a.egress(frame)
    q = next(q for q in a.dp.qps() if q["sport"] == 50104)
    assert q["bytes"] == 3 * len(frame)


def test_bad_placement_is_refused(ab):
    a, _ = ab
    with pytest.raises(HostError):
        a.dp.set_placements({(B[1], 1, 1): 16})


# ---- left alone ------------------------------------------------------------------------

def ipv4():
    ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 28, 0, 0, 64, 17, 0, bytes(4), bytes(4))
    return P.ether("02:00:00:00:00:01", "02:00:00:00:00:02", P.ETH_P_IP, ip + bytes(8))


UNTOUCHED = {
    "ipv4": (ipv4(), "pass_not_ipv6"),
    # the kernel's skb test run needs a whole IPv6 header (54 bytes); shorter cannot be fed
    "ipv6_header_only": (qp_frame()[:54], "pass_malformed"),
    "short_udp": (qp_frame()[:58], "pass_malformed"),
    "no_bth": (qp_frame()[:66], "pass_malformed"),
    "fragment": (P.ipv6_frame(A[1], B[1], 44, bytes(8) + bytes(40)), "pass_fragment"),
    "tcp": (P.ipv6_frame(A[1], B[1], P.PROTO_TCP, P.tcp6(A[1], B[1], 1, 4791)), "pass_not_roce"),
    "other_udp_port": (qp_frame(dport=5000), "pass_not_roce"),
    "app_chose_source": (qp_frame(src=A[2]), "pass_app_chose"),
    "app_chose_destination": (qp_frame(dst=B[3]), "pass_app_chose"),
    "foreign_source": (qp_frame(src="fd00::1"), "pass_not_base"),
}


@pytest.mark.parametrize("case", sorted(UNTOUCHED))
def test_egress_leaves_other_packets_untouched(ab, case):
    a, _ = ab
    frame, reason = UNTOUCHED[case]
    before = a.reasons()[reason]
    assert a.egress(frame) == frame
    assert a.reasons()[reason] == before + 1


@pytest.mark.parametrize("frame", [ipv4(), qp_frame()[:54], qp_frame()[:60], qp_frame(dst=B[1]),
                                   P.ipv6_frame(A[2], B[2], 44, bytes(48)), qp_frame(dport=5000)])
def test_ingress_leaves_other_packets_untouched(ab, frame):
    _, b = ab
    assert b.ingress(frame) == frame


def test_weights_that_do_not_fit_are_refused_not_truncated(ab):
    from rlbhost.dataplane import HostError
    a, _ = ab
    before = a.dp.weights()
    with pytest.raises(HostError, match="too large"):
        a.dp.set_weights({1: 5_000_000})           # x1000 would wrap a u32 to 705032.704
    with pytest.raises(HostError, match="finite"):
        a.dp.set_weights({1: float("nan")})
    assert a.dp.weights() == before


@pytest.mark.parametrize("ports", [[70000], [0], [4791, -1], [True]])
def test_a_roce_port_that_does_not_fit_is_refused_not_truncated(ab, ports):
    """The map field is 16 bits: 70000 used to be stored as 4464, a port nobody uses."""
    a, _ = ab
    before = list(a.dp.maps["config"].get(0).roce_ports)
    with pytest.raises(HostError, match="1 to 65535"):
        a.dp.set_config(roce_ports=ports)
    assert list(a.dp.maps["config"].get(0).roce_ports) == before


def test_path_indexes_of_gone_prefixes_are_reused(ab):
    """Prefixes that come and go (a renumbering, several RAs over time) used to keep their index
    for good: after 16 distinct values the table was full. A gone path's index is reused, and
    nothing of the old path (weight, QPs, placements) sticks to the new one."""
    a, _ = ab
    a.dp.set_weights({1: 1, 2: 1, 3: 1, 4: 0.5})
    try:
        for round_ in range(6):                  # 4 + 6 x 4 = 28 distinct values over time
            vals = {v: f"fc00:1:1:{v:x}:a8c0:ffff:fe00:1" for v in range(16 * (round_ + 1), 16 * (round_ + 1) + 4)}
            a.dp.set_paths({1: A[1], **vals}, field=3, base_value=1)
        live = [p for p in a.dp.paths() if p.valid]
        assert len(live) == 5 and len(a.dp.paths()) <= 16
        default = next(w for w in a.dp.weights() if w["prefix"] == "::/0")
        assert all(v == 1.0 for k, v in default["weights"].items() if k != 1)   # no 0.5 inherited
    finally:
        a.dp.set_paths(A, field=3, base_value=1)
        a.reset()


def test_only_this_hosts_fabric_prefixes_are_paths():
    """An extra prefix on the port (a management /64), or a deprecated address (a prefix being
    withdrawn), used to become a path like the fabric's: only the host's prefixes in the fabric
    file, current ones, are."""
    import ipaddress as ip
    import subprocess as sp
    with scratch_netns("rlbhq") as ns:
        sp.run(["ip", "link", "add", "eth0", "type", "veth", "peer", "name", "eth1"], check=True)
        sp.run(["ip", "link", "set", "eth0", "up"], check=True)
        for k in (1, 2, 3):
            sp.run(["ip", "addr", "add", f"{A[k]}/64", "dev", "eth0", "nodad"], check=True)
        sp.run(["ip", "addr", "add", "2001:db8:9::5/64", "dev", "eth0", "nodad"], check=True)
        sp.run(["ip", "addr", "add", f"{A[4]}/64", "dev", "eth0", "nodad", "preferred_lft", "0"], check=True)
        dp = HostDataplane(f"{ns}-q")
        try:
            dp.load()
            fabric = [ip.IPv6Network(f"fc00:1:1:{k}::/64") for k in range(1, 5)]
            dp.sync_paths("eth0", path_field=3, base_value=1, allowed=fabric)
            assert sorted(p.value for p in dp.paths() if p.valid) == [1, 2, 3]
        finally:
            dp.destroy()
            shutil.rmtree(pin_dir("host", f"{ns}-q").parent, ignore_errors=True)
