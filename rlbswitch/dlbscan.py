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
tries again from the widest."""
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


def program() -> str:
    """This version of the switch program (the digest its layout cache is kept by)."""
    return source_digest("rlb_switch.c")


def width() -> int:
    """The widest scan this kernel accepted (all members until a load says otherwise)."""
    try:
        rec = json.loads(RECORD.read_text())
        if (rec["kernel"], rec.get("program")) == (os.uname().release, program()) and int(rec["scan"]) in WIDTHS:
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
        try:
            write_atomic(RECORD, json.dumps({"kernel": os.uname().release, "program": program(), "scan": scan}))
        except OSError as e:             # (only the next start's time depends on it)
            log.warning("cannot record the DLB scan this kernel takes in %s: %s", RECORD, e)
