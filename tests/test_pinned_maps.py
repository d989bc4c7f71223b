"""PinnedMap.items() reads a hash map in batches (BPF_MAP_LOOKUP_BATCH) and every other map the
way it can: the same entries as one lookup a key, on the kernel's own maps."""
import ctypes as ct
import errno
import os
import uuid

import pytest
from bcc import BPF

from rlbcommon import maps
from rlbcommon.libbpf import lib
from rlbcommon.maps import PinnedMap

SRC = b"""
struct leaf { u64 a; u32 b; u32 c; };
struct lpm { u32 prefixlen; u8 addr[16]; };
BPF_HASH(plain, u64, struct leaf, 6000);
BPF_TABLE("lru_hash", u64, struct leaf, lru, 16384);
BPF_PERCPU_HASH(percpu, u64, struct leaf, 64);
BPF_LPM_TRIE(trie, struct lpm, struct leaf, 256);
BPF_HASH(empty, u64, struct leaf, 64);
"""


class Leaf(ct.Structure):
    _fields_ = [("a", ct.c_uint64), ("b", ct.c_uint32), ("c", ct.c_uint32)]


class Lpm(ct.Structure):
    _fields_ = [("prefixlen", ct.c_uint32), ("addr", ct.c_uint8 * 16)]


@pytest.fixture(scope="module")
def pinned():
    """{name: PinnedMap} of the maps above, pinned under /sys/fs/bpf for the module."""
    if os.geteuid() != 0:
        pytest.skip("needs root")
    bpf = BPF(text=SRC)
    tag = uuid.uuid4().hex[:8]
    paths = {}
    out = {}
    try:
        for name, key in (("plain", ct.c_uint64), ("lru", ct.c_uint64), ("percpu", ct.c_uint64),
                          ("trie", Lpm), ("empty", ct.c_uint64)):
            path = f"/sys/fs/bpf/rlb-test-maps-{tag}-{name}"
            assert lib.bpf_obj_pin(bpf[name.encode()].map_fd, path.encode()) == 0, name
            paths[name] = path
            out[name] = PinnedMap(path, key, Leaf)
        yield out
    finally:
        for m in out.values():
            m.close()
        for path in paths.values():
            os.unlink(path)
        bpf.cleanup()


def per_key(m: PinnedMap) -> dict:
    """The map as one lookup a key reads it (the way items() read every map before)."""
    return {bytes(k): bytes(m.get(k)) for k in m.keys()}


def fill(m: PinnedMap, n: int):
    for i in range(n):
        m.set(ct.c_uint64(i * 7919 + 3), Leaf(i, i % 13, 0xABCD))


@pytest.mark.parametrize("name", ["plain", "lru"])
def test_a_hash_maps_items_come_in_batches_and_are_every_entry(pinned, name, monkeypatch):
    """5000 entries: more than four calls' worth. keys() (the per-entry way) is not used."""
    m = pinned[name]
    fill(m, 5000)
    want = per_key(m)
    assert len(want) == 5000
    calls = []
    real = lib.bpf_map_lookup_batch

    def counted(*a):
        calls.append(1)
        return real(*a)
    monkeypatch.setattr(maps.lib, "bpf_map_lookup_batch", counted)
    monkeypatch.setattr(PinnedMap, "keys", lambda self: pytest.fail("read per key"))
    got = list(m.items())
    assert {bytes(k): bytes(v) for k, v in got} == want and len(got) == 5000
    assert 5 <= len(calls) <= 8                 # 1024 entries a call at most, whole buckets
    assert {v.c for _, v in got} == {0xABCD} and sorted(v.a for _, v in got) == list(range(5000))


def test_a_bucket_larger_than_a_call_reads_falls_back_to_one_lookup_a_key(pinned, monkeypatch):
    """With one entry a call, the first bucket of two cannot be read (ENOSPC): items() reads per
    key instead and still returns every entry once."""
    m = pinned["plain"]
    fill(m, 5000)
    want = per_key(m)
    monkeypatch.setattr(maps, "LOOKUP_BATCH", 1)
    got = {bytes(k): bytes(v) for k, v in m.items()}
    assert got == want


def test_maps_without_a_batch_read_are_read_per_key(pinned, monkeypatch):
    """A map type whose kernel refuses the batch lookup (6.1's LPM trie; 6.18's has one) is
    read per key, and the refusal remembered; per-CPU maps are read per key (their values are
    one per CPU); an empty hash map has no items."""
    trie = pinned["trie"]
    for i in range(40):
        k = Lpm(64)
        k.addr[:] = [0xfd, 0, 0, i] + [0] * 12
        trie.set(k, Leaf(i, 1, 2))
    want = per_key(trie)
    assert {bytes(k): bytes(v) for k, v in trie.items()} == want and len(want) == 40
    asked = []

    def refused(*a):
        asked.append(1)
        ct.set_errno(errno.EINVAL)
        return -errno.EINVAL
    monkeypatch.setattr(maps, "_NO_BATCH_LOOKUP", set())
    monkeypatch.setattr(maps.lib, "bpf_map_lookup_batch", refused)
    assert {bytes(k): bytes(v) for k, v in trie.items()} == want
    assert {bytes(k): bytes(v) for k, v in trie.items()} == want
    assert trie.map_type in maps._NO_BATCH_LOOKUP and len(asked) == 1
    cpu = pinned["percpu"]
    cpu.set(ct.c_uint64(5), Leaf(9, 9, 9))
    assert [(k.value, v.a) for k, v in cpu.items()] == [(5, 9)]
    assert list(pinned["empty"].items()) == []
