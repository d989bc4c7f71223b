"""The etcd client's watches against a real etcd (Debian's etcd-server): a quiet watch stays
open (re-opening one costs etcd about a millisecond of CPU and, over TLS, a handshake: every
host holds two), ends at once when asked, and keeps a dead member in view by TCP keepalive."""
from __future__ import annotations

import re
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from rlbcommon import etcd as etcdmod
from rlbcommon.etcd import Etcd, prefix_end
from rlblab.etcdserver import EtcdServer

from .test_etcd_identity import free_port

BENCH = Path(__file__).resolve().parent.parent / "bench"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    s = EtcdServer(tmp_path_factory.mktemp("etcd"), client_port=free_port(), peer_port=free_port()).start()
    try:
        yield s
    finally:
        s.stop()


def watches_opened(server) -> int:
    """Watch streams etcd has opened so far (its gRPC server's count: the gateway goes through it)."""
    text = urllib.request.urlopen(f"{server.url}/metrics", timeout=5).read().decode()
    m = re.search(r'^grpc_server_started_total\{grpc_method="Watch",grpc_service="etcdserverpb.Watch",'
                  r'grpc_type="bidi_stream"\} (\d+)', text, re.M)
    return int(m.group(1)) if m else 0


def follow(client: Etcd, prefix: str, stop: threading.Event, seen: list):
    _, rev = client.get_prefix(prefix)
    for events, _ in client.watch_prefix(prefix, rev + 1, stop):
        seen += [(e.kv.key, e.kv.value) for e in events]


def test_a_quiet_watch_stays_open_and_still_delivers(server):
    client = Etcd(server.url)
    stop, seen = threading.Event(), []
    before = watches_opened(server)
    t = threading.Thread(target=follow, args=(client, "/q/", stop, seen), daemon=True)
    t.start()
    time.sleep(1.0)
    assert watches_opened(server) == before + 1
    time.sleep(7.0)                            # quiet longer than the 5 s streams used to last
    client.put("/q/a", "1")
    deadline = time.monotonic() + 5
    while not seen and time.monotonic() < deadline:
        time.sleep(0.05)
    assert seen == [("/q/a", b"1")]
    assert watches_opened(server) == before + 1          # the same stream all along
    stop.set()
    t.join(2)
    assert not t.is_alive()


def test_a_stopped_watch_ends_at_once(server):
    client = Etcd(server.url)
    stop, seen = threading.Event(), []
    t = threading.Thread(target=follow, args=(client, "/s/", stop, seen), daemon=True)
    t.start()
    time.sleep(1.0)
    stop.set()
    t0 = time.monotonic()
    t.join(5)
    assert not t.is_alive() and time.monotonic() - t0 < 1.5      # not after the stream's idle time


def test_a_watch_stream_probes_a_silent_peer(server):
    client = Etcd(server.url)
    body = {"create_request": {"key": etcdmod._b64("/k/"), "range_end": etcdmod._b64(prefix_end("/k/"))}}
    stream = client._request("watch", body, stream=True)
    try:
        sock = stream.conn.sock
        assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
        assert (sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE),
                sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL),
                sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT)) == etcdmod.KEEPALIVE_S
        assert next(iter(stream))                 # the stream answers: its creation
    finally:
        stream.close()


def test_the_request_cost_bench_compares_clear_and_tls():
    # enough requests that etcd's CPU (read in clock ticks, 10 ms) cannot round to nothing
    out = subprocess.run([sys.executable, str(BENCH / "etcd_costs.py"), "--n", "300", "--watches", "100"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    rows = {line[:36].strip(): line[36:].split() for line in out.stdout.splitlines()[1:]}
    assert list(rows) == ["lease keepalive", "read", "watch opened"]
    for cells in rows.values():              # etcd / client in clear, etcd / client over TLS, ratio
        assert cells[1] == "/" and cells[4] == "/" and cells[6].endswith("x")
        assert float(cells[0]) > 0 and float(cells[3]) > 0


def test_a_streams_no_leader_refusal_reads_as_unavailable():
    """The gateway wraps a stream's refusal in {"error": {...}} with `grpc_code`: read as any other
    (a member without a leader is UNAVAILABLE, so the client goes on to the next member; read as
    UNKNOWN, it ended the agent's watch loop: the partition test's failure in CI)."""
    raw = (b'{"error":{"grpc_code":14,"http_code":503,"message":"etcdserver: no leader",'
           b'"http_status":"Service Unavailable"}}')
    err = etcdmod._refusal(503, raw)
    assert err.code == etcdmod.UNAVAILABLE and str(err) == "etcdserver: no leader"
    plain = etcdmod._refusal(400, b'{"error":"etcdserver: key not found","code":5,"message":"etcdserver: key not found"}')
    assert plain.code == 5 and str(plain) == "etcdserver: key not found"
    assert etcdmod._refusal(503, b"upstream gone").code == etcdmod.UNAVAILABLE
    assert etcdmod._refusal(500, b"boom").code == 2
