"""The coordinator's placement (pure logic): equitable colourings, weights, dead links, per-QP
restrictions, incremental changes, checked against the de Werra bound and brute force."""
from __future__ import annotations

import itertools
import math
import random
from pathlib import Path

import pytest

from rlbfabric import balance, workloads
from rlbfabric.policy import localrule
from rlbfabric.fabric import load, parse
from rlbfabric.policy.placement import DOWN, UP, Placement
from rlbfabric.policy.qpplacer import QpInfo, QpPlacer

LAB = Path(__file__).resolve().parent.parent / "lab"


def random_instance(rnd, leaves, colours, n, presets=True, p=None):
    p = p or Placement(leaves, colours)
    for i in range(n):
        a = rnd.randrange(leaves)
        b = rnd.randrange(leaves - 1)
        b += b >= a
        p.add(i, a, b, colour=rnd.randrange(colours) if presets and rnd.random() < 0.5 else None)
    return p


def violation(leaves, colours, edges, targets, cols):
    """QPs outside the targets, summed over links, for one colouring."""
    lo, hi = targets
    load = [[[0] * colours for _ in range(leaves)] for _ in (UP, DOWN)]
    for (a, b, _), c in zip(edges, cols):
        load[UP][a][c] += 1
        load[DOWN][b][c] += 1
    return sum(max(0, load[s][v][c] - hi[s][v][c]) + max(0, lo[s][v][c] - load[s][v][c])
               for s in (UP, DOWN) for v in range(leaves) for c in range(colours))


@pytest.mark.parametrize("leaves,colours,n", [(2, 4, 6), (2, 4, 13), (4, 4, 40), (8, 4, 250),
                                              (5, 3, 101), (16, 8, 1000), (64, 8, 4096)])
def test_equal_capacities_every_link_meets_the_bound(leaves, colours, n):
    """de Werra: every leaf's worst uplink and downlink is exactly ceil(d / colours)."""
    for seed in range(5):
        p = random_instance(random.Random(seed), leaves, colours, n)
        p.solve()
        assert all(p.colour(i) is not None for i in range(n))
        assert p.violation() == 0
        for side in (UP, DOWN):
            for row in p.loads()[side]:
                d = sum(row)
                assert max(row) == math.ceil(d / colours) and min(row) >= d // colours


def brute_force(leaves, colours, edges, caps, targets):
    usable = [[c for c in range(colours) if m >> c & 1 and caps[a][c] > 0 and caps[b][c] > 0]
              for a, b, m in edges]
    return min(violation(leaves, colours, edges, targets, cols) for cols in itertools.product(*usable))


def small_cases(kind, count=400):
    """Random small fabrics; kind: 'weights' (unequal link speeds), 'dead' (links down, both
    directions), 'masks' (QPs barred from some colours, as a zero host weight does)."""
    rnd = random.Random(7)
    while count:
        leaves, colours, n = rnd.choice([2, 3]), rnd.choice([2, 3]), rnd.randint(2, 7)
        caps = [[1.0] * colours for _ in range(leaves)]
        for v in range(leaves):
            for c in range(colours):
                if kind == "weights" and rnd.random() < 0.3:
                    caps[v][c] = rnd.choice([0.5, 2.0])
                if kind == "dead" and rnd.random() < 0.25:
                    caps[v][c] = 0.0
        edges = []
        for _ in range(n):
            a = rnd.randrange(leaves)
            b = rnd.randrange(leaves - 1)
            b += b >= a
            m = (1 << colours) - 1
            if kind == "masks" and rnd.random() < 0.3:
                m &= ~(1 << rnd.randrange(colours))
            edges.append((a, b, m))
        if any(not any(m >> c & 1 and caps[a][c] and caps[b][c] for c in range(colours)) for a, b, m in edges):
            continue
        count -= 1
        yield leaves, colours, edges, caps, [rnd.randrange(colours) if rnd.random() < 0.5 else None for _ in edges]


def solve_case(leaves, colours, edges, caps, presets):
    p = Placement(leaves, colours)
    for v in range(leaves):
        p.set_capacity(v, UP, caps[v])
        p.set_capacity(v, DOWN, caps[v])
    for i, ((a, b, m), c) in enumerate(zip(edges, presets)):
        p.add(i, a, b, m, c)
    p.solve()
    return [p.colour(i) for i in range(len(edges))], p.targets()


@pytest.mark.parametrize("kind", ["weights", "dead"])
def test_as_good_as_brute_force_with_link_speeds_and_failures(kind):
    worse = 0
    for leaves, colours, edges, caps, presets in small_cases(kind):
        cols, targets = solve_case(leaves, colours, edges, caps, presets)
        for (a, b, m), c in zip(edges, cols):   # never on a dead link
            assert c is not None and caps[a][c] > 0 and caps[b][c] > 0
        worse += (violation(leaves, colours, edges, targets, cols)
                  > brute_force(leaves, colours, edges, caps, targets))
    # measured: 0 of 400 for both (3000 each by hand: weights 1, dead links 0)
    assert worse <= 1


def test_per_qp_restrictions_are_respected_and_nearly_optimal():
    """Per-QP colour restrictions break de Werra's theorem; the chains that may turn to a third
    colour still reach the optimum almost always (measured: 3 of 400 miss it by one QP)."""
    worse = 0
    for leaves, colours, edges, caps, presets in small_cases("masks"):
        cols, targets = solve_case(leaves, colours, edges, caps, presets)
        assert all(m >> c & 1 for (_, _, m), c in zip(edges, cols))
        worse += (violation(leaves, colours, edges, targets, cols)
                  > brute_force(leaves, colours, edges, caps, targets))
    assert worse <= 8


def test_incremental_changes_move_few_qps():
    rnd = random.Random(3)
    p = random_instance(rnd, 8, 4, 300, presets=False)
    p.solve()
    moves = []
    for j in range(200):
        if rnd.random() < 0.5:
            a, b = rnd.sample(range(8), 2)
            p.add(("new", j), a, b)
        else:
            p.remove(rnd.choice(list(p.qps)))
        changed = p.solve()
        moves.append(len(changed))
        assert p.violation() == 0
    # a new QP counts as one; a chain recolours its length in QPs
    assert max(moves) <= 6 and sum(moves) / len(moves) <= 2.0, moves


def test_a_link_failure_moves_only_its_qps_and_recovery_reinstates_balance():
    p = random_instance(random.Random(4), 4, 4, 200, presets=False)
    p.solve()
    before = {k: p.colour(k) for k in p.qps}
    for side in (UP, DOWN):
        p.set_capacity(2, side, [1, 1, 0, 1])          # leaf 2's uplink 2 died
    changed = p.solve()
    on_dead = {k for k, q in p.qps.items() if before[k] == 2 and 2 in (q.group.a, q.group.b)}
    assert on_dead <= changed
    assert all(not (p.colour(k) == 2 and 2 in (q.group.a, q.group.b)) for k, q in p.qps.items())
    # the QPs that did not ride the dead link mostly stay (chains may move a few to make room)
    assert len(changed - on_dead) <= len(on_dead)
    for side in (UP, DOWN):
        p.set_capacity(2, side, [1, 1, 1, 1])
    p.solve()
    assert p.violation() == 0


def all_to_all(leaves, colours, per_pair, dead=(), one_by_one=False):
    """Every leaf pair's per_pair QPs, with (leaf, colour) links down both ways; the worst leaf's
    figures by live links, and the per-leaf bound (best_max_over_mean over its live links)."""
    p = Placement(leaves, colours)
    caps = [[0.0 if (v, c) in dead else 1.0 for c in range(colours)] for v in range(leaves)]
    for v in range(leaves):
        p.set_capacity(v, UP, caps[v])
        p.set_capacity(v, DOWN, caps[v])
    for k, (a, b) in enumerate(x for x in itertools.permutations(range(leaves), 2) for _ in range(per_pair)):
        p.add(k, a, b)
        if one_by_one:
            p.solve()
    p.solve()
    return p, figures_of(p, caps), max(balance.best_max_over_mean(per_pair * (leaves - 1), row) for row in caps)


def figures_of(p, caps):
    up, down = p.loads()
    return balance.figures(dict(enumerate(up)), dict(enumerate(down)), dict(enumerate(caps)))


def worst_of(leaves, colours, edges, caps, cols) -> float:
    """One colouring's worst leaf (max/mean over live links, uplinks and downlinks)."""
    up = [[0] * colours for _ in range(leaves)]
    down = [[0] * colours for _ in range(leaves)]
    for (a, b, _), c in zip(edges, cols):
        up[a][c] += 1
        down[b][c] += 1
    return max(balance.figures(dict(enumerate(up)), dict(enumerate(down)), dict(enumerate(caps))))


@pytest.mark.parametrize("leaves,colours,per_pair", [(3, 3, 12), (3, 3, 1), (4, 4, 8), (4, 3, 5), (6, 4, 3),
                                                     (8, 4, 6), (8, 8, 2)])
def test_a_dead_link_the_pairs_that_can_lean_on_its_colour_elsewhere(leaves, colours, per_pair):
    """Leaf 1's link on the last colour down: its pairs must share the others, so every other
    pair leans on that colour. FARE's even split of each pair left the other leaves' links
    uneven (3 leaves x 3 colours, 12 QPs a pair: 10/10/4 on leaf 0's uplinks where 8/8/8 is
    possible); every leaf now reaches its bound, and still does when the QPs come one by one."""
    dead = {(1, colours - 1)}
    for one_by_one in (False, True):
        p, got, bound = all_to_all(leaves, colours, per_pair, dead, one_by_one)
        assert max(got) == pytest.approx(bound), (one_by_one, p.loads())
        assert all(p.colour(k) != colours - 1 for k, q in p.qps.items() if 1 in (q.group.a, q.group.b))
    if (leaves, colours, per_pair) == (3, 3, 12):
        assert p.loads()[UP] == [[8, 8, 8], [12, 12, 0], [8, 8, 8]]


def test_a_dead_link_back_every_pair_back_to_the_even_split():
    p, got, _ = all_to_all(3, 3, 12, {(1, 2)})
    for side in (UP, DOWN):
        p.set_capacity(1, side, [1.0, 1.0, 1.0])
    p.solve()
    assert p.violation() == 0 and p.loads()[UP] == [[8, 8, 8]] * 3
    assert all(g.frac == pytest.approx([1 / 3] * 3) for g in p.groups.values())


def test_pairs_no_longer_next_to_a_cut_off_one_go_back_to_the_even_split():
    """The link stays down but the QPs to and from its leaf end: the others have nothing to make
    room for, so they split evenly again (they kept leaning once, until a capacity changed)."""
    p, _, _ = all_to_all(3, 3, 12, {(1, 2)})
    for k, q in list(p.qps.items()):
        if 1 in (q.group.a, q.group.b):
            p.remove(k)
    p.solve()
    assert all(g.frac == pytest.approx([1 / 3] * 3) for g in p.groups.values())
    assert p.violation() == 0 and p.loads()[UP] == [[4, 4, 4], [0, 0, 0], [4, 4, 4]]


@pytest.mark.parametrize("kind", ["dead", "masks"])
def test_dead_links_and_barred_colours_reach_the_best_figures(kind):
    """Random fabrics of 3-5 leaves with links down (or QPs barred from a colour, as a zero host
    weight does), small enough to try every placement: the placement's worst leaf (max/mean over
    live links, both sides) is never above the best of them all (137 fabrics with links down,
    128 with QPs barred; FARE's even split was above the best in 2 of the barred ones)."""
    rnd = random.Random(11)
    tried = 0
    for _ in range(200):
        leaves, colours = rnd.choice([3, 4, 5]), rnd.choice([2, 3, 4])
        caps = [[1.0] * colours for _ in range(leaves)]
        if kind == "dead":
            for _ in range(rnd.choice([1, 2])):
                caps[rnd.randrange(leaves)][rnd.randrange(colours)] = 0.0
        edges = []
        while len(edges) < rnd.randint(6, 10):
            a, b = rnd.sample(range(leaves), 2)
            m = (1 << colours) - 1
            if kind == "masks" and rnd.random() < 0.4:
                m &= ~(1 << rnd.randrange(colours))
            if any(m >> c & 1 and caps[a][c] and caps[b][c] for c in range(colours)):
                edges.append((a, b, m))
        usable = [[c for c in range(colours) if m >> c & 1 and caps[a][c] and caps[b][c]] for a, b, m in edges]
        if math.prod(len(u) for u in usable) > 2000:
            continue
        tried += 1
        cols, _ = solve_case(leaves, colours, edges, caps, [None] * len(edges))
        best = min(worst_of(leaves, colours, edges, caps, c) for c in itertools.product(*usable))
        assert worst_of(leaves, colours, edges, caps, cols) <= best + 1e-9, (leaves, colours, caps, edges)
    assert tried >= 100


def test_unusable_qp_stays_unplaced_until_a_path_returns():
    p = Placement(2, 2)
    p.set_capacity(0, UP, [0, 0])
    p.add("q", 0, 1)
    assert p.solve() == set() and p.colour("q") is None
    p.set_capacity(0, UP, [1, 1])
    assert p.solve() == {"q"} and p.colour("q") is not None


def test_bad_input_is_refused():
    p = Placement(2, 4)
    with pytest.raises(ValueError):
        p.add("x", 0, 0)
    with pytest.raises(ValueError):
        p.set_capacity(0, UP, [1, 1])
    with pytest.raises(ValueError):
        Placement(2, 0)
    p.add("x", 0, 1)
    with pytest.raises(KeyError):
        p.add("x", 0, 1)


# ---- the fabric-level model ------------------------------------------------------------

def test_placer_maps_hosts_and_paths_through_the_fabric_file():
    fab = load(LAB / "fabric.toml")
    pl = QpPlacer(fab)
    assert pl.host_of("fc00:2:1:3:a8c0:ffff:fe00:1") == "h3" and pl.host_of("fc00:9::1") is None
    every = {k: 1.0 for k in range(1, 5)}
    for i in range(4):
        pl.add(("h1", i), QpInfo("h1", "h3", 1, every))      # all four on path 1 now
    pl.add(("h1", "local"), QpInfo("h1", "h2", 1, every))     # same leaf: nothing to place
    assert pl.solve() == 3
    assert sorted(pl.placements("h1").values()) == [1, 2, 3, 4]
    assert ("h1", "local") not in pl.placements("h1")
    assert pl.link_loads()["l1"]["up"] == [1, 1, 1, 1] and pl.link_loads()["l2"]["down"] == [1, 1, 1, 1]
    # l1's uplink to s3 dies: its QP goes elsewhere, the rest stay
    kept = {k: v for k, v in pl.placements("h1").items() if v != 3}
    assert pl.set_link("l1", 2, False) and not pl.set_link("l1", 2, False)
    pl.solve()
    after = pl.placements("h1")
    assert 3 not in after.values() and all(after[k] == v for k, v in kept.items())
    assert pl.dead_links() == [("l1", 2)]


def test_placer_with_two_paths_per_uplink_and_parallel_links():
    fab = parse({"fabric": {"paths": 8}, "spine": [{"name": f"s{k}", "asn": 65000} for k in (1, 2, 3, 4)],
                 "leaf": [{"name": "l1", "asn": 65001, "hosts": ["h1"]}, {"name": "l2", "asn": 65002, "hosts": ["h2"]}]})
    pl = QpPlacer(fab)
    for i in range(8):
        pl.add(i, QpInfo("h1", "h2", None, {k: 1.0 for k in range(1, 9)}))
    pl.solve()
    assert pl.link_loads()["l1"]["up"] == [2, 2, 2, 2]
    par = QpPlacer(load(LAB / "fabric-parallel.toml"))       # 2 spines x 2 links = 4 colours
    assert par.n_colours == 4 and par.colour_of_path == {1: 0, 2: 1, 3: 2, 4: 3}


def test_host_weights_scale_its_paths():
    """A host that reports path 4 at half weight (a degraded sub-path, §3.1) gets half a share
    there; the two-QP, 10:5 Gb/s case splits one each, the nearest to 1.33:0.67."""
    fab = load(LAB / "fabric.toml")
    pl = QpPlacer(fab)
    for i in range(7):
        pl.add(i, QpInfo("h1", "h3", None, {1: 1.0, 2: 1.0, 3: 1.0, 4: 0.5}))
    pl.solve()
    assert pl.link_loads()["l1"]["up"] == [2, 2, 2, 1]
    two = QpPlacer(load(LAB / "fabric-2x2.toml"))
    for i in range(2):
        two.add(i, QpInfo("h1", "h2", None, {1: 1.0, 2: 1.0}))
    two.solve()
    assert two.link_loads()["l1"]["up"] == [1, 1]


def test_half_speed_link_gets_half_the_qps():
    fab = load(LAB / "fabric-2x2.toml")          # l1-s2 at 5 Gb/s, the rest 10
    pl = QpPlacer(fab)
    every = {1: 1.0, 2: 1.0}
    for i in range(9):
        pl.add(i, QpInfo("h1", "h2", None, every))
    pl.solve()
    assert pl.caps("l1") == [10000.0, 5000.0]
    assert pl.link_loads()["l1"]["up"] == [6, 3]


# ---- workloads, figures, the local rule ---------------------------------------------------

def test_workloads():
    hosts = [f"h{i}" for i in range(1, 9)]
    assert workloads.connections("pairs", hosts[:4]) == [("h1", "h3"), ("h2", "h4")]
    assert len(workloads.connections("all-to-all", hosts)) == 56
    assert workloads.connections("ring", hosts)[-1] == ("h8", "h1")
    perm = workloads.connections("permutation", hosts, random.Random(1))
    assert sorted(d for _, d in perm) == hosts and all(s != d for s, d in perm)
    moe = workloads.connections("moe", hosts, random.Random(1), fanout=3)
    assert len(moe) == 24 and all(s != d for s, d in moe)
    tree = workloads.connections("tree", hosts)
    assert ("h2", "h1") in tree and ("h1", "h2") in tree and len(tree) == 14
    with pytest.raises(ValueError):
        workloads.connections("mesh", hosts)


def test_balance_figures():
    assert balance.max_over_mean([2, 1, 1, 0]) == 2.0
    assert balance.max_over_mean([0, 0]) is None
    assert balance.max_over_mean([6, 3], [10, 5]) == pytest.approx(1.0)
    assert balance.best_max_over_mean(2, [1] * 4) == 2.0
    assert balance.best_max_over_mean(6, [1] * 4) == pytest.approx(4 / 3)
    assert balance.best_max_over_mean(7, [2, 1, 1, 1]) == pytest.approx(2 / 1.4)
    assert balance.best_max_over_mean(3, [1, 0, 1, 1]) == 1.0


def test_local_rule_rotation_spreads_hosts_of_a_leaf_and_leaves():
    fab = load(LAB / "fabric.toml")
    assert [localrule.rotation(fab, h) for h in ("h1", "h2", "h3", "h4")] == [0, 2, 1, 3]
    wide = parse({"fabric": {"paths": 8}, "spine": [{"name": f"s{k}", "asn": 65000} for k in range(1, 9)],
                  "leaf": [{"name": "l1", "asn": 65001, "hosts": [f"h{i}" for i in range(1, 9)]},
                           {"name": "l2", "asn": 65002, "hosts": ["h9"]}]})
    assert sorted(localrule.rotation(wide, f"h{i}") for i in range(1, 9)) == list(range(8))


@pytest.mark.parametrize("kind", ["pairs", "all-to-all"])
@pytest.mark.parametrize("per_conn", [1, 2, 3])
def test_local_rule_is_exact_on_symmetric_matrices_of_one_leaf_pair(kind, per_conn):
    """The issue's requirement, by simulation of the rule (the program is checked against the
    same rule in test_host_tc): any arrival order gives the best possible."""
    fab = load(LAB / "fabric.toml")
    qps = workloads.connections(kind, fab.hosts) * per_conn
    best = balance.best_figures(fab, qps)
    for seed in range(20):
        order = list(qps)
        random.Random(seed).shuffle(order)
        paths = localrule.simulate(fab, order)
        placed = [(s, d, p) for (s, d), p in zip(order, paths)]
        assert balance.figures(*balance.leaf_loads(fab, placed)) == pytest.approx(best)


# ---- releases after a change of weights (draft-fare-scale-up §3.1) ----------------------------

def test_release_targets_release_the_excess_rounded_up_and_move_nothing_else():
    from rlbcommon.weights import release_targets
    assert release_targets([2, 2, 2, 2], [1, 1, 1, 0.5], 8, 0, [1, 1, 1, 1]) == [3, 2, 2, 1]
    assert release_targets([3, 2, 2, 1], [1, 1, 1, 1], 8, 0, [1, 1, 1, 0.5]) == [2, 2, 2, 2]
    assert release_targets([250] * 4, [1, 1, 1, 0.5], 1000, 0, [1] * 4)[3] == 142


def test_grouped_release_targets_planes_then_sub_ports():
    from rlbcommon.weights import grouped_release_targets as g
    # the peer's plane 1 at half bandwidth: 64 x (1/4 - 1/7) = 6.86 -> 7 QPs leave plane 1
    t = g([8] * 8, [.5, .5, 1, 1, 1, 1, 1, 1], 2, 0, [1] * 8)
    assert sum(t[:2]) == 9 and sum(t) == 64 and abs(t[0] - t[1]) <= 1
    # a local sub-port down after the data plane moved its 8 QPs: already right, nothing moves
    now = [0, 9, 10, 9, 9, 9, 9, 9]
    assert g(now, [0, 1, 1, 1, 1, 1, 1, 1], 2, 0, [0, 1, 1, 1, 1, 1, 1, 1]) == now
    # ... and if nothing had moved yet: exactly its 8 move, one of them within the plane
    t = g([8] * 8, [0, 1, 1, 1, 1, 1, 1, 1], 2, 0, [1] * 8)
    assert t[0] == 0 and t[1] == 9 and sum(max(0, 8 - x) for x in t) == 8
    # recovery: back to 8 each, the fewest moves (8)
    assert g(now, [1] * 8, 2, 0, [0, 1, 1, 1, 1, 1, 1, 1]) == [8] * 8


def test_release_targets_against_brute_force():
    """For random counts and weights: every target within one of its share, sums right, and no
    target set within one of the shares moves fewer QPs unless it keeps a degraded member above
    its share rounded down."""
    import itertools
    import math
    import random
    from rlbcommon.weights import release_targets
    rnd = random.Random(7)
    for _ in range(300):
        n = rnd.randint(2, 4)
        counts = [rnd.randint(0, 6) for _ in range(n)]
        counts[0] += 0 if sum(counts) else 1
        total = sum(counts)
        before = [rnd.choice([0.5, 1, 2]) for _ in range(n)]
        after = [b * rnd.choice([0.5, 1, 1, 2]) for b in before]
        t = release_targets(counts, after, total, 0, before)
        exact = [w * total / sum(after) for w in after]
        assert sum(t) == total and all(math.floor(e + 1e-9) <= x <= math.ceil(e - 1e-9) for x, e in zip(t, exact))
        degraded = [after[i] / sum(after) < before[i] / sum(before) - 1e-12 and counts[i] > exact[i] + 1e-9
                    for i in range(n)]
        moves = sum(max(0, c - x) for c, x in zip(counts, t))
        for cand in itertools.product(*[range(math.floor(e + 1e-9), math.ceil(e - 1e-9) + 1) for e in exact]):
            if sum(cand) != total or any(d and c > math.floor(e + 1e-9) for d, c, e in zip(degraded, cand, exact)):
                continue
            assert moves <= sum(max(0, c - x) for c, x in zip(counts, cand))


def test_groups_are_freed_with_their_last_qp_and_weights_must_be_finite():
    """Weights differ per QP (a host's capacity changes, verbs peers): each weight ratio is a
    group, and a group whose QPs have all gone must go too, or a long-running coordinator grows
    without bound. An infinite weight once made a NaN-keyed group per QP."""
    p = Placement(3, 4)
    for i in range(200):
        p.add(i, 0, 1 + i % 2, weights=[1.0, 1.0 + i, 1.0, 0.5])
    assert len(p.groups) == 200
    p.solve()
    for i in range(200):
        p.remove(i)
    assert p.groups == {} and all(g == [] for side in p.at for g in side)
    for bad in ([math.inf, 1, 1, 1], [math.nan, 1, 1, 1], [-1, 1, 1, 1]):
        with pytest.raises(ValueError, match="finite non-negative"):
            p.add("x", 0, 1, weights=bad)
    assert p.groups == {}


def test_the_searchs_violation_steps_equal_the_violations_own_difference():
    """_dv (written out for speed) is the change of _wv when one QP turns from one colour to
    another, at loads under, within and over the targets, on full, slow and dead links."""
    rnd = random.Random(5)
    for _ in range(300):
        p = Placement(3, 4)
        for leaf in range(3):
            caps = [rnd.choice([0.0, 25.0, 40.0, 100.0]) for _ in range(4)]
            p.set_capacity(leaf, UP, caps)
            p.set_capacity(leaf, DOWN, caps)
        for _ in range(rnd.randrange(20)):
            a, b = rnd.sample(range(3), 2)
            p.add(object(), a, b, colour=rnd.randrange(4))
        p.targets()
        for side in (UP, DOWN):
            for v in range(3):
                p.load[side][v] = [rnd.randrange(6) for _ in range(4)]   # anywhere around the targets
                for gain, shed in itertools.permutations(range(4), 2):
                    ld = p.load[side][v]
                    want = (p._wv(side, v, gain, ld[gain] + 1) - p._wv(side, v, gain, ld[gain])
                            + p._wv(side, v, shed, ld[shed] - 1) - p._wv(side, v, shed, ld[shed]))
                    assert p._dv(side, v, gain, shed) == pytest.approx(want, abs=1e-12)
