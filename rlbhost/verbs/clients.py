"""The verbs socket: the library in each RDMA process of this host connects here (SEQPACKET, one
message a question or a report). Who may connect is the socket's mode (root and the verbs group);
what each connection and each user may hold is capped here, so one user's jobs always leave room
for another's; answers to a process that does not read are dropped, never waited on."""
from __future__ import annotations

import collections
import errno
import grp
import logging
import os
import selectors
import socket
import struct
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from rlbcommon.constants import VERBS_GROUP

from ..dataplane import VerbsQp
from . import protocol as P

log = logging.getLogger(__name__)

MAX_CLIENTS = 1024
MAX_CLIENTS_PER_UID = 256      # one user's connections: another user's jobs always find room
ACCEPT_PAUSE_S = 1.0           # out of file descriptors: new connections wait this long
MAX_BATCH = 2                  # messages read from one client per round: no client starves others,
                               # and the peers' answers (read first each round) wait for no burst
LISTEN = "listen"              # the listener's mark in the service's selector
UCRED = struct.Struct("3i")
SO_MEMINFO, MEMINFO = 55, struct.Struct("9I")       # SK_MEMINFO_*: [2] wmem charged, [3] sndbuf granted
CHARGE_STEP = 8                # message lengths are measured in steps of this many bytes
MSG_TRUNC, SEND_FLAGS = int(socket.MSG_TRUNC), int(socket.MSG_DONTWAIT | socket.MSG_NOSIGNAL)  # plain ints:
                               # an enum's & and | cost a call each, on every message

Local = tuple[str, int, int]   # a QP of this host: (RDMA device, port, QP number)


@dataclass(frozen=True)
class SocketRoom:
    """What a library's socket holds before its sends fail, as this kernel counts it: the send
    buffer it grants the library's RLBV_SNDBUF (capped at net.core.wmem_max, doubled), and what
    it charges that buffer for one message of each length (the message's buffers, rounded up to
    an allocator's size: 768 bytes for up to 192 here, 1280 beyond). Messages read by the agent
    were charged so while they waited."""
    sndbuf: int
    charges: tuple[int, ...]          # [i]: a message of up to i * CHARGE_STEP bytes

    def charge(self, length: int) -> int:
        return self.charges[min(len(self.charges) - 1, -(-length // CHARGE_STEP))]


def measure_room() -> SocketRoom:
    """Measured once on a socket pair set up as the library sets up its own: each length sent,
    its charge read back (SO_MEMINFO), the message taken off again."""
    lib, agent = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    with lib, agent:
        lib.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, P.C["RLBV_SNDBUF"])
        charges = []
        for i in range(-(-(P.MSG_MAX + 1) // CHARGE_STEP) + 1):
            lib.send(b"x" * max(1, i * CHARGE_STEP))
            charges.append(MEMINFO.unpack(lib.getsockopt(socket.SOL_SOCKET, SO_MEMINFO, MEMINFO.size))[2])
            agent.recv(P.MSG_MAX + CHARGE_STEP)
        sndbuf = MEMINFO.unpack(lib.getsockopt(socket.SOL_SOCKET, SO_MEMINFO, MEMINFO.size))[3]
    return SocketRoom(sndbuf, tuple(charges))


def proc_start(pid: int) -> int | None:
    """The process's start time (clock ticks since boot): with the pid, it names one process.
    None once it has ended (a zombie too: its QPs are gone with it)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        fields = stat[stat.rindex(")") + 2:].split()
        return None if fields[0] in ("Z", "X") else int(fields[19])
    except (OSError, ValueError, IndexError):
        return None


@dataclass
class Client:
    sock: socket.socket
    pid: int
    uid: int
    start: int | None
    greeted: bool = False
    pending: int = 0               # its questions waiting on a peer agent
    qpns: set[Local] = field(default_factory=set)
    ahs: dict[int, VerbsQp] = field(default_factory=dict)        # handle -> entry
    ah_pending: dict[int, tuple[VerbsQp, str]] = field(default_factory=dict)  # question seq -> (entry, NIC)
    ah_nic: dict[int, str] = field(default_factory=dict)         # handle -> its NIC
    backlog: int = 0               # bytes its messages read since its socket was last found empty
                                   # were charged there (SocketRoom)


class Clients:
    """The listening socket and every library connected to it, registered in the service's
    selector (the listener marked LISTEN, each connection by its Client). on_message(c, m) gets
    each message read (raising P.BadMessage cuts the process off); on_drop(c) is told of each
    process that leaves, before it is forgotten."""

    def __init__(self, path: Path, group: str | None, sel: selectors.BaseSelector, counters: dict[str, int],
                 on_message: Callable[[Client, object], None], on_drop: Callable[[Client], None],
                 on_full: Callable[[Client], None] | None = None):
        """on_full(c): c's backlog reached half of what its socket holds, so its library's sends
        may have failed (words lost): told once each time it does, and again once that backlog is
        read to its end (a QP whose INIT was read after the first word is as much at risk: its
        library may have given up on it with its later words lost)."""
        self.path, self.group, self.sel, self.counters = Path(path), group, sel, counters
        self.on_message, self.on_drop, self.on_full = on_message, on_drop, on_full
        self.room = measure_room()
        self.full_at = self.room.sndbuf // 2          # bytes charged to a library's socket
        self.by_sock: dict[socket.socket, Client] = {}
        self.per_uid: dict[int, dict[str, int]] = collections.defaultdict(
            lambda: {"clients": 0, "qps": 0, "pending": 0})       # what each user holds
        self.listener: socket.socket | None = None
        self.access = ""
        self.paused_until = 0.0

    def __len__(self) -> int:
        return len(self.by_sock)

    def __contains__(self, c: Client) -> bool:
        """Still connected."""
        return c.sock in self.by_sock

    def all(self) -> list[Client]:
        return list(self.by_sock.values())

    def open(self):
        """The socket, reachable by root and the verbs group (or every user, if asked for)."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            self.path.unlink()
        except FileNotFoundError:
            pass
        s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_NONBLOCK | socket.SOCK_CLOEXEC)
        s.bind(str(self.path))
        self.access = self._restrict()
        s.listen(128)
        self.listener = s
        self.sel.register(s, selectors.EVENT_READ, LISTEN)

    def _restrict(self) -> str:
        """The socket's owners: root and the verbs group (0660); every user only if asked for
        with group '*'. Without the group (the default one not made yet) only root's jobs."""
        group = self.group if self.group is not None else VERBS_GROUP
        if group == "*":
            os.chmod(self.path, 0o666)
            log.warning("verbs: every local user may use %s (--verbs-group '*'): any of them can make "
                        "other users' QPs keep their addresses", self.path)
            return "every user"
        try:
            gid = grp.getgrnam(group).gr_gid
        except KeyError:
            if self.group is not None:
                raise                               # named, and missing: the operator's error
            gid = 0
            log.warning("verbs: no group %s: only root's jobs may use %s (`rlbhost verbs install` makes the "
                        "group; add the users who run jobs to it)", group, self.path)
        os.chown(self.path, 0, gid)
        os.chmod(self.path, 0o660)
        return f"root and group {group}" if gid else "root only"

    def close(self):
        for c in self.all():
            self.drop(c, "agent stopping")
        if self.listener is not None:
            if not self.paused_until:
                self.sel.unregister(self.listener)
            self.listener.close()
            self.listener = None
        try:
            self.path.unlink()
        except FileNotFoundError:
            pass

    def accept(self):
        if time.monotonic() < self.paused_until:
            return
        while True:
            try:
                s, _ = self.listener.accept()
            except BlockingIOError:
                return
            except OSError as e:
                if e.errno not in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    raise
                # out of descriptors: the connection waits in the backlog (the library times out
                # and keeps) and this loop does not spin on it
                self.counters["accept_failed"] += 1
                self.paused_until = time.monotonic() + ACCEPT_PAUSE_S
                self.sel.unregister(self.listener)
                log.warning("verbs: cannot accept a connection (%s): not accepting for %.0f s", e.strerror,
                            ACCEPT_PAUSE_S)
                return
            s.setblocking(False)
            pid, uid, _gid = UCRED.unpack(s.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, UCRED.size))
            held = self.per_uid[uid]
            if len(self.by_sock) >= MAX_CLIENTS or held["clients"] >= MAX_CLIENTS_PER_UID:
                self.counters["refused_clients"] += 1
                log.warning("verbs: refusing pid %d (uid %d): %d processes connected already, %d of them uid %d's",
                            pid, uid, len(self.by_sock), held["clients"], uid)
                s.close()
                continue
            c = Client(s, pid, uid, proc_start(pid))
            self.by_sock[s] = c
            held["clients"] += 1
            self.sel.register(s, selectors.EVENT_READ, c)
            log.info("verbs: pid %d (uid %d) connected", pid, uid)

    def resume(self):
        """Accepting again once the pause after running out of descriptors is over."""
        if self.paused_until and time.monotonic() >= self.paused_until and self.listener is not None:
            self.paused_until = 0.0
            self.sel.register(self.listener, selectors.EVENT_READ, LISTEN)

    def drop(self, c: Client, why: str):
        self.sel.unregister(c.sock)
        c.sock.close()
        del self.by_sock[c.sock]
        self.per_uid[c.uid]["clients"] -= 1
        self.on_drop(c)
        log.info("verbs: pid %d %s (%d QPs stay until they are destroyed or it ends)", c.pid, why, len(c.qpns))

    def read(self, c: Client, limit: int = MAX_BATCH) -> bool:
        """Up to `limit` of the process's messages, each to on_message; True when none is left
        (or the process is gone), False when its socket may hold more."""
        for _ in range(limit):
            try:
                data, _, flags, _ = c.sock.recvmsg(P.MSG_MAX + 1)
            except BlockingIOError:
                if c.backlog >= self.full_at and self.on_full is not None:
                    self.on_full(c)                 # the end of a backlog that could overflow
                c.backlog = 0
                return True
            except OSError as e:
                self.drop(c, f"left ({e.strerror})")
                return True
            if not data:
                self.drop(c, "disconnected")
                return True
            held = c.backlog
            c.backlog += self.room.charge(len(data))
            if held < self.full_at <= c.backlog and self.on_full is not None:
                self.on_full(c)
            try:
                if len(data) > P.MSG_MAX or flags & MSG_TRUNC:
                    raise P.BadMessage("message too long")
                self.on_message(c, P.parse_local(data))
            except P.BadMessage as e:
                self.counters["bad_messages"] += 1
                log.warning("verbs: pid %d sent a bad message (%s): cut off", c.pid, e)
                self.drop(c, "cut off")
                return True
        return False

    @staticmethod
    def send(c: Client, data: bytes):
        try:
            c.sock.send(data, SEND_FLAGS)
        except (BlockingIOError, OSError):
            pass                 # a library not reading its answers: it times out and keeps
