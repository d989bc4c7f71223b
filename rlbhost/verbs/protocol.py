"""The two conversations of the verbs path selector, as text (verbs/rlb_verbs.h has the first):

- library <-> agent, over the local socket: what a QP (or address handle) is, and its path;
- agent <-> agent, UDP between the hosts' base addresses: which path the two ends of one QP
  share. Every message names both ends, so any of them can be answered by itself:

    ASK <id> <budget_us> <a_base> <a_qpn> <b_base> <b_qpn> <a_paths>   a asks b, the pair's
        rendezvous (the lower base address), for the pair's path; its own QP takes part
    CHECK <id> <budget_us> <a_base> <a_qpn> <b_base> <b_qpn> <a_paths> <path>   a, the
        rendezvous, proposes the pair's path: b takes it if b's QP takes part and can use it
    PATHS <id> <budget_us> <a_base> <b_base>                        which paths can b use (UD)
    USED <id> <a_base> <a_qpn> <b_base> <b_qpn> <path> <keep>       a's end keeps its addresses
    CONFIRM <id> <a_base> <a_qpn> <b_base> <b_qpn> <path>           a's library has put the QP on
        the path: b's may have it too (until then b's agent holds it back from b's library)
    HAS <id> <budget_us> <a_base> <a_qpn> <b_base> <b_qpn> <path>   a's library waits on b's
        CONFIRM: has b's library put its QP on the path? (b answers only once it can say yes,
        YES <path>, or that its end keeps, KEEP: a asks again until then; a CONFIRM that is lost
        every time does not leave a waiting; a rendezvous b that holds its own end back too goes
        first on it: both ends waiting for the other would wait out their time)
    REPLY <id> PATH <path>     (to ASK: the path; the asker's library goes first, and its agent
        CONFIRMs once the library has it)
    REPLY <id> HELD <path>     (to ASK: the path, which the rendezvous's library has or is being
        given: the asker's waits for the rendezvous's CONFIRM)
    REPLY <id> KEEP <keep> | REPLY <id> NO <keep>
    REPLY <id> YES <path> <paths>     (to CHECK: the path taken, 0 if not that one; to PATHS: 0;
        to HAS: the path b's library has)
    REPLY <id> ACK             (to USED and CONFIRM: heard)

  USED and CONFIRM change the receiver's state: they are sent again (every few milliseconds, then
  less often) until acknowledged, and taking one twice changes nothing (an end's state moves one
  way only: unconfirmed -> confirmed, path -> keep). Questions are sent again until answered,
  and answered from the state the first answer left, so any message may be lost or repeated.

  A datagram carries one message or several, one a line (`pack_peer`): what an agent has for one
  peer in a round goes together, so a burst of QPs costs a few datagrams, not a few per QP (the
  kernel's send and receive are most of a message's cost). Agents before this refuse a datagram of
  several lines as a bad message, and those pairs keep their addresses.

  <paths> are path field values, comma-separated ("-" for none); budget_us is what is left of
  the asker's time when it sends: a question older than that is not worked on.

  An end is named by its NIC's base address and its QP number: on a server of several NICs the
  base address names one RDMA port (each NIC has its own prefixes), so (address, number) is as
  unique fabric-wide as (device, port, number) is on its host; each message is sent from the
  address of the NIC it is about, and the receiver checks that."""
from __future__ import annotations

import functools
import ipaddress
import os
import struct
from dataclasses import dataclass

from rlbcommon.cheader import constants, enum_names
from rlbcommon.paths import VERBS_SRC

HEADER = "rlb_verbs.h"
C = constants(HEADER, VERBS_SRC)
KEEP = {name: v for v, name in enum_names(HEADER, "RLBV_KEEP_", VERBS_SRC).items() if name != "max"}
KEEP_NAME = {v: k for k, v in KEEP.items()}
VERSION, MSG_MAX, AH_BIT = C["RLBV_VERSION"], C["RLBV_MSG_MAX"], C["RLBV_AH_HANDLE_BIT"]
WAIT_MAX = C["RLBV_WAIT_MAX"]
WAIT_MIN_NS = C["RLBV_WAIT_MIN_MS"] * 1_000_000


def wait_ns(timeout_ns: int) -> int:
    """rlbv_wait_ns(): how long after asking a library waits on a pair its other end may be on."""
    return max(WAIT_MAX * timeout_ns, WAIT_MIN_NS)
QPN_MAX = (1 << 24) - 1
DATAGRAM_MAX = 1232            # an agent's datagram, seal included: IPv6's minimum MTU less its headers


_IDS: list[int] = []          # message ids drawn ahead (message_id)
_IDS_AT_ONCE = 512
os.register_at_fork(after_in_child=_IDS.clear)     # a child never sends its parent's ids


def message_id() -> int:
    """A random 63-bit id for a peer message, as secrets.randbits(63) gives, but drawn from the
    kernel's generator 512 at a time: one getrandom call a message was a syscall a QP end."""
    try:
        return _IDS.pop()
    except IndexError:
        _IDS.extend(v >> 1 for v in struct.unpack(f"<{_IDS_AT_ONCE}Q", os.urandom(8 * _IDS_AT_ONCE)))
        return _IDS.pop()


class BadMessage(ValueError):
    """A message that does not follow the protocol: the sender is cut off or ignored."""


@functools.lru_cache(maxsize=65536)
def _addr(text: str) -> str:
    """The canonical text of an IPv6 address (remembered: the same peers come again and again)."""
    try:
        return str(ipaddress.IPv6Address(text))
    except ValueError:
        raise BadMessage(f"{text[:50]!r} is not an IPv6 address") from None


def _int(text: str, lo: int, hi: int) -> int:
    try:
        v = int(text)
    except ValueError:
        raise BadMessage(f"{text[:20]!r} is not a number") from None
    if not lo <= v <= hi:
        raise BadMessage(f"{v} is not {lo}-{hi}")
    return v


@functools.lru_cache(maxsize=1024)
def _dev(text: str) -> str:
    if not 0 < len(text) <= 64 or not all(c.isalnum() or c in "_-.:" for c in text):
        raise BadMessage(f"{text[:70]!r} is not a device name")
    return text


def paths_text(values) -> str:
    return ",".join(str(v) for v in sorted(values)) or "-"


def parse_paths(text: str) -> frozenset[int]:
    if text == "-":
        return frozenset()
    return frozenset(_int(v, 1, 0xFFFF) for v in text.split(",")[:64])


# ---- library -> agent ------------------------------------------------------------------------
@dataclass(frozen=True)
class Hello:
    version: int
    pid: int
    kept: tuple[int, ...]          # QPs kept while the library had no agent, by reason


@dataclass(frozen=True)
class Init:
    dev: str
    port: int
    qpn: int


@dataclass(frozen=True)
class Question:                    # RTR (a QP) or AH (an address handle)
    kind: str
    seq: int
    dev: str
    port: int
    qpn: int                       # 0 for an address handle
    sgid_index: int
    sgid: str
    dgid: str
    dest_qpn: int                  # 0 for an address handle
    deadline_ns: int               # CLOCK_MONOTONIC
    timeout_ns: int                # how long the asker waits in all
    asked_ns: int = 0              # when it was asked (the deadline less the timeout, as sent)


@dataclass(frozen=True)
class Used:
    dev: str
    port: int
    qpn: int                       # an address handle: 0, with seq and handle
    path: int
    keep: int
    dgid: str = ""                 # a QP: its peer, as the application gave it
    dest_qpn: int = 0
    seq: int = 0
    handle: int = 0


@dataclass(frozen=True)
class Gone:
    dev: str                       # a QP number is its device's (the port it is on follows from it)
    qpn: int
    handle: int = 0


def parse_local(data: bytes):
    """One message from a library: Hello, Init, Question, Used or Gone (BadMessage otherwise)."""
    try:
        f = data.decode("ascii").split(" ")
    except UnicodeDecodeError:
        raise BadMessage("not ASCII") from None
    kind, n = f[0], len(f)
    u64, i32 = (1 << 64) - 1, (1 << 31) - 1
    if kind == "HELLO" and n == 4:
        kept = tuple(_int(x, 0, u64) for x in f[3].split(",")[:64])
        return Hello(_int(f[1], 0, i32), _int(f[2], 0, i32), kept)
    if kind == "INIT" and n == 4:
        return Init(_dev(f[1]), _int(f[2], 1, 255), _int(f[3], 0, QPN_MAX))
    if kind == "RTR" and n == 11:
        deadline, timeout = _int(f[9], 0, u64), _int(f[10], 1, 60_000_000_000)
        return Question("RTR", _int(f[1], 0, u64), _dev(f[2]), _int(f[3], 1, 255), _int(f[4], 0, QPN_MAX),
                        _int(f[5], 0, 0xFFFF), _addr(f[6]), _addr(f[7]), _int(f[8], 0, QPN_MAX),
                        deadline, timeout, max(0, deadline - timeout))
    if kind == "AH" and n == 9:
        deadline, timeout = _int(f[7], 0, u64), _int(f[8], 1, 60_000_000_000)
        return Question("AH", _int(f[1], 0, u64), _dev(f[2]), _int(f[3], 1, 255), 0, _int(f[4], 0, 0xFFFF),
                        _addr(f[5]), _addr(f[6]), 0, deadline, timeout, max(0, deadline - timeout))
    if kind == "USED" and n == 8:
        return Used(_dev(f[1]), _int(f[2], 1, 255), _int(f[3], 0, QPN_MAX), _int(f[4], 0, 0xFFFF),
                    _int(f[5], 0, len(KEEP) - 1), _addr(f[6]), _int(f[7], 0, QPN_MAX))
    if kind == "AHUSED" and n == 5:
        return Used("", 0, 0, _int(f[3], 0, 0xFFFF), _int(f[4], 0, len(KEEP) - 1), seq=_int(f[1], 0, u64),
                    handle=_int(f[2], 0, u64))
    if kind == "GONE" and n == 3:
        return Gone(_dev(f[1]), _int(f[2], 0, QPN_MAX))
    if kind == "AHGONE" and n == 2:
        return Gone("", 0, handle=_int(f[1], 0, u64))
    raise BadMessage(f"unknown message {kind[:20]!r} with {n} fields")


def hello_reply(ports, table=None) -> bytes:
    return (f"HELLO {VERSION} {','.join(f'{d}:{p}' for d, p in ports) or '-'}" + (f" {table}" if table else "")).encode()


def path_reply(seq: int, path: int, gid_index: int, saddr: str, daddr: str) -> bytes:
    return f"PATH {seq} {path} {gid_index} {saddr} {daddr}".encode()


def wait_reply(seq: int, deadline_ns: int) -> bytes:
    return f"WAIT {seq} {deadline_ns}".encode()


def keep_reply(seq: int, keep: str) -> bytes:
    return f"KEEP {seq} {KEEP[keep]}".encode()


# ---- agent <-> agent ---------------------------------------------------------------------------
@dataclass(frozen=True)
class PeerMsg:
    kind: str                      # ASK, CHECK, PATHS, USED, CONFIRM, HAS, REPLY
    id: int = 0
    budget_us: int = 0
    a_base: str = ""
    a_qpn: int = 0
    b_base: str = ""
    b_qpn: int = 0
    paths: frozenset[int] = frozenset()
    verdict: str = ""              # REPLY: PATH, HELD, KEEP, YES, NO, ACK
    path: int = 0
    keep: int = 0

    def encode(self) -> bytes:
        k = self.kind
        if k == "ASK":
            s = (f"ASK {self.id} {self.budget_us} {self.a_base} {self.a_qpn} {self.b_base} {self.b_qpn} "
                 f"{paths_text(self.paths)}")
        elif k == "CHECK":
            s = (f"CHECK {self.id} {self.budget_us} {self.a_base} {self.a_qpn} {self.b_base} {self.b_qpn} "
                 f"{paths_text(self.paths)} {self.path}")
        elif k == "PATHS":
            s = f"PATHS {self.id} {self.budget_us} {self.a_base} {self.b_base}"
        elif k == "USED":
            s = f"USED {self.id} {self.a_base} {self.a_qpn} {self.b_base} {self.b_qpn} {self.path} {self.keep}"
        elif k == "CONFIRM":
            s = f"CONFIRM {self.id} {self.a_base} {self.a_qpn} {self.b_base} {self.b_qpn} {self.path}"
        elif k == "HAS":
            s = f"HAS {self.id} {self.budget_us} {self.a_base} {self.a_qpn} {self.b_base} {self.b_qpn} {self.path}"
        elif self.verdict in ("PATH", "HELD"):
            s = f"REPLY {self.id} {self.verdict} {self.path}"
        elif self.verdict == "ACK":
            s = f"REPLY {self.id} ACK"
        elif self.verdict in ("KEEP", "NO"):
            s = f"REPLY {self.id} {self.verdict} {self.keep}"
        else:
            s = f"REPLY {self.id} YES {self.path} {paths_text(self.paths)}"
        return s.encode()


def parse_peer(data: bytes) -> PeerMsg:
    try:
        f = data.decode("ascii").split(" ")
    except UnicodeDecodeError:
        raise BadMessage("not ASCII") from None
    k, n, u64 = f[0], len(f), (1 << 64) - 1
    if k == "ASK" and n == 8:
        return PeerMsg(k, _int(f[1], 0, u64), _int(f[2], 0, 60_000_000), _addr(f[3]), _int(f[4], 0, QPN_MAX),
                       _addr(f[5]), _int(f[6], 0, QPN_MAX), parse_paths(f[7]))
    if k == "CHECK" and n == 9:
        return PeerMsg(k, _int(f[1], 0, u64), _int(f[2], 0, 60_000_000), _addr(f[3]), _int(f[4], 0, QPN_MAX),
                       _addr(f[5]), _int(f[6], 0, QPN_MAX), parse_paths(f[7]), path=_int(f[8], 1, 0xFFFF))
    if k == "PATHS" and n == 5:
        return PeerMsg(k, _int(f[1], 0, u64), _int(f[2], 0, 60_000_000), _addr(f[3]), b_base=_addr(f[4]))
    if k == "USED" and n == 8:
        return PeerMsg(k, _int(f[1], 0, u64), a_base=_addr(f[2]), a_qpn=_int(f[3], 0, QPN_MAX), b_base=_addr(f[4]),
                       b_qpn=_int(f[5], 0, QPN_MAX), path=_int(f[6], 0, 0xFFFF), keep=_int(f[7], 0, len(KEEP) - 1))
    if k == "CONFIRM" and n == 7:
        return PeerMsg(k, _int(f[1], 0, u64), a_base=_addr(f[2]), a_qpn=_int(f[3], 0, QPN_MAX), b_base=_addr(f[4]),
                       b_qpn=_int(f[5], 0, QPN_MAX), path=_int(f[6], 1, 0xFFFF))
    if k == "HAS" and n == 8:
        return PeerMsg(k, _int(f[1], 0, u64), _int(f[2], 0, 60_000_000), _addr(f[3]), _int(f[4], 0, QPN_MAX),
                       _addr(f[5]), _int(f[6], 0, QPN_MAX), path=_int(f[7], 1, 0xFFFF))
    if k == "REPLY" and n == 4 and f[2] in ("PATH", "HELD"):
        return PeerMsg(k, _int(f[1], 0, u64), verdict=f[2], path=_int(f[3], 1, 0xFFFF))
    if k == "REPLY" and n == 3 and f[2] == "ACK":
        return PeerMsg(k, _int(f[1], 0, u64), verdict="ACK")
    if k == "REPLY" and n == 4 and f[2] in ("KEEP", "NO"):
        return PeerMsg(k, _int(f[1], 0, u64), verdict=f[2], keep=_int(f[3], 0, len(KEEP) - 1))
    if k == "REPLY" and n == 5 and f[2] == "YES":
        return PeerMsg(k, _int(f[1], 0, u64), verdict="YES", path=_int(f[3], 0, 0xFFFF), paths=parse_paths(f[4]))
    raise BadMessage(f"unknown message {k[:20]!r} with {n} fields")


def pack_peer(messages: list[bytes], limit: int) -> list[bytes]:
    """Encoded messages for one peer as datagram bodies of at most `limit` bytes, one a line, in order."""
    out: list[bytes] = []
    cur: list[bytes] = []
    size = 0
    for m in messages:
        if cur and size + 1 + len(m) > limit:
            out.append(b"\n".join(cur))
            cur, size = [], 0
        size += len(m) + (1 if cur else 0)
        cur.append(m)
    if cur:
        out.append(b"\n".join(cur))
    return out


def unpack_peer(body: bytes) -> list[bytes]:
    """The messages of one datagram's body."""
    return body.split(b"\n")
