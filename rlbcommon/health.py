"""The health of an agent's loops: every loop (bird sync, netlink followers, sweeper, coordinator
client) reports each round as done or failed; nothing a loop meets stops it silently. The record
is exported as metrics and kept in a file beside the agent's other runtime files, so `status`
commands (other processes) show it too."""
from __future__ import annotations

import json
import logging
import threading
import time
from pathlib import Path

from .metrics import counter, gauge
from .paths import write_atomic

WRITE_EVERY_S = 5.0


class Health:
    def __init__(self, path: Path | None = None):
        self.path = path
        self.loops: dict[str, dict] = {}
        self.lock = threading.Lock()
        self._written = 0.0

    def _loop(self, name: str) -> dict:
        return self.loops.setdefault(name, {"errors": 0, "last_error": "", "last_error_at": 0.0, "last_ok": 0.0})

    def ok(self, name: str):
        with self.lock:
            self._loop(name)["last_ok"] = time.time()
            if time.time() - self._written >= WRITE_EVERY_S:
                self._write()

    def failed(self, name: str, exc: BaseException, log: logging.Logger, expected: tuple = (OSError,)):
        """A round of the loop failed: one log line (with the traceback unless the error is one
        of the expected, operational kinds), counted; the loop goes on."""
        if isinstance(exc, expected):
            log.warning("%s: %s (keeping the last good state)", name, exc)
        else:
            log.exception("%s failed (keeping the last good state)", name)
        with self.lock:
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

    def metrics(self, prefix: str, node: str):
        """Metric families: errors per loop, and seconds since each loop last completed a round."""
        errors = counter(f"{prefix}_loop_errors", "rounds of an agent loop that failed (the loop goes on)",
                         ["node", "loop"])
        age = gauge(f"{prefix}_loop_last_ok_age_seconds", "seconds since the loop last completed a round",
                    ["node", "loop"])
        now = time.time()
        for name, e in self.snapshot().items():
            errors.add_metric([node, name], e["errors"])
            if e["last_ok"]:
                age.add_metric([node, name], now - e["last_ok"])
        return errors, age


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
