"""Where the running host agent leaves what other processes read (`rlbhost status`, `why`): here,
apart from the agent, so a command that only reads them does not load the agent's kinds."""
from __future__ import annotations

from pathlib import Path

from rlbcommon.paths import RUN_DIR


def health_file(instance: str) -> Path:
    """Where the running agent keeps its loops' health (read by `rlbhost status`)."""
    return RUN_DIR / f"{instance}-host-health.json"


def why_file(instance: str) -> Path:
    """Where a rail-only GPU's agent writes its decisions (read by `rlbhost why`)."""
    return RUN_DIR / f"{instance}-host-why.json"
