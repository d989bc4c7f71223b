"""Health probes between GPUs over every plane (draft-fare-scale-up §3: "data-plane health check
mechanisms running directly between GPUs, spanning each network plane").

Why a UDP probe and not multihop BFD: a probe must cross one chosen plane, both ways, and bird's
multihop BFD follows the kernel's route (one plane, whichever it picks) and cannot be pinned; the
probe is built here and sent out of a port of the plane under test with that link's MACs (the way
the data plane sends QPs), and the result feeds the same agent that sets the weights. The peer's
kernel answers it (rlb_host_echo on the port's TC ingress, like BFD's echo) straight back over
the same plane: an answer says the plane and the peer's port work, and no answer waits for the
peer's agent to be scheduled. Cost: one small frame per peer per plane per interval, each way,
and no user-space work at the peer.

Each GPU sends a probe to every peer on every plane it has a live port in every `interval`. A
(peer, plane) with no answer for `dead_after` while the peer still answers on another plane is
down: the agent stops using that plane towards that peer (its QPs move), until answers return."""
from __future__ import annotations

import ipaddress
import logging
import select
import socket
import struct
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable

from rlbcommon import packets as P
from rlbcommon.cheader import constants
from rlbcommon.siphash import siphash24

log = logging.getLogger(__name__)

UDP_NO_CHECK6_RX = 102    # linux/udp.h: accept IPv6 UDP with a zero checksum (RFC 6936)
SO_RCVBUFFORCE, SO_RXQ_OVFL = 33, 40
# a burst of answers (forged ones included) waits here while the thread lacks the CPU: the
# default 208 KiB held ~150 on a busy host, and what overflowed could be the genuine answers
RX_BUFFER = 4 << 20
_C = constants("rlb_host.h")                  # the echo reads the same head (struct rlbh_probe)
PROBE_PORT = _C["RLBH_PROBE_PORT"]
MAGIC = struct.pack("!I", _C["RLBH_PROBE_MAGIC"])
PROBE, REPLY = _C["RLBH_PROBE_ASK"], _C["RLBH_PROBE_ANSWER"]
# magic, kind, plane, sender GPU number, sequence, sender's send time (ns), the answer's tag
FMT = "!4sBBHIQ8s"
SIZE = struct.calcsize(FMT)
NO_TAG = bytes(8)
# Defaults: a probe per peer per plane every 20 ms, a plane silent for 3 of them is down (BFD's
# usual detect multiplier). Detection then takes 40-80 ms after a silent failure (the last
# answer came up to one interval before it), leaving room within FARE scale-up's 150 ms for a
# loaded host's late rounds and the weights' update; the verdict's other conditions, not a
# longer wait, keep a stalled peer or host from looking like a silent plane.
INTERVAL_MS, DEAD_MS = 20, 60
# A plane whose live ports change under this GPU (a sub-cable lost or back) is being re-converged
# by its switch, which moves that port's traffic, the probes' answers included, only once it has
# seen the change itself: a software switch's agent can take tens of milliseconds under load,
# and a verdict taken meanwhile emptied a plane that still had a working sub-port (16 QPs moved
# off and back instead of 8). Silent verdicts on such a plane wait this long after the change;
# a plane with no live port left is out of use at once all the same.
SETTLE_S = 0.3


@dataclass
class PlaneHealth:
    """What a GPU knows of one (peer, plane)."""
    sent: int = 0
    answered: int = 0
    last_answer: float = 0.0           # monotonic seconds
    rtt_s: float = 0.0                 # last round trip
    unanswered: int = 0                # probes sent since the last answer
    last_seq: int = 0                  # the round of the newest probe answered
    first_answer: float = 0.0          # monotonic seconds of the first answer (0: none yet)
    answers: deque = field(default_factory=lambda: deque(maxlen=16))  # [(round, monotonic arrival)]
    up: bool = True
    window: deque = field(default_factory=lambda: deque(maxlen=50))   # [sent seq, answered?]


class Prober:
    """ports() -> {plane number: [(ifname, switch MAC, own MAC)] live}; peers: {GPU number:
    loopback}; on_change(peer number, plane, up) is called from the probe thread."""

    def __init__(self, me: int, loopback: str, peers: dict[int, str], port: int,
                 ports: Callable[[], dict[int, list[tuple[str, str, str]]]],
                 on_change: Callable[[int, int, bool], None], interval: float = INTERVAL_MS / 1000,
                 dead_after: float = DEAD_MS / 1000, on_round: Callable[[], None] | None = None,
                 keys: Callable[[str], list[bytes] | None] | None = None, settle_s: float = SETTLE_S):
        self.me, self.loopback, self.peers, self.port = me, loopback, peers, port
        self.ports, self.on_change = ports, on_change
        self.on_round = on_round or (lambda: None)     # a round done (the agent's Health)
        # keys(peer's loopback): the keys its answers must be signed with (KeyFile.to_check: the
        # ones shared with that peer, else the fabric-wide ones); [] takes answers unsigned, as
        # from an echo without a key; None refuses every answer from it
        self.keys = keys or (lambda peer: [])
        self.rejected = {"tag": 0, "stale": 0, "unknown": 0, "overflow": 0}
        self.interval, self.dead_after, self.settle_s = interval, dead_after, settle_s
        self._live: dict[int, tuple[str, ...]] = {}       # plane -> its live ports last round
        self._settling: dict[int, float] = {}            # plane -> until when it re-converges
        self.startup_grace = max(1.0, 10 * dead_after)
        self.state: dict[tuple[int, int], PlaneHealth] = {}
        self.stop = threading.Event()
        self._raw: dict[str, socket.socket] = {}
        self._heads: dict[tuple, bytes] = {}
        self._seq = 0
        self._peer_of = {addr: n for n, addr in peers.items()}
        self._own_packed = ipaddress.IPv6Address(loopback).packed     # the tag's last 16 bytes

    # ---- frames ---------------------------------------------------------------------------
    def _send(self, ifname: str, dmac: str, smac: str, dst: str, plane: int, seq: int, t_ns: int) -> bool:
        """Whether the frame left (a port going down or gone: it did not)."""
        s = self._raw.get(ifname)
        if s is None:
            s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
            try:
                s.bind((ifname, 0))        # the port's ifindex now: a re-created port gets a new one
            except OSError:
                s.close()
                return False               # gone meanwhile
            self._raw[ifname] = s
        body = struct.pack(FMT, MAGIC, PROBE, plane, self.me, seq, t_ns, NO_TAG)
        head = self._heads.get((ifname, dmac, dst))
        if head is None:
            # zero UDP checksum (the receiver allows it, RFC 6936): the headers are built once
            # and every probe is one concatenation, not a checksum in Python
            frame = P.ipv6_frame(self.loopback, dst, 17,
                                 P.udp6(self.loopback, dst, self.port, self.port, body, zero_checksum=True),
                                 dmac=dmac, smac=smac)
            head = self._heads[(ifname, dmac, dst)] = frame[:-SIZE]
        try:
            s.send(head + body)
        except (BlockingIOError, InterruptedError):
            return False
        except OSError:
            # a port going down, or removed: the socket is bound to an ifindex that may never come
            # back (a port re-created under the same name has another), so bind afresh next time
            self._raw.pop(ifname, None)
            s.close()
            return False
        return True

    @staticmethod
    def _port_for(ports, plane: int, n: int):
        """The plane's n-th live port, round the list (the plane has one: its caller loops over them)."""
        live = ports[plane]
        return live[n % len(live)]

    # ---- the loop ---------------------------------------------------------------------------
    def run(self):
        rx = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
        rx.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        rx.setsockopt(socket.SOL_UDP, UDP_NO_CHECK6_RX, 1)
        try:
            rx.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, RX_BUFFER)
        except PermissionError:                 # without CAP_NET_ADMIN: as far as rmem_max allows
            rx.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RX_BUFFER)
        rx.setsockopt(socket.SOL_SOCKET, SO_RXQ_OVFL, 1)    # the kernel says what it dropped
        self._overflow_base = self.rejected["overflow"]    # a new socket counts from zero
        rx.bind((self.loopback, self.port))
        rx.setblocking(False)
        try:
            next_round = time.monotonic()
            while not self.stop.is_set():
                now = time.monotonic()
                if now >= next_round:
                    self._receive(rx)       # answers already here count before any verdict
                    now = time.monotonic()
                    self._round(now)
                    self.on_round()
                    next_round = now + self.interval
                ready, _, _ = select.select([rx], [], [], max(0.0, next_round - time.monotonic()))
                if ready:
                    self._receive(rx)
        finally:                    # a supervisor may run this again: nothing closed is kept
            rx.close()
            for s in self._raw.values():
                s.close()
            self._raw.clear()

    def _round(self, now: float):
        ports = self.ports()
        self._seq += 1
        t_ns = time.monotonic_ns()
        for plane in set(ports) | set(self._live):
            live = tuple(p[0] for p in ports.get(plane, ()))
            if self._live.get(plane, live) != live:
                self._settling[plane] = now + self.settle_s
            self._live[plane] = live
        for peer, addr in self.peers.items():
            for plane in ports:
                # the round's port for this peer first, then the plane's others: a probe that
                # could not leave (its port went down just now) is no evidence against the plane
                for k in range(len(ports[plane])):
                    ifname, dmac, smac = self._port_for(ports, plane, self._seq + peer + k)
                    if self._send(ifname, dmac, smac, addr, plane, self._seq, t_ns):
                        break
                else:
                    continue
                st = self.state.setdefault((peer, plane), PlaneHealth(last_answer=now))
                st.sent += 1
                st.unanswered += 1
                st.window.append([self._seq, False])
        # down: no answer for dead_after, AND as many probes sent since the last answer as fit
        # in it (a stall of this very loop is not a silent plane), AND the peer answering on
        # another plane meanwhile: a plane failing in its middle goes quiet alone, while a peer
        # too busy to answer (or a busy host) goes quiet on every plane at once. "Meanwhile" is
        # by round: another plane answered a later round than this plane's last, and that answer
        # is an interval old without this plane's for the same round. A peer back from a stall
        # answers its backlog plane after plane, a few microseconds apart: judged by arrival
        # alone, the first plane's answer made the others look silent (3 planes falsely down)
        need = max(2, round(self.dead_after / self.interval) - 1)
        for (peer, plane), st in list(self.state.items()):
            answering = now - st.last_answer <= self.dead_after
            if st.up:       # the others are asked only of a plane that has gone quiet (rare)
                up = plane in ports and (answering or st.unanswered < need
                                         or now < self._settling.get(plane, 0.0)
                                         or not self._answered_elsewhere(peer, st, now))
            else:   # back only on an answer of its own: others going quiet too (a loaded peer or
                # host) is no news of this plane, and flipped it up and down every few rounds
                up = plane in ports and answering
            if up != st.up:
                log.warning("probes to GPU %d over plane %d: %s", peer, plane,
                            "answered again" if up else f"no answer for {self.dead_after * 1000:.0f} ms")
                self.on_change(peer, plane, up)
                st.up = up      # only once applied: a verdict whose change failed is made again

    def _answered_elsewhere(self, peer: int, st: PlaneHealth, now: float) -> bool:
        """The peer answers now on another plane, and answered there a later round than st's
        last, an interval ago or more. A plane that has never answered is judged only once
        another has answered for a while: a starting peer's echo appears port by port."""
        settled = now - self.startup_grace
        return any(o is not st and pe == peer and now - o.last_answer <= self.dead_after / 2
                   and (st.answered or 0 < o.first_answer <= settled)
                   and any(seq > st.last_seq and now - t >= self.interval for seq, t in o.answers)
                   for (pe, _), o in self.state.items())

    def _receive(self, rx):
        """Answers to our probes (the peers' kernels send them; probes to us never get here,
        the echo on our ports answers them)."""
        while True:
            try:
                data, anc, _, (src, *_) = rx.recvmsg(256, socket.CMSG_SPACE(4))
            except BlockingIOError:
                return
            for level, kind, cdata in anc:
                if level == socket.SOL_SOCKET and kind == SO_RXQ_OVFL and len(cdata) >= 4:
                    total = int.from_bytes(cdata[:4], "little")      # this socket's drops so far
                    self.rejected["overflow"] = self._overflow_base + total
            if len(data) < SIZE:
                continue
            magic, kind, plane, sender, seq, t_ns, tag = struct.unpack(FMT, data[:SIZE])
            if magic != MAGIC or kind != REPLY or sender != self.me:
                continue
            peer_addr = src.split("%")[0]
            st = self.state.get((self._peer_of.get(peer_addr), plane))
            if st is None:
                self.rejected["unknown"] += 1
                continue
            if not self.verify(peer_addr, plane, seq, t_ns, tag):
                self.rejected["tag"] += 1
                continue
            if not self._expected(st, seq):
                self.rejected["stale"] += 1
                continue
            self._answered(st, seq, time.monotonic(), (time.monotonic_ns() - t_ns) / 1e9)

    def verify(self, peer: str, plane: int, seq: int, t_ns: int, tag: bytes) -> bool:
        """The answer's tag is what the peer's echo makes with one of the keys this host holds for
        it over this probe (its round, send time, plane, our number, the peer's and our loopbacks)."""
        keys = self.keys(peer)
        if keys is None:
            return False
        if not keys:
            return True
        msg = (struct.pack("!IQBHx", seq, t_ns, plane, self.me)
               + socket.inet_pton(socket.AF_INET6, peer) + self._own_packed)
        got = int.from_bytes(tag, "little")
        return any(siphash24(k, msg) == got for k in keys)

    @staticmethod
    def _expected(st: PlaneHealth, seq: int) -> bool:
        """A round we probed (in the window of recent ones) and not yet answered: a replayed or
        made-up sequence number never keeps a plane up."""
        for entry in reversed(st.window):
            if entry[0] == seq:
                return not entry[1]
        return False

    @staticmethod
    def _answered(st: PlaneHealth, seq: int, now: float, rtt_s: float):
        st.answered += 1
        st.unanswered = 0
        st.first_answer = st.first_answer or now
        st.last_answer = now
        st.last_seq = max(st.last_seq, seq)
        st.answers.append((seq, now))
        st.rtt_s = rtt_s
        for entry in reversed(st.window):      # usually the newest
            if entry[0] == seq:
                entry[1] = True
                break

    def snapshot(self) -> list[dict]:
        """Per (peer, plane): up, round trip, loss over the last probes (those older than
        dead_after, whose answers had time to come)."""
        out = []
        horizon = max(1, round(self.dead_after / self.interval))
        for (peer, plane), st in sorted(self.state.items()):
            settled = list(st.window)[:-horizon] if len(st.window) > horizon else []
            loss = (sum(1 for _, a in settled if not a) / len(settled)) if settled else 0.0
            out.append({"peer": peer, "plane": plane, "up": st.up, "rtt_s": st.rtt_s, "loss": loss,
                        "sent": st.sent, "answered": st.answered})
        return out
