"""Shards of placement end to end: `rlblab up --fabric lab/fabric-4x4.toml --coord-shards 2` — an
etcd member in the lab's management namespace, four `rlbcoord --etcd --shard K/2` (two a shard),
real `rlbhost --etcd` agents and leaves. Traffic matrices across the whole fabric are placed by
both shards together as by one coordinator; killing one shard's leader leaves the other's alone."""
from __future__ import annotations

import random
import time
from pathlib import Path

import pytest

from rlbfabric import workloads
from rlblab.matrix import FORGET_S, run_matrix

from .conftest import fabric_lab, h1_to_h3_during, local_rule_off_the_best
from .test_etcd_lab_netns import placements

pytestmark = pytest.mark.netns
LAB = Path(__file__).resolve().parent.parent / "lab"


@pytest.fixture(scope="module")
def lab():
    with fabric_lab(LAB / "fabric-4x4.toml", "rlbsh", etcd=True, shards=2) as lab:
        yield lab


def leaders(lab) -> dict[str, str]:
    """{shard: the coordinator leading it}."""
    return {str(lab.shard_of(k.split("-", 1)[1])): k for k in lab.leading_coordinators()}


def test_each_shard_has_a_leader_placing_only_its_leaves_hosts(lab):
    got = leaders(lab)
    assert sorted(got) == ["1/2", "2/2"], got
    conns = workloads.connections("all-to-all", lab.hosts, random.Random(5))
    run_matrix(lab, conns, 1, packets=80, seed=5, bursts=2)
    for shard, key in got.items():
        s = lab.coordinator_status(key)
        mine = {h for lf in lab.fabric.leaves[int(shard[0]) - 1::2] for h in lf.hosts}
        assert set(s["hosts"]) == mine, (shard, sorted(s["hosts"]))
    time.sleep(FORGET_S)


@pytest.mark.parametrize("kind, per_conn", [("all-to-all", 1), ("ring", 3), ("permutation", 4)])
def test_two_shards_reach_the_best_as_one_coordinator_does(lab, kind, per_conn):
    conns = workloads.connections(kind, lab.hosts, random.Random(per_conn))
    r = run_matrix(lab, conns, per_conn, packets=150, seed=60 + per_conn, bursts=2)
    time.sleep(FORGET_S)
    best, got = r.best(lab.fabric), r.figures(1)
    print(f"\n{kind} x{per_conn}, 2 shards: best {best}, local {r.figures(0)}, placed {got}, "
          f"placed after {r.placed_after_s} s")
    assert got[0] <= best[0] + 0.05 and got[1] <= best[1] + 0.05, (got, best)
    assert r.placed_after_s is not None and r.placed_after_s < 0.5, (r.placed_after_s, r.unplaced)


def test_two_shards_fix_what_the_local_rule_cannot(lab):
    """A permutation where the hosts alone collide on a downlink (the local rule's model, as
    test_balance_netns finds it): the shards' leaders bring it to the best."""
    fab = lab.fabric
    seed, conns = local_rule_off_the_best(fab)
    r = run_matrix(lab, conns, 1, packets=150, seed=seed, bursts=2)
    time.sleep(FORGET_S)
    best = r.best(fab)
    print(f"\npermutation (seed {seed}), 2 shards: best {best}, local {r.figures(0)}, placed {r.figures(1)}")
    assert max(r.figures(0)) >= max(best) + 0.8
    assert r.figures(1)[0] <= best[0] + 0.05 and r.figures(1)[1] <= best[1] + 0.05


def test_one_shards_leader_killed_mid_stream_its_standby_leads_nothing_moves_nothing_lost(lab):
    """4 QPs h1 -> h3 (h1 is shard 1's) at 2000 packets/s; shard 1's leader is SIGKILLed once they
    are placed: its standby leads within 2 s, not one placement changes, every packet arrives,
    shard 2's leader never notices; then the shards place together again."""
    before = leaders(lab)
    other = lab.coordinator_status(before["2/2"])["etcd"]["counters"]["takeovers"]
    seen = {}

    def kill_shard_1s_leader():
        seen["placed"] = placements(lab, "h1")
        t0 = time.monotonic()
        lab.kill_agent(before["1/2"])
        while "1/2" not in leaders(lab) and time.monotonic() - t0 < 10:
            time.sleep(0.02)
        seen["took"] = time.monotonic() - t0

    try:
        sent, received, _ = h1_to_h3_during(lab, 2000, 2000, kill_shard_1s_leader, seed=87, payload_len=256,
                                            lead_s=0.8)
        time.sleep(0.5)
        after = leaders(lab)
        print(f"\nshard 1's leader {before['1/2']} killed: {after.get('1/2')} leads after {seen['took']:.2f} s; "
              f"{received}/{sent} packets arrived")
        assert len(seen["placed"]) == 4 and placements(lab, "h1") == seen["placed"]
        assert after.get("1/2") not in (None, before["1/2"]) and seen["took"] < 2.0, (after, seen)
        assert sent == 8000 and received == 8000
        assert after["2/2"] == before["2/2"]
        assert lab.coordinator_status(after["2/2"])["etcd"]["counters"]["takeovers"] == other
        time.sleep(FORGET_S)
        conns = workloads.connections("ring", lab.hosts, random.Random(9))
        r = run_matrix(lab, conns, 2, packets=150, seed=99, bursts=2)
        best, got = r.best(lab.fabric), r.figures(1)
        assert got[0] <= best[0] + 0.05 and got[1] <= best[1] + 0.05, (got, best)
    finally:
        lab.start_coordinator(before["1/2"].split("-", 1)[1])     # back, as its unit would restart it
        time.sleep(FORGET_S)
