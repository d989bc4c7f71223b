"""Where a lab keeps its configs, sockets, keys and logs: /run/rlblab/<lab name>, made readable by
root only. Not /tmp: a lab runs as root, and a predictable name in a world-writable directory
lets any local user plant a file or a symlink there before the lab writes its bird
configurations (with the BGP password) and agent logs. A directory that exists but is not
root's own, or that others may write, is refused."""
from __future__ import annotations

import os
from pathlib import Path

from rlbcommon.paths import private_dir

BASE = Path(os.environ.get("RLB_LAB_DIR", "/run/rlblab"))


class LabDirError(RuntimeError):
    pass


def lab_dir(name: str) -> Path:
    for path in (BASE, BASE / name):
        problem = private_dir(path)
        if problem:
            raise LabDirError(f"{problem}; remove it and retry")
    return BASE / name
