"""Compiling bpf/ programs with bcc, pinning their maps, and their struct layouts.

Every map a program declares with BPF_TABLE_PINNED lands under its pin directory, so a new
program (a restarted agent, an upgrade) reuses the live state. Processes that only touch
maps (the CLI, metrics) get the key/leaf ctypes from a layout file that bcc's own type
description produced at the last compile; they never compile unless that file is missing."""
from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import subprocess
from pathlib import Path

from .maps import PinnedMap
from .paths import BPF_DIR, BPFFS, PIN_ROOT, RUN_DIR, write_atomic

log = logging.getLogger(__name__)


class BpfSetupError(RuntimeError):
    pass


def ensure_bpffs():
    """Pins need bpffs at /sys/fs/bpf; mount it if this machine has not."""
    with open("/proc/mounts") as f:
        if any(line.split()[1:3] == [str(BPFFS), "bpf"] for line in f):
            return
    BPFFS.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "bpf", "bpf", str(BPFFS)], check=True)
    log.info("mounted bpffs at %s", BPFFS)


def source_digest(source: str) -> str:
    h = hashlib.sha256()
    for p in sorted(BPF_DIR.rglob("*.[ch]")):
        h.update(str(p.relative_to(BPF_DIR)).encode() + p.read_bytes())
    return f"{Path(source).stem}-{h.hexdigest()[:16]}"


def _layout_file(source: str) -> Path:
    return RUN_DIR / "layouts" / f"{source_digest(source)}.json"


def compile_program(source: str, pin_dir: Path, extra_cflags: list[str] | None = None):
    """bcc-compile bpf/<source>; its pinned maps are created or reopened under pin_dir."""
    try:
        from bcc import BPF
    except ImportError as e:  # pragma: no cover - environment problem
        raise BpfSetupError("bcc is not importable: install python3-bpfcc and use a venv made "
                            "with --system-site-packages (scripts/bootstrap.sh does both)") from e
    ensure_bpffs()
    pin_dir.mkdir(parents=True, exist_ok=True)
    cflags = [f"-I{BPF_DIR}", f'-DRLB_PIN_DIR="{pin_dir}"', "-Wno-unused-function",
              "-Wno-compare-distinct-pointer-types"] + (extra_cflags or [])
    try:
        bpf = BPF(src_file=str(BPF_DIR / source).encode(), cflags=cflags)
    except Exception as e:
        raise BpfSetupError(f"compiling {source} failed: {e}. Kernel headers present? "
                            f"(/lib/modules/{os.uname().release}/build)") from e
    _save_layouts(bpf, source)
    return bpf


def _save_layouts(bpf, source: str):
    from bcc import lib
    out = {}
    for name in _table_names(bpf):
        key = lib.bpf_table_key_desc(bpf.module, name)
        leaf = lib.bpf_table_leaf_desc(bpf.module, name)
        out[name.decode()] = [json.loads(key), json.loads(leaf)]
    write_atomic(_layout_file(source), json.dumps(out))


def _table_names(bpf):
    """Names of the maps a compiled module declares (bcc exports no Python call for it)."""
    import ctypes as ct
    from bcc import lib
    lib.bpf_num_tables.restype = ct.c_size_t
    lib.bpf_num_tables.argtypes = [ct.c_void_p]
    lib.bpf_table_name.restype = ct.c_char_p
    lib.bpf_table_name.argtypes = [ct.c_void_p, ct.c_size_t]
    return [lib.bpf_table_name(bpf.module, i) for i in range(lib.bpf_num_tables(bpf.module))]


def layouts(source: str) -> dict[str, tuple]:
    """{map name: (key ctype, leaf ctype)} as bcc described them for this source version."""
    from bcc import BPF
    path = _layout_file(source)
    if not path.exists():
        # Compile once into a scratch pin dir to learn the layouts; nothing is attached.
        scratch = PIN_ROOT / f"layout-scratch-{os.getpid()}"   # no dots: bpffs before 6.x refuses them
        try:
            compile_program(source, scratch).cleanup()
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
    data = json.loads(path.read_text())
    return {name: (BPF._decode_table_type(k), BPF._decode_table_type(v))
            for name, (k, v) in data.items()}


def open_maps(source: str, pin_dir: Path) -> dict[str, PinnedMap]:
    """Every pinned map of a program, opened by path with bcc's layouts."""
    if not pin_dir.exists():
        raise FileNotFoundError(pin_dir)
    out = {}
    for name, (k, v) in layouts(source).items():
        p = pin_dir / name
        if p.exists():
            out[name] = PinnedMap(p, k, v)
    return out
