"""Where the running switch agent leaves what other processes read (`rlbswitch status`, `route
show`): here, apart from the agent, so a command that only reads them does not load the agent."""
from __future__ import annotations

from pathlib import Path

from rlbcommon.paths import RUN_DIR


def health_file(instance: str) -> Path:
    """Where the running agent keeps its loops' health (read by `rlbswitch status`)."""
    return RUN_DIR / f"{instance}-switch-health.json"


def why_file(instance: str) -> Path:
    """Why each route is programmed as it is (prefix -> reason), for `rlbswitch route show`."""
    return RUN_DIR / f"{instance}-switch-routes.json"
