"""Dashboards checked against a real Prometheus (Debian's) scraping a running namespace lab:
every panel's query must return data."""
from __future__ import annotations

import json
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from rlbcommon import netns
from rlbmonitor import dashboards

from .conftest import fabric_lab

pytestmark = pytest.mark.netns
ROOT = Path(__file__).resolve().parent.parent
FABRIC = ROOT / "lab" / "fabric-2x2.toml"


def promql(lab, expr: str) -> list:
    url = "http://127.0.0.1:9090/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    with netns.inside(lab.ns("mon")):
        body = json.loads(urllib.request.urlopen(url, timeout=5).read())
    assert body["status"] == "success", body
    return body["data"]["result"]


@pytest.fixture(scope="module")
def lab():
    with fabric_lab(FABRIC, "rlbmt", monitor=True) as lab:
        lab.start_prometheus()
        yield lab


def test_committed_dashboards_are_the_generated_ones():
    for name, fn in dashboards.DASHBOARDS.items():
        committed = json.loads((ROOT / "grafana" / name).read_text())
        assert committed == fn(), f"grafana/{name} is stale: python -m rlbmonitor.dashboards grafana"


def test_prometheus_scrapes_every_agent(lab):
    deadline = time.time() + 20
    while time.time() < deadline:
        up = promql(lab, 'up{job=~"rlbswitch|rlbhost"}')
        if len(up) == 6 and all(r["value"][1] == "1" for r in up):
            break
        time.sleep(0.5)
    assert sorted(r["metric"]["instance_node"] for r in up) == ["h1", "h2", "l1", "l2", "s1", "s2"]
    assert all(r["value"][1] == "1" for r in up)


def test_every_panel_query_returns_data(lab):
    lab.run_qps("h1", "h2", 2, 200, seed=1, rate_pps=400)   # a second of traffic
    queries = [q for fn in dashboards.LEAF_SPINE.values() for q in dashboards.panel_queries(fn())]
    deadline = time.time() + 30          # rate() needs two scrapes in its window
    while True:
        empty = [title for title, expr in queries if not promql(lab, dashboards.as_grafana_sends(expr))]
        if not empty or time.time() > deadline:
            break
        time.sleep(1)
    took = promql(lab, 'max by (job) (scrape_duration_seconds{job=~"rlbswitch|rlbhost"})')
    print("\nslowest scrape per job (s):", {r["metric"]["job"]: round(float(r["value"][1]), 3) for r in took})
    assert not empty, f"panels without data: {empty}"
    # and the numbers mean something: the leaf's uplinks carried the QPs (once a scrape after
    # the burst has landed: scrapes are 2 s apart)
    deadline = time.time() + 15
    while True:
        tx = promql(lab, 'rlb_switch_port_tx_bytes_total{node="rlbmt-l1", interface=~"eth-s.*"}')
        if (len(tx) == 2 and all(float(r["value"][1]) > 10_000 for r in tx)) or time.time() > deadline:
            break
        time.sleep(0.5)
    assert len(tx) == 2 and all(float(r["value"][1]) > 10_000 for r in tx), tx
    qps = promql(lab, 'rlb_host_path_active_qps{node="rlbmt-h1"}')
    assert len(qps) == 2


def test_template_variables_resolve(lab):
    variables = [v for fn in dashboards.LEAF_SPINE.values() for v in fn()["templating"]["list"]
                 if v["type"] == "query"]
    assert {v["name"] for v in variables} == {"node", "interface", "host"}
    for var in variables:
        q = var["query"]
        metric = q[len("label_values("):].rsplit(",", 1)[0].replace("$node", ".*")
        assert promql(lab, metric), var["name"]
