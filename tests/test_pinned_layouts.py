"""An upgrade adopts pinned maps only when its program lays them out the same way: bcc itself
reopens a pinned map whatever its layout, so a changed struct would silently misread live state.
Real bcc compiles of a small program, changed between 'versions'."""
from __future__ import annotations

import uuid

import pytest

from rlbcommon import bpfprog
from rlbcommon.paths import PIN_ROOT

PROGRAM = """
#include <uapi/linux/bpf.h>
struct entry { %s };
BPF_TABLE_PINNED("hash", u32, struct entry, qps, 64, RLB_PIN_DIR "/qps");
%s
int prog(struct xdp_md *ctx) { u32 k = 0; struct entry *e = qps.lookup(&k); return e ? XDP_PASS : XDP_DROP; }
"""
V1 = ("u32 path; u32 idle;", "")
REORDERED = ("u32 idle; u32 path;", "")     # same size, other meaning: only the record can tell
GROWN = ("u32 path; u32 idle; u64 bytes;", "")
NEW_MAP = ("u32 path; u32 idle;", 'BPF_TABLE_PINNED("array", u32, u64, extra, 4, RLB_PIN_DIR "/extra");')


@pytest.fixture
def version(tmp_path, monkeypatch):
    monkeypatch.setattr(bpfprog, "BPF_DIR", tmp_path)
    pins = PIN_ROOT / f"layout-test-{uuid.uuid4().hex[:6]}" / "host"

    def compile_as(v: tuple[str, str]):
        (tmp_path / "prog.c").write_text(PROGRAM % v)
        return bpfprog.compile_program("prog.c", pins)
    try:
        yield compile_as, pins
    finally:
        import shutil
        shutil.rmtree(pins.parent, ignore_errors=True)
        bpfprog.forget_pinned_layouts(pins)


def put(bpf, path: int, idle: int):
    t = bpf["qps"]
    t[t.Key(0)] = t.Leaf(path, idle)


def test_same_layout_is_adopted_with_its_entries(version):
    compile_as, pins = version
    a = compile_as(V1)
    put(a, 3, 17)
    a.cleanup()
    b = compile_as(V1)
    assert [(v.path, v.idle) for v in b["qps"].values()] == [(3, 17)]
    b.cleanup()


@pytest.mark.parametrize("changed", [REORDERED, GROWN], ids=["reordered", "grown"])
def test_a_changed_layout_is_refused_and_the_old_state_stays(version, changed):
    compile_as, pins = version
    a = compile_as(V1)
    put(a, 3, 17)
    a.cleanup()
    with pytest.raises(bpfprog.LayoutChanged, match=r"lays out the pinned maps qps differently"):
        compile_as(changed)
    b = compile_as(V1)                     # the old version still adopts its state
    assert [(v.path, v.idle) for v in b["qps"].values()] == [(3, 17)]
    b.cleanup()


def test_a_new_map_is_fine_and_state_gone_means_layout_forgotten(version):
    compile_as, pins = version
    compile_as(V1).cleanup()
    b = compile_as(NEW_MAP)                # an upgrade that adds a map adopts the rest
    assert (pins / "extra").exists() and (pins / "qps").exists()
    b.cleanup()
    import shutil
    shutil.rmtree(pins)                    # detach --all, or a reboot
    pins.mkdir(parents=True)
    compile_as(GROWN).cleanup()            # nothing pinned any more: any layout starts fresh


def test_pin_directories_are_created_private_and_a_foreign_one_is_refused(tmp_path):
    """Maps pinned where another user may write could be swapped under the agent: a pin
    directory is made 0700, and one that someone else owns or may write is refused."""
    import os
    import shutil as sh
    from rlbcommon.bpfprog import BpfSetupError, private_pin_dir
    from rlbcommon.paths import PIN_ROOT
    base = PIN_ROOT / f"test-private-{os.getpid()}"
    try:
        private_pin_dir(base / "host")
        assert oct((base / "host").stat().st_mode & 0o777) == "0o700"
        os.chmod(base / "host", 0o777)
        with pytest.raises(BpfSetupError, match="only it may write"):
            private_pin_dir(base / "host")
        os.chmod(base / "host", 0o700)
        os.chown(base / "host", 65534, 65534)
        with pytest.raises(BpfSetupError, match="uid 65534"):
            private_pin_dir(base / "host")
    finally:
        sh.rmtree(base, ignore_errors=True)
