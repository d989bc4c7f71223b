"""Faults injected on purpose, to prove the agents survive them (etcd's and TiKV's failpoints):
RLB_FAILPOINTS="<loop>=hang@<when>[,...]" makes that loop's round block forever from <when> on:
a number of seconds after the process started, or an absolute path, from the moment that file
exists (armed at run time: a test under systemd hangs a loop of a running agent, mid-traffic).
Read once at import; nothing is armed without the variable, and a fresh start after a hang
(watchdog.restart) runs without it."""
from __future__ import annotations

import os
import threading
import time

ENV = "RLB_FAILPOINTS"
_started = time.monotonic()


def parse(text: str) -> dict[str, float | str]:
    """{loop: seconds after start it hangs at, or the file whose existence hangs it}; ValueError
    names what is wrong."""
    out: dict[str, float | str] = {}
    for item in filter(None, (p.strip() for p in text.split(","))):
        name, _, what = item.partition("=")
        action, _, after = what.partition("@")
        if not name or action != "hang":
            raise ValueError(f"{ENV}: {item!r} is not <loop>=hang@<seconds or /absolute/file>")
        if after.startswith("/"):
            out[name] = after
            continue
        try:
            out[name] = float(after or 0)
        except ValueError:
            raise ValueError(f"{ENV}: {item!r}: {after!r} is neither seconds nor an absolute path") from None
    return out


_armed = parse(os.environ.get(ENV, ""))


def due(when: float | str, since: float) -> bool:
    return os.path.exists(when) if isinstance(when, str) else time.monotonic() - since >= when


def check(loop: str) -> None:
    """Where a loop starts a round: blocks forever if its failpoint says so (a hung loop)."""
    if _armed and loop in _armed and due(_armed[loop], _started):
        threading.Event().wait()
