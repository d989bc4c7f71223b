"""How many members of a group the switch program scans for DLB, on this kernel.

The program picks a DLB (and spray, and pinned-backup) member in a loop the verifier walks
member by member. Kernels from about 6.8 prune that walk and take all RLB_MAX_MEMBERS; Debian
12's 6.1 gives up at its million instructions past 16 members ("Argument list too long"). The
loader builds the loop as wide as the kernel accepts, widest first, and records the width for
this kernel release and this program's source, so that the next start builds it at once and the
route model, in any process, refuses groups wider than the program looks. The record is kept
across reboots (STATE_DIR): on 6.1 each width refused costs a compile and a million-instruction
walk before the switch forwards (under the VM lab's emulation, about 170 s each: two of them
were most of a leaf's time to converge). Another kernel, or another version of the program,
tries again from the widest, except where a kernel series was measured (KNOWN): a fresh start
there begins at the width it took, and narrower ones stay to be tried if that is refused. The VM
lab's 6.1 leaves spent 23 minutes of a 35-minute start (2026-11-30, under emulation) being
refused 64 and 32 before they forwarded, and every switch first started on Debian 12 paid the
same two walks."""
from __future__ import annotations

import json
import logging
import os

from rlbcommon.bpfprog import source_digest
from rlbcommon.cheader import constants
from rlbcommon.constants import STATE_DIR
from rlbcommon.paths import write_atomic

log = logging.getLogger(__name__)
MAX_MEMBERS = constants("rlb_switch.h")["RLB_MAX_MEMBERS"]
WIDTHS = (MAX_MEMBERS, 32, 16, 8)          # tried in this order
RECORD = STATE_DIR / "switch-dlb-scan.json"
REFUSED = "Argument list too long"         # E2BIG: the verifier's instruction limit
# the widest scan a kernel series was measured to take, by release prefix: 6.1 (Debian 12's
# 6.1.0-*: 64 and 32 refused, 16 taken, in every VM lab run); 6.18 (this project's CI) takes 64
KNOWN = {"6.1.": 16}


def program() -> str:
    """This version of the switch program (the digest its layout cache is kept by)."""
    return source_digest("rlb_switch.c")


def width() -> int:
    """The widest scan this kernel accepted; before any load here, what its series was measured to
    take (KNOWN), else all members until a load says otherwise."""
    release = os.uname().release
    try:
        rec = json.loads(RECORD.read_text())
        if (rec["kernel"], rec.get("program")) == (release, program()) and int(rec["scan"]) in WIDTHS:
            return int(rec["scan"])
    except (OSError, ValueError, KeyError, TypeError):
        pass
    return next((w for prefix, w in KNOWN.items() if release.startswith(prefix)), MAX_MEMBERS)


def to_try() -> list[int]:
    """The widths a load tries, from the one recorded (or the widest) down."""
    start = width()
    return [w for w in WIDTHS if w <= start]


def record(scan: int):
    rec = {"kernel": os.uname().release, "program": program(), "scan": scan}
    try:
        if json.loads(RECORD.read_text()) == rec:
            return
    except (OSError, ValueError):
        pass
    try:
        write_atomic(RECORD, json.dumps(rec))
    except OSError as e:                 # (only the next start's time depends on it)
        log.warning("cannot record the DLB scan this kernel takes in %s: %s", RECORD, e)
