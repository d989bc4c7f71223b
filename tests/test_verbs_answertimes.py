"""How long libraries waited for the agent's answers (rlbhost/verbs/answertimes.py): the buckets an
answer lands in, the quantiles read back from two readings, Prometheus's cumulative form, and the
asking time a question carries (its deadline less its timeout, as the library sends them)."""
from prometheus_client.core import HistogramMetricFamily

from rlbhost.verbs import answertimes as A
from rlbhost.verbs import protocol as P


def test_an_answer_lands_in_the_bucket_whose_bounds_hold_it():
    t = A.AnswerTimes()
    for ms in (0.05, 0.1, 0.4, 0.9, 1.0, 1.2, 6.0, 12_000.0):
        t.add("rtr", int(ms * 1e6))
    t.add("ah", 250_000)
    c = A.between(t.snapshot(), None)
    got = {(A.BUCKETS_MS[i - 1] if i else 0.0, A.BUCKETS_MS[i] if i < len(A.BUCKETS_MS) else None): n
           for i, n in enumerate(c) if n}
    # (lo, hi]: 0.1 ms is in the first bucket, 1.0 in (0.75, 1]; past 5 s, the open bucket
    assert got == {(0.0, 0.1): 2, (0.3, 0.5): 1, (0.75, 1.0): 2, (1.0, 1.5): 1, (5.0, 7.5): 1, (5000.0, None): 1}
    assert A.between(t.snapshot(), None, "ah")[A.BUCKETS_MS.index(0.3)] == 1
    assert t.snapshot()["rtr"]["sum_ms"] == sum((0.05, 0.1, 0.4, 0.9, 1.0, 1.2, 6.0, 12_000.0))


def test_quantiles_of_an_interval_come_from_two_readings():
    t = A.AnswerTimes()
    for _ in range(1000):
        t.add("rtr", 20_000_000)          # an earlier burst, 20 ms each
    before = t.snapshot()
    for i in range(1000):                 # then 0.01 .. 10 ms, evenly
        t.add("rtr", (i + 1) * 10_000)
    c = A.between(t.snapshot(), before)
    assert sum(c) == 1000
    s = A.summary(c)
    # the true median is 5 ms and the 99th percentile 9.9 ms: within their buckets (3-5, 7.5-10)
    assert 3.0 <= s["median_ms"] <= 5.0 and 7.5 <= s["p99_ms"] <= 10.0
    assert s["over_5ms"] == 500 and s["n"] == 1000
    assert A.summary(A.between(before, before)) == {"n": 0, "median_ms": None, "p99_ms": None, "over_5ms": 0}


def test_prometheus_gets_cumulative_buckets_in_seconds():
    t = A.AnswerTimes()
    for ns in (50_000, 400_000, 6_000_000):
        t.add("rtr", ns)
    buckets, total = A.buckets(t.snapshot(), "rtr")
    assert buckets[0] == ("0.0001", 1) and dict(buckets)["0.0005"] == 2 and dict(buckets)["0.0075"] == 3
    assert buckets[-1] == ("+Inf", 3) and abs(total - 0.00645) < 1e-9
    fam = HistogramMetricFamily("x", "y", labels=["kind"])
    fam.add_metric(["rtr"], buckets, total)        # the form the collector hands prometheus_client
    assert [s.value for s in fam.samples if s.name == "x_count"] == [3]


def test_a_question_carries_when_it_was_asked():
    rtr = P.parse_local(b"RTR 7 rxe0 1 17 3 fd00::1 fd00::2 18 5000000000 20000000")
    assert rtr.asked_ns == 5_000_000_000 - 20_000_000
    ah = P.parse_local(b"AH 8 rxe0 1 3 fd00::1 fd00::2 1000 20000000")
    assert ah.asked_ns == 0                        # (a deadline before its timeout: never below 0)
