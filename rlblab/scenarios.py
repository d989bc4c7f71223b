"""The seeds' worked examples, runnable by name: `rlblab scenario --list`, `rlblab scenario NAME`.

Every scenario, registered by its fabric kind's module (the framework: rlblab/scenario.py). The
end-to-end tests call the same run functions on their own labs, so what an operator runs is what
CI asserts."""
from __future__ import annotations

# each module registers its scenarios, in this order (what `--list` shows)
from . import closscenarios, planescenarios, railscenarios  # noqa: F401
from .scenario import LAB_DIR, SCENARIOS, Check, Scenario, format_checks, run_scenario

__all__ = ["LAB_DIR", "SCENARIOS", "Check", "Scenario", "format_checks", "run_scenario"]
