"""The coordinator over its real HTTP API (a server thread on loopback): placements that balance
the fabric, refusals of strangers and bad input, leaf link reports, silent hosts forgotten,
metrics, and the host agent's client against it (with a fake data plane: the client's own logic)."""
from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
from collections import Counter
from pathlib import Path

import pytest

from rlbcommon import coordapi
from rlbcoord.service import Coordinator, make_server
from rlbcoord import kinds  # noqa: F401 - each kind registers its coordinator and metrics
from rlbcoord.metrics import exposition
from rlbfabric.fabric import load

FABRIC = load(Path(__file__).resolve().parent.parent / "lab" / "fabric.toml")
IID = {"h1": "::a:1", "h2": "::a:2", "h3": "::a:3", "h4": "::a:4"}


def addr(host: str, k: int) -> str:
    leaf, port = FABRIC.leaf_of_host(host)
    return str(FABRIC.host_prefixes(leaf, port)[k - 1].network_address + int(IID[host].split(":")[-1], 16))


def paths(host: str) -> dict:
    return {str(k): addr(host, k) for k in range(1, 5)}


def report(host: str, qps: list[tuple[str, int, int, int]], weights=None) -> dict:
    """qps: (peer host, sport, qp, current path)."""
    return {"paths": paths(host), "weights": weights or [{"prefix": "::/0", "weights": {"1": 1, "2": 1, "3": 1, "4": 1}}],
            "qps": [{"peer": addr(p, 1), "sport": s, "qp": q, "path": k, "bytes": 1000} for p, s, q, k in qps]}


class Clock:
    t = 100.0

    def __call__(self):
        return self.t


@pytest.fixture
def coord():
    clock = Clock()
    c = Coordinator(FABRIC, host_timeout_s=5.0, clock=clock)
    server = make_server(c, "::1", 0, exposition(c))
    t = threading.Thread(target=server.serve_forever, daemon=True)
    t.start()
    c.url = coordapi.url_for("::1", server.server_address[1])
    c.test_clock = clock
    yield c
    server.shutdown()
    server.server_close()


def placements(reply) -> dict:
    return {(p["peer"], p["sport"], p["qp"]): p["path"] for p in reply["placements"]}


def test_two_hosts_that_both_start_on_path_1_are_spread_over_all_spines(coord):
    """The issue's worst case: h1->h3 and h2->h4, 2 QPs each, both hosts' local rule on paths 1,2."""
    r1 = coordapi.call(coord.url, coordapi.REPORT.format("h1"), report("h1", [("h3", 50000, 1, 1), ("h3", 50001, 2, 2)]))
    r2 = coordapi.call(coord.url, coordapi.REPORT.format("h2"), report("h2", [("h4", 50000, 3, 1), ("h4", 50001, 4, 2)]))
    r1 = coordapi.call(coord.url, coordapi.REPORT.format("h1"), report("h1", [("h3", 50000, 1, 1), ("h3", 50001, 2, 2)]))
    got = sorted(list(placements(r1).values()) + list(placements(r2).values()))
    assert got == [1, 2, 3, 4]
    s = coordapi.call(coord.url, coordapi.STATUS)
    assert s["links"]["l1"]["up"] == [1, 1, 1, 1] and s["links"]["l2"]["down"] == [1, 1, 1, 1]
    assert s["balance"] == {"up": 1.0, "down": 1.0, "best_up": 1.0, "best_down": 1.0}
    assert s["qps"] == {"fabric": 4, "local": 0, "newest": 4}
    assert s["balance_newest"] == {"up": 1.0, "down": 1.0, "best_up": 1.0, "best_down": 1.0}


def test_qps_within_a_leaf_get_no_placement(coord):
    r = coordapi.call(coord.url, coordapi.REPORT.format("h1"), report("h1", [("h2", 50000, 1, 1)]))
    assert r["placements"] == []
    assert coordapi.call(coord.url, coordapi.STATUS)["qps"] == {"fabric": 0, "local": 1, "newest": 0}


def test_strangers_and_bad_input_are_refused(coord):
    with pytest.raises(coordapi.CoordinatorError, match="403.*not in the fabric"):
        coordapi.call(coord.url, coordapi.REPORT.format("h9"), report("h1", []))
    body = report("h1", [])
    body["paths"]["1"] = addr("h3", 1)                     # claims h3's address
    with pytest.raises(coordapi.CoordinatorError, match="403.*not an address of h1"):
        coordapi.call(coord.url, coordapi.REPORT.format("h1"), body)
    for bad in ({"paths": "x"}, {**report("h1", []), "qps": [{"peer": "nope", "sport": 1, "qp": 1}]},
                {**report("h1", []), "qps": [{"peer": addr("h3", 1), "sport": 70000, "qp": 1}]},
                {**report("h1", []), "weights": [{"prefix": "bad"}]}):
        with pytest.raises(coordapi.CoordinatorError, match="400"):
            coordapi.call(coord.url, coordapi.REPORT.format("h1"), bad)
    req = urllib.request.Request(coord.url + coordapi.REPORT.format("h1"), data=b"{not json",
                                 headers={"Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req, timeout=2)
    assert e.value.code == 400
    with pytest.raises(coordapi.CoordinatorError, match="403.*not a leaf"):
        coordapi.call(coord.url, coordapi.LINKS.format("s1"), {"ports": {}})
    with pytest.raises(coordapi.CoordinatorError, match="403.*no uplinks"):
        coordapi.call(coord.url, coordapi.LINKS.format("l1"), {"ports": {"eth-h1": False}})
    c = coordapi.call(coord.url, coordapi.STATUS)["counters"]
    assert c["refused"] == 4 and c["bad"] == 5 and c["reports"] == 0


def test_dead_uplink_gets_no_qps_and_its_return_rebalances(coord):
    qps = [("h3", 50000 + i, i, 1) for i in range(8)]
    coordapi.call(coord.url, coordapi.REPORT.format("h1"), report("h1", qps))
    assert coordapi.call(coord.url, coordapi.LINKS.format("l1"),
                         {"ports": {"eth-s1": True, "eth-s2": True, "eth-s3": True, "eth-s4": False}}) == {"changed": ["eth-s4"]}
    r = coordapi.call(coord.url, coordapi.REPORT.format("h1"), report("h1", qps))
    got = sorted(placements(r).values())
    assert 4 not in got and [got.count(k) for k in (1, 2, 3)] in ([3, 3, 2], [3, 2, 3], [2, 3, 3])
    assert coordapi.call(coord.url, coordapi.STATUS)["dead_links"] == ["l1/4"]
    coordapi.call(coord.url, coordapi.LINKS.format("l1"), {"ports": {"eth-s4": True}})
    r = coordapi.call(coord.url, coordapi.REPORT.format("h1"), report("h1", qps))
    assert sorted(placements(r).values()) == [1, 1, 2, 2, 3, 3, 4, 4]


def test_zero_weight_path_is_avoided_for_that_destination(coord):
    w = [{"prefix": "::/0", "weights": {"1": 1, "2": 1, "3": 1, "4": 1}},
         {"prefix": "fc00:2::/32", "weights": {"1": 1, "2": 0, "3": 1, "4": 1}}]
    r = coordapi.call(coord.url, coordapi.REPORT.format("h1"), report("h1", [("h3", 50000 + i, i, 2) for i in range(6)], w))
    assert 2 not in placements(r).values()


def test_silent_host_is_forgotten_and_ended_qps_leave(coord):
    coordapi.call(coord.url, coordapi.REPORT.format("h1"), report("h1", [("h3", 1, 1, 1), ("h3", 2, 2, 1)]))
    coordapi.call(coord.url, coordapi.REPORT.format("h2"), report("h2", [("h4", 1, 1, 1)]))
    assert coordapi.call(coord.url, coordapi.STATUS)["qps"]["fabric"] == 3
    coordapi.call(coord.url, coordapi.REPORT.format("h1"), report("h1", [("h3", 1, 1, 1)]))   # one QP ended
    assert coordapi.call(coord.url, coordapi.STATUS)["qps"]["fabric"] == 2
    coord.test_clock.t += 6
    coordapi.call(coord.url, coordapi.REPORT.format("h1"), report("h1", [("h3", 1, 1, 1)]))
    coord.expire()                                       # the service does this every second
    s = coordapi.call(coord.url, coordapi.STATUS)
    assert list(s["hosts"]) == ["h1"] and s["qps"]["fabric"] == 1 and s["counters"]["hosts_expired"] == 1


def test_metrics(coord):
    coordapi.call(coord.url, coordapi.REPORT.format("h1"), report("h1", [("h3", 1, 1, 1), ("h3", 2, 2, 1)]))
    body = urllib.request.urlopen(coord.url + "/metrics", timeout=2).read().decode()
    lines = {line.split(" ")[0]: float(line.split(" ")[1]) for line in body.splitlines() if line and line[0] != "#"}
    assert lines['rlb_coord_qps{kind="fabric"}'] == 2
    assert lines['rlb_coord_link_qps{colour="1",leaf="l1",side="up"}'] + lines['rlb_coord_link_qps{colour="2",leaf="l1",side="up"}'] == 2
    assert lines['rlb_coord_balance{of="placed",side="up"}'] == 2.0     # 2 QPs on 4 uplinks
    assert lines['rlb_coord_balance_newest{of="placed",side="up"}'] == 2.0   # both active: the newest
    assert lines['rlb_coord_reports_total{result="ok"}'] == 1
    assert json.loads(urllib.request.urlopen(coord.url + "/healthz", timeout=2).read()) == {"ok": True}


# ---- the host agent's client ------------------------------------------------------------------

class FakeHostDataplane:
    """What the client reads and writes of the host data plane, in memory."""

    class P:
        def __init__(self, index, value, address):
            self.index, self.value, self.address, self.valid = index, value, address, True

    def __init__(self, host, qps):
        self._paths = [self.P(k - 1, k, addr(host, k)) for k in range(1, 5)]
        self._qps, self.placed = qps, {}
        self.sinks = []                   # who hears of the QPs a sweep removes as idle

    def on_idle(self, sink):
        self.sinks.append(sink)

    def sweep(self, idle):
        """A sweep that removed `idle` from conntrack."""
        for sink in self.sinks:
            sink(idle)

    def paths(self):
        return self._paths

    def qps(self):
        return self._qps

    def verbs_qps(self):
        return getattr(self, "_verbs", [])

    def weights(self):
        return [{"prefix": "::/0", "weights": {k: 1.0 for k in range(1, 5)}}]

    def placements(self):
        return dict(self.placed)

    def set_placements(self, want):
        self.placed = dict(want)
        return len(want), 0

    import contextlib

    @contextlib.contextmanager
    def locked(self):
        yield


def test_client_reports_remembers_idle_qps_and_falls_back(coord):
    from rlbhost.coordclient import CoordinatorClient
    live = [{"peer": addr("h3", 1), "sport": 50000 + i, "qp": i, "path": 0, "idle_ms": 1, "active": True, "bytes": 10}
            for i in range(4)]
    dp = FakeHostDataplane("h1", live)
    client = CoordinatorClient(dp, "h1", coord.url, fallback_s=0.0)
    assert client.report_once() == 4
    assert sorted(dp.placed.values()) == [0, 1, 2, 3]             # path indexes, one per spine
    dp._qps = []                                                   # idle: swept from conntrack
    client.report_once()
    assert len(dp.placed) == 4                                     # remembered, still placed
    client.url = "http://[::1]:1"                                  # coordinator gone
    client._failed(coordapi.CoordinatorError("gone"))
    assert dp.placed == {} and client.counters["fallbacks"] == 1


def test_client_reports_a_qp_the_sweep_removed_before_it_looked(coord):
    """A burst shorter than the report period: the agent's sweep drops the QP's idle entry before
    the client reads the table; the client still learns it from the sweep and gets a placement."""
    import time as _t
    from rlbhost.coordclient import CoordinatorClient
    dp = FakeHostDataplane("h1", [])
    client = CoordinatorClient(dp, "h1", coord.url)
    dp.sweep({(addr("h3", 1), 50001, 5): {"path": 2, "bytes": 900,
                                          "last_ns": _t.clock_gettime_ns(_t.CLOCK_MONOTONIC) - 250_000_000}})
    assert client.report_once() == 1 and client._idle == {}
    assert list(dp.placed) == [(addr("h3", 1), 50001, 5)]
    assert client.memory[(addr("h3", 1), 50001, 5)]["active"] is False


def test_hold_idle_qps_are_kept_only_by_a_client_and_at_most_idle_max(coord):
    """Without a coordinator nobody keeps the sweep's idle QPs (the host's table grew with every QP
    ever idle before); a client keeps at most IDLE_MAX between two reports, whatever the sweeps
    hand it while its reports stall."""
    from rlbhost.coordclient import IDLE_MAX, CoordinatorClient
    from rlbhost.dataplane import HostDataplane
    assert not hasattr(HostDataplane(), "swept") and HostDataplane()._idle_sinks == []
    dp = FakeHostDataplane("h1", [])
    client = CoordinatorClient(dp, "h1", coord.url)
    for n in range(3):
        dp.sweep({(addr("h3", 1), 50000 + n, q): {"path": 0, "bytes": 1, "last_ns": 0}
                  for q in range(IDLE_MAX // 2)})
    assert len(client._idle) == IDLE_MAX and IDLE_MAX >= 4096
    client.body()
    assert client._idle == {}


# ---- QPs placed through verbs (rlbhost/verbs/): fixed, and the loads a host places new ones by --------
def verbs_report(host: str, fixed: list[tuple[str, int, int]], peers=()) -> dict:
    """fixed: (peer host, QP number, path) of QPs placed through verbs, as the deciding end reports them."""
    body = report(host, [])
    body["qps"] = [{"peer": addr(p, 1), "sport": 0, "qp": q, "path": k, "bytes": 0, "fixed": True} for p, q, k in fixed]
    body["peers"] = [addr(p, 1) for p in peers]
    return body


def test_verbs_qps_are_never_moved_and_get_no_placement_but_count_on_their_links(coord):
    # four verbs QPs h1 -> h3 all on path 1: the coordinator could spread them, but cannot move them
    r = coordapi.call(coord.url, coordapi.REPORT.format("h1"), verbs_report("h1", [("h3", q, 1) for q in range(4)]))
    assert r["placements"] == []
    assert r["links"] == {"leaf": "l1", "up": {"load": [4, 0, 0, 0], "cap": [10000.0] * 4},
                          "down": {"l2": {"load": [4, 0, 0, 0], "cap": [10000.0] * 4}}}
    # a new TC-seen QP of h2 -> h4 is placed around them
    body = report("h2", [("h4", 50000, 9, 1)])
    body["qps"][0]["path"] = None
    r2 = coordapi.call(coord.url, coordapi.REPORT.format("h2"), body)
    assert placements(r2)[(addr("h4", 1), 50000, 9)] != 1
    # a peer the host is about to place QPs towards: its leaf's downlinks come back too
    r3 = coordapi.call(coord.url, coordapi.REPORT.format("h3"), verbs_report("h3", [], peers=["h1"]))
    assert set(r3["links"]["down"]) == {"l1"} and r3["links"]["up"]["load"][0] == 0


def test_the_client_reports_the_verbs_qps_it_decided_as_fixed_and_places_new_ones_by_the_loads(coord):
    """The host's client: the verbs QPs its agent decided (not those the peer decided, which the
    peer reports; not address handles) go out as fixed; the answer's loads reach the view the
    rendezvous chooses new paths with."""
    from rlbhost.coordclient import CoordinatorClient
    from rlbhost.dataplane import VerbsQp
    from rlbhost.verbs.advice import FabricView
    dp = FakeHostDataplane("h1", [])
    h3 = addr("h3", 1)
    dp._verbs = [VerbsQp(h3, addr("h3", 2), 0x11, 0x21, 1, 0, 1, flags=1),      # decided here, path 2
                 VerbsQp(h3, addr("h3", 1), 0x12, 0x22, 0, 0, 1, flags=0),      # decided by h3
                 VerbsQp(h3, addr("h3", 3), 0x13 | 1 << 24, 0, 2, 0, 1, flags=1 | 2)]   # an address handle
    view = FabricView(FABRIC, "h1")
    client = CoordinatorClient(dp, "h1", coord.url, view=view)
    view.best(h3, {1, 2, 3, 4})                                      # asked about: its downlinks come back
    body = client.body()
    assert [q for q in body["qps"] if q.get("fixed")] == [{"peer": h3, "sport": 0, "qp": 0x21, "path": 2,
                                                             "bytes": 0, "fixed": True}]
    assert body["peers"] == [h3]
    client.report_once()
    assert view.links["up"]["load"] == [0, 1, 0, 0] and view.links["down"]["l2"]["load"] == [0, 1, 0, 0]
    assert view.best(addr("h4", 1), {1, 2, 3, 4}) == {1, 3, 4}      # path 2 holds the fixed QP


def test_a_fixed_qp_without_its_path_is_refused(coord):
    body = verbs_report("h1", [("h3", 1, 1)])
    body["qps"][0]["path"] = None
    with pytest.raises(coordapi.CoordinatorError, match="fixed QP needs its path"):
        coordapi.call(coord.url, coordapi.REPORT.format("h1"), body)


def test_the_coordinators_loads_choose_a_new_verbs_qps_path_and_count_what_was_placed_since():
    from rlbhost.verbs.advice import FabricView
    clock = Clock()
    view = FabricView(FABRIC, "h1", clock=clock)
    assert view.best(addr("h3", 1), {1, 2, 3, 4}) is None            # no answer yet: the local rule
    cap = [10000.0] * 4
    view.answered({"leaf": "l1", "up": {"load": [1, 0, 2, 0], "cap": cap},
                   "down": {"l2": {"load": [0, 3, 0, 0], "cap": [10000.0, 10000.0, 10000.0, 0.0]}}}, clock.t)
    # path 4's downlink is dead, 2 has 3 QPs into l2, 1 and 3 carry more on l1's uplinks than 2 and 4
    assert view.best(addr("h3", 1), {1, 2, 3, 4}) == {1}
    view.placed(addr("h3", 1), 1)                                     # counted until the next answer
    assert view.best(addr("h4", 1), {1, 2, 3, 4}) == {1, 3}
    assert view.peer_list() == [addr("h3", 1), addr("h4", 1)]
    assert view.best(addr("h2", 1), {1, 2}) is None                  # same leaf: no fabric link
    clock.t += 4
    assert view.best(addr("h3", 1), {1, 2, 3, 4}) is None            # stale: the local rule


def test_weights_that_are_not_finite_are_refused(coord):
    for w in ("Infinity", "NaN", -1):
        body = report("h1", [("h3", 50000, 1, 1)], weights=[{"prefix": "::/0", "weights": {"1": w, "2": 1}}])
        data = json.dumps(body).replace('"Infinity"', "Infinity").replace('"NaN"', "NaN").encode()
        req = urllib.request.Request(coord.url + coordapi.REPORT.format("h1"), data=data,
                                     headers={"Content-Type": "application/json"})
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(req, timeout=2)
        assert e.value.code == 400 and b"finite" in e.value.read()
    assert coordapi.call(coord.url, coordapi.STATUS)["qps"]["fabric"] == 0


def test_a_writer_of_placements_is_told_every_host_whose_placements_changed():
    """take_changed(): the hosts reported or forgotten, and those whose QPs the placement moved
    without them reporting (a dead uplink of their leaf); nobody else (what etcd's writer
    compares, instead of every host of the fabric)."""
    c = Coordinator(FABRIC, host_timeout_s=1e9)
    c.apply_reports({"h1": report("h1", [("h3", 50000 + i, i, 1) for i in range(8)]),
                     "h3": report("h3", [("h1", 40000, 1, 1)])})
    assert c.take_changed() == {"h1", "h3"} and c.take_changed() == set()
    before = {k: p for k, p in c.all_placements()["h1"].items()}
    assert sorted(before.values()) == [1, 1, 2, 2, 3, 3, 4, 4]
    c.links("l1", {"ports": {"eth-s4": False}})                 # l1's fourth uplink dies
    assert c.take_changed() == {"h1"}                           # h1's two QPs there moved; h3 is on l2
    assert 4 not in c.all_placements({"h1"})["h1"].values()
    c.apply_reports({"h3": None})
    assert c.take_changed() == {"h3"} and "h3" not in c.all_placements()


def test_single_qps_of_a_known_host_cost_their_own_reading_not_the_whole_report(monkeypatch):
    """apply_reports' `changes`: a QP written, one gone and one unreadable, of a host whose report
    was read: only those three are read, the bad one alone is refused, the placement follows."""
    c = Coordinator(FABRIC, host_timeout_s=1e9)
    qps = [("h3", 50000 + i, i, 1) for i in range(32)]
    c.apply_reports({"h1": report("h1", qps)})
    assert c.knows("h1") and not c.knows("h2")
    read = []
    real = c._qp
    monkeypatch.setattr(c, "_qp", lambda *a: read.append(a[2]) or real(*a))
    h3 = addr("h3", 1)
    new = {"peer": h3, "sport": 60000, "qp": 99, "path": 2, "active": True}
    bad = c.apply_reports({}, {"h1": {(h3, 60000, 99): new, (h3, 50000, 0): None}})
    assert bad == {} and len(read) == 1                          # the new QP; the gone one costs no reading
    keys_ = c.hosts["h1"]["keys"]
    assert len(keys_) == 32 and ("h1", h3, 60000, 99) in keys_ and ("h1", h3, 50000, 0) not in keys_
    assert sorted(Counter(c.all_placements()["h1"].values()).values()) == [8, 8, 8, 8]
    bad = c.apply_reports({}, {"h1": {(h3, 60001, 100): {"peer": h3, "sport": 70000, "qp": 100}}})
    assert "sport must be a whole number 0-65535" in bad["h1"] and len(c.hosts["h1"]["keys"]) == 32


def test_a_host_above_its_qps_limit_is_refused_and_keeps_its_earlier_state(coord):
    """host_qps_max bounds what one host's report or keys put in the model: over HTTP a report
    with more is refused (400), through etcd a change that would leave more; the host keeps the
    QPs placed before, and a change that stays within is taken."""
    coord.host_qps_max = 8
    h3 = addr("h3", 1)
    post = coordapi.REPORT.format("h1")
    with pytest.raises(coordapi.CoordinatorError, match="400.*9 QPs: more than the 8"):
        coordapi.call(coord.url, post, report("h1", [("h3", 50000 + i, i, 1) for i in range(9)]))
    assert "h1" not in coord.hosts
    assert len(placements(coordapi.call(coord.url, post, report("h1", [("h3", 50000 + i, i, 1) for i in range(8)])))) == 8
    one = {"peer": h3, "sport": 60000, "qp": 99, "path": 2}
    bad = coord.apply_reports({}, {"h1": {(h3, 60000, 99): one}})
    assert "9 QPs: more than the 8" in bad["h1"]
    assert len(coord.hosts["h1"]["keys"]) == 8 and ("h1", h3, 60000, 99) not in coord.hosts["h1"]["keys"]
    assert coord.apply_reports({}, {"h1": {(h3, 60000, 99): one, (h3, 50000, 0): None}}) == {}   # one out, one in
    assert len(coord.hosts["h1"]["keys"]) == 8 and ("h1", h3, 60000, 99) in coord.hosts["h1"]["keys"]
    assert sum(coord.placer.loads()[0][0]) == 8                  # h1's leaf's uplinks carry its 8 alone
