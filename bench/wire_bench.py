"""Real packets through real forwarders, side by side in one run.

    generator ns            forwarder ns                          sink ns
    g0 (xdp_gen, XDP_TX) -> in0 [forwarder] -> out0/out1/out2 -> s0/s1/s2 (xdp_sink: count, drop)

The generator is an XDP program run with BPF_PROG_RUN + BPF_F_TEST_XDP_LIVE_FRAMES: each run
rewrites its page into the next frame (IPv6/UDP 4791/BTH, the source port and QP cycling over
--flows flows) and sends it out of g0. veth NAPI runs on the sending CPU and the bench pins
itself to one CPU, so that CPU runs the whole chain: the chain's rate compares forwarders
fairly. Program cost is the kernel's own accounting (kernel.bpf_stats_enabled=1,
run_time_ns / run_cnt of the forwarder's program).

Forwarders: a bare devmap redirect (the floor), Linux IPv6 forwarding (no XDP), rlbswitch in
each mode, and rlbhost's TC programs against an empty TC program in the same place (a Linux
forwarder with the program on its egress or ingress hook). Each case with 1 and with --flows
flows; the switch cases again with --routes extra /64 routes installed.
Ratios are against the bare redirect and Linux measured in this run (each run of a switch case
against a run of the bare redirect swapped into in0 just before it: the machine's speed drifts
over minutes); absolute figures are for this machine only.

The guard: each forwarder's program time over the bare redirect's (and over the empty TC
program's, for the host) and the chain's slowdown against the bare redirect's rate are printed
beside the ratios recorded for this CPU kind in bench/ratios.json (groups "wire ns", "wire
chain", "wire host": bench/records.py), and a ratio more than 10 % over its record is named;
--check exits 1 then, --record writes this run's as this kind's record."""
from __future__ import annotations

import argparse
import contextlib
import ctypes as ct
import os
import statistics
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from rlbcommon import netns  # noqa: E402
from rlbcommon import packets as P  # noqa: E402
from rlbcommon.libbpf import prog_info  # noqa: E402
from rlbcommon.testrun import live_frames  # noqa: E402
from rlblab import topo  # noqa: E402
from bench.records import RECORD, WARN, compared_with, medians, over_line, over_record, recorded, write_record  # noqa: E402

GEN_HDR = 80
IN_MAC, GEN_MAC = "02:00:00:00:0a:01", "02:00:00:00:0a:02"
SINK_MAC = {k: f"02:00:00:00:0b:0{k}" for k in range(3)}
OUT_MAC = {k: f"02:00:00:00:0c:0{k}" for k in range(3)}
SRC = "fc00:1:1:1::a"
DST = {"pinned": "fc00:2:0:1::1", "weighted": "fc00:2:0:2::1", "dlb": "fc00:2:0:3::1",
       "pinned failing over": "fc00:2:0:4::1", "connected": "fc00:9::5", "spray": "fc00:2:0:5::1"}
HOST_PATHS = {k: f"fc00:1:1:{k}::a" for k in range(1, 5)}
STATS_SYSCTL = Path("/proc/sys/kernel/bpf_stats_enabled")


@dataclass
class Result:
    case: str
    flows: int
    routes: int
    mpps: list[float] = field(default_factory=list)
    ns: list[float] = field(default_factory=list)
    delivered: list[float] = field(default_factory=list)
    # the bare redirect measured right before each run (the switch's cases): its ns and rate
    ref_ns: list[float] = field(default_factory=list)
    ref_mpps: list[float] = field(default_factory=list)

    @property
    def rate(self) -> float:
        return statistics.median(self.mpps)

    @property
    def prog_ns(self) -> float | None:
        return statistics.median(self.ns) if self.ns else None

    def ns_x_ref(self, ref: Result) -> float | None:
        """Program time over the reference's: run by run against the bare redirect measured just
        before it where it was (the machine's speed drifts between cases), else medians over."""
        if self.ref_ns and len(self.ref_ns) == len(self.ns):
            return statistics.median(n / b for n, b in zip(self.ns, self.ref_ns))
        return self.prog_ns / ref.prog_ns if self.prog_ns is not None and ref.prog_ns else None

    def slowdown(self, ref: Result) -> float:
        """The reference's chain rate over this one's (paired run by run where it was measured so)."""
        if self.ref_mpps and len(self.ref_mpps) == len(self.mpps):
            return statistics.median(b / m for m, b in zip(self.mpps, self.ref_mpps))
        return ref.rate / self.rate


class Chain:
    """The three namespaces, the generator and the sinks; forwarders are swapped in per case."""

    def __init__(self, size: int):
        tag = uuid.uuid4().hex[:5]
        self.gen, self.fwd, self.sink = f"wgen-{tag}", f"wfwd-{tag}", f"wsink-{tag}"
        self.instance = f"wire-{tag}"
        try:
            self._build(size)
        except BaseException:
            self.close()                  # no namespaces left behind by a failed start
            raise

    def _build(self, size: int):
        from bcc import BPF
        for ns in (self.gen, self.fwd, self.sink):
            topo.add_ns(ns)
        topo.link(self.gen, "g0", self.fwd, "in0", GEN_MAC, IN_MAC)
        for k in range(3):
            topo.link(self.fwd, f"out{k}", self.sink, f"s{k}", OUT_MAC[k], SINK_MAC[k])
        self.bpf = BPF(src_file=str(Path(__file__).with_name("wire.c")).encode())
        self.gen_fd = self.bpf.load_func(b"xdp_gen", BPF.XDP).fd
        sink = self.bpf.load_func(b"xdp_sink", BPF.XDP)
        with netns.inside(self.sink):
            for k in range(3):
                BPF.attach_xdp(f"s{k}".encode(), sink, 1 << 2)
        with netns.inside(self.gen):
            self.g0 = self._ifindex("g0")
        self.size = size

    @staticmethod
    def _ifindex(name: str) -> int:
        import socket
        return socket.if_nametoindex(name)

    def frame(self, dst: str, src: str = SRC) -> bytes:
        payload = max(0, self.size - 74)
        return P.roce_frame(src, dst, 49152, 1, dmac=IN_MAC, smac=GEN_MAC, payload_len=payload,
                            hop_limit=64, zero_checksum=True)

    def set_traffic(self, frame: bytes, flows: int):
        cfg = self.bpf[b"gen_cfg"]
        v = cfg.Leaf()
        v.n_flows = flows
        ct.memmove(ct.addressof(v.tmpl), frame[:GEN_HDR], GEN_HDR)
        cfg[ct.c_int(0)] = v
        self.bpf[b"gen_seq"].clear()

    def delivered(self) -> int:
        return self.bpf[b"sink_count"].sum(ct.c_int(0)).value

    def measure(self, frame: bytes, flows: int, packets: int, prog_fd: int | None) -> tuple[float, float | None, float]:
        """One run: chain rate (Mpps), the program's ns per packet, delivered fraction."""
        self.set_traffic(frame, flows)
        self.bpf[b"sink_count"].clear()
        before = prog_info(prog_fd) if prog_fd is not None else None
        with netns.inside(self.gen):
            t0 = time.perf_counter()
            live_frames(self.gen_fd, frame, packets, self.g0)
            elapsed = time.perf_counter() - t0
        time.sleep(0.05)                       # the last batch drains
        got = self.delivered()
        ns = None
        if before is not None:
            after = prog_info(prog_fd)
            runs = after.run_cnt - before.run_cnt
            ns = (after.run_time_ns - before.run_time_ns) / runs if runs else None
        return got / elapsed / 1e6, ns, got / packets

    def close(self):
        for ns in (self.gen, self.fwd, self.sink):
            topo.del_ns(ns)


def fwd_sh(chain: Chain, *cmd: str):
    topo.run(chain.fwd, *cmd)


@contextlib.contextmanager
def linux_forwarding(chain: Chain):
    """The forwarder namespace as a plain IPv6 router: routes via the sink, a static neighbour."""
    fwd_sh(chain, "sysctl", "-qw", "net.ipv6.conf.all.forwarding=1")
    fwd_sh(chain, "ip", "-6", "neigh", "replace", "fe80::5", "lladdr", SINK_MAC[0], "dev", "out0",
           "nud", "permanent")
    fwd_sh(chain, "ip", "-6", "route", "replace", "fc00::/16", "via", "fe80::5", "dev", "out0")
    try:
        yield
    finally:
        fwd_sh(chain, "ip", "-6", "route", "del", "fc00::/16")
        fwd_sh(chain, "sysctl", "-qw", "net.ipv6.conf.all.forwarding=0")


@contextlib.contextmanager
def xdp_on_in0(chain: Chain, fn, restore=None):
    """fn's program on in0 (native XDP); afterwards restore() (in the forwarder's namespace) puts
    back what was there, or in0 is left without one."""
    from bcc import BPF
    with netns.inside(chain.fwd):
        BPF.attach_xdp(b"in0", fn, 1 << 2)
    try:
        yield
    finally:
        with netns.inside(chain.fwd):
            if restore is not None:
                restore()
            else:
                BPF.remove_xdp(b"in0", 1 << 2)


@contextlib.contextmanager
def tc_prog(chain: Chain, ifname: str, direction: str, fd: int, name: str):
    from pyroute2 import NetNS
    parent = {"ingress": 0xFFFFFFF2, "egress": 0xFFFFFFF3}[direction]
    with NetNS(chain.fwd) as ipr:
        idx = ipr.link_lookup(ifname=ifname)[0]
        with contextlib.suppress(Exception):
            ipr.tc("add", "clsact", idx)
        ipr.tc("replace-filter", "bpf", idx, handle=1, prio=1, fd=fd, name=name, parent=parent,
               classid=1, direct_action=True)
        try:
            yield
        finally:
            ipr.tc("del-filter", "bpf", idx, handle=1, prio=1, parent=parent)


def run_case(chain: Chain, args, results: list, case: str, frame: bytes, prog_fd, routes: int = 0,
             paired=None):
    """args.rounds runs with 1 and with args.flows flows each; paired: (swap, the bare redirect's
    program fd), swap() a context manager putting the bare redirect in the forwarder's place for
    a run of it just before each of this case's."""
    for flows in (1, args.flows):
        r = Result(case, flows, routes)
        for _ in range(args.rounds):
            if paired is not None:
                swap, bare_fd = paired
                with swap():
                    ref_mpps, ref_ns, _ = chain.measure(frame, flows, args.packets, bare_fd)
                r.ref_mpps.append(ref_mpps)
                if ref_ns is not None:           # (a run the kernel did not count: unpaired, below)
                    r.ref_ns.append(ref_ns)
            mpps, ns, frac = chain.measure(frame, flows, args.packets, prog_fd)
            r.mpps.append(mpps)
            if ns is not None:
                r.ns.append(ns)
            r.delivered.append(frac)
        results.append(r)
        print(f"  {case:<34}{flows:>6} flows {routes:>6} routes  {r.rate:6.2f} Mpps"
              + (f"  {r.prog_ns:6.1f} ns" if r.prog_ns is not None else "")
              + f"  delivered {min(r.delivered):.3f}", file=sys.stderr)


@contextlib.contextmanager
def switch_on(chain: Chain, ingress: tuple[str, ...] = ("in0",), outs: int = 3):
    """rlbswitch attached in the forwarder namespace (its ingress ports and out0..): the data
    plane and a next hop to each sink, with a pinned route to out0 (backup out1); destroyed after."""
    from rlbfabric.routes import NextHop, Route
    from rlbswitch.dataplane import SwitchDataplane
    with netns.inside(chain.fwd):
        dp = SwitchDataplane(chain.instance)
        try:
            for name in (*ingress, *(f"out{k}" for k in range(outs))):
                dp.attach(name)
            nh = [NextHop.parse(f"out{k}@{SINK_MAC[k]}") for k in range(outs)]
            dp.add_route(Route("fc00:2:0:1::/64", "pinned", [nh[0]], [nh[1]]))
            yield dp, nh
        finally:
            dp.destroy()


def switch_cases(chain: Chain, args, results: list, bare=None):
    """Each mode of rlbswitch; with `bare` (the bare redirect's program), each run paired with
    one of the bare redirect just before it, swapped into in0 and back."""
    from rlbfabric.routes import NextHop, Route
    with switch_on(chain) as (dp, nh):
        paired = None
        if bare is not None:
            @contextlib.contextmanager
            def swap():
                with xdp_on_in0(chain, bare, restore=lambda: dp.attach("in0")):   # (replaced in place)
                    yield
            paired = (swap, bare.fd)
        dp.add_route(Route("fc00:2:0:2::/64", "weighted", [NextHop(h.ifname, mac=h.mac, weight=1)
                                                            for h in nh[:2]]))
        dp.add_route(Route("fc00:2:0:3::/64", "dlb", nh[:2]))
        dp.add_route(Route("fc00:2:0:4::/64", "pinned", [nh[2]], nh[:2]))
        dp.add_route(Route("fc00:2:0:5::/64", "spray", [NextHop(h.ifname, mac=h.mac, weight=1)
                                                         for h in nh[:2]]))
        dp.add_route(Route("fc00:9::/64", "connected", dev="out0"))
        dp.update_neighbour(dp.ifindex("out0"), "fc00:9::5", SINK_MAC[0])
        dp.set_port_up(dp.ifindex("out2"), False)     # the failover route's primary is down
        fd = dp.prog_fd
        for extra in (0, args.routes) if args.routes else (0,):
            if extra:
                many = [Route(f"fc00:3:{i >> 16:x}:{i & 0xffff:x}::/64", "pinned", [nh[i % 2]])
                        for i in range(extra)]
                dp.apply_routes(many, merge=True)
            for mode, dst in DST.items():
                if mode not in args.modes.split(","):
                    continue
                run_case(chain, args, results, f"rlbswitch {mode}", chain.frame(dst), fd, extra, paired)


def host_cases(chain: Chain, args, results: list):
    """rlbhost's TC programs on a Linux forwarder, against an empty TC program in their place."""
    from rlbhost.dataplane import HostDataplane
    empty = chain.bpf.load_func(b"tc_empty", chain.bpf.SCHED_CLS)
    out = chain.frame("fc00:1:2:1::b")                            # base -> base: egress moves it
    back = chain.frame(HOST_PATHS[3], src="fc00:1:2:3::b")       # path 3 -> ingress restores
    with netns.inside(chain.fwd):
        host = HostDataplane(chain.instance)
        try:
            host.load()
            host.set_paths(HOST_PATHS, field=3, base_value=1)
            host.set_config(expiry_ms=3_600_000)
            host.set_weights({1: 0, 2: 0, 3: 1, 4: 0})
            with linux_forwarding(chain):
                for direction, ifname, frame in (("egress", "out0", out), ("ingress", "in0", back)):
                    for label, fd, name in ((f"empty TC {direction}", empty.fd, "tc_empty"),
                                            (f"rlbhost {direction}", host.prog_fd(direction),
                                             f"rlb_host_{direction}")):
                        with tc_prog(chain, ifname, direction, fd, name):
                            run_case(chain, args, results, label, frame, fd)
        finally:
            host.destroy()


def result_of(results: list[Result], case: str, flows: int, routes: int = 0) -> Result:
    return next(r for r in results if r.case == case and r.flows == flows and r.routes == routes)


def case_name(r: Result) -> str:
    return f"{r.case}, {r.flows} flows" + (f", +{r.routes} routes" if r.routes else "")


def ratios(results: list[Result]) -> dict[str, dict[str, float]]:
    """The run's ratios, every one higher-is-worse: program time over the bare redirect's (or
    over the empty TC program's in the same place), and the bare redirect's chain rate over the
    forwarder's."""
    out: dict[str, dict[str, float]] = {"wire ns": {}, "wire chain": {}, "wire host": {}}
    for r in results:
        if r.case.startswith("empty TC"):
            continue
        if r.case.startswith("rlbhost"):
            ref = result_of(results, r.case.replace("rlbhost", "empty TC"), r.flows)
            if r.prog_ns and ref.prog_ns:
                out["wire host"][case_name(r)] = round(r.prog_ns / ref.prog_ns, 3)
            continue
        bare = result_of(results, "bare devmap redirect", r.flows)
        x = r.ns_x_ref(bare)
        if x is not None:
            out["wire ns"][case_name(r)] = round(x, 3)
        out["wire chain"][case_name(r)] = round(r.slowdown(bare), 3)
    return {g: v for g, v in out.items() if v}


def report(results: list[Result], args, now: dict | None = None, record: dict | None = None):
    def find(case, flows, routes=0):
        return result_of(results, case, flows, routes)

    def rec(group: str, r: Result) -> str:
        """The case's record in this group and the change, or blanks."""
        old = (record or {}).get(group, {}).get(case_name(r))
        got = (now or {}).get(group, {}).get(case_name(r))
        if not old or got is None:
            return f"{'-':>6}{'':>6}"
        return f"{old:>6.2f}{(got / old - 1) * 100:>+5.0f}%" + ("!" if got > old * WARN else " ")

    print(f"Real packets, {args.size}-byte frames, one CPU (cpu {args.cpu}) runs generator, forwarder "
          f"and sink; median of {args.rounds} runs of {args.packets} packets; records: "
          f"{compared_with()} in bench/{RECORD.name} ('!': more than 10 % over)")
    print(f"{'forwarder in the middle':<34}{'flows':>6}{'routes':>7}{'Mpps':>7}{'x bare':>8}"
          f"{'x linux':>8}{'prog ns':>9}{'ns x bare':>10}{'record':>12}{'chain rec':>12}")
    for r in results:
        if r.case.startswith(("empty TC", "rlbhost")):
            continue
        bare, linux = find("bare devmap redirect", r.flows), find("Linux IPv6 forwarding", r.flows)
        x = r.ns_x_ref(bare)
        ns = f"{r.prog_ns:9.1f}{x:10.2f}" if x is not None else f"{'-':>9}{'-':>10}"
        print(f"{r.case:<34}{r.flows:>6}{r.routes:>7}{r.rate:7.2f}{1 / r.slowdown(bare):8.2f}"
              f"{r.rate / linux.rate:8.2f}{ns}{rec('wire ns', r)}{rec('wire chain', r)}")
    host = [r for r in results if r.case.startswith("rlbhost")]
    if host:
        print(f"\n{'host TC on a Linux forwarder':<34}{'flows':>6}{'Mpps':>7}{'x empty':>8}{'prog ns':>9}"
              f"{'empty ns':>9}{'ns x empty':>11}{'record':>12}")
        for r in host:
            ref = find(r.case.replace("rlbhost", "empty TC"), r.flows)
            print(f"{r.case:<34}{r.flows:>6}{r.rate:7.2f}{r.rate / ref.rate:8.2f}{r.prog_ns:9.1f}"
                  f"{ref.prog_ns:9.1f}{r.prog_ns / ref.prog_ns:11.2f}{rec('wire host', r)}")
    lost = [r for r in results if min(r.delivered) < 0.99]
    for r in lost:
        print(f"note: {r.case} ({r.flows} flows) delivered only {min(r.delivered):.3f} of what was sent")
    print("\n" + over_line(now or {}, record or {}))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--packets", type=int, default=2_000_000, help="packets per run")
    ap.add_argument("--rounds", type=int, default=3, help="runs per case (median taken)")
    ap.add_argument("--flows", type=int, default=10_000, help="flows in the many-flow runs (<= 16384)")
    ap.add_argument("--routes", type=int, default=16_384, help="extra /64 routes for the table-size runs")
    ap.add_argument("--size", type=int, default=128, help="frame size in bytes (>= 80)")
    ap.add_argument("--cpu", type=int, default=os.cpu_count() - 1, help="the CPU that runs the chain")
    ap.add_argument("--only", choices=("switch", "host"), help="run only one half")
    ap.add_argument("--modes", default=",".join(DST), help="rlbswitch modes to run (comma-separated)")
    ap.add_argument("--runs", type=int, default=1, help="whole runs (each in a fresh chain); the "
                    "ratios compared and recorded are each one's median over them")
    ap.add_argument("--check", action="store_true", help="exit 1 when a ratio is over 1.1x its record")
    ap.add_argument("--record", action="store_true", help=f"write this run's ratios to {RECORD.name} "
                    "as this CPU kind's (each group run replaces the kind's: record from a full run)")
    args = ap.parse_args()
    if not 1 <= args.flows <= 16384:
        ap.error("--flows must be 1..16384 (source ports cycle over 16384 values)")
    if not 80 <= args.size <= 3000:
        ap.error("--size must be 80..3000 bytes")
    if args.packets < 10_000 or args.rounds < 1 or args.runs < 1:
        ap.error("--packets must be >= 10000, --rounds and --runs >= 1")
    if os.geteuid():
        ap.error("run as root (namespaces, XDP)")

    os.sched_setaffinity(0, {args.cpu})
    stats_was = STATS_SYSCTL.read_text().strip()
    STATS_SYSCTL.write_text("1")
    record, each = recorded(), []
    try:
        for n in range(args.runs):
            results = one_run(args)
            each.append(ratios(results))
            if args.runs > 1:
                print(f"\n== run {n + 1} of {args.runs}")
            report(results, args, each[-1], record)
    finally:
        STATS_SYSCTL.write_text(stats_was)
    now = medians(each)
    if args.runs > 1:
        report_medians(now, record, args.runs)
    if args.record:
        print(write_record(now))
        return 0
    return 1 if args.check and over_record(now, record, WARN) else 0


def one_run(args) -> list[Result]:
    """Every case once, in a chain of namespaces built for the run and removed after it."""
    from bcc import BPF
    chain = Chain(args.size)
    results: list[Result] = []
    try:
        if args.only != "host":
            with netns.inside(chain.fwd):
                chain.bpf[b"bare_tx"][ct.c_int(0)] = ct.c_int(Chain._ifindex("out0"))
            bare = chain.bpf.load_func(b"xdp_bare", BPF.XDP)
            with xdp_on_in0(chain, bare):
                run_case(chain, args, results, "bare devmap redirect", chain.frame(DST["pinned"]), bare.fd)
            with linux_forwarding(chain):
                run_case(chain, args, results, "Linux IPv6 forwarding", chain.frame(DST["pinned"]), None)
            switch_cases(chain, args, results, bare)
        if args.only != "switch":
            host_cases(chain, args, results)
    finally:
        chain.close()
    return results


def report_medians(now: dict, record: dict, runs: int):
    print(f"\nmedians of {runs} runs, against {compared_with()} record ('!': more than 10 % over)")
    for g, cases in now.items():
        print(f"\n{g:<52}{'ratio':>7}{'record':>8}")
        for c, r in cases.items():
            old = record.get(g, {}).get(c)
            rec = f"{old:>8.2f}{(r / old - 1) * 100:>+5.0f}%" + ("!" if r > old * WARN else "") if old else f"{'-':>8}"
            print(f"{c:<52}{r:>7.2f}{rec}")
    print("\n" + over_line(now, record))


if __name__ == "__main__":
    sys.exit(main())
