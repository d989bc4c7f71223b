"""Every agent thread runs under a supervisor: whatever a loop raises is logged (with its
traceback), counted in the agent's Health, backed off (0.1 s doubling to 5 s) and the loop starts
again; nothing dies silently. A loop that has failed for `give_up_s` without a good round since
(Health.ok) cannot resume: the supervisor sets `fatal`, and the agent's main thread exits non-zero
so systemd (Restart=on-failure) starts a fresh process."""
from __future__ import annotations

import logging
import os
import threading
import time
from typing import Callable

from .health import Health
from .threadname import name_this_thread

BACKOFF_S = (0.1, 5.0)
GIVE_UP_S = 60.0


class Supervisor:
    def __init__(self, health: Health, log: logging.Logger, stop: threading.Event | None = None,
                 give_up_s: float = GIVE_UP_S, backoff_s: tuple[float, float] = BACKOFF_S):
        self.health, self.log = health, log
        self.stop = stop or threading.Event()
        self.give_up_s, self.backoff_s = give_up_s, backoff_s
        self.fatal = threading.Event()
        self.reason = ""
        self.threads: dict[str, threading.Thread] = {}

    def start(self, name: str, loop: Callable[..., None], *args) -> threading.Thread:
        """Run loop(*args) in a thread named `name`, again each time it raises; a return ends it
        (a loop returns when its stop is set)."""
        t = threading.Thread(target=self._body, args=(name, loop, args), name=name, daemon=True)
        self.threads[name] = t
        t.start()
        return t

    def _body(self, name: str, loop: Callable[..., None], args: tuple):
        name_this_thread(name)
        delay = self.backoff_s[0]
        failing_since: float | None = None
        while not self.stop.is_set():
            started = time.time()
            try:
                loop(*args)
                return
            except Exception as e:          # noqa: BLE001 - the point: nothing ends a loop silently
                self.health.failed(name, e, self.log, expected=())
            last_ok = self.health.snapshot().get(name, {}).get("last_ok", 0.0)
            if last_ok >= started:          # it had good rounds before failing: a new failure
                failing_since, delay = None, self.backoff_s[0]
            now = time.monotonic()
            failing_since = failing_since or now
            if now - failing_since >= self.give_up_s:
                self.reason = f"loop {name} has failed for {now - failing_since:.0f} s without a good round"
                self.log.error("%s: the agent exits for a fresh start", self.reason)
                self.fatal.set()
                return
            self.stop.wait(delay)
            delay = min(self.backoff_s[1], delay * 2)

    def check(self):
        """From the agent's main loop: exit non-zero when a loop cannot resume."""
        if self.fatal.is_set():
            raise SystemExit(f"{self.reason}; exiting for a restart")

    def exit_when_fatal(self):
        """For agents whose main thread blocks elsewhere: a thread that ends the process with
        status 1 once a loop cannot resume (forwarding goes on from the pinned maps meanwhile)."""
        def watch():
            self.fatal.wait()
            self.log.critical("%s: exiting so that systemd restarts the agent", self.reason)
            logging.shutdown()
            os._exit(1)
        threading.Thread(target=watch, name="supervisor", daemon=True).start()
