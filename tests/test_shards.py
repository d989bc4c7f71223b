"""Placement split over shards of the leaves (rlbcoord/shards.py), on the model alone: each
shard's placer holds only its leaves' hosts' QPs and places them above the loads the others
publish. Their joint placement must be the best one (every link within one QP of its share, as
one placer gets) and must settle: no shard keeps moving QPs because another did."""
from __future__ import annotations

import math
import random

import pytest

from rlbcoord import shards
from rlbcoord.shards import Shard
from rlbfabric.fabric import load, uniform_clos
from rlbfabric.policy.placement import DOWN, UP, add_loads
from rlbfabric.policy.qpplacer import TIERS, QpInfo, QpPlacer

from .test_etcd_coordination import FABRIC_FILE


def excess(loads) -> int:
    """QPs above the best a link can carry: its leaf's QPs on that side over the colours, rounded
    up (equal capacities: one placer always reaches 0)."""
    out = 0
    for side in (UP, DOWN):
        for row in loads[side]:
            out += max(0, max(row) - math.ceil(sum(row) / len(row)))
    return out


def flows(fabric, rnd: random.Random, per_host: int, idle_share: float = 0.0):
    w = {k: 1.0 for k in range(1, fabric.paths + 1)}
    out = []
    for src in fabric.hosts:
        for i in range(per_host):
            # idle ones: last packets 1 s or 2 s ago (older generations, placed in the room left)
            last = rnd.choice((99.0, 98.0)) if rnd.random() < idle_share else None
            out.append(((src, rnd.choice(fabric.hosts), i), QpInfo(src, "", rnd.randint(1, fabric.paths), w, last=last)))
    for key, q in out:
        q.dst = key[1]
    return out


def split(fabric, qps, n: int) -> dict[int, QpPlacer]:
    owner = {h: k for k in range(1, n + 1) for h in Shard(k, n).hosts(fabric)}
    placers = {k: QpPlacer(fabric) for k in range(1, n + 1)}
    for key, q in qps:
        placers[owner[q.src]].add(key, q)
    return placers


def rounds(fabric, placers: dict[int, QpPlacer], n_rounds: int, exchange: bool = True) -> list[int]:
    """Every shard solves at once on what the others published the round before (the worst
    timing: nobody sees the others' moves of the same round); QPs moved per round."""
    n_leaves, n_colours = len(fabric.leaves), fabric.colours()
    moved = []
    for _ in range(n_rounds):
        published = {k: p.tier_loads() for k, p in placers.items()}
        m = 0
        for k, p in placers.items():
            if exchange:
                p.set_outside(shards.before(k, published, TIERS, n_leaves, n_colours),
                              shards.newest(published, k, n_leaves, n_colours))
            m += p.solve(now=100.0)
        moved.append(m)
    return moved


def joint(placers) -> list:
    out = None
    for p in placers.values():
        if out is None:
            out = p.loads()
        else:
            add_loads(out, p.loads())
    return out


@pytest.mark.parametrize("leaves,n,seed", [(8, 3, 1), (16, 4, 2), (32, 8, 3)])
def test_shards_reach_the_best_placement_and_settle_within_one_round_each(leaves, n, seed):
    fabric = uniform_clos(leaves, 4, 4)
    qps = flows(fabric, random.Random(seed), 6)
    one = QpPlacer(fabric)
    for key, q in qps:
        one.add(key, q)
    one.solve(now=100.0)
    assert excess(one.loads()) == 0
    placers = split(fabric, qps, n)
    moved = rounds(fabric, placers, n + 3)
    # shard 1 places above nobody, shard 2 above shard 1, ...: settled after n rounds
    assert all(m == 0 for m in moved[n:]), moved
    assert excess(joint(placers)) == 0, moved
    assert sum(len(p.qps) for p in placers.values()) == len(one.qps)


def test_without_the_others_loads_the_shared_downlinks_are_not_balanced():
    """The control: the same shards, each blind to the others, overload the downlinks they share."""
    fabric = uniform_clos(8, 4, 4)
    placers = split(fabric, flows(fabric, random.Random(1), 6), 3)
    rounds(fabric, placers, 4, exchange=False)
    loads = joint(placers)
    assert excess(loads) >= 2
    assert excess([[[0] * 4 for _ in loads[UP]], loads[DOWN]]) == excess(loads)   # all of it downlinks


def test_idle_generations_are_placed_in_the_room_every_shards_newer_ones_leave():
    fabric = uniform_clos(16, 4, 4)
    placers = split(fabric, flows(fabric, random.Random(4), 8, idle_share=0.5), 4)
    moved = rounds(fabric, placers, 4 * TIERS + 2)
    assert moved[-2:] == [0, 0], moved
    newest = None
    for p in placers.values():
        if newest is None:
            newest = p.loads(tiers=1)
        else:
            add_loads(newest, p.loads(tiers=1))
    assert excess(newest) == 0                     # the QPs active now: the best, whatever idles


def test_leaves_are_dealt_to_shards_in_turn_so_a_jobs_neighbouring_leaves_spread_over_all():
    fabric = uniform_clos(10, 2, 4)
    got = [Shard(k, 3).leaves(fabric) for k in (1, 2, 3)]
    assert got == [["l1", "l4", "l7", "l10"], ["l2", "l5", "l8"], ["l3", "l6", "l9"]]
    assert Shard(2, 3).hosts(fabric) == {"h3", "h4", "h9", "h10", "h15", "h16"}
    assert Shard(1, 1).leaves(fabric) == [lf.name for lf in fabric.leaves]
    with pytest.raises(ValueError, match="11 shards for 10 leaves"):
        Shard(1, 11).leaves(fabric)


@pytest.mark.parametrize("text,why", [("2", "K/N"), ("a/b", "K/N"), ("0/2", "1-2"), ("3/2", "1-2"),
                                      ("1/0", "at least one")])
def test_a_shard_that_is_not_one_is_refused_with_the_form(text, why):
    with pytest.raises(ValueError, match=why):
        Shard.parse(text)
    assert Shard.parse("2/4") == Shard(2, 4) and str(Shard(2, 4)) == "2/4"


def test_a_shards_loads_read_back_as_written_and_a_foreign_leaf_is_refused():
    fabric = load(FABRIC_FILE)
    names = [lf.name for lf in fabric.leaves]
    index = {n: i for i, n in enumerate(names)}
    tiers = [[[[1, 0, 2, 0], [0, 0, 0, 0]], [[0, 0, 0, 0], [3, 1, 0, 0]]] for _ in range(TIERS)]
    text = shards.encode(tiers, 2, names)
    assert "l2" in text and text.count("l1") == TIERS           # all-zero rows are left out
    assert shards.decode(text, index, TIERS, 4) == (2, tiers)
    with pytest.raises(ValueError, match="l9"):
        shards.decode(text.replace("l2", "l9"), index, TIERS, 4)
    with pytest.raises(ValueError, match="QP counts"):
        shards.decode(text.replace("[3,1,0,0]", "[3,1,-1,0]"), index, TIERS, 4)


def test_the_order_a_generation_is_placed_in():
    """Generation t of shard k sits above every shard's newer generations and above generation t
    of the shards numbered before k, never above its own number's successors' generation t."""
    one = [[[[1]], [[0]]], [[[10]], [[0]]], [[[100]], [[0]]]]        # per tier: [side][leaf][colour]
    others = {1: one, 3: one}
    got = shards.before(2, others, 3, 1, 1)
    # tier 0: shard 1's tier 0 only; tier 1: both tiers 0, shard 1's tier 1; tier 2: ...
    assert [t[UP][0][0] for t in got] == [1, 1 + 1 + 10, 2 + 20 + 100]
    assert shards.before(2, {}, 3, 1, 1) is None
    assert shards.newest(others, 2, 1, 1)[UP][0][0] == 2
