"""The scenarios' framework: a scenario names the document and figure it reproduces, the lab it
needs (a fabric file and how to build it), and a run(lab) that sends real traffic and returns
checks: what was measured, what the document expects, PASS or FAIL. Each fabric kind's
scenarios live in that kind's module of rlblab/kinds/ and register here (rlblab/scenarios.py
lists the folder);
`rlblab scenario NAME` and the end-to-end tests run the same functions."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from rlbfabric.fabric import FabricError, load

from .labs import open_lab

LAB_DIR = Path(__file__).resolve().parent.parent / "lab"


@dataclass
class Check:
    what: str
    measured: object
    expected: str
    ok: bool


@dataclass
class Scenario:
    name: str
    source: str                    # the document and figure
    summary: str
    fabric: str                    # file under lab/
    run: Callable[[object], list[Check]]      # on the lab the fabric file needs (rlblab/labs.py)
    lab: dict = field(default_factory=dict)   # the lab's options (mode, shape, coordinator)
    minutes: float = 2.0           # about how long, lab included


SCENARIOS: dict[str, Scenario] = {}       # by name, in the order registered


def register(*scenarios: Scenario):
    for s in scenarios:
        if s.name in SCENARIOS:
            raise ValueError(f"scenario {s.name} registered twice")
        SCENARIOS[s.name] = s


def format_checks(s: Scenario, checks: list[Check]) -> str:
    lines = [f"{s.name}: {s.source} - {s.summary}"]
    for c in checks:
        lines.append(f"  {'PASS' if c.ok else 'FAIL'}  {c.what}: {c.measured}  (expected {c.expected})")
    lines.append(f"{s.name}: {'PASS' if checks and all(c.ok for c in checks) else 'FAIL'}")
    return "\n".join(lines)


def run_scenario(name: str, lab_name: str = "rlbsn", echo=print, fabric: Path | None = None,
                 repeat: int = 1) -> bool:
    """Build the scenario's lab (from its own fabric file, or another of the same kind), run it
    `repeat` times on that lab (each run puts back what it changed), print each run's checks,
    tear the lab down. True when every run passed."""
    s = SCENARIOS[name]
    fabric = fabric or LAB_DIR / s.fabric
    kind, wanted = load(fabric).kind, load(LAB_DIR / s.fabric).kind
    if kind != wanted:
        raise FabricError(f"{name} runs on a {wanted} fabric; {fabric} is {kind}")
    if repeat < 1:
        raise FabricError(f"repeat {repeat}: run a scenario at least once")
    lab = open_lab(fabric, lab_name, **s.lab)
    passed = []
    try:
        echo(f"==> building {fabric.name} as lab {lab_name} ({s.lab.get('mode', 'rlb')})")
        lab.up()
        lab.wait_converged(180)
        for i in range(1, repeat + 1):
            echo(f"==> running {name}" + (f" ({i} of {repeat})" if repeat > 1 else ""))
            checks = s.run(lab)
            echo(format_checks(s, checks))
            passed.append(all(c.ok for c in checks))
    finally:
        lab.down()
    if repeat > 1:
        echo(f"{name}: {sum(passed)} of {repeat} runs passed")
    return all(passed)
