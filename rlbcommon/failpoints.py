"""Faults injected on purpose, to prove the agents survive them (etcd's and TiKV's failpoints):
RLB_FAILPOINTS="<point>=<action>@<when>[,...]", where <when> is a number of seconds after the
process started, or an absolute path: from the moment that file exists (armed at run time: a test
under systemd hangs a loop of a running agent, mid-traffic). Actions:

    hang    the loop named <point> blocks forever where its round starts (a hung loop)
    drop    what is about to be sent at <point> is not sent (a message the network always loses,
            e.g. verbs-CONFIRM: every CONFIRM the verbs agent would send its peers)

Read once at import; nothing is armed without the variable, and a fresh start after a hang
(watchdog.restart) runs without it."""
from __future__ import annotations

import os
import threading
import time

ENV = "RLB_FAILPOINTS"
ACTIONS = ("hang", "drop")
_started = time.monotonic()


def parse(text: str) -> dict[str, tuple[str, float | str]]:
    """{point: (action, seconds after start it is armed at, or the file whose existence arms it)};
    ValueError names what is wrong."""
    out: dict[str, tuple[str, float | str]] = {}
    for item in filter(None, (p.strip() for p in text.split(","))):
        name, _, what = item.partition("=")
        action, _, after = what.partition("@")
        if not name or action not in ACTIONS:
            raise ValueError(f"{ENV}: {item!r} is not <point>={'|'.join(ACTIONS)}@<seconds or /absolute/file>")
        if after.startswith("/"):
            out[name] = (action, after)
            continue
        try:
            out[name] = (action, float(after or 0))
        except ValueError:
            raise ValueError(f"{ENV}: {item!r}: {after!r} is neither seconds nor an absolute path") from None
    return out


_armed = parse(os.environ.get(ENV, ""))
DROPS = any(action == "drop" for action, _ in _armed.values())   # for senders to test before naming a point


def due(when: float | str, since: float) -> bool:
    return os.path.exists(when) if isinstance(when, str) else time.monotonic() - since >= when


def _on(point: str, action: str) -> bool:
    got = _armed.get(point)
    return got is not None and got[0] == action and due(got[1], _started)


def check(loop: str) -> None:
    """Where a loop starts a round: blocks forever if its failpoint says so (a hung loop)."""
    if _armed and _on(loop, "hang"):
        threading.Event().wait()


def dropped(point: str) -> bool:
    """Where something is sent: True if its failpoint says to lose it."""
    return bool(_armed) and _on(point, "drop")
