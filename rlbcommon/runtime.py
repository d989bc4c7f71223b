"""What every agent runs on (the switch agent, the leaf-spine host agent, the scale-up and the
rail-only GPU agents): one Health, one stop for all its loops, and its threads under one
Supervisor. An agent writes rounds, not loops:

- `every(name, period, step)`: step(), then a wait of period (seconds, or a function giving
  them), again and again; a round that raises one of `expected` (operational: a missing map, a
  refused write) is logged and counted and the next round comes as usual; anything else goes to the supervisor (logged with
  its traceback, counted, backed off, the loop resumed; the agent exits non-zero for a restart
  when it cannot resume).
- `stream(name, session)`: a round that lasts (a watch): session(beat) beats while it is alive.
- `follow(name, groups, changed, resync)`: netlink events of `groups`; resync() once subscribed
  (so nothing falls between the read and the events) and again whenever a batch holds a change
  (`changed(messages)`); a socket that lost events (ENOBUFS) is replaced and the state read
  afresh by the same supervisor.

The foreground loop (`every(..., foreground=True)`) checks the supervisor each round."""
from __future__ import annotations

import logging
import threading
from typing import Callable

from . import failpoints
from .health import Health
from .supervise import Supervisor

Period = float | Callable[[], float]


class AgentRuntime:
    def __init__(self, log: logging.Logger, health: Health | None = None, stop: threading.Event | None = None):
        self.log = log
        self.health = health or Health()
        self.stop = stop or threading.Event()
        self.supervisor = Supervisor(self.health, log, self.stop)

    def every(self, name: str, period: Period, step: Callable[[], object], expected: tuple = (OSError,),
              wake: threading.Event | None = None, foreground: bool = False):
        """Rounds of step() until stop; `wake` set cuts a wait short. In a thread of its own,
        or (foreground) in the caller's, which it then holds until stop. A round (and its wait)
        longer than the health's hang_s, or three periods, is a hang (watchdog.py)."""
        first = period() if callable(period) else period
        self.health.expect(name, max(self.health.hang_s, 3 * first))

        def loop():
            while not self.stop.is_set():
                if foreground:
                    self.supervisor.check()       # a loop that cannot resume: exit for a restart
                failpoints.check(name)
                try:
                    step()
                    self.health.ok(name)
                except expected as e:
                    self.health.failed(name, e, self.log, expected)
                # the whole period after the round, not what is left of it: a round slowed by a
                # busy host must not turn into rounds back to back (16 agents' sweeps on two
                # cores did, and starved every other thread of the lab)
                wait = period() if callable(period) else period
                if wake is None:
                    if wait > 0:              # (rounds back to back: stop is checked above)
                        self.stop.wait(wait)
                else:
                    wake.wait(wait)
                    wake.clear()
        if not foreground:
            return self.supervisor.start(name, loop)
        while not self.stop.is_set():          # the foreground's own supervision: log, count, resume
            try:
                return loop()
            except Exception as e:             # noqa: BLE001 - nothing ends the agent silently
                self.health.failed(name, e, self.log, expected=())
                self.stop.wait(self.supervisor.backoff_s[0])

    def stream(self, name: str, session: Callable[[Callable[[], None]], None],
               within_s: float | None = None) -> threading.Thread:
        """A loop whose round is long-lived (an etcd watch, a lease kept alive): session(beat)
        runs until stop, calling beat() at least every within_s (the health's hang_s) while it
        is alive (each batch, each quiet re-open), and is called again when it returns. What it
        raises goes to the supervisor (logged with its traceback, counted, backed off, resumed);
        errors it expects it handles itself."""
        self.health.expect(name, within_s)

        def beat():
            self.health.ok(name)

        def loop():
            while not self.stop.is_set():
                failpoints.check(name)
                session(beat)
                beat()
        return self.supervisor.start(name, loop)

    def follow(self, name: str, groups: int, changed: Callable[[list], bool], resync: Callable[[], None],
               ready: threading.Event | None = None) -> threading.Thread:
        """Follow netlink `groups` in a supervised thread: `resync()` reads the state once
        subscribed (nothing falls between), then each batch goes to `changed(msgs)`, which
        applies what it can from the messages themselves and returns True when the state must
        be read again. `ready` is set after the first read. A batch and its resync longer than
        the health's hang_s is a hang."""
        # (pyroute2, which parses the events, is loaded by the agents that follow netlink, not
        # by every command that reads an agent's state: a third of such a command's start)
        from .netlinkevents import NetlinkEvents
        self.health.expect(name)

        def loop():
            with NetlinkEvents(groups) as events:
                resync()
                self.health.ok(name)
                if ready is not None:
                    ready.set()
                while not self.stop.is_set():
                    failpoints.check(name)
                    msgs = events.batch(timeout=0.5)
                    if msgs and changed(msgs):
                        resync()
                    self.health.ok(name)
        return self.supervisor.start(name, loop)
