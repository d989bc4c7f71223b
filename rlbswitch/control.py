"""How a command changes a switch: through its agent when one runs, by itself when none does.

The routing maps have one writer at a time (SwitchDataplane.claim). The agent is that writer
for its life, so a command that would change routes, settings or ports asks it over a Unix
socket in the root-only lock directory: one request per connection, a JSON object answered by a
JSON object. Without an agent the command is the writer for as long as it runs. Either way
`perform` does the work, so a change means the same with an agent or without, and the agent's
model is never changed under it."""
from __future__ import annotations

import json
import logging
import os
import socket
import struct
import time
from pathlib import Path

from rlbcommon.filelock import lock_dir
from rlbfabric.routes import Route, RouteError

from .dataplane import DataplaneError, SwitchDataplane
from .tables import Changes

log = logging.getLogger(__name__)

MAX_REQUEST = 256 << 20     # a 256k-route table is about 60 MB of JSON
WAIT_S = 60.0               # for an owner that does not answer yet (an agent loading its program)
IO_TIMEOUT_S = 300.0        # a command's wait for the answer (a big table's work included)
READ_S = 10.0               # the agent's for a request to arrive whole: a local socket is fast
ACCEPT_S = 0.5              # the serving loop's round


class ControlError(RuntimeError):
    """A request the agent could not read."""


def sock_path(instance: str) -> Path:
    return lock_dir() / f"{instance}-switch.sock"


# ---- the work, wherever it runs ------------------------------------------------------------
def perform(dp: SwitchDataplane, op: str, args: dict):
    """One change to the switch, by the process that writes its tables."""
    if op == "add":
        dp.add_route(args["route"], owner="operator")
        return None
    if op == "del":
        return dp.del_route(args["prefix"])
    if op == "apply":
        return dp.apply_routes(args["routes"], merge=args["merge"], owner="operator",
                               scope=lambda net: dp.tables.owner(net) == "operator")
    if op == "config":
        dp.set_config(**args["values"])
        return dp.config()
    if op == "detach":
        for ifname in args["interfaces"]:
            dp.detach(ifname)
        return None
    raise ControlError(f"unknown request {op!r}")


def _encode(op: str, args: dict) -> dict:
    if op == "add":
        return {"op": op, "route": args["route"].to_dict()}
    if op == "apply":
        return {"op": op, "routes": [r.to_dict() for r in args["routes"]], "merge": args["merge"]}
    return {"op": op, **args}


def _decode(req: dict) -> tuple[str, dict]:
    if not isinstance(req, dict) or not isinstance(req.get("op"), str):
        raise ControlError("a request is a JSON object with an 'op'")
    op, args = req["op"], {k: v for k, v in req.items() if k != "op"}
    try:
        if op == "add":
            args["route"] = Route.from_json(args["route"])
        elif op == "apply":
            args["routes"] = [Route.from_json(e) for e in args["routes"]]
            args["merge"] = bool(args.get("merge"))
        elif op == "del":
            args["prefix"] = str(args["prefix"])
        elif op == "config":
            if not isinstance(args.get("values"), dict):
                raise ControlError("config: 'values' must be an object")
        elif op == "detach":
            args["interfaces"] = [str(i) for i in args["interfaces"]]
    except (KeyError, TypeError) as e:
        raise ControlError(f"{op}: malformed request ({e})") from None
    return op, args


def _result_json(result):
    if isinstance(result, Changes):
        return {"changes": vars(result)}
    return {"value": result}


def _result_of(answer: dict):
    if "changes" in answer:
        return Changes(**answer["changes"])
    return answer.get("value")


# ---- a command's side --------------------------------------------------------------------
def submit(dp: SwitchDataplane, op: str, **args):
    """Make a change: as the tables' writer when nobody else is, else through the agent. Waits
    up to WAIT_S for an owner that is busy (a command) or not listening yet (an agent starting)."""
    deadline = time.monotonic() + WAIT_S
    path = sock_path(dp.instance)
    while True:
        try:
            dp.claim(0)
            return perform(dp, op, args)
        except DataplaneError:
            if dp.owns():                   # the work itself failed, as the owner
                raise
        answer = _ask(path, _encode(op, args))
        if answer is not None:
            if "error" in answer:
                raise (RouteError if answer.get("kind") == "route" else DataplaneError)(answer["error"])
            return _result_of(answer)
        if time.monotonic() >= deadline:
            raise DataplaneError(
                f"switch {dp.instance}: its tables are written by pid {dp.owner_pid()}, which has not "
                f"answered on {path} for {WAIT_S:g} s (an agent still loading its program, or a hung "
                "command: `fuser -v` on the socket and the owner file names it)")
        time.sleep(0.1)


def _ask(path: Path, request: dict) -> dict | None:
    """The agent's answer; None when no agent listens."""
    body = json.dumps(request).encode()
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC) as s:
        s.settimeout(IO_TIMEOUT_S)
        try:
            s.connect(str(path))
        except (FileNotFoundError, ConnectionRefusedError):
            return None
        s.sendall(body)
        s.shutdown(socket.SHUT_WR)
        return json.loads(_read_all(s, MAX_REQUEST))


def _read_all(s: socket.socket, limit: int) -> bytes:
    chunks, n = [], 0
    while True:
        b = s.recv(1 << 20)
        if not b:
            return b"".join(chunks)
        n += len(b)
        if n > limit:
            raise ControlError(f"more than {limit} bytes")
        chunks.append(b)


# ---- the agent's side --------------------------------------------------------------------
class ControlServer:
    """The agent's socket: requests served one at a time, in the agent's own model."""

    def __init__(self, dp: SwitchDataplane):
        if not dp.owns():
            raise DataplaneError("only the tables' writer serves the control socket")
        self.dp = dp
        self.path = sock_path(dp.instance)
        if len(os.fsencode(self.path)) > 107:            # sun_path's size, less the NUL
            raise DataplaneError(f"{self.path}: too long for a Unix socket (set RLB_RUN_DIR shorter)")
        self.served = 0
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        self.path.unlink(missing_ok=True)    # a dead owner's: we hold the tables now
        self.sock.bind(str(self.path))
        os.chmod(self.path, 0o600)
        self.sock.listen(8)
        self.sock.settimeout(ACCEPT_S)

    def round(self):
        try:
            conn, _ = self.sock.accept()
        except socket.timeout:
            return
        with conn:
            conn.settimeout(READ_S)        # a client that never finishes must not hold the loop
            pid = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))[0]
            conn.sendall(json.dumps(self.handle(conn, pid)).encode())

    def handle(self, conn: socket.socket, pid: int) -> dict:
        try:
            op, args = _decode(json.loads(_read_all(conn, MAX_REQUEST)))
            log.info("control: %s for a command (pid %d)", op, pid)
            result = perform(self.dp, op, args)
            self.served += 1
            return _result_json(result)
        except RouteError as e:
            return {"error": str(e), "kind": "route"}
        except (DataplaneError, ControlError, ValueError, OSError) as e:
            return {"error": str(e), "kind": "dataplane"}
        except Exception as e:               # noqa: BLE001 - said to the command, logged here
            log.exception("control: request failed")
            return {"error": f"the agent failed: {e}", "kind": "dataplane"}

    def close(self):
        self.sock.close()
        self.path.unlink(missing_ok=True)
