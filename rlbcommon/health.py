"""The health of an agent's loops: every loop (bird sync, netlink followers, sweeper, coordinator
client) reports each round as done or failed; nothing a loop meets stops it silently. The record
is exported as metrics and kept in a file beside the agent's other runtime files, so `status`
commands (other processes) show it too."""
from __future__ import annotations

import json
import logging
import os
import threading
import time
from pathlib import Path

from .paths import write_atomic

WRITE_EVERY_S = 5.0
OK_EVERY_S = 0.1         # a loop's good rounds recorded at most this often (a busy loop runs
                         # thousands a second; hangs are judged over seconds), and always the first
                         # after a failure (the supervisor tells a loop that resumed by it)
HANG_S = 60.0            # a loop that has not finished a round this long is hung (unless it says otherwise)
HANG_ENV = "RLB_HANG_S"                  # the agents' --hang-s from a unit's environment
RESTARTS_ENV = "RLB_HANG_RESTARTS"       # carried over the watchdog's fresh start (exec)


def hang_restarts() -> int:
    """How many times this agent started afresh for a hung loop (since systemd started it)."""
    try:
        return int(os.environ.get(RESTARTS_ENV, "0"))
    except ValueError:
        return 0


class Health:
    def __init__(self, path: Path | None = None, hang_s: float = HANG_S):
        self.path = path
        self.hang_s = hang_s                      # how long a round may take, unless a loop says
        self.loops: dict[str, dict] = {}
        self.lock = threading.Lock()
        self._written = 0.0
        self.expected: dict[str, float] = {}      # loop -> how long a round may take
        self.beats: dict[str, float] = {}         # loop -> when it last finished a round (monotonic)
        self.hangs: list[str] = []                # loops found hung in this process
        self._ok_at: dict[str, float] = {}        # loop -> its last ok() that was recorded (monotonic)

    def expect(self, name: str, within_s: float | None = None):
        """Loop `name` finishes a round (done or failed) at least every within_s (hang_s) from now on."""
        with self.lock:
            self.expected[name] = within_s or self.hang_s
            self.beats[name] = time.monotonic()

    def hung(self, now: float | None = None) -> list[tuple[str, float, float]]:
        """(loop, seconds since its last round, how long a round may take) of every hung loop."""
        now = time.monotonic() if now is None else now
        with self.lock:
            return [(n, now - self.beats[n], w) for n, w in self.expected.items() if now - self.beats[n] > w]

    def note_hang(self, names: list[str]):
        with self.lock:
            self.hangs += names
            for n in names:
                self._loop(n)["last_error"] = "hung"
                self._loop(n)["last_error_at"] = time.time()
            self._write()

    def _loop(self, name: str) -> dict:
        return self.loops.setdefault(name, {"errors": 0, "last_error": "", "last_error_at": 0.0, "last_ok": 0.0})

    def ok(self, name: str):
        now = time.monotonic()
        if now - self._ok_at.get(name, -OK_EVERY_S) < OK_EVERY_S:
            return
        with self.lock:
            self._ok_at[name] = now
            self._loop(name)["last_ok"] = time.time()
            self.beats[name] = now
            if time.time() - self._written >= WRITE_EVERY_S:
                self._write()

    def waiting(self, name: str):
        """A round of the loop ended waiting on something outside the agent (etcd unreachable,
        retried): the loop is alive, not hung, and not ok either (its last_ok stays: the age
        metric shows how long it has been waiting)."""
        with self.lock:
            self.beats[name] = time.monotonic()

    def failed(self, name: str, exc: BaseException, log: logging.Logger, expected: tuple = (OSError,)):
        """A round of the loop failed: one log line (with the traceback unless the error is one
        of the expected, operational kinds), counted; the loop goes on."""
        if isinstance(exc, expected):
            log.warning("%s: %s (keeping the last good state)", name, exc)
        else:
            log.exception("%s failed (keeping the last good state)", name)
        with self.lock:
            self.beats[name] = time.monotonic()
            self._ok_at.pop(name, None)           # the next good round is recorded, whenever it comes
            e = self._loop(name)
            e["errors"] += 1
            e["last_error"] = f"{type(exc).__name__}: {exc}"[:300]
            e["last_error_at"] = time.time()
            self._write()

    def _write(self):
        self._written = time.time()
        if self.path is not None:
            try:
                write_atomic(self.path, json.dumps(self.loops))
            except OSError:
                pass

    def snapshot(self) -> dict:
        with self.lock:
            return {k: dict(v) for k, v in self.loops.items()}


def read(path: Path) -> dict:
    """What a running agent last wrote (empty if none runs)."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def describe(loops: dict) -> list[str]:
    now = time.time()
    out = []
    for name, e in sorted(loops.items()):
        line = f"  {name:<14} errors {e['errors']:>5}"
        if e.get("last_ok"):
            line += f", last round {now - e['last_ok']:.1f} s ago"
        if e.get("last_error"):
            line += f", last error {now - e['last_error_at']:.0f} s ago: {e['last_error']}"
        out.append(line)
    return out
