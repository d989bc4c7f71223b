"""A small etcd v3 client over etcd's JSON gateway (/v3/...), standard library only.

Why our own: the agents need keys, leases, transactions, watches and password authentication
(each host and switch its own etcd user, issue 31). etcd3gw (OpenStack) speaks the same gateway
but has no password authentication and brings requests, futurist and pbr; python-etcd3 speaks
gRPC but is unmaintained and pins old grpcio/protobuf. What is used here is a few JSON calls:
keys and values are base64 on the wire, a watch is one HTTP response streaming one JSON object
per line. Several endpoints (the members of a cluster) are tried in turn.

TLS (https:// endpoints): the members' certificates are checked against the fabric's CA
(tls_context), and a client certificate is shown when etcd asks for one (--client-cert-auth).
Identity stays the password: etcd's gateway does not map a certificate's Common Name to a user
(etcd PR 10366), and refuses client certificates that carry one.

Errors: EtcdUnavailable when no endpoint answers (the caller keeps its last state and retries),
EtcdError for a refusal (etcd's gRPC code and message: permission denied, lease not found...)."""
from __future__ import annotations

import base64
import http.client
import json
import logging
import random
import socket
import ssl
import threading
import urllib.parse
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from .tls import client_context

log = logging.getLogger(__name__)

# gRPC status codes etcd answers with (google.golang.org/grpc/codes)
NOT_FOUND, PERMISSION_DENIED, FAILED_PRECONDITION, UNAVAILABLE, UNAUTHENTICATED = 5, 7, 9, 14, 16
INVALID_TOKEN = "etcdserver: invalid auth token"
MAX_TXN_OPS = 128                # etcd's --max-txn-ops default
# A watch stays open while nothing comes: re-opening one costs etcd a request (and a TLS
# handshake), about 1 ms of its CPU; at 5 s, 4k hosts' two watches each cost it a core or two
# doing nothing. A dead member is noticed by TCP keepalive instead (about 25 s), a member cut
# off from its cluster by etcd itself (require-leader ends the stream), and the stream is
# still opened afresh after WATCH_IDLE_S of silence (jittered: hosts do not come back at once).
WATCH_IDLE_S = 300.0
QUIET_WATCH_S = 20.0      # a watch of an agent's loop, opened again this often (+-20 %) when quiet:
                          # its loop beats each time, well inside the agents' hang time (60 s)
KEEPALIVE_S = (10, 5, 3)         # idle before probing, between probes, probes unanswered
REQUIRE_LEADER = {"Grpc-Metadata-Hasleader": "true"}     # clientv3's WithRequireLeader, via the gateway
TLS_HINT = (" (TLS: is --etcd-ca the CA that signed etcd's certificate, for the address in the URL? "
            "Does etcd ask for a client certificate (--etcd-cert)?)")


class EtcdError(Exception):
    """etcd refused a request (its gRPC code and message)."""

    def __init__(self, code: int, message: str):
        super().__init__(message)
        self.code = code


class EtcdCompacted(EtcdError):
    """A watch asked for a revision etcd has compacted away: read the prefix again."""

    def __init__(self, message: str):
        super().__init__(FAILED_PRECONDITION, message)


class EtcdUnavailable(EtcdError):
    """No endpoint could be reached, or none had a leader."""

    def __init__(self, message: str):
        super().__init__(UNAVAILABLE, message)


def _b64(x: bytes | str) -> str:
    return base64.b64encode(x.encode() if isinstance(x, str) else x).decode()


def _unb64(s: str | None) -> bytes:
    return base64.b64decode(s) if s else b""


def prefix_end(prefix: bytes | str) -> bytes:
    """The range end that covers every key starting with `prefix` (etcd's convention)."""
    p = bytearray(prefix.encode() if isinstance(prefix, str) else prefix)
    while p:
        if p[-1] < 0xFF:
            p[-1] += 1
            return bytes(p)
        p.pop()
    return b"\0"


@dataclass
class KeyValue:
    key: str
    value: bytes
    mod_revision: int = 0
    create_revision: int = 0
    lease: int = 0

    @classmethod
    def of(cls, kv: dict) -> "KeyValue":
        return cls(_unb64(kv.get("key")).decode(), _unb64(kv.get("value")), int(kv.get("mod_revision", 0)),
                   int(kv.get("create_revision", 0)), int(kv.get("lease", 0)))


@dataclass
class Event:
    kind: str                  # "put" or "delete"
    kv: KeyValue


def tls_context(ca: Path | None = None, cert: Path | None = None) -> ssl.SSLContext:
    """How a client checks etcd's members (rlbcommon/tls.py), errors naming etcd."""
    try:
        return client_context(ca, cert)
    except ValueError as e:
        raise ValueError(f"etcd {e}") from None


class Etcd:
    def __init__(self, endpoints: list[str] | str, user: str | None = None, password: str | None = None,
                 timeout: float = 2.0, tls: ssl.SSLContext | None = None):
        self.endpoints = [e.rstrip("/") for e in ([endpoints] if isinstance(endpoints, str) else endpoints)]
        if not self.endpoints:
            raise ValueError("etcd: no endpoint")
        plain = [e for e in self.endpoints if not e.startswith("https://")]
        if tls is not None and plain:              # a CA given for a member spoken to in clear
            raise ValueError(f"etcd: {', '.join(plain)} is not https://, yet TLS was asked for")
        if tls is None and len(plain) < len(self.endpoints):
            tls = tls_context()
        self.tls = tls
        self.user, self.password, self.timeout = user, password, timeout
        self._token: str | None = None
        self._lock = threading.Lock()
        self._good = 0                         # the endpoint that answered last
        self._local = threading.local()        # this thread's connections, by endpoint
        self._pool: ThreadPoolExecutor | None = None   # apply_parallel's senders

    # ---- transport ----------------------------------------------------------------------
    # Requests go over one kept-alive connection per thread and endpoint (a TCP handshake and a
    # gateway connection per request had cost more than the request); watches stream over a
    # connection of their own.
    def _post(self, endpoint: str, path: str, data: bytes, timeout: float, token: str | None) -> tuple[int, bytes]:
        """(HTTP status, body) of one request. A kept-alive connection the server closed while
        idle is replaced once; any other failure closes it and is raised (OSError)."""
        conns = self._local.__dict__.setdefault("conns", {})
        headers = {"Content-Type": "application/json", **({"Authorization": token} if token else {})}
        while True:
            conn = conns.get(endpoint)
            reused = conn is not None
            if conn is None:
                conn = conns[endpoint] = _connection(endpoint, timeout, self.tls)
            conn.timeout = timeout
            if conn.sock is not None:
                conn.sock.settimeout(timeout)
            try:
                conn.request("POST", f"/v3/{path}", body=data, headers=headers)
                resp = conn.getresponse()
                return resp.status, resp.read()
            except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError):
                conn.close()
                del conns[endpoint]
                if not reused:
                    raise
            except (OSError, http.client.HTTPException) as e:
                conn.close()
                del conns[endpoint]
                raise _transport_error(e) from None

    def _stream(self, endpoint: str, path: str, data: bytes, timeout: float, token: str | None) -> "_Stream":
        """A streaming request on a connection of its own, with TCP keepalive."""
        conn = _connection(endpoint, timeout, self.tls)
        headers = {"Content-Type": "application/json", **REQUIRE_LEADER, **({"Authorization": token} if token else {})}
        try:
            conn.connect()
            _keepalive(conn.sock)
            conn.request("POST", f"/v3/{path}", body=data, headers=headers)
            resp = conn.getresponse()
        except (OSError, http.client.HTTPException) as e:
            conn.close()
            raise _transport_error(e) from None
        if resp.status >= 400:
            raw = resp.read()
            conn.close()
            raise _refusal(resp.status, raw)
        return _Stream(conn, resp)

    def _request(self, path: str, body: dict, timeout: float | None = None, stream: bool = False,
                 auth: bool = True):
        """POST to the first endpoint that answers; a refusal is raised as etcd said it."""
        timeout = self.timeout if timeout is None else timeout
        data = json.dumps(body).encode()
        last = None
        n = len(self.endpoints)
        for i in range(n):
            idx = (self._good + i) % n
            endpoint = self.endpoints[idx]
            try:
                for fresh in (False, True):
                    if fresh:
                        self._token = None         # expired (simple tokens do): once more, fresh
                    token = self._auth_token() if auth and self.user else None
                    try:
                        if stream:
                            resp = self._stream(endpoint, path, data, timeout, token)
                            resp.endpoint = idx
                            self._good = idx
                            return resp
                        status, raw = self._post(endpoint, path, data, timeout, token)
                        if status >= 400:
                            raise _refusal(status, raw)
                        self._good = idx
                        return json.loads(raw or b"{}")
                    except EtcdError as err:
                        if fresh or not (token and err.code == UNAUTHENTICATED and str(err) == INVALID_TOKEN):
                            raise
            except EtcdUnavailable as e:           # authenticating found no endpoint either
                last = e
            except EtcdError as e:
                if e.code != UNAVAILABLE:          # refused: as etcd said
                    raise
                last = e                           # a member without a leader: the next one
            except OSError as e:
                last = e
        raise EtcdUnavailable(f"etcd at {', '.join(self.endpoints)}: {getattr(last, 'reason', last)}")

    def _unavailable(self, idx: int):
        """The member at endpoint `idx` lost its cluster: the next request starts with the next."""
        with self._lock:
            if self._good == idx:
                self._good = (idx + 1) % len(self.endpoints)

    def _auth_token(self) -> str:
        with self._lock:
            if self._token is None:
                r = self._request("auth/authenticate", {"name": self.user, "password": self.password or ""},
                                  auth=False)
                self._token = r["token"]
            return self._token

    # ---- keys ---------------------------------------------------------------------------
    def put(self, key: str, value: bytes | str, lease: int = 0) -> int:
        """Returns the store's revision after the write."""
        body = {"key": _b64(key), "value": _b64(value)}
        if lease:
            body["lease"] = str(lease)
        return int(self._request("kv/put", body)["header"]["revision"])

    def get(self, key: str) -> KeyValue | None:
        kvs = self._request("kv/range", {"key": _b64(key)}).get("kvs") or []
        return KeyValue.of(kvs[0]) if kvs else None

    def get_prefix(self, prefix: str) -> tuple[list[KeyValue], int]:
        """Every key under prefix and the revision they were read at (to watch from next)."""
        r = self._request("kv/range", {"key": _b64(prefix), "range_end": _b64(prefix_end(prefix))})
        return [KeyValue.of(kv) for kv in r.get("kvs") or []], int(r["header"]["revision"])

    def delete(self, key: str) -> int:
        return int(self._request("kv/deleterange", {"key": _b64(key)}).get("deleted", 0))

    def delete_prefix(self, prefix: str) -> int:
        return int(self._request("kv/deleterange", {"key": _b64(prefix),
                                                   "range_end": _b64(prefix_end(prefix))}).get("deleted", 0))

    def txn(self, compare: list[dict], success: list[dict], failure: list[dict] | None = None) -> dict:
        return self._request("kv/txn", {"compare": compare, "success": success, "failure": failure or []})

    def create(self, key: str, value: bytes | str, lease: int = 0) -> bool:
        """Put only if the key does not exist: True if this call created it."""
        put = {"key": _b64(key), "value": _b64(value)}
        if lease:
            put["lease"] = str(lease)
        r = self.txn([{"key": _b64(key), "result": "EQUAL", "target": "CREATE", "create_revision": "0"}],
                     [{"request_put": put}])
        return bool(r.get("succeeded"))

    def apply(self, puts: dict[str, bytes | str], deletes: list[str] | tuple = (), lease: int = 0,
              compare: list[dict] | None = None) -> int:
        """Writes and deletions as transactions of at most MAX_TXN_OPS each (etcd's default
        limit): one round trip per batch, not per key. Returns the store's revision after the
        last one. With `compare` (e.g. created()), each transaction applies only while it holds:
        0 from the first that did not."""
        ops = [{"request_put": {"key": _b64(k), "value": _b64(v), **({"lease": str(lease)} if lease else {})}}
               for k, v in puts.items()]
        ops += [{"request_delete_range": {"key": _b64(k)}} for k in deletes]
        rev = 0
        for i in range(0, len(ops), MAX_TXN_OPS):
            r = self.txn(compare or [], ops[i:i + MAX_TXN_OPS])
            if compare and not r.get("succeeded"):
                return 0
            rev = int(r["header"]["revision"])
        return rev

    def apply_parallel(self, puts: dict[str, bytes | str], deletes: list[str] | tuple = (),
                       compare: list[dict] | None = None, width: int = 4) -> list[tuple[dict, list, int]]:
        """apply() for writes whose order does not matter (each key once): their transactions
        sent `width` at a time, so a write of many keys to a busy etcd waits about one round
        trip, not one per MAX_TXN_OPS. Returns each transaction's (puts, deletes, revision or 0
        when `compare` failed). An error of any is raised once all have ended."""
        items: list[tuple[str, bytes | str | None]] = [*puts.items(), *((k, None) for k in deletes)]
        chunks = [items[i:i + MAX_TXN_OPS] for i in range(0, len(items), MAX_TXN_OPS)]

        def one(chunk):
            p = {k: v for k, v in chunk if v is not None}
            d = [k for k, v in chunk if v is None]
            return p, d, self.apply(p, d, compare=compare)
        if len(chunks) <= 1:
            return [one(c) for c in chunks]
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(width, thread_name_prefix="etcd-apply")
        futures = [self._pool.submit(one, c) for c in chunks]
        wait(futures)
        return [f.result() for f in futures]

    # ---- leases -------------------------------------------------------------------------
    def lease_grant(self, ttl_s: int) -> int:
        return int(self._request("lease/grant", {"TTL": str(int(ttl_s))})["ID"])

    def lease_keepalive(self, lease: int) -> int:
        """Refresh a lease; returns its TTL, or 0 when it has expired (its keys are gone)."""
        r = self._request("lease/keepalive", {"ID": str(lease)}).get("result", {})
        return int(r.get("TTL", 0))

    def lease_revoke(self, lease: int):
        try:
            self._request("lease/revoke", {"ID": str(lease)})
        except EtcdError as e:
            if e.code != NOT_FOUND:
                raise

    # ---- watches ------------------------------------------------------------------------
    def watch_prefix(self, prefix: str, start_revision: int, stop: threading.Event,
                     idle_s: float = WATCH_IDLE_S, quiet: bool = False) -> Iterator[tuple[list[Event], int]]:
        """Batches of events under prefix from start_revision on, each with the revision it
        brings the reader to, until `stop` is set (at once: the stream is shut). A stream quiet
        for idle_s (+-20 %) is re-opened from where it was (nothing is missed: etcd replays
        from the revision), after an empty batch with `quiet` (a reader that must say it is
        alive: an agent's loop); EtcdUnavailable is raised when etcd cannot be reached (or the
        member has no leader), EtcdCompacted when the revision was compacted away (read the
        prefix again), EtcdError when etcd refuses (authentication, permission)."""
        rev = start_revision
        while not stop.is_set():
            body = {"create_request": {"key": _b64(prefix), "range_end": _b64(prefix_end(prefix)),
                                       "start_revision": str(rev)}}
            resp = self._request("watch", body, stream=True)        # connected within the usual timeout
            resp.conn.sock.settimeout(idle_s * random.uniform(0.8, 1.2))
            resp.shut_on(stop)
            try:
                for line in resp:
                    if stop.is_set():
                        return
                    msg = json.loads(line)
                    if "error" in msg:
                        code, why = msg["error"].get("grpc_code", 2), msg["error"].get("message", "")
                        if code == UNAVAILABLE:    # its member lost the cluster's leader (require-leader)
                            self._unavailable(resp.endpoint)
                            raise EtcdUnavailable(f"watch {prefix} at {self.endpoints[resp.endpoint]}: {why}")
                        raise EtcdError(code, why)
                    res = msg.get("result", {})
                    if res.get("compact_revision") and int(res["compact_revision"]) > 0:
                        raise EtcdCompacted(f"revision {rev} compacted (now {res['compact_revision']})")
                    events = [Event("delete" if e.get("type") == "DELETE" else "put", KeyValue.of(e["kv"]))
                              for e in res.get("events") or []]
                    if events:
                        rev = max(e.kv.mod_revision for e in events) + 1
                        yield events, rev
            except (socket.timeout, TimeoutError):
                if quiet:
                    yield [], rev
                continue                       # quiet: open again from rev
            except (OSError, ValueError) as e:
                if stop.is_set():
                    return
                raise EtcdUnavailable(f"watch {prefix}: {e}") from None
            finally:
                resp.close()

    # ---- users and roles (an operator's, or the lab's, setup) --------------------------
    def user_add(self, name: str, password: str):
        self._request("auth/user/add", {"name": name, "password": password})

    def role_add(self, name: str):
        self._request("auth/role/add", {"name": name})

    def role_grant(self, role: str, key: str, range_end: bytes | str | None, perm: str):
        """perm: READ, WRITE or READWRITE over [key, range_end) (range_end None: the key alone)."""
        p = {"permType": perm, "key": _b64(key)}
        if range_end is not None:
            p["range_end"] = _b64(range_end)
        self._request("auth/role/grant", {"name": role, "perm": p})

    def user_grant_role(self, user: str, role: str):
        self._request("auth/user/grant", {"user": user, "role": role})

    def auth_enable(self):
        self._request("auth/enable", {})


def created(key: str, revision: int) -> dict:
    """A transaction's condition: `key` exists as created at `revision` (a leader's fence)."""
    return {"key": _b64(key), "result": "EQUAL", "target": "CREATE", "create_revision": str(revision)}


class _Stream:
    """A streaming response and its connection: lines as they come; shut (from another
    thread) when `stop` is set, so a reader blocked on a quiet stream returns at once."""

    def __init__(self, conn: http.client.HTTPConnection, resp: http.client.HTTPResponse):
        self.conn, self.resp = conn, resp
        self.endpoint = 0                      # which of the client's endpoints it streams from
        self.done = threading.Event()

    def __iter__(self):
        return iter(self.resp)

    def shut_on(self, stop: threading.Event):
        def wait():
            while not self.done.is_set():
                if stop.wait(0.5):
                    try:
                        self.conn.sock.shutdown(socket.SHUT_RDWR)
                    except (OSError, AttributeError):
                        pass
                    return
        threading.Thread(target=wait, name="etcd-watch-stop", daemon=True).start()

    def close(self):
        self.done.set()
        self.resp.close()
        self.conn.close()


def _transport_error(e: Exception) -> OSError:
    """A connection's failure as the caller sees it: its text, with the TLS options to check
    when it was the handshake or a certificate."""
    return OSError((str(e) or type(e).__name__) + (TLS_HINT if isinstance(e, ssl.SSLError) else ""))


def _keepalive(sock: socket.socket):
    idle, interval, count = KEEPALIVE_S
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, idle)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, interval)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, count)


def _connection(endpoint: str, timeout: float, tls: ssl.SSLContext | None) -> http.client.HTTPConnection:
    u = urllib.parse.urlsplit(endpoint)
    if u.scheme == "https":
        return http.client.HTTPSConnection(u.hostname, u.port, timeout=timeout, context=tls)
    return http.client.HTTPConnection(u.hostname, u.port, timeout=timeout)


def _refusal(status: int, raw: bytes) -> EtcdError:
    try:
        body = json.loads(raw or b"{}")
    except ValueError:                         # the gateway's own refusals are plain text
        body = {"message": f"HTTP {status}: {raw[:300].decode(errors='replace').strip()}"}
    if not isinstance(body, dict):
        body = {}
    if isinstance(body.get("error"), dict):    # a stream's refusal: {"error": {"grpc_code": ..}}
        body = body["error"]
    code = body.get("code", body.get("grpc_code"))
    if code is None:                           # no gRPC code: the HTTP status says enough
        code = UNAVAILABLE if status == 503 else 2
    return EtcdError(int(code), body.get("message") or body.get("error") or f"HTTP {status}")
