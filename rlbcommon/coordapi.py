"""The coordinator's HTTP/JSON API, as both sides use it: where each call goes, and a client.

    POST /v1/hosts/<host>/report     a host's paths, weights and QPs -> its placements
    POST /v1/switches/<leaf>/links   a leaf's uplinks, up or down
    POST /v1/gpus/<gpu>/load         rail-only: a GPU's link rates -> every rail's and domain's H
    GET  /v1/status                  hosts, QPs, link loads, balance
    GET  /metrics                    Prometheus
    GET  /healthz                    200 when serving

Plain HTTP on the management network (loopback by default): the coordinator trusts what
reaches it there, and checks every name and address against the fabric file."""
from __future__ import annotations

import http.client
import json
import urllib.error
import urllib.request

from rlbcommon.constants import COORDINATOR_PORT as DEFAULT_PORT

REPORT = "/v1/hosts/{}/report"
LINKS = "/v1/switches/{}/links"
GPU_LOAD = "/v1/gpus/{}/load"
STATUS = "/v1/status"


class CoordinatorError(RuntimeError):
    """The coordinator could not be reached or refused the call; the message says which."""


def url_for(addr: str, port: int = DEFAULT_PORT) -> str:
    host = f"[{addr}]" if ":" in addr else addr
    return f"http://{host}:{port}"


def call(base: str, path: str, body: dict | None = None, timeout: float = 2.0) -> dict:
    """POST body (or GET without one) as JSON; the decoded JSON answer."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(base.rstrip("/") + path, data=data,
                                 headers={"Content-Type": "application/json"} if data else {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return json.loads(r.read() or b"{}")
    except urllib.error.HTTPError as e:
        try:
            msg = json.loads(e.read()).get("error", "")
        except (ValueError, AttributeError):
            msg = ""
        raise CoordinatorError(f"{base}{path}: {e.code} {msg or e.reason}") from None
    except (urllib.error.URLError, OSError, ValueError, http.client.HTTPException) as e:
        # HTTPException: e.g. IncompleteRead, an answer cut short by the timeout on a busy host
        raise CoordinatorError(f"{base}{path}: {getattr(e, 'reason', None) or str(e) or repr(e)}") from None
