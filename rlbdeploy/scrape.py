"""Prometheus scrape configuration for a fabric: every switch agent (:9471), host agent (:9472)
and the coordinator (:9473), labelled with the node's name and role. Rendered from the fabric
file like the bird configs and the units: `rlbfabric prometheus` renders it for a real fabric,
and the VM lab's monitor runs what it renders (rlbmonitor holds what Prometheus and Grafana
show: alert rules and dashboards)."""
from __future__ import annotations

import ipaddress
import json
import re

from rlbcommon.constants import METRICS_PORT
from rlbfabric.errors import FabricError

from .units import SWITCH_ROLES, role

HOSTNAME = re.compile(r"^(?=.{1,253}$)([A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*$")


def scrape_config(targets: dict[str, tuple], interval: str = "2s", rule_files: list[str] = ()) -> str:
    """targets: {node: (IPv6 or IPv4 address, role[, port])}; role 'host' is scraped on 9472,
    switches on 9471, 'coordinator' on 9473 unless a port is given (several coordinators on one
    machine); rule_files: alerting rules to load (rlbmonitor/alerts.py).
    Returned as YAML (JSON is valid YAML, and needs no YAML library)."""
    P = METRICS_PORT
    jobs = []
    for job, port, roles in (("rlbswitch", P["switch"], ("leaf", "spine", "superspine")),
                             ("rlbhost", P["host"], ("host",)), ("rlbcoord", P["coordinator"], ("coordinator",))):
        static = [{"targets": [_target(t[0], t[2] if len(t) > 2 else port)],
                   "labels": {"instance_node": node, "role": t[1]}}
                  for node, t in sorted(targets.items()) if t[1] in roles]
        if static:
            jobs.append({"job_name": job, "scrape_interval": interval, "static_configs": static})
    conf = {"global": {"scrape_interval": interval, "evaluation_interval": interval}, "scrape_configs": jobs}
    if rule_files:
        conf["rule_files"] = list(rule_files)
    return json.dumps(conf, indent=2)


def _target(addr: str, port: int) -> str:
    return f"[{addr}]:{port}" if ":" in addr else f"{addr}:{port}"


def agent_role(fabric, node: str) -> str | None:
    """The role a node is scraped as, or None where no agent of ours runs (a rail-only fabric's
    rail switches): the role deploy.units gives it, so what is scraped is what is installed."""
    r = role(fabric, node)
    return r if r in SWITCH_ROLES or r == "host" else None


def check_address(node: str, addr: str) -> str:
    """A management address: an IP address or a DNS name (Prometheus resolves it)."""
    try:
        return str(ipaddress.ip_address(addr))
    except ValueError:
        if HOSTNAME.match(addr) and not addr.replace(".", "").isdigit():
            return addr
    raise FabricError(f"{node}: {addr!r} is neither an IP address nor a host name")


def fabric_scrape_config(fabric, addrs: dict[str, str], coordinator: str | list[str] | None = None,
                         interval: str = "2s", rule_files: list[str] = ()) -> str:
    """The scrape configuration of every agent of a fabric from {node: management address}.
    Every node that runs an agent needs an address, and every address must name such a node:
    a fabric scraped in part would look healthy where it is not watched. `coordinator`: its
    address, or several coordinators' (on etcd: the leader and its standbys), each ADDRESS or
    ADDRESS:PORT ([IPv6]:PORT); one is labelled `coordinator`, several `coordinator-1`, ..."""
    nodes = [n.name for n in fabric.switches] + list(fabric.machines)
    unknown = sorted(set(addrs) - set(nodes))
    if unknown:
        raise FabricError(f"not in the fabric: {', '.join(unknown)}")
    roles = {n: r for n in nodes if (r := agent_role(fabric, n))}
    missing = [n for n in roles if n not in addrs]
    if missing:
        raise FabricError(f"no management address for {', '.join(missing)}")
    targets = {n: (check_address(n, addrs[n]), r) for n, r in roles.items()}
    coords = [coordinator] if isinstance(coordinator, str) else list(coordinator or [])
    for i, c in enumerate(coords, start=1):
        name = "coordinator" if len(coords) == 1 else f"coordinator-{i}"
        addr, port = _address_port(name, c)
        targets[name] = (addr, "coordinator", port) if port else (addr, "coordinator")
    return scrape_config(targets, interval, rule_files)


def _address_port(node: str, text: str) -> tuple[str, int | None]:
    """ADDRESS, ADDRESS:PORT or [IPv6]:PORT (a bare IPv6 address has no port)."""
    host, port = text, None
    if text.startswith("["):
        host, sep, rest = text[1:].partition("]")
        if not sep or (rest and not rest.startswith(":")):
            raise FabricError(f"{node}: {text!r}: expected [IPv6] or [IPv6]:PORT")
        port = rest[1:] or None
    elif text.count(":") == 1:
        host, port = text.split(":")
    if port is not None and not (port.isdigit() and 0 < int(port) < 65536):
        raise FabricError(f"{node}: {text!r}: the port must be 1-65535")
    return check_address(node, host), int(port) if port is not None else None


def read_addresses(text: str, where: str) -> dict[str, str]:
    """An inventory of management addresses: one `node address` per line, # comments."""
    out: dict[str, str] = {}
    for i, line in enumerate(text.splitlines(), start=1):
        words = line.split("#", 1)[0].split()
        if not words:
            continue
        if len(words) != 2:
            raise FabricError(f"{where}:{i}: expected 'node address', got {line.strip()!r}")
        if words[0] in out:
            raise FabricError(f"{where}:{i}: {words[0]} is listed twice")
        out[words[0]] = words[1]
    return out
