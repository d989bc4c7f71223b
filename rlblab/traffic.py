"""RoCEv2-like traffic sent as a NIC would: hand-built frames from a raw packet socket.

Frames from a kernel UDP socket would carry the socket's hash across veths and skew any
ECMP comparison; raw frames carry nothing but their bytes."""
from __future__ import annotations

import socket
import time
from dataclasses import dataclass

from rlbcommon import netns
from rlbcommon.packets import roce_frame


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
            sock.send(fr)
            sent += 1
        if rate_pps and sent % max(burst, 1) == 0:
            ahead = sent / rate_pps - (time.perf_counter() - start)
            if ahead > 0:
                time.sleep(ahead)
    return sent
