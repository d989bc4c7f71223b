"""The verbs agents' link to each other: UDP on VERBS_PORT, each datagram sealed with the key this
host shares with the peer (else the fabric's) and aged by the kernel's arrival stamp; a round's
messages for one peer packed into as few datagrams as fit (one seal, one send, one receive for
many: under a burst that is most of the work saved). Questions are sent again until answered and
USED/CONFIRM until acknowledged, at each peer's own interval (outstanding.py)."""
from __future__ import annotations

import errno
import functools
import ipaddress
import logging
import selectors
import socket
import struct
import time
from typing import Callable

from rlbcommon import failpoints
from rlbcommon.constants import VERBS_TCLASS

from ..probekeys import KeyFile
from . import protocol as P
from .outstanding import Outstanding, Pending
from .peerauth import SEAL_MAX, Unsealer, seal

log = logging.getLogger(__name__)

NOTIFY_FOR_NS = 3_000_000_000  # a USED or CONFIRM is sent again until acknowledged or this old
MAX_UDP_BATCH = 256            # peers' messages read per round (they settle questions waiting)
UDP = "udp"                    # the socket's mark in the service's selector
SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", 35)   # Linux's, absent from Python 3.11's module
IPV6_PKTINFO = getattr(socket, "IPV6_PKTINFO", 50)
MSG_TRUNC = int(socket.MSG_TRUNC)
ERROR_LOG_S = 10.0             # a fault in handling peers' messages is logged at most this often


def mono_ns() -> int:
    return time.clock_gettime_ns(time.CLOCK_MONOTONIC)


class PeerLink:
    def __init__(self, port: int, keys: KeyFile, sel: selectors.BaseSelector, counters: dict[str, int],
                 on_message: Callable[[P.PeerMsg, str, int], None]):
        """on_message(m, sender, arrived_ns) gets every message but the answers to this host's
        own (REPLY: those go to the question's on_reply)."""
        self.port, self.keys, self.sel, self.counters = port, keys, sel, counters
        self.on_message = on_message
        self.unsealer = Unsealer()
        self.pending = Outstanding()       # messages to peers waiting on an answer
        self.outbox: dict[tuple[str, str | None], list[bytes]] = {}   # (peer, from) -> this round's messages
        self.udp: socket.socket | None = None
        self._error_logged_at = -ERROR_LOG_S

    @property
    def up(self) -> bool:
        return self.udp is not None

    def open(self):
        u = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM | socket.SOCK_NONBLOCK | socket.SOCK_CLOEXEC)
        u.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
        u.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
        u.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_TCLASS, VERBS_TCLASS)
        u.bind(("::", self.port))
        self.udp = u
        self.sel.register(u, selectors.EVENT_READ, UDP)

    def close(self):
        if self.udp is not None:
            self.sel.unregister(self.udp)
            self.udp.close()
            self.udp = None

    def ask(self, msg: P.PeerMsg, peer: str, deadline_ns: int, on_reply, src: str | None = None,
            key=None, steady: bool = False) -> Pending | None:
        """A question: on_reply(answer), or on_reply(None) once deadline_ns passes unanswered
        (at once if it has passed, or the link is down)."""
        now = mono_ns()
        if deadline_ns <= now or self.udp is None:
            on_reply(None)
            return None
        p = self.pending.add(Pending(msg, peer, deadline_ns, on_reply, src, key, steady=steady), now)
        if not steady:                         # (a steady one goes first after one interval)
            self.send(msg, peer, src)
        return p

    def notify(self, msg: P.PeerMsg, peer: str, src: str):
        """A message that changes the peer's state (USED, CONFIRM): sent again until the peer
        acknowledges it (outstanding.py: how often), for NOTIFY_FOR_NS."""
        if self.udp is None:
            return
        msg = P.PeerMsg(**{**msg.__dict__, "id": P.message_id()})
        now = mono_ns()

        def acked(reply):
            if reply is None:
                self.counters["unacknowledged"] += 1
                log.debug("verbs: %s to %s never acknowledged", msg.kind, peer)
        self.pending.add(Pending(msg, peer, now + NOTIFY_FOR_NS, acked, src), now)
        self.send(msg, peer, src)

    def send(self, msg: P.PeerMsg, peer: str, src: str | None = None):
        """To the peer's agent, from `src` (the base address of the NIC the message is about: the
        peer checks the sender is that NIC, and a server's source routing sends it out of it).
        Queued, and sent with the round's other messages for that peer (flush)."""
        if self.udp is not None and not (failpoints.DROPS and failpoints.dropped(f"verbs-{msg.kind}")):
            self.outbox.setdefault((peer, src), []).append(msg.encode())

    def reply(self, to: P.PeerMsg, src: str, me: str, **answer):
        """The answer to a peer's message (sent again whenever the message comes again)."""
        self.send(P.PeerMsg("REPLY", to.id, **answer), src, me)

    def flush(self):
        """The round's messages, as few datagrams as fit them."""
        outbox, self.outbox = self.outbox, {}
        for (peer, src), messages in outbox.items():
            self.counters["messages_sent"] += len(messages)
            key = self.keys.to_seal(peer)            # the key shared with that peer, else the fabric's
            for body in P.pack_peer(messages, P.DATAGRAM_MAX - SEAL_MAX):
                data = seal(body, key) if key else body
                try:
                    if src:
                        self.udp.sendmsg([data], [(socket.IPPROTO_IPV6, IPV6_PKTINFO, _pktinfo(src))], 0,
                                         (peer, self.port))
                    else:
                        self.udp.sendto(data, (peer, self.port))
                    self.counters["datagrams_sent"] += 1
                except OSError as e:
                    if e.errno not in (errno.ENETUNREACH, errno.EHOSTUNREACH, errno.EAGAIN, errno.EADDRNOTAVAIL):
                        log.warning("verbs: cannot send to %s: %s", peer, e)

    def resend_due(self, now: int):
        """Copies of what is unanswered and due again; what ran out of time is given up (None)."""
        for p in self.pending.due(now):
            if p.done:                                          # its time is up
                p.on_reply(None)
                continue
            # a question's budget is what is left of it
            changes = ({"budget_us": max(0, (p.deadline_ns - now) // 1000)}
                       if p.msg.kind in ("ASK", "CHECK", "PATHS") else {})
            self.counters["resent"] += 1
            self.send(self.pending.resend(p, now, **changes), p.peer, p.src)

    def read(self):
        """The peers' datagrams waiting (at most MAX_UDP_BATCH), checked, to their answers or
        on_message."""
        for _ in range(MAX_UDP_BATCH):
            try:
                data, anc, flags, src = self.udp.recvmsg(P.DATAGRAM_MAX, socket.CMSG_SPACE(16))
            except BlockingIOError:
                return
            if flags & MSG_TRUNC:
                self.counters["bad_messages"] += 1
                continue
            arrived = time.time_ns()
            for level, kind, cdata in anc:
                if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS and len(cdata) >= 16:
                    sec, nsec = struct.unpack("qq", cdata[:16])
                    arrived = sec * 1_000_000_000 + nsec
            try:
                # only the keys shared with the sender (a host that leaked its file speaks only
                # as itself); aged at arrival (the kernel's stamp), not after waiting in this socket
                keys = self.keys.to_check(src[0])
                if keys is None:
                    raise P.BadMessage("no key is shared with this sender")
                data = self.unsealer.open(data, keys, arrived // 1_000_000)
            except P.BadMessage as e:
                self.counters["unauthenticated"] += 1
                log.debug("verbs: refused a message from %s: %s", src[0], e)
                continue
            sender = src[0].split("%")[0]
            for line in P.unpack_peer(data):
                try:
                    m = P.parse_peer(line)
                    if m.kind == "REPLY":
                        self._answered(m, sender)
                    else:
                        self.on_message(m, sender, arrived)
                except P.BadMessage as e:
                    self.counters["bad_messages"] += 1
                    log.debug("verbs: bad message from %s: %s", src[0], e)
                except Exception:   # noqa: BLE001 - one message's fault is that message's alone
                    self._failed(line, sender)

    def _failed(self, line: bytes, sender: str):
        """A fault in this agent's handling of one message: counted, and logged with its
        traceback (at most every ERROR_LOG_S, with how many since); the datagram's other messages
        and the round go on. Raised out of the round, it lost them all and held every library's
        answer for the loop's restart: 0.1 s, doubling while it recurs (6.4 s in a bench)."""
        self.counters["message_errors"] += 1
        now = time.monotonic()
        if now - self._error_logged_at >= ERROR_LOG_S:
            self._error_logged_at = now
            log.exception("verbs: handling a message from %s failed (%d so far; the others go on): %r",
                          sender, self.counters["message_errors"], line[:120])

    def _answered(self, m: P.PeerMsg, sender: str):
        p = self.pending.get(m.id)
        if p is not None and _same_host(sender, p.peer):
            self.pending.answered(m.id, mono_ns())
            p.on_reply(m)

    def reread_keys(self):
        try:
            if self.keys.refresh():
                log.info("verbs: the fabric's keys reread from %s: %d fabric-wide, %d shared with a host",
                         self.keys.path, len(self.keys.keys), len(self.keys.pairs))
        except ValueError as e:              # a half-edited file: the keys read before stay
            log.warning("verbs: %s (the keys read before stay in use)", e)
        self.counters["key_file_bad"] = int(self.keys.bad)


@functools.lru_cache(maxsize=64)
def _pktinfo(src: str) -> bytes:
    """struct in6_pktinfo: send from this address, out of whichever interface routes it."""
    return ipaddress.IPv6Address(src).packed + struct.pack("I", 0)


@functools.lru_cache(maxsize=65536)
def _same_host(src: str, peer: str) -> bool:
    """A reply comes from the host asked (any of its path addresses: the kernel picks the source)."""
    a, b = ipaddress.IPv6Address(src).packed, ipaddress.IPv6Address(peer).packed
    return a[8:] == b[8:]
