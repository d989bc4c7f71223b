"""Data-plane liveness of the neighbouring switches: a switch that keeps carrier but forwards
nothing (hung, its program gone) is taken out of forwarding within a few heartbeats, whatever
BGP's graceful restart and `bfd graceful` keep in the routing table meanwhile.

Every round, each fabric port asks its neighbour (UDP to the neighbour's link-local address,
hop limit 255); the neighbour's XDP program answers out of the same port (rlb_switch.c
heartbeat_answer), so an answer says that program runs and that port moves packets, and does not
depend on the neighbour's bird or agent: a bird restart (the case graceful restart is for) keeps
answering. A port whose neighbour has left MISS asks in a row unanswered is silent: the data plane
treats it as a lost carrier (pinned routes go to their backups at once, DLB leaves it); three
answers in a row give it back.

Guards, so that the heartbeat can only help:
- a neighbour that never answered (a switch of another make: FRR, a vendor's) is never judged;
  the neighbours that did are remembered in the run directory, so an agent started afresh judges
  them at once;
- asks are counted, not time: an agent whose loop is late sends no asks and judges nobody;
- when every judged neighbour is silent at once, the fault is more likely this switch's own
  receive path: nothing is taken out (logged)."""
from __future__ import annotations

import contextlib
import ipaddress
import json
import logging
import os
import socket
import struct
import time
from dataclasses import dataclass
from pathlib import Path

from rlbcommon.cheader import constants

from .abi import HEADER
from .dataplane import DataplaneError, SwitchDataplane
from .discovery import echo_peer

log = logging.getLogger(__name__)

C = constants(HEADER)
PORT, MAGIC = C["RLB_HEARTBEAT_PORT"], C["RLB_HEARTBEAT_MAGIC"]
ASK, ANSWER = C["RLB_HEARTBEAT_ASK"], C["RLB_HEARTBEAT_ANSWER"]
WIRE = struct.Struct("!IBBHIQ")          # struct rlb_heartbeat
INTERVAL_MS = 100                         # rlbswitch run --heartbeat-ms
MISS = 5                                  # asks in a row unanswered: silent (0.5 s at 100 ms)
BACK = 3                                  # answers in a row: alive again
FIND_EVERY = 10                           # rounds between looks for an unknown or silent neighbour
SO_TIMESTAMPNS = SCM_TIMESTAMPNS = 35     # <asm-generic/socket.h>; Python names neither
UDP_NO_CHECK6_TX, UDP_NO_CHECK6_RX = 101, 102   # <linux/udp.h>


@dataclass
class Neighbour:
    ifname: str
    ifindex: int
    peer: str | None = None               # its link-local address
    answered: bool = False                # has answered once: judged from then on
    last_seq: int = 0                     # the newest ask it answered
    streak: int = 0                       # answers in a row (since the last miss)
    silent: bool = False
    silences: int = 0
    rtt_us: float = 0.0


class Heartbeat:
    def __init__(self, dp: SwitchDataplane, ifnames: list[str], state_file: Path,
                 interval_ms: int = INTERVAL_MS, changed=None):
        """ifnames: the fabric ports (towards switches, not hosts). changed(): called when a
        port's liveness changes (the uplink report wakes)."""
        self.dp, self.state_file, self.interval_s = dp, state_file, interval_ms / 1000
        self.changed = changed or (lambda: None)
        known = self._read_state()
        self.ports: dict[int, Neighbour] = {}
        for ifname in ifnames:
            try:
                ifindex = dp.ifindex(ifname)
            except DataplaneError:
                continue
            peer = known.get(ifname)
            self.ports[ifindex] = Neighbour(ifname, ifindex, peer, answered=peer is not None)
        self.seq = 0
        self.suspect_logged = False
        self.sock = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
        self.sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_UNICAST_HOPS, 255)
        self.sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_RECVHOPLIMIT, 1)
        self.sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)   # arrival time: the round trip
        # no UDP checksum either way (RFC 6936): an ask whose checksum a NIC's offload left to
        # finish (virtio, veth) would come back answered with a wrong one and be dropped here
        self.sock.setsockopt(socket.SOL_UDP, UDP_NO_CHECK6_TX, 1)
        self.sock.setsockopt(socket.SOL_UDP, UDP_NO_CHECK6_RX, 1)
        self.sock.bind(("::", 0))
        self.sock.setblocking(False)

    # ---- one round -------------------------------------------------------------------------
    def round(self):
        """Read the answers that came since the last round, judge, ask again."""
        self._read_answers()
        self._judge()
        self.seq += 1
        for n in self.ports.values():
            # the first round checks what the run directory remembered (a neighbour replaced
            # while we were away); later, a port without an answering neighbour looks again
            if self.seq == 1 or ((n.peer is None or self.seq - n.last_seq >= MISS) and self.seq % FIND_EVERY == 0):
                self._find(n)
            if n.peer is None:
                continue
            # sent at the wall clock's time: the kernel stamps answers in that clock
            ask = WIRE.pack(MAGIC, ASK, 0, n.ifindex & 0xFFFF, self.seq & 0xFFFFFFFF, time.time_ns())
            with contextlib.suppress(OSError):     # no route, neighbour unresolved: unanswered
                self.sock.sendto(ask, (n.peer, PORT, 0, n.ifindex))

    def _read_answers(self):
        while True:
            try:
                data, anc, _, (src, _, _, scope) = self.sock.recvmsg(64, 256)
            except (BlockingIOError, InterruptedError):
                return
            hops = next((struct.unpack("i", d[:4])[0] for lvl, typ, d in anc
                         if lvl == socket.IPPROTO_IPV6 and typ == socket.IPV6_HOPLIMIT), None)
            sec, nsec = next((struct.unpack("qq", d[:16]) for lvl, typ, d in anc
                              if lvl == socket.SOL_SOCKET and typ == SCM_TIMESTAMPNS), (0, 0))
            n = self.ports.get(scope)
            if n is None or hops != 255 or len(data) < WIRE.size:
                continue                           # not from one hop away by a port we ask on
            magic, kind, _, port, seq, t_ns = WIRE.unpack_from(data)
            if magic != MAGIC or kind != ANSWER or port != n.ifindex & 0xFFFF or not 0 < seq <= self.seq:
                continue
            if src.split("%")[0] != n.peer or seq <= n.last_seq:
                continue
            n.streak = n.streak + 1 if seq == n.last_seq + 1 else 1
            n.last_seq, n.rtt_us = seq, (sec * 10**9 + nsec - t_ns) / 1000
            if not n.answered:
                n.answered = True
                log.info("%s: neighbour %s answers heartbeats (%.0f us): judged from now on",
                         n.ifname, n.peer, n.rtt_us)
                self._write_state()

    def _judge(self):
        """Silent: MISS asks unanswered in a row; alive again: BACK answers in a row."""
        silent = self.dp.silent_ports()
        carrier = {p.ifindex: p.up or p.ifindex in silent for p in self.dp.ports()}
        judged = [n for n in self.ports.values() if n.answered and n.peer and carrier.get(n.ifindex)]
        missing = {n.ifindex for n in judged if self.seq - n.last_seq >= MISS}
        if len(judged) > 1 and missing == {n.ifindex for n in judged}:
            if not self.suspect_logged:
                log.warning("no neighbour answers heartbeats on any of %d ports: this switch's own "
                            "receive path is more likely at fault; no port taken out", len(judged))
                self.suspect_logged = True
            return
        self.suspect_logged = False
        for n in judged:
            if n.ifindex in missing and not n.silent:
                n.silent, n.streak = True, 0
                n.silences += 1
                self.dp.set_port_silent(n.ifindex, True)
                log.warning("%s: neighbour %s has answered none of the last %d heartbeats (%.0f ms) with "
                            "carrier up: taken out of forwarding", n.ifname, n.peer, self.seq - n.last_seq,
                            (self.seq - n.last_seq) * self.interval_s * 1000)
                self.changed()
            elif n.silent and n.streak >= BACK:
                n.silent = False
                self.dp.set_port_silent(n.ifindex, False)
                log.warning("%s: neighbour %s answers heartbeats again: back in forwarding", n.ifname, n.peer)
                self.changed()

    def _find(self, n: Neighbour):
        """The neighbour's link-local address (an echo to all-nodes on the port); a new one
        (the neighbour replaced) starts unjudged again."""
        with self.dp.netlink() as ipr:
            own = {a.get_attr("IFA_ADDRESS") for a in ipr.get_addr(family=socket.AF_INET6, index=n.ifindex)}
        peer = echo_peer(n.ifname, n.ifindex, own, timeout=min(0.1, self.interval_s))
        if peer is None or peer == n.peer:
            return
        if n.peer is not None:
            log.info("%s: the neighbour is now %s (was %s)", n.ifname, peer, n.peer)
        n.peer, n.answered, n.last_seq, n.streak = peer, False, self.seq - 1, 0
        if n.silent:                           # a new neighbour is judged once it answers
            n.silent = False
            self.dp.set_port_silent(n.ifindex, False)
            self.changed()

    # ---- what neighbours answered, across restarts -------------------------------------------
    def _read_state(self) -> dict[str, str]:
        try:
            got = json.loads(self.state_file.read_text())
            return {k: str(ipaddress.IPv6Address(v)) for k, v in got.items() if isinstance(k, str)}
        except (OSError, ValueError, AttributeError):
            return {}

    def _write_state(self):
        state = {n.ifname: n.peer for n in self.ports.values() if n.answered and n.peer}
        tmp = self.state_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(state, sort_keys=True))
        os.replace(tmp, self.state_file)

    def status(self) -> dict[str, dict]:
        return {n.ifname: {"peer": n.peer, "judged": n.answered, "silent": n.silent, "silences": n.silences,
                           "rtt_us": round(n.rtt_us, 1), "unanswered": self.seq - n.last_seq if n.answered else None}
                for n in self.ports.values()}
