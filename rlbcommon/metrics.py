"""Prometheus helpers: a registry per agent (its own collector, and the expiry of the etcd TLS
files it uses: certs.py), served on loopback unless told otherwise.

The page is served by a bounded server (httpbound.py: a few connections at once, more answered
503) and collected one scrape at a time: a scrape that comes while a collection runs waits for the
next one, which answers every scrape that waited for it. prometheus_client's own server collects
in a thread per request, all at once: on a host short of CPU (the VM lab under emulation) a
collection outlasted the scrape interval, scrapes piled up (a thread each, reading the maps and
waiting on the verbs service's lock: over twenty at once in one thread dump) and starved the agent's loops
until its watchdog restarted it."""
from __future__ import annotations

import logging
import threading
import time
from http.server import BaseHTTPRequestHandler

from prometheus_client.exposition import choose_encoder, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import CollectorRegistry

from .certs import CertCollector
from .httpbound import BoundedServer, bind_family
from .health import hang_restarts

log = logging.getLogger(__name__)

__all__ = ["serve", "one_at_a_time", "counter", "gauge", "histogram", "table_fill", "loop_health"]


SCRAPES_AT_ONCE = 4       # connections served at once (Prometheus scrapes one at a time per target)
SCRAPE_IDLE_S = 10.0      # a connection silent this long is closed
SCRAPE_WAIT_S = 30.0      # a scrape waits this long for its collection, then is answered 503


class Collections:
    """The registry collected one scrape at a time. A scrape takes the result of a collection that
    started after it came (never one already under way: it could miss what the scraper just did),
    so scrapes that pile up behind a slow collection share the next one."""

    def __init__(self, registry: CollectorRegistry):
        self.registry = registry
        self.cond = threading.Condition()
        self.running = False
        self.done = 0                    # collections finished
        self.last: tuple[list | None, BaseException | None] = (None, None)

    def families(self, wait_s: float = SCRAPE_WAIT_S) -> list:
        deadline = time.monotonic() + wait_s
        with self.cond:
            want = self.done + (2 if self.running else 1)
            while self.done < want:
                if not self.running:
                    self.running = True
                    break
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"no collection within {wait_s:g} s")
                self.cond.wait(left)
            else:
                return self._result()
        result: tuple = (None, RuntimeError("the collection was interrupted"))
        try:
            result = (list(self.registry.collect()), None)
        except Exception as e:           # answered 500 to every scrape that waited for it
            result = (None, e)
        finally:                         # whatever ended it, the next scrape may collect
            with self.cond:
                self.running = False
                self.done += 1
                self.last = result
                self.cond.notify_all()
        families, err = result
        if err is not None:
            raise err
        return families

    def _result(self) -> list:
        families, err = self.last
        if err is not None:
            raise err
        return families


class _Families:
    """Collected families in the shape the encoders read (a registry's collect())."""

    def __init__(self, families: list):
        self._families = families

    def collect(self):
        return iter(self._families)


def one_at_a_time(registry: CollectorRegistry):
    """For a server of its own (the coordinator's API): a function returning the registry's
    Prometheus text, collected one scrape at a time as the agents' pages are."""
    collections = Collections(registry)
    return lambda: generate_latest(_Families(collections.families()))


class _Scrape(BaseHTTPRequestHandler):
    timeout = SCRAPE_IDLE_S

    def do_GET(self):
        if self.path.split("?", 1)[0] not in ("/metrics", "/"):
            return self._send(404, b"not found: /metrics\n", "text/plain")
        try:
            families = self.server.collections.families()
        except TimeoutError as e:
            return self._send(503, f"{e}\n".encode(), "text/plain")
        except Exception as e:
            log.warning("metrics: collecting failed: %s", e)
            return self._send(500, f"collecting failed: {e}\n".encode(), "text/plain")
        encoder, content_type = choose_encoder(self.headers.get("Accept"))
        self._send(200, encoder(_Families(families)), content_type)

    def _send(self, code: int, body: bytes, content_type: str):
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


class MetricsServer(BoundedServer):
    max_connections = SCRAPES_AT_ONCE


def start(registry: CollectorRegistry, port: int, addr: str = "127.0.0.1") -> MetricsServer:
    """Serve the registry on http://addr:port/metrics from a thread of its own (port 0: any free one,
    server.server_address tells)."""
    server_class = type("MetricsServer", (MetricsServer,), {"address_family": bind_family(addr)})
    server = server_class((addr, port), _Scrape)
    server.collections = Collections(registry)
    threading.Thread(target=server.serve_forever, name="metrics", daemon=True).start()
    return server


def serve(collector, port: int, addr: str = "127.0.0.1") -> CollectorRegistry:
    """Expose one custom collector (read at scrape time) on http://addr:port/metrics."""
    registry = CollectorRegistry()
    registry.register(collector)
    registry.register(CertCollector())         # the etcd TLS files it uses, when they expire
    start(registry, port, addr)
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
