"""The fabric's etcd certificates, for an operator without a PKI of their own (and for the labs):
a CA, a server certificate for the etcd members' addresses, and a client certificate per etcd
identity (keys.identities: every host, every switch, the coordinators, root), issued with the
openssl command line. Run again after the fabric grows: what exists is kept, what is missing is
issued from the same CA.

Why TLS, with passwords still the identity: over http:// a password, and the token etcd gives
for it, cross the management network in clear; whoever reads them writes as that host. TLS
hides both and checks that the member is the fabric's etcd. A client certificate adds that only
machines holding one issued by this CA may connect at all (etcd --client-cert-auth). It cannot
carry the user: etcd's JSON gateway ignores a certificate's Common Name and refuses one that
has it (etcd PR 10366), so every certificate here has none; the machine's name is in OU.

Files, in the directory given (mode 700; keys mode 600):
    ca.pem, ca.key            the CA (keep ca.key off the machines, like root's password)
    server.pem, server.key    etcd's --cert-file and --key-file (also its client side: etcd's
                              gateway connects to its own gRPC port with them)
    <user>.pem                a client's certificate and key in one file (--etcd-cert; also
                              --coordinator-cert: the coordinator reads the machine from OU)
    coordinator-server.pem    the coordinator's HTTPS certificate and key (rlbcoord run --tls-cert)"""
from __future__ import annotations

import ipaddress
import logging
import shutil
import subprocess
import tempfile
from pathlib import Path

from rlbcommon.paths import write_private
from rlbfabric.base import Fabric

from .etcdauth import ROOT_USER
from .keys import identities

log = logging.getLogger(__name__)
OPENSSL = "openssl"
CURVE = "prime256v1"             # P-256: what etcd's and Go's TLS handshake fastest
CA_DAYS, CERT_DAYS = 3650, 825   # a leaf certificate's life as browsers accept it; renew by re-issuing
O = "rlb"


def ca_file(directory: Path) -> Path:
    return directory / "ca.pem"


def client_file(directory: Path, user: str) -> Path:
    return directory / f"{user}.pem"


def server_files(directory: Path) -> tuple[Path, Path]:
    return directory / "server.pem", directory / "server.key"


def coordinator_file(directory: Path) -> Path:
    """The coordinator's HTTPS certificate and key, one file (rlbcoord run --tls-cert)."""
    return directory / "coordinator-server.pem"


def issue_coordinator(directory: Path, servers: list[str]) -> list[str]:
    """The coordinator's HTTPS certificate for `servers` (its addresses or names, as the agents'
    --coordinator URLs write them), from the CA issue() made; again when the names change."""
    ca, ca_key = ca_file(directory), directory / "ca.key"
    if not ca.exists() or not ca_key.exists():
        raise ValueError(f"no CA in {directory}: issue the fabric's certificates first")
    alt = ",".join(_alt_name(s) for s in servers)
    f = coordinator_file(directory)
    if f.exists() and _alt_names(f) == _alt_names_of(alt):
        return []
    with tempfile.TemporaryDirectory() as tmp:
        c, k = Path(tmp) / "c.pem", Path(tmp) / "c.key"
        _leaf(directory, ca, ca_key, f"/O={O}/OU=coordinator", f"subjectAltName={alt}\nextendedKeyUsage=serverAuth",
              c, k)
        write_private(f, c.read_text() + k.read_text())
    return [str(f)]


def issue(fabric: Fabric | None, directory: Path, servers: list[str]) -> list[str]:
    """Issue what is missing: the CA, the server certificate (for `servers`: the members'
    addresses or names, as clients write them in their URLs), a client certificate per identity
    of `fabric` and for root. Returns the files written. ValueError: a server name that is
    neither an address nor a DNS name, or openssl missing or failing."""
    if shutil.which(OPENSSL) is None:
        raise ValueError("openssl is not installed (apt-get install openssl)")
    if not servers:
        raise ValueError("the etcd members' addresses or names are needed for their certificate")
    alt = ",".join(_alt_name(s) for s in servers)
    directory.mkdir(parents=True, exist_ok=True)
    directory.chmod(0o700)
    written = []
    ca, ca_key = ca_file(directory), directory / "ca.key"
    if not ca.exists() or not ca_key.exists():
        _openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", f"ec_paramgen_curve:{CURVE}", "-nodes",
                 "-keyout", str(ca_key), "-out", str(ca), "-days", str(CA_DAYS), "-subj", f"/O={O}/CN=rlb etcd CA",
                 "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign")
        ca_key.chmod(0o600)
        written.append(str(ca))
    cert, key = server_files(directory)
    if not cert.exists() or not key.exists() or _alt_names(cert) != _alt_names_of(alt):
        _leaf(directory, ca, ca_key, f"/O={O}/OU=etcd", f"subjectAltName={alt}\nextendedKeyUsage=serverAuth,clientAuth",
              cert, key)
        written.append(str(cert))
    users = [ROOT_USER, *(i.user for i in identities(fabric))] if fabric is not None else [ROOT_USER]
    for user in users:
        f = client_file(directory, user)
        if not f.exists():
            with tempfile.TemporaryDirectory() as tmp:
                c, k = Path(tmp) / "c.pem", Path(tmp) / "c.key"
                _leaf(directory, ca, ca_key, f"/O={O}/OU={user}", "extendedKeyUsage=clientAuth", c, k)
                write_private(f, c.read_text() + k.read_text())
            written.append(str(f))
    log.info("etcd certificates in %s: %d issued, CA %s", directory, len(written), ca)
    return written


def _leaf(directory: Path, ca: Path, ca_key: Path, subject: str, extensions: str, cert: Path, key: Path):
    """A certificate signed by the CA, without a Common Name (etcd's gateway refuses one)."""
    with tempfile.TemporaryDirectory() as tmp:
        csr, ext = Path(tmp) / "req.csr", Path(tmp) / "ext.cnf"
        ext.write_text(f"basicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature\n{extensions}\n")
        _openssl("req", "-new", "-newkey", "ec", "-pkeyopt", f"ec_paramgen_curve:{CURVE}", "-nodes",
                 "-keyout", str(key), "-out", str(csr), "-subj", subject)
        key.chmod(0o600)
        _openssl("x509", "-req", "-in", str(csr), "-CA", str(ca), "-CAkey", str(ca_key), "-CAcreateserial",
                 "-CAserial", str(directory / "ca.srl"), "-days", str(CERT_DAYS), "-sha256",
                 "-extfile", str(ext), "-out", str(cert))


def _alt_name(server: str) -> str:
    host = server.strip("[]")
    try:
        return f"IP:{ipaddress.ip_address(host)}"
    except ValueError:
        pass
    labels = host.rstrip(".").split(".")
    if not host or not all(lb and len(lb) <= 63 and lb.replace("-", "").isalnum() for lb in labels):
        raise ValueError(f"etcd server {server!r}: an IP address or a DNS name")
    return f"DNS:{host}"


def _alt_names_of(alt: str) -> set[str]:
    """subjectAltName entries as openssl prints them (IPv6 in full, upper case)."""
    out = set()
    for entry in alt.split(","):
        kind, value = entry.split(":", 1)
        out.add(f"IP Address:{ipaddress.ip_address(value).exploded.upper()}" if kind == "IP"
                else f"DNS:{value}")
    return out


def _alt_names(cert: Path) -> set[str]:
    text = _openssl("x509", "-in", str(cert), "-noout", "-ext", "subjectAltName")
    lines = [ln.strip() for ln in text.splitlines()[1:] if ln.strip()]
    return {_normal(e.strip()) for ln in lines for e in ln.split(",")}


def _normal(entry: str) -> str:
    kind, _, value = entry.partition(":")
    if kind == "IP Address":
        return f"IP Address:{ipaddress.ip_address(value).exploded.upper()}"
    return entry


def _openssl(*args: str) -> str:
    r = subprocess.run([OPENSSL, *args], capture_output=True, text=True)
    if r.returncode != 0:
        raise ValueError(f"openssl {args[0]} failed: {r.stderr.strip()[-400:]}")
    return r.stdout
