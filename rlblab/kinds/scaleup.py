"""FARE for scale-up networks on the multi-plane fabric (lab/scaleup.toml): splits by path
bandwidth, sub-cable and plane failures, silent failures caught by the probes, spray."""
from __future__ import annotations

import contextlib
import ctypes as ct
import functools
import json
import os
import threading
import time
from collections import Counter

from pyroute2 import IPRoute

from rlbcommon import libbpf, netns
from rlbcommon.paths import pin_dir

from ..faults import SilentDrop
from ..labs import register_lab
from ..scaleuplab import ScaleupLab
from ..scenario import Check, Scenario, register

register_lab(ScaleupLab)


def _wait_planes(lab, src: str, dst: str, want: dict[int, float], timeout: float | None = None) -> dict[int, float]:
    deadline, got = time.time() + (timeout or lab.SETTLE_S), {}
    while time.time() < deadline:
        got = lab.plane_weights(src, dst)
        if got == want:
            break
        time.sleep(0.2)
    return got


def _one_subport_fewer(lab, plane: int) -> dict[int, float]:
    """Every plane at full bandwidth but `plane`, which lost one of its m sub-ports."""
    m = lab.fabric.subports
    return {p: f * (m - 1) / m if p == plane else f for p, f in lab.full_planes().items()}


def _shape(lab) -> tuple[int, int, list[str]]:
    """(planes, sub-ports per plane, GPU names) of the lab's fabric: the scenarios' expected
    figures follow from them, not from one fabric file."""
    return len(lab.fabric.planes), lab.fabric.subports, lab.gpus


def _plane_of(lab, value: int) -> int:
    """The plane a path value (a GPU's sub-port) belongs to."""
    return (value - 1) // lab.fabric.subports + 1


def _qp_paths(lab, gpu: str, peer: str, idle: bool = False) -> dict[tuple[int, int], int]:
    """{(UDP source port, QP): path value} of a GPU's active QPs to a peer (idle: and those its
    table still holds, not swept yet)."""
    lo = lab.fabric.loopback(peer)
    return {(q["sport"], q["qp"]): q["path"] + 1 for q in json.loads(lab.cli(gpu, "qps", "--json"))
            if q["peer"] == lo and (q["active"] or idle)}


def _converged_first(fn):
    """A scale-up scenario starts from a converged lab: a fault the scenario before it cleared
    may still be travelling through BGP, and QPs placed meanwhile would be counted as moved by
    its recovery."""
    @functools.wraps(fn)
    def run(lab, *a, **kw):
        lab.wait_converged()
        return fn(lab, *a, **kw)
    return run


@_converged_first
def scaleup_split(lab, n_qps: int = 64) -> list[Check]:
    """§3.1: g2 loses one of its two sub-cables into plane 1, so g1's path bandwidth to g2 via
    plane 1 halves (FARE min() at g2, the plane switch and g1); 64 new QPs g1->g2 split 1:2:2:2
    across the planes, within 2 points of those weights, and evenly over each plane's sub-ports."""
    m = lab.fabric.subports
    # the QPs are counted where g1's table holds them, after the run: they must not expire first
    # (counting them from packets misread a QP the sweep moved mid-run as two halves)
    with _long_expiry(lab, "g1"):
        checks, ours = _split_under_half_plane(lab, n_qps, m)
    # the next scenario's QPs must not meet these: gone within an expiry and a sweep
    deadline = time.monotonic() + 30
    while ours & set(_qp_paths(lab, "g1", "g2", idle=True)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return checks


def _split_under_half_plane(lab, n_qps: int, m: int) -> tuple[list[Check], set]:
    lab.set_port("g2", f"eth-p1-{m}", False)
    ours: set = set()
    try:
        want = _one_subport_fewer(lab, 1)
        got = _wait_planes(lab, "g1", "g2", want)
        checks = [Check("g1's plane weights to g2 (Gb/s)", got, str(want), got == want)]
        r = lab.run_qps("g1", "g2", n_qps, 20, seed=21)
        ours.update((f.sport, f.qp) for f in r.flows)
        placed = [v for q, v in _qp_paths(lab, "g1", "g2").items() if q in ours]
        checks.append(Check("the run's QPs active in g1's table", len(placed), str(n_qps), len(placed) == n_qps))
        per_sub = Counter(((v - 1) // m + 1, (v - 1) % m + 1) for v in placed)
        shares = lab.plane_shares(per_sub)
        exp = {k: v / sum(want.values()) for k, v in want.items()}
        worst = max(abs(shares.get(k, 0) - exp[k]) for k in exp)
        checks.append(Check(f"{n_qps} QPs: share per plane", shares,
                            f"{ {k: round(v, 3) for k, v in exp.items()} } within 0.02", worst <= 0.02))
        arrived = sum(r.links.values()) >= r.sent * 512
        checks.append(Check("bytes the plane switches received from g1", sum(r.links.values()),
                            f">= {r.sent} packets x 512 bytes", arrived))
        uneven = [p for p in want if max(per_sub.get((p, i), 0) for i in range(1, m + 1))
                  - min(per_sub.get((p, i), 0) for i in range(1, m + 1)) > 1]
        checks.append(Check("QPs per sub-port within each plane", dict(sorted(per_sub.items())),
                            "differ by at most 1", not uneven))
    finally:
        lab.set_port("g2", f"eth-p1-{m}", True)
    return checks, ours


@contextlib.contextmanager
def _long_expiry(lab, gpu: str):
    """A GPU's idle QPs kept (not expired) for the block, so that their paths can be read from
    its table after traffic stops; its expiry as it was afterwards."""
    expiry = json.loads(lab.cli(gpu, "config", "--json"))["expiry_ms"]
    lab.cli(gpu, "config", "--expiry-ms", str(max(60000, int(4000 * lab.SETTLE_S))))
    try:
        yield
    finally:
        lab.cli(gpu, "config", "--expiry-ms", f"{expiry:g}")


@_converged_first
def scaleup_subcable(lab, n_qps: int = 64) -> list[Check]:
    """§3.1: a sub-cable fails at the sender (g1's eth-p2-1: its QPs must move) or at the
    receiver (g2's eth-p3-1: g1's plane 3 to g2 keeps (m-1)/m of its bandwidth, so some of its QPs
    must leave), and comes back. Each time the QPs must end within one QP of the weights per plane,
    and no more QPs may move than that takes: with 4 planes of 2 and 64 QPs, 8 = ceil(64/8) and
    7 = ceil(16 - 64/7); other shapes get the rounding of their own counts."""
    checks = []
    planes, _, _ = _shape(lab)
    full = lab.full_planes()
    # the QPs must outlive a fault's travel to g1's weights and back: idle entries expire
    with _long_expiry(lab, "g1"):
        def traffic():
            lab.run_qps("g1", "g2", n_qps, 5, seed=31)
            time.sleep(0.3)
            return _qp_paths(lab, "g1", "g2")

        def step(what: str, before: dict, now: dict, weights: dict[int, float], dead: int | None) -> Check:
            moved = sum(1 for q in before if now.get(q) != before[q])
            fewest = _fewest_moves(before, now)
            per_plane = {p: sum(1 for v in now.values() if _plane_of(lab, v) == p) for p in range(1, planes + 1)}
            ideal = {p: n_qps * w / sum(weights.values()) for p, w in weights.items()}
            fair = all(abs(per_plane[p] - ideal[p]) < 1 for p in ideal)
            empty = dead is None or not any(v == dead for v in now.values())
            return Check(what, (moved, per_plane),
                         f"{fewest} (the fewest for this split); planes within 1 of "
                         f"{ {p: round(v, 1) for p, v in ideal.items()} }", moved == fewest and fair and empty)

        for where, node, port, plane in (("sender", "g1", "eth-p2-1", 2), ("receiver", "g2", "eth-p3-1", 3)):
            before = traffic()
            lab.set_port(node, port, False)
            degraded = _one_subport_fewer(lab, plane)
            _wait_planes(lab, "g1", "g2", degraded)
            time.sleep(0.5)
            during = traffic()
            dead = next(p.value for p in lab.fabric.gpu_ports("g1") if p.ifname == port) if node == "g1" else None
            checks.append(step(f"{where}'s sub-cable {port} down: QPs moved; QPs per plane", before, during,
                               degraded, dead))
            lab.set_port(node, port, True)
            _wait_planes(lab, "g1", "g2", full, timeout=2 * lab.SETTLE_S)
            time.sleep(0.5)
            after = traffic()
            checks.append(step(f"{port} back: QPs moved back; QPs per plane", during, after, full, None))
    return checks


def _fewest_moves(before: dict, after: dict) -> int:
    """The fewest QPs that turn one placement into the other: those leaving each sub-port that
    holds fewer afterwards (a QP taken from a sub-port that did not shrink moved needlessly)."""
    had, has = Counter(before.values()), Counter(after.values())
    return sum(max(0, n - has.get(path, 0)) for path, n in had.items())


def _stream_loss(lab, src: str, dst: str, n_qps: int, seconds: float, rate_pps: float, fault, seed: int):
    """Send n QPs at rate_pps for `seconds` in rounds of one packet per QP, calling fault() a
    third of the way in; returns (packets sent, delivered, ms): the ms are how long the fault
    kept taking the traffic of the QP it hit longest, its lost packets (one per round: a QP
    loses from the fault until it is moved) times the round's time as sent. Per QP and by
    the rounds actually sent, the figure depends neither on how many QPs the fault's plane
    held nor on the rate a loaded machine managed."""
    res: dict = {}
    rounds = int(seconds * rate_pps / n_qps)
    with lab.receiver(dst) as rx:
        t = threading.Thread(target=lambda: res.update(r=lab.run_qps(
            src, dst, n_qps, rounds, seed=seed, payload_len=128, rate_pps=rate_pps)))
        t.start()
        # run_qps reads counters through the CLI before it sends, which takes seconds on a
        # loaded machine: the third is counted from the stream's first packet delivered, or
        # the fault can land before the stream and the probes have the plane out already
        end = time.monotonic() + 60
        while rx.count == 0 and t.is_alive() and time.monotonic() < end:
            time.sleep(0.005)
        time.sleep(seconds / 3)
        streaming = t.is_alive()
        fault()
        t.join()
    if not streaming:
        raise RuntimeError(f"the stream {src}->{dst} ended before the fault: nothing measured")
    if rx.dropped:
        raise RuntimeError(f"the receiver on {dst} dropped {rx.dropped} datagrams itself (this process "
                           "too busy to read them): the loss cannot be told from the fabric's")
    r = res["r"]
    worst = max(rounds - rx.per_sport.get(f.sport, 0) for f in r.flows)
    return r.sent, rx.count, worst * r.seconds / rounds * 1000


def ports_down(lab, switch: str, ifnames: list[str]) -> dict[str, float]:
    """A switch's ports set down in order, by netlink from this process (as a switch failing
    drops them all at once; `ip` in a new process per port would add its start-up between
    them, tens of ms on a loaded machine): {ifname: ms its down call took}."""
    took = {}
    with netns.inside(lab.ns(switch)), IPRoute() as ipr:
        for name in ifnames:
            idx = ipr.link_lookup(ifname=name)[0]
            t0 = time.perf_counter()
            ipr.link("set", index=idx, state="down")
            took[name] = (time.perf_counter() - t0) * 1000
    return took


def ports_out_ms(lab, gpu: str, ports: list, t0: float, timeout: float = 1.0) -> float:
    """ms from perf_counter t0 until every one of `ports` (a GPU's) is out of use in its data
    plane (its bit in the carrier watcher's mask); the timeout if not."""
    want = sum(1 << (p.value - 1) for p in ports)
    fd = libbpf.obj_get(str(pin_dir("host", lab.ns(gpu)) / "port_down"))
    key, val = ct.c_uint32(0), ct.c_uint32(0)
    try:
        while time.perf_counter() - t0 < timeout:
            libbpf.lib.bpf_map_lookup_elem(fd, ct.byref(key), ct.byref(val))
            if val.value & want == want:
                break
            time.sleep(0.00005)
        return (time.perf_counter() - t0) * 1000
    finally:
        os.close(fd)


def carrier_reaction_ms(lab, gpu: str, plane: str, sub: int = 1, trials: int = 20) -> list[tuple[float, float]]:
    """A GPU port loses carrier (its plane switch's end set down, by netlink) until the GPU's
    data plane has the port out of use (its bit in the carrier watcher's mask): per trial (ms
    the down call took, ms until out of use). The kernel reports the GPU end's carrier loss only
    once the down call has released the RTNL lock (a veth's close holds it for milliseconds
    here), so the difference is what the GPU adds: the kernel's event and the watcher."""
    port = next(p for p in lab.fabric.gpu_ports(gpu) if p.plane.name == plane and p.sub == sub)
    bit = 1 << (port.value - 1)
    fd = libbpf.obj_get(str(pin_dir("host", lab.ns(gpu)) / "port_down"))
    key, val = ct.c_uint32(0), ct.c_uint32(0)

    def mask_has_bit() -> bool:
        libbpf.lib.bpf_map_lookup_elem(fd, ct.byref(key), ct.byref(val))
        return bool(val.value & bit)

    out = []
    try:
        with netns.inside(lab.ns(plane)), IPRoute() as ipr:
            idx = ipr.link_lookup(ifname=port.switch_ifname)[0]
            for _ in range(trials):
                t0 = time.perf_counter()
                ipr.link("set", index=idx, state="down")
                t1 = time.perf_counter()
                while not mask_has_bit() and time.perf_counter() - t0 < 1.0:
                    time.sleep(0.00005)
                out.append(((t1 - t0) * 1000, (time.perf_counter() - t0) * 1000))
                lab.set_port(plane, port.switch_ifname, True)
                end = time.perf_counter() + 2
                while mask_has_bit() and time.perf_counter() < end:
                    time.sleep(0.001)
                time.sleep(0.05)
    finally:
        os.close(fd)
    return out


@_converged_first
def scaleup_plane_failure(lab) -> list[Check]:
    """The last plane's switch (p4 in lab/scaleup.toml) fails (every port loses carrier): the GPUs see it locally and stop using
    the plane at once (the data plane moves a QP on its next packet). Measured twice: the time
    from a port's carrier loss to the data plane's taking it out of use (20 trials, exact), and
    a stream: g1 sends 8 QPs to g2 at 8000 packets/s in rounds of one packet per QP (a round
    is 1 ms, the stream's resolution), and the rounds the QP hit longest lost are how long p4
    kept getting traffic: the down call's own time (the kernel reports the carrier loss only
    after it), then the host's reaction."""
    checks = []
    last = lab.fabric.planes[-1]
    trials = carrier_reaction_ms(lab, "g1", last.name)
    call = sorted(c for c, _ in trials)
    after = sorted(t - c for c, t in trials)
    med = lambda xs: round(xs[len(xs) // 2], 2)
    checks.append(Check("port down: until out of use at the GPU, after the switch's down call "
                        "(median, max of 20; the call itself, median)",
                        (med(after), round(after[-1], 2), med(call)), "<= 1 ms", med(after) <= 1.0))
    ports = lab.fabric.switch_ports(last)
    src = [p for p in lab.fabric.gpu_ports("g1") if p.plane.name == last.name]
    first = [p.switch_ifname for p in src]
    lab.cli("g1", "config", "--expiry-ms", "60000")
    try:
        rate, n = 8000, 8
        out_ms: list[float] = []

        def fail_plane():
            """g1's ports first, timed until g1's data plane has them out; then the others (a
            peer's port down first would drop g1's traffic before g1 could see anything)."""
            t0 = time.perf_counter()
            ports_down(lab, last.name, first)
            out_ms.append(ports_out_ms(lab, "g1", src, t0))
            ports_down(lab, last.name, [p for p in ports if p not in first])
        _, _, ms = _stream_loss(lab, "g1", "g2", n, 3.0, rate, fail_plane, seed=41)
        # from the first down call until g1's data plane has the ports out: the down calls and
        # the kernel's carrier report (its link watcher waits for the RTNL lock, behind other
        # link changes: tens of ms on a loaded machine), then the host's reaction (above); no
        # packet may be lost after that, within a round
        bound = out_ms[0] + n / rate * 1000
        checks.append(Check(f"{last.name} down: traffic lost on it (ms, the QP hit longest; "
                            "ms until g1's data plane had the ports out, from the first down call)",
                            (round(ms, 2), round(out_ms[0], 2)),
                            f"<= {bound:.2f} ms: none lost once out of use, within a round", 0 <= ms <= bound))
        w = _wait_planes(lab, "g1", "g2", {**lab.full_planes(), last.index: 0.0})
        checks.append(Check("g1's plane weights to g2 after", w, f"{last.name} 0", w.get(last.index) == 0.0))
    finally:
        for p in ports:
            lab.set_port(last.name, p, True)
        lab.cli("g1", "config", "--expiry-ms", "200")
        _wait_planes(lab, "g1", "g2", lab.full_planes(), timeout=2 * lab.SETTLE_S)
    return checks


@_converged_first
def scaleup_silent_failure(lab) -> list[Check]:
    """Plane p2 silently drops everything to g2 (carrier up, BGP and BFD on link-local untouched):
    only the GPUs' probes see it. g1 streams 16 QPs to g2; the time p2 kept getting g1's traffic
    (the rounds of the stream the QP hit longest lost, 2 ms each) must stay within 150 ms."""
    drop = SilentDrop(lab.ns("g2"), [p.ifname for p in lab.fabric.gpu_ports("g2") if p.plane.name == "p2"],
                      lab.fabric.loopback("g2"))
    lab.cli("g1", "config", "--expiry-ms", "60000")
    checks = []
    full = lab.full_planes()
    try:
        rate, n = 8000, 16
        sent, got, ms = _stream_loss(lab, "g1", "g2", n, 3.0, rate, drop.on, seed=51)
        checks.append(Check("p2 silently dropping to g2: traffic lost on it (ms, the QP hit longest)",
                            round(ms, 1), "<= 150 ms (and some lost: the fault was real)", got < sent and ms <= 150))
        w = lab.plane_weights("g1", "g2")
        checks.append(Check("g1's plane weights to g2 during", w, "p2 0, the others full",
                            w.get(2) == 0.0 and all(w[p] == full[p] for p in full if p != 2)))
        p2 = sum(v for k, v in lab.weights("g1").get(f"{lab.fabric.loopback('g3')}/128", {}).items()
                 if _plane_of(lab, k) == 2)
        checks.append(Check("g1 to g3 (not behind the fault) keeps p2", p2, f"{full[2]}", p2 == full[2]))
    finally:
        drop.off()
        lab.cli("g1", "config", "--expiry-ms", "200")
    back = _wait_planes(lab, "g1", "g2", full, timeout=10)
    checks.append(Check("fault cleared: p2 back for g2", back, "all planes full", back == full))
    return checks


@_converged_first
def scaleup_spray(lab, packets: int = 100_000) -> list[Check]:
    """§3.2: the last GPU (g8) tolerates reordering; g1 sends it one QP per plane and each packet
    is sprayed by weight over the planes and their sub-ports: 100 000 packets, each within 1
    point. g1's last sub-cable into p1 is down first: p1 then weighs (m-1)/m, so with 4 planes
    of 2 the plane shares are 1/7, 2/7, 2/7, 2/7 and each sub-port of p2-p4 1/7."""
    checks = []
    planes, m, gpus = _shape(lab)
    peer = gpus[-1]
    lab.set_port("g1", f"eth-p1-{m}", False)
    try:
        want = _one_subport_fewer(lab, 1)
        got = _wait_planes(lab, "g1", peer, want)
        checks.append(Check(f"g1's plane weights to {peer}", got, str(want), got == want))
        r = lab.run_qps("g1", peer, planes, packets // planes, seed=61, payload_len=128)
        total = sum(r.qp_packets.values())
        shares = lab.plane_shares(r.qp_packets)
        exp = {k: v / sum(want.values()) for k, v in want.items()}
        checks.append(Check(f"{planes} QPs, {packets} packets: share per plane", shares,
                            f"{ {k: round(v, 3) for k, v in exp.items()} } within 0.01",
                            all(abs(shares[k] - exp[k]) <= 0.01 for k in exp)))
        subs = {k: round(v / total, 4) for k, v in r.qp_packets.items() if k[0] != 1}
        checks.append(Check("packets g1 sent / the plane switches counted from it", (total, sum(
            v for v in r.links.values())), f"{r.sent} sent", total == r.sent))
        checks.append(Check("share per sub-port of the other planes", subs, f"{exp[2] / m:.4f} within 0.01 each",
                            all(abs(v - exp[2] / m) <= 0.01 for v in subs.values())))
    finally:
        lab.set_port("g1", f"eth-p1-{m}", True)
    return checks


register(
    Scenario("scaleup-3.1-split", "FARE scale-up, §3.1", "64 QPs split across planes by path "
             "bandwidth (a peer's half plane), evenly over sub-ports", "scaleup.toml", scaleup_split),
    Scenario("scaleup-3.1-subcable", "FARE scale-up, §3.1", "a sub-cable fails at either end: "
             "the fewest QPs move for a split within one QP of the weights, and back", "scaleup.toml", scaleup_subcable),
    Scenario("scaleup-plane-down", "FARE scale-up, §3", "a plane fails, seen locally: traffic off it "
             "within 1 ms", "scaleup.toml", scaleup_plane_failure),
    Scenario("scaleup-silent", "FARE scale-up, §3 (health checks)", "a plane silently drops to one "
             "GPU: the probes take it out of use within 150 ms", "scaleup.toml", scaleup_silent_failure),
    Scenario("scaleup-3.2-planes", "FARE scale-up, §3.2", "per-packet spray across planes and "
             "sub-ports by weight (100k packets)", "scaleup.toml", scaleup_spray),
)
