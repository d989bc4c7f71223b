"""Balance under churn and on uneven fabrics, in the coordinator's model and over its report path
(no namespaces): QPs active now are placed as if remembered idle ones did not exist, remembered
ones fill the room left, a returning QP is placed again; fabrics generated at random (spines,
hosts per leaf, half-speed links) are placed as well as brute force can."""
from __future__ import annotations

import ipaddress
import random
import tomllib

import pytest

from rlbfabric import balance, workloads
from rlbcoord.service import Coordinator
from rlbfabric.fabric import parse
from rlbfabric.policy.localrule import path_weights
from rlbfabric.policy.qpplacer import QpInfo, QpPlacer
from rlblab.fabricgen import make_fabric, random_fabric

from .test_coordinator import FABRIC, addr, paths


class Clock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self):
        return self.t


def body(host, qps, active=True, idle_ms=0.0):
    """qps: (peer host, sport, qp, path or None)."""
    return {"paths": paths(host), "weights": [{"prefix": "::/0", "weights": {"1": 1, "2": 1, "3": 1, "4": 1}}],
            "qps": [{"peer": addr(p, 1), "sport": s, "qp": q, "path": k, "bytes": 1000, "active": active,
                     "idle_ms": idle_ms} for p, s, q, k in qps]}


def placed(reply):
    return {(p["peer"], p["sport"], p["qp"]): p["path"] for p in reply["placements"]}


@pytest.mark.parametrize("gap_s", [0.2, 0.6, 2.0])
def test_new_qps_are_placed_as_if_the_idle_ones_did_not_exist(gap_s):
    """Job A (h1->h3, h2->h4, 2 QPs each) ran, placed one per spine; it ends; gap_s later job B
    starts on the same hosts, its QPs where the local rule put them (h1's and h2's on paths 1,
    2). B alone must get one QP per uplink of l1, whatever A's placements left; A fills the rest."""
    clock = Clock()
    c = Coordinator(FABRIC, clock=clock)
    a = {"h1": [("h3", 40000 + i, 100 + i, 1 + i) for i in range(2)],
         "h2": [("h4", 41000 + i, 200 + i, 1 + i) for i in range(2)]}
    for h, q in a.items():
        c.report(h, body(h, q))
    for h, q in a.items():
        c.report(h, body(h, q))
    assert c.placer.link_loads()["l1"]["up"] == [1, 1, 1, 1]
    # B's QPs start on A's old paths, in the worst way for a union: every B QP of h1 where one of
    # h2's A QPs sits
    a_paths = {h: [placed(c.report(h, body(h, q)))[(addr(p, 1), s, n)] for p, s, n, _ in q] for h, q in a.items()}
    clock.t += gap_s + 0.3
    b = {"h1": [("h3", 50000 + i, 300 + i, a_paths["h2"][i]) for i in range(2)],
         "h2": [("h4", 51000 + i, 400 + i, a_paths["h1"][i]) for i in range(2)]}
    idle = (gap_s + 0.3) * 1000
    for _ in range(2):
        for h in ("h1", "h2"):
            r = c.report(h, {**body(h, b[h]), "qps": body(h, b[h])["qps"] + body(h, a[h], False, idle)["qps"]})
    new = c.placer.link_loads(tiers=1)
    assert new["l1"]["up"] == [1, 1, 1, 1] and new["l2"]["down"] == [1, 1, 1, 1], new
    assert c.placer.link_loads()["l1"]["up"] == [2, 2, 2, 2]       # A in the room left
    s = c.status()
    assert s["qps"]["newest"] == 4 and s["balance_newest"]["up"] == 1.0
    # B idles between its bursts (1.2 s), A longer: B keeps its placement, A stays behind it
    before = {h: placed(c.report(h, {**body(h, b[h], False, 1200), "qps": body(h, b[h], False, 1200)["qps"]
                                      + body(h, a[h], False, idle + 1200)["qps"]})) for h in ("h1", "h2")}
    clock.t += 1.2
    for h in ("h1", "h2"):
        r = c.report(h, {**body(h, b[h], False, 1200), "qps": body(h, b[h], False, 1200)["qps"]
                         + body(h, a[h], False, idle + 1200)["qps"]})
        assert {k: v for k, v in placed(r).items() if k[1] >= 50000} == \
            {k: v for k, v in before[h].items() if k[1] >= 50000}
    assert c.placer.link_loads(tiers=1)["l1"]["up"] == [1, 1, 1, 1]


def test_a_returning_qp_is_placed_again_if_its_path_would_unbalance_the_active_ones():
    clock = Clock()
    c = Coordinator(FABRIC, clock=clock)
    b = [("h3", 50000 + i, 300 + i, None) for i in range(4)]
    c.report("h1", body("h1", b))
    on = placed(c.report("h1", body("h1", b)))
    assert sorted(on.values()) == [1, 2, 3, 4]
    old = ("h3", 40000, 100, None)
    clock.t += 1.0
    r = placed(c.report("h1", {**body("h1", b), "qps": body("h1", b)["qps"] + body("h1", [old], False, 3000)["qps"]}))
    assert c.placer.generation(("h1", addr("h3", 1), 40000, 100)) == 1
    # it returns on path 1, beside the active QP placed there: the active set is 5 QPs over 4
    # links, so at most one link carries 2 (it may stay) -- now make B 3 QPs: 4 links, 4 QPs
    b3 = b[:3]
    clock.t += 0.3
    moved_from = on[(addr("h3", 1), b3[0][1], b3[0][2])]
    back = ("h3", 40000, 100, moved_from)
    r = placed(c.report("h1", {**body("h1", b3), "qps": body("h1", b3)["qps"] + body("h1", [back])["qps"]}))
    r = placed(c.report("h1", {**body("h1", b3), "qps": body("h1", b3)["qps"] + body("h1", [back])["qps"]}))
    assert c.placer.generation(("h1", addr("h3", 1), 40000, 100)) == 0
    assert sorted(r.values()) == [1, 2, 3, 4]          # the returning QP took the free link


# ---- uneven fabrics, generated ----------------------------------------------------------------

def parse_text(text: str):
    return parse(tomllib.loads(text))


def figure(fab, placer, pairs_colours) -> float:
    """The worst leaf's max/mean by utilisation, uplinks and downlinks alike."""
    up, down = balance.leaf_loads(fab, pairs_colours)
    caps = {lf.name: placer.caps(lf.name) for lf in fab.leaves}
    return max(balance.figures(up, down, caps))


def brute_force(fab, placer, qps) -> float:
    return balance.searched_best(fab, qps, {lf.name: placer.caps(lf.name) for lf in fab.leaves}, limit=10 ** 6)


def coordinated(fab, qps, presets=None) -> tuple[float, QpPlacer]:
    pl = QpPlacer(fab)
    every = {k: 1.0 for k in range(1, fab.paths + 1)}
    for i, (s, d) in enumerate(qps):
        pl.add(i, QpInfo(s, d, None if presets is None else presets[i], every))
    pl.solve()
    return figure(fab, pl, [(s, d, pl.colour(i) if i in pl.qps else None)
                            for i, (s, d) in enumerate(qps)]), pl


def test_generated_uneven_fabrics_are_placed_as_well_as_brute_force():
    """Random 3-stage fabrics (2-4 spines, 2-3 leaves, 1-3 hosts per leaf, a quarter of the
    leaf-spine links at half speed), random matrices (permutation, ring, all-to-all, pairs) at 1-3
    QPs per connection, small enough to try every placement."""
    rnd = random.Random(28)
    tried = worse = 0
    excess = []
    while tried < 150:
        fab = parse_text(random_fabric(rnd))
        kind = rnd.choice(["permutation", "ring", "all-to-all", "pairs"])
        if kind == "pairs" and len(fab.hosts) % 2:
            continue
        qps = workloads.connections(kind, fab.hosts, rnd) * rnd.randint(1, 3)
        pl0 = QpPlacer(fab)
        crossing = [q for q in qps if pl0.leaf_of_host[q[0]] != pl0.leaf_of_host[q[1]]]
        if not crossing or fab.colours() ** len(crossing) > 5000:
            continue
        tried += 1
        got, pl = coordinated(fab, qps, [rnd.randint(1, fab.paths) for _ in qps])
        best = brute_force(fab, pl, qps)
        assert got >= best - 1e-9
        excess.append(got - best)
        worse += got > best + 1e-9
    print(f"\n{tried} cases: {worse} above brute force; mean excess {sum(excess) / len(excess):.3f}, "
          f"worst {max(excess):.3f}")
    # measured: 1 of 150 above brute force, mean excess 0.003 (the targets before water-filling: 55,
    # mean 0.392, worst 3.5)
    assert worse <= 3 and max(excess) <= 0.5


def test_no_qp_sits_on_a_half_speed_link_while_the_full_speed_ones_have_room():
    """The issue's case: 4 spines, 3 leaves, two leaf-spine links at half speed; permutations and
    rings with one QP per connection measured 1.99 by utilisation with the old targets."""
    fab = parse_text(make_fabric(4, 3, 2, slow={(1, 2): 5000, (3, 4): 5000}))
    for seed in range(20):
        for kind in ("permutation", "ring"):
            qps = workloads.connections(kind, fab.hosts, random.Random(seed))
            got, pl = coordinated(fab, qps, [1] * len(qps))
            best = brute_force(fab, pl, qps)
            assert got <= best + 1e-9, (kind, seed, got, best, pl.link_loads())


def test_the_uneven_fabrics_all_to_all_reaches_the_best_whatever_order_the_hosts_report_in():
    """The namespace test's matrix (test_balance_netns, all-to-all x1 on 4 spines, 3 leaves, two
    half-speed links), its QPs arriving host by host, a solve after each, as the coordinator
    takes reports. Measured before the sideways steps (Placement._escape): 6 orders of 300 stuck
    at 1.50 (a leaf's uplinks [2, 3, 2, 1], no two- or three-colour chain lowering the violation);
    the netns test met one of them in CI."""
    fab = parse_text(make_fabric(4, 3, 2, slow={(1, 2): 5000, (3, 4): 5000}))
    conns = workloads.connections("all-to-all", fab.hosts, random.Random(8))
    caps = balance.link_caps(fab)
    best = balance.best_figures(fab, conns, caps)
    assert best == (1.3125, 1.3125)
    every = {k: 1.0 for k in range(1, fab.paths + 1)}
    pl0 = QpPlacer(fab)

    def weights(src, dst):        # the host's weights for its peer's prefix (the local rule's)
        net = pl0.host_nets[dst][0]
        return next((w for p, w in path_weights(fab, src).items() if net.subnet_of(ipaddress.ip_network(p))), every)
    table = {(s, d): weights(s, d) for s, d in conns}
    stuck = []
    for order in range(300):
        rnd = random.Random(order)
        pl = QpPlacer(fab)
        hosts = list(fab.hosts)
        rnd.shuffle(hosts)
        for h in hosts:
            for i, (s, d) in enumerate(conns):
                if s == h:
                    pl.add(i, QpInfo(s, d, rnd.randint(1, fab.paths), table[(s, d)]))
            pl.solve()
        got = balance.figures(*balance.leaf_loads(fab, [(s, d, pl.colour(i) if i in pl.qps else None)
                                                         for i, (s, d) in enumerate(conns)]), caps)
        if max(got) > max(best) + 1e-9:
            stuck.append((order, got, pl.link_loads()))
    assert not stuck, stuck[:3]


def test_the_room_left_is_filled_lowest_utilisation_first():
    """An older generation fills the links the newer one left emptiest, by capacity."""
    fab = parse_text(make_fabric(4, 2, 1, slow={(1, 4): 5000}))
    pl = QpPlacer(fab)
    every = {k: 1.0 for k in range(1, 5)}
    for i in range(3):
        pl.add(("new", i), QpInfo("h1", "h2", 1, every))
    for i in range(5):
        pl.add(("old", i), QpInfo("h1", "h2", 1, every, last=0.0))
    pl.solve(now=10.0)
    assert pl.link_loads(tiers=1)["l1"]["up"] in ([1, 1, 1, 0],)     # the half-speed link stays empty
    total = pl.link_loads()["l1"]["up"]
    assert sorted(total[:3]) == [2, 2, 3] and total[3] == 1, total     # 8 QPs: the best there is


def test_hosts_weigh_paths_to_each_leaf_by_the_fabric_files_link_speeds():
    """The local rule's weights when no operator set any: per destination leaf, each path's
    narrowest leaf-spine link; leaves reached over equal paths keep ::/0's weights."""
    fab = parse_text(make_fabric(4, 3, 2, slow={(1, 2): 5000, (3, 4): 5000}))
    assert path_weights(fab, "h1") == {"fc00:2::/32": {1: 1.0, 2: 0.5, 3: 1.0, 4: 1.0},
                                       "fc00:3::/32": {1: 1.0, 2: 0.5, 3: 1.0, 4: 0.5}}
    assert path_weights(fab, "h3") == {"fc00:1::/32": {1: 1.0, 2: 0.5, 3: 1.0, 4: 1.0},
                                       "fc00:3::/32": {1: 1.0, 2: 1.0, 3: 1.0, 4: 0.5}}
    assert path_weights(parse_text(make_fabric(4, 2, 2)), "h1") == {}
    # the coordinator takes such weights as what they are (path capacity), not twice: 3 QPs over
    # a 10/5 Gb/s pair of paths split 2/1 whether the host weighs its paths or not
    two = parse_text(make_fabric(2, 2, 1, slow={(1, 2): 5000}))
    for weights in ({1: 1.0, 2: 1.0}, {1: 1.0, 2: 0.5}):
        pl = QpPlacer(two)
        for i in range(3):
            pl.add(i, QpInfo("h1", "h2", None, weights))
        pl.solve()
        assert pl.link_loads()["l1"]["up"] == [2, 1], weights


def test_generations_from_last_packet_times():
    """Active QPs and idle ones within the gap of them: the newest generation; a cluster further
    back the next; everything older the last. An idle QP whose last packet is now sorts with the
    active ones."""
    fab = parse_text(make_fabric(4, 2, 1))
    pl = QpPlacer(fab)
    every = {k: 1.0 for k in range(1, 5)}
    lasts = {"a": None, "b": 100.0, "c": 99.95, "d": 99.5, "e": 99.45, "f": 98.0, "g": 90.0}
    for k, t in lasts.items():
        pl.add(k, QpInfo("h1", "h2", None, every, last=t))
    pl.solve(now=100.0)
    assert {k: pl.generation(k) for k in lasts} == {"a": 0, "b": 0, "c": 0, "d": 1, "e": 1, "f": 2, "g": 2}
    # 0.2 s later d is active again: it joins a (the newest); b and c, idle since 0.2 s, are
    # behind them now, and e further back
    pl.update("d", QpInfo("h1", "h2", pl.path("d"), every, last=None))
    pl.solve(now=100.2)
    assert {k: pl.generation(k) for k in lasts} == {"a": 0, "b": 1, "c": 1, "d": 0, "e": 2, "f": 2, "g": 2}
    assert sorted(pl.link_loads(tiers=1)["l1"]["up"]) == [0, 0, 1, 1]
    assert sorted(pl.link_loads(tiers=2)["l1"]["up"]) == [1, 1, 1, 1]
