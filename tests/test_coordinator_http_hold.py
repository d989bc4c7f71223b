"""The coordinator's HTTP server holds against bad framing and floods (rlbcoord/httpguard.py),
on its real server over loopback: a negative, missing, chunked or oversized Content-Length is
refused without reading a body; idle connections are cut off after the idle time; connections
past the bound are answered 503 at once and the server serves again when they go; one client past
its rate is answered 429 while another is served."""
from __future__ import annotations

import json
import socket
import threading
import time
from pathlib import Path

import pytest

from rlbcommon import coordapi
from rlbcoord import httpguard, kinds  # noqa: F401 - kinds: each registers its coordinator and metrics
from rlbcoord.metrics import exposition
from rlbcoord.service import Coordinator, make_server
from rlbfabric.fabric import load

FABRIC = load(Path(__file__).resolve().parent.parent / "lab" / "fabric.toml")


@pytest.fixture
def server(monkeypatch):
    monkeypatch.setattr(httpguard, "IDLE_S", 2.0)
    monkeypatch.setattr(httpguard.GuardedServer, "max_connections", 8)
    monkeypatch.setattr(httpguard, "RATE_PER_S", 1.0)    # so that no pause of a loaded machine refills it
    monkeypatch.setattr(httpguard, "BURST", 20)
    c = Coordinator(FABRIC, host_timeout_s=5.0)
    srv = make_server(c, "::1", 0, exposition(c))
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    srv.port = srv.server_address[1]
    yield srv
    srv.shutdown()
    srv.server_close()


def raw(port: int, data: bytes, timeout: float = 5.0) -> bytes:
    """What the server answers to `data` sent on a fresh connection (until it closes or a pause)."""
    with socket.create_connection(("::1", port), timeout=timeout) as s:
        s.sendall(data)
        out = b""
        try:
            while True:
                chunk = s.recv(65536)
                if not chunk:
                    break
                out += chunk
                if b"\r\n\r\n" in out and len(out.split(b"\r\n\r\n", 1)[1]) >= _length(out):
                    break
        except socket.timeout:
            pass
        return out


def _length(reply: bytes) -> int:
    for line in reply.split(b"\r\n\r\n", 1)[0].split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            return int(line.split(b":")[1])
    return 0


def status_code(reply: bytes) -> int:
    return int(reply.split(b" ", 2)[1])


REPORT = coordapi.REPORT.format("h1").encode()


@pytest.mark.parametrize("headers,code", [
    (b"Content-Length: -1\r\n", 400),
    (b"", 411),
    (b"Transfer-Encoding: chunked\r\n", 411),
    (b"Content-Length: 99999999999\r\n", 413),
    (b"Content-Length: 12abc\r\n", 400),
])
def test_hold_a_body_without_a_strict_length_is_refused_unread(server, headers, code):
    t = time.monotonic()
    reply = raw(server.port, b"POST " + REPORT + b" HTTP/1.1\r\nHost: x\r\n" + headers + b"\r\n" + b"{" * 4096)
    assert status_code(reply) == code, reply[:200]
    assert time.monotonic() - t < 2                     # answered at once, nothing waited for
    assert server.counters["length"] == 1
    # a well-framed body is read and judged on its content, and the server serves on
    body = json.dumps({"paths": []}).encode()
    judged = raw(server.port, b"POST " + REPORT + b" HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
    assert status_code(judged) == 400 and b"paths must be" in judged
    assert status_code(raw(server.port, b"GET /v1/status HTTP/1.1\r\nHost: x\r\n\r\n")) == 200
    assert server.counters["length"] == 1


def test_hold_idle_connections_are_cut_off_and_past_the_bound_answered_503_at_once(server):
    idle = [socket.create_connection(("::1", server.port), timeout=5) for _ in range(8)]
    try:
        time.sleep(0.3)
        t = time.monotonic()
        reply = raw(server.port, b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        assert status_code(reply) == 503 and time.monotonic() - t < 1
        assert server.counters["busy"] >= 1
        # the idle ones are closed by the server after its idle time (2 s here)
        for s in idle:
            assert s.recv(10) == b""
    finally:
        for s in idle:
            s.close()
    time.sleep(0.2)
    assert status_code(raw(server.port, b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")) == 200


def test_hold_one_client_past_its_rate_gets_429_and_another_is_served(server):
    codes = []
    for _ in range(httpguard.BURST + 20):
        codes.append(status_code(raw(server.port, b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")))
        if codes[-1] == 429:
            break
    assert codes.count(200) >= httpguard.BURST - 1 and codes[-1] == 429
    assert server.counters["rate"] == 1
    # another client address is not held back by the first one's rate
    assert server.limiter.allow("2001:db8::99") and not server.limiter.allow("::1")


def test_hold_body_length_and_rate_limiter_rules():
    assert httpguard.body_length({"Content-Length": "12"}) == 12
    for headers, code in (({}, 411), ({"Content-Length": "-5"}, 400), ({"Content-Length": "1", "Transfer-Encoding": "chunked"}, 411),
                          ({"Content-Length": str(httpguard.MAX_BODY + 1)}, 413)):
        with pytest.raises(httpguard.BadLength) as e:
            httpguard.body_length(headers)
        assert e.value.code == code
    t = [0.0]
    r = httpguard.RateLimiter(rate=10, burst=3, clock=lambda: t[0])
    assert [r.allow("a") for _ in range(4)] == [True, True, True, False]
    assert r.allow("b")
    t[0] = 0.1
    assert r.allow("a") and not r.allow("a")
