"""The host's choice of which QPs move (rlbhost/rebalance.py), without maps: the periodic sweep
and a release after a change of capacity."""
from __future__ import annotations

from rlbhost.rebalance import LiveQp, moves


def qps(per_path: dict[int, int], placed: set[int] = frozenset()) -> list[LiveQp]:
    out, t = [], 0
    for path, n in per_path.items():
        for _ in range(n):
            t += 1
            out.append(LiveQp(f"q{t}", path, created_ns=t, coordinated=path in placed))
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


def moved_to(qs: list[LiveQp], mv: list[tuple[LiveQp, int]]) -> list[LiveQp]:
    """The QPs after the moves, each keeping its home (the agent keeps homes across a change)."""
    to = {q.key: i for q, i in mv}
    return [LiveQp(q.key, to.get(q.key, q.path), q.created_ns, home=q.home) for q in qs]


def homed(per_path: dict[int, int]) -> list[LiveQp]:
    return [LiveQp(q.key, q.path, q.created_ns, home=q.path) for q in qps(per_path)]


def test_a_change_in_two_steps_moves_no_qp_the_net_change_keeps_still():
    """Path 0 dies (its 4 QPs spread over the 3 others), then paths 2 and 3 gain weight: path 1
    gives back what it took, and the QPs it gives are those that came from path 0, not its own.
    Before homes, the newest moved (path 1's own: path 0's were the oldest): 5 moved, not 4."""
    qs = homed({0: 4, 1: 4, 2: 4, 3: 4})
    step1 = moved_to(qs, moves(qs, [0, 2, 2, 2], release=True, before=[2, 2, 2, 2]))
    assert after(qs, moves(qs, [0, 2, 2, 2], release=True, before=[2, 2, 2, 2])) in (
        {1: 6, 2: 5, 3: 5}, {1: 5, 2: 6, 3: 5}, {1: 5, 2: 5, 3: 6})
    step2 = moved_to(step1, moves(step1, [0, 2, 3, 3], release=True, before=[0, 2, 2, 2]))
    assert after(step2, []) == {1: 4, 2: 6, 3: 6}
    net = [q.key for q in step2 if q.path != q.home]
    assert sorted(net) == ["q1", "q2", "q3", "q4"]


def test_a_change_taken_back_moves_the_same_qps_home():
    """Paths 0 and 1 go to 0 for a moment (a probe verdict), their QPs move to path 2, and they
    come back: each path takes back its own QPs, so the round trip changes no QP's path. Before
    homes, path 2 gave its newest, which were its own: 8 of 12 QPs ended elsewhere."""
    qs = homed({0: 4, 1: 4, 2: 4})
    out = moved_to(qs, moves(qs, [0, 0, 1], release=False))
    assert after(out, []) == {2: 12}
    back = moved_to(out, moves(out, [1, 1, 1], release=True, before=[0, 0, 1]))
    assert [(q.key, q.path) for q in back] == [(q.key, q.path) for q in qs]


def test_homes_change_which_qps_move_never_how_many():
    """Against the same QPs without homes: the same number of moves, every path within one QP of
    its share as before, and after a release the same count on every path (the sweep's spare
    units, above the shares rounded down, may go to the paths whose own QPs come back)."""
    from rlbcommon.weights import share_bounds
    import random
    rnd = random.Random(7)
    for _ in range(300):
        n = rnd.randint(2, 6)
        per = {i: rnd.randint(0, 6) for i in range(n)}
        eff = [rnd.choice([0, 1, 2, 3]) for _ in range(n)]
        if not any(eff) or not sum(per.values()):
            continue
        plain = qps(per)
        homes = [LiveQp(q.key, q.path, q.created_ns, home=rnd.randrange(n)) for q in plain]
        release = rnd.random() < 0.5
        a, b = moves(plain, eff, release), moves(homes, eff, release)
        assert len(a) == len(b)
        if release:
            assert after(plain, a) == after(homes, b)
        else:
            lo, hi = share_bounds(eff, len(plain))
            got = after(homes, b)
            assert all(lo[i] <= got.get(i, 0) <= hi[i] for i in range(n)) == \
                all(lo[i] <= after(plain, a).get(i, 0) <= hi[i] for i in range(n))
