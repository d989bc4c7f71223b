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


def test_the_agent_runtimes_rounds_go_on_after_failures_of_either_kind():
    """every(): an expected error is one failed round, an unexpected one goes to the supervisor;
    both are counted and the rounds go on (in a thread, and in the foreground until stop)."""
    from rlbcommon.runtime import AgentRuntime
    rt = AgentRuntime(log)
    rt.supervisor.backoff_s = (0.01, 0.05)
    rounds = {"bg": 0, "fg": 0}

    def step(name, fail_every):
        def go():
            rounds[name] += 1
            if rounds[name] % fail_every == 1:
                raise (OSError("map gone") if name == "bg" else KeyError("a bug"))
            if rounds["bg"] >= 6 and rounds["fg"] >= 6:
                rt.stop.set()
        return go
    rt.every("bg", 0.005, step("bg", 3))
    t0 = time.monotonic()
    rt.every("fg", 0.005, step("fg", 3), foreground=True)      # returns once stop is set
    assert time.monotonic() - t0 < 5
    snap = rt.health.snapshot()
    assert snap["bg"]["errors"] >= 2 and "OSError" in snap["bg"]["last_error"]
    assert snap["fg"]["errors"] >= 2 and "KeyError" in snap["fg"]["last_error"]
    assert snap["bg"]["last_ok"] > 0 and snap["fg"]["last_ok"] > 0


def test_a_slow_round_is_followed_by_the_whole_period_never_by_rounds_back_to_back():
    """Sixteen agents on two cores made each sweep outlast its 50 ms period; counting the round's
    time against the period then ran sweeps back to back and starved the agents' other threads
    (placements took 1.8 s against 0.5). Each round is followed by the whole period."""
    from rlbcommon.runtime import AgentRuntime
    rt = AgentRuntime(log)
    starts = []

    def slow():
        starts.append(time.monotonic())
        time.sleep(0.05)               # as long as the period
        if len(starts) == 6:
            rt.stop.set()
    rt.every("sweep", 0.05, slow, foreground=True)
    gaps = [b - a for a, b in zip(starts, starts[1:])]
    assert len(gaps) == 5 and min(gaps) >= 0.098, gaps      # round + period, every time


def test_the_agent_runtime_follows_netlink_and_reads_again_on_a_change():
    """follow(): the state is read once subscribed, and again on a batch that holds a change (a
    dummy link made in a scratch namespace)."""
    from pyroute2 import IPRoute
    from pyroute2.netlink.rtnl import RTMGRP_LINK
    from rlbcommon.runtime import AgentRuntime
    from .conftest import scratch_netns
    with scratch_netns("rlbrt"):
        rt, ready, reads = AgentRuntime(log), threading.Event(), []
        # the follower's thread is made in this (scratch) namespace and stays in it
        rt.follow("links", RTMGRP_LINK, lambda msgs: any(m["event"] == "RTM_NEWLINK" for m in msgs),
                  lambda: reads.append(time.monotonic()), ready)
        assert ready.wait(5) and len(reads) == 1
        with IPRoute() as ipr:
            ipr.link("add", ifname="rt0", kind="veth", peer="rt1")
        deadline = time.monotonic() + 5
        while len(reads) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        rt.stop.set()
        assert len(reads) >= 2


def test_a_good_round_after_a_failure_is_recorded_however_soon_it_comes():
    """Good rounds are recorded at most every OK_EVERY_S (a busy loop has thousands a second),
    but the first after a failure always is: the supervisor judges a restarted loop by it."""
    health = Health()
    health.ok("verbs")
    first = health.snapshot()["verbs"]["last_ok"]
    health.ok("verbs")                                   # within OK_EVERY_S: not recorded again
    assert health.snapshot()["verbs"]["last_ok"] == first
    health.failed("verbs", RuntimeError("a bad round"), log, expected=())
    failed_at = time.time()
    health.ok("verbs")                                   # at once: recorded
    assert health.snapshot()["verbs"]["last_ok"] >= failed_at > first
