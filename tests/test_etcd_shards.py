"""Placement split over shards (rlbcoord run --etcd --shard K/N) on a real etcd with
authentication on, each coordinator an `rlbcoord run` process: hosts of both shards send QPs into
one leaf, whose downlinks both shards load; together they place them as one coordinator would
(every downlink its share), a shard's dead leader is replaced by its standby without moving a QP
and without the other shard noticing, and a coordinator started with another shard count never
leads beside them."""
from __future__ import annotations

import json
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from rlbcoord import etcdauth, keys
from rlbdeploy.units import Coordination, coordinator_unit
from rlbfabric.fabric import FabricError, load

from .test_etcd_coordination import Coord, etcd_metrics, etcd_with_users, qp_parts, user, wait
from .test_etcd_identity import free_port

FABRIC_FILE = Path(__file__).resolve().parent.parent / "lab" / "fabric-4x4.toml"
FABRIC = load(FABRIC_FILE)
# 4 leaves dealt to 2 shards: 1 has l1 and l3 (h1, h2, h5, h6), 2 has l2 and l4 (h3, h4, h7, h8).
# Into l1: h5 (shard 1) 6 QPs, h3 and h7 (shard 2) 3 each: 12 over 4 downlinks, 3 on each at
# best; each shard's 6 alone would be 2, 2, 1, 1, and blind to the other's on the same two.
INTO_L1 = {"h5": ("h1", 6), "h3": ("h2", 3), "h7": ("h1", 3)}


@pytest.fixture(scope="module")
def etcd(tmp_path_factory):
    yield from etcd_with_users(FABRIC, tmp_path_factory)


def addr(host: str, k: int = 1) -> str:
    leaf, port = FABRIC.leaf_of_host(host)
    return str(FABRIC.host_prefixes(leaf, port)[k - 1].network_address + 1)


def write_host(etcd, host: str, qps: dict) -> int:
    """A host's report and QPs ({(peer host, sport, qp): path}) as rlbhost --etcd writes them."""
    client = user(etcd, keys.host_user(host))
    lease = client.lease_grant(30)
    puts = {keys.report_key(host): json.dumps({
        "paths": {str(k): addr(host, k) for k in range(1, FABRIC.paths + 1)},
        "weights": [{"prefix": "::/0", "weights": {str(k): 1 for k in range(1, FABRIC.paths + 1)}}]})}
    puts.update(qp_parts(host, {(addr(peer), sport, qp): {"path": path, "active": True}
                                for (peer, sport, qp), path in qps.items()}))
    client.apply(puts, lease=lease)
    return lease


def placed(etcd) -> dict:
    """{(host, QP): (path, revision)} of every placement key, read as root."""
    admin = user(etcd, etcdauth.ROOT_USER)
    kvs, _ = admin.get_prefix(keys.placements_root())
    out = {}
    for kv in kvs:
        _, host, part = keys.split(kv.key)
        for q, p in keys.read_placements(part, kv.value).items():
            out[(host, q)] = (p, kv.mod_revision)
    return out


def into_l1(got: dict) -> list[int]:
    """QPs per path (spine) on the downlinks into l1, of the placements `got`."""
    on_l1 = {addr(h) for h in FABRIC.leaves[0].hosts}
    n = Counter(p for (_, q), (p, _) in got.items() if q[0] in on_l1)
    return [n[k] for k in range(1, FABRIC.paths + 1)]


def status(c: Coord) -> dict:
    s = c.status()
    return s["etcd"] if s else {}


@pytest.fixture
def shard_coords(etcd, tmp_path):
    admin = user(etcd, etcdauth.ROOT_USER)
    admin.delete_prefix(keys.ROOT)
    started = {name: Coord(etcd, name, tmp_path, FABRIC_FILE, ("--shard", shard))
               for name, shard in (("a1", "1/2"), ("b1", "1/2"), ("a2", "2/2"))}
    try:
        wait(lambda: sum(status(c).get("leading", False) for c in started.values()) == 2, 20,
             "a leader in each shard")
        yield started
    finally:
        for c in started.values():
            c.kill()
        admin.delete_prefix(keys.ROOT)


def test_two_shards_place_a_leafs_shared_downlinks_as_one_and_a_dead_shard_leader_moves_nothing(etcd, shard_coords):
    for host, (peer, n) in INTO_L1.items():            # every QP first on path 1, as the worst start
        write_host(etcd, host, {(peer, 50000 + i, i): 1 for i in range(n)})
    took = wait(lambda: len(placed(etcd)) == 12 and into_l1(placed(etcd)) == [3, 3, 3, 3], 10,
                "the 12 QPs into l1 placed 3 on each downlink")
    print(f"\n12 QPs of two shards into l1 placed 3 a downlink after {took * 1000:.0f} ms")
    before = placed(etcd)
    # the hosts move their QPs where they were placed (what rlbhost does for new or idle QPs)
    peer_of = {addr(h): h for h in FABRIC.hosts}
    for host in INTO_L1:
        write_host(etcd, host, {(peer_of[q[0]], q[1], q[2]): p for (h, q), (p, _) in before.items() if h == host})
    time.sleep(0.5)
    assert placed(etcd) == before                      # nothing to rewrite
    # each shard wrote its own hosts' placements only
    leaders = {status(c)["shard"]: (name, c) for name, c in shard_coords.items() if status(c).get("leading")}
    assert sorted(leaders) == ["1/2", "2/2"]
    assert {h for h, _ in before} == {"h5", "h3", "h7"}
    assert status(leaders["1/2"][1])["hosts_in_etcd"] == 1          # h5 only: h3, h7 are not read
    assert status(leaders["2/2"][1])["hosts_in_etcd"] == 2
    # l1's link loads, written by shard 1's leader, count shard 2's QPs into l1 too
    def l1_down():
        kv = user(etcd, keys.host_user("h1")).get(keys.links_prefix() + "l1")
        return kv and json.loads(kv.value)["loads"]["down"]["load"]
    wait(lambda: l1_down() == [3, 3, 3, 3], 3, "links/l1 with both shards' QPs")
    # shard 1's leader dies: its standby leads, nothing moves, shard 2 never notices
    name, leader = leaders["1/2"]
    standby = shard_coords["b1" if name == "a1" else "a1"]
    leader.kill()
    took = wait(lambda: status(standby).get("leading", False), 5, "shard 1's standby to lead")
    assert took < 2.0, took
    time.sleep(0.6)                                    # it has solved, compared, published
    assert placed(etcd) == before                      # not one QP moved, nothing rewritten
    assert status(leaders["2/2"][1])["counters"]["takeovers"] == 1
    print(f"shard 1's standby leads {took:.2f} s after its leader was killed")
    # and it places: a new QP of h6's (shard 1) goes where l1's downlinks have room
    write_host(etcd, "h6", {("h2", 40000, 7): 1})
    wait(lambda: ("h6", (addr("h2"), 40000, 7)) in placed(etcd), 3, "h6's QP placed by the new leader")
    assert sorted(into_l1(placed(etcd))) == [3, 3, 3, 4]


def test_a_coordinator_of_another_shard_count_never_leads_beside_them_and_says_why(etcd, shard_coords, tmp_path):
    odd = Coord(etcd, "whole", tmp_path, FABRIC_FILE)   # --shard 1/1: the whole fabric
    try:
        wait(lambda: "another shard count" in odd.log.read_text(), 10, "its refusal in the log")
        time.sleep(1.0)
        assert not status(odd).get("leading", True)
        text = odd.log.read_text()
        assert "1/2 (" in text and "2/2 (" in text and "same --shard count" in text, text
    finally:
        odd.kill()


@pytest.mark.parametrize("args,why", [
    (("--shard", "3/2", "--etcd", "http://127.0.0.1:1"), "--shard: '3/2': the shard's number must be 1-2"),
    (("--shard", "5/5", "--etcd", "http://127.0.0.1:1"), "--shard: 5 shards for 4 leaves"),
    (("--shard", "1/2"), "--shard goes with --etcd"),
])
def test_a_shard_that_cannot_be_is_refused_before_anything_starts(args, why):
    r = subprocess.run([sys.executable, "-m", "rlbcoord.cli", "run", "--fabric", str(FABRIC_FILE),
                        "--port", str(free_port()), *args], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and why in r.stderr, r.stderr


def test_units_give_each_coordinator_its_shard_and_refuse_one_without_etcd():
    on_etcd = Coordination(etcd="http://10.0.0.2:2379")
    unit = coordinator_unit(FABRIC_FILE, "10.0.0.3", coordination=on_etcd, name="c3", shard="2/2")["rlb-coord"]
    assert "--etcd http://10.0.0.2:2379" in unit and unit.split("ExecStart=")[1].split("\n")[0].endswith(
        "--name c3 --shard 2/2")
    assert "--shard" not in coordinator_unit(FABRIC_FILE, "10.0.0.3", coordination=on_etcd)["rlb-coord"]
    with pytest.raises(FabricError, match="goes with etcd"):
        coordinator_unit(FABRIC_FILE, "10.0.0.3", shard="1/2")
    r = subprocess.run([sys.executable, "-m", "rlbdeploy.cli", "units", "--fabric", str(FABRIC_FILE), "--node",
                        "coordinator", "--mgmt-ip", "10.0.0.3", "--etcd", "http://10.0.0.2:2379", "--shard", "1/2"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "rlbcoord run" in r.stdout and "--shard 1/2" in r.stdout, r.stderr
    r = subprocess.run([sys.executable, "-m", "rlbdeploy.cli", "units", "--fabric", str(FABRIC_FILE), "--node",
                        "h1", "--mgmt-ip", "10.0.0.21", "--shard", "1/2"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "coordinator" in r.stderr, r.stderr


def test_a_shards_loads_that_cannot_be_read_are_said_once_and_change_nothing(etcd, shard_coords):
    write_host(etcd, "h5", {("h1", 50000 + i, i): 1 for i in range(4)})
    wait(lambda: len(placed(etcd)) == 4, 5, "h5's 4 placements")
    before = placed(etcd)
    admin = user(etcd, etcdauth.ROOT_USER)
    leaders = {status(c)["shard"]: c for c in shard_coords.values() if status(c).get("leading")}
    bogus = json.dumps({"of": 2, "tiers": [[{"l9": [1, 2, 3, 4]}, {}]]})
    for _ in range(5):                                 # a shard whose fabric file has a leaf l9
        admin.put(keys.shard_loads_key(2), bogus)
        time.sleep(0.1)
    admin.put(keys.shard_loads_key(3), json.dumps({"of": 2, "tiers": [[{}, {"l1": [9, 9, 9, 9]}]]}))
    time.sleep(0.5)
    assert placed(etcd) == before
    log = leaders["1/2"].log.read_text()
    assert log.count("cannot read it (leaf 'l9' is not in this fabric file)") == 1, log
    assert "shards/3" not in log                       # no shard 3 of 2: not even read
    r = subprocess.run([sys.executable, "-m", "rlbcoord.cli", "status", "--url", leaders["1/2"].url],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 0 and r.stdout.startswith("shard 1/2: the QPs of this shard's hosts"), r.stdout + r.stderr


def test_a_shard_with_no_coordinator_left_is_seen_by_the_others(etcd, shard_coords):
    """Shard 2's only coordinator dies: nobody of shard 2 is left to say so, so shard 1's
    coordinators do (RlbShardWithoutLeader reads it)."""
    one = next(c for c in shard_coords.values() if status(c).get("shard") == "1/2" and status(c).get("leading"))
    assert status(one)["other_shards_without_leader"] == []
    shard_coords["a2"].kill()
    took = wait(lambda: status(one)["other_shards_without_leader"] == [2], 5, "shard 1 to see shard 2 leaderless")
    assert etcd_metrics(one.url)["rlb_coord_etcd_other_shards_without_leader"] == 1
    print(f"\nshard 2 seen without a leader {took:.2f} s after its only coordinator died")
