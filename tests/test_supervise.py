"""The supervised loop every agent thread runs under: whatever a loop raises is logged and counted,
the loop runs again after a back-off, and a loop that cannot resume ends the agent."""
from __future__ import annotations

import logging
import threading
import time

from rlbcommon.health import Health
from rlbcommon.supervise import Supervisor

log = logging.getLogger("test")


def test_a_loop_that_raises_is_run_again_and_counted():
    health, runs, done = Health(), [], threading.Event()
    stop = threading.Event()

    def loop():
        runs.append(time.monotonic())
        if len(runs) < 3:
            raise KeyError("a map write failed")     # not an OSError: it used to end the thread
        health.ok("probes")
        done.set()
        stop.wait()

    sup = Supervisor(health, log, stop, give_up_s=30, backoff_s=(0.05, 1.0))
    sup.start("probes", loop)
    assert done.wait(5)
    stop.set()
    snap = health.snapshot()["probes"]
    assert snap["errors"] == 2 and "KeyError" in snap["last_error"] and snap["last_ok"] > 0
    assert runs[2] - runs[1] >= runs[1] - runs[0] >= 0.05 * 0.9     # backed off, doubling
    assert not sup.fatal.is_set()


def test_a_loop_that_never_has_a_good_round_ends_the_agent():
    health, stop = Health(), threading.Event()

    def loop():
        raise OSError("No such device")

    sup = Supervisor(health, log, stop, give_up_s=0.3, backoff_s=(0.02, 0.05))
    sup.start("links", loop)
    assert sup.fatal.wait(5)
    assert "links" in sup.reason and health.snapshot()["links"]["errors"] >= 3
    try:
        sup.check()
    except SystemExit as e:
        assert "exiting for a restart" in str(e)
    else:
        raise AssertionError("check() must exit")


def test_good_rounds_between_failures_keep_the_agent_running():
    """A loop that fails now and then but has good rounds in between is never given up on."""
    health, stop, n = Health(), threading.Event(), [0]

    def loop():
        n[0] += 1
        health.ok("bird")
        time.sleep(0.05)
        raise RuntimeError("bird's socket closed")

    sup = Supervisor(health, log, stop, give_up_s=0.2, backoff_s=(0.01, 0.02))
    sup.start("bird", loop)
    time.sleep(1.0)
    stop.set()
    assert n[0] >= 5 and not sup.fatal.is_set()
