"""The rail-only fabric kind, the h-score registry and the GPU agent's mapping of decisions to
first hops: pure logic, no lab (tests/test_rail_netns.py runs them on the wire)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from rlbcoord.hregistry import HRegistry
from rlbcoord.service import BadRequest, Refused
from rlbfabric.fabric import FabricError, parse
from rlbfabric.hscore import Gpu, SortedRails, decide
from rlbhost.dataplane import PortPath
from rlbhost.kinds.railonly import KEEP, RailGpuAgent, direct, paths_of

BASE = {"kind": "rail-only", "domains": 3, "rails": 4, "rail_mbps": 10, "domain_mbps": 40}


def fabric(**kw):
    return parse({"fabric": {**BASE, **kw}})


def test_a_rail_only_fabric_names_and_addresses_every_gpu():
    f = fabric()
    assert f.kind == "rail-only" and len(f.hosts) == 12 and [s.name for s in f.switches] == ["r1", "r2", "r3", "r4"]
    assert f.address("d3g4") == "fc00:3::4" and f.gpu("d3g4") == Gpu(3, 4)
    assert f.gpu_of("fc00:2::1") == Gpu(2, 1) and f.gpu_of("fc00:2::9") is None
    assert str(f.domain_net(2)) == "fc00:2::/64"
    hops = f.first_hops("d2g3")
    assert [(h.value, h.ifname, h.via) for h in hops] == [
        (1, "eth-rail", "rail"), (2, "eth-dom", "d2g1"), (3, "eth-dom", "d2g2"), (5, "eth-dom", "d2g4")]
    assert f.rail_ports(2) == [("eth-d1", "d1g2"), ("eth-d2", "d2g2"), ("eth-d3", "d3g2")]
    assert f.tau_s == 0.4 and f.delta == 0.0


@pytest.mark.parametrize("bad,msg", [
    ({"rails": 16}, "rails 16"),
    ({"domains": 1}, "domains 1"),
    ({"delta": 2}, "delta 2"),
    ({"delta": "wide"}, "delta 'wide'"),
    ({"prefix": "fc00:1"}, "one hextet"),
    ({"rail_mbps": 0}, "rail_mbps 0"),
    ({"tau_ms": True}, "tau_ms True"),
])
def test_bad_rail_only_fabrics_are_refused_clearly(bad, msg):
    with pytest.raises(FabricError, match=msg):
        fabric(**bad)


def test_leaf_spine_tables_in_a_rail_only_file_are_refused():
    with pytest.raises(FabricError, match=r"not \[\[spine\]\]"):
        parse({"fabric": BASE, "spine": [{"name": "s1", "asn": 1}]})
    with pytest.raises(FabricError, match="no GPU 'd9g1'"):
        fabric().gpu("d9g1")
    with pytest.raises(FabricError, match="no GPU 'd01g1'"):
        fabric().gpu("d01g1")


def load(tx=0.0, rx=0.0, dtx=0.0, drx=0.0):
    return {"rail": {"tx_bps": tx, "rx_bps": rx}, "domain": {"tx_bps": dtx, "rx_bps": drx}}


def test_the_registry_scores_a_rail_by_its_busiest_link_and_forgets_silent_gpus():
    now = [0.0]
    r = HRegistry(fabric(tau_ms=10), stale_s=2.0, clock=lambda: now[0])
    r.load("d1g2", load(tx=6e6))                 # 60 % of rail 2's 10 Mb/s, first sample: taken as is
    t = r.load("d2g2", load(rx=2e6, dtx=10e6))   # rail 2 busiest link still 60 %; domain 2 at 25 %
    assert t["rails"]["2"] == pytest.approx(0.4) and t["domains"]["2"] == pytest.approx(0.75)
    assert t["rails"]["1"] == 1.0 and "reporting" not in t           # the answer: scores only
    assert r.status()["reporting"] == ["d1g2", "d2g2"]
    now[0] = 3.0                                 # d1g2 silent for 3 s: only d2g2's 20 % counts
    t = r.load("d2g2", load(rx=2e6))
    assert t["rails"]["2"] == pytest.approx(0.8, abs=1e-3) and r.status()["reporting"] == ["d2g2"]
    assert r.status()["counters"] == {"reports": 3, "refused": 0, "bad": 0}


def test_a_dead_link_scores_full_and_an_element_nobody_reports_scores_zero():
    """A GPU whose rail link is dead reports no traffic on it: that used to read as an idle rail,
    the best one. And an element whose GPUs all went silent kept its last score for good."""
    now = [0.0]
    r = HRegistry(fabric(tau_ms=10), stale_s=2.0, clock=lambda: now[0])
    body = load()
    body["rail"]["up"] = False
    t = r.load("d1g3", body)
    assert t["rails"]["3"] == 0.0 and t["domains"]["1"] == 1.0
    r.load("d1g1", load(tx=1e6))
    now[0] = 1.0
    r.expire()
    assert r.status()["rails"]["1"] == pytest.approx(0.9)          # still reported: kept
    now[0] = 3.5                                                     # d1g1 silent 2.5 s
    r.expire()
    s = r.status()
    assert s["rails"]["1"] == 0.0 and s["reporting"] == []
    with pytest.raises(BadRequest):
        r.load("d1g1", {"rail": {"tx_bps": 0, "rx_bps": 0, "up": "no"}, "domain": {"tx_bps": 0, "rx_bps": 0}})


def test_the_registry_smooths_with_its_time_constant():
    now = [0.0]
    r = HRegistry(fabric(tau_ms=500), clock=lambda: now[0])
    r.load("d1g1", load())
    now[0] = 2.0
    h = r.load("d1g1", load(tx=10e6))["rails"]["1"]     # a full-load step, 2 s = 4 tau later
    assert h == pytest.approx(0.0183, abs=1e-3)          # e^-4: 98 % of the step followed


@pytest.mark.parametrize("gpu,body,exc", [
    ("d9g9", load(), Refused),
    ("d1g1", {"rail": {"tx_bps": -1, "rx_bps": 0}, "domain": {"tx_bps": 0, "rx_bps": 0}}, BadRequest),
    ("d1g1", {"rail": {"tx_bps": 0, "rx_bps": 0}}, BadRequest),
    ("d1g1", [], BadRequest),
])
def test_the_registry_refuses_bad_reports(gpu, body, exc):
    r = HRegistry(fabric())
    with pytest.raises(exc):
        r.load(gpu, body)
    assert r.status()["counters"]["reports"] == 0


def test_decisions_map_to_first_hops():
    src = Gpu(1, 1)
    rails = SortedRails({1: 0.4, 2: 0.5, 3: 0.8, 4: 1.0})
    doms = {1: 1.0, 2: 1.0, 3: 1.0}
    assert paths_of(decide(rails, doms, src, Gpu(2, 2)), Gpu(2, 2)) == [4]          # drd via rail 3
    assert paths_of(decide(rails, doms, src, Gpu(2, 2), 0.5), Gpu(2, 2)) == [4, 5]  # window: rails 3, 4
    assert paths_of(decide(rails, doms, src, Gpu(1, 3)), Gpu(1, 3)) == [4]          # d: to (1, 3) itself
    assert paths_of(decide(rails, doms, src, Gpu(3, 1)), Gpu(3, 1)) == [1]          # r
    flat = SortedRails({1: 1.0, 2: 0.9, 3: 0.9, 4: 0.9})
    assert paths_of(decide(flat, doms, src, Gpu(2, 2)), Gpu(2, 2)) == [1]           # rd: gamma 1 > 0.9
    assert paths_of(decide(flat, doms, Gpu(1, 2), Gpu(2, 1)), Gpu(2, 1)) == [2]     # dr: to (1, 1)
    assert direct(src, Gpu(2, 3)).kind == "rd" and direct(src, Gpu(1, 3)).kind == "d"


def test_the_agent_weights_the_chosen_hop_and_keeps_the_others_for_qps_in_flight():
    f = fabric()
    a = RailGpuAgent(None, f, "d1g1", None)
    a.carrier = {"eth-rail": True, "eth-dom": True}
    a.macs = {1: "02:00:00:00:00:01", 3: "02:00:00:00:00:03", 4: "02:00:00:00:00:04"}   # (1, 4) unknown
    assert [p.value for p in a.port_paths() if p.dmac] == [1, 3, 4]
    assert a.port_paths()[-1] == PortPath(5, "eth-dom", None, True)
    rails = SortedRails({1: 0.4, 2: 0.5, 3: 0.8, 4: 1.0})
    doms = {1: 1.0, 2: 1.0, 3: 1.0}
    w = a.weights({"d2g2": decide(rails, doms, Gpu(1, 1), Gpu(2, 2))})
    assert w == {"fc00:2::2/128": ({1: KEEP, 3: KEEP, 4: 1.0}, False)}
    # to (2, 3): m = gamma(dst) = 0.8, best fit rail 4, whose first hop (to (1, 4)) is unusable:
    # the direct path (own rail, rd) takes the QPs
    d = decide(rails, doms, Gpu(1, 1), Gpu(2, 3))
    assert (d.kind, d.rails) == ("drd", [4])
    assert a.weights({"d2g3": d}) == {"fc00:2::3/128": ({1: 1.0, 3: KEEP, 4: KEEP}, False)}


def test_without_the_registry_every_pair_takes_its_direct_path():
    import time
    a = RailGpuAgent(None, fabric(), "d1g1", "http://[::1]:1")
    assert {n: d.kind for n, d in a.decide_all().items() if n in ("d1g2", "d2g1", "d2g2")} == \
        {"d1g2": "d", "d2g1": "r", "d2g2": "rd"}
    a.table = {"rails": {"1": 0.4, "2": 0.5, "3": 0.8, "4": 1.0}, "domains": {"1": 1, "2": 1, "3": 1}, "delta": 0}
    a.table_at = time.monotonic()
    assert a.decide_all()["d2g2"].rails == [3]
    a.table_at -= 2.5                      # the registry silent for longer than 2 s: direct again
    assert a.decide_all()["d2g2"].kind == "rd"


def test_the_coordinator_serves_the_registry_over_http_and_rlbcoord_status_shows_it():
    import threading
    from typer.testing import CliRunner
    from rlbcommon import coordapi
    from rlbcoord.cli import app
    from rlbcoord.metrics import exposition
    from rlbcoord.service import make_server
    reg = HRegistry(fabric())
    server = make_server(reg, "::1", 0, exposition(reg))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = coordapi.url_for("::1", server.server_address[1])
        t = coordapi.call(url, coordapi.GPU_LOAD.format("d2g3"), load(tx=3e6, drx=20e6))
        assert t["rails"]["3"] == pytest.approx(0.7) and t["domains"]["2"] == pytest.approx(0.5)
        with pytest.raises(coordapi.CoordinatorError, match="403 'd9g9' is not a GPU"):
            coordapi.call(url, coordapi.GPU_LOAD.format("d9g9"), load())
        out = CliRunner().invoke(app, ["status", "--url", url])
        assert out.exit_code == 0, out.output
        assert "1 GPUs reporting" in out.output and "3: 0.700" in out.output and "2: 0.500" in out.output
        import urllib.request
        metrics = urllib.request.urlopen(url + "/metrics", timeout=5).read().decode()
        assert 'rlb_coord_hscore{element="rail",id="3"} 0.7' in metrics
        assert 'rlb_coord_reports_total{result="refused"} 1.0' in metrics
    finally:
        server.shutdown()
        server.server_close()


def test_a_rail_gpu_learns_its_neighbours_macs_again_after_a_link_loses_carrier():
    """A link that comes back may lead to another device (a replaced switch, a re-created port):
    the MACs learnt over it are forgotten when it loses carrier, and asked for again."""
    from types import SimpleNamespace
    from rlbfabric.kinds.railonly import DOMAIN_IF, RAIL_IF
    from rlbhost.kinds.railonly import RailGpuAgent
    a = RailGpuAgent.__new__(RailGpuAgent)
    a.hops = [SimpleNamespace(value=1, ifname=RAIL_IF), SimpleNamespace(value=2, ifname=DOMAIN_IF)]
    a.macs = {1: "02:00:00:00:00:01", 2: "02:00:00:00:00:02"}
    a._counters = None
    a._links = lambda: {RAIL_IF: {"up": False, "tx": 0, "rx": 0}, DOMAIN_IF: {"up": True, "tx": 0, "rx": 0}}
    a.measure()
    assert a.macs == {2: "02:00:00:00:00:02"}


def test_the_coordinator_on_etcd_is_refused_for_a_kind_without_one():
    """rlbcoord run --etcd on a rail-only fabric: one line naming the kinds that have a
    coordinator on etcd, exit status 2, before anything is started."""
    lab = Path(__file__).resolve().parent.parent / "lab"
    r = subprocess.run([sys.executable, "-m", "rlbcoord.cli", "run", "--fabric", str(lab / "rail-only.toml"),
                        "--etcd", "http://127.0.0.1:1", "--port", "1"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2, r.stderr
    assert "a rail-only fabric has no coordinator on etcd (kinds that have one: clos); run without it" in r.stderr
