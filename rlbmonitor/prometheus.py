"""Prometheus scrape configuration for a fabric: every switch agent (:9471), host agent (:9472)
and the coordinator (:9473), labelled with the node's name and role."""
from __future__ import annotations

import json


def scrape_config(targets: dict[str, tuple[str, str]], interval: str = "2s", rule_files: list[str] = ()) -> str:
    """targets: {node: (IPv6 or IPv4 address, role)}; role 'host' is scraped on 9472, switches on
    9471, 'coordinator' on 9473; rule_files: alerting rules to load (rlbmonitor/alerts.py).
    Returned as YAML (JSON is valid YAML, and needs no YAML library)."""
    from rlbfabric.constants import METRICS_PORT as P
    jobs = []
    for job, port, roles in (("rlbswitch", P["switch"], ("leaf", "spine", "superspine")),
                             ("rlbhost", P["host"], ("host",)), ("rlbcoord", P["coordinator"], ("coordinator",))):
        static = [{"targets": [f"[{addr}]:{port}" if ":" in addr else f"{addr}:{port}"],
                   "labels": {"instance_node": node, "role": role}}
                  for node, (addr, role) in sorted(targets.items()) if role in roles]
        if static:
            jobs.append({"job_name": job, "scrape_interval": interval, "static_configs": static})
    conf = {"global": {"scrape_interval": interval, "evaluation_interval": interval}, "scrape_configs": jobs}
    if rule_files:
        conf["rule_files"] = list(rule_files)
    return json.dumps(conf, indent=2)
