"""The seeds' worked examples, runnable by name: `rlblab scenario --list`, `rlblab scenario NAME`.

Every scenario, registered by its fabric kind's module (the framework: rlblab/scenario.py). The
end-to-end tests call the same run functions on their own labs, so what an operator runs is what
CI asserts."""
from __future__ import annotations

from . import kinds           # each kind's module registers its scenarios (and its lab)
from .scenario import LAB_DIR, SCENARIOS, Check, Scenario, format_checks, run_scenario

# What `--list` shows: by module in this order, each module's in the order it registered them.
# Not the order of import: a process that imported one module earlier (a test) lists the same.
_MODULES = [m.__name__ for m in kinds.MODULES]
_ordered = sorted(SCENARIOS.items(), key=lambda kv: _MODULES.index(kv[1].run.__module__)
                  if kv[1].run.__module__ in _MODULES else len(_MODULES))
SCENARIOS.clear()
SCENARIOS.update(_ordered)

__all__ = ["LAB_DIR", "SCENARIOS", "Check", "Scenario", "format_checks", "run_scenario"]
