"""How long libraries wait for the agent: from a question's asking (its library's clock, the host's
CLOCK_MONOTONIC: the question's deadline less its timeout) to the agent's final answer (a path or a
keep; a WAIT is not one), per kind (rtr, ah). Kept as cumulative bucket counts, so the verbs thread
pays one bisect an answer, the status file and the metrics carry the same figures, and a reader
takes the quantiles of any interval from two readings (`quantile`).

What it tells an operator: an RTR that takes long in the application, with answers quick here, is
the application's own time (its scheduling, its device); with answers slow here, the agent is
behind (`rlbhost verbs status`, rlb_host_verbs_answer_seconds)."""
from __future__ import annotations

import bisect

# bucket upper bounds, ms (the last bucket, past 5 s, has none)
BUCKETS_MS = (0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 7.5, 10.0, 15.0, 20.0, 30.0, 50.0,
              100.0, 200.0, 500.0, 1000.0, 2000.0, 5000.0)
_BOUNDS_NS = tuple(int(b * 1_000_000) for b in BUCKETS_MS)
KINDS = ("rtr", "ah")


class AnswerTimes:
    def __init__(self):
        self.counts = {k: [0] * (len(BUCKETS_MS) + 1) for k in KINDS}
        self.sum_ns = dict.fromkeys(KINDS, 0)

    def add(self, kind: str, waited_ns: int):
        waited_ns = max(0, waited_ns)
        self.counts[kind][bisect.bisect_left(_BOUNDS_NS, waited_ns)] += 1
        self.sum_ns[kind] += waited_ns

    def snapshot(self) -> dict:
        """{"buckets_ms": bounds, kind: {"counts": per bucket (not cumulative), "sum_ms": ...}}"""
        return {"buckets_ms": list(BUCKETS_MS),
                **{k: {"counts": list(self.counts[k]), "sum_ms": self.sum_ns[k] / 1e6} for k in KINDS}}


def between(now: dict, before: dict | None, kind: str = "rtr") -> list[int]:
    """The answers of `kind` per bucket from reading `before` to reading `now` (snapshots)."""
    cur = (now or {}).get(kind, {}).get("counts") or [0] * (len(BUCKETS_MS) + 1)
    old = (before or {}).get(kind, {}).get("counts") or [0] * len(cur)
    return [a - b for a, b in zip(cur, old)]


def quantile(counts: list[int], q: float) -> float | None:
    """The q-quantile (0..1) of answers counted per bucket, in ms, interpolated within its bucket
    (a bucket's precision: the figure is at most one bucket off); past the last bound, that bound.
    None for no answers."""
    n = sum(counts)
    if not n:
        return None
    rank = q * n
    seen = 0
    for i, c in enumerate(counts):
        if c and seen + c >= rank:
            if i >= len(BUCKETS_MS):
                return BUCKETS_MS[-1]
            lo = BUCKETS_MS[i - 1] if i else 0.0
            return lo + (BUCKETS_MS[i] - lo) * max(0.0, rank - seen) / c
        seen += c
    return BUCKETS_MS[-1]


def summary(counts: list[int]) -> dict:
    """{"n", "median_ms", "p99_ms", "over_5ms"} of answers counted per bucket."""
    over = sum(c for b, c in zip(BUCKETS_MS + (float("inf"),), counts) if b > 5.0)
    return {"n": sum(counts), "median_ms": quantile(counts, 0.5), "p99_ms": quantile(counts, 0.99),
            "over_5ms": over}


def buckets(snap: dict, kind: str) -> tuple[list[tuple[str, int]], float]:
    """Prometheus's form of a snapshot's `kind`: cumulative (le, count) in seconds, and the sum."""
    counts = snap[kind]["counts"]
    out, total = [], 0
    for bound, c in zip([*(f"{b / 1000:g}" for b in snap["buckets_ms"]), "+Inf"], counts):
        total += c
        out.append((bound, total))
    return out, snap[kind]["sum_ms"] / 1000
