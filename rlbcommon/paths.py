"""Where things live: BPF sources, pinned maps, runtime files."""
from __future__ import annotations

import os
import stat
import threading
from pathlib import Path

from rlbcommon.constants import RUN_DIR

_HERE = Path(__file__).resolve().parent
# bpf/ beside the packages in a checkout; rlbcommon/bpf/ once installed from a wheel
BPF_DIR = Path(os.environ.get("RLB_BPF_DIR") or next(
    (d for d in (_HERE.parent / "bpf", _HERE / "bpf") if (d / "rlb_switch.c").exists()), _HERE.parent / "bpf"))
# verbs/ (the C source of the verbs path selector) beside the packages, or inside the wheel
VERBS_SRC = Path(os.environ.get("RLB_VERBS_SRC") or next(
    (d for d in (_HERE.parent / "verbs", _HERE.parent / "rlbhost" / "verbs" / "src")
     if (d / "rlb_verbs.c").exists()), _HERE.parent / "verbs"))
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


def write_private(path: Path, text: str):
    """Write a file only its owner may read (bird configurations carry the BGP password),
    through a rename as write_atomic: the old file is never readable with the new secret."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(text)
        tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)


def private_dir(path: Path) -> str | None:
    """Make `path` a directory only this user may use (0700), or adopt it if it is one this user
    owns and only it may write; otherwise say what is wrong with it (None: all is well). A
    directory someone else controls could have files swapped under a root process."""
    try:
        path.mkdir(mode=0o700)
    except FileExistsError:
        pass
    st = path.lstat()
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o022:
        return (f"{path}: not a directory of this user that only it may write "
                f"(uid {st.st_uid}, mode {oct(st.st_mode & 0o777)})")
    return None
