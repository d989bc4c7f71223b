"""The agent's side of the verbs path selector: answers the library in every RDMA process of this
host over a local socket, and agrees with the peer hosts' agents on each QP's path.

Why agents must agree. An RC QP has an address vector at each end; a receiver may drop packets
whose addresses are not the ones its QP was given (Soft-RoCE does: rxe_recv.c check_addr), so
both ends of a QP must be put on the same path, or both keep the application's addresses. Each
end asks at its own time (the order of the two RTRs is the application's), within a few
milliseconds, and a missing or slow agent must leave a QP that works.

How. Every QP pair has a rendezvous: the agent of the end with the lower base address. It alone
decides the pair's path, once, when the first of the two ends asks. A QP takes part only if its
process loads the library, which tells its agent when the QP moves to INIT, before the application
can hand the QP number to its peer.
- The rendezvous's end asks first: it chooses the path and proposes it to the other agent
  (CHECK), which takes it only if that QP takes part and can use the path, and says yes; then
  the rendezvous's library is told (this end goes first).
- The other end asks first: its agent asks the rendezvous (ASK), which decides; the asker's
  library is told (PATH: the asker goes first), unless the rendezvous's own library is being given
  the path already (HELD: the rendezvous goes first).
One end's library goes first; the other end holds the path back from its library (pending in the
table, a question parked) until the first end's agent says its library has put the QP on the path
(CONFIRM, sent once the library reports it: USED); while a library waits parked, its agent asks
the other end's (HAS) until that end's library has the path (or keeps), so the word arrives
however often the CONFIRM is lost; a HAS reaching the rendezvous while its own end is held back
too (each end waiting for the other: an answer lost or late) makes the rendezvous's end go
first. So an end never takes a path its peer's library may have given up on. Whatever cannot
be settled in time keeps the application's addresses at both ends: an end that keeps says so
(USED) and the other turns to keep too, or counts a disagreement if its library had the path
already.

Loss, slowness and bad neighbours. A library that finds its agent stalled sends each word once
and keeps its QPs, so with its socket full its words are lost: the agent counts what it reads of
each library since its socket was last empty (charged as the kernel charges it), and at half of
what the socket holds takes that process's QPs it never heard a question for (those registered
until the socket is read empty included) as kept (a peer
asking is answered keep), and a peer's question about a QP whose process still has words unread
after the drain as busy. Questions are
sent again until answered (every 2 ms, then less often), USED and CONFIRM until acknowledged
(ACK), and any of them taken twice changes nothing; a
library waiting on a pending pair is told to wait longer (WAIT, up to rlbv_wait_ns()), and
finds the pair pending in the table itself if its agent is too slow to say so. The agent reads a
library's backlog before a peer's CHECK or ASK about its QP (what the library said first counts
first); a question older than its asker's patience is answered keep, not worked on, and none is
worked on longer than the agent's cap (--verbs-max-timeout-ms, 2 s) whatever it asks; an agent
that finds questions waiting half their time sheds new pairs for a while (keep at both ends)
rather than answer one end too late.
Local users: the socket is root's and the verbs group's (0660), each user's connections, QPs and
questions in flight are capped, answers to a process that does not read are dropped, never waited
on. bench/verbs_bench.py measures the two ends' devices (--loss: with the agents' datagrams lost).

A server with several fabric NICs has one service for all of them: a question names its RDMA
device and port, whose netdev (sysfs gid_attrs/ndevs) is the NIC whose paths, weights and counts
decide it; a QP is (device, port, QP number) here and in the decision table, since every device
numbers its QPs from the same start; between agents a QP end is its NIC's base address and its
number, and each message leaves from the address of the NIC it is about (the peer checks that).

The decision is the local rule (rlbfabric/policy/localrule.py, what the TC program does): the
usable path, of those both hosts can use, with the fewest active QPs for its weight, ties from the
host's rotation; QPs placed here count in the same active counters as TC-seen QPs and hold their
path until the application destroys them (or its process ends). UD address handles need no
agreement (a UD receiver takes any of its GIDs): the host decides alone, from the peer's usable
paths (asked once, kept for PEER_PATHS_TTL_S).

This module is the agreement; beside it: clients.py the libraries' socket and what each user may
hold, peerlink.py the sealed UDP between agents and what is sent again, nicview.py each NIC's
paths and the choice of one."""
from __future__ import annotations

import collections
import dataclasses
import json
import logging
import os
import selectors
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from rlbcommon.constants import VERBS_PORT
from rlbcommon.health import Health
from rlbcommon.heap import Heap
from rlbcommon.paths import write_atomic
from rlbcommon.runtime import AgentRuntime
from rlbfabric import addrplan

from ..dataplane import C as HOST_C, HostDataplane, VerbsQp
from ..gids import GidTable
from ..probekeys import KeyFile
from . import protocol as P
from .advice import FabricView
from .answertimes import AnswerTimes
from .clients import LISTEN, Client, Clients, Local, proc_start
from .kernelqps import MISSING, KernelQps
from .nicview import NicState, NicViews, View, Why, addr_lt, with_field
from .outstanding import Pending
from .peerlink import UDP, PeerLink, mono_ns
from .roundclock import RoundClock, garbage
from .table import DecisionTable, NoFence

log = logging.getLogger(__name__)

MARGIN_NS = 1_000_000          # what an answer needs to get back to the library
MIN_WORK_NS = 300_000          # a question with less time left is answered keep at once
GO_FIRST_MIN_NS = 500_000_000  # a HAS with less of its asker's wait left breaks no mutual wait
PEER_PATHS_TTL_S = 5.0
KEPT_TTL_S = 120.0             # keeps answered for QPs this host does not know
REUSED_AFTER_S = 1.0           # ... forgotten sooner when a new QP of that number starts (an INIT
                               # this late cannot be the one the keep was answered for)
REAP_EVERY_S = 1.0
STATUS_EVERY_S = 1.0
MAX_QPS_PER_CLIENT = 65536
MAX_QPS_PER_UID = 131072       # (a server's 8 NICs x 16k QPs)
MAX_PENDING_PER_CLIENT = 256   # questions of one process waiting on peers at once
MAX_PENDING_PER_UID = 1024     # ... and of one user's processes
MAX_TIMEOUT_NS = 2_000_000_000 # a question is worked on this long at most, whatever its asker says
                               # (the default of the agent's --verbs-max-timeout-ms)
MAX_DRAIN = 1024               # a library's messages read to find a QP a peer asks about (bounded:
                               # a library's INIT is among its last few messages)
RECENT = 256                   # decisions kept with their reasons for `rlbhost why`
BEHIND_S = 0.05                # after a question waited half its time: new pairs keep this long
SLICE_NS = 4_000_000           # a round reads clients this long at most before the peers' messages
                               # are read and the round's messages sent (a CONFIRM or an answer
                               # waits on one slice, not on a burst's every question)
RELEASE_SLICE_NS = 2_000_000   # a round lets go of reaped QPs this long at most (each costs its map
                               # entries, about 0.25 ms: a job's 1000 at once held every answer 250 ms)
# the agent's nice value once its verbs service runs (Linux keeps one per thread; every thread
# of the agent, since they share the interpreter's lock): ahead of applications' busy-polling
# threads (NCCL's proxies, perftest), which on a full machine kept every answer past its RTR, and
# behind bird (rlbdeploy.units.BIRD_NICE); LLVM at start compiles at 0, before it is set
VERBS_NICE = -5
DECIDED, AH = HOST_C["RLBH_VF_DECIDED"], HOST_C["RLBH_VF_AH"]
Key = tuple[Local, str, int]   # a pair: (this end, the peer's base address, the peer's QP number)


def qp_text(local: Local) -> str:
    dev, port, qpn = local
    return f"QP 0x{qpn:x} of {dev}/{port}"


@dataclass
class LocalQp:
    """An RC/UC QP of a process with the library on this host."""
    key: Local
    pid: int
    start: int | None
    nic: str = ""                  # the fabric NIC its RDMA port is on ('' if none)
    uid: int = -1                  # whose (-1: adopted after a restart)
    asked: bool = False            # a peer was asked about it (it may hold a path for it)
    heard: bool = False            # its library asked this agent about it (a question read here)
    at: float = 0.0                # when it was registered (monotonic; 0: adopted after a restart)

    @property
    def qpn(self) -> int:
        return self.key[2]


@dataclass
class Decision:
    """A pair's path as this host knows it: path 0 is a keep, for reason keep."""
    path: int
    keep: str = ""
    here: bool = False             # this host is the pair's rendezvous
    local_told: bool = False
    peer_told: bool = False
    entry: VerbsQp | None = None   # what the data plane holds for it
    at: float = field(default_factory=time.monotonic)
    why: str | Why = ""
    # a path taken on the other end's question stays unconfirmed until the other end says its
    # library has it (CONFIRM): till then this end's library is not given it (it waits, parked)
    confirmed: bool = True
    confirm_sent: bool = False
    applied: bool = False          # this end's library reported the QP on the path (USED)
    peer_has: bool = False         # the other end's agent said its library has it (CONFIRM)
    nic: str = ""                  # the NIC this end is on (whose data plane holds the entry)
    pending_ns: int = 0            # when its unconfirmed path went into the table (monotonic):
                                   # a library that gave up before then never saw it
    owner: int | str | None = None  # a keep for a QP not known here: the kernel's word on who made
                                   # it then (a pid, MISSING, None: it cannot say)


@dataclass
class Parked:
    """A library's question held until the other end's agent says its library has the path."""
    c: Client
    q: P.Question
    deadline_ns: int               # the library waits this long (extended by WAIT)


class VerbsService:
    def __init__(self, dps: dict[str, HostDataplane], socket_path: Path, port: int = VERBS_PORT,
                 group: str | None = None, gids: GidTable | None = None, health: Health | None = None,
                 status_path: Path | None = None, advice: dict[str, FabricView] | None = None,
                 table_path: Path | None = None, keys: KeyFile | None = None, kernel: KernelQps | None = None,
                 max_timeout_ns: int = MAX_TIMEOUT_NS):
        """`dps`: {fabric NIC: its data plane}; `advice`: the coordinator's view from each NIC;
        `kernel`: the kernel's word on QPs (read from rdma netlink when not given);
        `max_timeout_ns`: the longest any question is worked on."""
        self.max_timeout_ns = max_timeout_ns
        self.nics = {ifname: NicState(ifname, dp, (advice or {}).get(ifname)) for ifname, dp in dps.items()}
        self.port = port
        self.instance = next(iter(dps.values())).instance
        self.table_path = table_path      # the decisions, for the libraries to read
        self.table: DecisionTable | None = None
        self.status_path = status_path
        self.gids = gids or GidTable(list(self.nics))
        self.views = NicViews(self.nics, self.gids)
        self.kernel = kernel or KernelQps.open()
        self.health = health or Health()
        self.lock = threading.Lock()         # the counters, read by metrics
        self.counters: dict[str, int] = {"questions_rtr": 0, "questions_ah": 0, "placed_rtr": 0,
                                         "placed_ah": 0, "disagreements": 0, "bad_messages": 0,
                                         "refused_clients": 0, "refused_questions": 0, "accept_failed": 0,
                                         "peer_questions": 0, "stale_questions": 0,
                                         "foreign_qps": 0, "unknown_qps": 0, "released_qps": 0, "behind": 0,
                                         "unauthenticated": 0, "resent": 0, "unacknowledged": 0,
                                         "has_asked": 0, "has_confirmed": 0, "withdrawn": 0,
                                         "messages_sent": 0, "datagrams_sent": 0, "key_file_bad": 0,
                                         "answered_late": 0, "kept_unheard": 0, "kept_busy": 0,
                                         "slow_rounds": 0, "message_errors": 0, "mutual_waits": 0}
        self.answer_times = AnswerTimes()    # how long libraries waited for their answers
        self.clock = RoundClock()            # what a long round spent its time on
        self.sel = selectors.DefaultSelector()
        self.clients = Clients(socket_path, group, self.sel, self.counters, self._local, self._dropped,
                               self._words_may_be_lost)
        # the fabric's keys: the peers' messages sealed with them
        self.link = PeerLink(port, keys or KeyFile(None), self.sel, self.counters, self._peer)
        self.local: dict[Local, LocalQp] = {}
        self.by_nic: dict[tuple[str, int], Local] = {}      # (NIC, QP number) -> its QP
        self.by_dev: dict[tuple[str, int], Local] = {}      # (device, QP number) -> its QP
        # what the reaper looks at, kept as QPs come and go so that a look costs what changed, not
        # a walk of every QP (8 devices' 8000 QPs took 7 ms a second of the thread that answers)
        self.dev_qpns: dict[str, set[int]] = collections.defaultdict(set)          # device -> its QPs here
        self.of_process: dict[tuple[int, int | None], set[Local]] = {}             # (pid, start) -> its QPs
        self.on_nic: collections.Counter = collections.Counter()                    # NIC -> its QPs
        self.unowned: collections.deque = collections.deque()   # (when, QP) of keeps for QPs not here
        self.releasing: collections.deque[tuple[LocalQp, bool]] = collections.deque()  # reaped (and whether
                                                         # its process lives on), let go a slice a round
        self.to_release: set[Local] = set()                                  # ... their QPs, queued once
        # by this host's QP: (the pair's key, decision)
        self.decisions: dict[Local, tuple[Key, Decision]] = {}
        self.checks: dict[Key, int] = {}                      # a pair's CHECK waiting -> its pending id
        self.proposals: dict[Key, tuple[int, VerbsQp]] = {}   # asked of the peer
        self.parked: dict[Key, list[Parked]] = {}             # waiting on a CONFIRM
        self.has_asks: dict[Key, int] = {}                    # a parked pair's HAS -> its pending id
        self.peer_paths: dict[str, tuple[float, frozenset[int]]] = {}
        self.ah_ids = 0
        # processes whose library may have lost words: (pid, start) -> when its socket was found
        # half full (its QPs registered before then and never asked about may have kept their
        # addresses without a word reaching here: _unheard)
        self.lost_words: dict[tuple[int, int | None], float] = {}
        self.kept: dict[str, int] = {k: 0 for k in P.KEEP if k != "none"}
        self.stop = threading.Event()
        self._wake_r, self._wake_w = os.pipe()
        self.behind_until = 0.0
        self._niced = 0                      # the thread _prioritise last ran on
        self.recent: collections.deque = collections.deque(maxlen=RECENT)
        self._next_reap = self._next_status = 0.0
        # a server's QPs (thousands of decisions, local QPs, table slots) and the agent's modules
        # out of the collector's sight: its full collections stalled this thread 30-45 ms at a
        # time while 4 devices' QPs went to RTR, past the libraries' 20 ms (rlbcommon/heap.py)
        self.heap = Heap()

    @property
    def dp(self) -> HostDataplane:
        """The one NIC's data plane (a host with one NIC)."""
        (nic,) = self.nics.values()
        return nic.dp

    @property
    def socket_path(self) -> Path:
        return self.clients.path

    # ---- sockets ------------------------------------------------------------------------
    def open(self):
        """The local socket (root's and the verbs group's) and the peers' UDP port."""
        self.clients.open()
        self.link.open()
        self.sel.register(self._wake_r, selectors.EVENT_READ, "wake")
        if self.table_path is not None:
            try:
                self.table = DecisionTable(self.table_path)
                self.table.clear()
            except NoFence as e:
                log.warning("verbs: no decision table for the libraries (%s): they ask this agent for every pair", e)
        self._adopt()
        log.info("verbs: answering on %s (%s), agreeing with peers on UDP %d; NICs %s; RDMA ports %s; "
                 "QP owners: %s", self.socket_path, self.clients.access, self.port, ", ".join(self.nics),
                 ", ".join(f"{d}/{p}" for d, p in self.gids.served()) or "none yet", self.kernel.describe())

    def close(self):
        self.clients.close()
        self.link.close()
        if self.table is not None:        # the file stays: jobs that mapped it keep it, the next agent reuses it
            self.table.close()
            self.table = None
        self.kernel.close()

    def _adopt(self):
        """QPs placed before a restart keep their entries (and the pairs decided here stay
        decided): rebuilt from each NIC's data plane, the QP on the NIC's RDMA port."""
        n = 0
        for nic in self.nics.values():
            dev, port = self._port_of(nic)
            for q in nic.dp.verbs_qps():
                if q.is_ah:
                    nic.dp.verbs_drop(q)      # its process's handle is unknown now: re-placed next time
                    continue
                local = (dev, port, q.local_qpn)
                self._index(LocalQp(local, q.pid, proc_start(q.pid), nic.ifname))
                self._record((local, q.peer_base, q.remote_qpn), Decision(
                    self._value_of(nic, q.path), here=q.decided_here, local_told=True, peer_told=True, entry=q,
                    nic=nic.ifname, applied=True, peer_has=True))
                n += 1
        if n:
            log.info("verbs: %d QPs placed before this agent started are kept", n)

    def _port_of(self, nic: NicState) -> tuple[str, int]:
        """The RDMA port on a NIC (a RoCE NIC has one); ('', 0) while it has none."""
        got = self.gids.ports_on(nic.ifname)
        return got[0] if got else ("", 0)

    def _nic_of_port(self, dev: str, port: int, index: int | None = None) -> NicState | None:
        nd = self.gids.netdev(dev, port, index)
        return self.nics.get(nd) if nd else None

    def _local_of(self, nic: NicState, qpn: int) -> Local:
        """A QP of this NIC named by a peer: the one registered, else as its RDMA port names it."""
        return self.by_nic.get((nic.ifname, qpn)) or (*self._port_of(nic), qpn)

    def _index(self, lq: LocalQp):
        old = self.local.get(lq.key)
        if old is not None:
            self._unindex(old)
        self.local[lq.key] = lq
        self.by_dev[(lq.key[0], lq.qpn)] = lq.key
        self.dev_qpns[lq.key[0]].add(lq.qpn)
        self.of_process.setdefault((lq.pid, lq.start), set()).add(lq.key)
        self.on_nic[lq.nic] += 1
        if lq.nic:
            other = self.by_nic.get((lq.nic, lq.qpn))
            if other is not None and other != lq.key:
                log.warning("verbs: %s and %s share NIC %s: a peer cannot tell them apart (one RDMA port a NIC)",
                            qp_text(other), qp_text(lq.key), lq.nic)
            self.by_nic[(lq.nic, lq.qpn)] = lq.key

    def _unindex(self, lq: LocalQp):
        self.on_nic[lq.nic] -= 1
        mine = self.of_process.get((lq.pid, lq.start))
        if mine is not None:
            mine.discard(lq.key)
            if not mine:
                del self.of_process[(lq.pid, lq.start)]
                self.lost_words.pop((lq.pid, lq.start), None)

    def _decision(self, key: Key) -> Decision | None:
        got = self.decisions.get(key[0])
        return got[1] if got is not None and got[0] == key else None

    def _drop_entry(self, d: Decision):
        if d.entry is not None and d.nic in self.nics:
            self.nics[d.nic].dp.verbs_drop(d.entry)

    def _record(self, key: Key, d: Decision) -> Decision:
        """The pair's decision; one the same QP held for another pair (the QP was reset and
        connected again) is dropped. The last ones are kept with their reasons (`rlbhost why`)."""
        old = self.decisions.get(key[0])
        if old is not None and old[0] != key:
            self._drop_entry(old[1])
            if self.table is not None:
                self.table.remove(*old[0][0], old[0][2], old[0][1])
        self.decisions[key[0]] = (key, d)
        if key[0] not in self.local:
            self.unowned.append((d.at, key[0]))
        if not d.why:
            d.why = f"the application's addresses: {d.keep}" if not d.path else ""
        self.recent.append((time.time(), key, d))
        self._publish(key, d)
        return d

    def _publish(self, key: Key, d: Decision):
        """The decision into the table the libraries read (a path only with this end's GID for
        it: without, the library asks, and is answered from the decision)."""
        if self.table is None:
            return
        local, peer, remote = key
        dev, port, qpn = local
        lq = self.local.get(local)
        if lq is None:               # a QP that does not take part: nobody here reads it
            return
        if not d.path:
            self.table.put(dev, port, qpn, remote, peer, keep=P.KEEP.get(d.keep, P.KEEP["error"]))
            return
        nic = self.nics.get(d.nic or lq.nic)
        if nic is None:
            self.table.remove(dev, port, qpn, remote, peer)
            return
        if not d.confirmed:       # the library asks, and waits (longer, if this agent is slow) for the word
            self.table.put(dev, port, qpn, remote, peer, d.path, pending=True)
            d.pending_ns = d.pending_ns or mono_ns()
            return
        v = self.views.view(nic)
        ours = v.addr.get(d.path)
        idx = self.gids.index_of(dev, port, ours) if ours else None
        if idx is None:
            self.table.remove(dev, port, qpn, remote, peer)
        else:
            self.table.put(dev, port, qpn, remote, peer, d.path, idx, 0, ours, with_field(peer, v.field, d.path))

    @staticmethod
    def _value_of(nic: NicState, index: int) -> int:
        return next((p.value for p in nic.dp.paths() if p.index == index), 0)

    # ---- the loop -----------------------------------------------------------------------
    def start(self, runtime: AgentRuntime | None = None) -> AgentRuntime:
        """Its loops on the agent's runtime (one health, one stop, the supervisor's restarts):
        the verbs rounds back to back (each waits in select for a message or its next timer),
        and, where the kernel tracks RDMA, every REAP_EVERY_S a read of every device's QPs for
        _reap to let go of the QPs the kernel no longer has. A round that raises is logged with
        its traceback and the loop resumed after the supervisor's back-off (a bad round never
        ends the service, nor spins it)."""
        self.runtime = runtime or AgentRuntime(log, self.health)
        self.stop = self.runtime.stop
        self.runtime.every("verbs", 0, self._round, expected=())    # a failed round: the supervisor's back-off
        # the status file from a thread of its own: a write that waits on the disk (a journal
        # commit; /run on a disk, as on this project's CI machine) held every answer up to a second
        self.runtime.every("verbs-status", STATUS_EVERY_S, self._write_status)
        if self.kernel.available:
            self.runtime.every("verbs-kernel", REAP_EVERY_S, self.kernel.look)
        return self.runtime

    def shutdown(self):
        self.stop.set()
        os.write(self._wake_w, b"x")

    def _round(self):
        if self._niced != threading.get_ident():   # (no syscall, unlike the native id)
            self._prioritise()
        now = mono_ns()
        timeout = 0.5
        first = self.link.pending.next_due()
        due = [first] if first is not None else []
        due += [w.deadline_ns - MARGIN_NS for waiting in self.parked.values() for w in waiting]
        if due:
            timeout = max(0.0, min(timeout, (min(due) - now) / 1e9))
        if self.releasing:
            timeout = 0
        ready = self.sel.select(timeout)
        clock = self.clock
        clock.start(mono_ns() - now, int(timeout * 1e9))
        if len(ready) > 1:
            ready.sort(key=_udp_first)                     # the peers' answers first
        slice_end = mono_ns() + SLICE_NS
        for key, _ in ready:
            if key.data == LISTEN:
                self.clients.accept()
            elif key.data == UDP:
                self.link.read()
            elif key.data == "wake":
                os.read(self._wake_r, 64)
            elif key.data in self.clients:
                self.clients.read(key.data)
                if mono_ns() > slice_end:
                    self._between_slices()
                    slice_end = mono_ns() + SLICE_NS
        clock.mark("reading")
        self._timers(mono_ns())
        clock.mark("timers")
        self.link.flush()
        clock.mark("sending")
        self.clients.resume()
        clock.mark("resuming clients")
        t = time.monotonic()
        if t >= self._next_reap:
            self._next_reap = t + REAP_EVERY_S
            self._reap()
            clock.mark("reaping")
        if self.releasing:
            self._let_go(mono_ns() + RELEASE_SLICE_NS)
            clock.mark("letting go")
        if t >= self._next_status:
            self._next_status = t + STATUS_EVERY_S
            self.link.reread_keys()
            self.heap.settle()
            self.heap.collect_if_due(idle=not self.link.pending and not self.parked)
            clock.mark("keys and heap")
        if clock.end():
            self.counters["slow_rounds"] += 1

    def _prioritise(self):
        """Every thread of the agent at VERBS_NICE, from the verbs thread's first round (its
        programs are loaded by then: LLVM compiled at 0). Not the verbs thread alone: it runs
        only while it holds the interpreter's lock, and a thread at 0 holding that lock behind
        busy-polling applications holds its answers up (the likely cause of about 1 s a QP in the
        VM lab while another transfer polled, against 0.15 s without). Threads started later
        inherit it. Without CAP_SYS_NICE they stay as they are, and say so."""
        self._niced = threading.get_ident()
        try:
            for task in os.listdir("/proc/self/task"):
                try:
                    os.setpriority(os.PRIO_PROCESS, int(task), VERBS_NICE)
                except ProcessLookupError:
                    pass                        # a thread that ended meanwhile
        except OSError as e:
            log.warning("verbs: the agent's threads keep their nice value (%s): a busy machine delays answers", e)

    def _between_slices(self):
        """Within a long round (a burst of questions from many processes): what settles pairs
        already decided goes out and comes in now, not after every other process's questions."""
        self.link.flush()
        self.link.read()
        self._timers(mono_ns())
        self.link.flush()

    # ---- clients ------------------------------------------------------------------------
    def _dropped(self, c: Client):
        """A process gone from the socket: its address handles' entries go (its QPs stay until
        they are destroyed or it ends: _reap)."""
        for handle, entry in c.ahs.items():
            self._ah_drop(c.ah_nic.get(handle, ""), entry)
        for entry, nic in c.ah_pending.values():
            self._ah_drop(nic, entry)
        if (c.pid, c.start) not in self.of_process:
            self.lost_words.pop((c.pid, c.start), None)

    def _ah_drop(self, nic: str, entry: VerbsQp):
        if nic in self.nics:
            self.nics[nic].dp.verbs_drop(entry)

    def _local(self, c: Client, m):
        if isinstance(m, P.Hello):
            if m.version != P.VERSION:
                raise P.BadMessage(f"protocol version {m.version}, this agent speaks {P.VERSION}")
            c.greeted = True
            for i, n in enumerate(m.kept[1:len(P.KEEP)], start=1):
                self._count_kept(P.KEEP_NAME[i], n)
            self.clients.send(c, P.hello_reply(self.gids.served(), self.table_path if self.table else None))
            return
        if not c.greeted:
            raise P.BadMessage("no HELLO first")
        if isinstance(m, P.Init):
            self._register(c, m.dev, m.port, m.qpn)
        elif isinstance(m, P.Question):
            self._question(c, m)
        elif isinstance(m, P.Used):
            self._used(c, m)
        elif isinstance(m, P.Gone):
            self._gone(c, m)

    def _register(self, c: Client, dev: str, port: int, qpn: int) -> LocalQp | None:
        """The client's QP (None: another process owns it, or the kernel has no such QP; a process
        may speak only for its own QPs). Where the kernel tracks the device its word decides;
        elsewhere the first live claimant holds the number."""
        local = (dev, port, qpn)
        lq = self.local.get(local)
        if lq is not None and (lq.pid, lq.start) == (c.pid, c.start):
            return lq
        owner = self.kernel.owner(dev, qpn, c.pid)
        if owner == MISSING:
            self.counters["unknown_qps"] += 1
            log.warning("verbs: pid %d (uid %d) spoke for %s, which the kernel does not have: ignored",
                        c.pid, c.uid, qp_text(local))
            return None
        if owner is not None and owner != c.pid:
            self.counters["foreign_qps"] += 1
            log.warning("verbs: pid %d (uid %d) spoke for %s, which the kernel says pid %d made: ignored",
                        c.pid, c.uid, qp_text(local), owner)
            return None
        if lq is not None and owner == c.pid:
            self._forget_qp(local)        # the kernel's owner speaks: an earlier claim was not its
            lq = None
        if lq is not None:
            if lq.start is not None and proc_start(lq.pid) == lq.start:
                self.counters["foreign_qps"] += 1
                log.warning("verbs: pid %d (uid %d) spoke for %s, which pid %d holds: ignored",
                            c.pid, c.uid, qp_text(local), lq.pid)
                return None
            self._forget_qp(local)        # a QP number reused after its old process ended
            lq = None
        if lq is None:
            if len(c.qpns) >= MAX_QPS_PER_CLIENT:
                raise P.BadMessage(f"more than {MAX_QPS_PER_CLIENT} QPs")
            if self.clients.per_uid[c.uid]["qps"] >= MAX_QPS_PER_UID:
                self.counters["refused_questions"] += 1
                return None
            old = self.decisions.get(local)
            if old is not None and (time.monotonic() - old[1].at > REUSED_AFTER_S
                                    or old[1].owner not in (None, c.pid)):
                # a keep answered for an earlier QP of this number: one whose INIT was this late,
                # or one the kernel said another process made (a job without the library, whose
                # QP numbers the next job reuses at once: its pairs kept on the stale keep)
                self._forget_qp(local)
            nic = self._nic_of_port(dev, port)
            lq = LocalQp(local, c.pid, c.start, nic.ifname if nic else "", c.uid, at=time.monotonic())
            self._index(lq)
            c.qpns.add(local)
            self.clients.per_uid[c.uid]["qps"] += 1
        return lq

    # ---- the view of one NIC -----------------------------------------------------------------
    # ---- questions from the library --------------------------------------------------------
    def _question(self, c: Client, q: P.Question):
        self.counters["questions_rtr" if q.kind == "RTR" else "questions_ah"] += 1
        now = mono_ns()
        cap = self.max_timeout_ns
        if q.timeout_ns > cap or q.deadline_ns > now + min(q.timeout_ns, cap):
            # a deadline far off would keep this question (and its peers' resends) alive for as
            # long as the asker likes: worked on for its stated time, at most max_timeout_ns
            timeout = min(q.timeout_ns, cap)
            q = dataclasses.replace(q, deadline_ns=min(q.deadline_ns, now + timeout), timeout_ns=timeout)
        # too late to work on, unless the pair is decided already: a pair pending here (the other
        # end goes first) is one the library waits longer for, and a keep now could leave the
        # other end alone on the path
        late = q.deadline_ns - now < MIN_WORK_NS
        if late and q.kind != "RTR":
            return self._keep(c, q, "timeout")
        nic = self._nic_of_port(q.dev, q.port, q.sgid_index)
        if nic is None:                       # an RDMA port on a NIC the agent does not serve
            return self._keep(c, q, "othernic")
        v = self.views.view(nic)
        if v.ports_mode:
            return self._keep(c, q, "portsmode")
        entry = self.gids.table.get((q.dev, q.port), {}).get(q.sgid_index)
        if entry is None:
            self.gids.refresh()
            entry = self.gids.table.get((q.dev, q.port), {}).get(q.sgid_index)
        if entry is not None and not entry[1].lower().endswith("v2"):
            return self._keep(c, q, "notrocev2")
        ours = v.peer_base(q.sgid)
        peer = v.peer_base(q.dgid)
        if ours != v.base_addr or peer is None or peer == ours:
            return self._keep(c, q, "notfabric")
        if q.kind == "AH":
            if addrplan.field_value(q.dgid, v.field) != v.base_value:
                return self._keep(c, q, "notfabric")   # an answer to a path address: left as it is
            return self._ah(c, q, nic, v, peer)
        lq = self._register(c, q.dev, q.port, q.qpn)
        if lq is None:
            return self._keep(c, q, "error")
        lq.heard = True
        key = (lq.key, peer, q.dest_qpn)
        d = self._decision(key)
        here = addr_lt(ours, peer)
        if d is not None and d.path and not d.confirmed and d.pending_ns >= q.deadline_ns:
            # the path went into the table after this question's time was up: its library may
            # have looked, found nothing and kept (its USED may not be here yet), so the pair keeps
            return self._withdraw(key, d, "timeout", c, q)
        if d is not None:                          # (whatever this user's caps: it costs no peer a word)
            return self._answer(c, q, key, d, v)
        # A keep answered here is the pair's from now on (recorded, so that a peer's CHECK or ASK
        # read after it is answered keep, not given a path this end's library has given up on)
        if late:
            return self._decide_keep(key, here, "timeout", c, q, nic)
        if c.pending >= MAX_PENDING_PER_CLIENT or self.clients.per_uid[c.uid]["pending"] >= MAX_PENDING_PER_UID:
            self.counters["refused_questions"] += 1
            return self._decide_keep(key, here, "busy", c, q, nic)
        if self._behind(q, now):                   # both ends keep, rather than one too late
            self._decide_keep(key, here, "busy", c, q, nic)
            return self._tell_peer(key, 0, "busy", nic)
        usable = self.views.usable(nic, v, peer, q.dev, q.port)
        mine = self.views.paths(v, usable)
        if here and not mine:
            return self._decide_keep(key, True, "nopath", c, q, nic)
        if here:
            return self._propose(c, q, key, lq, nic, peer, mine)
        budget = q.deadline_ns - now - MARGIN_NS
        msg = P.PeerMsg("ASK", P.message_id(), budget // 1000, ours, q.qpn, peer, q.dest_qpn, mine)

        def asked(reply, c=c, q=q, key=key, lq=lq):
            known = self._decision(key)
            placed = reply is not None and reply.verdict in ("PATH", "HELD")
            if known is not None and known.path and placed and reply.path == known.path:
                # the rendezvous's CHECK came first and was taken: PATH says this end goes first
                known.confirmed = known.confirmed or reply.verdict == "PATH"
                self._publish(key, known)
                return self._answer(c, q, key, known)
            if known is not None:
                return self._answer(c, q, key, known)
            late = mono_ns() > q.deadline_ns - MIN_WORK_NS // 2
            v2 = self.views.view(nic)
            # (HELD: the rendezvous's library may be on the path already: this one waits for its word)
            keep = ("nopeer" if reply is None else "timeout" if late and reply.verdict != "HELD" else
                    "nopath" if placed and reply.path not in v2.index else None)
            if keep is not None:               # this end keeps: recorded, and the rendezvous told
                self._decide_keep(key, False, keep, c, q, nic)
                self._tell_peer(key, 0, keep, nic)
                return
            if not placed:
                d = self._record(key, Decision(0, P.KEEP_NAME.get(reply.keep, "peerkeeps"), nic=nic.ifname))
                return self._tell_local(c, q, v2, peer, d)
            # PATH: this end's library goes first (the rendezvous's waits for its CONFIRM); HELD:
            # the rendezvous's library goes first, this one waits for its CONFIRM
            d = self._record(key, Decision(reply.path, entry=self._put(nic, v2, key, lq, reply.path, 0),
                                           why=f"decided by {peer}'s agent, the pair's rendezvous",
                                           nic=nic.ifname, confirmed=reply.verdict == "PATH"))
            self._answer(c, q, key, d, v2)
        lq.asked = True
        self._ask_peer(msg, peer, q.deadline_ns - MARGIN_NS, self._counted(c, asked), ours, key)

    def _propose(self, c: Client, q: P.Question, key: Key, lq: LocalQp, nic: NicState, peer: str,
                 mine: frozenset[int], tried: frozenset[int] = frozenset()):
        """This end is the rendezvous and asks first: it chooses the path (counted at once, as a
        proposal) and asks the other end's agent to take it (CHECK). That agent writes the path
        into its decision table before it says yes, so the other end's library finds it there,
        whenever it asks, without waiting on anything; only then is this end's library told."""
        v = self.views.view(nic)
        known = self.peer_paths.get(peer)
        theirs = known[1] if known and time.monotonic() - known[0] < PEER_PATHS_TTL_S else mine
        with nic.dp.verbs_lock:
            usable = self.views.usable(nic, v, peer, q.dev, q.port)
            path = self.views.choose(nic, v, peer, usable[0], usable[1], (mine & theirs) - tried) if usable else None
            entry = self._put(nic, v, key, lq, path, DECIDED) if path else None
        if path is None:
            return self._decide_keep(key, True, "nopath", c, q, nic)
        why = self.views.why.said("decided here")
        self.proposals[key] = (path, entry)
        budget = q.deadline_ns - mono_ns() - MARGIN_NS
        msg = P.PeerMsg("CHECK", P.message_id(), budget // 1000, v.base_addr, q.qpn, peer, q.dest_qpn, mine,
                        path=path)

        def checked(reply):
            self.proposals.pop(key, None)
            known = self._decision(key)
            if known is not None:              # the peer's own ASK came meanwhile and decided
                if entry is not None and (known.entry is None or known.entry.path != entry.path):
                    nic.dp.verbs_drop(entry)
                return self._answer(c, q, key, known)
            if reply is not None and reply.verdict == "YES" and reply.path == path:
                self.peer_paths[peer] = (time.monotonic(), reply.paths)
                d = self._record(key, Decision(path, here=True, entry=entry, peer_told=True, why=why,
                                               nic=nic.ifname))
                return self._tell_local(c, q, self.views.view(nic), peer, d)
            nic.dp.verbs_drop(entry)
            if reply is not None and reply.verdict == "YES":      # the other end cannot use it
                self.peer_paths[peer] = (time.monotonic(), reply.paths)
                if q.deadline_ns - mono_ns() > 2 * MARGIN_NS and (mine & reply.paths) - tried - {path}:
                    return self._propose(c, q, key, lq, nic, peer, mine & reply.paths, tried | {path})
                return self._decide_keep(key, True, "nopath", c, q, nic)
            keep = ("nopeer" if reply is None else P.KEEP_NAME.get(reply.keep, "peerkeeps") or "peerkeeps")
            self._decide_keep(key, True, keep, c, q, nic)
            if reply is None:                   # the other end may have taken it: it turns to keep
                self._tell_peer(key, 0, keep, nic)
        lq.asked = True
        self._ask_peer(msg, peer, q.deadline_ns - MARGIN_NS, self._counted(c, checked), v.base_addr, key)

    def _words_may_be_lost(self, c: Client):
        """c's socket held half of what it can unread (Clients.on_full): its library's sends may
        have failed (it waits a few ms for room, then counts this agent stalled, sends each word
        once and keeps its QPs), so what it said of its later QPs may never reach here. Those it
        registered before now and never asks about keep their addresses when their peers ask
        (_unheard), rather than go on a path their own end may never take. Told again when that
        backlog has been read to its end: the QPs whose INITs were behind the half mark are
        covered too (a job whose INITs were still unread when its agent stopped left 1024 pairs
        of 3000 apart: the lost-words test's inits-unread case)."""
        proc = (c.pid, c.start)
        if proc not in self.lost_words:
            log.warning("verbs: pid %d's socket held half of its %d bytes unread: what its library said after may be "
                        "lost, so its QPs it has not asked about keep their addresses if their peers ask first",
                        c.pid, self.clients.room.sndbuf)
        self.lost_words[proc] = time.monotonic()

    def _unheard(self, lq: LocalQp | None) -> bool:
        """A QP its library has said nothing of but INIT, registered before its process's socket
        was found half full: it may have kept its addresses with its words lost."""
        if lq is None or lq.heard:
            return False
        since = self.lost_words.get((lq.pid, lq.start))
        if since is None or since < lq.at:
            return False
        self.counters["kept_unheard"] += 1
        return True

    def _behind(self, q: P.Question | None = None, now: int = 0) -> bool:
        """Is this agent behind its questions? A question that waited here half its asker's time
        says so, for BEHIND_S: until then new pairs are not started (a path decided now might reach
        one end after it gave up), which both ends learn as a keep."""
        if q is not None and now - (q.deadline_ns - q.timeout_ns) > q.timeout_ns // 2:
            if not self._behind():
                log.warning("verbs: questions wait here half their time: new QPs keep the application's "
                            "addresses for %.0f ms", BEHIND_S * 1000)
            self.behind_until = time.monotonic() + BEHIND_S
            self.counters["behind"] += 1
        return time.monotonic() < self.behind_until

    def _counted(self, c: Client, on_reply):
        """on_reply, with the client's (and its user's) count of questions waiting on peers kept."""
        c.pending += 1
        held = self.clients.per_uid[c.uid]
        held["pending"] += 1

        def done(reply):
            c.pending -= 1
            held["pending"] -= 1
            on_reply(reply)
        return done

    def _keep(self, c: Client, q: P.Question, keep: str, until_ns: int = 0):
        self._reply(c, q, P.keep_reply(q.seq, keep), until_ns)

    def _reply(self, c: Client, q: P.Question, data: bytes, until_ns: int = 0):
        """A question's final answer (a path or a keep), and how long its library waited for it,
        if it still waits (until its deadline, or until_ns: a wait extended by WAIT)."""
        self.clients.send(c, data)
        now = mono_ns()
        if now <= max(until_ns, q.deadline_ns):
            self.answer_times.add("rtr" if q.kind == "RTR" else "ah", now - q.asked_ns)
        else:
            self.counters["answered_late"] += 1

    def _decide_keep(self, key: Key, here: bool, keep: str, c: Client | None = None, q: P.Question | None = None,
                     nic: NicState | None = None):
        d = self._record(key, Decision(0, keep, here=here, nic=nic.ifname if nic else ""))
        if key[0] not in self.local:          # a QP not known here: who made it, as the kernel says
            d.owner = self.kernel.owner(key[0][0], key[0][2])
        if c is not None:
            self._tell_local(c, q, None, key[1], d)
        return d

    def _tell_local(self, c: Client, q: P.Question, v: View | None, peer: str, d: Decision, until_ns: int = 0):
        """Answer the library with a decision; a path whose GID is missing here is a keep.
        until_ns: the library waits this long (a parked question's wait, extended by WAIT)."""
        d.local_told = True
        if not d.path:
            return self._keep(c, q, d.keep or "nopath", until_ns)
        nic = self.nics.get(d.nic)
        if nic is None:
            return self._keep(c, q, "othernic", until_ns)
        v = v or self.views.view(nic)
        ours = v.addr.get(d.path)
        idx = self.gids.index_of(q.dev, q.port, ours) if ours else None
        if idx is None:
            return self._keep(c, q, "nogid", until_ns)
        self._reply(c, q, P.path_reply(q.seq, d.path, idx, ours, with_field(peer, v.field, d.path)), until_ns)

    def _answer(self, c: Client, q: P.Question, key: Key, d: Decision, v: View | None = None):
        """Answer the library with the pair's decision, or, while the other end's library has not
        confirmed a path this end must not go first on, hold the question (parked) until it does."""
        if d.path and not d.confirmed:
            # the other end's library goes first, and may have the path already: this library
            # waits longer for its word (a bounded WAIT) rather than give up and leave them apart
            latest = q.deadline_ns - q.timeout_ns + P.wait_ns(q.timeout_ns)
            if latest > q.deadline_ns:
                self.clients.send(c, P.wait_reply(q.seq, latest))
            self.parked.setdefault(key, []).append(Parked(c, q, max(latest, q.deadline_ns)))
            return self._ask_has(key, d, max(latest, q.deadline_ns) - MARGIN_NS)
        self._tell_local(c, q, v, key[1], d)

    def _ask_has(self, key: Key, d: Decision, deadline_ns: int):
        """A library waits on the other end's word (CONFIRM): ask that end's agent whether its
        library has the path (HAS), steadily, until it says so or keeps, or the wait ends. Its
        first copy goes after one interval: the CONFIRM has usually come by then."""
        nic = self.nics.get(d.nic)
        if key in self.has_asks or nic is None or not self.link.up or deadline_ns <= mono_ns():
            return
        local, peer, remote = key
        base = self.views.view(nic).base_addr
        msg = P.PeerMsg("HAS", P.message_id(), (deadline_ns - mono_ns()) // 1000, base, local[2], peer, remote,
                        path=d.path)

        def answered(reply, key=key):
            self.has_asks.pop(key, None)
            known = self._decision(key)
            if reply is None or known is None or not known.path or known.confirmed:
                return                         # (no word in time: the parked timers keep)
            if reply.verdict == "YES" and reply.path == known.path:
                self.counters["has_confirmed"] += 1
                self._peer_has(key, known.path)
            elif reply.verdict == "KEEP":
                self._peer_kept(key, P.KEEP_NAME.get(reply.keep, "error"))
        self.counters["has_asked"] += 1
        p = self.link.ask(msg, peer, deadline_ns, answered, base, key, steady=True)
        if p is not None:
            self.has_asks[key] = p.first_id

    def _decide(self, key: Key, lq: LocalQp | None, nic: NicState, peer_paths: frozenset[int],
                confirmed: bool = True) -> Decision:
        """The rendezvous decides a pair's path on the other end's question (ASK): the path it
        proposed already if its own end asked first and the asker can use it, else the local rule;
        counted at once."""
        proposal = self.proposals.get(key)
        if proposal is not None and proposal[0] in peer_paths:
            return self._record(key, Decision(proposal[0], here=True, entry=proposal[1], confirmed=confirmed,
                                              why=self.views.why.said("decided here (proposed)"), nic=nic.ifname))
        if proposal is not None:
            nic.dp.verbs_drop(proposal[1])
        v = self.views.view(nic)
        local, peer, remote = key
        dev, port = (local[0], local[1]) if lq is not None and local[0] else (None, None)
        usable = self.views.usable(nic, v, peer, dev, port)
        path = None
        if usable is not None:
            with nic.dp.verbs_lock:
                path = self.views.choose(nic, v, peer, usable[0], usable[1], peer_paths)
                entry = self._put(nic, v, key, lq, path, DECIDED) if path else None
        if path is None:
            return self._decide_keep(key, True, "nopath", nic=nic)
        return self._record(key, Decision(path, here=True, entry=entry, confirmed=confirmed,
                                          why=self.views.why.said("decided here"), nic=nic.ifname))

    def _put(self, nic: NicState, v: View, key: Key, lq: LocalQp | None, path: int, flags: int) -> VerbsQp:
        local, peer, remote = key
        wid = self.views.weights(nic, peer)[0]
        q = VerbsQp(peer, with_field(peer, v.field, path), local[2], remote, v.index[path], wid,
                    lq.pid if lq else 0, flags)
        nic.dp.verbs_put(q)
        self.counters["placed_rtr"] += 1
        nic.placed["rtr"] += 1
        return q

    # ---- what the library did, and QPs that end ---------------------------------------------
    def _used(self, c: Client, m: P.Used):
        if m.handle or m.seq:
            return self._ah_used(c, m)
        local = (m.dev, m.port, m.qpn)
        if m.path:
            got = self.decisions.get(local)
            lq = self.local.get(local)
            if got is not None and lq is not None and lq.pid == c.pid:
                key, d = got
                if d.path != m.path:            # it read the table before the pair turned to keep
                    self._disagree(key, f"this end's library took path {m.path}, the pair is "
                                        f"{'kept' if not d.path else f'on path {d.path}'}")
                    return
                d.local_told = d.applied = True
                nic = self.nics.get(d.nic)
                if not d.peer_has and not d.confirm_sent and nic is not None:
                    # the QP is on the path now: the other end's library may have it too
                    d.confirm_sent = True
                    base = self.views.view(nic).base_addr
                    self.link.notify(P.PeerMsg("CONFIRM", a_base=base, a_qpn=key[0][2], b_base=key[1], b_qpn=key[2],
                                           path=d.path), key[1], base)
            return
        keep = P.KEEP_NAME.get(m.keep, "error")
        self._count_kept(keep)
        if keep in ("ipv4", "linklocal"):        # never a fabric QP: no peer to tell
            return
        lq = self._register(c, m.dev, m.port, m.qpn)
        if lq is None:
            return
        got = self.decisions.get(local)
        if got is None:
            # kept without a decision here (this agent was slow or away): whatever the peer asks
            # about this pair later is answered keep. The peer is told only if it was asked: one
            # never asked holds no path for the pair (a library that stopped asking for a while
            # costs the peers nothing)
            nic = self._nic_of_port(m.dev, m.port)
            if nic is None:
                return
            v = self.views.view(nic)
            peer = v.peer_base(m.dgid)
            if peer is not None and peer != v.base_addr:
                key = (local, peer, m.dest_qpn)
                self._decide_keep(key, addr_lt(v.base_addr, peer), keep, nic=nic)
                if lq.asked:
                    self._tell_peer(key, 0, keep, nic)
        elif got[1].path:
            key, d = got
            self._unplace(key, d, keep)
            self._tell_peer(key, 0, keep, self.nics.get(d.nic))  # the peer turns to keep too, or counts a disagreement

    def _withdraw(self, key: Key, d: Decision, keep: str, c: Client | None = None, q: P.Question | None = None):
        """An unconfirmed path this end's library may never have seen: the pair keeps here, the
        library is answered keep, and a peer already told of the path is told it keeps."""
        self.counters["withdrawn"] += 1
        self._unplace(key, d, keep)
        if c is not None:
            self._keep(c, q, keep)
        if d.peer_told:
            self._tell_peer(key, 0, keep, self.nics.get(d.nic))
        self._release(key, d)

    def _unplace(self, key: Key, d: Decision, keep: str):
        self._drop_entry(d)
        d.path, d.keep, d.entry = 0, keep, None
        self._publish(key, d)

    def _disagree(self, key: Key, why: str):
        self.counters["disagreements"] += 1
        log.warning("verbs: %s <-> %s QP 0x%x: %s: the two ends may not agree (a receiver that checks "
                    "addresses will drop this QP's packets)", qp_text(key[0]), key[1], key[2], why)

    def _gone(self, c: Client, m: P.Gone):
        if m.handle:
            entry = c.ahs.pop(m.handle, None)
            if entry is not None:
                self._ah_drop(c.ah_nic.pop(m.handle, ""), entry)
            return
        local = self.by_dev.get((m.dev, m.qpn))       # a QP number is its device's, whatever the port
        lq = self.local.get(local) if local else None
        if lq is not None and lq.pid == c.pid:
            self._forget_qp(local)
            c.qpns.discard(local)

    def _forget_qp(self, local: Local):
        lq = self.local.pop(local, None)
        if lq is not None:
            if lq.uid >= 0:
                self.clients.per_uid[lq.uid]["qps"] -= 1
            self._unindex(lq)
        if self.by_dev.get((local[0], local[2])) == local:
            del self.by_dev[(local[0], local[2])]
            self.dev_qpns[local[0]].discard(local[2])
        if lq is not None and self.by_nic.get((lq.nic, lq.qpn)) == local:
            del self.by_nic[(lq.nic, lq.qpn)]
        got = self.decisions.pop(local, None)
        if got is not None:
            self._drop_entry(got[1])
            if self.table is not None:
                self.table.remove(*local, got[0][2], got[0][1])

    def _reap(self):
        """QPs the kernel no longer has (destroyed, their GONE lost), QPs of processes that ended
        without destroying them: queued, and let go a slice a round (_let_go), so that a job
        killed with thousands of QPs does not hold up the answers of the jobs starting beside it;
        keeps answered long ago."""
        looked_at, present = self.kernel.seen or (0.0, {})
        for dev, has in present.items():
            for qpn in self.dev_qpns.get(dev, set()) - has:
                local = self.by_dev.get((dev, qpn))
                lq = self.local.get(local)
                if lq is None or lq.at >= looked_at or local in self.to_release:   # (made since the look)
                    continue
                self.counters["released_qps"] += 1
                log.info("verbs: %s of pid %d is gone from the kernel: released", qp_text(local), lq.pid)
                self._queue_release(lq, True)
        for (pid, start), mine in list(self.of_process.items()):
            if start is None or proc_start(pid) != start:
                for local in mine - self.to_release:
                    self._queue_release(self.local[local], False)
        old = time.monotonic() - KEPT_TTL_S
        while self.unowned and self.unowned[0][0] < old:
            _, local = self.unowned.popleft()
            got = self.decisions.get(local)
            if got is not None and got[1].at < old and local not in self.local:
                self._forget_qp(local)
        for peer in [p for p, (t, _) in self.peer_paths.items() if time.monotonic() - t > PEER_PATHS_TTL_S]:
            del self.peer_paths[peer]

    def _queue_release(self, lq: LocalQp, lives_on: bool):
        self.releasing.append((lq, lives_on))
        self.to_release.add(lq.key)

    def _let_go(self, until_ns: int):
        """Reaped QPs let go until until_ns: each only if it is still the QP that was reaped (its
        number may have been taken meanwhile by a new QP, which _register let the old one go for)."""
        while self.releasing and mono_ns() < until_ns:
            lq, lives_on = self.releasing.popleft()
            self.to_release.discard(lq.key)
            if self.local.get(lq.key) is lq:
                self._forget_qp(lq.key)
                if lives_on:                     # no longer its process's QP (an ended one has no client)
                    for c in self.clients.all():
                        c.qpns.discard(lq.key)

    # ---- address handles ---------------------------------------------------------------------
    def _ah(self, c: Client, q: P.Question, nic: NicState, v: View, peer: str):
        known = self.peer_paths.get(peer)

        def decide(paths, c=c, q=q):
            if paths is None:
                return self._keep(c, q, "nopeer")
            v2 = self.views.view(nic)
            usable = self.views.usable(nic, v2, peer, q.dev, q.port)
            if usable is None:
                return self._keep(c, q, "nopath")
            with nic.dp.verbs_lock:
                path = self.views.choose(nic, v2, peer, usable[0], usable[1], paths)
                if path is None:
                    return self._keep(c, q, "nopath")
                self.ah_ids = (self.ah_ids + 1) % P.AH_BIT
                entry = VerbsQp(peer, with_field(peer, v2.field, path), P.AH_BIT | self.ah_ids, 0,
                                v2.index[path], usable[0], c.pid, AH)
                nic.dp.verbs_put(entry)
            c.ah_pending[q.seq] = (entry, nic.ifname)
            self.counters["placed_ah"] += 1
            nic.placed["ah"] += 1
            self._tell_local(c, q, v2, peer, Decision(path, nic=nic.ifname))
        if known and time.monotonic() - known[0] < PEER_PATHS_TTL_S:
            return decide(known[1])
        msg = P.PeerMsg("PATHS", P.message_id(), (q.deadline_ns - mono_ns() - MARGIN_NS) // 1000,
                        v.base_addr, b_base=peer)

        def got(reply):
            if reply is not None and reply.verdict == "YES":
                self.peer_paths[peer] = (time.monotonic(), reply.paths)
                return decide(reply.paths)
            decide(None)
        self._ask_peer(msg, peer, q.deadline_ns - MARGIN_NS, got, v.base_addr)

    def _ah_used(self, c: Client, m: P.Used):
        entry, nic = c.ah_pending.pop(m.seq, (None, ""))
        if not m.path:
            self._count_kept(P.KEEP_NAME.get(m.keep, "error"))
            if entry is not None:
                self._ah_drop(nic, entry)
            return
        if entry is not None:
            c.ahs[m.handle] = entry
            c.ah_nic[m.handle] = nic

    # ---- peers ----------------------------------------------------------------------------
    def _ask_peer(self, msg: P.PeerMsg, peer: str, deadline_ns: int, on_reply, src: str | None = None,
                  key: Key | None = None):
        now = mono_ns()
        if deadline_ns <= now or not self.link.up:
            return on_reply(None)
        if msg.kind == "CHECK" and key is not None:
            self.checks[key] = msg.id

            def on_reply(reply, inner=on_reply, key=key, mid=msg.id):
                if self.checks.get(key) == mid:
                    del self.checks[key]
                inner(reply)
        self.link.ask(msg, peer, deadline_ns, on_reply, src, key)

    def _tell_peer(self, key: Key, path: int, keep: str, nic: NicState | None):
        if nic is None:
            return
        local, peer, remote = key
        v = self.views.view(nic)
        self.link.notify(P.PeerMsg("USED", a_base=v.base_addr, a_qpn=local[2], b_base=peer, b_qpn=remote, path=path,
                               keep=P.KEEP[keep]), peer, v.base_addr)

    def _timers(self, now: int):
        self._parked_timers(now)
        self.link.resend_due(now)

    def _peer(self, m: P.PeerMsg, src: str, arrived_ns: int):
        """A peer agent's message about a pair (its answers to this host's go to their questions)."""
        nic = self.views.of_base(m.b_base)
        if nic is None:
            self.counters["bad_messages"] += 1
            return                  # not for a NIC of this host
        v = self.views.view(nic)
        if v.peer_base(src) != m.a_base:
            self.counters["bad_messages"] += 1
            return                  # not from the host it names
        self.counters["peer_questions"] += 1
        me = v.base_addr
        key = (self._local_of(nic, m.b_qpn), m.a_base, m.a_qpn)          # from this host's side
        if m.kind in ("USED", "CONFIRM"):
            if m.kind == "USED":
                if not m.path:
                    self._peer_kept(key, P.KEEP_NAME.get(m.keep, "error"), nic)
            else:
                self._peer_has(key, m.path)
            return self.link.reply(m, src, me, verdict="ACK")   # again if heard again
        if m.kind == "HAS":
            return self._has(m, key, nic, src, me)
        fresh = m.budget_us * 1000 - (time.time_ns() - arrived_ns) > MIN_WORK_NS
        if m.kind == "PATHS":
            usable = self.views.usable(nic, v, m.a_base, None, None)
            paths = self.views.paths(v, usable)
            return self.link.reply(m, src, me, verdict="YES", paths=paths)
        if not fresh:
            self.counters["stale_questions"] += 1
        if m.kind == "CHECK":
            # what this end's library said before the CHECK came (its question, or that it gave
            # up) is read first: a path taken for a library that gave up would leave the two apart
            lq, drained = self._known_qp(nic, m.b_qpn, drain=True)
            key = (self._local_of(nic, m.b_qpn), m.a_base, m.a_qpn)     # its INIT may have come just now
            known = self._decision(key)
            # (not drained: its library's word may wait further back in its socket)
            busy = known is None and (self._behind() or not drained)
            unheard = known is None and fresh and lq is not None and not busy and self._unheard(lq)
            if known is not None and not known.path:
                return self.link.reply(m, src, me, verdict="NO", keep=P.KEEP[known.keep or "timeout"])
            if known is None and (not fresh or lq is None or busy or unheard):
                keep = "timeout" if not fresh or unheard else "peerkeeps" if lq is None else "busy"
                self._decide_keep(key, False, keep, nic=nic)
                self.counters["kept_busy"] += keep == "busy"
                return self.link.reply(m, src, me, verdict="NO", keep=P.KEEP[keep])
            # a pair decided already (a copy sent again, late or not) is answered as it stands:
            # a stale copy of a CHECK taken once must not turn it into a keep at one end only
            dev, port = (lq.key[0] or None, lq.key[1]) if lq is not None else (None, None)
            usable = self.views.usable(nic, v, m.a_base, dev, port)
            paths = self.views.paths(v, usable)
            if known is None and m.path in paths:
                # taken: recorded (and in the table for this end's library) before the yes, and
                # the library's backlog read once more after that: a question of it whose time ran
                # out before the path was in the table withdraws it (its library may have kept)
                known = self._record(key, Decision(m.path, entry=self._put(nic, v, key, lq, m.path, 0),
                                                   confirmed=False, nic=nic.ifname,
                                                   why=f"proposed by {m.a_base}'s agent, the pair's rendezvous"))
                if not self._known_qp(nic, m.b_qpn, drain=True)[1] and known.path:
                    self._withdraw(key, known, "busy")     # its library's word may wait further back
                known = self._decision(key)
                if known is not None and not known.path:
                    return self.link.reply(m, src, me, verdict="NO", keep=P.KEEP[known.keep or "timeout"])
            took = known.path if known is not None and known.path == m.path else 0
            return self.link.reply(m, src, me, verdict="YES", path=took, paths=paths)
        # ASK: this host is the pair's rendezvous (its library's word read first, as for CHECK)
        lq, drained = self._known_qp(nic, m.b_qpn, drain=True)
        key = (self._local_of(nic, m.b_qpn), m.a_base, m.a_qpn)
        d = self._decision(key)
        if d is None:
            waiting = self._waiting_check(key)
            if not fresh or (waiting is not None and waiting.deadline_ns - mono_ns() < MIN_WORK_NS):
                # the asker, or this end's own library waiting on its own question, will have
                # given up by the time a path could reach it: both keep
                d = self._decide_keep(key, True, "timeout", nic=nic)
            elif self._behind() or not drained:      # (not drained: its library's word may wait further back)
                d = self._decide_keep(key, True, "busy", nic=nic)
                self.counters["kept_busy"] += 1
            elif lq is None:
                d = self._decide_keep(key, True, "peerkeeps", nic=nic)
            elif self._unheard(lq):
                d = self._decide_keep(key, True, "timeout", nic=nic)
            else:
                # the asker's library goes first: this end's waits for its word (CONFIRM), whether
                # it asked already (its question parks) or asks later
                d = self._decide(key, lq, nic, m.paths, confirmed=False)
                self._complete_check(key)
                if d.path:        # in the table now: what the library said meanwhile (as for CHECK)
                    if not self._known_qp(nic, m.b_qpn, drain=True)[1] and self._decision(key) is d and d.path:
                        self._withdraw(key, d, "busy")
                    d = self._decision(key) or d
        d.peer_told = True
        # PATH: the asker goes first (this end waits for its CONFIRM, or has the path on the QP
        # already); HELD: this end's library is being given the path, the asker waits for our CONFIRM
        verdict = "PATH" if not d.confirmed or d.applied else "HELD"
        if d.path:
            self.link.reply(m, src, me, verdict=verdict, path=d.path)
        else:
            self.link.reply(m, src, me, verdict="KEEP", keep=P.KEEP[d.keep or "nopath"])

    def _has(self, m: P.PeerMsg, key: Key, nic: NicState, src: str, me: str):
        """The other end's library waits on this end's: answered once this end's library has the
        path (its USED read first, if it waits in the socket) or keeps; until then not at all
        (the asker asks again: an answer "not yet" would say nothing more)."""
        d = self._decision(key)
        if d is not None and d.path and not d.applied:
            self._known_qp(nic, m.b_qpn, drain=True)
            d = self._decision(key)
        if d is None:
            return
        if d.path and not d.confirmed and d.here and m.path == d.path and m.budget_us * 1000 > GO_FIRST_MIN_NS:
            # Both ends wait for the other's library to go first: the asker asks HAS only while
            # its library is parked, and this end holds its own back too (it answered the asker's
            # ASK "PATH", and that answer came after the asker had given up on it while the
            # asker's end held this end's CHECK). Each would wait out the library's longest wait
            # (rlbv_wait_ns, 10 s) and keep. The rendezvous goes first: the asker's library
            # still waits on this path, so it cannot have given up on it (a HAS with less of its
            # wait left than GO_FIRST_MIN_NS may have outlived it: both keep, as before).
            self.counters["mutual_waits"] += 1
            self._confirm(key, d)
        if d.path and d.applied:
            return self.link.reply(m, src, me, verdict="YES", path=d.path)
        if not d.path:
            return self.link.reply(m, src, me, verdict="KEEP", keep=P.KEEP.get(d.keep, P.KEEP["error"]))

    def _waiting_check(self, key: Key) -> Pending | None:
        return self.link.pending.get(self.checks.get(key, -1))

    def _complete_check(self, key: Key) -> bool:
        """This end asked the peer (CHECK) while the peer asked this end (ASK): the ASK decided;
        the waiting question is answered now. False if there was none."""
        p = self.link.pending.pop(self.checks.get(key, -1))
        if p is None:
            return False
        p.on_reply(P.PeerMsg("REPLY", p.first_id, verdict="YES", paths=frozenset()))
        return True

    def _peer_has(self, key: Key, path: int):
        """The other end's library has the path (CONFIRM, or a HAS answered): it is this end's too
        (the table, parked questions)."""
        d = self._decision(key)
        if d is None or d.path != path:
            return
        d.peer_has = True
        if not d.confirmed:
            self._confirm(key, d)

    def _confirm(self, key: Key, d: Decision):
        """This end's library may have the path now: into the table, and to the questions parked on it."""
        d.confirmed = True
        self._publish(key, d)
        self._release(key, d)

    def _release(self, key: Key, d: Decision):
        """Answer the questions parked on a decision that is settled now."""
        has = self.has_asks.pop(key, None)
        if has is not None:
            self.link.pending.pop(has)
        nic = self.nics.get(d.nic)
        v = self.views.view(nic) if nic is not None else None
        for w in self.parked.pop(key, []):
            if w.c in self.clients:
                self._tell_local(w.c, w.q, v, key[1], d, w.deadline_ns)

    def _parked_timers(self, now: int):
        """A parked question whose asker is about to give up: it keeps, and so does the pair."""
        for key in list(self.parked):
            due = [w for w in self.parked[key] if now >= w.deadline_ns - MARGIN_NS]
            if not due:
                continue
            d = self._decision(key)
            if d is not None and d.path:
                self._unplace(key, d, "timeout")
                self._tell_peer(key, 0, "timeout", self.nics.get(d.nic))
            self._release(key, d or Decision(0, "timeout"))

    def _known_qp(self, nic: NicState, qpn: int, drain: bool = False) -> tuple[LocalQp | None, bool]:
        """A QP of this NIC that takes part; the INIT may still wait in a library's socket (it was
        sent before the application could hand the QP number out), so read those first. drain: a
        known QP's process is read first too (what its library said before the peer's message).
        One process's backlog read here is bounded: a process that floods its socket costs the
        peers' answers little, and others' QPs nothing. Returns the QP and whether its process's
        socket was read to the end (False: its library's word on it may wait further back)."""
        local = self.by_nic.get((nic.ifname, qpn))
        owner = self.local.get(local) if local else None
        emptied: dict[int, bool] = {}              # pid -> its socket read to the end
        if owner is None:
            for c in self.clients.all():
                if c in self.clients:
                    emptied[c.pid] = self.clients.read(c, MAX_DRAIN) and emptied.get(c.pid, True)
        elif drain:
            for c in self.clients.all():
                if c.pid == owner.pid and c in self.clients:
                    emptied[c.pid] = self.clients.read(c, MAX_DRAIN) and emptied.get(c.pid, True)
        local = self.by_nic.get((nic.ifname, qpn))
        lq = self.local.get(local) if local else None
        return lq, lq is None or emptied.get(lq.pid, True)

    def _peer_kept(self, key: Key, keep: str, nic: NicState | None = None):
        """The other end kept its addresses (USED, or a HAS answered): so does this one, or, if its
        library was told a path already, the pair may disagree (counted, logged)."""
        d = self._decision(key)
        if d is None:
            if nic is not None:
                self._decide_keep(key, addr_lt(self.views.view(nic).base_addr, key[1]), keep, nic=nic)
        elif d.path:
            if d.local_told:
                self._disagree(key, f"the peer kept its addresses ({keep}) after this end was told path {d.path}")
            self._unplace(key, d, keep)
            self._release(key, d)

    # ---- reporting ------------------------------------------------------------------------------
    def _count_kept(self, keep: str, n: int = 1):
        if keep in self.kept:
            self.kept[keep] += n

    def snapshot(self) -> dict:
        """For the status file and the metrics (another thread): copies taken in one step each."""
        with self.lock:
            on_nic = dict(self.on_nic)
            return {"socket": str(self.socket_path), "clients": len(self.clients),
                    "qps": len(self.local), "pairs": len(self.decisions), "pending": len(self.link.pending),
                    "ports": [f"{d}/{p}" for d, p in self.gids.served()],
                    "qp_owners": self.kernel.describe(),
                    "nics": {n.ifname: {"label": n.dp.label,
                                        "ports": [f"{d}/{p}" for d, p in self.gids.ports_on(n.ifname)],
                                        "qps": on_nic.get(n.ifname, 0),
                                        "placed": dict(n.placed)} for n in self.nics.values()},
                    "counters": dict(self.counters), "kept": dict(self.kept),
                    "answer_times": self.answer_times.snapshot(), "garbage": garbage(),
                    "decisions": [{"at": round(t, 3), "dev": k[0][0], "port": k[0][1], "qp": k[0][2], "nic": d.nic,
                                   "peer": k[1], "peer_qp": k[2], "path": d.path, "keep": d.keep, "why": str(d.why)}
                                  for t, k, d in list(self.recent)]}

    def _write_status(self):
        """The status file, for `rlbhost verbs status` (written by its own thread: snapshot()
        takes its copies under the interpreter's lock; the write may wait on the disk)."""
        if self.status_path is not None:
            try:
                write_atomic(self.status_path, json.dumps(self.snapshot()))
            except OSError:
                pass



def _udp_first(ready) -> bool:
    return ready[0].data != UDP
