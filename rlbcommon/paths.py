"""Where things live: BPF sources, pinned maps, runtime files."""
from __future__ import annotations

import os
from pathlib import Path

from rlbfabric.constants import RUN_DIR

BPF_DIR = Path(os.environ.get("RLB_BPF_DIR", Path(__file__).resolve().parent.parent / "bpf"))
BPFFS = Path("/sys/fs/bpf")
PIN_ROOT = BPFFS / "rlb"


def pin_dir(component: str, instance: str | None = None) -> Path:
    """Pinned maps of one agent: /sys/fs/bpf/rlb/<instance>/<component>.

    The instance is the network namespace name in labs (many switches share one bpffs)
    and 'default' on a real machine."""
    return PIN_ROOT / (instance or "default") / component


def write_atomic(path: Path, text: str):
    """Write through a temporary file and a rename, so a reader never sees half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    tmp.replace(path)
