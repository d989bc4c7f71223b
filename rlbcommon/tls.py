"""TLS as the fabric uses it, for etcd and the coordinator alike: a client checks the server
against the fabric's CA (rlbfabric etcd-tls issues one) and shows its machine's certificate; a
server shows its own and reads who a client is from its certificate. A machine's certificate
names it in its Organizational Unit (rlb-host-<machine>, rlb-switch-<switch>: coord/keys.py), not
its Common Name, which etcd's gateway refuses (etcd PR 10366)."""
from __future__ import annotations

import ssl
from pathlib import Path


def client_context(ca: Path | None = None, cert: Path | None = None) -> ssl.SSLContext:
    """How a client checks a server: against `ca` (None: the system's CAs), names or addresses as
    in the URL; `cert`: a PEM file with this client's certificate and its key, for a server that
    asks for one. ValueError names the file that cannot be used."""
    try:
        ctx = ssl.create_default_context(cafile=str(ca) if ca else None)
    except (OSError, ssl.SSLError) as e:
        raise ValueError(f"CA file {ca}: {getattr(e, 'strerror', None) or e}") from None
    if cert is not None:
        try:
            ctx.load_cert_chain(str(cert))
        except (OSError, ssl.SSLError) as e:
            raise ValueError(f"client certificate {cert}: {getattr(e, 'strerror', None) or e} "
                             "(one PEM file: the certificate, then its private key)") from None
    return ctx


def server_context(cert: Path, clients_ca: Path | None = None) -> ssl.SSLContext:
    """A server showing `cert` (its certificate and key in one PEM file). With `clients_ca`, a
    client may show a certificate of that CA (one of another CA fails the handshake); whether it
    must is the server's call per request (peer_unit). ValueError names the file."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        ctx.load_cert_chain(str(cert))
    except (OSError, ssl.SSLError) as e:
        raise ValueError(f"server certificate {cert}: {getattr(e, 'strerror', None) or e} "
                         "(one PEM file: the certificate, then its private key)") from None
    if clients_ca is not None:
        try:
            ctx.load_verify_locations(cafile=str(clients_ca))
        except (OSError, ssl.SSLError) as e:
            raise ValueError(f"CA file {clients_ca}: {getattr(e, 'strerror', None) or e}") from None
        ctx.verify_mode = ssl.CERT_OPTIONAL
    return ctx


def peer_unit(sock) -> str | None:
    """The Organizational Unit of the certificate a TLS peer showed (checked against the CA by
    the handshake), or None: no TLS, no certificate, or none with a unit."""
    getpeercert = getattr(sock, "getpeercert", None)
    cert = getpeercert() if getpeercert else None
    for rdn in (cert or {}).get("subject", ()):
        for key, value in rdn:
            if key == "organizationalUnitName":
                return value
    return None
