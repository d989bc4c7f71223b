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
from .paths import BPF_DIR, BPFFS, PIN_ROOT, RUN_DIR, private_dir, write_atomic

log = logging.getLogger(__name__)


class BpfSetupError(RuntimeError):
    pass


def ensure_bpffs():
    """Pins need bpffs at /sys/fs/bpf; mount it if this machine has not, readable by root only
    (pinned maps steer the traffic: nobody else may open them)."""
    with open("/proc/mounts") as f:
        if any(line.split()[1:3] == [str(BPFFS), "bpf"] for line in f):
            return
    BPFFS.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "bpf", "-o", "mode=0700", "bpf", str(BPFFS)], check=True)
    log.info("mounted bpffs at %s (mode 0700)", BPFFS)


def private_pin_dir(pin_dir: Path):
    """Create the pin directory (and /sys/fs/bpf/rlb) root-only, or adopt it only if root owns
    it and nobody else may write it: maps pinned in a directory someone else controls could be
    swapped under the agent."""
    if not pin_dir.is_relative_to(BPFFS):
        pin_dir.mkdir(parents=True, exist_ok=True)
        return
    path = BPFFS
    for part in pin_dir.relative_to(BPFFS).parts:
        path = path / part
        problem = private_dir(path)
        if problem:
            raise BpfSetupError(f"{problem}: refusing to pin maps there")


def source_digest(source: str) -> str:
    h = hashlib.sha256()
    for p in sorted(BPF_DIR.rglob("*.[ch]")):
        h.update(str(p.relative_to(BPF_DIR)).encode() + p.read_bytes())
    return f"{Path(source).stem}-{h.hexdigest()[:16]}"


def _layout_file(source: str) -> Path:
    return RUN_DIR / "layouts" / f"{source_digest(source)}.json"


class LayoutChanged(BpfSetupError):
    """A newer program whose maps are laid out differently cannot adopt the pinned ones."""


def compile_program(source: str, pin_dir: Path, extra_cflags: list[str] | None = None, record: bool = True):
    """bcc-compile bpf/<source>; its pinned maps are created or reopened under pin_dir.

    bcc reopens a pinned map by path whatever its layout, so a program whose structs changed
    would read and write the old entries as if they were new ones. The layout of every map is
    recorded when pinned (record=True) and a program that describes a pinned map differently is
    refused before anything is attached: the running one keeps forwarding."""
    try:
        from bcc import BPF
    except ImportError as e:  # pragma: no cover - environment problem
        raise BpfSetupError("bcc is not importable: install python3-bpfcc and use a venv made "
                            "with --system-site-packages (scripts/bootstrap.sh does both)") from e
    ensure_bpffs()
    private_pin_dir(pin_dir)
    cflags = [f"-I{BPF_DIR}", f'-DRLB_PIN_DIR="{pin_dir}"', "-Wno-unused-function",
              "-Wno-compare-distinct-pointer-types"] + (extra_cflags or [])
    pinned = {p.name for p in pin_dir.iterdir()}
    try:
        bpf = BPF(src_file=str(BPF_DIR / source).encode(), cflags=cflags)
    except Exception as e:
        raise BpfSetupError(f"compiling {source} failed: {e}. Kernel headers present? "
                            f"(/lib/modules/{os.uname().release}/build)") from e
    desc = _save_layouts(bpf, source)
    if record:
        try:
            _adopt(pin_dir, desc, pinned)
        except LayoutChanged:
            bpf.cleanup()
            raise
    return bpf


def _pinned_layout_file(pin_dir: Path) -> Path:
    """Where the layouts of a pin directory's maps are recorded: the run dir, which a reboot
    empties as it empties bpffs."""
    return RUN_DIR / "pinned-layouts" / (str(pin_dir).strip("/").replace("/", "+") + ".json")


def _adopt(pin_dir: Path, desc: dict, pinned: set[str]):
    """Refuse maps pinned with another layout; record the layouts of what is pinned now."""
    rec = _pinned_layout_file(pin_dir)
    old = json.loads(rec.read_text()) if rec.exists() else {}
    changed = sorted(n for n in desc.keys() & old.keys() & pinned if desc[n] != old[n])
    if changed:
        raise LayoutChanged(
            f"{pin_dir}: this version lays out the pinned maps {', '.join(changed)} differently from "
            "the program that made them, so it cannot adopt them; the running program keeps "
            "forwarding. Move traffic off this node first, then detach --all and attach this "
            "version (docs/operations.md, 'An upgrade that changes a map')")
    unknown = sorted(n for n in desc.keys() & pinned if n not in old)
    if unknown:
        log.warning("%s: maps %s adopted without a record of their layout", pin_dir, ", ".join(unknown))
    write_atomic(rec, json.dumps({**old, **desc}))


def forget_pinned_layouts(pin_dir: Path):
    """The pins are gone (detach --all): so is the record of their layouts."""
    _pinned_layout_file(pin_dir).unlink(missing_ok=True)


def _save_layouts(bpf, source: str):
    from bcc import lib
    out = {}
    for name in _table_names(bpf):
        key = lib.bpf_table_key_desc(bpf.module, name)
        leaf = lib.bpf_table_leaf_desc(bpf.module, name)
        out[name.decode()] = [json.loads(key), json.loads(leaf)]
    write_atomic(_layout_file(source), json.dumps(out))
    return out


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
            compile_program(source, scratch, record=False).cleanup()
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
