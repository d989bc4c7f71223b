"""Prometheus alerting rules for the failures an operator must hear about, generated here:
`python -m rlbmonitor.alerts prometheus/` writes prometheus/rlb-alerts.yml (committed; checked
with `promtool check rules` and loaded by the labs' Prometheus, where the tests provoke them).

Durations are for a real fabric: long enough that one lost scrape or a flap BFD already handled
does not page anyone, short enough that a dead session or a stuck agent is heard within a minute."""
from __future__ import annotations

import json
import sys
from pathlib import Path

RULES = [
    # (name, expression, for, severity, summary)
    ("RlbAgentDown", 'up{job=~"rlbswitch|rlbhost|rlbcoord"} == 0', "30s", "critical",
     "{{ $labels.job }} on {{ $labels.instance_node }} is not answering scrapes"),
    ("RlbAgentLoopErrors", 'increase({__name__=~"rlb_(switch|host|coord)_loop_errors_total"}[2m]) > 0', "1m", "warning",
     "{{ $labels.node }}: agent loop {{ $labels.loop }} keeps failing (rlbswitch/rlbhost status says why)"),
    ("RlbAgentLoopHung", '{__name__=~"rlb_(switch|host|coord)_loop_hung"} == 1', "0s", "critical",
     "{{ $labels.node }}: agent loop {{ $labels.loop }} has stopped finishing rounds (a lock or a read that "
     "never returns): the agent is starting afresh; forwarding goes on from the pinned maps"),
    ("RlbAgentRestartedForHang", 'increase({__name__=~"rlb_(switch|host|coord)_hang_restarts_total"}[30m]) > 0', "0s",
     "warning", "{{ $labels.node }}: the agent started afresh because a loop hung (its log names the loop): "
     "it works again, but something makes it hang"),
    ("RlbBgpSessionDown", "rlb_switch_bgp_session_up == 0", "30s", "critical",
     "{{ $labels.node }}: BGP session {{ $labels.session }} is not Established"),
    ("RlbPathAtZeroWeight", "rlb_host_path_weight == 0 and on(node, nic, path) rlb_host_path_usable == 1", "2m",
     "warning", "{{ $labels.node }} {{ $labels.nic }}: path {{ $labels.path }} is usable but weighted 0 (by hand, "
     "or its capacity is gone upstream): its share of the fabric is idle"),
    ("RlbPathUnusable", "rlb_host_path_usable == 0", "1m", "warning",
     "{{ $labels.node }} {{ $labels.nic }}: path {{ $labels.path }} cannot carry traffic (no address, no carrier "
     "or no MAC)"),
    ("RlbSwitchNeighbourSilent", "rlb_switch_neighbour_silent == 1", "10s", "critical",
     "{{ $labels.node }} {{ $labels.interface }}: the switch on this port keeps carrier but its data plane "
     "answers no heartbeat (hung, or its XDP program gone): the port is out of forwarding until it answers"),
    ("RlbTableNearlyFull", '{__name__=~"rlb_(switch|host)_table_fill_ratio"} > 0.9', "5m", "warning",
     "{{ $labels.node }} {{ $labels.nic }}: table {{ $labels.table }} is {{ $value | humanizePercentage }} full: "
     "past it routes, next hops or neighbours are refused, or the oldest QPs' paths evicted (conntrack)"),
    ("RlbDlbReassignmentStorm", 'rate(rlb_switch_packets_total{reason="ev_dlb_reassign"}[1m]) > 1000', "2m",
     "warning", "{{ $labels.node }}: flowlets reassigned {{ $value | humanize }}/s: ports flapping or "
     "quality bands set too tight"),
    ("RlbBirdUnreachable", "increase(rlb_switch_bird_errors_total[2m]) > 0", "1m", "critical",
     "{{ $labels.node }}: the agent cannot read bird's control socket; routes are frozen"),
    ("RlbCoordinatorUnreachable", "rlb_host_coordinator_reachable == 0", "1m", "warning",
     "{{ $labels.node }} {{ $labels.nic }}: the coordinator is unreachable; the host places QPs by its local rule"),
    ("RlbNoCoordinatorLeads", "max by (shard) (rlb_coord_etcd_leading) == 0", "30s", "critical",
     "coordinators of shard {{ $labels.shard }} on etcd run but none leads (etcd unreachable, refusing "
     "them, or coordinators of another shard count lead): its hosts' QPs are not placed; they keep "
     "their placements, then place new QPs by their local rule"),
    ("RlbShardWithoutLeader", "max(rlb_coord_etcd_other_shards_without_leader) > 0", "30s", "critical",
     "{{ $value }} shard(s) of placement have no leader, as the other shards' coordinators see it: "
     "their hosts' QPs are not placed (start their coordinators: rlbcoord run --shard K/N)"),
    ("RlbEtcdCertExpiring", "rlb_etcd_cert_expiry_timestamp_seconds - time() < 30 * 86400", "10m", "warning",
     "{{ $labels.instance_node }}: its etcd {{ $labels.file }} certificate ({{ $labels.path }}) expires within "
     "30 days: then etcd refuses it and its reports; issue it again (rlbfabric etcd-tls) and restart the agent"),
    ("RlbVerbsDisagreement", "increase(rlb_host_verbs_disagreements_total[5m]) > 0", "0s", "critical",
     "{{ $labels.node }}: the two ends of a verbs QP may have ended on different paths (an answer lost "
     "after the decision): a receiver that checks addresses drops that QP's packets (the agent's log names it)"),
    ("RlbVerbsQpsKeptTheirAddresses",
     'increase(rlb_host_verbs_kept_total{reason=~"noagent|timeout|nopeer|busy|error"}[5m]) > 0', "5m", "warning",
     "{{ $labels.node }}: QPs of jobs with the verbs library keep the application's addresses "
     "({{ $labels.reason }}): they work but are not balanced (rlbhost verbs status)"),
    ("RlbVerbsJobsNotPlacedBySettings",
     'increase(rlb_host_verbs_kept_total{reason=~"ipv4|linklocal|notrocev2|notfabric|othernic"}[10m]) > 0', "10m",
     "warning", "{{ $labels.node }}: jobs' QPs are left on their own addresses by their GIDs ({{ $labels.reason }}: "
     "IPv4 or link-local GIDs, RoCE v1, or a device on no fabric NIC): their NCCL settings, not the fabric "
     "(rlbhost verbs check --pid <a rank>; NCCL_IB_ADDR_FAMILY=AF_INET6)"),
    ("RlbVerbsLocalUserRefused",
     'increase(rlb_host_verbs_refused_total{what=~"client|question|accept_failed"}[10m]) > 0', "0s", "warning",
     "{{ $labels.node }}: the verbs agent refused a local process ({{ $labels.what }}: a user over its caps on "
     "connections, QPs or questions, or out of file descriptors): a job misbehaving, or caps too small for it "
     "(the agent's log names the pid and uid)"),
    ("RlbFabricKeyFileBad", "rlb_host_fabric_key_file_bad == 1", "1m", "critical",
     "{{ $labels.node }}: the fabric's key file is gone, empty or unreadable: the agent goes on with the keys "
     "it read before, but a restart would run it without them (put the file back, mode 600)"),
    ("RlbCoordReportWithoutIdentity", "increase(rlb_coord_http_refused_total{why=~\"identity|handshake\"}[5m]) > 0",
     "0m", "warning",
     "the coordinator refused {{ $value }} report(s) or handshake(s) in 5 min: a machine reporting for "
     "another, without its certificate, or with one of another CA (its log names the client and whose "
     "certificate it showed)"),
    ("RlbCoordHostOverQpLimit", "max(rlb_coord_etcd_hosts_over) > 0", "1m", "warning",
     "{{ $value }} host(s) hold more QPs in etcd than a host may have placed (rlbcoord run --host-qps-max): "
     "their new QPs are not placed and the coordinator keeps only a count of them (rlbcoord status names "
     "them): a job far larger than planned, or a host misbehaving"),
    ("RlbVerbsAnswersSlow",
     'histogram_quantile(0.99, sum by (node, le) (rate(rlb_host_verbs_answer_seconds_bucket{kind="rtr"}[5m]))) > 0.005',
     "10m", "warning",
     "{{ $labels.node }}: 1 in 100 of its verbs libraries' RTRs waited more than {{ $value | humanizeDuration }} "
     "for the agent (5 ms is the budget): the agent is behind its questions (a burst of QPs, or a busy machine "
     "starving it): QPs still agree, but RTRs take longer and past the libraries' timeout keep their addresses"),
    ("RlbVerbsMessageErrors", "increase(rlb_host_verbs_message_errors_total[10m]) > 0", "0m", "warning",
     "{{ $labels.node }}: the verbs agent failed to handle {{ $value }} peer agents' message(s) in 10 min: a "
     "fault of the agent's own (its log has the traceback: report it); the other messages go on, but the "
     "pairs those messages were about may keep their addresses"),
    ("RlbVerbsPeerMessagesLost",
     'rate(rlb_host_verbs_peer_messages_total{what="resent"}[5m]) > 10', "10m", "warning",
     "{{ $labels.node }}: the verbs agents' messages (UDP 4798) are being sent again more than 10 a second: "
     "lost or late between hosts (the fabric's default class dropping, or a peer agent slow): QPs still agree, "
     "but more keep their addresses"),
]


def rules() -> dict:
    return {"groups": [{"name": "rlb", "rules": [
        {"alert": name, "expr": expr, "for": dur, "labels": {"severity": sev},
         "annotations": {"summary": summary}} for name, expr, dur, sev, summary in RULES]}]}


def write(outdir: Path) -> Path:
    """The rule file (JSON is valid YAML: no YAML library needed)."""
    outdir.mkdir(parents=True, exist_ok=True)
    path = outdir / "rlb-alerts.yml"
    path.write_text(json.dumps(rules(), indent=2) + "\n")
    return path


if __name__ == "__main__":
    write(Path(sys.argv[1] if len(sys.argv) > 1 else "prometheus"))
