"""Names a thread as the kernel sees it (`top -H`, /proc/<pid>/task/<tid>/comm, perf), so an
operator can tell which of an agent's loops uses the CPU. Python 3.11 names threads only for
itself."""
from __future__ import annotations

import ctypes
import ctypes.util

PR_SET_NAME = 15
COMM_MAX = 15                  # the kernel keeps 15 characters of a thread's name

_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


def name_this_thread(name: str) -> None:
    """'rlb-<name>' (cut to the kernel's 15 characters) for the calling thread."""
    _libc.prctl(PR_SET_NAME, f"rlb-{name}"[:COMM_MAX].encode(), 0, 0, 0)
