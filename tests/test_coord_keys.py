"""A host's placements and QPs as etcd values (rlbcoord/keys.py): a few keys per host,
read back exactly, older per-QP keys still understood, anything else refused; the coordinator's
mirror of a host's QP keys as they are rewritten."""
from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from rlbcoord import keys
from rlbcoord.etcdrun import EtcdCoordination
from rlbcoord.service import Coordinator
from rlbfabric.fabric import load

FABRIC_FILE = Path(__file__).resolve().parent.parent / "lab" / "fabric.toml"


def qps(n: int, seed: int = 1) -> dict:
    rnd = random.Random(seed)
    return {(f"fd00:{i % 7}::1", 49152 + rnd.randrange(16384), rnd.getrandbits(24)): 1 + i % 8 for i in range(n)}


def test_a_hosts_placements_are_one_key_that_reads_back_exactly():
    placed = qps(8)
    parts = keys.placement_parts(placed)
    assert list(parts) == ["part0"]
    assert keys.read_placements("part0", parts["part0"].encode()) == placed
    # the text is canonical: the same placements in another order are the same value
    assert keys.placement_parts(dict(reversed(list(placed.items())))) == parts
    assert keys.placement_parts({}) == {}


def test_a_host_with_more_qps_than_a_part_holds_gets_parts_and_a_change_rewrites_one():
    placed = qps(2 * keys.PART_QPS + 1)
    parts = keys.placement_parts(placed)
    assert sorted(parts) == ["part0", "part1", "part2"]
    back = {}
    for name, value in parts.items():
        got = keys.read_placements(name, value.encode())
        assert 0 < len(got) < 2 * keys.PART_QPS
        back.update(got)
    assert back == placed
    q = next(iter(placed))
    moved = keys.placement_parts({**placed, q: placed[q] % 8 + 1})
    assert sum(moved[k] != parts[k] for k in parts) == 1


def test_an_older_coordinators_per_qp_key_is_read_and_anything_else_refused():
    assert keys.read_placements("fd00::1_50000_7", b"3") == {("fd00::1", 50000, 7): 3}
    for name, value in (("part0", b"[1, 2]"), ("part0", b'{"fd00::1_1_1": "3"}'),
                        ("part0", b'{"no-qp": 3}'), ("part0", b"not json"), ("x", b"3"),
                        ("part0", json.dumps({"fd00::1_1_1": True}).encode())):
        with pytest.raises(ValueError):
            keys.read_placements(name, value)


# ---- a host's QPs: parts that grow and shrink by powers of two -------------------------------
def host_qps(n: int, seed: int = 2) -> dict:
    rnd = random.Random(seed)
    return {(f"fd00:{i % 5}::1", 49152 + rnd.randrange(16384), rnd.getrandbits(24)):
            {"path": 1 + i % 4, "active": bool(i % 3)} for i in range(n)}


def test_a_hosts_qps_are_a_power_of_two_of_parts_with_room_to_shrink():
    P = keys.HOST_PART_QPS
    assert [keys.host_part_count(n) for n in (0, 1, P, P + 1, 2 * P, 2 * P + 1)] == [1, 1, 1, 2, 2, 4]
    # a host at a boundary keeps its parts: going down to a quarter before they halve
    assert keys.host_part_count(P, have=2) == 2 and keys.host_part_count(P // 2 + 1, have=2) == 2
    assert keys.host_part_count(P // 2, have=2) == 1
    assert keys.host_part_count(2 * P + 1, have=2) == 4 and keys.host_part_count(3, have=8) == 1


def test_a_hosts_qps_read_back_exactly_from_their_parts_and_a_change_rewrites_one():
    qps = host_qps(300)
    n = keys.host_part_count(len(qps))
    parts = keys.qp_parts(qps, n)
    assert n == 8 and sorted(parts) == [f"part{i}" for i in range(8)]
    back = {}
    for name, value in parts.items():
        got = keys.read_qps(name, value.encode())
        assert 0 < len(got) < 2 * keys.HOST_PART_QPS and not back.keys() & got.keys()
        back.update(got)
    assert back == qps
    q = next(iter(qps))
    changed = keys.qp_parts({**qps, q: {"path": 4, "active": False, "since": 1.5}}, n)
    assert sum(changed[k] != parts[k] for k in parts) == 1
    assert keys.qp_parts(dict(reversed(list(qps.items()))), n) == parts      # canonical text


def test_an_older_hosts_key_for_one_qp_is_read_and_anything_else_refused():
    assert keys.read_qps("fd00::1_50000_7", b'{"path": 2, "active": true}') == {
        ("fd00::1", 50000, 7): {"path": 2, "active": True}}
    for name, value in (("part0", b"[1]"), ("part0", b'{"fd00::1_1_1": 3}'), ("part0", b'{"no-qp": {}}'),
                        ("part0", b"not json"), ("fd00::1_1_1", b"3"), ("x", b"{}")):
        with pytest.raises(ValueError):
            keys.read_qps(name, value)


def test_the_coordinators_mirror_keeps_a_qp_that_moves_part_whichever_key_comes_first():
    """A host whose QPs outgrow their parts rewrites them all in one transaction: a QP leaves
    one key and appears in another. Read in either order, every QP is in the mirror once, the
    new one marked to be read (and a moved one only if it was out of the mirror meanwhile)."""
    qps = host_qps(keys.HOST_PART_QPS)
    one = keys.qp_parts(qps, 1)
    more = {**qps, **host_qps(1, seed=9)}
    two = keys.qp_parts(more, 2)
    for order in (sorted, lambda ks: sorted(ks, reverse=True)):
        coord = EtcdCoordination(Coordinator(load(FABRIC_FILE)), None, "unit")
        for name, v in one.items():
            coord._put(keys.qp_part_key("h1", name), v.encode())
        assert coord.reports["h1"]["qps"] == qps
        coord.dirty_qps.clear()
        writes = {name: two.get(name) for name in set(one) | set(two)}
        for name in order(writes):
            v = writes[name]
            coord._put(keys.qp_part_key("h1", name), v.encode() if v is not None else None)
        assert coord.reports["h1"]["qps"] == more
        assert coord.dirty_qps["h1"] >= more.keys() - qps.keys()
        if order is sorted:                                   # part0 first: the moved ones drop out
            assert len(coord.dirty_qps["h1"]) > 1
        else:                                                 # part1 first: they never leave
            assert coord.dirty_qps["h1"] == more.keys() - qps.keys()
        coord._put(keys.qp_part_key("h1", "part0"), None)
        coord._put(keys.qp_part_key("h1", "part1"), None)
        assert "h1" not in coord.reports                      # no report, no QPs: nothing of h1
