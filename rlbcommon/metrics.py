"""Prometheus helpers: a registry per agent (its own collector, and the expiry of the etcd TLS
files it uses: certs.py), served on loopback unless told otherwise."""
from __future__ import annotations

import logging
import time

from prometheus_client import start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import CollectorRegistry

from .certs import CertCollector
from .health import hang_restarts

log = logging.getLogger(__name__)

__all__ = ["serve", "counter", "gauge", "histogram", "table_fill", "loop_health"]


def serve(collector, port: int, addr: str = "127.0.0.1") -> CollectorRegistry:
    """Expose one custom collector (read at scrape time) on http://addr:port/metrics."""
    registry = CollectorRegistry()
    registry.register(collector)
    registry.register(CertCollector())         # the etcd TLS files it uses, when they expire
    start_http_server(port, addr=addr, registry=registry)
    log.info("metrics on http://%s:%d/metrics", addr if ":" not in addr else f"[{addr}]", port)
    return registry


def counter(name: str, doc: str, labels: list[str]) -> CounterMetricFamily:
    return CounterMetricFamily(name, doc, labels=labels)


def gauge(name: str, doc: str, labels: list[str]) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, labels=labels)


def histogram(name: str, doc: str, labels: list[str]) -> HistogramMetricFamily:
    return HistogramMetricFamily(name, doc, labels=labels)


def table_fill(prefix: str, rows: list[tuple[list[str], str, int, int]], labels: list[str]):
    """Entries, capacity and fill ratio of bounded tables (maps, caches): `rows` of (label values,
    table, entries, capacity). A full table refuses or evicts what comes next, so each is watched
    (alert RlbTableNearlyFull on <prefix>_table_fill_ratio)."""
    entries = gauge(f"{prefix}_table_entries", "entries in a bounded table", [*labels, "table"])
    cap = gauge(f"{prefix}_table_capacity", "entries the table can hold", [*labels, "table"])
    ratio = gauge(f"{prefix}_table_fill_ratio", "entries over capacity", [*labels, "table"])
    for values, table, n, size in rows:
        entries.add_metric([*values, table], n)
        cap.add_metric([*values, table], size)
        ratio.add_metric([*values, table], n / size if size else 0.0)
    return entries, cap, ratio


def loop_health(health, prefix: str, node: str):
    """An agent's Health (health.py) as metric families: errors per loop, seconds since each
    loop last completed a round, loops hung, and restarts for a hang."""
    errors = counter(f"{prefix}_loop_errors", "rounds of an agent loop that failed (the loop goes on)",
                     ["node", "loop"])
    age = gauge(f"{prefix}_loop_last_ok_age_seconds", "seconds since the loop last completed a round",
                ["node", "loop"])
    hung = gauge(f"{prefix}_loop_hung", "1 while a loop has not finished a round for longer than a round "
                 "may take (the agent then starts afresh)", ["node", "loop"])
    restarts = counter(f"{prefix}_hang_restarts", "times the agent started afresh because a loop hung "
                       "(since systemd started it)", ["node"])
    now = time.time()
    for name, e in health.snapshot().items():
        errors.add_metric([node, name], e["errors"])
        if e["last_ok"]:
            age.add_metric([node, name], now - e["last_ok"])
    late = {n for n, _, _ in health.hung()}
    for name in sorted(health.expected):
        hung.add_metric([node, name], 1 if name in late else 0)
    restarts.add_metric([node], hang_restarts())
    return errors, age, hung, restarts
