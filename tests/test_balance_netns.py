"""The whole fabric balanced under many-to-many traffic, end to end: bird2, XDP switches, rlbhost
on every host reporting to a real rlbcoord on the management network; every leaf uplink and
spine downlink read from the spines' kernel counters while every host of a matrix sends at once."""
from __future__ import annotations

import contextlib
import random
import time
import urllib.request
from pathlib import Path

import pytest

from rlbcommon import coordapi, netns
from rlbfabric import balance, workloads
from rlbcoord import etcdtls, keys
from rlbhost.dataplane import HostDataplane
from rlblab.fabricgen import make_fabric
from rlblab.matrix import FORGET_S, report, run_matrix

from .conftest import fabric_lab, h1_to_h3_during, local_rule_off_the_best

pytestmark = pytest.mark.netns
LAB = Path(__file__).resolve().parent.parent / "lab"


@pytest.fixture(scope="module")
def default():
    with fabric_lab(LAB / "fabric.toml", "rlbbd", coordinator_tls=True) as lab:   # HTTPS, a certificate each
        yield lab


@pytest.fixture(scope="module")
def wide():
    with fabric_lab(LAB / "fabric-4x4.toml", "rlbbw") as lab:
        yield lab


def measured(lab, kind: str, per_conn: int, seed: int):
    conns = workloads.connections(kind, lab.hosts, random.Random(seed))
    r = run_matrix(lab, conns, per_conn, packets=150, seed=seed, bursts=2)
    time.sleep(FORGET_S)            # the next test's QPs meet no ghosts of these
    return r


@pytest.mark.parametrize("kind", ["pairs", "all-to-all", "ring"])
@pytest.mark.parametrize("per_conn", [1, 2, 3])
def test_default_fabric_local_rule_and_coordinator_reach_the_best(default, kind, per_conn):
    r = measured(default, kind, per_conn, seed=per_conn)
    best = r.best(default.fabric)
    print(f"\n{kind} x{per_conn}: best {best}, local (burst 1) {r.figures(0)}, coordinated {r.figures(1)}")
    for got in (r.figures(1), r.figures(0)):   # coordinated; and the local rule, exact here too
        assert got[0] <= best[0] + 0.05 and got[1] <= best[1] + 0.05, (got, best)


def test_hold_over_https_every_host_reports_for_itself_alone(default):
    """The default lab's coordinator serves HTTPS and reads each reporter from its certificate
    (the balance tests above ran through it): every host and leaf got in with its own, and a
    report about h1 shown with h2's certificate is refused."""
    s = default.coordinator_status()
    assert set(s["hosts"]) == set(default.hosts)
    assert s["http"]["identity"] == 0 and s["http"]["handshake"] == 0
    assert not s["dead_links"]                       # the leaves' link reports got in too
    h2 = etcdtls.client_file(default.coord_creds, keys.host_user("h2"))
    with netns.inside(default.ns("mon")):
        tls = coordapi.client_tls(default.coordinator_url, default.coordinator_ca, h2)
        with pytest.raises(coordapi.CoordinatorError, match="403"):
            coordapi.call(default.coordinator_url, coordapi.REPORT.format("h1"), {"paths": {}, "qps": []}, tls=tls)
    assert default.coordinator_status()["http"]["identity"] == 1


def diagnose(lab, unplaced: dict) -> str:
    """What the coordinator and the hosts said about QPs that got no placement in time."""
    s = lab.coordinator_status()
    out = [f"unplaced {unplaced}; coordinator: hosts {s['hosts']}, qps {s['qps']}, counters {s['counters']}"]
    for h in unplaced:
        if h in lab.hosts:
            with netns.inside(lab.ns(h)):
                metrics = urllib.request.urlopen("http://127.0.0.1:9472/metrics", timeout=5).read().decode()
            out.append(f"{h}: " + "; ".join(line for line in metrics.splitlines()
                                             if "coordinator" in line or "placements" in line or "ev_placed" in line))
    return "\n".join(out)


@pytest.mark.parametrize("kind", ["pairs", "all-to-all", "ring"])
@pytest.mark.parametrize("per_conn", [1, 3])
def test_wide_fabric_coordinated_reaches_the_best(wide, kind, per_conn):
    r = measured(wide, kind, per_conn, seed=10 + per_conn)
    best = r.best(wide.fabric)
    got = r.figures(1)
    print(f"\n{kind} x{per_conn}: best {best}, local (burst 1) {r.figures(0)}, coordinated {got}, "
          f"placed after {r.placed_after_s} s")
    assert got[0] <= best[0] + 0.05 and got[1] <= best[1] + 0.05, (got, best)
    assert r.placed_after_s is not None and r.placed_after_s < 1.0, diagnose(wide, r.unplaced)
    s = wide.coordinator_status()
    assert len(s["hosts"]) == 8 and s["over_target"] == 0


def test_wide_fabric_coordinator_fixes_what_the_local_rule_cannot(wide):
    """A random permutation where the hosts alone collide on a downlink (found with the local
    rule's model, which the program follows QP by QP): the coordinator brings it to the best."""
    fab = wide.fabric
    seed, conns = local_rule_off_the_best(fab)
    r = run_matrix(wide, conns, 1, packets=150, seed=seed, bursts=2)
    time.sleep(FORGET_S)
    best = r.best(fab)
    print(f"\npermutation (seed {seed}): best {best}, local {r.figures(0)}, coordinated {r.figures(1)}")
    assert max(r.figures(0)) >= max(best) + 0.8            # the model's prediction, measured
    assert r.figures(1)[0] <= best[0] + 0.05 and r.figures(1)[1] <= best[1] + 0.05


@contextlib.contextmanager
def l1_s4_down(wide):
    """l1's link to s4 down until the block ends, the coordinator told of it (and of its return)."""
    netns.run(wide.ns("l1"), "ip", "link", "set", "eth-s4", "down")
    try:
        deadline = time.time() + 3
        while wide.coordinator_status()["dead_links"] != ["l1/4"]:
            assert time.time() < deadline, wide.coordinator_status()["dead_links"]
            time.sleep(0.1)
        yield
    finally:
        netns.run(wide.ns("l1"), "ip", "link", "set", "eth-s4", "up")
    deadline = time.time() + 3
    while wide.coordinator_status()["dead_links"]:
        assert time.time() < deadline
        time.sleep(0.1)


def test_coordinator_avoids_a_dead_uplink_and_rebalances_when_it_returns(wide):
    with l1_s4_down(wide):
        conns = [("h1", "h3"), ("h2", "h4")]
        run_matrix(wide, conns, 3, packets=50, seed=77, bursts=2)
        s = wide.coordinator_status()
        assert s["links"]["l1"]["up"][3] == 0 and sorted(s["links"]["l1"]["up"][:3]) == [2, 2, 2]
        assert s["over_target"] == 0
    time.sleep(0.6)                 # two report periods: the hosts hear the new placements
    s = wide.coordinator_status()
    assert sorted(s["links"]["l1"]["up"]) == [1, 1, 2, 2]
    time.sleep(FORGET_S)


def test_all_to_all_with_a_link_down_every_leaf_reaches_the_best_over_its_live_links(wide):
    """l1's link to s4 down: l1's pairs share s1-s3, so every other leaf's QPs lean on s4 (FARE's
    even split per pair left 6.7/6.7/6.7/4 QPs on their links, 1.17 where 1.00 is possible)."""
    with l1_s4_down(wide):
        conns = workloads.connections("all-to-all", wide.hosts, random.Random(5))
        r = run_matrix(wide, conns, 2, packets=150, seed=5, bursts=2)
        best, got = r.best(wide.fabric), r.figures(1)
        print(f"\nall-to-all x2, l1-s4 down: best {best}, local {r.figures(0)}, coordinated {got}, placed after "
              f"{r.placed_after_s} s\n" + "\n".join(report(wide, r)) + f"\ncoordinator: {wide.coordinator_status()['links']}")
        assert r.dead == [("l1", 3)] and r.caps["l1"][3] == 0.0 and min(r.caps["l1"][:3]) > 0
        assert best == (1.0, 1.0)
        assert got[0] <= best[0] + 0.05 and got[1] <= best[1] + 0.05, (got, best, r.bursts[1])
    time.sleep(FORGET_S)


def test_coordinator_killed_mid_traffic_loses_nothing_and_the_local_rule_takes_over(default):
    """4 QPs h1 -> h3 at 2000 packets/s for 5 s; the coordinator is killed after 1 s. Every packet
    arrives; the hosts drop its placements after 3 s and new QPs follow the local rule again."""
    lab = default
    placed = {}

    def kill_after_placing():
        time.sleep(0.5)
        with netns.inside(lab.ns("h1")):
            placed["hd"] = HostDataplane(lab.ns("h1"))
            placed["n"] = len(placed["hd"].placements())
        lab.kill_agent("coordinator")

    sent, received, _ = h1_to_h3_during(lab, 2500, 2000, kill_after_placing, seed=99, payload_len=256)
    hd = placed["hd"]
    assert placed["n"] == 4                   # the coordinator placed them
    assert sent == 10000 and received == 10000
    deadline = time.time() + 6
    with netns.inside(lab.ns("h1")):
        while hd.placements():
            assert time.time() < deadline, "placements never dropped"
            time.sleep(0.2)
        placed_before = hd.stats()["reasons"]["ev_placed"]
        # new QPs now: the local rule (h1 starts at path 1) puts 4 QPs one per spine
        r = run_matrix(lab, [("h1", "h3")], 4, packets=50, seed=5, bursts=1)
        assert hd.stats()["reasons"]["ev_placed"] == placed_before
        hd.close()
    assert r.figures(0)[0] <= 1.02
    with open(lab.work / "agent-h1.log") as f:
        assert "placements dropped, deciding locally" in f.read()
    lab.start_coordinator()


# ---- churn: a new job's QPs start while the last job's are remembered --------------------------
CHURN = [("default", "pairs", 2), ("wide", "permutation", 2)]


class PathSampler:
    """The paths the hosts' conntrack gives each QP (first seen), sampled every 10 ms while a
    matrix runs: what a figure off the best is made of."""

    def __init__(self, lab, hosts):
        self.dps = {h: HostDataplane(lab.ns(h)) for h in hosts}
        self.seen: dict[str, dict] = {h: {} for h in hosts}
        self.stop = False

    def _run(self):
        while not self.stop:
            for h, dp in self.dps.items():
                try:
                    for q in dp.qps():
                        self.seen[h].setdefault((q["sport"], q["qp"]), (q["path"], round(q["idle_ms"])))
                except Exception:        # a read racing the agent's sweep: the next one
                    pass
            time.sleep(0.01)

    def __enter__(self):
        import threading
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop = True
        self.thread.join()
        for dp in self.dps.values():
            dp.close()

    def paths(self) -> dict[str, list]:
        return {h: sorted(v.items()) for h, v in self.seen.items()}


def churned(lab, kind: str, per_conn: int, gap_s: float, seed: int):
    conns = workloads.connections(kind, lab.hosts, random.Random(seed))
    with PathSampler(lab, sorted({s for s, _ in conns})) as sampler:
        r = run_matrix(lab, conns, per_conn, packets=150, seed=seed, bursts=2, churn_gap_s=gap_s)
    r.sampled = sampler.paths()
    time.sleep(FORGET_S)
    return r


@pytest.mark.parametrize("gap_s", [0.2, 0.6, 2.0])
@pytest.mark.parametrize("which, kind, per_conn", CHURN, ids=[c[0] for c in CHURN])
def test_churn_coordinated_new_qps_reach_the_best(request, which, kind, per_conn, gap_s):
    """The issue's scenario: job A's QPs ran and went idle; gap_s after its last packet job B
    starts on the same hosts with fresh QPs. B's second burst (its placements taken) must be
    within 0.05 of the best possible for B alone, uplinks and downlinks, whatever A left."""
    lab = request.getfixturevalue(which)
    r = churned(lab, kind, per_conn, gap_s, seed=int(gap_s * 10) + 3)
    best = r.best(lab.fabric)
    got = r.figures(1)
    print(f"\n{which} {kind} x{per_conn}, gap {gap_s} s: best {best}, local (burst 1) {r.figures(0)}, "
          f"coordinated {got}")
    assert got[0] <= best[0] + 0.05 and got[1] <= best[1] + 0.05, (got, best)


@pytest.mark.parametrize("which, kind, per_conn", CHURN, ids=[c[0] for c in CHURN])
def test_churn_local_rule_never_above_ecmp(request, which, kind, per_conn):
    """Without the coordinator, the same churn at every gap: the local rule's figure (the new
    QPs' first burst) is never above kernel ECMP's mean for that matrix (a random colour per QP,
    the model of a hash over fresh source ports)."""
    lab = request.getfixturevalue(which)
    lab.kill_agent("coordinator")
    try:
        time.sleep(3.5)              # the hosts drop the coordinator's placements after 3 s
        for gap_s in (0.2, 0.6, 2.0):
            seed = int(gap_s * 10) + 30
            r = churned(lab, kind, per_conn, gap_s, seed)
            ecmp = balance.random_figures(lab.fabric, r.qps)
            got = r.figures(0)
            print(f"\n{which} {kind} x{per_conn}, gap {gap_s} s, local rule: {got}, ECMP mean {ecmp}, "
                  f"best {r.best(lab.fabric)}")
            if max(got) > max(r.best(lab.fabric)) + 0.05:
                print(f"  paths (sport, qp) -> (path index, idle ms when first seen): {r.sampled}")
            assert got[0] <= ecmp[0] and got[1] <= ecmp[1], (gap_s, got, ecmp)
    finally:
        lab.start_coordinator()
        time.sleep(1.0)


# ---- an uneven fabric: two leaf-spine links at half speed, judged by utilisation ---------------
@pytest.fixture(scope="module")
def uneven(tmp_path_factory):
    f = tmp_path_factory.mktemp("uneven") / "fabric-uneven.toml"
    f.write_text(make_fabric(4, 3, 2, slow={(1, 2): 5000, (3, 4): 5000}))
    with fabric_lab(f, "rlbbu") as lab:
        yield lab


@pytest.mark.parametrize("kind, per_conn, churn", [("permutation", 1, None), ("ring", 1, None),
                                                   ("all-to-all", 1, None), ("permutation", 2, 0.6)])
def test_uneven_fabric_coordinated_reaches_the_best_by_utilisation(uneven, kind, per_conn, churn):
    """The issue's second fabric: 4 spines, 3 leaves, l1-s2 and l3-s4 at half speed. The old
    targets let a QP sit on a half-speed link while full-speed ones had room (1.99 by utilisation
    on permutations and rings with 1 QP per connection). Coordinated: within 0.05 of the best
    placement (found by trying them all); the local rule, with paths weighed by the fabric file's
    link speeds, never above kernel ECMP's mean."""
    seed = 7 + per_conn
    conns = workloads.connections(kind, uneven.hosts, random.Random(seed))
    r = run_matrix(uneven, conns, per_conn, packets=150, seed=seed, bursts=2, churn_gap_s=churn)
    time.sleep(FORGET_S)
    assert r.caps is not None
    best = r.best(uneven.fabric)
    ecmp = balance.random_figures(uneven.fabric, r.qps, caps=r.caps)
    print(f"\n{kind} x{per_conn}{f', churn {churn} s' if churn else ''}: best {best}, local (burst 1) "
          f"{r.figures(0)}, coordinated {r.figures(1)}, ECMP mean {ecmp}")
    got = r.figures(1)
    if got[0] > best[0] + 0.05 or got[1] > best[1] + 0.05:     # which links: for the failure's account
        print("\n".join(["burst 1 (local rule):", *report(uneven, r, 0), "burst 2:", *report(uneven, r, 1)]))
    assert got[0] <= best[0] + 0.05 and got[1] <= best[1] + 0.05, (got, best, r.placed_after_s, r.unplaced)
    local = r.figures(0)
    assert local[0] <= ecmp[0] and local[1] <= ecmp[1], (local, ecmp)
