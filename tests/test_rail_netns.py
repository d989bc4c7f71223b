"""The rail-only fabric end to end (lab/rail-only.toml: 4 domains x 4 GPUs, 4 XDP rail switches,
bridge domains, GPUs relaying; the coordinator as h-score registry): the registered h-score
scenarios (what `rlblab scenario NAME` runs), QPs in flight keeping their path when the decision
changes, and the metrics."""
from __future__ import annotations

import time
import urllib.request
from pathlib import Path

import pytest

from rlbcommon import netns
from rlbcommon.constants import METRICS_PORT

from .conftest import fabric_lab, scenario_passes

FABRIC = Path(__file__).resolve().parent.parent / "lab" / "rail-only.toml"


@pytest.fixture(scope="module")
def lab():
    with fabric_lab(FABRIC, "rlbro", timeout=90, monitor=True) as lab:
        yield lab


def test_qps_take_the_best_fit_remote_rail(lab):
    checks = scenario_passes("hscore-remote-rail", lab)
    per_rail = [c.measured[0] for c in checks if "bytes per rail" in c.what]
    assert len(per_rail) == 2 and carried(per_rail[0], 16 * 5 * 316) == 3 and carried(per_rail[1], 16 * 5 * 316) == 4


def carried(rx: dict[int, int], qp_bytes: int) -> int | None:
    """The one rail whose switch got the QPs' bytes from domain 1 (each other rail got less
    than one datagram's worth: neighbour discovery between a relay and its rail switch also
    counts there), else None."""
    full = [k for k, v in rx.items() if qp_bytes <= v < qp_bytes + 316]
    rest = [v for k, v in rx.items() if k not in full]
    return full[0] if len(full) == 1 and all(v < 316 for v in rest) else None


def test_no_remote_rail_when_a_gamma_exceeds_one(lab):
    scenario_passes("hscore-no-remote-rail", lab)


def test_delta_spreads_qps_over_the_window(lab):
    scenario_passes("hscore-spray", lab)


def test_qps_in_flight_keep_their_rail_when_the_decision_changes(lab):
    """Rail 1 at 20 %: G1 -> G2 is dr (gamma(G1) 0.8 < gamma(G2) 1; first hop (1, 2), rail 2).
    Then rails 1, 2, 3 at 60, 50, 20 %: the decision becomes drd via rail 3; QPs still active
    stay on rail 2, new ones take rail 3. (Loads keep every comparison clear of the noise.)"""
    from rlblab.kinds.railonly import _settle, rail_loads
    per_qp = 5 * 316                     # 5 datagrams of 256 bytes payload: 316 bytes on the wire
    lab.cli("d1g1", "config", "--expiry-ms", "60000")

    def settled(loads):
        took, s = _settle(lab, {"rails": {k: 1 - loads.get(k, 0) for k in range(1, 5)}})
        assert took <= 2.0, s
        time.sleep(0.3)

    try:
        with rail_loads(lab, {1: 0.2}):
            settled({1: 0.2})
            assert lab.why("d1g1", "d2g2")["peers"]["d2g2"]["kind"] == "dr"
            b = lab.rail_rx(1)
            lab.run_qps("d1g1", "d2g2", 8, 5, seed=91)
            mid = lab.rail_rx(1)
        assert carried({k: mid[k] - b[k] for k in b}, 8 * per_qp) == 2
        with rail_loads(lab, {1: 0.6, 2: 0.5, 3: 0.2}):
            settled({1: 0.6, 2: 0.5, 3: 0.2})
            assert lab.why("d1g1", "d2g2")["peers"]["d2g2"]["rails"] == [3]
            lab.run_qps("d1g1", "d2g2", 8, 5, seed=91)       # the same QPs, still active
            old = lab.rail_rx(1)
            lab.run_qps("d1g1", "d2g2", 8, 5, seed=92)       # new QPs
            new = lab.rail_rx(1)
        assert carried({k: old[k] - mid[k] for k in b}, 8 * per_qp) == 2
        assert carried({k: new[k] - old[k] for k in b}, 8 * per_qp) == 3
    finally:
        lab.cli("d1g1", "config", "--expiry-ms", "200")


def _metrics(lab, addr: str, port: int) -> str:
    with netns.inside(lab.ns("mon")):
        with urllib.request.urlopen(f"http://[{addr}]:{port}/metrics", timeout=5) as r:
            return r.read().decode()


def test_metrics_show_h_scores_ratios_and_path_types(lab):
    coord = _metrics(lab, f"{lab.MGMT}1", METRICS_PORT["coordinator"])
    assert 'rlb_coord_hscore{element="rail",id="4"}' in coord
    assert 'rlb_coord_gpus_reporting 16.0' in coord
    host = _metrics(lab, lab.mgmt_addr("d1g1"), METRICS_PORT["host"])
    types = {line.split('kind="')[1].split('"')[0]: float(line.split()[-1])
             for line in host.splitlines() if line.startswith("rlb_host_path_type_peers{")}
    assert types["d"] == 3 and types["r"] == 3 and types["d"] + types["r"] + types["rd"] + types["dr"] + types["drd"] == 15
    assert "rlb_host_h_ratio{" in host


def test_why_names_a_missing_destination(lab):
    with pytest.raises(RuntimeError, match="no destination 'd9g9'"):
        lab.cli("d1g1", "why", "d9g9")
    out = lab.cli("d1g1", "why", "d2g2")
    assert "d2g2" in out and "first hop" in out


def test_the_rails_dashboard_has_data_for_every_panel(lab):
    """Last (Prometheus scraping every agent each second is load the timed tests need not
    share): with rails 1 and 2 loaded (so remote rails are in use), every query of
    grafana/rlb-rails.json returns data from the running lab."""
    import json
    import urllib.parse
    from rlblab.kinds.railonly import rail_loads
    from rlbmonitor import dashboards

    def promql(expr):
        url = "http://127.0.0.1:9090/api/v1/query?" + urllib.parse.urlencode({"query": expr})
        with netns.inside(lab.ns("mon")):
            return json.loads(urllib.request.urlopen(url, timeout=5).read())["data"]["result"]

    lab.start_prometheus()
    with rail_loads(lab, {1: 0.6, 2: 0.5}):
        lab.run_qps("d1g1", "d2g2", 8, 50, seed=5, rate_pps=400)
        queries = dashboards.panel_queries(dashboards.rails_dashboard())
        deadline = time.time() + 40
        while True:
            empty = [t for t, q in queries if not promql(dashboards.as_grafana_sends(q))]
            if not empty or time.time() > deadline:
                break
            time.sleep(1)
        assert not empty, f"panels without data: {empty}"
        h = {r["metric"]["id"]: float(r["value"][1]) for r in promql('rlb_coord_hscore{element="rail"}')}
        assert h["1"] < 0.6 and h["2"] < 0.7 and h["4"] > 0.9
        assert len(promql("rlb_host_h_ratio")) == 16
        # GPUs weight per destination: their unused default weights must not look like idle paths
        assert not promql('ALERTS{alertname=~"RlbPathAtZeroWeight|RlbPathUnusable"}')
