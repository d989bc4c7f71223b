"""What the coordinator runs per fabric kind, one module each: its coordinator in COORDINATORS,
its metrics in COLLECTORS and, for a kind whose coordinator keeps its state on etcd, the runner
in ETCD_RUNNERS (rlbcoord/__init__.py). This folder is listed to find them: a kind without a
module here has no coordinator, and `rlbcoord run` says so by name."""
from __future__ import annotations

from rlbcommon.discover import modules_of

MODULES = modules_of(__name__, __path__)
