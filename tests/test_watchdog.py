"""Hangs are faults (rlbcommon/watchdog.py, health.py, failpoints.py): a loop that stops finishing
rounds is found, systemd hears only while every loop is alive, a hung loop starts the agent
afresh, and the units ask systemd to watch."""
from __future__ import annotations

import logging
import socket
import threading
import time
from pathlib import Path

import pytest

from rlbcommon import failpoints
from rlbcommon.health import RESTARTS_ENV, Health
from rlbcommon.metrics import loop_health
from rlbcommon.runtime import AgentRuntime
from rlbcommon.watchdog import Watchdog
from rlbdeploy import units as deploy
from rlbfabric.fabric import load

log = logging.getLogger("test")
ROOT = Path(__file__).resolve().parent.parent


def test_a_loop_silent_longer_than_its_round_may_take_is_hung_and_one_that_beats_is_not():
    h = Health(hang_s=10)
    h.expect("sweep")
    h.expect("slow", 30)
    t0 = time.monotonic()
    assert h.hung(t0 + 9) == []
    [(name, age, within)] = h.hung(t0 + 11)
    assert name == "sweep" and 11 <= age < 12 and within == 10
    h.ok("sweep")                                      # a round done
    assert h.hung(time.monotonic() + 9) == []
    h.failed("slow", OSError("refused"), log)          # a round failed is a round finished too
    assert sorted(n for n, _, _ in h.hung(time.monotonic() + 31)) == ["slow", "sweep"]


def test_the_runtime_expects_rounds_of_every_loop_within_three_periods_or_the_hang_time():
    h = Health(hang_s=5)
    rt = AgentRuntime(log, h)
    rt.every("fast", 0.01, lambda: None)
    rt.every("slow", 4.0, lambda: None)
    try:
        assert h.expected == {"fast": 5, "slow": 12.0}
    finally:
        rt.stop.set()


def test_a_stream_that_beats_is_alive_however_long_its_round_and_one_that_stops_beating_is_hung():
    """runtime.stream: a round that lasts (a watch) is alive while it beats; when it stops beating
    (a read that never returns) it is hung within the hang time; a round that ends is begun again."""
    h = Health(hang_s=0.4)
    rt = AgentRuntime(log, h)
    stuck, block, rounds = threading.Event(), threading.Event(), []

    def session(beat):
        rounds.append(1)
        if len(rounds) == 1:
            return                           # a first round that ends: called again
        while not stuck.is_set() and not rt.stop.is_set():
            beat()
            time.sleep(0.05)
        block.wait()
    rt.stream("watch", session)
    try:
        time.sleep(1.0)                      # 2.5 hang times, beating all along
        assert len(rounds) == 2 and h.hung() == []
        stuck.set()
        time.sleep(0.6)
        assert [n for n, _, _ in h.hung()] == ["watch"]
    finally:
        block.set()
        rt.stop.set()


def test_failpoints_parse_and_refuse_what_they_do_not_know():
    assert failpoints.parse("sweep=hang@3, verbs=hang") == {"sweep": ("hang", 3.0), "verbs": ("hang", 0.0)}
    assert failpoints.parse("") == {}
    assert failpoints.parse("sweep=hang@/run/rlb/hang-sweep") == {"sweep": ("hang", "/run/rlb/hang-sweep")}
    assert failpoints.parse("verbs-CONFIRM=drop") == {"verbs-CONFIRM": ("drop", 0.0)}
    for bad in ("sweep=crash@1", "=hang@1", "sweep=hang@soon", "sweep=hang@run/relative"):
        with pytest.raises(ValueError, match="RLB_FAILPOINTS"):
            failpoints.parse(bad)


def test_a_failpoint_on_a_file_is_due_once_the_file_exists(tmp_path):
    trigger = tmp_path / "hang-sweep"
    assert not failpoints.due(str(trigger), 0.0)
    trigger.touch()
    assert failpoints.due(str(trigger), 0.0)
    assert failpoints.due(1.0, time.monotonic() - 2) and not failpoints.due(5.0, time.monotonic() - 2)


def notify_socket(tmp_path, monkeypatch) -> socket.socket:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    s.bind(str(tmp_path / "notify"))
    s.settimeout(3)
    monkeypatch.setenv("NOTIFY_SOCKET", str(tmp_path / "notify"))
    return s


def test_systemd_hears_ready_and_each_second_alive_until_a_loop_hangs_then_the_agent_starts_afresh(tmp_path, monkeypatch,
                                                                                                   caplog):
    s = notify_socket(tmp_path, monkeypatch)
    h = Health(hang_s=0.5)
    hung = threading.Event()
    rt = AgentRuntime(log, h)
    block = threading.Event()
    rounds = []
    # a loop whose fourth round never returns (a lock never released)
    def fourth_round_waits():
        rounds.append(1)
        if len(rounds) >= 4:
            block.wait()
    rt.every("sweep", 0.05, fourth_round_waits)
    wd = Watchdog(h, log, rt.stop, on_hang=lambda _log: hung.set(), check_s=0.1).start()
    try:
        assert s.recv(64) == b"READY=1"
        assert s.recv(64) == b"WATCHDOG=1"
        assert hung.wait(5), "the hung loop was not noticed"
        assert len(rounds) == 4 and h.hangs == ["sweep"]
        # the log says where it waits: the hung thread's stack first, down to the wait itself
        [dump] = [r.getMessage() for r in caplog.records if r.getMessage().startswith("stacks at the hang")]
        first = dump.split("\nthread ")[1]
        assert first.startswith("sweep (hung):") and "in fourth_round_waits" in first and "block.wait()" in first
        assert "thread watchdog" not in dump
        assert h.snapshot()["sweep"]["last_error"] == "hung"
        s.settimeout(0.3)
        pings = []
        try:
            while True:
                pings.append(s.recv(64))       # what was sent before the hang
        except socket.timeout:
            pass
        with pytest.raises(socket.timeout):
            s.recv(64)                         # and nothing after it
        fam = {m.name: m for m in loop_health(h, "rlb_host", "h1")}
        assert [x.value for x in fam["rlb_host_loop_hung"].samples] == [1]
    finally:
        block.set()
        rt.stop.set()
        wd.thread.join(2)
        s.close()


def test_the_agents_units_ask_systemd_to_watch_them():
    fab = load(ROOT / "lab" / "fabric.toml")
    for node in ("l1", "s1", "h1"):
        units = deploy.units(fab, Path("/etc/rlb/fabric.toml"), node, "fd00:99::1", None)
        agent = units.get("rlb-switch") or units["rlb-host"]
        assert "WatchdogSec=60" in agent and "NotifyAccess=main" in agent
        # the watch begins once the agent says it is ready, not while it imports
        assert "Type=notify" in agent and "TimeoutStartSec=10min" in agent
        assert "WatchdogSec" not in units.get("rlb-bird", "")


def test_a_restart_for_a_hang_widens_systemds_watch_and_the_new_process_sets_it_back(tmp_path, monkeypatch):
    """The exec'd agent imports before its watchdog thread speaks (over 60 s under emulation):
    restart() widens systemd's watch first, and the new process's watchdog restores the unit's
    (WATCHDOG_USEC, which systemd put in the environment) right after READY."""
    from rlbcommon import watchdog
    s = notify_socket(tmp_path, monkeypatch)
    monkeypatch.setenv("WATCHDOG_USEC", "60000000")
    execs = []
    monkeypatch.setattr(watchdog.os, "execve", lambda *a: execs.append(a))
    watchdog.restart(log)
    assert s.recv(64) == f"WATCHDOG_USEC={int(watchdog.START_GRACE_S * 1e6)}".encode() and len(execs) == 1
    assert execs[0][2][RESTARTS_ENV] == "1"
    rt = AgentRuntime(log, Health(hang_s=5))
    wd = Watchdog(rt.health, log, rt.stop, check_s=0.1).start()
    try:
        assert s.recv(64) == b"READY=1" and s.recv(64) == b"WATCHDOG_USEC=60000000"
        assert s.recv(64) == b"WATCHDOG=1"
    finally:
        rt.stop.set()
        wd.thread.join(2)
        s.close()
