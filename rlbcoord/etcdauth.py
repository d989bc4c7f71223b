"""Issue the fabric's etcd identities (keys.py says who may write what): a role and a user per
host, per switch and for the coordinator, each user's password in a file only root reads, then
etcd's authentication switched on. Run again after the fabric grows: what exists is kept (users,
their passwords), what is missing is added, and grants are made again (etcd keeps them once).

The root user (etcd's own administrator, which authentication needs) gets a password file too;
an operator keeps it off the machines."""
from __future__ import annotations

import ipaddress
import logging
import secrets
import ssl
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path

from rlbcommon import certs
from rlbcommon.etcd import FAILED_PRECONDITION, Etcd, EtcdError, EtcdUnavailable, tls_context
from rlbcommon.paths import write_private
from rlbcommon.secretfile import read_secret
from rlbfabric.base import Fabric

from .keys import identities

log = logging.getLogger(__name__)
ROOT_USER = "root"


def password_file(directory: Path, user: str) -> Path:
    return directory / f"{user}.password"


def read_password(path: Path) -> str:
    """A password file: one line, readable by its owner only; an error names the file."""
    text = read_secret(path, "etcd password file")
    if not text:
        raise ValueError(f"etcd password file {path} is empty")
    return text


def client(urls: str, user: str, password_file: Path | None, ca: Path | None = None,
           cert: Path | None = None, timeout: float = 2.0) -> Etcd:
    """An agent's etcd client from its options: comma-separated client URLs, its user, the file
    with its password (None: no authentication, a lab's etcd without it), the CA of etcd's
    certificate and its own certificate (https:// URLs; etcdtls.py). ValueError names what is
    wrong."""
    endpoints = [u.strip() for u in urls.split(",") if u.strip()]
    if not endpoints or not all(u.startswith(("http://", "https://")) for u in endpoints):
        raise ValueError(f"--etcd {urls!r}: client URLs, comma-separated (https://[fd00:99::1]:2379)")
    tls = tls_options(endpoints, ca, cert)
    if password_file is None:
        return Etcd(endpoints, tls=tls, timeout=timeout)
    clear = [u for u in endpoints if u.startswith("http://") and not _loopback(u)]
    if clear:
        log.warning("etcd at %s is spoken to in clear: %s's password and token cross the network "
                    "readable (https:// with --etcd-ca: docs/operations.md)", ", ".join(clear), user)
    return Etcd(endpoints, user, read_password(password_file), timeout=timeout, tls=tls)


def tls_options(endpoints: list[str], ca: Path | None, cert: Path | None) -> ssl.SSLContext | None:
    """The TLS an operator's --etcd-ca and --etcd-cert ask for (None: neither given); ValueError
    when a URL is not https:// or a file cannot be used."""
    if ca is None and cert is None:
        return None
    plain = [u for u in endpoints if not u.startswith("https://")]
    if plain:
        raise ValueError(f"--etcd-ca and --etcd-cert are for https:// URLs; {', '.join(plain)} is spoken to in clear")
    ctx = tls_context(ca, cert)
    certs.note("ca", ca)                       # their expiry on the agent's /metrics
    certs.note("client", cert)
    return ctx


def _loopback(url: str) -> bool:
    host = urllib.parse.urlsplit(url).hostname or ""
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def _password(directory: Path, user: str) -> tuple[str, bool]:
    """The user's password: from its file, or a new one written there. (password, new)"""
    f = password_file(directory, user)
    if f.exists():
        return read_password(f), False
    pw = secrets.token_urlsafe(24)
    write_private(f, pw + "\n")
    return pw, True


def _exists_already(e: EtcdError) -> bool:
    return e.code == FAILED_PRECONDITION and "already exists" in str(e)


@dataclass
class Issued:
    users_added: list[str] = field(default_factory=list)
    users_kept: list[str] = field(default_factory=list)
    auth_enabled: bool = False


def issue(fabric: Fabric, endpoints: list[str], directory: Path, timeout: float = 5.0,
          tls: ssl.SSLContext | None = None) -> Issued:
    """Create what is missing. Works on an etcd with authentication off (the first run) or on
    (later runs: as root, from root's password file). `tls`: how root reaches an https etcd."""
    directory.mkdir(parents=True, exist_ok=True)
    directory.chmod(0o700)
    root_pw, _ = _password(directory, ROOT_USER)
    admin = Etcd(endpoints, timeout=timeout, tls=tls)
    try:
        admin.get("/")                         # authentication off: anyone may read
        was_on = False
    except EtcdUnavailable:
        raise
    except EtcdError:
        admin, was_on = Etcd(endpoints, ROOT_USER, root_pw, timeout=timeout, tls=tls), True
    out = Issued()
    _add_user(admin, ROOT_USER, root_pw)
    try:
        admin.user_grant_role(ROOT_USER, ROOT_USER)
    except EtcdError as e:
        if e.code != FAILED_PRECONDITION:
            raise
    for ident in identities(fabric):
        pw, _ = _password(directory, ident.user)
        (out.users_added if _add_user(admin, ident.user, pw) else out.users_kept).append(ident.user)
        try:
            admin.role_add(ident.user)
        except EtcdError as e:
            if not _exists_already(e):
                raise
        for g in ident.grants:
            admin.role_grant(ident.user, g.prefix, g.range_end, g.perm)
        admin.user_grant_role(ident.user, ident.user)
    if not was_on:
        admin.auth_enable()
        out.auth_enabled = True
    log.info("etcd identities: %d added, %d kept; authentication %s", len(out.users_added),
             len(out.users_kept), "enabled" if out.auth_enabled else "was on already")
    return out


def _add_user(admin: Etcd, user: str, password: str) -> bool:
    """True if added; an existing user keeps its password."""
    try:
        admin.user_add(user, password)
        return True
    except EtcdError as e:
        if _exists_already(e):
            return False
        raise
