"""RoCEv2-like traffic sent as a NIC would: hand-built frames from a raw packet socket.

Frames from a kernel UDP socket would carry the socket's hash across veths and skew any
ECMP comparison; raw frames carry nothing but their bytes."""
from __future__ import annotations

import errno
import ipaddress
import random
import socket
import threading
import time
from dataclasses import dataclass, field

from rlbcommon import netns
from rlbcommon.packets import bth, roce_frame


@dataclass
class QpRun:
    """What a lab's run_qps measured, the same for every fabric kind."""
    sent: int                                       # packets sent
    # bytes per fabric link the traffic could take, from the switches' counters: a leaf's
    # uplinks by spine (leaf-spine), (plane, sub-port) (scale-up); empty where the lab reads
    # its links apart (rail-only: rail_rx)
    links: dict = field(default_factory=dict)
    qp_packets: dict = field(default_factory=dict)  # per path, what the source's data plane sent
    flows: list = field(default_factory=list)
    seconds: float = 0.0                            # how long the sending took


@dataclass
class Flow:
    src: str
    dst: str
    sport: int
    qp: int


def open_raw(ns: str | None, ifname: str) -> socket.socket:
    """A raw packet socket bound to an interface of a namespace (it stays there)."""
    with netns.inside(ns):
        s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
        s.bind((ifname, 0))
    return s


def send(sock: socket.socket, flows: list[Flow], packets_per_flow: int, dmac: str, smac: str,
         payload_len: int = 256, rate_pps: float | None = None, burst: int = 1) -> int:
    """Interleave the flows' packets (as QPs run concurrently); returns packets sent.
    With rate_pps, paces to that rate (checked every burst)."""
    frames = [roce_frame(f.src, f.dst, f.sport, f.qp, dmac=dmac, smac=smac,
                         payload_len=payload_len) for f in flows]
    sent, start = 0, time.perf_counter()
    for i in range(packets_per_flow):
        for fr in frames:
            try:
                sock.send(fr)
            except OSError as e:          # ENOBUFS: the stack dropped it (a data plane's drop,
                if e.errno != errno.ENOBUFS:   # e.g. a redirect to a port gone down): lost, not unsent
                    raise
            sent += 1
        if rate_pps and sent % max(burst, 1) == 0:
            _pace(sent, rate_pps, start, time.sleep)
    return sent


class QpSender:
    """RoCEv2-like traffic from kernel UDP sockets, one per QP, as an application (or Soft-RoCE)
    would send it: source bound to one base address, destination port 4791, a BTH per datagram.
    Unlike raw frames these cross the host's own stack and TC egress."""

    def __init__(self, ns: str | None, src: str, dst: str, n_qps: int, port: int = 4791,
                 base_sport: int = 49152, seed: int = 0):
        rnd = random.Random(seed)
        self.dst, self.port, self.socks, self.qps = dst, port, [], []
        self._bth = bth
        with netns.inside(ns):
            for i in range(n_qps):
                s = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
                s.bind((src, base_sport + i))
                self.socks.append(s)
                self.qps.append(rnd.getrandbits(24))

    def send(self, packets_per_qp: int, payload_len: int = 256, rate_pps: float | None = None) -> int:
        sent, start = 0, time.perf_counter()
        for psn in range(packets_per_qp):
            sent += self._round(psn, payload_len)
            if rate_pps:
                _pace(sent, rate_pps, start, time.sleep)
        return sent

    def send_until(self, stop: threading.Event, rate_pps: float, payload_len: int = 256) -> int:
        """Every QP in turn, PSN after PSN, at rate_pps in all until `stop` is set; returns
        packets sent (always whole rounds: each QP got the same PSNs)."""
        sent, start, psn = 0, time.perf_counter(), 0
        while not stop.is_set():
            sent += self._round(psn, payload_len)
            psn += 1
            _pace(sent, rate_pps, start, stop.wait)
        return sent

    def _round(self, psn: int, payload_len: int) -> int:
        """One packet of each QP, with this PSN."""
        for s, qp in zip(self.socks, self.qps):
            s.sendto(self._bth(qp, psn) + bytes(payload_len), (self.dst, self.port))
        return len(self.socks)

    def close(self):
        for s in self.socks:
            s.close()


def _pace(sent: int, rate_pps: float, start: float, wait):
    """Wait (with `wait`) until `sent` packets are due at rate_pps since `start`."""
    ahead = sent / rate_pps - (time.perf_counter() - start)
    if ahead > 0:
        wait(ahead)


class SocketReader:
    """A socket read on a background thread until close()."""

    def __init__(self, sock: socket.socket):
        self.sock = sock
        self.sock.settimeout(0.2)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _loop(self):
        while not self._stop.is_set():
            try:
                self.take()
            except socket.timeout:
                continue

    def take(self):
        raise NotImplementedError

    def close(self):
        self._stop.set()
        self._thread.join()
        self.sock.close()


class QpReceiver(SocketReader):
    """A UDP application on port 4791 that records, per datagram, the source and the local
    destination address it saw (IPV6_PKTINFO): what the stack delivered, after any restore."""

    def __init__(self, ns: str | None, port: int = 4791):
        with netns.inside(ns):
            sock = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_RECVPKTINFO, 1)
            # a measuring tool must not be the bottleneck: with the default buffer a Python
            # reader drops bursts (Udp6RcvbufErrors) that the network delivered
            sock.setsockopt(socket.SOL_SOCKET, 33, 16 << 20)   # SO_RCVBUFFORCE
            sock.bind(("::", port))
        self.seen: list[tuple[str, str, int]] = []   # (source, destination, BTH dest QP)
        self.arrivals: list[tuple[float, int]] = []  # (monotonic time, BTH dest QP)
        self.psns: dict[int, list[int]] = {}         # BTH dest QP -> its PSNs in arrival order
        super().__init__(sock)

    def take(self):
        data, anc, _, addr = self.sock.recvmsg(4096, 256)
        dst = next((str(ipaddress.IPv6Address(d[:16])) for lvl, typ, d in anc
                    if lvl == socket.IPPROTO_IPV6 and typ == socket.IPV6_PKTINFO), "?")
        qp = int.from_bytes(data[5:8], "big")
        self.seen.append((addr[0], dst, qp))
        self.arrivals.append((time.monotonic(), qp))
        self.psns.setdefault(qp, []).append(int.from_bytes(data[9:12], "big"))


class Capture(SocketReader):
    """Frames seen on an interface (a raw packet socket, like tcpdump would use)."""

    def __init__(self, ns: str | None, ifname: str):
        with netns.inside(ns):
            sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(0x0003))
            sock.bind((ifname, 0))
        self.frames: list[bytes] = []
        super().__init__(sock)

    def take(self):
        self.frames.append(self.sock.recv(4096))

    def close(self) -> list[bytes]:
        super().close()
        return self.frames
