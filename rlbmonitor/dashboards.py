"""Grafana dashboards for RLB fabrics, built with Grafana's own SDK (grafana-foundation-sdk:
typed builders for the dashboard schema Grafana expects) and written as JSON: `python -m
rlbmonitor.dashboards grafana/` writes the files committed under grafana/. One dashboard per
concern; every panel's query is evaluated against a real Prometheus scraping a namespace lab in
the test suite."""
from __future__ import annotations

import json
import sys
from pathlib import Path

from grafana_foundation_sdk.builders import dashboard as gd
from grafana_foundation_sdk.builders import prometheus, stat, timeseries
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models.dashboard import DataSourceRef, GridPos, VariableRefresh

DATASOURCE = DataSourceRef(type_val="prometheus", uid="${datasource}")
VARIABLES = {      # name: (label, query)
    "node": ("switch", "label_values(rlb_switch_port_tx_bytes_total, node)"),
    "interface": ("port", 'label_values(rlb_switch_port_tx_bytes_total{node=~"$node"}, interface)'),
    "host": ("host", "label_values(rlb_host_path_active_qps, node)"),
}


def _panel(pid: int, title: str, expr: str, legend: str, unit: str, x: int, y: int, w: int = 12,
           kind: str = "timeseries", h: int = 8):
    panel = stat.Panel() if kind == "stat" else timeseries.Panel()
    return (panel.id(pid).title(title).datasource(DATASOURCE).grid_pos(GridPos(h=h, w=w, x=x, y=y))
            .unit(unit).with_target(prometheus.Dataquery().ref_id("A").datasource(DATASOURCE)
                                    .expr(expr).legend_format(legend)))


def _variables(*names: str) -> list:
    out = [gd.DatasourceVariable("datasource").label("Prometheus").type("prometheus")]
    for name in names:
        label, query = VARIABLES[name]
        out.append(gd.QueryVariable(name).label(label).datasource(DATASOURCE).query(query)
                   .refresh(VariableRefresh.ON_TIME_RANGE_CHANGED).include_all(True).multi(True)
                   .all_value(".*"))
    return out


def _dashboard(uid: str, title: str, tags: list[str], variables: list, panels: list) -> dict:
    d = gd.Dashboard(title).uid(uid).tags(tags).editable().refresh("5s").time("now-15m", "now")
    for v in variables:
        d = d.with_variable(v)
    for p in panels:
        d = d.with_panel(p)
    return json.loads(JSONEncoder(sort_keys=True).encode(d.build()))


SWITCH = 'node=~"$node"'
PORT = 'node=~"$node", interface=~"$interface"'
HOST = 'node=~"$host"'


def overview_dashboard() -> dict:
    """The fabric at a glance: is everything up, is anything hot, is anything moving."""
    panels = [
        _panel(1, "Agents up", 'up{job=~"rlbswitch|rlbhost|rlbcoord"}', "{{job}} {{instance_node}}", "short",
               0, 0, kind="stat"),
        _panel(2, "BGP sessions not established", "sum(1 - rlb_switch_bgp_session_up)", "sessions down",
               "short", 12, 0, kind="stat"),
        _panel(3, "Busiest port (tx / capacity)",
               "max(rate(rlb_switch_port_tx_bytes_total[$__rate_interval]) "
               "/ on(node, interface) rlb_switch_port_capacity_bytes_per_second)", "busiest port",
               "percentunit", 0, 8),
        _panel(4, "Fabric tx, all switch ports (bits/s)", "8 * sum(rate(rlb_switch_port_tx_bytes_total[$__rate_interval]))",
               "fabric", "bps", 12, 8),
        _panel(5, "QPs on paths, all hosts", "sum(rlb_host_path_active_qps)", "QPs", "short", 0, 16),
        _panel(6, "Agent loop errors, all agents (/s)",
               'sum(rate({__name__=~"rlb_(switch|host)_loop_errors_total"}[$__rate_interval]))', "errors",
               "short", 12, 16),
    ]
    return _dashboard("rlb-overview", "RLB: fabric overview", ["rlb", "rdma"], _variables(), panels)


def paths_dashboard() -> dict:
    """Per-path utilisation on the switches: ports, next hops, DLB and failover events."""
    panels = [
        _panel(1, "Per-port utilisation (tx / capacity)",
               f"rate(rlb_switch_port_tx_bytes_total{{{PORT}}}[$__rate_interval]) "
               f"/ on(node, interface) rlb_switch_port_capacity_bytes_per_second{{{PORT}}}",
               "{{node}} {{interface}}", "percentunit", 0, 0),
        _panel(2, "Per-port tx (bits/s)", f"8 * rate(rlb_switch_port_tx_bytes_total{{{PORT}}}[$__rate_interval])",
               "{{node}} {{interface}}", "bps", 12, 0),
        _panel(3, "Per-path load (next hop packets/s)",
               f"rate(rlb_switch_nexthop_packets_total{{{SWITCH}}}[$__rate_interval])", "{{node}} via {{nexthop}}",
               "pps", 0, 8),
        _panel(4, "DLB reassignments and failovers (/s)",
               f'rate(rlb_switch_packets_total{{{SWITCH}, reason=~"ev_dlb_reassign|ev_failover|ev_weighted_fallback"}}'
               "[$__rate_interval])", "{{node}} {{reason}}", "pps", 12, 8),
        _panel(5, "Packets handed to the kernel, by reason (/s)",
               f'rate(rlb_switch_packets_total{{{SWITCH}, reason=~"pass_.*"}}[$__rate_interval])',
               "{{node}} {{reason}}", "pps", 0, 16),
        _panel(6, "Port liveness", f"rlb_switch_port_up{{{PORT}}}", "{{node}} {{interface}}", "short", 12, 16,
               kind="stat"),
    ]
    return _dashboard("rlb-paths", "RLB: per-path utilisation", ["rlb", "rdma"],
                      _variables("node", "interface"), panels)


def hosts_dashboard() -> dict:
    """Host QPs per path: where the host agents put QPs and what each path carries, per fabric NIC
    of a GPU server (the `nic` label; empty on a host with one NIC)."""
    panels = [
        _panel(1, "QPs per path per host and NIC", f"rlb_host_path_active_qps{{{HOST}}}",
               "{{node}} {{nic}} path {{path}}", "short", 0, 0),
        _panel(2, "Host tx per NIC and path (bits/s)",
               f"8 * rate(rlb_host_path_tx_bytes_total{{{HOST}}}[$__rate_interval])",
               "{{node}} {{nic}} path {{path}}", "bps", 12, 0),
        _panel(3, "QP releases by host agents (/s)",
               f'rate(rlb_host_packets_total{{{HOST}, reason="ev_released"}}[$__rate_interval])', "{{node}}",
               "short", 0, 8),
        _panel(4, "Paths usable", f"rlb_host_path_usable{{{HOST}}}", "{{node}} {{nic}} path {{path}}", "short",
               12, 8, kind="stat"),
        _panel(5, "Host agent loop errors (/s)", f"rate(rlb_host_loop_errors_total{{{HOST}}}[$__rate_interval])",
               "{{node}} {{loop}}", "short", 0, 16),
        # QPs placed through the verbs library (hardware RoCE: rlbhost/verbs/)
        _panel(6, "Verbs QPs placed (/s)", f'rate(rlb_host_verbs_placed_total{{{HOST}}}[$__rate_interval])',
               "{{node}} {{kind}}", "short", 12, 16),
        _panel(7, "Verbs QPs kept on the application's addresses, by cause (/s)",
               f"rate(rlb_host_verbs_kept_total{{{HOST}}}[$__rate_interval])", "{{node}} {{reason}}", "short", 0, 24),
        _panel(8, "Verbs QP pairs whose ends may disagree", f"rlb_host_verbs_disagreements_total{{{HOST}}}",
               "{{node}}", "short", 12, 24, kind="stat"),
        _panel(9, "QPs per server NIC (TC-seen and verbs)", f"sum by (node, nic) (rlb_host_path_active_qps{{{HOST}}})",
               "{{node}} {{nic}}", "short", 0, 32),
        _panel(10, "Verbs QPs placed per server NIC (/s)",
               f"rate(rlb_host_verbs_placed_per_nic_total{{{HOST}}}[$__rate_interval])", "{{node}} {{nic}} {{kind}}",
               "short", 12, 32),
        # how long libraries wait for the agent (the RTR's share that is the agent's: against a 1 ms
        # median and 5 ms at worst, the budget of a server's eight NICs' QPs)
        _panel(11, "Verbs answer time, 99th percentile (from the library's asking)",
               f"histogram_quantile(0.99, sum by (node, kind, le) "
               f"(rate(rlb_host_verbs_answer_seconds_bucket{{{HOST}}}[$__rate_interval])))",
               "{{node}} {{kind}}", "s", 0, 40),
    ]
    return _dashboard("rlb-hosts", "RLB: host QPs per path", ["rlb", "rdma"], _variables("host"), panels)


def control_dashboard() -> dict:
    """Control plane health: BGP, bird, the bird -> XDP sync, the agents' loops."""
    panels = [
        _panel(1, "BGP sessions established", f"rlb_switch_bgp_session_up{{{SWITCH}}}", "{{node}} {{session}}",
               "short", 0, 0, kind="stat"),
        _panel(2, "Routes by mode", f"rlb_switch_routes{{{SWITCH}}}", "{{node}} {{mode}}", "short", 12, 0,
               kind="stat"),
        _panel(3, "bird -> XDP sync time (s)", f"rlb_switch_last_sync_seconds{{{SWITCH}}}", "{{node}}", "s", 0, 8),
        _panel(4, "bird control socket errors (/s)",
               f"rate(rlb_switch_bird_errors_total{{{SWITCH}}}[$__rate_interval])", "{{node}}", "short", 12, 8),
        _panel(5, "Switch agent loop errors (/s)",
               f"rate(rlb_switch_loop_errors_total{{{SWITCH}}}[$__rate_interval])", "{{node}} {{loop}}", "short",
               0, 16),
    ]
    return _dashboard("rlb-control", "RLB: control plane health", ["rlb", "rdma"], _variables("node"), panels)


def coordinator_dashboard() -> dict:
    """The fabric coordinator of a leaf-spine fabric: placements, balance, who reaches it; on
    etcd, which coordinator leads and what it writes there."""
    panels = [
        _panel(1, "QPs placed per leaf uplink", 'rlb_coord_link_qps{side="up"}', "{{leaf}} uplink {{colour}}",
               "short", 0, 0),
        _panel(2, "Worst leaf max/mean, placed and best possible", "rlb_coord_balance", "{{side}} {{of}}",
               "short", 12, 0),
        _panel(3, "Hosts reaching the coordinator", f"rlb_host_coordinator_reachable{{{HOST}}}", "{{node}}",
               "short", 0, 8, kind="stat"),
        _panel(4, "Placement time (s per placement)",
               "rate(rlb_coord_solve_seconds_total[$__rate_interval]) / rate(rlb_coord_solves_total[$__rate_interval])",
               "placement", "s", 12, 8),
        _panel(5, "Worst leaf max/mean of the QPs active now (newest generation), placed and best",
               "rlb_coord_balance_newest", "{{side}} {{of}}", "short", 0, 16),
        # on etcd (rlbcoord --etcd): who leads, and what it asks of etcd
        _panel(6, "Coordinators on etcd: leading (1) or standing by (0)", "rlb_coord_etcd_leading",
               "{{instance_node}} (shard {{shard}})", "short", 12, 16, kind="stat"),
        _panel(7, "Hosts with keys in etcd (leases alive)", "rlb_coord_etcd_hosts", "{{instance_node}}",
               "short", 0, 24),
        _panel(8, "Solves of etcd's changes (/s)", "rate(rlb_coord_etcd_batches_total[$__rate_interval])",
               "{{instance_node}}", "short", 12, 24),
        _panel(9, "Keys written to etcd (/s): placements and link loads",
               "rate(rlb_coord_etcd_placements_written_total[$__rate_interval]) "
               "+ rate(rlb_coord_etcd_link_loads_written_total[$__rate_interval])", "{{instance_node}}",
               "short", 0, 32),
        _panel(10, "Writes fenced off (another leads) and reads etcd refused (/s)",
               "rate(rlb_coord_etcd_fenced_total[$__rate_interval]) "
               "+ rate(rlb_coord_etcd_refusals_total[$__rate_interval])", "{{instance_node}}", "short", 12, 32),
    ]
    return _dashboard("rlb-coordinator", "RLB: fabric coordinator", ["rlb", "rdma"], _variables("host"), panels)


def planes_dashboard() -> dict:
    """A scale-up fabric (draft-fare-scale-up): per GPU, each peer's planes as the probes see
    them, the sub-ports in use and what they carry, and the plane switches' ports."""
    host = HOST
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
    variables = _variables("node", "host")
    return _dashboard("rlb-planes", "RLB scale-up: planes, probes and sub-ports", ["rlb", "rdma", "scale-up"],
                      variables, panels)


def rails_dashboard() -> dict:
    """A rail-only fabric (outshift-hscore-rail-routing): the registry's h-scores per rail and
    domain, each GPU's h-ratio, the path types its agent chose and the remote rails it uses."""
    host = HOST
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
    variables = _variables("host")
    return _dashboard("rlb-rails", "RLB rail-only: h-scores and path types", ["rlb", "rdma", "rail-only"],
                      variables, panels)


LEAF_SPINE = {"rlb-overview.json": overview_dashboard, "rlb-paths.json": paths_dashboard,
              "rlb-hosts.json": hosts_dashboard, "rlb-control.json": control_dashboard,
              "rlb-coordinator.json": coordinator_dashboard}
DASHBOARDS = {**LEAF_SPINE, "rlb-planes.json": planes_dashboard, "rlb-rails.json": rails_dashboard}


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
