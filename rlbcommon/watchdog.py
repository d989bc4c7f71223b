"""Hangs are faults. Every loop of an agent beats (Health: each round done or failed) and says how
long a round may take; a loop silent past that is hung (a lock never released, a read that never
returns). The watchdog thread checks each second:

- all loops alive: systemd is told so (sd_notify WATCHDOG=1; the units set WatchdogSec=, so a
  process frozen whole, this thread too, is killed and started again by systemd);
- a loop hung: logged with its name and age, and every thread's stack (what the hung loop waits
  on, and which thread holds it), and the process starts afresh in place (exec of the
  same command: the data plane keeps forwarding from its pinned maps and the new process adopts
  them, as after any restart). The count of such restarts survives the exec (RLB_HANG_RESTARTS)
  and is exported with the loops' health."""
from __future__ import annotations

import logging
import os
import socket
import sys
import threading
import traceback
from typing import Callable

from .failpoints import ENV as FAILPOINTS_ENV
from .health import RESTARTS_ENV, Health, hang_restarts
from .threadname import name_this_thread

CHECK_S = 1.0
START_GRACE_S = 600.0    # systemd's watch while a restarted agent imports (the unit's TimeoutStartSec)


def sd_notify(state: str) -> bool:
    """Tell systemd (the unit's NOTIFY_SOCKET) `state`; False where no systemd listens."""
    addr = os.environ.get("NOTIFY_SOCKET")
    if not addr:
        return False
    if addr.startswith("@"):
        addr = "\0" + addr[1:]
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as s:
            s.sendto(state.encode(), addr)
        return True
    except OSError:
        return False


def restart(log: logging.Logger) -> None:
    """This process again, from its first line: the same command, environment and namespace,
    without injected faults, its count of hang restarts one higher. systemd's watch is widened
    for the new process's start (its imports come before its watchdog thread), which sets it
    back (Watchdog.start)."""
    env = {k: v for k, v in os.environ.items() if k != FAILPOINTS_ENV}
    env[RESTARTS_ENV] = str(hang_restarts() + 1)
    sd_notify(f"WATCHDOG_USEC={int(START_GRACE_S * 1e6)}")
    logging.shutdown()
    os.execve(sys.executable, list(sys.orig_argv), env)


def stacks(hung: list[str]) -> str:
    """Every thread's stack, the hung loops' first (a loop's thread carries its name; a foreground
    loop runs in the main thread): a hang is a wait, and the stack of the thread it waits for
    is what explains it."""
    frames = sys._current_frames()
    threads = sorted(threading.enumerate(), key=lambda t: (t.name not in hung, t.name))
    out = []
    for t in threads:
        frame = frames.get(t.ident)
        if frame is None or t is threading.current_thread():
            continue
        mark = " (hung)" if t.name in hung else ""
        out.append(f"thread {t.name}{mark}:\n" + "".join(traceback.format_stack(frame)).rstrip())
    return "\n".join(out)


class Watchdog:
    def __init__(self, health: Health, log: logging.Logger, stop: threading.Event | None = None,
                 on_hang: Callable[[logging.Logger], None] = restart, check_s: float = CHECK_S):
        self.health, self.log = health, log
        self.stop = stop or threading.Event()
        self.on_hang, self.check_s = on_hang, check_s
        self.thread: threading.Thread | None = None

    def start(self) -> "Watchdog":
        if hang_restarts():
            self.log.warning("started afresh after a hung loop (%d time(s) since systemd started the agent)",
                             hang_restarts())
        self.thread = threading.Thread(target=self._run, name="watchdog", daemon=True)
        self.thread.start()
        return self

    def _run(self):
        name_this_thread("watchdog")
        sd_notify("READY=1")
        if os.environ.get("WATCHDOG_USEC"):      # the unit's own watch, after a restart's wider one
            sd_notify(f"WATCHDOG_USEC={os.environ['WATCHDOG_USEC']}")
        while not self.stop.wait(self.check_s):
            hung = self.health.hung()
            if not hung:
                sd_notify("WATCHDOG=1")
                continue
            for name, age, within in hung:
                self.log.critical("loop %s has not finished a round for %.0f s (a round may take %.0f s): hung; "
                                  "starting afresh (forwarding goes on from the pinned maps)", name, age, within)
            names = [h[0] for h in hung]
            self.log.critical("stacks at the hang:\n%s", stacks(names))
            self.health.note_hang(names)
            self.on_hang(self.log)
            return
