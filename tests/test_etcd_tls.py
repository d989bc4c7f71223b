"""etcd over TLS against a real etcd (Debian's etcd-server) with --client-cert-auth and
authentication on, as a site runs it: rlbfabric etcd-tls's certificates; the identities still
hold over it; what is refused, and how it reads; and what crosses the network, seen through a
TCP relay between client and etcd: the password and the token in clear over http://, neither
over https:// (issue 31: identity)."""
from __future__ import annotations

import logging
import os
import shutil
import stat
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from rlbcommon.etcd import PERMISSION_DENIED, Etcd, EtcdError, EtcdUnavailable, tls_context
from rlbcommon.metrics import serve
from rlbcoord import etcdauth, etcdtls, keys
from rlbfabric.fabric import load
from rlblab.etcdserver import EtcdServer

from .ports import free_port
from .relay import Relay

LAB = Path(__file__).resolve().parent.parent / "lab"
FABRIC = load(LAB / "fabric.toml")


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("pki") / "etcd"
    etcdtls.issue(FABRIC, d, ["127.0.0.1", "localhost"])
    return d


@pytest.fixture(scope="module")
def etcd(pki, tmp_path_factory):
    server = EtcdServer(tmp_path_factory.mktemp("etcd"), client_port=free_port(), peer_port=free_port(),
                        tls=pki).start()
    try:
        etcdauth.issue(FABRIC, [server.url], pki, tls=server.client_tls())
        yield server
    finally:
        server.stop()


def as_user(server: EtcdServer, pki: Path, user: str, url: str | None = None, timeout: float = 2.0) -> Etcd:
    return etcdauth.client(url or server.url, user, etcdauth.password_file(pki, user), etcdtls.ca_file(pki),
                           etcdtls.client_file(pki, user), timeout=timeout)


def subject(cert: Path) -> str:
    return subprocess.run(["openssl", "x509", "-in", str(cert), "-noout", "-subject"], capture_output=True,
                          text=True, check=True).stdout.strip()


def test_the_certificates_every_machine_gets(pki):
    users = [etcdauth.ROOT_USER, *(i.user for i in keys.identities(FABRIC))]
    assert stat.S_IMODE(pki.stat().st_mode) == 0o700
    assert stat.S_IMODE((pki / "ca.key").stat().st_mode) == 0o600
    assert stat.S_IMODE(etcdtls.server_files(pki)[1].stat().st_mode) == 0o600
    for user in users:
        f = etcdtls.client_file(pki, user)
        assert stat.S_IMODE(f.stat().st_mode) == 0o600
        text = f.read_text()
        assert "BEGIN CERTIFICATE" in text and "PRIVATE KEY" in text        # one file: --etcd-cert
        # etcd's gateway refuses a client certificate with a Common Name: none has one
        assert subject(f) == f"subject=O = rlb, OU = {user}"
    assert subject(etcdtls.server_files(pki)[0]) == "subject=O = rlb, OU = etcd"
    assert etcdtls._alt_names(etcdtls.server_files(pki)[0]) == {"IP Address:127.0.0.1", "DNS:localhost"}


def test_issuing_again_keeps_what_exists_and_a_new_member_gets_a_new_server_certificate(pki, tmp_path):
    d = tmp_path / "again"
    etcdtls.issue(None, d, ["127.0.0.1"])
    ca, root = etcdtls.ca_file(d).read_text(), etcdtls.client_file(d, etcdauth.ROOT_USER).read_text()
    server = etcdtls.server_files(d)[0].read_text()
    assert etcdtls.issue(None, d, ["127.0.0.1"]) == []
    assert etcdtls.issue(None, d, ["127.0.0.1", "fd00:99::2"]) == [str(etcdtls.server_files(d)[0])]
    assert etcdtls.ca_file(d).read_text() == ca and etcdtls.client_file(d, etcdauth.ROOT_USER).read_text() == root
    assert etcdtls.server_files(d)[0].read_text() != server
    assert etcdtls._alt_names(etcdtls.server_files(d)[0]) == {"IP Address:127.0.0.1",
                                                               "IP Address:FD00:0099:0000:0000:0000:0000:0000:0002"}
    with pytest.raises(ValueError, match="an IP address or a DNS name"):
        etcdtls.issue(None, d, ["etcd one"])


def test_over_tls_a_host_still_writes_only_its_own_keys(etcd, pki):
    h1 = as_user(etcd, pki, keys.host_user("h1"))
    h1.put(keys.host_prefix("h1") + "report", "{}")
    assert h1.get(keys.host_prefix("h1") + "report").value == b"{}"
    with pytest.raises(EtcdError) as e:
        h1.put(keys.host_prefix("h2") + "report", "forged")
    assert e.value.code == PERMISSION_DENIED
    # h2's certificate with h1's password is still h1: the password is the identity
    mixed = etcdauth.client(etcd.url, keys.host_user("h1"), etcdauth.password_file(pki, keys.host_user("h1")),
                            etcdtls.ca_file(pki), etcdtls.client_file(pki, keys.host_user("h2")))
    with pytest.raises(EtcdError) as e:
        mixed.put(keys.host_prefix("h2") + "report", "forged")
    assert e.value.code == PERMISSION_DENIED


def test_what_is_refused_says_why(etcd, pki):
    user = keys.host_user("h1")
    pw = etcdauth.password_file(pki, user)
    # not our CA: the system's CAs do not know the fabric's
    with pytest.raises(EtcdUnavailable, match="certificate verify failed.*--etcd-ca"):
        etcdauth.client(etcd.url, user, pw).get(keys.host_prefix("h1"))
    # our CA but no client certificate: etcd ends the handshake
    with pytest.raises(EtcdUnavailable, match="--etcd-cert"):
        etcdauth.client(etcd.url, user, pw, etcdtls.ca_file(pki)).get(keys.host_prefix("h1"))
    # the member reached at an address its certificate does not name
    port = int(etcd.url.rsplit(":", 1)[1])
    relay = Relay(port, "127.0.0.2")
    try:
        with pytest.raises(EtcdUnavailable, match="IP address mismatch"):
            as_user(etcd, pki, user, url=f"https://127.0.0.2:{relay.port}").get(keys.host_prefix("h1"))
    finally:
        relay.close()
    # a CA for a member spoken to in clear, or a certificate that is no PEM of both
    with pytest.raises(ValueError, match="https://"):
        etcdauth.client("http://127.0.0.1:2379", user, pw, etcdtls.ca_file(pki))
    with pytest.raises(ValueError, match="not https://"):
        Etcd(["https://127.0.0.1:1", "http://127.0.0.1:2"], tls=tls_context(etcdtls.ca_file(pki)))
    with pytest.raises(ValueError, match=r"client certificate .*ca\.pem.*private key"):
        tls_context(etcdtls.ca_file(pki), etcdtls.ca_file(pki))
    with pytest.raises(ValueError, match="CA file /nonexistent"):
        tls_context(Path("/nonexistent"))


def test_a_client_certificate_with_a_common_name_is_refused_by_the_gateway(etcd, pki, tmp_path):
    """Why etcdtls issues none with a CN: etcd's JSON gateway refuses them (etcd PR 10366)."""
    key, csr, crt = tmp_path / "k", tmp_path / "csr", tmp_path / "crt"
    subprocess.run(["openssl", "req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                    "-nodes", "-keyout", str(key), "-out", str(csr), "-subj", f"/CN={keys.host_user('h1')}"],
                   check=True, capture_output=True)
    subprocess.run(["openssl", "x509", "-req", "-in", str(csr), "-CA", str(etcdtls.ca_file(pki)), "-CAkey",
                    str(pki / "ca.key"), "-CAserial", str(tmp_path / "srl"), "-CAcreateserial", "-days", "1",
                    "-out", str(crt)], check=True, capture_output=True)
    pem = tmp_path / "cn.pem"
    pem.write_text(crt.read_text() + key.read_text())
    client = Etcd(etcd.url, tls=tls_context(etcdtls.ca_file(pki), pem))
    with pytest.raises(EtcdError, match="CommonName"):
        client.get(keys.host_prefix("h1"))


def _through_relay(url: str, client_of) -> tuple[bytes, str, str]:
    """What the wire carried while a host authenticated and wrote its report: (bytes, password,
    token)."""
    port = int(url.rsplit(":", 1)[1])
    relay = Relay(port)
    try:
        client = client_of(url.replace(f":{port}", f":{relay.port}"))
        client.put(keys.host_prefix("h1") + "report", '{"paths": {}}')
        with relay.lock:
            return bytes(relay.seen), client.password, client._token
    finally:
        relay.close()


def test_over_https_the_network_sees_neither_password_nor_token(etcd, pki, tmp_path_factory):
    user = keys.host_user("h1")
    seen, password, token = _through_relay(etcd.url, lambda url: as_user(etcd, pki, user, url=url))
    assert len(seen) > 1000 and token                       # the exchange went through the relay
    assert password.encode() not in seen and token.encode() not in seen
    assert b"report" not in seen and keys.host_prefix("h1").encode() not in seen
    # the same exchange with an etcd spoken to in clear: both are there for anyone to read
    work = tmp_path_factory.mktemp("clear")
    clear = EtcdServer(work, client_port=free_port(), peer_port=free_port()).start()
    try:
        etcdauth.issue(FABRIC, [clear.url], work / "creds")
        seen, password, token = _through_relay(
            clear.url, lambda url: etcdauth.client(url, user, etcdauth.password_file(work / "creds", user)))
        assert password.encode() in seen and token.encode() in seen
    finally:
        clear.stop()


def test_a_password_sent_in_clear_over_the_network_is_warned_about(pki, caplog):
    user = keys.host_user("h1")
    pw = etcdauth.password_file(pki, user)
    with caplog.at_level(logging.WARNING, logger=etcdauth.__name__):
        etcdauth.client("http://127.0.0.1:2379,http://[::1]:2379", user, pw)
        assert not caplog.records                            # loopback: nothing crosses a network
        etcdauth.client("http://[fd00:99::1]:2379", user, pw)
    assert [r.getMessage() for r in caplog.records] == [
        f"etcd at http://[fd00:99::1]:2379 is spoken to in clear: {user}'s password and token cross the "
        "network readable (https:// with --etcd-ca: docs/operations.md)"]


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True,
                          env={**os.environ, "COLUMNS": "250"})       # a message on one line


def test_the_operators_commands(tmp_path):
    out = tmp_path / "etcd"
    r = cli("rlbdeploy.cli", "etcd-tls", "--fabric", str(LAB / "fabric.toml"), "--server", "10.0.0.2",
            "--server", "etcd1.example.net", "-o", str(out))
    assert r.returncode == 0, r.stderr
    users = [etcdauth.ROOT_USER, *(i.user for i in keys.identities(FABRIC))]
    assert f"{len(users) + 2} files issued in {out}" in r.stdout
    assert etcdtls._alt_names(etcdtls.server_files(out)[0]) == {"IP Address:10.0.0.2", "DNS:etcd1.example.net"}
    bad = cli("rlbdeploy.cli", "etcd-tls", "--fabric", str(LAB / "fabric.toml"), "--server", "a b", "-o", str(out))
    assert bad.returncode == 2 and "'a b': an IP address or a DNS name" in bad.stderr
    clear = cli("rlbdeploy.cli", "etcd-users", "--fabric", str(LAB / "fabric.toml"), "--etcd", "http://10.0.0.2:2379",
                "--etcd-ca", str(etcdtls.ca_file(out)))
    assert clear.returncode == 2 and "--etcd-ca and --etcd-cert are for https:// URLs" in clear.stderr
    # an agent given a CA without etcd, or a CA for a member spoken to in clear, says so and stops
    coord = cli("rlbcoord.cli", "run", "--fabric", str(LAB / "fabric.toml"), "--etcd-ca", str(out / "ca.pem"))
    assert coord.returncode != 0 and "--etcd-ca and --etcd-cert go with --etcd" in coord.stderr
    coord = cli("rlbcoord.cli", "run", "--fabric", str(LAB / "fabric.toml"), "--etcd", "http://[::1]:1",
                "--etcd-ca", str(out / "ca.pem"))
    assert coord.returncode != 0 and "http://[::1]:1 is spoken to in clear" in coord.stderr


def test_a_member_its_starter_cannot_reach_is_stopped_not_left_running(pki, tmp_path):
    """start() that fails (here: no root certificate to check readiness with) stops the etcd it
    started: nothing is left running for a test or a lab to trip over."""
    d = tmp_path / "server-only"
    d.mkdir()
    for f in (*etcdtls.server_files(pki), etcdtls.ca_file(pki)):
        (d / f.name).write_bytes(f.read_bytes())
    server = EtcdServer(tmp_path / "etcd", client_port=free_port(), peer_port=free_port(), tls=d)
    with pytest.raises(ValueError, match="root.pem"):
        server.start()
    assert server.proc is None
    running = subprocess.run(["pgrep", "-f", str(server.data)], capture_output=True, text=True).stdout
    assert running == ""


def test_an_agents_metrics_say_when_its_etcd_certificates_expire_and_see_a_renewal(pki, tmp_path):
    """What RlbEtcdCertExpiring reads: each etcd TLS file an agent uses, on the /metrics every
    agent serves (rlbcommon.metrics.serve), read again when the file is replaced."""
    mine = tmp_path / "h1.pem"
    shutil.copy(etcdtls.client_file(pki, keys.host_user("h1")), mine)
    etcdauth.client("https://127.0.0.1:2379", keys.host_user("h1"), None, etcdtls.ca_file(pki), mine)
    port = free_port()
    serve(Nothing(), port)
    def scrape() -> dict[str, float]:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
            text = r.read().decode()
        return {ln.split('file="')[1].split('"')[0]: float(ln.split()[-1]) for ln in text.splitlines()
                if ln.startswith("rlb_etcd_cert_expiry_timestamp_seconds{")}
    now = time.time()
    got = scrape()
    assert abs(got["client"] - (now + etcdtls.CERT_DAYS * 86400)) < 2 * 86400, got
    assert abs(got["ca"] - (now + etcdtls.CA_DAYS * 86400)) < 2 * 86400, got
    # renewed by an operator (here: a certificate of 10 days, from the same CA)
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                    "-nodes", "-keyout", str(tmp_path / "k.pem"), "-out", str(tmp_path / "c.pem"), "-days", "10",
                    "-subj", "/O=rlb"], check=True, capture_output=True)
    mine.write_text((tmp_path / "c.pem").read_text() + (tmp_path / "k.pem").read_text())
    os.utime(mine, ns=(time.time_ns() + 10**9, time.time_ns() + 10**9))
    assert abs(scrape()["client"] - (now + 10 * 86400)) < 2 * 86400


class Nothing:
    def collect(self):
        return iter(())
