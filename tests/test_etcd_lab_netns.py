"""The coordinator on etcd, end to end (issue 31): `rlblab up --etcd` — an etcd member in the lab's
management namespace, an etcd user per host, leaf and coordinator, two `rlbcoord --etcd` of which
one leads, `rlbhost --etcd` on every host and `rlbswitch --etcd` on the leaves. Balance through
etcd, a forged report refused by etcd, the leader killed mid-collective, etcd itself killed."""
from __future__ import annotations

import json
import random
import threading
import time
from pathlib import Path

import pytest

from rlbcommon import health, netns
from rlbcommon import packets as P
from rlbcommon.etcd import PERMISSION_DENIED, Etcd, EtcdError
from rlbfabric import workloads
from rlbcoord import etcdauth, keys
from rlbhost.runfiles import health_file
from rlbhost.dataplane import HostDataplane
from rlblab.matrix import FORGET_S, run_matrix
from rlblab.traffic import Capture, QpReceiver, QpSender

from .conftest import fabric_lab, h1_to_h3_during

pytestmark = pytest.mark.netns
LAB = Path(__file__).resolve().parent.parent / "lab"


@pytest.fixture(scope="module")
def lab():
    with fabric_lab(LAB / "fabric.toml", "rlbet", etcd=True) as lab:
        yield lab


def as_user(lab, user: str) -> Etcd:
    return lab.etcd_client(user)


def in_model(lab, host: str) -> int:
    """How many of the host's QPs the leading coordinator's model holds."""
    return lab.coordinator_status()["hosts"].get(host, {}).get("qps", 0)


def in_etcd(lab, host: str) -> tuple[dict, dict]:
    """The host's QPs and the placements written for them, as etcd holds them ({QpId: ...})."""
    admin = as_user(lab, etcdauth.ROOT_USER)
    qp_at, placed_at = keys.qps_prefix(host), keys.placements_prefix(host)
    with netns.inside(lab.ns("mon")):
        qps, placed = admin.get_prefix(qp_at)[0], admin.get_prefix(placed_at)[0]
    return ({q: v for kv in qps for q, v in keys.read_qps(kv.key[len(qp_at):], kv.value).items()},
            {q: v for kv in placed for q, v in keys.read_placements(kv.key[len(placed_at):], kv.value).items()})


def placements(lab, host: str) -> dict:
    with netns.inside(lab.ns(host)):
        dp = HostDataplane(lab.ns(host))
        try:
            return dp.placements()
        finally:
            dp.close()


@pytest.mark.parametrize("kind, per_conn", [("pairs", 2), ("all-to-all", 1), ("ring", 3)])
def test_placements_through_etcd_reach_the_best(lab, kind, per_conn):
    conns = workloads.connections(kind, lab.hosts, random.Random(per_conn))
    r = run_matrix(lab, conns, per_conn, packets=150, seed=40 + per_conn, bursts=2)
    time.sleep(FORGET_S)
    best, got = r.best(lab.fabric), r.figures(1)
    print(f"\n{kind} x{per_conn}: best {best}, local {r.figures(0)}, through etcd {got}, "
          f"placed after {r.placed_after_s} s")
    assert got[0] <= best[0] + 0.05 and got[1] <= best[1] + 0.05, (got, best)
    assert r.placed_after_s is not None and r.placed_after_s < 0.5, (r.placed_after_s, r.unplaced)


def test_a_forged_report_and_a_forged_link_report_are_refused_by_etcd(lab):
    """h2's credentials cannot write h1's QPs; l2's cannot say l1's uplinks are down."""
    with netns.inside(lab.ns("mon")):
        h2, l2 = as_user(lab, keys.host_user("h2")), as_user(lab, keys.switch_user("l2"))
        for call in (lambda: h2.put(keys.qp_part_key("h1", "part0"), json.dumps({"fc00::1_1_1": {"path": 1, "active": True}})),
                     lambda: h2.delete_prefix(keys.host_prefix("h1")),
                     lambda: l2.put(keys.uplinks_key("l1"), json.dumps({"eth-s1": False})),
                     lambda: h2.put(keys.placement_key("h2", "part0"), '{"fc00::1_1_1":1}')):
            with pytest.raises(EtcdError) as e:
                call()
            assert e.value.code == PERMISSION_DENIED
        assert lab.coordinator_status()["dead_links"] == []


def test_the_leader_killed_mid_collective_a_standby_leads_nothing_moves_nothing_lost(lab):
    """4 QPs h1 -> h3 at 2000 packets/s for 4 s; the leading coordinator is killed (SIGKILL) once
    they are placed. The standby leads within 2 s, not one placement changes, every packet
    arrives; then it places new QPs."""
    seen = {}

    def kill_the_leader():
        seen["before"] = placements(lab, "h1")
        seen["leader"] = lab.leading_coordinator()
        t0 = time.monotonic()
        lab.kill_agent(seen["leader"])
        while lab.leading_coordinator() is None and time.monotonic() - t0 < 10:
            time.sleep(0.02)
        seen["took"] = time.monotonic() - t0
        seen["new"] = lab.leading_coordinator()

    try:
        sent, received, _ = h1_to_h3_during(lab, 2000, 2000, kill_the_leader, seed=77, payload_len=256, lead_s=0.8)
        time.sleep(0.5)
        after = placements(lab, "h1")
        print(f"\n{seen['leader']} killed: {seen['new']} leads after {seen['took']:.2f} s; "
              f"{received}/{sent} packets arrived; placements {len(seen['before'])} -> {len(after)}")
        assert len(seen["before"]) == 4 and after == seen["before"]
        assert seen["new"] not in (None, seen["leader"]) and seen["took"] < 2.0
        assert sent == 8000 and received == 8000
        time.sleep(FORGET_S)
        r = run_matrix(lab, [("h2", "h4")], 4, packets=100, seed=78, bursts=2)
        assert r.placed_after_s is not None and r.placed_after_s < 0.5, r.unplaced
        assert r.figures(1)[0] <= r.best(lab.fabric)[0] + 0.05
    finally:
        lab.start_coordinator(seen.get("leader", "").split("-", 1)[-1] or None)
        time.sleep(FORGET_S)


def test_etcd_killed_and_restarted_loses_nothing_and_placements_resume(lab):
    """etcd dies under a stream: forwarding never waits on it (0 lost), the hosts keep their
    placements, then decide locally; etcd back, new QPs are placed through it again."""
    seen = {}

    def kill_etcd():
        seen["before"] = placements(lab, "h1")
        lab.kill_agent("etcd")

    sent, received, _ = h1_to_h3_during(lab, 2000, 2000, kill_etcd, seed=88, payload_len=256, lead_s=0.8)
    assert len(seen["before"]) == 4 and sent == 8000 and received == 8000
    with netns.inside(lab.ns("mon")):
        lab.etcd_server.start()
        lab.agents["etcd"] = lab.etcd_server.proc
    time.sleep(FORGET_S)
    r = run_matrix(lab, [("h1", "h3"), ("h2", "h4")], 2, packets=100, seed=89, bursts=2)
    print(f"\netcd back: placed after {r.placed_after_s} s, {r.figures(1)}")
    assert r.placed_after_s is not None and r.placed_after_s < 1.0, r.unplaced
    assert r.figures(1)[0] <= r.best(lab.fabric)[0] + 0.05
    # the host's watch and lease are loops of its agent: they beat through etcd's absence (each
    # wait a round) and after it, and none was taken for hung
    loops = health.read(health_file(lab.ns("h1")))
    assert {"etcd-lease", "placements"} <= set(loops), sorted(loops)
    assert not [n for n, e in loops.items() if e["last_error"] == "hung"], loops
    assert all(time.time() - loops[n]["last_ok"] < 10 for n in ("etcd-lease", "placements")), loops


def test_a_host_agent_killed_its_lease_ends_its_qps_leave_and_come_back_with_it(lab):
    """h1's agent SIGKILLed during a stream of 4 QPs: forwarding goes on from the pinned maps (no
    packet lost); its lease (3 s) ends, so its keys go, its QPs leave the leader's model and their
    placements are deleted; started again, it writes them under a new lease and they are placed."""
    seen = {}

    def h1_keys():
        qps, placed = in_etcd(lab, "h1")
        return len(qps), len(placed)

    def restart_h1():
        lab.wait_for(lambda: h1_keys() == (4, 4) and in_model(lab, "h1") == 4, 5, "h1's 4 QPs placed")
        lab.kill_agent("h1")
        t0 = time.monotonic()
        lab.wait_for(lambda: h1_keys() == (0, 0) and in_model(lab, "h1") == 0, 8, "h1's keys to end with its lease")
        seen["gone_after"] = time.monotonic() - t0
        lab.start_host_agent("h1")
        t1 = time.monotonic()
        lab.wait_for(lambda: h1_keys() == (4, 4) and in_model(lab, "h1") == 4, 10, "h1's QPs back in etcd and placed")
        seen["back_after"] = time.monotonic() - t1

    sent, received, _ = h1_to_h3_during(lab, 4000, 1000, restart_h1, seed=91, payload_len=256, lead_s=1.0)
    print(f"\nh1's agent killed: its keys gone after {seen['gone_after']:.1f} s (lease 3 s); started "
          f"again: back and placed after {seen['back_after']:.1f} s; {received}/{sent} packets")
    assert sent == 16000 and received == 16000
    assert seen["gone_after"] <= 3.0 + 1.5                        # the lease's TTL, and etcd's check


def test_a_host_and_its_leaf_upgraded_under_traffic_move_no_qp_and_lose_nothing(lab):
    """The upgrade of docs/operations.md, as the VM lab does it with Soft-RoCE: h1's and l1's
    agents stopped as systemd stops them (SIGTERM) under 8 QPs from h1's own stack to h3, down
    past h1's lease (its QPs leave the leader's model), then started again (new programs replace
    the old ones on the same pinned maps). On h1's wire each QP keeps the one path it had; at h3
    every packet of every QP arrives, in PSN order; h1's QPs are in the model again, placed
    where they are."""
    h1 = lab.host_addresses("h1")
    paths = {addr: value for value, addr in h1.items()}
    sender = QpSender(lab.ns("h1"), h1[1], lab.host_addresses("h3")[1], 8, base_sport=55000, seed=7)
    rx, cap = QpReceiver(lab.ns("h3")), Capture(lab.ns("h1"), "eth0")
    stop, out, seen = threading.Event(), {}, {}
    stream = threading.Thread(target=lambda: out.setdefault("sent", sender.send_until(stop, 2000, 128)))
    stream.start()
    try:
        lab.wait_for(lambda: in_model(lab, "h1") >= 8, 10, "h1's 8 QPs in the leader's model")
        for agent in ("h1", "l1"):
            lab.stop_agent(agent)
        t0 = time.monotonic()
        lab.wait_for(lambda: in_model(lab, "h1") == 0 and in_etcd(lab, "h1") == ({}, {}), 8,
                     "h1's QPs to leave the model and etcd with its lease")
        seen["gone_after"] = time.monotonic() - t0
        lab.start_agent("l1")
        lab.start_host_agent("h1")
        lab.wait_for(lambda: in_model(lab, "h1") >= 8 and len(in_etcd(lab, "h1")[1]) >= 8, 10,
                     "h1's QPs back in the model and placed")
        seen["down_s"] = time.monotonic() - t0
        seen["placed"] = {qp: path for (_, _, qp), path in in_etcd(lab, "h1")[1].items()}
        time.sleep(0.5)
    finally:
        stop.set()
        stream.join()
        time.sleep(0.3)
        frames = cap.close()
        rx.close()
        sender.close()
    on_wire: dict[int, set[int]] = {}
    for f in frames:
        p = P.parse(f)
        if p.dport == P.ROCE_PORT and p.src in paths:
            on_wire.setdefault(p.qp, set()).add(paths[p.src])
    rounds = out["sent"] // 8
    print(f"\nh1 and l1 stopped: h1's QPs left the model after {seen['gone_after']:.1f} s, back after "
          f"{seen['down_s']:.1f} s; {len(rx.seen)}/{out['sent']} packets; paths on the wire "
          f"{sorted(sorted(v) for v in on_wire.values())}")
    assert sorted(on_wire) == sorted(sender.qps) and all(len(v) == 1 for v in on_wire.values()), on_wire
    assert seen["placed"] == {qp: min(v) for qp, v in on_wire.items()}     # placed again where they are
    not_all_in_order = [qp for qp in sender.qps if rx.psns.get(qp) != list(range(rounds))]
    assert rounds >= 1000 and not not_all_in_order, not_all_in_order
