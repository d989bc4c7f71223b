"""Grafana dashboards (JSON model, schema 38) for RLB fabrics, generated here: `python -m
rlbmonitor.dashboards grafana/` writes the files committed under grafana/. Every panel's query
is evaluated against a real Prometheus scraping a namespace lab in the test suite."""
from __future__ import annotations

import json
import sys
from pathlib import Path

DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}


def _panel(pid: int, title: str, expr: str, legend: str, unit: str, x: int, y: int, w: int = 12,
           kind: str = "timeseries", h: int = 8) -> dict:
    return {"id": pid, "type": kind, "title": title, "datasource": DATASOURCE,
            "gridPos": {"x": x, "y": y, "w": w, "h": h},
            "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
            "targets": [{"refId": "A", "datasource": DATASOURCE, "expr": expr, "legendFormat": legend}]}


def _variables() -> list[dict]:
    def query(name, q, label):
        return {"name": name, "label": label, "type": "query", "datasource": DATASOURCE,
                "query": {"query": q, "refId": name}, "definition": q, "refresh": 2,
                "includeAll": True, "multi": True, "allValue": ".*", "current": {}}
    return [
        {"name": "datasource", "type": "datasource", "query": "prometheus", "label": "Prometheus"},
        query("node", "label_values(rlb_switch_port_tx_bytes_total, node)", "switch"),
        query("interface", 'label_values(rlb_switch_port_tx_bytes_total{node=~"$node"}, interface)', "port"),
        query("host", "label_values(rlb_host_path_active_qps, node)", "host"),
    ]


def _dashboard(uid: str, title: str, tags: list[str], variables: list[dict], panels: list[dict]) -> dict:
    return {"uid": uid, "title": title, "schemaVersion": 38, "version": 1, "editable": True,
            "refresh": "5s", "time": {"from": "now-15m", "to": "now"}, "tags": tags,
            "templating": {"list": variables}, "panels": panels}


def fabric_dashboard() -> dict:
    sel = 'node=~"$node", interface=~"$interface"'
    panels = [
        _panel(1, "Per-port utilisation (tx / capacity)",
               f"rate(rlb_switch_port_tx_bytes_total{{{sel}}}[$__rate_interval]) "
               f"/ on(node, interface) rlb_switch_port_capacity_bytes_per_second{{{sel}}}",
               "{{node}} {{interface}}", "percentunit", 0, 0),
        _panel(2, "Per-port tx (bits/s)",
               f"8 * rate(rlb_switch_port_tx_bytes_total{{{sel}}}[$__rate_interval])",
               "{{node}} {{interface}}", "bps", 12, 0),
        _panel(3, "Per-path load (next hop packets/s)",
               'rate(rlb_switch_nexthop_packets_total{node=~"$node"}[$__rate_interval])',
               "{{node}} via {{nexthop}}", "pps", 0, 8),
        _panel(4, "QPs per path per host", 'rlb_host_path_active_qps{node=~"$host"}',
               "{{node}} path {{path}}", "short", 12, 8),
        _panel(5, "Host tx per path (bits/s)",
               '8 * rate(rlb_host_path_tx_bytes_total{node=~"$host"}[$__rate_interval])',
               "{{node}} path {{path}}", "bps", 0, 16),
        _panel(6, "DLB reassignments and failovers (/s)",
               'rate(rlb_switch_packets_total{node=~"$node", reason=~"ev_dlb_reassign|ev_failover|ev_weighted_fallback"}[$__rate_interval])',
               "{{node}} {{reason}}", "pps", 12, 16),
        _panel(7, "QP releases by host agents (/s)",
               'rate(rlb_host_packets_total{node=~"$host", reason="ev_released"}[$__rate_interval])',
               "{{node}}", "short", 0, 24),
        _panel(8, "Packets handed to the kernel, by reason (/s)",
               'rate(rlb_switch_packets_total{node=~"$node", reason=~"pass_.*"}[$__rate_interval])',
               "{{node}} {{reason}}", "pps", 12, 24),
        _panel(9, "BGP sessions established", 'rlb_switch_bgp_session_up{node=~"$node"}',
               "{{node}} {{session}}", "short", 0, 32, kind="stat"),
        _panel(10, "Routes by mode", 'rlb_switch_routes{node=~"$node"}', "{{node}} {{mode}}", "short",
               12, 32, kind="stat"),
        _panel(11, "Agents up", 'up{job=~"rlbswitch|rlbhost|rlbcoord"}', "{{job}} {{instance_node}}", "short",
               0, 40, kind="stat"),
        _panel(12, "bird -> XDP sync time (s)", 'rlb_switch_last_sync_seconds{node=~"$node"}',
               "{{node}}", "s", 12, 40),
        _panel(13, "bird control socket errors (/s)",
               'rate(rlb_switch_bird_errors_total{node=~"$node"}[$__rate_interval])', "{{node}}", "short", 0, 48),
        _panel(14, "Port liveness", f'rlb_switch_port_up{{{sel}}}', "{{node}} {{interface}}", "short",
               12, 48, kind="stat"),
        _panel(15, "Coordinator: QPs placed per leaf uplink", 'rlb_coord_link_qps{side="up"}',
               "{{leaf}} uplink {{colour}}", "short", 0, 56),
        _panel(16, "Coordinator: worst leaf max/mean, placed and best possible", "rlb_coord_balance",
               "{{side}} {{of}}", "short", 12, 56),
        _panel(17, "Hosts reaching the coordinator", 'rlb_host_coordinator_reachable{node=~"$host"}',
               "{{node}}", "short", 0, 64, kind="stat"),
        _panel(18, "Coordinator placement time (s per placement)",
               "rate(rlb_coord_solve_seconds_total[$__rate_interval]) / rate(rlb_coord_solves_total[$__rate_interval])",
               "placement", "s", 12, 64),
    ]
    return _dashboard("rlb-fabric", "RLB fabric: per-path utilisation", ["rlb", "rdma"], _variables(), panels)


def planes_dashboard() -> dict:
    """A scale-up fabric (draft-fare-scale-up): per GPU, each peer's planes as the probes see
    them, the sub-ports in use and what they carry, and the plane switches' ports."""
    host = 'node=~"$host"'
    panels = [
        _panel(1, "Probes answered, per peer and plane (1 = in use)", f"rlb_host_plane_probe_up{{{host}}}",
               "{{node}} -> GPU {{peer}} plane {{plane}}", "short", 0, 0, kind="stat"),
        _panel(2, "Probe round trip per peer and plane", f"rlb_host_plane_probe_rtt_seconds{{{host}}}",
               "{{node}} -> GPU {{peer}} plane {{plane}}", "s", 12, 0),
        _panel(3, "Probe loss per peer and plane (share of the last probes)",
               f"rlb_host_plane_probe_loss_ratio{{{host}}}", "{{node}} -> GPU {{peer}} plane {{plane}}",
               "percentunit", 0, 8),
        _panel(4, "Probes sent (/s)", f"sum by (node, plane) (rate(rlb_host_plane_probes_sent_total{{{host}}}"
               "[$__rate_interval]))", "{{node}} plane {{plane}}", "pps", 12, 8),
        _panel(5, "Sub-ports usable (carrier and switch MAC)", f"rlb_host_path_usable{{{host}}}",
               "{{node}} sub-port {{path}}", "short", 0, 16, kind="stat"),
        _panel(6, "QPs per sub-port", f"rlb_host_path_active_qps{{{host}}}", "{{node}} sub-port {{path}}",
               "short", 12, 16),
        _panel(7, "Tx per sub-port (bits/s)", f"8 * rate(rlb_host_path_tx_bytes_total{{{host}}}[$__rate_interval])",
               "{{node}} sub-port {{path}}", "bps", 0, 24),
        _panel(8, "QPs moved by the agents to match the weights (/s)",
               f'rate(rlb_host_packets_total{{{host}, reason="ev_released"}}[$__rate_interval])',
               "{{node}}", "short", 12, 24),
        _panel(9, "Plane switch ports: tx (bits/s)",
               '8 * rate(rlb_switch_port_tx_bytes_total{node=~"$node"}[$__rate_interval])',
               "{{node}} {{interface}}", "bps", 0, 32),
        _panel(10, "GPU agent loop errors (/s; 'carrier' = the carrier watcher restarted)",
               f"rate(rlb_host_loop_errors_total{{{host}}}[$__rate_interval])", "{{node}} {{loop}}",
               "short", 12, 32),
    ]
    variables = [v for v in _variables() if v["name"] in ("datasource", "node", "host")]
    return _dashboard("rlb-planes", "RLB scale-up: planes, probes and sub-ports", ["rlb", "rdma", "scale-up"],
                      variables, panels)


def rails_dashboard() -> dict:
    """A rail-only fabric (outshift-hscore-rail-routing): the registry's h-scores per rail and
    domain, each GPU's h-ratio, the path types its agent chose and the remote rails it uses."""
    host = 'node=~"$host"'
    panels = [
        _panel(1, "h-score per rail (1 = idle at line rate)", 'rlb_coord_hscore{element="rail"}',
               "rail {{id}}", "percentunit", 0, 0),
        _panel(2, "h-score per domain", 'rlb_coord_hscore{element="domain"}', "domain {{id}}",
               "percentunit", 12, 0),
        _panel(3, "h-ratio per GPU: H(its rail) / H(its domain); above 1, no remote rail",
               f"rlb_host_h_ratio{{{host}}}", "{{node}}", "short", 0, 8),
        _panel(4, "Destinations by path type chosen (d, r, rd, dr, drd)",
               f"sum by (kind) (rlb_host_path_type_peers{{{host}}})", "{{kind}}", "short", 12, 8),
        _panel(5, "Destinations reached over each remote rail (drd)",
               f"sum by (rail) (rlb_host_remote_rail_peers{{{host}}})", "rail {{rail}}", "short", 0, 16),
        _panel(6, "Tx per first hop (bits/s; 1 = own rail, 1 + y = the domain to GPU y)",
               f"8 * rate(rlb_host_path_tx_bytes_total{{{host}}}[$__rate_interval])",
               "{{node}} hop {{path}}", "bps", 12, 16),
        _panel(7, "GPUs reporting to the registry", "rlb_coord_gpus_reporting", "GPUs", "short", 0, 24,
               kind="stat"),
        _panel(8, "GPU agent loop errors (/s; 'registry' = the coordinator unreachable)",
               f"rate(rlb_host_loop_errors_total{{{host}}}[$__rate_interval])", "{{node}} {{loop}}",
               "short", 12, 24),
    ]
    variables = [v for v in _variables() if v["name"] in ("datasource", "host")]
    return _dashboard("rlb-rails", "RLB rail-only: h-scores and path types", ["rlb", "rdma", "rail-only"],
                      variables, panels)


DASHBOARDS = {"rlb-fabric.json": fabric_dashboard, "rlb-planes.json": planes_dashboard,
              "rlb-rails.json": rails_dashboard}


def panel_queries(dashboard: dict) -> list[tuple[str, str]]:
    return [(p["title"], t["expr"]) for p in dashboard["panels"] for t in p.get("targets", [])]


def as_grafana_sends(expr: str) -> str:
    """A panel's query as Grafana sends it with every variable on 'All' (for checking panels
    against a Prometheus without a Grafana)."""
    return (expr.replace("$__rate_interval", "30s").replace("$node", ".*").replace("$interface", ".*")
            .replace("$host", ".*"))


def write(outdir: Path):
    outdir.mkdir(parents=True, exist_ok=True)
    for name, fn in DASHBOARDS.items():
        (outdir / name).write_text(json.dumps(fn(), indent=2) + "\n")


if __name__ == "__main__":
    write(Path(sys.argv[1] if len(sys.argv) > 1 else "grafana"))
