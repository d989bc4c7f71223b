"""Prometheus helpers: a registry per agent (its own collector, and the expiry of the etcd TLS
files it uses: certs.py), served on loopback unless told otherwise."""
from __future__ import annotations

import logging

from prometheus_client import start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import CollectorRegistry

from .certs import CertCollector

log = logging.getLogger(__name__)

__all__ = ["serve", "counter", "gauge", "table_fill"]


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
