"""The agent's decisions in a file the libraries map read-only (verbs/rlb_verbs.h, struct
rlbv_record): the second end of a QP reads its path there instead of asking a busy agent.

One file per agent instance, kept across restarts (a library's mapping of it stays good: the agent
rewrites the records it adopted, and removes the rest). Each record is written under its sequence
count: odd while it changes, so a reader copies between two equal even counts.

The reader (rlb_verbs.c) loads the count with acquire order, so the writer's stores must reach
other CPUs in order: the count odd, then the body, then the count even. x86 keeps stores in
program order (and each step here is a C call of its own, which no compiler moves across the
others); weaker CPUs (aarch64: Grace) do not, so there each step is fenced with libatomic's
atomic_thread_fence, which every host that builds the library has (gcc depends on it). A weak
machine without it gets no table: the libraries ask the agent for every pair instead."""
from __future__ import annotations

import ctypes
import ctypes.util
import functools
import ipaddress
import mmap
import os
import platform
import struct
from pathlib import Path
from typing import Callable

from rlbcommon.ipv6 import ipv6_packed

from . import protocol as P

C = P.C
HEAD = struct.Struct("<4I")                        # magic, version, slots, record size
RECORD = struct.Struct("<5I8sHHI16s16s")           # seq, state, device, local qpn, remote qpn, iid,
SLOTS, PROBE = C["RLBV_TABLE_SLOTS"], C["RLBV_TABLE_PROBE"]   # path, gid index, keep, saddr, daddr
EMPTY, LIVE, REMOVED = C["RLBV_SLOT_EMPTY"], C["RLBV_SLOT_LIVE"], C["RLBV_SLOT_REMOVED"]
PENDING = C["RLBV_SLOT_PENDING"]
BODY = struct.Struct("<4I8sHHI16s16s")             # a record without its sequence count


def _fnv(data: bytes, h: int = 2166136261) -> int:
    for b in data:
        h = ((h ^ b) * 16777619) & 0xFFFFFFFF
    return h


@functools.lru_cache(maxsize=1024)
def device(dev: str, port: int) -> int:
    """rlbv_device(): an RDMA port as the table names it."""
    return _fnv(bytes([port & 0xFF]), _fnv(dev.encode()))


def slot(device_key: int, local_qpn: int, remote_qpn: int, iid: bytes) -> int:
    """rlbv_slot(): FNV-1a over the key, as the library computes it."""
    return _fnv(device_key.to_bytes(4, "little") + local_qpn.to_bytes(4, "little")
                + remote_qpn.to_bytes(4, "little") + iid) % SLOTS


@functools.lru_cache(maxsize=65536)
def iid_of(address: str) -> bytes:
    """The interface identifier: the low 64 bits, the same on every path of a host."""
    return ipaddress.IPv6Address(address).packed[8:]


STORES_IN_ORDER = platform.machine() in ("x86_64", "AMD64", "i386", "i686")
ATOMIC_RELEASE = 3                                 # __ATOMIC_RELEASE


class NoFence(RuntimeError):
    """This machine may show other CPUs a record's stores out of order, and no fence is to be had."""


@functools.lru_cache(maxsize=1)
def release_fence() -> Callable[[], None] | None:
    """libatomic's atomic_thread_fence(__ATOMIC_RELEASE), or None where libatomic is missing."""
    try:
        lib = ctypes.CDLL(ctypes.util.find_library("atomic") or "libatomic.so.1")
        fence = lib.atomic_thread_fence
    except (OSError, AttributeError):
        return None
    fence.argtypes, fence.restype = [ctypes.c_int], None
    return functools.partial(fence, ATOMIC_RELEASE)


class DecisionTable:
    def __init__(self, path: Path, fence: Callable[[], None] | None = None, in_order: bool = STORES_IN_ORDER):
        """fence: what orders one step's stores before the next's (by default libatomic's where the
        machine needs one, nothing on x86); NoFence where it needs one and has none."""
        self.fence = fence or (None if in_order else release_fence())
        if self.fence is None and not in_order:
            raise NoFence(f"no libatomic (atomic_thread_fence) on this {platform.machine()} machine, whose "
                          "CPUs may see a record's stores out of order (apt install libatomic1)")
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.map = self._open() or self._replace()
        self.where: dict[tuple[int, int, int, bytes], int] = {}   # key -> slot, of the live records

    HEAD_NOW = (C["RLBV_TABLE_MAGIC"], P.VERSION, SLOTS, RECORD.size)
    SIZE = HEAD.size + SLOTS * RECORD.size

    def _open(self) -> mmap.mmap | None:
        """The file as a running agent left it, if it has this layout."""
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW)
        except OSError:
            return None
        try:
            if os.fstat(fd).st_size != self.SIZE:
                return None
            m = mmap.mmap(fd, self.SIZE, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)
        if HEAD.unpack_from(m, 0) != self.HEAD_NOW:
            m.close()
            return None
        return m

    def _replace(self) -> mmap.mmap:
        """A new, empty file put in place by rename: a library that mapped what was there (another
        layout, a damaged file) keeps reading that, never a file truncated or rewritten under it."""
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}")
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
        try:
            os.fchmod(fd, 0o644)                  # every job's library reads it
            os.ftruncate(fd, self.SIZE)
            m = mmap.mmap(fd, self.SIZE, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)
        HEAD.pack_into(m, 0, *self.HEAD_NOW)
        os.replace(tmp, self.path)
        return m

    def clear(self):
        """Every record removed (a starting agent rewrites those it adopts)."""
        for i in range(SLOTS):
            off = HEAD.size + i * RECORD.size
            if struct.unpack_from("<I", self.map, off + 4)[0] in (LIVE, PENDING):
                self._write(i, REMOVED, 0, 0, 0, bytes(8), 0, 0, 0, bytes(16), bytes(16))
        self.where.clear()

    def _write(self, i: int, state, device_key, local_qpn, remote_qpn, iid, path, gid_index, keep, saddr, daddr):
        off = HEAD.size + i * RECORD.size
        seq = struct.unpack_from("<I", self.map, off)[0]
        struct.pack_into("<I", self.map, off, (seq + 1) | 1)              # odd: being written
        if self.fence:
            self.fence()                          # the odd count seen before any of the body
        BODY.pack_into(self.map, off + 4, state, device_key, local_qpn, remote_qpn, iid, path, gid_index, keep,
                       saddr, daddr)
        if self.fence:
            self.fence()                          # the whole body seen before the even count
        struct.pack_into("<I", self.map, off, ((seq + 1) | 1) + 1)        # even: stable

    def put(self, dev: str, port: int, local_qpn: int, remote_qpn: int, peer: str, path: int = 0,
            gid_index: int = 0, keep: int = 0, saddr: str | None = None, daddr: str | None = None,
            pending: bool = False) -> bool:
        """Write a pair's decision (this end: QP local_qpn of RDMA port dev/port; path 0: keep, for
        reason keep; pending: a path this end waits on the other end's word for); False if its
        slots are full (the library then asks the agent, as without the table)."""
        key = (device(dev, port), local_qpn, remote_qpn, iid_of(peer))
        i = self.where.get(key)
        if i is None:
            first = slot(*key)
            for j in range(PROBE):
                k = (first + j) % SLOTS
                state = struct.unpack_from("<I", self.map, HEAD.size + k * RECORD.size + 4)[0]
                if state not in (LIVE, PENDING):
                    i = k
                    break
            if i is None:
                return False
        self._write(i, PENDING if pending else LIVE, *key, path, gid_index, keep,
                    ipv6_packed(saddr) if saddr else bytes(16), ipv6_packed(daddr) if daddr else bytes(16))
        self.where[key] = i
        return True

    def remove(self, dev: str, port: int, local_qpn: int, remote_qpn: int, peer: str):
        i = self.where.pop((device(dev, port), local_qpn, remote_qpn, iid_of(peer)), None)
        if i is not None:
            self._write(i, REMOVED, 0, 0, 0, bytes(8), 0, 0, 0, bytes(16), bytes(16))

    def close(self):
        self.map.close()
