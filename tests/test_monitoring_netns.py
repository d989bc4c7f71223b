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
    # as `rlblab up --monitor` runs it: the coordinators on etcd, one leading, both scraped
    with fabric_lab(FABRIC, "rlbmt", monitor=True, etcd=True) as lab:
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
    deadline = time.time() + 20
    while time.time() < deadline:                      # the coordinators: one leads, one stands by
        leading = {r["metric"]["instance_node"]: r["value"][1] for r in promql(lab, "rlb_coord_etcd_leading")}
        if sorted(leading.values()) == ["0", "1"]:
            break
        time.sleep(0.5)
    assert sorted(leading) == ["coordinator-c1", "coordinator-c2"] and sorted(leading.values()) == ["0", "1"], leading


def test_scrapes_leave_no_open_files_behind(lab):
    """Every agent answers 200 scrapes and holds no more files after them than before. The
    switch agent once kept a file descriptor per scrape (a netlink object shared with the
    metrics server's thread per request): under systemd's limit of 1024 its scrapes, lock
    files and map reads failed after about half an hour at 2 s scrapes."""
    import os
    from rlbcommon.constants import METRICS_PORT
    scrapes = 200

    def open_files(pid: int) -> int:
        return len(os.listdir(f"/proc/{pid}/fd"))

    agents = {n: (METRICS_PORT["switch"] if n[0] in "ls" else METRICS_PORT["host"])
              for n in ("l1", "l2", "s1", "s2", "h1", "h2")}
    before = {n: open_files(lab.agents[n].pid) for n in agents}
    with netns.inside(lab.ns("mon")):
        for n, port in agents.items():
            url = f"http://[{lab.mgmt_addr(n)}]:{port}/metrics"
            for _ in range(scrapes):
                body = urllib.request.urlopen(url, timeout=5).read()
            assert b"rlb_" in body, n
    grown = {n: open_files(lab.agents[n].pid) - before[n] for n in agents}
    print("\nopen files after", scrapes, "scrapes, more than before:", grown)
    assert all(g < 10 for g in grown.values()), grown


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


def test_committed_alert_rules_are_the_generated_ones_and_promtool_accepts_them(tmp_path):
    import subprocess
    from rlbmonitor import alerts
    committed = json.loads((ROOT / "prometheus" / "rlb-alerts.yml").read_text())
    assert committed == alerts.rules(), "prometheus/rlb-alerts.yml is stale: python -m rlbmonitor.alerts prometheus"
    res = subprocess.run(["promtool", "check", "rules", str(ROOT / "prometheus" / "rlb-alerts.yml")],
                         capture_output=True, text=True)
    assert res.returncode == 0 and f"SUCCESS: {len(alerts.RULES)} rules found" in res.stdout, res.stdout + res.stderr
    bad = tmp_path / "bad.yml"           # and promtool is a real check: a broken rule fails it
    bad.write_text(json.dumps({"groups": [{"name": "x", "rules": [{"alert": "A", "expr": "up =="}]}]}))
    assert subprocess.run(["promtool", "check", "rules", str(bad)], capture_output=True).returncode != 0


def test_alerts_fire_on_real_faults(lab):
    """The lab's Prometheus loads the rules; a BGP session taken down (l1's link to s1) and a
    usable path weighted 0 by hand (h1's path 2) each raise their alert (pending: its `for` has
    started; the rule matched the fault), and nothing else is alerting before."""
    with netns.inside(lab.ns("mon")):
        rules = json.loads(urllib.request.urlopen("http://127.0.0.1:9090/api/v1/rules", timeout=5).read())
    loaded = {r["name"]: r["health"] for g in rules["data"]["groups"] for r in g["rules"]}
    from rlbmonitor import alerts
    assert loaded == {name: "ok" for name, *_ in alerts.RULES}

    def active(name):
        return promql(lab, f'ALERTS{{alertname="{name}"}}')

    def wait_for(name, timeout=30):
        deadline = time.time() + timeout
        while time.time() < deadline:
            got = active(name)
            if got:
                return got
            time.sleep(0.5)
        return []

    assert not active("RlbBgpSessionDown") and not active("RlbPathAtZeroWeight")
    from rlbcommon.netns import run
    run(lab.ns("l1"), "ip", "link", "set", "eth-s1", "down")
    try:
        got = wait_for("RlbBgpSessionDown")
        assert {r["metric"]["node"] for r in got} >= {"rlbmt-l1"}, got
    finally:
        run(lab.ns("l1"), "ip", "link", "set", "eth-s1", "up")
    weights = json.loads(lab.cli("h1", "weights", "show", "--json"))
    default = next(w for w in weights if w["prefix"] == "::/0")["weights"]
    lab.cli("h1", "weights", "set", *[f"{p}={0 if str(p) == '2' else w}" for p, w in default.items()])
    try:
        got = wait_for("RlbPathAtZeroWeight")
        assert [(r["metric"]["node"], r["metric"]["path"]) for r in got] == [("rlbmt-h1", "2")], got
    finally:
        lab.cli("h1", "weights", "set", *[f"{p}={w}" for p, w in default.items()])


def test_no_coordinator_leading_is_alerted_and_clears_when_one_leads_again(lab):
    """etcd stopped: neither coordinator can hold the leader key, RlbNoCoordinatorLeads is raised
    (pending: its `for` has started); etcd back, one leads again and the alert is gone."""
    def active():
        return promql(lab, 'ALERTS{alertname="RlbNoCoordinatorLeads"}')

    def wait(cond, timeout, what):
        deadline = time.time() + timeout
        while not cond():
            assert time.time() < deadline, f"waited {timeout} s for {what}"
            time.sleep(0.5)
    assert not active()
    lab.kill_agent("etcd")
    try:
        wait(lambda: bool(active()), 30, "the alert")
        assert [float(r["value"][1]) for r in promql(lab, "rlb_coord_etcd_leading")] == [0.0, 0.0]
    finally:
        with netns.inside(lab.ns("mon")):
            lab.etcd_server.start()
            lab.agents["etcd"] = lab.etcd_server.proc
    wait(lambda: sorted(r["value"][1] for r in promql(lab, "rlb_coord_etcd_leading")) == ["0", "1"], 30,
         "one coordinator to lead again")
    wait(lambda: not active(), 30, "the alert to clear")


def test_a_passive_spine_port_is_up_when_its_dynamic_session_is():
    from rlbswitch.metrics import sessions_up
    assert sessions_up({"l1": "Passive", "l1_1": "Established", "l2": "Passive", "s1": "Established",
                        "s2": "Connect", "x_1": "Established"}) == \
        {"l1": True, "l2": False, "s1": True, "s2": False, "x_1": True}
