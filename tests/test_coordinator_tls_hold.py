"""The coordinator over HTTPS with the machines' certificates (rlbfabric etcd-tls issues them, the
same as etcd's): a report is taken only from the machine it is about, so a host can speak for
itself alone; status stays readable without a certificate; a certificate of another CA fails the
handshake; a client that stalls its handshake holds one connection, not the server. Real openssl
certificates, the real server on loopback, the agents' own client (coordapi)."""
from __future__ import annotations

import http.client
import socket
import ssl
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from rlbcommon import coordapi
from rlbcommon.tls import server_context
from rlbcoord import etcdtls, httpguard, keys
from rlbcoord.metrics import exposition
from rlbcoord.service import Coordinator, make_server

from .test_coordinator import FABRIC, report

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    d = tmp_path_factory.mktemp("pki")
    etcdtls.issue(FABRIC, d, ["::1"])
    assert etcdtls.issue_coordinator(d, ["::1"]) == [str(etcdtls.coordinator_file(d))]
    assert etcdtls.issue_coordinator(d, ["::1"]) == []          # kept while its names hold
    other = tmp_path_factory.mktemp("other-ca")
    etcdtls.issue(FABRIC, other, ["::1"])
    return d, other


@pytest.fixture
def server(pki, monkeypatch):
    monkeypatch.setattr(httpguard, "IDLE_S", 2.0)
    d, _ = pki
    c = Coordinator(FABRIC, host_timeout_s=5.0)
    srv = make_server(c, "::1", 0, exposition(c),
                      tls=server_context(etcdtls.coordinator_file(d), etcdtls.ca_file(d)))
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    srv.url = coordapi.url_for("::1", srv.server_address[1], https=True)
    yield srv
    srv.shutdown()
    srv.server_close()


def as_machine(pki, user: str | None, ca_dir=None):
    d, _ = pki
    cert = etcdtls.client_file(ca_dir or d, user) if user else None
    return coordapi.client_tls("https://[::1]:1", etcdtls.ca_file(d), cert)


def test_hold_a_report_is_taken_only_with_its_own_machines_certificate(pki, server):
    h1 = keys.host_user(FABRIC.machine_of("h1"))
    got = coordapi.call(server.url, coordapi.REPORT.format("h1"), report("h1", [("h3", 50000, 1, 1)]),
                        tls=as_machine(pki, h1))
    assert "placements" in got
    # h2's certificate, a switch's, none: refused, counted, the model unchanged
    for who in (keys.host_user("h2"), keys.switch_user("l1"), None):
        with pytest.raises(coordapi.CoordinatorError, match="403.*h1"):
            coordapi.call(server.url, coordapi.REPORT.format("h1"), report("h1", [("h4", 50001, 2, 2)]),
                          tls=as_machine(pki, who))
    assert server.counters["identity"] == 3
    status = coordapi.call(server.url, coordapi.STATUS, tls=as_machine(pki, None))   # no certificate needed
    assert status["hosts"]["h1"]["qps"] == 1 and "h2" not in status["hosts"]
    assert status["http"]["identity"] == 3
    conn = http.client.HTTPSConnection("::1", server.server_address[1], context=as_machine(pki, None), timeout=5)
    conn.request("GET", "/metrics")
    text = conn.getresponse().read().decode()
    assert 'rlb_coord_http_refused_total{why="identity"} 3.0' in text and "rlb_coord_hosts 1.0" in text
    # a leaf's link report with the leaf's own certificate; with a host's, refused
    ports = {p.ifname: True for p in FABRIC.ports_up(FABRIC.node("l1"))}
    coordapi.call(server.url, coordapi.LINKS.format("l1"), {"ports": ports}, tls=as_machine(pki, keys.switch_user("l1")))
    with pytest.raises(coordapi.CoordinatorError, match="403"):
        coordapi.call(server.url, coordapi.LINKS.format("l1"), {"ports": ports}, tls=as_machine(pki, h1))


def test_hold_a_certificate_of_another_ca_fails_the_handshake(pki, server):
    _, other = pki
    tls = as_machine(pki, keys.host_user("h1"), ca_dir=other)
    with pytest.raises(coordapi.CoordinatorError):
        coordapi.call(server.url, coordapi.REPORT.format("h1"), report("h1", []), tls=tls)
    deadline = time.monotonic() + 5
    while server.counters["handshake"] < 1 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert server.counters["handshake"] == 1
    # and a client that checks the server against another CA refuses the coordinator
    wrong = coordapi.client_tls(server.url, etcdtls.ca_file(other))
    with pytest.raises(coordapi.CoordinatorError, match="CERTIFICATE_VERIFY_FAILED|certificate verify failed"):
        coordapi.call(server.url, coordapi.STATUS, tls=wrong)


def test_hold_a_stalled_handshake_holds_one_connection_not_the_server(pki, server):
    """TCP connected, no ClientHello: the accept loop goes on (status is served meanwhile) and
    the silent connection is cut off after the idle time."""
    port = server.server_address[1]
    silent = socket.create_connection(("::1", port), timeout=10)
    try:
        t0 = time.monotonic()
        assert coordapi.call(server.url, coordapi.STATUS, tls=as_machine(pki, None))["hosts"] == {}
        assert time.monotonic() - t0 < 1.5
        silent.settimeout(httpguard.IDLE_S + 3)
        assert silent.recv(1) == b""                 # closed by the server after its idle time
        assert time.monotonic() - t0 >= httpguard.IDLE_S - 0.5
    finally:
        silent.close()


def test_an_http_url_with_a_certificate_is_refused_and_plain_http_is_not_served(pki, server):
    d, _ = pki
    with pytest.raises(ValueError, match="https://"):
        coordapi.client_tls("http://[::1]:9473", etcdtls.ca_file(d))
    with pytest.raises(coordapi.CoordinatorError):
        coordapi.call(server.url.replace("https://", "http://"), coordapi.STATUS, timeout=3)


def test_the_units_carry_the_certificates_for_an_https_coordinator():
    from rlbdeploy.units import Coordination, coordinator_unit, units
    coord = Coordination(url="https://[fd00:99::1]:9473")
    host = units(FABRIC, Path("/etc/rlb/fabric.toml"), "h1", "fd00:99::11", coord)["rlb-host"]
    assert "--coordinator-ca /etc/rlb/etcd-ca.pem --coordinator-cert /etc/rlb/etcd.pem" in host
    unit = coordinator_unit(Path("/etc/rlb/fabric.toml"), "fd00:99::1", coordination=coord)["rlb-coord"]
    assert "--tls-cert /etc/rlb/coordinator-server.pem --tls-ca /etc/rlb/etcd-ca.pem" in unit
    plain = units(FABRIC, Path("/etc/rlb/fabric.toml"), "h1", "fd00:99::11",
                  Coordination(url="http://[fd00:99::1]:9473"))["rlb-host"]
    assert "--coordinator-ca" not in plain


def test_the_coordinator_command_refuses_a_ca_without_a_certificate(tmp_path):
    r = subprocess.run([sys.executable, "-m", "rlbcoord.cli", "run", "--fabric", str(ROOT / "lab" / "fabric.toml"),
                        "--port", "1", "--tls-ca", str(tmp_path / "ca.pem")], capture_output=True, text=True)
    assert r.returncode != 0 and "--tls-ca goes with --tls-cert" in r.stderr + r.stdout
