"""What any exposed HTTP server needs, for the coordinator's: a bounded number of connections
served at once (one past it is answered 503 and closed, not given a thread), a read and idle
timeout per connection, a per-client request rate (429 past it), and a body read only with a
strict Content-Length (no chunked bodies, no negative or oversized lengths); over TLS, each
handshake in its connection's own thread and time."""
from __future__ import annotations

import logging
import ssl
import sys
import threading
import time

from prometheus_client import generate_latest
from prometheus_client.registry import CollectorRegistry

from rlbcommon.httpbound import BoundedServer
from rlbcommon.metrics import counter

log = logging.getLogger(__name__)

MAX_CONNECTIONS = 64           # connections served at once (each is a thread)
IDLE_S = 10.0                  # a connection silent this long (mid-request or between) is closed
RATE_PER_S = 50.0              # requests a client address may make a second (a host reports once a second)
BURST = 100                    # ... and at once
MAX_BODY = 16 << 20            # bytes of a report
MAX_CLIENTS = 65536            # client addresses remembered for their rate


class BadLength(ValueError):
    def __init__(self, code: int, why: str):
        super().__init__(why)
        self.code = code


def body_length(headers, limit: int = MAX_BODY) -> int:
    """The body's length from a request's headers, or BadLength (411: none or chunked, 400: not a
    number, 413: too large)."""
    if headers.get("Transfer-Encoding"):
        raise BadLength(411, "a body must have a Content-Length (no Transfer-Encoding)")
    text = headers.get("Content-Length")
    if text is None:
        raise BadLength(411, "a body must have a Content-Length")
    text = text.strip()
    if not text.isdigit():
        raise BadLength(400, f"Content-Length {text[:20]!r} is not a non-negative number")
    n = int(text)
    if n > limit:
        raise BadLength(413, f"a body of {n} bytes is larger than {limit}")
    return n


class RateLimiter:
    """A token bucket per client address."""

    def __init__(self, rate: float = RATE_PER_S, burst: int = BURST, clock=time.monotonic):
        self.rate, self.burst, self.clock = rate, burst, clock
        self.buckets: dict[str, tuple[float, float]] = {}     # address -> (tokens, when)
        self.lock = threading.Lock()

    def allow(self, client: str) -> bool:
        now = self.clock()
        with self.lock:
            tokens, at = self.buckets.get(client, (float(self.burst), now))
            tokens = min(float(self.burst), tokens + (now - at) * self.rate)
            ok = tokens >= 1.0
            self.buckets[client] = (tokens - 1.0 if ok else tokens, now)
            if len(self.buckets) > MAX_CLIENTS:                  # forget the longest idle
                for k, _ in sorted(self.buckets.items(), key=lambda kv: kv[1][1])[:MAX_CLIENTS // 4]:
                    del self.buckets[k]
            return ok


class GuardedServer(BoundedServer):
    """A BoundedServer (at most `max_connections` served at once, one more answered 503 and
    closed: a flood of idle sockets costs file descriptors, not threads) with its refusals
    counted by why, a per-client rate and TLS."""
    max_connections = MAX_CONNECTIONS
    request_queue_size = 1024      # the listen backlog (socketserver's 5 drops a thousand hosts' reports)

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        self.counters = {"busy": 0, "rate": 0, "length": 0, "identity": 0, "handshake": 0}
        self.limiter = RateLimiter(RATE_PER_S, BURST)

    def refused(self):
        self.counters["busy"] += 1

    def use_tls(self, ctx: ssl.SSLContext):
        """Serve HTTPS: each connection's handshake runs in its own thread, within its idle
        timeout (a client that stalls the handshake holds one slot, never the accept loop)."""
        self.socket = ctx.wrap_socket(self.socket, server_side=True, do_handshake_on_connect=False)
        self.tls = True

    def handle_error(self, request, client_address):
        """A failed TLS handshake (no certificate of the CA, a port scan) is counted and logged in
        one line, not as a traceback; the rest as every bounded server does (a peer gone
        mid-request: one debug line)."""
        err = sys.exc_info()[1]
        if isinstance(err, ssl.SSLError):
            self.counters["handshake"] += 1
            log.info("TLS handshake with %s failed: %s", client_address[0], getattr(err, "reason", None) or err)
        else:
            super().handle_error(request, client_address)


class _Refusals:
    def __init__(self, counters: dict):
        self.counters = counters

    def collect(self):
        c = counter("rlb_coord_http_refused", "HTTP requests and connections the coordinator refused, by "
                    "why: busy (connections at the bound), rate (a client past its rate), length (no "
                    "strict Content-Length), identity (a report shown with another machine's "
                    "certificate, or none), handshake (TLS failed: a certificate of another CA)", ["why"])
        for why, n in self.counters.items():
            c.add_metric([why], n)
        yield c


def exposition(counters: dict) -> bytes:
    """The server's refusals in Prometheus text, appended to the coordinator's own /metrics."""
    registry = CollectorRegistry()
    registry.register(_Refusals(dict(counters)))
    return generate_latest(registry)
