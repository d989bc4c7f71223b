"""The benches' recorded ratios (bench/ratios.json): each figure over a reference measured in the
same run, recorded per CPU kind, since a kind moves map lookups against plain code and so every
ratio; a kind never measured is held to the higher of each case over the kinds that were.
Every ratio here is higher-is-worse. Used by xdp_bench.py (test runs) and wire_bench.py (live
frames); tests/test_bench_guard.py fails a switch case far over its record."""
from __future__ import annotations

import json
import statistics
from pathlib import Path

RECORD = Path(__file__).with_name("ratios.json")
WARN, FAIL = 1.10, 1.50          # over the record: named by the bench; failed by the test


def machine_kind() -> str:
    """This machine's CPU kind: the model name the kernel reports (the same for every core)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return " ".join(line.split(":", 1)[1].split())
    except OSError:
        pass
    return "unknown"


def medians(runs: list[dict[str, dict[str, float]]]) -> dict[str, dict[str, float]]:
    """Each case's median over runs of the same groups."""
    return {g: {c: statistics.median(r[g][c] for r in runs) for c in cases} for g, cases in runs[0].items()}


def saved_record() -> dict:
    return json.loads(RECORD.read_text()) if RECORD.exists() else {}


def recorded(kind: str | None = None, saved: dict | None = None) -> dict[str, dict[str, float]]:
    """The ratios to compare with on a machine of `kind` (this one's by default): its kind's own
    record where one was made, else the higher of each case over the kinds measured."""
    saved = dict(saved_record() if saved is None else saved)
    kinds = saved.pop("kinds", {})
    return kinds.get(machine_kind() if kind is None else kind, saved)


def compared_with() -> str:
    """Which record this machine is compared with, in words (the benches' headers)."""
    kind = machine_kind()
    return (f"this CPU kind's ({kind})" if kind in saved_record().get("kinds", {})
            else f"any kind's (none for this one: {kind})")


def with_record(saved: dict, kind: str, now: dict[str, dict[str, float]]) -> dict:
    """The record file's content with `now` as kind's record, the any-kind level raised to it
    where it is higher (a case new to the file enters that level as measured)."""
    saved = json.loads(json.dumps(saved))
    kinds = saved.setdefault("kinds", {})
    kinds[kind] = {**kinds.get(kind, {}), **now}      # groups not measured now kept
    for g, cases in now.items():
        top = saved.setdefault(g, {})
        for c, r in cases.items():
            top[c] = max(r, top.get(c, r))
    return saved


def write_record(now: dict[str, dict[str, float]]) -> str:
    """Record `now` for this machine's kind; returns what was written, in words."""
    RECORD.write_text(json.dumps(with_record(saved_record(), machine_kind(), now), indent=1) + "\n")
    return f"recorded for {machine_kind()!r} in {RECORD}"


def over_record(now: dict, record: dict, limit: float) -> list[tuple[str, str, float, float]]:
    """(group, case, ratio now, recorded) for every case above limit x its record."""
    return [(g, c, r, record[g][c]) for g, cases in now.items() for c, r in cases.items()
            if c in record.get(g, {}) and r > record[g][c] * limit]


def over_line(now: dict, record: dict) -> str:
    """The benches' last line: every ratio more than WARN x its record, by group, or that none is."""
    bad = over_record(now, record, WARN)
    return ("more than 10 % over the record: " + ", ".join(f"{c} {g} ({r:.2f} vs {o:.2f})" for g, c, r, o in bad)
            if bad else "no ratio more than 10 % over its record")
