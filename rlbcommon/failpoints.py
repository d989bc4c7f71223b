"""Faults injected on purpose, to prove the agents survive them (etcd's and TiKV's failpoints):
RLB_FAILPOINTS="<loop>=hang@<seconds>[,...]" makes that loop's round block forever once the
process has run that long. Read once at import; nothing is armed without the variable, and a
fresh start after a hang (watchdog.restart) runs without it."""
from __future__ import annotations

import os
import threading
import time

ENV = "RLB_FAILPOINTS"
_started = time.monotonic()


def parse(text: str) -> dict[str, float]:
    """{loop: seconds after start it hangs at}; ValueError names what is wrong."""
    out = {}
    for item in filter(None, (p.strip() for p in text.split(","))):
        name, _, what = item.partition("=")
        action, _, after = what.partition("@")
        if not name or action != "hang":
            raise ValueError(f"{ENV}: {item!r} is not <loop>=hang@<seconds>")
        try:
            out[name] = float(after or 0)
        except ValueError:
            raise ValueError(f"{ENV}: {item!r}: {after!r} is not a number of seconds") from None
    return out


_armed = parse(os.environ.get(ENV, ""))


def check(loop: str) -> None:
    """Where a loop starts a round: blocks forever if its failpoint says so (a hung loop)."""
    if _armed and loop in _armed and time.monotonic() - _started >= _armed[loop]:
        threading.Event().wait()
