"""The verbs thread's round clock: a long round is counted and logged with what it was spent on
(its own CPU, queued for a CPU, or waiting on another thread holding the interpreter)."""
from __future__ import annotations

import gc
import logging
import random
import threading
import time

from rlbhost.verbs.roundclock import RoundClock, garbage


def _busy(ms: float):
    """This thread's own CPU for `ms` (however long others keep the CPU meanwhile)."""
    end = time.thread_time_ns() + int(ms * 1e6)
    while time.thread_time_ns() < end:
        pass


def test_a_short_round_is_not_counted_nor_logged(caplog):
    clock = RoundClock(slow_ns=50_000_000)
    with caplog.at_level(logging.WARNING):
        clock.start()
        _busy(5)
        clock.mark("reading")
        assert clock.end() is False
    assert clock.slow == 0 and clock.longest_ns == 0
    assert not caplog.records


def _primed(slow_ns: int) -> RoundClock:
    """A clock that has seen one round end (its CPU and queueing are counted from there)."""
    clock = RoundClock(slow_ns=slow_ns)
    clock.start()
    assert clock.end() is False
    return clock


def test_a_round_of_its_own_work_says_so_by_part(caplog):
    clock = _primed(50_000_000)
    with caplog.at_level(logging.WARNING):
        clock.start(waited_ns=3_000_000, timeout_ns=500_000_000)
        _busy(10)
        clock.mark("reading")
        _busy(70)
        clock.mark("timers")
        clock.mark("sending")          # under a millisecond: not named
        assert clock.end() is True
    assert clock.slow == 1 and clock.longest_ns >= 80_000_000
    (rec,) = caplog.records
    text = rec.getMessage()
    assert "after 3 ms waiting for work" in text
    own = float(text.split("own CPU ")[1].split(" ms")[0])
    assert own >= 75, text                        # the work was the thread's own
    parts = dict(p.rsplit(" ", 1) for p in text.split("by part (ms): ")[1].split(", "))
    assert set(parts) == {"reading", "timers"}, text
    assert int(parts["reading"]) >= 9 and int(parts["timers"]) >= 69, text


def test_a_round_held_up_by_another_thread_holding_the_interpreter_shows_little_cpu_of_its_own(caplog):
    """Another thread in one long C call (no bytecode, so the interpreter's lock is never offered)
    takes the lock as this thread makes a system call: the round is long, its own CPU short."""
    started = threading.Event()
    big = list(range(1_000_000))
    random.Random(1).shuffle(big)
    clock = _primed(50_000_000)                   # (its CPU counted from here: not the shuffle's)

    def hog():
        started.set()
        sorted(big)                               # C throughout: holds the lock for its whole length

    t = threading.Thread(target=hog)
    with caplog.at_level(logging.WARNING):
        clock.start()
        t.start()
        started.wait()
        time.sleep(0.001)                         # a system call: the lock goes to the hog
        clock.mark("reading")
        took_ok = clock.end()
    t.join()
    assert took_ok is True and clock.longest_ns >= 50_000_000
    text = caplog.records[0].getMessage()
    own = float(text.split("own CPU ")[1].split(" ms")[0])
    assert own < clock.longest_ns / 1e6 / 4, text  # most of the round was waiting, not working


def test_slow_rounds_are_logged_at_most_once_a_second_and_the_rest_counted_in_the_next_line(caplog):
    clock = RoundClock(slow_ns=1_000_000)
    with caplog.at_level(logging.WARNING):
        for _ in range(3):
            clock.start()
            _busy(2)
            clock.mark("reading")
            assert clock.end()
        time.sleep(1.05)
        clock.start()
        _busy(2)
        assert clock.end()
    assert clock.slow == 4
    texts = [r.getMessage() for r in caplog.records]
    assert len(texts) == 2, texts
    assert "(2 more slow rounds since the last line)" in texts[1]


def test_a_thread_that_woke_long_past_its_timeout_counts_as_a_stall_though_its_round_was_short(caplog):
    clock = _primed(50_000_000)
    with caplog.at_level(logging.WARNING):
        clock.start(waited_ns=130_000_000, timeout_ns=10_000_000)
        assert clock.end() is True
        clock.start(waited_ns=130_000_000, timeout_ns=100_000_000)     # 30 ms late: not a stall
        assert clock.end() is False
    assert clock.slow == 1 and clock.longest_ns >= 120_000_000
    (rec,) = caplog.records
    assert "after 130 ms waiting for work, 120 ms past its timeout" in rec.getMessage()


def test_a_garbage_collection_in_the_round_is_named_with_its_length(caplog):
    """A full collection of many tracked objects: its time is told apart from the round's own."""
    junk = [[i] for i in range(2_000_000)]        # tracked containers: a long full collection
    clock = _primed(1_000_000)
    before = garbage()
    with caplog.at_level(logging.WARNING):
        clock.start()
        t = time.perf_counter_ns()
        gc.collect()
        took_ms = (time.perf_counter_ns() - t) / 1e6
        clock.mark("reading")
        assert clock.end()
    del junk
    text = caplog.records[0].getMessage()
    collecting = float(text.split("collecting garbage ")[1].split(" ms")[0])
    assert took_ms >= 5 and 0.8 * took_ms - 1 <= collecting <= took_ms + 1, text
    # and the process's totals (the verbs status file's "garbage") count it as a full collection
    after = garbage()
    assert after["full"] == before["full"] + 1
    assert 0.8 * took_ms - 1 <= after["full_ms"] - before["full_ms"] <= took_ms + 1
    assert after["longest_ms"] >= 0.8 * took_ms - 1
    # (all collecting includes the full collections; the four totals are each rounded to 0.1 ms:
    # their differences may cross by up to 0.2, as 171.7 against 171.8 did once in CI; 0.25 for
    # the floats' own error)
    assert after["collecting_ms"] - before["collecting_ms"] >= after["full_ms"] - before["full_ms"] - 0.25
