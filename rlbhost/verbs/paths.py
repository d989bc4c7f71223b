"""Where the verbs service's files are: its socket (what RLB_VERBS_SOCKET names for the library;
/run/rlb/verbs.sock on a host, one per instance in labs) and its status for `rlbhost status`."""
from __future__ import annotations

from pathlib import Path

from rlbcommon.constants import RUN_DIR

from .protocol import VERSION


def socket_path(instance: str) -> Path:
    return RUN_DIR / ("verbs.sock" if instance == "default" else f"verbs-{instance}.sock")


def status_path(instance: str) -> Path:
    return RUN_DIR / f"{instance}-host-verbs.json"


def table_path(instance: str) -> Path:
    """The agent's decisions, read by the libraries (world-readable; kept across restarts). The
    protocol version is in the name: a new layout is a new file, and jobs that mapped the old one
    keep reading it, never a file rewritten under them."""
    return RUN_DIR / (f"verbs.v{VERSION}.table" if instance == "default" else f"verbs-{instance}.v{VERSION}.table")
