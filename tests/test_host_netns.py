"""rlbhost end to end: real SLAAC from a router's RAs, a UDP application sending RoCEv2-like
QPs, a capture on the router, and the receiving application's view."""
from __future__ import annotations

import time
from pathlib import Path

import pytest

from rlbfabric import addrplan
from rlbcommon import packets as P
from rlbcommon.netns import run
from rlblab import topo
from rlblab.hostlab import HostLab
from rlblab.traffic import Capture, QpReceiver, QpSender

pytestmark = pytest.mark.netns


@pytest.fixture(scope="module")
def lab():
    lab = HostLab("rlbhn")
    try:
        lab.up()
        lab.start_agent(1)
        lab.start_agent(2)
        yield lab
    finally:
        lab.down()
    assert not [ns for ns in topo.list_ns() if ns.startswith("rlbhn-")]


def csum_errors(ns: str) -> int:
    for line in run(ns, "cat", "/proc/net/snmp6").splitlines():
        if line.startswith("Udp6InCsumErrors"):
            return int(line.split()[1])
    return 0


def exchange(lab, n_qps: int, packets: int, sender: QpSender | None = None):
    """Send from h1's base address to h2's; returns (sender, frames on the router, received)."""
    rx = QpReceiver(lab.h[2])
    cap = Capture(lab.r, "eth-h1")
    own = sender is None
    sender = sender or QpSender(lab.h[1], lab.base(1), lab.base(2), n_qps)
    try:
        sent = sender.send(packets)
        time.sleep(0.3)
    finally:
        frames = cap.close()
        rx.close()
        if own:
            sender.close()
    roce = [P.parse(f) for f in frames if len(f) >= 74 and P.parse(f).dport == P.ROCE_PORT]
    assert sent == n_qps * packets
    return roce, rx.seen


def path_per_qp(frames) -> dict[int, set[int]]:
    out: dict[int, set[int]] = {}
    for p in frames:
        out.setdefault(p.qp, set()).add(addrplan.field_value(p.src, 3))
    return out


def test_each_qp_on_its_own_path_and_the_receiver_sees_base_addresses(lab):
    errors = csum_errors(lab.h[2])
    frames, seen = exchange(lab, 4, 100)
    a, b = lab.addresses(1), lab.addresses(2)
    # on the wire: four distinct path address pairs, one per QP, each QP on one path only
    pairs = {(p.src, p.dst) for p in frames}
    assert pairs == {(a[k], b[k]) for k in range(1, 5)}
    per_qp = path_per_qp(frames)
    assert len(per_qp) == 4 and sorted(min(v) for v in per_qp.values()) == [1, 2, 3, 4]
    assert all(len(v) == 1 for v in per_qp.values())
    # the application: every datagram, only base addresses, checksums good
    assert len(seen) == 400
    assert {(s, d) for s, d, _ in seen} == {(a[1], b[1])}
    assert csum_errors(lab.h[2]) == errors


def test_eight_qps_two_per_path(lab):
    frames, seen = exchange(lab, 8, 50)
    per_path = {}
    for qp, ks in path_per_qp(frames).items():
        per_path[min(ks)] = per_path.get(min(ks), 0) + 1
    assert per_path == {1: 2, 2: 2, 3: 2, 4: 2}
    assert len(seen) == 400


def test_weight_drop_moves_only_the_degraded_paths_qps(lab):
    sender = QpSender(lab.h[1], lab.base(1), lab.base(2), 8, base_sport=52000)
    lab.cli(1, "config", "--expiry-ms", "10000")   # QPs stay active across the change
    try:
        before = path_per_qp(exchange(lab, 8, 20, sender)[0])
        lab.cli(1, "weights", "set", "4=0")
        after = path_per_qp(exchange(lab, 8, 20, sender)[0])
        assert all(4 not in ks for ks in after.values())
        assert all(after[q] == before[q] for q in before if 4 not in before[q])
        lab.cli(1, "weights", "set", "4=1")
        back = path_per_qp(exchange(lab, 8, 20, sender)[0])
        assert sorted(min(v) for v in back.values()) == [1, 1, 2, 2, 3, 3, 4, 4]
    finally:
        sender.close()
        lab.cli(1, "weights", "set", "4=1")
        lab.cli(1, "config", "--expiry-ms", "200")


def test_restarted_agent_keeps_qps_on_their_paths(lab):
    sender = QpSender(lab.h[1], lab.base(1), lab.base(2), 4, base_sport=53000)
    try:
        lab.cli(1, "config", "--expiry-ms", "5000")
        before = path_per_qp(exchange(lab, 4, 20, sender)[0])
        lab.kill_agent(1)
        during = exchange(lab, 4, 20, sender)
        assert path_per_qp(during[0]) == before and len(during[1]) == 80   # programs stay
        lab.start_agent(1)
        after = exchange(lab, 4, 20, sender)
        assert path_per_qp(after[0]) == before and len(after[1]) == 80     # state adopted
    finally:
        sender.close()
        lab.cli(1, "config", "--expiry-ms", "200")


def test_host_hold_a_hung_loop_restarts_the_agent_in_place_and_no_packet_is_lost(lab):
    """h1's sweep loop is made to hang 2 s after start (a failpoint: as a lock never released
    would); with --hang-s 3 the watchdog finds it, logs it and the agent starts afresh in place
    (the same pid, exec), adopts its state and sweeps again; QPs sent all along keep their paths
    and lose nothing."""
    log = lab.work / "agent-h1.log"
    sender = QpSender(lab.h[1], lab.base(1), lab.base(2), 4, base_sport=53500)
    try:
        lab.cli(1, "config", "--expiry-ms", "10000")
        before = path_per_qp(exchange(lab, 4, 20, sender)[0])
        lab.kill_agent(1)
        start = log.stat().st_size
        lab.start_agent(1, "--hang-s", "3", env={"RLB_FAILPOINTS": "sweep=hang@2"})
        pid = lab.agents[1].pid
        deadline, rounds = time.time() + 60, 0
        while "started afresh after a hung loop" not in log.read_text()[start:]:
            assert time.time() < deadline, log.read_text()[start:][-2000:]
            frames, seen = exchange(lab, 4, 10, sender)          # traffic all along: nothing lost
            assert path_per_qp(frames) == before and len(seen) == 40
            rounds += 1
        text = log.read_text()[start:]
        assert "loop sweep has not finished a round" in text and rounds >= 2
        assert lab.agents[1].poll() is None and lab.agents[1].pid == pid       # in place
        env = (Path(f"/proc/{pid}/environ").read_bytes()).split(b"\0")
        assert b"RLB_HANG_RESTARTS=1" in env and not any(e.startswith(b"RLB_FAILPOINTS=") for e in env)
        deadline = time.time() + 30                               # it runs its loops again
        fresh = start + text.index("started afresh after a hung loop")
        while "following addresses" not in log.read_text()[fresh:]:
            assert time.time() < deadline
            time.sleep(0.2)
        after = exchange(lab, 4, 20, sender)
        assert path_per_qp(after[0]) == before and len(after[1]) == 80
    finally:
        sender.close()
        lab.kill_agent(1)
        lab.start_agent(1)
        lab.cli(1, "config", "--expiry-ms", "200")


def test_peer_without_rlbhost_answers_on_path_addresses(lab):
    lab.detach(2)
    try:
        frames, seen = exchange(lab, 4, 25)
        a, b = lab.addresses(1), lab.addresses(2)
        assert len(seen) == 100                                  # nothing lost
        assert {(s, d) for s, d, _ in seen} == {(a[k], b[k]) for k in range(1, 5)}
    finally:
        lab.start_agent(2)


def test_agent_follows_address_changes(lab):
    """A path whose address goes away is dropped and its QPs move; it comes back with it."""
    lab.cli(1, "config", "--expiry-ms", "10000")
    a4 = lab.addresses(1)[4]
    sender = QpSender(lab.h[1], lab.base(1), lab.base(2), 4, base_sport=54000)
    try:
        before = path_per_qp(exchange(lab, 4, 10, sender)[0])
        # the router keeps advertising the prefix: without this the next RA (3-4 s) brings the
        # address back mid-test and the QPs may return to path 4
        topo.sysctl(lab.h[1], "net.ipv6.conf.eth0.accept_ra", "0")
        run(lab.h[1], "ip", "addr", "del", f"{a4}/64", "dev", "eth0")
        deadline = time.time() + 5
        while time.time() < deadline and "(gone)" not in lab.cli(1, "status"):
            time.sleep(0.05)
        frames, seen = exchange(lab, 4, 10, sender)
        after = path_per_qp(frames)
        assert all(4 not in v for v in after.values()) and len(seen) == 40
        assert all(after[q] == before[q] for q in before if 4 not in before[q])
    finally:
        sender.close()
        topo.sysctl(lab.h[1], "net.ipv6.conf.eth0.accept_ra", "1")
        run(lab.h[1], "ip", "addr", "add", f"{a4}/64", "dev", "eth0", check=False)
        lab.cli(1, "config", "--expiry-ms", "200")
    deadline = time.time() + 5
    while time.time() < deadline and "(gone)" in lab.cli(1, "status"):
        time.sleep(0.05)
    assert "(gone)" not in lab.cli(1, "status")


def test_metrics_on_loopback(lab):
    import urllib.request
    from rlbcommon import netns
    exchange(lab, 4, 5)
    with netns.inside(lab.h[1]):
        body = urllib.request.urlopen("http://127.0.0.1:9472/metrics", timeout=5).read().decode()
    tx = [line for line in body.splitlines() if line.startswith("rlb_host_path_tx_packets_total")]
    assert len(tx) == 4 and all(float(line.split()[-1]) > 0 for line in tx)
    assert 'rlb_host_packets_total{nic="",node="rlbhn-h1",reason="rewritten"}' in body
    fill = {line.split('table="')[1].split('"')[0]: float(line.split()[-1]) for line in body.splitlines()
            if line.startswith("rlb_host_table_entries{")}
    assert set(fill) == {"conntrack", "weights", "placements", "verbs", "echo_keys"}   # (the QPs may be swept by now)
    assert fill["echo_keys"] == 0          # a host of a leaf-spine fabric answers no plane probes
    assert 'rlb_host_table_capacity{nic="",node="rlbhn-h1",table="conntrack"} 65536.0' in body
    assert 'rlb_host_table_capacity{nic="",node="rlbhn-h1",table="verbs"} 131072.0' in body
