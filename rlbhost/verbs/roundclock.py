"""What a long round of the verbs thread spent its time on.

Libraries wait 20 ms for an answer by default, and a library whose agent says nothing for twice
that stops asking for a second: a stall of a few hundred milliseconds keeps thousands of QPs on
their addresses. Whether such a stall is the thread's own work (a burst, a reap), another thread
holding the interpreter's lock, or the CPU given to other processes, decides what to do about it;
so every round is timed by part, and a round longer than SLOW_NS (or one whose wait for work
ended that much past its timeout: the thread woke late) is counted and logged with its parts, and
with the thread's own CPU, its time queued for a CPU (the kernel's schedstat for this thread) and
the interpreter's garbage collections (in any thread: each holds the interpreter's lock) since
the round before ended. The rest was spent waiting: for work, for the interpreter's lock
(another thread held it), or in the kernel.

A round costs a few clock reads and one pread of schedstat; only a slow one a log line."""
from __future__ import annotations

import gc
import logging
import os

from .peerlink import mono_ns

log = logging.getLogger(__name__)

SLOW_NS = 50_000_000          # a round this long already kept questions past a library's 20 ms
LOG_EVERY_NS = 1_000_000_000  # at most one line a second; the others are counted in it


class _Collections:
    """Time the interpreter spent collecting garbage, in any thread (a collection holds the
    interpreter's lock: every thread waits on it)."""
    total_ns = 0
    full = 0                   # full collections (the oldest generation), and their time
    full_ns = 0
    longest_ns = 0
    _since = 0
    installed = False

    @classmethod
    def install(cls):
        if not cls.installed:
            gc.callbacks.append(cls._callback)
            cls.installed = True

    @classmethod
    def _callback(cls, phase: str, info: dict):
        if phase == "start":
            cls._since = mono_ns()
        elif cls._since:
            took = mono_ns() - cls._since
            cls.total_ns += took
            cls.longest_ns = max(cls.longest_ns, took)
            if info.get("generation") == 2:
                cls.full += 1
                cls.full_ns += took
            cls._since = 0


def garbage() -> dict:
    """What collecting garbage has cost this process since the first RoundClock (status file)."""
    c = _Collections
    return {"collecting_ms": round(c.total_ns / 1e6, 1), "full": c.full, "full_ms": round(c.full_ns / 1e6, 1),
            "longest_ms": round(c.longest_ns / 1e6, 1)}


class RoundClock:
    def __init__(self, slow_ns: int = SLOW_NS):
        self.slow_ns = slow_ns
        self.slow = 0                  # rounds over slow_ns so far
        self.longest_ns = 0
        self._fd: int | None = None    # this thread's schedstat (opened from the thread timed)
        self._unlogged = 0
        self._logged_ns = 0
        self.t0 = self.waited_ns = self.late_ns = 0
        self.sched0 = (-1, -1)         # (on a CPU, queued for one) at the last round's end
        self.parts: list[tuple[str, int]] = []
        self.gc0 = 0                   # _Collections.total_ns at the last round's end
        _Collections.install()

    def start(self, waited_ns: int = 0, timeout_ns: int | None = None):
        """A round begins: its select, asked to wait `timeout_ns` at most, returned after
        `waited_ns` (past its timeout by slow_ns or more: the thread woke late, a stall too)."""
        self.t0 = mono_ns()
        self.waited_ns = waited_ns
        self.late_ns = 0 if timeout_ns is None else max(0, waited_ns - timeout_ns)
        self.parts = []

    def mark(self, part: str):
        """`part` of the round has ended now."""
        self.parts.append((part, mono_ns()))

    def end(self) -> bool:
        """The round is over: True (and counted, and perhaps logged) if it was slow. The thread's
        CPU and queueing are read once a round, here: a slow round's figures cover it and the
        wait before it (a wait for work costs no CPU; a late wake-up shows as queued)."""
        now = mono_ns()
        took = now - self.t0
        sched, self.sched0 = self.sched0, self._sched()
        collecting, self.gc0 = _Collections.total_ns - self.gc0, _Collections.total_ns
        if took < self.slow_ns and self.late_ns < self.slow_ns:
            return False
        self.slow += 1
        self.longest_ns = max(self.longest_ns, took + self.late_ns)
        if now - self._logged_ns < LOG_EVERY_NS:
            self._unlogged += 1
            return True
        parts, last = [], self.t0
        for name, t in self.parts:
            if t - last >= 1_000_000:
                parts.append(f"{name} {(t - last) / 1e6:.0f}")
            last = t
        known = min(sched + self.sched0) >= 0
        cpu, queued = (self.sched0[0] - sched[0], self.sched0[1] - sched[1]) if known else (-1, -1)
        woke = f", {self.late_ns / 1e6:.0f} ms past its timeout" if self.late_ns >= 1_000_000 else ""
        log.warning("verbs: a round took %.0f ms (after %.0f ms waiting for work%s); in both, the thread's own CPU %s, "
                    "queued for a CPU %s, the interpreter collecting garbage %s (in any thread), the rest waiting for "
                    "work, on the interpreter's lock or in the kernel; the round by part (ms): %s%s",
                    took / 1e6, self.waited_ns / 1e6, woke, _ms(cpu), _ms(queued), _ms(collecting),
                    ", ".join(parts) or "none over 1",
                    f" ({self._unlogged} more slow rounds since the last line)" if self._unlogged else "")
        self._logged_ns, self._unlogged = now, 0
        return True

    def _sched(self) -> tuple[int, int]:
        """This thread's (ns on a CPU, ns waiting on a run queue) from schedstat, or (-1, -1)."""
        if self._fd is None:
            try:
                self._fd = os.open("/proc/thread-self/schedstat", os.O_RDONLY | os.O_CLOEXEC)
            except OSError:
                self._fd = -1
        if self._fd < 0:
            return -1, -1
        try:
            f = os.pread(self._fd, 64, 0).split()
            return int(f[0]), int(f[1])
        except (OSError, IndexError, ValueError):
            return -1, -1


def _ms(ns: int) -> str:
    return f"{ns / 1e6:.0f} ms" if ns >= 0 else "unknown"
