"""How many members of a group the switch program scans for DLB, on this kernel.

The program picks a DLB (and spray, and pinned-backup) member in a loop the verifier walks
member by member. Kernels from about 6.8 prune that walk and take all RLB_MAX_MEMBERS; Debian
12's 6.1 gives up at its million instructions past 16 members ("Argument list too long"). The
loader builds the loop as wide as the kernel accepts, widest first, and records the width per
kernel release (in the run directory: a reboot, which may bring another kernel, forgets it), so
that the next start builds it at once and the route model, in any process, refuses groups wider
than the program looks."""
from __future__ import annotations

import json
import os

from rlbcommon.cheader import constants
from rlbcommon.paths import RUN_DIR, write_atomic

MAX_MEMBERS = constants("rlb_switch.h")["RLB_MAX_MEMBERS"]
WIDTHS = (MAX_MEMBERS, 32, 16, 8)          # tried in this order
RECORD = RUN_DIR / "switch-dlb-scan.json"
REFUSED = "Argument list too long"         # E2BIG: the verifier's instruction limit


def width() -> int:
    """The widest scan this kernel accepted (all members until a load says otherwise)."""
    try:
        rec = json.loads(RECORD.read_text())
        if rec["kernel"] == os.uname().release and int(rec["scan"]) in WIDTHS:
            return int(rec["scan"])
    except (OSError, ValueError, KeyError, TypeError):
        pass
    return MAX_MEMBERS


def to_try() -> list[int]:
    """The widths a load tries, from the one recorded (or the widest) down."""
    start = width()
    return [w for w in WIDTHS if w <= start]


def record(scan: int):
    if width() != scan or not RECORD.exists():
        write_atomic(RECORD, json.dumps({"kernel": os.uname().release, "scan": scan}))
