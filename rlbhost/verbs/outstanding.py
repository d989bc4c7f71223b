"""The agent's messages to peer agents that wait for an answer (questions) or an acknowledgement
(USED, CONFIRM), and when each is sent again.

Each copy sent again gets an id of its own, so an answer says which copy it answers and gives an
exact round trip to that peer, even when copies were lost or slow (Karn's problem, solved as
QUIC's packet numbers do). A peer's interval between copies is its smoothed round trip plus four
deviations (RFC 6298's RTO), never below RESEND_NS: an idle peer on a lossy link is asked again
every 2 ms, and a peer slowed by a burst of QPs is not sent copies it would only queue behind the
first (what turned a burst into a storm of copies, and the burst into timeouts, before).

A steady message (HAS: asked while a library waits on it) is sent first after one interval (the
CONFIRM it stands in for has usually come by then), and again at the peer's interval, never
slowing down and at least STEADY_COPIES times in what is left of its time: it ends a wait that
cannot be made longer, so a slow round trip must not leave it one copy."""
from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass, field, replace

from . import protocol as P

RESEND_NS = 2_000_000          # the shortest interval between copies of an unanswered message
NOTIFY_FAST_NS = 40_000_000    # a USED or CONFIRM is sent again at the peer's interval this long
                               # (while the libraries at both ends may be waiting on it),
NOTIFY_SLOW_NS = 250_000_000   # ... then at doubling intervals up to this
STEADY_COPIES = 8              # a steady message's copies in the time it has, at least


@dataclass
class Pending:
    """A message to a peer agent waiting on its answer."""
    msg: P.PeerMsg                 # the copy sent last (its id is that copy's)
    peer: str                      # the peer agent's address
    deadline_ns: int               # the peer's answer is of no use after this
    on_reply: object               # callable(PeerMsg | None): None on timeout
    src: str | None = None         # sent from this address (the NIC's base)
    key: object = None             # the pair it is about (ASK, CHECK)
    first_id: int = 0              # the id of the first copy (what others know it by)
    sent_ns: int = 0               # the first send
    resend_ns: int = 0             # the next copy goes then
    every_ns: int = RESEND_NS      # the interval between copies
    copies: dict[int, int] = field(default_factory=dict)   # each copy's id -> when it was sent
    done: bool = False
    steady: bool = False           # first sent after an interval, then at the peer's (no slowing)


class PeerClock:
    """One peer's round trip: smoothed, and its deviation (RFC 6298)."""
    __slots__ = ("srtt", "rttvar")

    def __init__(self):
        self.srtt = 0
        self.rttvar = 0

    def sample(self, rtt_ns: int):
        if not self.srtt:
            self.srtt, self.rttvar = rtt_ns, rtt_ns // 2
        else:
            self.rttvar += (abs(self.srtt - rtt_ns) - self.rttvar) // 4
            self.srtt += (rtt_ns - self.srtt) // 8

    def interval(self) -> int:
        return max(RESEND_NS, min(self.srtt + 4 * self.rttvar, NOTIFY_SLOW_NS))


class Outstanding:
    """Pending messages by any of their copies' ids, and a heap of when each is next due."""

    def __init__(self):
        self.by_id: dict[int, Pending] = {}
        self.clocks: dict[str, PeerClock] = {}
        self._heap: list[tuple[int, int, Pending]] = []
        self._seq = itertools.count()
        self.count = 0

    def __len__(self) -> int:
        return self.count

    def __bool__(self) -> bool:
        return self.count > 0

    def clock(self, peer: str) -> PeerClock:
        c = self.clocks.get(peer)
        if c is None:
            c = self.clocks[peer] = PeerClock()
        return c

    def add(self, p: Pending, now: int) -> Pending:
        """p, waiting from now: sent by the caller now, or (steady) first by resend."""
        p.first_id, p.sent_ns = p.msg.id, now
        p.copies[p.msg.id] = now
        p.every_ns = self._steady(p, now) if p.steady else self.clock(p.peer).interval()
        p.resend_ns = now + p.every_ns
        self.by_id[p.msg.id] = p
        self.count += 1
        self._push(p)
        return p

    def get(self, mid: int) -> Pending | None:
        return self.by_id.get(mid)

    def pop(self, mid: int) -> Pending | None:
        """The message one of whose copies is `mid`, no longer waiting (None if none was)."""
        p = self.by_id.get(mid)
        if p is None:
            return None
        for cid in p.copies:
            self.by_id.pop(cid, None)
        p.done = True
        self.count -= 1
        return p

    def answered(self, mid: int, now: int) -> Pending | None:
        """As pop, with the answered copy's round trip taken into its peer's clock."""
        p = self.pop(mid)
        if p is not None:
            self.clock(p.peer).sample(now - p.copies[mid])
        return p

    def next_due(self) -> int | None:
        while self._heap and self._stale(self._heap[0]):
            heapq.heappop(self._heap)
        return self._heap[0][0] if self._heap else None

    def due(self, now: int) -> list[Pending]:
        """The messages whose deadline or next copy has come, in that order; the expired ones
        are no longer waiting (their on_reply is the caller's to call with None)."""
        out = []
        while self._heap and self._heap[0][0] <= now:
            entry = heapq.heappop(self._heap)
            if self._stale(entry):
                continue
            p = entry[2]
            if now >= p.deadline_ns:
                self.pop(p.first_id)
            out.append(p)
        return out

    def resend(self, p: Pending, now: int, **changes) -> P.PeerMsg:
        """The next copy of p (its message with a new id and `changes`), and when the one after
        it goes: at the peer's interval while the answer may still be awaited, then at doubling
        intervals."""
        copy = replace(p.msg, id=P.message_id(), **changes)
        p.msg = copy
        p.copies[copy.id] = now
        self.by_id[copy.id] = p
        if p.steady:
            p.every_ns = self._steady(p, now)
        elif now - p.sent_ns > NOTIFY_FAST_NS:
            p.every_ns = min(2 * p.every_ns, NOTIFY_SLOW_NS)
        else:
            p.every_ns = self.clock(p.peer).interval()
        p.resend_ns = now + p.every_ns
        self._push(p)
        return copy

    def _steady(self, p: Pending, now: int) -> int:
        return max(RESEND_NS, min(self.clock(p.peer).interval(), (p.deadline_ns - now) // STEADY_COPIES))

    @staticmethod
    def _due(p: Pending) -> int:
        return min(p.resend_ns, p.deadline_ns)

    def _push(self, p: Pending):
        heapq.heappush(self._heap, (self._due(p), next(self._seq), p))

    def _stale(self, entry) -> bool:
        t, _, p = entry
        return p.done or t != self._due(p)
