"""Pinned BPF maps, opened by path: the agents, the CLI and the tests all use this one class."""
from __future__ import annotations

import ctypes as ct
import errno
import os
from pathlib import Path
from typing import Iterator

from . import libbpf
from .libbpf import BPF_ANY, PERCPU_MAP_TYPES, BpfError, check, lib

# map types whose kernel refused BPF_MAP_UPDATE_BATCH here (the LPM trie before it had one)
_NO_BATCH_UPDATE: set[int] = set()
# map types whose kernel refused BPF_MAP_LOOKUP_BATCH here (the LPM trie has none)
_NO_BATCH_LOOKUP: set[int] = set()
LOOKUP_BATCH = 1024            # entries a BPF_MAP_LOOKUP_BATCH call reads at most, in items()
_UNSUPPORTED = {errno.EINVAL, errno.EOPNOTSUPP, 524}          # 524: the kernel's ENOTSUPP


class PinnedMap:
    """A map under /sys/fs/bpf with the key/leaf ctypes that bcc derived from bpf/ headers."""

    def __init__(self, path: Path, key_type, leaf_type):
        self.path = Path(path)
        self.fd = libbpf.obj_get(str(path))
        info = libbpf.map_info(self.fd)
        self.map_type, self.max_entries = info.type, info.max_entries
        self.key_type, self.leaf_type = key_type, leaf_type
        self.percpu = info.type in PERCPU_MAP_TYPES
        if ct.sizeof(key_type) != info.key_size or ct.sizeof(leaf_type) != info.value_size:
            raise ValueError(f"{path}: pinned map layout ({info.key_size}/{info.value_size} bytes) "
                             f"differs from this version's ({ct.sizeof(key_type)}/"
                             f"{ct.sizeof(leaf_type)}); detach and attach again")
        self._stride = (ct.sizeof(leaf_type) + 7) & ~7
        self._ncpu = libbpf.possible_cpus() if self.percpu else 1

    def close(self):
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    def key(self, key):
        if isinstance(key, int):
            return self.key_type(key)
        return key

    def _valbuf(self):
        return ct.create_string_buffer(self._stride * self._ncpu)

    def get(self, key):
        """The leaf (summed over CPUs for per-CPU maps is get_percpu's job) or None."""
        k = self.key(key)
        buf = self._valbuf()
        if lib.bpf_map_lookup_elem(self.fd, ct.byref(k), buf) < 0:
            return None
        return self.leaf_type.from_buffer_copy(buf.raw[:ct.sizeof(self.leaf_type)])

    def get_percpu(self, key) -> list:
        k = self.key(key)
        buf = self._valbuf()
        if lib.bpf_map_lookup_elem(self.fd, ct.byref(k), buf) < 0:
            return []
        size = ct.sizeof(self.leaf_type)
        return [self.leaf_type.from_buffer_copy(buf.raw[i * self._stride:i * self._stride + size])
                for i in range(self._ncpu)]

    def set(self, key, leaf, flags: int = BPF_ANY):
        k = self.key(key)
        if self.percpu:
            buf = self._valbuf()
            for i in range(self._ncpu):
                ct.memmove(ct.addressof(buf) + i * self._stride, ct.byref(leaf),
                           ct.sizeof(leaf))
            ret = lib.bpf_map_update_elem(self.fd, ct.byref(k), buf, flags)
        else:
            ret = lib.bpf_map_update_elem(self.fd, ct.byref(k), ct.byref(leaf), flags)
        if ret < 0:                     # the message only when it is needed: a table is many writes
            check(ret, f"update {self.path.name}")

    def set_percpu(self, key, rows: list):
        """Write one value per CPU (per-CPU maps)."""
        k = self.key(key)
        buf = self._valbuf()
        for i, leaf in enumerate(rows[:self._ncpu]):
            ct.memmove(ct.addressof(buf) + i * self._stride, ct.byref(leaf), ct.sizeof(leaf))
        check(lib.bpf_map_update_elem(self.fd, ct.byref(k), buf, BPF_ANY), f"update {self.path.name}")

    def delete(self, key) -> bool:
        return lib.bpf_map_delete_elem(self.fd, ct.byref(self.key(key))) == 0

    def keys(self) -> Iterator:
        prev, nxt = None, self.key_type()
        while True:
            ret = lib.bpf_map_get_next_key(self.fd, None if prev is None else ct.byref(prev),
                                           ct.byref(nxt))
            if ret < 0:
                return
            yield self.key_type.from_buffer_copy(nxt)
            prev = self.key_type.from_buffer_copy(nxt)

    def items(self) -> Iterator:
        """Every (key, leaf): LOOKUP_BATCH entries a syscall where the kernel has
        BPF_MAP_LOOKUP_BATCH for this map type (hash maps: 5.6), else two syscalls an entry.
        An agent's sweep reads every tracked QP of every NIC several times a second."""
        batched = None if self.percpu or self.map_type in _NO_BATCH_LOOKUP else self._items_batched()
        if batched is not None:
            yield from batched
            return
        for k in self.keys():
            v = self.get(k)
            if v is not None:
                yield k, v

    def _items_batched(self) -> list | None:
        """items() read by BPF_MAP_LOOKUP_BATCH; None where it cannot be (this map type has no
        batch lookup, or a hash bucket holds more than a call reads: then read per key)."""
        ksize, vsize = ct.sizeof(self.key_type), ct.sizeof(self.leaf_type)
        n = max(1, min(self.max_entries, LOOKUP_BATCH))
        keys, vals = ct.create_string_buffer(ksize * n), ct.create_string_buffer(vsize * n)
        # where the next call starts: a bucket (hash maps) or a key (arrays), opaque to us
        before, after = ct.create_string_buffer(max(ksize, 8)), ct.create_string_buffer(max(ksize, 8))
        out, first = [], True
        while True:
            count = ct.c_uint32(n)
            ret = lib.bpf_map_lookup_batch(self.fd, None if first else before, after, keys, vals,
                                           ct.byref(count), None)
            err = ct.get_errno() if ret < 0 else 0
            if ret < 0 and err != errno.ENOENT:          # ENOENT: this call reached the end
                if err in _UNSUPPORTED and first:
                    _NO_BATCH_LOOKUP.add(self.map_type)
                    return None
                if err == errno.ENOSPC:
                    return None
                check(ret, f"batch lookup {self.path.name}")
            kraw, vraw = keys.raw, vals.raw
            out += [(self.key_type.from_buffer_copy(kraw, i * ksize), self.leaf_type.from_buffer_copy(vraw, i * vsize))
                    for i in range(count.value)]
            if ret < 0:
                return out
            ct.memmove(before, after, len(after))
            first = False

    def array_bytes(self) -> bytes:
        """Every slot of an array map, in index order, as one buffer read by a single
        BPF_MAP_LOOKUP_BATCH call (not per-CPU maps)."""
        n, size = self.max_entries, ct.sizeof(self.leaf_type)
        keys = (ct.c_uint32 * n)()
        vals = ct.create_string_buffer(size * n)
        token = ct.c_uint32()
        count = ct.c_uint32(n)
        ret = lib.bpf_map_lookup_batch(self.fd, None, ct.byref(token), keys, vals,
                                       ct.byref(count), None)
        if ret < 0 and ct.get_errno() != 2:  # ENOENT: the batch reached the end
            check(ret, f"batch lookup {self.path.name}")
        if count.value != n or (n and keys[n - 1] != n - 1):
            raise OSError(f"batch lookup {self.path.name}: {count.value} of {n} slots")
        return vals.raw

    def array_slice(self, start: int, n: int) -> bytes:
        """Slots start .. start+n-1 of an array map in one BPF_MAP_LOOKUP_BATCH call (a batch
        continues after the key it is given: start-1)."""
        size = ct.sizeof(self.leaf_type)
        keys = (ct.c_uint32 * n)()
        vals = ct.create_string_buffer(size * n)
        token, count = ct.c_uint32(), ct.c_uint32(n)
        prev = ct.c_uint32(start - 1)
        ret = lib.bpf_map_lookup_batch(self.fd, ct.byref(prev) if start else None, ct.byref(token), keys,
                                       vals, ct.byref(count), None)
        if ret < 0 and ct.get_errno() != 2:
            check(ret, f"batch lookup {self.path.name}")
        if count.value != n or (n and (keys[0], keys[n - 1]) != (start, start + n - 1)):
            raise OSError(f"batch lookup {self.path.name}: {count.value} of slots {start}..{start + n - 1}")
        return vals.raw

    def array_values(self) -> list:
        """Every slot of an array map in one BPF_MAP_LOOKUP_BATCH call (not per-CPU maps):
        scanning a 4096-entry table costs one syscall instead of 4096. All-zero slots
        come back as None."""
        size = ct.sizeof(self.leaf_type)
        raw, empty = self.array_bytes(), bytes(size)
        out = [None] * self.max_entries
        for i in range(self.max_entries):
            chunk = raw[i * size:(i + 1) * size]
            if chunk != empty:  # decode only used slots: the table is mostly empty
                out[i] = self.leaf_type.from_buffer_copy(chunk)
        return out

    def update_batch(self, writes: list[tuple[int, bytes]]):
        """Array writes (index, value bytes) in one BPF_MAP_UPDATE_BATCH call, applied in list
        order (an index may appear more than once: later wins, as separate updates would)."""
        if not writes:
            return
        n, size = len(writes), ct.sizeof(self.leaf_type)
        keys = (ct.c_uint32 * n)(*(k for k, _ in writes))
        vals = ct.create_string_buffer(b"".join(v for _, v in writes), n * size)
        count = ct.c_uint32(n)
        check(lib.bpf_map_update_batch(self.fd, keys, vals, ct.byref(count), None),
              f"batch update {self.path.name}")

    def put_many(self, keys: bytes, values: bytes, n: int) -> tuple[int, BpfError | None]:
        """n entries of any map, keys and values each laid end to end, in order: one
        BPF_MAP_UPDATE_BATCH call where the kernel has it for this map type, else one update
        each. (entries written, the error that stopped the next one, or None)."""
        if not n:
            return 0, None
        ksize, vsize = ct.sizeof(self.key_type), ct.sizeof(self.leaf_type)
        if self.map_type not in _NO_BATCH_UPDATE:
            count = ct.c_uint32(n)
            ret = lib.bpf_map_update_batch(self.fd, keys, values, ct.byref(count), None)
            if ret >= 0:
                return n, None
            refused = libbpf.error(ret, f"batch update {self.path.name}")
            # a kernel without the operation refuses before writing anything and leaves the count
            # as it was given: n, not 0
            done = count.value if count.value < n else 0
            if done or refused.errno not in _UNSUPPORTED:
                return done, refused
            _NO_BATCH_UPDATE.add(self.map_type)        # an older kernel: one update each
        for i in range(n):
            ret = lib.bpf_map_update_elem(self.fd, keys[i * ksize:(i + 1) * ksize],
                                          values[i * vsize:(i + 1) * vsize], BPF_ANY)
            if ret < 0:
                return i, libbpf.error(ret, f"update {self.path.name}")
        return n, None

    def clear(self):
        for k in list(self.keys()):
            self.delete(k)

    def zero(self, key):
        self.set(key, self.leaf_type())


def checked_set(obj, name: str, value, error=ValueError, what: str | None = None):
    """Store an integer in a ctypes field only if it fits (ctypes would truncate silently:
    2**32 into a u32 is 0). `error` is raised with a message naming the field and its range."""
    import math
    ctype = dict(obj._fields_)[name]
    signed = ctype(-1).value < 0
    bits = ct.sizeof(ctype) * 8
    lo, hi = (-(1 << (bits - 1)), (1 << (bits - 1)) - 1) if signed else (0, (1 << bits) - 1)
    label = what or name
    if isinstance(value, float) and not math.isfinite(value):
        raise error(f"{label}: {value} is not a finite number")
    if int(value) != value:
        raise error(f"{label}: {value} is not a whole number")
    if not lo <= int(value) <= hi:
        raise error(f"{label}: {value} is out of range ({lo}..{hi})")
    setattr(obj, name, int(value))
