"""The coordinator's HTTP/JSON API, as both sides use it: where each call goes, and a client.

    POST /v1/hosts/<host>/report     a host's paths, weights and QPs -> its placements
    POST /v1/switches/<leaf>/links   a leaf's uplinks, up or down
    POST /v1/gpus/<gpu>/load         rail-only: a GPU's link rates -> every rail's and domain's H
    GET  /v1/status                  hosts, QPs, link loads, balance
    GET  /metrics                    Prometheus
    GET  /healthz                    200 when serving

Plain HTTP on the management network (loopback by default): the coordinator trusts what
reaches it there, and checks every name and address against the fabric file. Over HTTPS with
client certificates (rlbcoord run --tls-cert --tls-ca; the agents' --coordinator-ca and
--coordinator-cert, the machine certificates rlbfabric etcd-tls issues), a report is taken only
from the machine it is about: a host can speak for itself alone. Status stays readable without one."""
from __future__ import annotations

import http.client
import json
import socket
import ssl
import threading
import urllib.parse
from pathlib import Path

from rlbcommon.constants import COORDINATOR_PORT as DEFAULT_PORT
from rlbcommon.tls import client_context

REPORT = "/v1/hosts/{}/report"
LINKS = "/v1/switches/{}/links"
GPU_LOAD = "/v1/gpus/{}/load"
STATUS = "/v1/status"


class CoordinatorError(RuntimeError):
    """The coordinator could not be reached or refused the call; the message says which."""


def url_for(addr: str, port: int = DEFAULT_PORT, https: bool = False) -> str:
    host = f"[{addr}]" if ":" in addr else addr
    return f"{'https' if https else 'http'}://{host}:{port}"


def client_tls(url: str | None, ca: Path | None = None, cert: Path | None = None) -> ssl.SSLContext | None:
    """How an agent speaks to the coordinator at `url`: None over http://; over https:// the
    server checked against `ca` (None: the system's CAs), `cert` shown as this machine's identity.
    ValueError: a CA or certificate for an http:// URL, or a file that cannot be used."""
    if not url or not url.startswith("https://"):
        if ca or cert:
            raise ValueError(f"a CA or certificate for the coordinator goes with an https:// URL, "
                             f"not {url or 'none'}")
        return None
    return client_context(ca, cert)


# The TLS session each (coordinator, context) gave last: the next report resumes it, without the
# two certificate checks of a full handshake. The server still knows the client: a resumed
# session carries the certificate it was made with. Measured (bench/coord_tls_bench.py, OpenSSL
# 3.0): the coordinator's CPU a report 0.8 ms plain, 5.8 ms with a full handshake, 3.8 resumed.
_sessions: dict[tuple[str, int], ssl.SSLSession] = {}
_sessions_lock = threading.Lock()


class _Resuming(http.client.HTTPSConnection):
    def connect(self):
        key = (f"{self.host}:{self.port}", id(self._context))
        with _sessions_lock:
            session = _sessions.get(key)
        sock = socket.create_connection((self.host, self.port), self.timeout)
        try:
            self.sock = self._context.wrap_socket(sock, server_hostname=self.host, session=session)
        except (OSError, ValueError):
            sock.close()
            raise
        self.tls_sock, self._key = self.sock, key

    def remember(self):
        """Keep the session for the next call: read from the socket the answer comes on, before
        the answer is read to its end (http.client then closes it, and its session with it)."""
        session = self.tls_sock.session
        if session is not None:
            with _sessions_lock:
                _sessions[self._key] = session


def call(base: str, path: str, body: dict | None = None, timeout: float = 2.0,
         tls: ssl.SSLContext | None = None) -> dict:
    """POST body (or GET without one) as JSON; the decoded JSON answer. `tls`: client_tls's (an
    https:// URL without one: the system's CAs)."""
    data = None if body is None else json.dumps(body).encode()
    u = urllib.parse.urlsplit(base.rstrip("/") + path)
    try:
        if u.scheme == "https":
            conn = _Resuming(u.hostname, u.port or 443, timeout=timeout, context=tls or client_context())
        elif u.scheme == "http":
            conn = http.client.HTTPConnection(u.hostname, u.port or 80, timeout=timeout)
        else:
            raise CoordinatorError(f"{base}: an http:// or https:// URL")
    except ValueError as e:                    # a port that is no number
        raise CoordinatorError(f"{base}: {e}") from None
    try:
        conn.request("POST" if data is not None else "GET", u.path, body=data,
                     headers={"Content-Type": "application/json"} if data is not None else {})
        resp = conn.getresponse()
        if isinstance(conn, _Resuming):
            conn.remember()                    # the ticket came before the answer's head
        raw = resp.read()
    except (OSError, ValueError, http.client.HTTPException) as e:
        # HTTPException: e.g. IncompleteRead, an answer cut short by the timeout on a busy host
        raise CoordinatorError(f"{base}{path}: {getattr(e, 'reason', None) or str(e) or repr(e)}") from None
    finally:
        conn.close()
    if resp.status >= 400:
        try:
            msg = json.loads(raw).get("error", "")
        except (ValueError, AttributeError):
            msg = ""
        raise CoordinatorError(f"{base}{path}: {resp.status} {msg or resp.reason}")
    try:
        return json.loads(raw or b"{}")
    except ValueError as e:
        raise CoordinatorError(f"{base}{path}: not JSON ({e})") from None
