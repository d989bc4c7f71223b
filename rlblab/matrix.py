"""Traffic matrices through a namespace fabric: every host of the matrix sends its QPs at once (raw
RoCEv2 frames from its NIC, as a NIC would), burst after burst like a collective's iterations;
every leaf uplink and every spine->leaf downlink is read from the spines' kernel counters.

Between bursts the QPs fall idle: that is when RLB hosts take the coordinator's placements, so
the first burst shows the local rule and the later ones the coordinated placement."""
from __future__ import annotations

import random
import socket
import threading
import time
from dataclasses import dataclass, field

from rlbcommon import netns
from rlbcommon.packets import ROCE_PORT, roce_frame
from rlbfabric import balance


BURST_GAP_S = 1.2     # > conntrack expiry (200 ms) + two coordinator report periods (250 ms)
PLACED_WAIT_S = 10.0  # placements later than the gap (a loaded machine): waited for this long at most
IDLE_AFTER_S = 0.3    # then the conntrack expiry (200 ms) passes, so the QPs take them
FORGET_S = 3.5        # > the hosts' QP memory (3 s): an earlier matrix's QPs have left the coordinator


@dataclass
class MatrixRun:
    qps: list[tuple[str, str]]                       # (source, destination) per QP
    qp_bytes: int                                    # one QP's bytes per burst
    bursts: list[dict] = field(default_factory=list)  # per burst: {"up": {leaf: [bytes]}, "down": ...}
    sent: int = 0
    placed_after_s: float | None = None              # first packet -> every QP has a placement
    unplaced: dict = field(default_factory=dict)     # host -> QPs still without one, if any

    caps: dict | None = None                         # leaf -> link speeds, where they differ (0: down)
    dead: list = field(default_factory=list)         # (leaf, colour) of the links down as it started

    def figures(self, burst: int = -1) -> tuple[float, float]:
        """(uplinks, downlinks) worst leaf's max/mean in bytes (by utilisation where link speeds
        differ); a leaf side with less than half a QP's bytes is idle (BGP, BFD and ND alone)."""
        b = self.bursts[burst]
        return balance.figures(b["up"], b["down"], self.caps, idle_below=self.qp_bytes / 2)

    def best(self, fabric) -> tuple[float, float]:
        """The per-leaf bound; on fabrics with slower links, the best placement found by trying
        them all where that is quick (the bound may be out of reach there)."""
        bound = balance.best_figures(fabric, self.qps, self.caps)
        if self.caps:
            found = balance.searched_best(fabric, self.qps, self.caps)
            if found is not None:
                return found, found
        return bound


def link_bytes(lab) -> tuple[dict[str, list[int]], dict[str, list[int]]]:
    """Data bytes so far on every leaf's uplinks and downlinks, in uplink (colour) order, each
    read at the sending end (FabricLab.sent: the control traffic left out where XDP forwards).
    Every switch is read once."""
    at = {sw: lab.sent(sw) for sw in {n.name for lf in lab.fabric.leaves
                                      for n in (lf, *(p.peer for p in lab.fabric.ports_up(lf)))}}
    up, down = {}, {}
    for lf in lab.fabric.leaves:
        ports = lab.fabric.ports_up(lf)
        up[lf.name] = [at[lf.name][p.ifname]["tx_bytes"] for p in ports]
        down[lf.name] = [at[p.peer.name][p.peer_ifname]["tx_bytes"] for p in ports]
    return up, down


def run_matrix(lab, connections: list[tuple[str, str]], qps_per_connection: int = 1, packets: int = 200,
               seed: int = 1, bursts: int = 2, gap_s: float = BURST_GAP_S, payload_len: int = 512,
               churn_gap_s: float | None = None) -> MatrixRun:
    """Send the matrix `bursts` times (the same QPs each time, fresh ports and QP numbers per
    seed) and read every fabric link's bytes per burst.

    churn_gap_s: first run the same matrix with other QPs (a job that ends: `bursts` bursts), then
    start these churn_gap_s after its last packet; only the new QPs' bursts are measured."""
    rnd = random.Random(seed)
    addrs = {h: lab.host_addresses(h)[1] for h in {x for c in connections for x in c}}
    socks, macs = {}, {}
    sinks = [s for s in (sink(ns) for ns in sorted({lab.host_ns(d) for _, d in connections})) if s]
    sets = 1 if churn_gap_s is None else 2
    # source ports unique across the matrix (and the job before it): equal ones would look like
    # one QP's two directions
    ports = iter(rnd.sample(range(49152, 65536), sets * len(connections) * qps_per_connection))
    try:
        jobs = []
        for _ in range(sets):
            qps, frames = [], []
            keys: dict[str, set] = {}        # host -> its fabric-crossing QPs (placements expected)
            for src, dst in connections:
                if src not in socks:
                    socks[src] = lab.qp_frames_sender(src)
                    macs[src] = lab.frame_macs(src)
                for _ in range(qps_per_connection):
                    qps.append((src, dst))
                    dmac, smac = macs[src]
                    sport, qpn = next(ports), rnd.getrandbits(24)
                    frames.append((socks[src], roce_frame(addrs[src], addrs[dst], sport, qpn, dmac=dmac,
                                                          smac=smac, payload_len=payload_len)))
                    if lab.fabric.leaf_of_host(src)[0] is not lab.fabric.leaf_of_host(dst)[0]:
                        keys.setdefault(src, set()).add((addrs[dst], sport, qpn))
            jobs.append((qps, frames, keys))
        if churn_gap_s is not None:           # the job that ends
            old = jobs.pop(0)[1]
            for b in range(bursts):
                if b:
                    time.sleep(gap_s)
                _burst(old, packets)
            time.sleep(churn_gap_s)
        qps, frames, keys = jobs[0]
        out = MatrixRun(qps, packets * len(frames[0][1]) if frames else 0)
        caps = balance.link_caps(lab.fabric)
        out.dead = sorted(lab.dead_uplinks())
        for leaf, c in out.dead:
            caps[leaf][c] = 0.0
        if len({c for row in caps.values() for c in row}) > 1:
            out.caps = caps
        watch = PlacementWatch(lab, keys) if lab.coordinator and bursts > 1 else None
        for b in range(bursts):
            if b:
                time.sleep(gap_s)
                if watch:
                    # on a loaded machine the placements can land after the gap: wait for them
                    # (the event burst 2 depends on), then for the QPs to go idle again so they
                    # take them (hosts apply placements to new and idle QPs only)
                    if watch.t1 is None and watch.wait(PLACED_WAIT_S):
                        time.sleep(IDLE_AFTER_S)
                    out.placed_after_s = watch.stop()
                    out.unplaced = {h: n for h, n in watch.missing.items() if n}
                    watch = None
            up0, down0 = link_bytes(lab)
            if watch:
                watch.start()
            out.sent += _burst(frames, packets)
            time.sleep(0.3)
            up1, down1 = link_bytes(lab)
            out.bursts.append({"up": {k: [a - b for a, b in zip(up1[k], up0[k])] for k in up1},
                               "down": {k: [a - b for a, b in zip(down1[k], down0[k])] for k in down1}})
        return out
    finally:
        for s in [*socks.values(), *sinks]:
            s.close()


def _burst(frames: list, packets: int) -> int:
    for _ in range(packets):
        for sock, frame in frames:
            sock.send(frame)
    return packets * len(frames)


class PlacementWatch:
    """Polls the hosts' placement maps (pinned, readable from here) from the first packet until
    every fabric-crossing QP of the matrix has a placement."""

    def __init__(self, lab, keys: dict[str, set]):
        self.dps = {h: lab.host_dataplane(h) for h in keys}
        self.keys, self.done = keys, threading.Event()
        self.t0 = self.t1 = None
        self.missing: dict = {}

    def start(self):
        self.t0 = time.monotonic()
        self.thread = threading.Thread(target=self._poll, daemon=True)
        self.thread.start()

    def _poll(self):
        while not self.done.is_set():
            try:
                self.missing = {h: len(k - set(self.dps[h].placements())) for h, k in self.keys.items()}
            except Exception as e:     # a map read racing the agent's writes: read again
                self.missing = {"error": repr(e)}
            else:
                if not any(self.missing.values()):
                    self.t1 = time.monotonic()
                    return
            time.sleep(0.02)

    def wait(self, timeout: float) -> bool:
        """True once every QP has its placement (False: not within timeout)."""
        self.thread.join(timeout)
        return self.t1 is not None

    def stop(self) -> float | None:
        self.done.set()
        self.thread.join()
        for dp in self.dps.values():
            dp.close()
        return None if self.t1 is None else self.t1 - self.t0


def sink(ns: str) -> socket.socket | None:
    """A UDP socket on the RoCE port that reads nothing: the host's stack drops what arrives
    instead of answering port unreachable, which would load the reverse links."""
    with netns.inside(ns):
        s = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
        try:
            s.bind(("::", ROCE_PORT))
        except OSError:           # something listens there already: no answers either
            s.close()
            return None
    return s


def report(lab, run: MatrixRun, burst: int = -1) -> list[str]:
    """Per leaf, bytes on each uplink and downlink, then the figures next to the best possible."""
    names = [p.peer.name + (f"-{p.link}" if lab.fabric.parallel > 1 else "") for p in lab.fabric.ports_up(lab.fabric.leaves[0])]
    b = run.bursts[burst]
    out = [f"{'leaf':<6}{'uplinks to ' + ', '.join(names) + ' (kB)':<40}{'downlinks from them (kB)':<36}"]
    for lf in lab.fabric.leaves:
        out.append(f"{lf.name:<6}{' '.join(f'{x / 1000:>7.0f}' for x in b['up'][lf.name]):<40}"
                   f"{' '.join(f'{x / 1000:>7.0f}' for x in b['down'][lf.name]):<36}")
    got, best = run.figures(burst), run.best(lab.fabric)
    if run.dead:
        out.append("down, left out of the figures: " + ", ".join(f"{lf}-{names[c]}" for lf, c in run.dead))
    out.append(f"worst leaf max/mean: uplinks {got[0]:.2f} (best possible {best[0]:.2f}), "
               f"downlinks {got[1]:.2f} (best possible {best[1]:.2f}); {len(run.qps)} QPs")
    return out
