"""A host's placements as etcd values (rlbfabric/coord/keys.py): one key per host, parts past
PART_QPS QPs, read back exactly, older per-QP keys still understood, anything else refused."""
from __future__ import annotations

import json
import random

import pytest

from rlbfabric.coord import keys


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
