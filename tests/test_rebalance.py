"""The host's choice of which QPs move (rlbhost/rebalance.py), without maps: the periodic sweep
and a release after a change of capacity."""
from __future__ import annotations

from rlbhost.rebalance import LiveQp, moves


def qps(per_path: dict[int, int], placed: set[int] = frozenset()) -> list[LiveQp]:
    out, t = [], 0
    for path, n in per_path.items():
        for _ in range(n):
            t += 1
            out.append(LiveQp(f"q{t}", path, created_ns=t, placed_here=path in placed))
    return out


def after(qs: list[LiveQp], mv: list[tuple[LiveQp, int]]) -> dict[int, int]:
    where = {q.key: q.path for q in qs}
    where.update({q.key: i for q, i in mv})
    return {p: sum(1 for v in where.values() if v == p) for p in sorted(set(where.values()))}


def test_the_sweep_leaves_a_split_within_one_qp_of_the_shares():
    assert moves(qps({0: 3, 1: 2}), [1, 1], release=False) == []
    assert moves(qps({0: 1, 1: 2}), [1, 2], release=False) == []


def test_the_sweep_moves_the_newest_from_a_path_over_its_share():
    qs = qps({0: 5})
    mv = moves(qs, [1, 1], release=False)
    assert sorted(q.key for q, _ in mv) == ["q4", "q5"] and {i for _, i in mv} == {1}
    assert after(qs, mv) == {0: 3, 1: 2}


def test_the_sweep_keeps_the_coordinators_placements_unless_their_path_died():
    qs = qps({0: 5}, placed={0})
    assert moves(qs, [1, 1], release=False) == []
    mv = moves(qs, [0, 1], release=False)
    assert len(mv) == 5 and after(qs, mv) == {1: 5}


def test_a_release_moves_the_proportional_excess_and_reinstates_it():
    """Path 0 falls from half to a third of 8 QPs: it releases 4 - 8/3 rounded up, the newest;
    when it recovers the other path gives back its excess over 4."""
    qs = qps({0: 4, 1: 4})
    mv = moves(qs, [1, 2], release=True, before=[1, 1])
    assert sorted(q.key for q, _ in mv) == ["q3", "q4"] and after(qs, mv) == {0: 2, 1: 6}
    qs2 = [LiveQp(q.key, dict((m.key, i) for m, i in mv).get(q.key, q.path), q.created_ns) for q in qs]
    mv2 = moves(qs2, [1, 1], release=True, before=[1, 2])
    assert len(mv2) == 2 and after(qs2, mv2) == {0: 4, 1: 4}


def test_planes_of_sub_ports_keep_each_plane_and_sub_port_within_one_qp():
    # 2 planes x 2 sub-ports, plane 1 at half (its sub-ports 1 each), 12 QPs all on plane 2
    qs = qps({2: 6, 3: 6})
    mv = moves(qs, [1, 1, 2, 2], release=False, group_size=2)
    got = after(qs, mv)
    assert got.get(0, 0) + got.get(1, 0) == 4 and got[2] + got[3] == 8
    assert all(abs(got.get(a, 0) - got.get(b, 0)) <= 1 for a, b in ((0, 1), (2, 3)))
    assert len(mv) == 4
