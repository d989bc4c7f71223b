"""Where things live: BPF sources, pinned maps, runtime files."""
from __future__ import annotations

import os
from pathlib import Path

BPF_DIR = Path(os.environ.get("RLB_BPF_DIR", Path(__file__).resolve().parent.parent / "bpf"))
BPFFS = Path("/sys/fs/bpf")
PIN_ROOT = BPFFS / "rlb"
RUN_DIR = Path(os.environ.get("RLB_RUN_DIR", "/run/rlb"))


def pin_dir(component: str, instance: str | None = None) -> Path:
    """Pinned maps of one agent: /sys/fs/bpf/rlb/<instance>/<component>.

    The instance is the network namespace name in labs (many switches share one bpffs)
    and 'default' on a real machine."""
    return PIN_ROOT / (instance or "default") / component
