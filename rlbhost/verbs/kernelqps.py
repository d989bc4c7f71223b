"""The kernel's word on QPs: which exist on an RDMA device and which process made each, from its
RDMA resource tracking (rdma netlink, RDMA_NLDEV_CMD_RES_QP_GET, what `rdma resource show qp`
prints). A client's claim on a QP number is checked against it: QP numbers are predictable, so
any local user could otherwise speak for another's QP before its owner does; and a QP the kernel
no longer has is let go whatever messages were lost.

The kernel names the task that made the QP: a thread (NCCL makes its QPs in a proxy thread), so
the owner is that thread's process (its Tgid). It names no one for a kernel QP or a task outside
the agent's PID namespace: such QPs are checked for existence only.

Without RDMA netlink (a kernel with no RDMA core) there is no authority and the agent falls back to
what the processes themselves say. RLB_RDMA_RES_DIR points the agent at a directory laid out as
<device>/<QP number> holding the creating thread's id, which the tests' stand-in libibverbs keeps:
the kernel's table for devices the kernel does not have."""
from __future__ import annotations

import errno
import logging
import os
import socket
import struct
import time
from dataclasses import dataclass
from pathlib import Path

from rlbcommon.nlmsg import HDR, NLA, NLM_F_DUMP, NLM_F_REQUEST, NLMSG_DONE, NLMSG_ERROR, attributes, error, messages

log = logging.getLogger("rlb.verbs")

# <linux/netlink.h> and <rdma/rdma_netlink.h> (tests/test_verbs_kernelqps.py checks them against
# the installed headers)
NETLINK_RDMA = 20
RDMA_NL_NLDEV = 5
CMD_GET = 1
CMD_RES_QP_GET = 10
ATTR_DEV_INDEX = 1
ATTR_DEV_NAME = 2
ATTR_PORT_INDEX = 3
ATTR_RES_QP = 19
ATTR_RES_QP_ENTRY = 20
ATTR_RES_LQPN = 21
ATTR_RES_PID = 28
ATTR_RES_KERN_NAME = 29

DEVICES_REREAD_S = 1.0               # a device not known is looked for again at most this often


def msg_type(cmd: int) -> int:
    return (RDMA_NL_NLDEV << 10) + cmd


def attr(kind: int, payload: bytes) -> bytes:
    n = NLA.size + len(payload)
    return NLA.pack(n, kind) + payload + b"\0" * (-n % 4)


def attrs(buf: bytes) -> dict[int, bytes]:
    """{type: payload} of one level of netlink attributes (the last of a repeated type)."""
    return dict(attributes(buf))


def nested(buf: bytes, kind: int) -> list[bytes]:
    """Every payload of `kind` at one level (a table's entries repeat one type)."""
    return [p for k, p in attributes(buf) if k == kind]


def u32(b: bytes | None) -> int | None:
    return struct.unpack_from("=I", b)[0] if b is not None and len(b) >= 4 else None


def text(b: bytes | None) -> str | None:
    return b.split(b"\0", 1)[0].decode(errors="replace") if b is not None else None


@dataclass(frozen=True)
class KernelQp:
    dev: str
    qpn: int
    port: int | None      # None before the QP is bound to a port (RESET)
    task: int | None      # the thread that made it; None: the kernel's own, or not in our PID namespace


def qps_of_message(payload: bytes) -> list[KernelQp]:
    """The QPs in one RES_QP_GET answer: a dump's table of entries (sent over several answers),
    or the one QP a query names, its attributes beside the device's."""
    top = attrs(payload)
    dev = text(top.get(ATTR_DEV_NAME)) or ""
    table = top.get(ATTR_RES_QP)
    entries = nested(table, ATTR_RES_QP_ENTRY) if table is not None else [payload]
    out = []
    for entry in entries:
        a = attrs(entry)
        qpn = u32(a.get(ATTR_RES_LQPN))
        if qpn is not None:
            out.append(KernelQp(dev, qpn, u32(a.get(ATTR_PORT_INDEX)), u32(a.get(ATTR_RES_PID))))
    return out


class RdmaNetlink:
    """The kernel's resource tracking through one NETLINK_RDMA socket."""

    def __init__(self, sock: socket.socket):
        self.sock = sock
        self.seq = 0
        self.query = True        # False: a kernel that answers RES_QP_GET only as a dump

    @classmethod
    def open(cls) -> RdmaNetlink | None:
        try:
            s = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_CLOEXEC, NETLINK_RDMA)
            s.bind((0, 0))
        except OSError as e:                 # EPROTONOSUPPORT: no RDMA core in this kernel
            log.info("verbs: no RDMA netlink (%s): QP owners are what processes say", e.strerror)
            return None
        s.settimeout(1.0)
        return cls(s)

    def close(self):
        self.sock.close()

    def _ask(self, cmd: int, flags: int, body: bytes = b"") -> list[bytes]:
        """The answer's payloads; OSError with the kernel's errno on a refusal."""
        self.seq = (self.seq + 1) & 0xFFFFFFFF
        self.sock.send(HDR.pack(HDR.size + len(body), msg_type(cmd), NLM_F_REQUEST | flags, self.seq, 0) + body)
        out = []
        while True:
            for kind, seq, payload in messages(self.sock.recv(1 << 16)):
                if seq != self.seq:
                    continue                      # a late answer to an earlier question
                if kind == NLMSG_ERROR and (err := error(payload)):
                    raise err
                if kind in (NLMSG_DONE, NLMSG_ERROR):     # the end of a dump, or an acknowledgement
                    return out
                out.append(payload)
                if not flags & NLM_F_DUMP:
                    return out

    def devices(self) -> dict[str, int]:
        """{device name: index}."""
        out = {}
        for p in self._ask(CMD_GET, NLM_F_DUMP):
            a = attrs(p)
            name, index = text(a.get(ATTR_DEV_NAME)), u32(a.get(ATTR_DEV_INDEX))
            if name and index is not None:
                out[name] = index
        return out

    def qps(self, index: int) -> list[KernelQp]:
        """Every QP of one device."""
        out = []
        for p in self._ask(CMD_RES_QP_GET, NLM_F_DUMP, attr(ATTR_DEV_INDEX, struct.pack("=I", index))):
            out += qps_of_message(p)
        return out

    def qp(self, index: int, qpn: int) -> KernelQp | None:
        """One QP (None: the device has no such QP)."""
        if self.query:
            body = attr(ATTR_DEV_INDEX, struct.pack("=I", index)) + attr(ATTR_RES_LQPN, struct.pack("=I", qpn))
            try:
                got = [q for p in self._ask(CMD_RES_QP_GET, 0, body) for q in qps_of_message(p)]
            except OSError as e:
                if e.errno == errno.ENOENT:
                    return None
                if e.errno not in (errno.EINVAL, errno.EOPNOTSUPP):
                    raise
                self.query = False       # no query by QP number (older kernels): the dump
                log.info("verbs: the kernel answers QP queries only as a dump (%s)", e.strerror)
            else:
                return next((q for q in got if q.qpn == qpn), None)
        return next((q for q in self.qps(index) if q.qpn == qpn), None)


class ResDir:
    """The tests' stand-in for the kernel's table: <root>/<device>/<QP number in hex> holding the
    creating thread's id, kept by tests/verbs/stub_ibverbs.c (made at ibv_create_qp, removed at
    ibv_destroy_qp). As the kernel frees a process's QPs when it ends, a query about an entry whose
    process has ended finds no QP (a dump lists it still: the agent's own check of ended processes
    lets such QPs go)."""

    def __init__(self, root: Path):
        self.root = root
        self.names: list[str] = []

    def close(self):
        pass

    def devices(self) -> dict[str, int]:
        try:
            self.names = sorted(os.listdir(self.root))
        except OSError:
            self.names = []
        return {d: i for i, d in enumerate(self.names)}

    def _dev(self, index: int) -> str | None:
        return self.names[index] if 0 <= index < len(self.names) else None

    def qps(self, index: int) -> list[KernelQp]:
        dev = self._dev(index)
        try:
            names = os.listdir(self.root / dev) if dev else []
        except OSError:
            names = []
        return [KernelQp(dev, int(n, 16), None, None) for n in names]

    def qp(self, index: int, qpn: int) -> KernelQp | None:
        dev = self._dev(index)
        try:                      # (os.open: a third of Path.read_text's cost, asked per QP)
            fd = os.open(f"{self.root}/{dev}/{qpn:x}", os.O_RDONLY | os.O_CLOEXEC) if dev else None
            if fd is None:
                return None
            try:
                task = int(os.read(fd, 64))
            finally:
                os.close(fd)
        except (OSError, ValueError):
            return None
        return KernelQp(dev, qpn, None, task) if task is not None and os.path.exists(f"/proc/{task}") else None


def tgid(task: int) -> int | None:
    """The process a thread belongs to (None: it has ended)."""
    try:
        with open(f"/proc/{task}/status", "rb") as f:
            for line in f:
                if line.startswith(b"Tgid:"):
                    return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return None


MISSING = "missing"        # owner(): the kernel has no such QP


class KernelQps:
    """What the service asks: does the kernel track this device, does it have this QP and whose
    process made it (asked by the verbs thread as each QP comes), and which QPs each device has
    (looked at every second by a thread of its own, with its own socket: a dump of thousands of
    QPs is milliseconds of Python the verbs thread does not wait on). Devices the kernel does not
    know (or no authority at all) are not tracked: for them the service goes by what processes
    say, as before."""

    def __init__(self, source: RdmaNetlink | ResDir | None, dumps: RdmaNetlink | ResDir | None = None):
        self.source = source
        self.dumps = dumps or source
        self.index: dict[str, int] = {}
        self.read_at = -DEVICES_REREAD_S
        # the last look: (when it began, {device: its QP numbers}); swapped whole
        self.seen: tuple[float, dict[str, set[int]]] | None = None

    @classmethod
    def open(cls) -> KernelQps:
        root = os.environ.get("RLB_RDMA_RES_DIR")
        if root:
            return cls(ResDir(Path(root)), ResDir(Path(root)))
        source = RdmaNetlink.open()
        return cls(source, RdmaNetlink.open() if source is not None else None)

    @property
    def available(self) -> bool:
        return self.source is not None

    def close(self):
        for s in {id(x): x for x in (self.source, self.dumps) if x is not None}.values():
            s.close()

    def describe(self) -> str:
        if self.source is None:
            return "what processes say (no RDMA netlink)"
        kind = "the kernel (rdma netlink)" if isinstance(self.source, RdmaNetlink) else f"the table in {self.source.root}"
        return f"{kind}: devices {', '.join(sorted(self.index)) or 'none read yet'}"

    def _index_of(self, dev: str) -> int | None:
        if self.source is None:
            return None
        if dev not in self.index and time.monotonic() - self.read_at >= DEVICES_REREAD_S:
            self.read_at = time.monotonic()
            try:
                self.index = self.source.devices()
            except OSError as e:
                log.warning("verbs: the kernel's RDMA devices could not be read: %s", e)
        return self.index.get(dev)

    def tracks(self, dev: str) -> bool:
        return self._index_of(dev) is not None

    def owner(self, dev: str, qpn: int, claimant: int = 0) -> int | str | None:
        """The pid of the process whose thread made the QP; MISSING if the kernel has no such QP;
        None if it cannot say (an untracked device, the kernel's own QP, a task it names to no
        one here, an error). `claimant`: the pid that claims it (made in its main thread, as most
        QPs are, it is the owner without a read of /proc)."""
        index = self._index_of(dev)
        if index is None:
            return None
        try:
            q = self.source.qp(index, qpn)
        except OSError as e:
            log.warning("verbs: the kernel could not be asked about QP 0x%x of %s: %s", qpn, dev, e)
            return None
        if q is None:
            return MISSING
        if not q.task:
            return None
        return claimant if q.task == claimant else tgid(q.task)

    def look(self):
        """Every device's QPs, into `seen` (the watcher thread's round; OSError if the devices
        cannot be listed). A device whose table cannot be read now is left out: not judged."""
        if self.dumps is None:
            return
        began = time.monotonic()
        got = {}
        for dev, index in self.dumps.devices().items():
            try:
                got[dev] = {q.qpn for q in self.dumps.qps(index)}
            except OSError as e:
                log.warning("verbs: the kernel's QPs of %s could not be read: %s", dev, e)
        self.seen = (began, got)
