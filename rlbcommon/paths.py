"""Where things live: BPF sources, pinned maps, runtime files."""
from __future__ import annotations

import os
import threading
from pathlib import Path

from rlbfabric.constants import RUN_DIR

_HERE = Path(__file__).resolve().parent
# bpf/ beside the packages in a checkout; rlbcommon/bpf/ once installed from a wheel
BPF_DIR = Path(os.environ.get("RLB_BPF_DIR") or next(
    (d for d in (_HERE.parent / "bpf", _HERE / "bpf") if (d / "rlb_switch.c").exists()), _HERE.parent / "bpf"))
BPFFS = Path("/sys/fs/bpf")
PIN_ROOT = BPFFS / "rlb"


def pin_dir(component: str, instance: str | None = None) -> Path:
    """Pinned maps of one agent: /sys/fs/bpf/rlb/<instance>/<component>.

    The instance is the network namespace name in labs (many switches share one bpffs)
    and 'default' on a real machine."""
    return PIN_ROOT / (instance or "default") / component


def write_atomic(path: Path, text: str):
    """Write through a temporary file and a rename, so a reader never sees half a file. The
    temporary name is the writer's own: processes starting together (a lab's agents caching
    the same program layout) must not rename each other's."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        tmp.write_text(text)
        tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)
