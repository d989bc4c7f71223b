"""The host TC egress program in ports mode (FARE scale-up) under BPF_PROG_TEST_RUN: each QP's
packets leave by its path's port with that link's MACs and unchanged bytes otherwise; QPs split by
weight across planes and evenly over a plane's sub-ports; a port losing carrier moves exactly its
QPs; other traffic by flow hash; spray per packet."""
from __future__ import annotations

import random
import struct
import subprocess
import sys
import time
from collections import Counter

import pytest
from pyroute2 import IPRoute

from rlbcommon import packets as P
from rlbcommon.testrun import TC_ACT_REDIRECT, TC_ACT_SHOT, prog_test_run
from rlbfabric.base import add_loopback_device
from rlbhost.carrier import down_mask, link_events
from rlbhost.dataplane import HostDataplane, HostError, PortPath

from .conftest import scratch_netns

LOOP_A, LOOP_B, LOOP_C = "fc00:0:ff::1", "fc00:0:ff::2", "fc00:0:ff::3"
PLANES, SUBS = 4, 2
# port (plane p, sub-port i) = eth-p<p>-<i>, path value (p-1)*SUBS + i, switch MAC 02:00:00:00:0p:0i
PORTS = {(p, i): f"eth-p{p}-{i}" for p in range(1, PLANES + 1) for i in range(1, SUBS + 1)}


def value(p, i):
    return (p - 1) * SUBS + i


def switch_mac(p, i):
    return f"02:00:00:00:{p:02x}:{i:02x}"


def port_paths(down=()):
    return [PortPath(value(p, i), name, switch_mac(p, i), (p, i) not in down) for (p, i), name in PORTS.items()]


@pytest.fixture(scope="module")
def host():
    with scratch_netns("rlbhp") as ns:
        for name in ["rlb0", *PORTS.values()]:
            add_loopback_device(name)
        dp = HostDataplane(f"{ns}-h")
        try:
            dp.attach_ports("rlb0", LOOP_A, port_paths(), group_size=SUBS, echo=True)
            yield dp
        finally:
            dp.destroy()


@pytest.fixture
def dp(host):
    host.set_port_paths(LOOP_A, port_paths())
    host.apply_weights({"::/0": ({v: 1 for v in range(1, 9)}, False)})
    host.set_config(expiry_ms=60_000, rotation=0)
    set_mask(host, 0)
    host.maps["conntrack"].clear()
    host.rebalance()
    return host


def set_mask(dp, mask):
    m = dp.maps["port_down"]
    m.set(0, m.leaf_type(mask))


def send(dp, frame):
    r = prog_test_run(dp.prog_fd("egress"), frame)
    return r.retval, r.data


def port_of(dp, data: bytes) -> tuple[int, int]:
    """(plane, sub-port) a frame left by, from the destination MAC the program wrote; the source
    MAC must be that port's own."""
    dmac = data[:6].hex(":")
    pi = next(k for k in PORTS if switch_mac(*k) == dmac)
    ifindex = {p.value: p.ifindex for p in dp.paths()}[value(*pi)]
    assert data[6:12] == dp._mac(ifindex)
    return pi


def qp_frames(n, dst=LOOP_B, seed=1):
    rnd = random.Random(seed)
    return [P.roce_frame(LOOP_A, dst, rnd.randrange(49152, 65536), rnd.getrandbits(24)) for _ in range(n)]


def planes_of(dp, frames):
    out = []
    for f in frames:
        rc, data = send(dp, f)
        assert rc == TC_ACT_REDIRECT
        out.append(port_of(dp, data))
    return out


def test_a_qp_leaves_by_its_port_with_the_links_macs_and_nothing_else_changed(dp):
    frame = qp_frames(1)[0]
    rc, data = send(dp, frame)
    assert rc == TC_ACT_REDIRECT
    assert data[12:] == frame[12:]                 # addresses, checksum, payload untouched
    first = port_of(dp, data)
    for _ in range(5):                             # conntrack keeps it there
        assert port_of(dp, send(dp, frame)[1]) == first
    assert dp.stats()["reasons"]["sent_on_port"] == 6


@pytest.mark.parametrize("plane_bw", [(1, 1, 1, 1), (2, 2, 2, 1), (4, 2, 1, 1)])
def test_64_qps_split_across_planes_by_path_bandwidth_and_evenly_over_sub_ports(dp, plane_bw):
    weights = {value(p, i): plane_bw[p - 1] / SUBS for p in range(1, PLANES + 1) for i in range(1, SUBS + 1)}
    dp.apply_weights({f"{LOOP_B}/128": (weights, False)})
    got = planes_of(dp, qp_frames(64, seed=sum(plane_bw)))
    total = sum(plane_bw)
    for p in range(1, PLANES + 1):
        share = sum(1 for q in got if q[0] == p) / 64
        assert abs(share - plane_bw[p - 1] / total) <= 0.02 + 1 / 64   # whole QPs
        subs = [sum(1 for q in got if q == (p, i)) for i in range(1, SUBS + 1)]
        assert max(subs) - min(subs) <= 1


def test_a_sub_port_losing_carrier_moves_exactly_its_qps(dp):
    frames = qp_frames(64, seed=3)
    before = dict(zip(range(64), planes_of(dp, frames)))
    on_port = [q for q, pi in before.items() if pi == (2, 1)]
    assert len(on_port) == 8
    assert dp.set_port_up("eth-p2-1", False) == [value(2, 1)]
    after = dict(zip(range(64), planes_of(dp, frames)))     # the program moves them on its own
    moved = [q for q in before if before[q] != after[q]]
    assert sorted(moved) == sorted(on_port)
    assert all(after[q] != (2, 1) for q in moved)
    dp.set_port_up("eth-p2-1", True)
    assert dp.rebalance(release=True) == 8                  # reinstated: its 8 come back
    again = dict(zip(range(64), planes_of(dp, frames)))
    assert all(sum(1 for pi in again.values() if pi == k) == 8 for k in PORTS)


def test_remote_half_plane_releases_the_proportional_qps(dp):
    """The peer lost one of its two sub-cables into plane 1: plane 1's path bandwidth to it halves
    (weights 1:2:2:2), so 64 x (1/4 - 1/7) = 6.86 -> exactly 7 QPs leave plane 1."""
    dp.apply_weights({f"{LOOP_B}/128": ({v: 1.0 for v in range(1, 9)}, False)})
    frames = qp_frames(64, seed=4)
    before = planes_of(dp, frames)
    assert sum(1 for pi in before if pi[0] == 1) == 16
    w = {value(p, i): (0.5 if p == 1 else 1.0) for p in range(1, 5) for i in range(1, 3)}
    dp.apply_weights({f"{LOOP_B}/128": (w, False)})
    after = planes_of(dp, frames)
    moved = sum(1 for a, b in zip(before, after) if a != b)
    assert moved == 7
    assert sum(1 for pi in after if pi[0] == 1) == 9


def test_a_probe_verdict_taken_back_before_anything_moved_moves_nothing(dp):
    """A plane judged silent for a moment (its probes lost while the plane's switch moved the
    peer's sub-link) and answering again before any QP left it: the weights come back to what
    the QPs are laid out for, so none moves. The release used to compare the new weights with
    the verdict's (a plane at 0 that still held its QPs) and moved QPs (62 QPs, 15.5 a plane:
    the planes holding 16 looked over a share that had fallen)."""
    w = {v: 1.0 for v in range(1, 9)}
    dp.apply_weights({f"{LOOP_B}/128": (w, False)})
    frames = qp_frames(62, seed=14)
    planes_of(dp, frames)
    dp.rebalance()                                             # the agent's sweep: planes even too
    before = planes_of(dp, frames)
    assert sorted(Counter(p for p, _ in before).values()) == [15, 15, 16, 16]
    assert max(Counter(before).values()) - min(Counter(before).values()) <= 1
    assert dp.zero_paths(f"{LOOP_B}/128", {value(3, 1), value(3, 2)})
    released = dp.stats()["reasons"]["ev_released"]
    dp.apply_weights({f"{LOOP_B}/128": (w, False)})           # answered again: the agent's step
    assert dp.stats()["reasons"]["ev_released"] == released
    assert planes_of(dp, frames) == before


def test_a_probe_verdict_taken_back_after_a_sweep_moved_its_qps_brings_the_same_qps_back(dp):
    """The verdict held long enough for a sweep to move plane 3's 16 QPs to the other planes;
    then the plane answers again. The release takes back plane 3's own QPs, so every QP ends on
    the port it had: none moved for nothing. Before, the planes gave back their newest QPs
    (in the scale-up lab, 24 moved where 6 were the fewest: docs/results.md)."""
    w = {v: 1.0 for v in range(1, 9)}
    dp.apply_weights({f"{LOOP_B}/128": (w, False)})
    frames = qp_frames(64, seed=15)
    planes_of(dp, frames)
    dp.rebalance()
    before = planes_of(dp, frames)
    assert Counter(before) == {k: 8 for k in PORTS}
    assert dp.zero_paths(f"{LOOP_B}/128", {value(3, 1), value(3, 2)})
    assert dp.rebalance() == 16                                # the sweep meanwhile
    during = planes_of(dp, frames)
    assert not any(p == 3 for p, _ in during)
    released = dp.stats()["reasons"]["ev_released"]
    dp.apply_weights({f"{LOOP_B}/128": (w, False)})           # answered again
    assert dp.stats()["reasons"]["ev_released"] == released + 16
    assert planes_of(dp, frames) == before


def test_per_destination_weights_and_a_plane_unusable_for_one_peer_only(dp):
    w = {v: 1.0 for v in range(1, 9)}
    dp.apply_weights({f"{LOOP_B}/128": ({**w, value(3, 1): 0, value(3, 2): 0}, False),
                      f"{LOOP_C}/128": (w, False)})
    to_b = planes_of(dp, qp_frames(48, LOOP_B, seed=5))
    to_c = planes_of(dp, qp_frames(48, LOOP_C, seed=6))
    assert not any(p == 3 for p, _ in to_b)
    assert sum(1 for p, _ in to_c if p == 3) == 12


def test_a_probe_verdict_zeroes_its_plane_at_once_even_while_a_sweep_holds_the_maps(dp):
    """zero_paths (a probe verdict's fast path) writes while another thread holds locked() (a
    long sweep on a busy host made the verdict wait 400 ms in the lab); the QPs on the dead
    plane move with their next packet, only towards that peer; it never zeroes the last plane."""
    import threading
    w = {v: 1.0 for v in range(1, 9)}
    dp.apply_weights({f"{LOOP_B}/128": (w, False), f"{LOOP_C}/128": (w, False)})
    frames = qp_frames(64, LOOP_B, seed=12)
    before = planes_of(dp, frames)
    held, release = threading.Event(), threading.Event()

    def sweep():
        with dp.locked():
            held.set()
            release.wait(10)
    t = threading.Thread(target=sweep)
    t.start()
    try:
        held.wait(5)
        t0 = time.monotonic()
        assert dp.zero_paths(f"{LOOP_B}/128", {value(2, 1), value(2, 2)})
        assert time.monotonic() - t0 < 1.0
        after = planes_of(dp, frames)             # moved by the program, no sweep needed
    finally:
        release.set()
        t.join()
    assert [q for q in range(64) if after[q] != before[q]] == [q for q in range(64) if before[q][0] == 2]
    assert not any(p == 2 for p, _ in after) and sum(1 for p, _ in before if p == 2) == 16
    assert sum(1 for p, _ in planes_of(dp, qp_frames(48, LOOP_C, seed=13)) if p == 2) == 12
    # the last plane left is never taken away (probes cannot tell a dead peer from a busy one)
    assert dp.zero_paths(f"{LOOP_B}/128", {value(p, i) for p in (1, 3) for i in (1, 2)})
    assert not dp.zero_paths(f"{LOOP_B}/128", {value(4, 1), value(4, 2)})
    entry = next(e for e in dp.weights() if e["prefix"] == f"{LOOP_B}/128")
    assert {v for v, x in entry["all_weights"].items() if x} == {value(4, 1), value(4, 2)}
    assert not dp.zero_paths("fc00:0:ff::99/128", {value(1, 1)})      # no entry of its own


def test_spray_per_packet_across_planes_and_sub_ports_within_one_point(dp):
    """§3.2: one QP, 100 000 packets, plane weights 2:2:1:1 -> each (plane, sub-port) its share
    within 1 point."""
    bw = (2, 2, 1, 1)
    w = {value(p, i): bw[p - 1] / 2 for p in range(1, 5) for i in range(1, 3)}
    dp.apply_weights({f"{LOOP_B}/128": (w, True)})
    frame = qp_frames(1)[0]
    counts: dict = {}
    for _ in range(100_000):
        rc, data = send(dp, frame)
        assert rc == TC_ACT_REDIRECT
        counts[data[:6]] = counts.get(data[:6], 0) + 1
    for p in range(1, 5):
        for i in range(1, 3):
            share = counts.get(bytes.fromhex(switch_mac(p, i).replace(":", "")), 0) / 100_000
            assert abs(share - bw[p - 1] / 2 / 6) < 0.01


def test_other_traffic_is_placed_by_flow_hash_on_live_ports(dp):
    dp.set_port_up("eth-p1-1", False)
    seen = set()
    for sport in range(40000, 40200):
        f = P.ipv6_frame(LOOP_A, LOOP_B, 17, P.udp6(LOOP_A, LOOP_B, sport, 9999, b"x" * 8))
        rc, data = send(dp, f)
        assert rc == TC_ACT_REDIRECT
        pi = port_of(dp, data)
        assert pi != (1, 1)
        assert port_of(dp, send(dp, f)[1]) == pi           # one flow, one port
        seen.add(pi)
    assert len(seen) == 7
    assert dp.stats()["reasons"]["hashed_on_port"] >= 400


def test_no_usable_port_drops_and_counts(dp):
    for name in PORTS.values():
        dp.set_port_up(name, False)
    before = dp.stats()["reasons"]["pass_no_path"]
    rc, _ = send(dp, qp_frames(1)[0])
    assert rc == TC_ACT_SHOT
    assert dp.stats()["reasons"]["pass_no_path"] == before + 1


def test_a_port_without_a_known_switch_mac_is_not_used(dp):
    paths = [PortPath(p.value, p.ifname, None if p.value == 1 else p.dmac, True) for p in port_paths()]
    dp.set_port_paths(LOOP_A, paths)
    got = planes_of(dp, qp_frames(32, seed=8))
    assert (1, 1) not in got


def test_bad_ports_are_refused(dp):
    with pytest.raises(HostError):
        dp.set_port_paths(LOOP_A, [])
    with pytest.raises(HostError):
        dp.set_port_paths(LOOP_A, [PortPath(17, "eth-p1-1", switch_mac(1, 1), True)])



def test_a_port_that_does_not_exist_is_unusable_and_the_others_still_change(dp):
    """One missing GPU port (removed, not created yet) used to make every update fail, so no
    weight or port change went in anywhere. Now it is unusable alone."""
    ports = port_paths(down=[(2, 1)])
    ports[0] = PortPath(ports[0].value, "nosuchport", ports[0].dmac, True)
    assert dp.set_port_paths(LOOP_A, ports)
    valid = {p.value: p.valid for p in dp.paths()}
    assert valid[ports[0].value] is False                 # the missing one
    down = next(p.value for p in ports if not p.up)
    assert valid[down] is False                           # the other change went in too
    assert sum(valid.values()) == len(ports) - 2



def test_the_carrier_watchers_mask_moves_exactly_the_dead_ports_qps(dp):
    """The watcher's bit for a port takes it out of use on the next packet, though the agent's
    own view (the path entry) still says usable: QPs on it move, no other QP does."""
    frames = qp_frames(64, seed=11)
    before = dict(zip(range(64), planes_of(dp, frames)))
    on_port = sorted(q for q, pi in before.items() if pi == (3, 2))
    assert len(on_port) == 8
    set_mask(dp, 1 << (value(3, 2) - 1))
    assert all(p.valid for p in dp.paths())
    after = dict(zip(range(64), planes_of(dp, frames)))
    assert sorted(q for q in before if before[q] != after[q]) == on_port
    assert not any(pi == (3, 2) for pi in after.values())
    for sport in range(40000, 40100):                        # flow-hash traffic avoids it too
        f = P.ipv6_frame(LOOP_A, LOOP_B, 17, P.udp6(LOOP_A, LOOP_B, sport, 9999, b"x" * 8))
        assert port_of(dp, send(dp, f)[1]) != (3, 2)
    status = {p["path"]: p["carrier"] for p in dp.status()["paths"]}
    assert [v for v, up in status.items() if not up] == [value(3, 2)]
    set_mask(dp, 0)                                          # carrier back: usable again
    assert dp.rebalance(release=True) == 8
    assert (3, 2) in set(planes_of(dp, frames))


def test_link_messages_are_parsed_and_the_mask_has_a_bit_per_dead_port():
    import struct
    name = b"eth-p1-2\0"
    attr = struct.pack("=HH", 4 + len(name), 3) + name + b"\0" * (-len(name) % 4)
    body = struct.pack("=BxHiII", 0, 1, 7, 0x10001, 0) + attr
    msg = struct.pack("=IHHII", 16 + len(body), 16, 0, 0, 0) + body
    down = struct.pack("=IHHII", 16 + len(body), 16, 0, 0, 0) + struct.pack("=BxHiII", 0, 1, 7, 0x1, 0) + attr
    done = struct.pack("=IHHII", 20, 3, 0, 0, 0) + b"\0" * 4
    assert list(link_events(msg + down + done)) == [("new", 7, "eth-p1-2", True), ("new", 7, "eth-p1-2", False),
                                                     ("done", 0, None, False)]
    ports = {"eth-p1-1": 0, "eth-p1-2": 1, "eth-p2-1": 2}
    assert down_mask(ports, {"eth-p1-1": True, "eth-p1-2": False, "eth-p2-1": True}) == 0b010
    assert down_mask(ports, {"eth-p1-1": True}) == 0b110           # unknown = no carrier


def test_the_carrier_watcher_follows_the_kernels_link_events(dp):
    """The real watcher process in the host's namespace: a port set down is in the mask within
    a few milliseconds of the kernel's event, back out when it comes up; the agent is not
    involved. (ifb ports: down/up is what changes their carrier here.)"""
    ports = {name: value(*pi) - 1 for pi, name in PORTS.items()}
    cmd = [sys.executable, "-m", "rlbhost.carrier", "--pins", str(dp.pins), "--rt-priority", "0"]
    for name, i in ports.items():
        cmd += ["--port", f"{name}={i}"]
    with IPRoute() as ipr:
        for name in ports:
            ipr.link("set", index=ipr.link_lookup(ifname=name)[0], state="up")
    set_mask(dp, 0xffff)                                      # stale: the watcher rewrites it
    watcher = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)

    def wait_mask(want, timeout=5.0):
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if dp.ports_down() == want:
                return time.monotonic()
            time.sleep(0.0005)
        raise AssertionError(f"mask {dp.ports_down():#x}, expected {want:#x}")

    try:
        wait_mask(0)
        with IPRoute() as ipr:
            idx = ipr.link_lookup(ifname="eth-p4-1")[0]
            t0 = time.monotonic()
            ipr.link("set", index=idx, state="down")
            took = wait_mask(1 << ports["eth-p4-1"]) - t0
            assert took < 0.5
            ipr.link("set", index=idx, state="up")
            wait_mask(0)
    finally:
        watcher.terminate()
        err = watcher.communicate(timeout=5)[1]
    assert "ports without carrier: eth-p4-1" in err


# ---- the probe echo (ports' TC ingress) --------------------------------------------------

def probe_frame(kind=None, magic=None, zero_checksum=True, port=None, plane=3, dst=LOOP_A):
    from rlbhost import probes
    body = struct.pack(probes.FMT, magic or probes.MAGIC, probes.PROBE if kind is None else kind,
                       plane, 7, 1234, 99, probes.NO_TAG)
    port = port or probes.PROBE_PORT
    return P.ipv6_frame(LOOP_B, dst, 17, P.udp6(LOOP_B, dst, port, port, body, zero_checksum=zero_checksum),
                        dmac="02:00:00:00:0a:01", smac="02:00:00:00:0b:02", hop_limit=63)


TC_ACT_UNSPEC = 2**32 - 1          # -1 as the test run's unsigned retval


def echo(dp, frame, port="eth-p3-1"):
    """The echo run on `frame` as it arrives by `port` (the test run's skb on that device)."""
    ctx = bytearray(44)
    struct.pack_into("<I", ctx, 40, dp.ifindex(port))       # struct __sk_buff's ifindex
    r = prog_test_run(dp.load()["rlb_host_echo"].fd, frame, ctx=bytes(ctx))
    return r.retval, r.data


@pytest.mark.parametrize("zero_checksum", [True, False])
def test_the_echo_answers_a_probe_back_to_its_sender_with_nothing_else_changed(dp, zero_checksum):
    from rlbhost import probes
    frame = probe_frame(zero_checksum=zero_checksum)
    rc, data = echo(dp, frame)
    assert rc == TC_ACT_REDIRECT
    got, sent = P.parse(data), P.parse(frame)
    assert (got.dmac, got.smac) == (sent.smac, sent.dmac)
    assert (got.src, got.dst) == (LOOP_A, LOOP_B)
    head = 14 + 40 + 8
    assert data[head:head + probes.SIZE] == struct.pack(probes.FMT, probes.MAGIC, probes.REPLY, 3, 7, 1234, 99,
                                                        probes.NO_TAG)
    assert data[14:14 + 8] == frame[14:14 + 8]                  # version, length, hop limit
    if zero_checksum:
        assert data[head - 2:head] == b"\0\0"
    else:
        assert data[head - 2:head] != b"\0\0" and P.udp_checksum_ok(data)


@pytest.mark.parametrize("case", ["answer", "magic", "port", "roce"])
def test_the_echo_leaves_everything_but_a_probe_alone(dp, case):
    from rlbhost import probes
    frame = {"answer": lambda: probe_frame(kind=probes.REPLY), "magic": lambda: probe_frame(magic=b"XXXX"),
             "port": lambda: probe_frame(port=probes.PROBE_PORT + 1),
             "roce": lambda: P.roce_frame(LOOP_B, LOOP_A, 50000, 1)}[case]()
    assert echo(dp, frame) == (TC_ACT_UNSPEC, frame)              # on to the hook's next filter


KEY = bytes.fromhex("000102030405060708090a0b0c0d0e0f")


@pytest.fixture
def signing(dp):
    dp.set_echo(LOOP_A, KEY)
    yield dp
    dp.maps["echo_cfg"].zero(0)


@pytest.mark.parametrize("zero_checksum", [True, False])
def test_a_signed_answer_carries_the_tag_the_prober_checks(signing, zero_checksum):
    """The echo signs its answer with the fabric's key over the probe (SipHash-2-4 in the
    kernel); the prober's check (Python) accepts exactly that tag, with this key or a second
    one it also holds, and nothing made without the key."""
    from rlbhost import probes
    rc, data = echo(signing, probe_frame(zero_checksum=zero_checksum))
    assert rc == TC_ACT_REDIRECT
    head = 14 + 40 + 8
    magic, kind, plane, sender, seq, t_ns, tag = struct.unpack(probes.FMT, data[head:head + probes.SIZE])
    assert (kind, plane, sender, seq, t_ns) == (probes.REPLY, 3, 7, 1234, 99) and tag != probes.NO_TAG
    assert data[head - 2:head] == b"\0\0"          # a zero UDP checksum, which the prober accepts
    prober = probes.Prober(7, LOOP_B, {1: LOOP_A}, probes.PROBE_PORT, dict, lambda *a: None,
                           keys=lambda peer: [bytes(16), KEY])
    assert prober.verify(LOOP_A, plane, seq, t_ns, tag)
    assert not prober.verify(LOOP_A, plane, seq + 1, t_ns, tag)        # another round
    assert not prober.verify(LOOP_A, 2, seq, t_ns, tag)                # another plane
    assert not prober.verify(LOOP_C, plane, seq, t_ns, tag)            # another GPU
    prober.keys = lambda peer: [bytes(16)]
    assert not prober.verify(LOOP_A, plane, seq, t_ns, tag)            # a key it does not hold


def test_hold_the_echo_signs_with_the_key_shared_with_the_prober(signing):
    """Keys per pair (rlbfabric host-keys): the answer to a prober with a key of its own is
    signed with that key alone, so a GPU that holds only its own pairs' keys (a leaked file) can
    answer only as itself; a prober without one gets the fabric-wide key. The prober checks
    with what it holds for the answering peer (KeyFile.to_check)."""
    import ipaddress
    from rlbhost import probes
    from rlbhost.probekeys import KeyFile
    pair_ab, pair_cb = bytes(range(16, 32)), bytes(range(32, 48))
    net = ipaddress.IPv6Network(f"{LOOP_B}/128")
    signing.set_echo(LOOP_A, KEY, [(net, pair_ab), (ipaddress.IPv6Network(f"{LOOP_C}/128"), pair_cb)])
    assert signing.status()["tables"]["echo_keys"][0] == 2
    head = 14 + 40 + 8

    def answered():
        rc, data = echo(signing, probe_frame())
        assert rc == TC_ACT_REDIRECT
        return struct.unpack(probes.FMT, data[head:head + probes.SIZE])[3:]

    sender, seq, t_ns, tag = answered()
    b_holds = KeyFile(None)
    b_holds.pairs = [(ipaddress.IPv6Network(f"{LOOP_A}/128"), pair_ab)]
    b_holds._by_net, b_holds._lengths = {b_holds.pairs[0][0]: [pair_ab]}, [128]
    prober = probes.Prober(7, LOOP_B, {1: LOOP_A}, probes.PROBE_PORT, dict, lambda *a: None, keys=b_holds.to_check)
    assert prober.verify(LOOP_A, 3, seq, t_ns, tag)
    prober.keys = lambda peer: [KEY, pair_cb]          # the fabric-wide key or another pair's: no
    assert not prober.verify(LOOP_A, 3, seq, t_ns, tag)
    # the pair's entry removed (and only the entries that differ rewritten): the fabric-wide key
    signing.set_echo(LOOP_A, KEY, [(ipaddress.IPv6Network(f"{LOOP_C}/128"), pair_cb)])
    assert [k.prefixlen for k in signing.maps["echo_keys"].keys()] == [128]
    sender, seq, t_ns, tag = answered()
    prober.keys = lambda peer: [KEY]
    assert prober.verify(LOOP_A, 3, seq, t_ns, tag)
    prober.keys = lambda peer: None                    # a peer this host has no key for: refused
    assert not prober.verify(LOOP_A, 3, seq, t_ns, tag)
    signing.set_echo(LOOP_A, KEY)
    assert not list(signing.maps["echo_keys"].keys())


def test_hold_the_echo_answers_for_the_plane_of_the_port_the_probe_came_in_by(signing):
    """A probe that says plane 3 but arrives by a plane-2 port (a miscabled or misrouted link)
    is answered for plane 2, signed so: the prober never counts it for plane 3. One arriving by
    a port that is no path is not answered."""
    from rlbhost import probes
    rc, data = echo(signing, probe_frame(plane=3), port="eth-p2-2")
    assert rc == TC_ACT_REDIRECT
    head = 14 + 40 + 8
    magic, kind, plane, sender, seq, t_ns, tag = struct.unpack(probes.FMT, data[head:head + probes.SIZE])
    assert (kind, plane) == (probes.REPLY, 2)
    prober = probes.Prober(7, LOOP_B, {1: LOOP_A}, probes.PROBE_PORT, dict, lambda *a: None, keys=lambda peer: [KEY])
    assert prober.verify(LOOP_A, 2, seq, t_ns, tag) and not prober.verify(LOOP_A, 3, seq, t_ns, tag)
    frame = probe_frame(plane=3)
    assert echo(signing, frame, port="rlb0") == (TC_ACT_UNSPEC, frame)


def test_the_echo_answers_only_probes_for_its_own_gpu(signing):
    """Misdelivered traffic must not look healthy: a probe for another GPU goes on untouched."""
    frame = probe_frame(dst=LOOP_C)
    assert echo(signing, frame) == (TC_ACT_UNSPEC, frame)
    assert echo(signing, probe_frame())[0] == TC_ACT_REDIRECT


def test_spoofed_stale_and_replayed_answers_never_keep_a_plane_up():
    """One forged answer with a huge sequence number used to keep a dead plane up for good: now
    an answer counts only with a valid tag, for a round probed recently, once."""
    import socket
    from rlbhost import probes
    from rlbcommon.siphash import siphash24
    prober = probes.Prober(7, LOOP_B, {1: LOOP_A}, probes.PROBE_PORT, lambda: {3: [("x", "m", "m")]},
                           lambda *a: None, keys=lambda peer: [KEY])
    prober._send = lambda *a: True       # the frame "left": sockets are not the point here
    prober._round(0.0)
    st = prober.state[(1, 3)]
    seq = prober._seq

    def answer(seq, tag=None, t_ns=5):
        msg = (struct.pack("!IQ", seq, t_ns) + struct.pack("!BH", 3, 7) + b"\0"
               + socket.inet_pton(socket.AF_INET6, LOOP_A) + socket.inet_pton(socket.AF_INET6, LOOP_B))
        tag = siphash24(KEY, msg).to_bytes(8, "little") if tag is None else tag
        return struct.pack(probes.FMT, probes.MAGIC, probes.REPLY, 3, 7, seq, t_ns, tag)

    class Rx:
        def __init__(self, frames):
            self.frames = list(frames)

        def recvmsg(self, n, ancillary):
            if not self.frames:
                raise BlockingIOError
            return self.frames.pop(0), [], 0, (LOOP_A, 0, 0, 0)

    prober._receive(Rx([answer(10**9, tag=b"\1" * 8), answer(10**9), answer(seq, tag=b"\2" * 8)]))
    assert st.answered == 0 and prober.rejected == {"tag": 2, "stale": 1, "unknown": 0, "overflow": 0}
    prober._receive(Rx([answer(seq), answer(seq)]))                # the real one, then its replay
    assert st.answered == 1 and prober.rejected["stale"] == 2


def test_the_echo_is_on_every_port_and_leaves_with_the_device(host):
    """attach_ports puts the echo on each port's ingress; `run` still finds the one device
    with the programs; detaching the device takes the echo off the ports too."""
    def echo_on():
        with IPRoute() as ipr:
            return sorted(n for n in PORTS.values()
                          if any((f.get_attr("TCA_OPTIONS").get_attr("TCA_BPF_NAME") or "") == "rlb_host_echo"
                                 for f in ipr.get_filters(ipr.link_lookup(ifname=n)[0], parent=0xFFFFFFF2)
                                 if f.get_attr("TCA_OPTIONS") is not None))
    assert echo_on() == sorted(PORTS.values())
    assert host.attached_interfaces() == ["rlb0"]
    assert sorted(host.attached_interfaces(echo=True)) == sorted(["rlb0", *PORTS.values()])
    try:
        host.detach("rlb0")
        assert echo_on() == [] and host.attached_interfaces(echo=True) == []
    finally:
        host.attach_ports("rlb0", LOOP_A, port_paths(), group_size=SUBS, echo=True)
    assert echo_on() == sorted(PORTS.values())
