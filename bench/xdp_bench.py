"""ns per packet of RLB's programs against reference programs, in one run, side by side.

Switch (XDP):

    empty            an XDP program that returns XDP_PASS (the test-run floor)
    parse+redirect   parse Ethernet/IPv6, rewrite MACs, hop limit, devmap redirect
    router           that, after a route lookup (LPM trie) and a next hop read, with a per-CPU
                     count: a router's work (the kernel's xdp_router_ipv4 sample, in IPv6)
    our modes        pinned, weighted, dlb, pinned failover, connected, pass (no route)
Host (TC):
    empty TC         returns TC_ACT_OK
    parse+redirect   parse Ethernet/IPv6, rewrite MACs, bpf_redirect to a port (the least a
                     scale-up GPU's egress must do)
    egress/ingress   address mode: QP already placed (conntrack hit) and rewritten; ingress restore
    ports egress     ports mode (FARE scale-up GPU, 4 planes x 2 sub-ports): a placed QP to its
                     sub-port, and per-packet spray by weight

Measured with BPF_PROG_TEST_RUN, kernel-timed. Test-run repeats work on one buffer, so a
forwarder's hop-limit decrement accumulates: frames start at hop limit 255 and each run has
250 repeats, so every measured packet takes the forwarding path. Median over many runs.
Numbers are for comparison on one machine, not absolute line-rate claims.

The guard: each case's ratio to its reference measured in the same run (the switch's to
parse+redirect, and again to the router, the host's to an empty TC program, ports mode to TC
parse+redirect) is printed
beside the ratio recorded in bench/ratios.json, and a case more than 10 % above its record is
named. --check exits 1 then; --record writes this run's ratios as the new record (after a
change meant to move them). tests/test_bench_guard.py runs the switch cases briefly in `make
test` and fails only on a ratio far outside noise (1.5x its record). Ratios move with the kind
of machine, against either reference (an Intel Xeon put the switch's 1.3-1.8x higher against
parse+redirect than the first kind, and 1.3-1.6x higher against the router than an AMD EPYC):
so each CPU kind (its /proc/cpuinfo model name) has its own record under "kinds", and a machine
of a kind never measured is held to the top level, the higher of each case over the kinds
measured (docs/results.md). --record writes this machine's kind, and raises the top level where
this kind is higher (lowering it is a hand edit: it stands for kinds not here)."""
from __future__ import annotations

import argparse
import ctypes
import ipaddress
import statistics
import subprocess
import sys
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from rlbcommon import netns  # noqa: E402
from rlbcommon import packets as P  # noqa: E402
from rlbcommon.testrun import TC_ACT_REDIRECT, XDP_PASS, XDP_REDIRECT, prog_test_run  # noqa: E402
from rlbhost.dataplane import HostDataplane  # noqa: E402
from rlbswitch.abi import POLICE  # noqa: E402
from rlbswitch.dataplane import SwitchDataplane  # noqa: E402
from rlbfabric.routes import NextHop, Route  # noqa: E402
from rlblab import topo  # noqa: E402
from bench.records import RECORD, WARN, compared_with, medians, over_line, over_record, recorded, write_record  # noqa: E402


def ns_per_packet(cases: list[tuple[str, int, bytes, int]], repeat: int, rounds: int) -> list[tuple[str, float]]:
    """Median ns per packet of each (name, prog fd, frame, expected verdict). The cases take
    turns, one test run each per round, so a burst of other work on the machine (a namespace
    torn down just before: the kernel's cleanup runs for seconds) lands on all of them alike
    rather than on whichever case was running; a case measured in one block had its ratio moved
    that way."""
    samples: dict[str, list[int]] = {name: [] for name, *_ in cases}
    for _ in range(rounds):
        for name, fd, frame, expect in cases:
            r = prog_test_run(fd, frame, repeat=repeat)
            if r.retval != expect:
                raise SystemExit(f"{name}: unexpected verdict {r.retval} (wanted {expect}): the setup is wrong")
            samples[name].append(r.duration_ns)
    return [(name, statistics.median(v)) for name, v in samples.items()]


# each case's reference: the first case of its group, measured in the same run
REFERENCES = {"switch": "parse+redirect baseline", "router": "router baseline", "host": "empty TC",
              "ports": "TC parse+redirect"}
MEASURED = ("switch", "host", "ports")   # "router" is the switch group's figures over another reference


def measure(repeat: int = 250, rounds: int = 300, groups=MEASURED) -> dict[str, dict[str, float]]:
    """{group: {case: ns per packet}}, in a scratch namespace removed afterwards."""
    from bcc import BPF
    ns = f"rlbbench-{uuid.uuid4().hex[:6]}"
    subprocess.run(["ip", "netns", "add", ns], check=True)
    out = {}
    try:
        with netns.inside(ns):
            topo.veth_ports(4)
            ref = BPF(src_file=str(Path(__file__).with_name("baseline.c")).encode())
            dp = SwitchDataplane(ns)
            host = HostDataplane(ns)
            gpu = HostDataplane(f"{ns}-gpu")          # a host is in one mode: a second instance
            try:
                if "switch" in groups:
                    out["switch"] = dict(run_cases(ref, dp, repeat, rounds))
                    out["router"] = out["switch"]     # the same figures, over a router's work
                if "host" in groups:
                    out["host"] = dict(run_host_cases(ref, host, rounds))
                if "ports" in groups:
                    out["ports"] = dict(run_ports_cases(ref, gpu, repeat, rounds))
            finally:
                dp.destroy()
                host.destroy()
                gpu.destroy()
    finally:
        subprocess.run(["ip", "netns", "del", ns])
    return out


def ratios(results: dict[str, dict[str, float]]) -> dict[str, dict[str, float]]:
    """Each case over its group's reference (same run)."""
    return {g: {c: round(v / cases[REFERENCES[g]], 3) for c, v in cases.items()}
            for g, cases in results.items()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=250, help="packets per kernel test run (max 253)")
    ap.add_argument("--rounds", type=int, default=300, help="test runs per case (median taken; a "
                    "run takes about 16 ms here, whatever it carries: the kernel's set-up)")
    ap.add_argument("--runs", type=int, default=1, help="measure this many times and take each "
                    "case's median ratio (a record: 3 or more)")
    ap.add_argument("--only", choices=MEASURED, help="run one group of cases")
    ap.add_argument("--check", action="store_true", help="exit 1 when a ratio is over 1.1x its record")
    ap.add_argument("--record", action="store_true", help=f"write this run's ratios to {RECORD.name}")
    args = ap.parse_args()
    if not 1 <= args.repeat <= 253:
        ap.error("--repeat must be 1..253 (the hop limit would run out and change the path)")
    if args.runs < 1:
        ap.error("--runs must be 1 or more")
    runs = [measure(args.repeat, args.rounds, (args.only,) if args.only else MEASURED) for _ in range(args.runs)]
    results, now = medians(runs), medians([ratios(r) for r in runs])
    record = recorded()
    report(args, results, now, record)
    if args.record:
        print(write_record(now))
        return 0
    return 1 if args.check and over_record(now, record, WARN) else 0


def run_cases(ref, dp, repeat: int, rounds: int) -> list[tuple[str, float]]:
    """Set up one route per mode and time each case."""
    from bcc import BPF
    empty = ref.load_func(b"xdp_empty", BPF.XDP).fd
    base = ref.load_func(b"xdp_parse_redirect", BPF.XDP).fd
    router = ref.load_func(b"xdp_router", BPF.XDP).fd
    ref[b"bench_tx"][ctypes.c_int(0)] = ctypes.c_int(dp.ifindex("p0"))
    router_route(ref, "fc00:2:0:1::/64", 1, port=0, dmac="02:00:00:00:01:00", smac="02:00:00:00:02:00")
    dp.load()
    for bucket in POLICE.values():             # the policer would cut the to-the-kernel case to its
        dp.set_police(bucket, 0, 1)           # burst: measured is the program's cost, not its drops
    for k in range(4):
        dp.register_port(dp.ifindex(f"p{k}"))
    nh = [NextHop.parse(f"p{k}@02:00:00:00:01:0{k}") for k in range(4)]
    dp.add_route(Route("fc00:2:0:1::/64", "pinned", [nh[0]], nh[1:]))
    # live members only (p3 goes down below): a flow hashed to a dead member falls back to DLB,
    # so with p3 in the group the case measured DLB or not by the start's random hash seed
    # (175-268 ns from run to run)
    dp.add_route(Route("fc00:2:0:2::/64", "weighted", [NextHop(h.ifname, mac=h.mac, weight=k + 1)
                                                        for k, h in enumerate(nh[:3])]))
    dp.add_route(Route("fc00:2:0:3::/64", "dlb", nh[:3]))
    dp.add_route(Route("fc00:2:0:5::/64", "spray", [NextHop(h.ifname, mac=h.mac, weight=1) for h in nh[:3]]))
    dp.add_route(Route("fc00:2:0:4::/64", "pinned", [NextHop.parse("p3@02:00:00:00:01:03")], nh[:3]))
    dp.add_route(Route("fc00:9::/64", "connected", dev="p1"))
    dp.update_neighbour(dp.ifindex("p1"), "fc00:9::5", "02:00:00:00:09:05")
    dp.set_port_up(dp.ifindex("p3"), False)   # makes fc00:2:0:4::/64 fail over

    frame = lambda dst: P.roce_frame("fc00:1::1", dst, 49152, 77, payload_len=1024, hop_limit=255)
    cases = [
        ("empty XDP", empty, frame("fc00:2:0:1::1"), XDP_PASS),
        ("parse+redirect baseline", base, frame("fc00:2:0:1::1"), XDP_REDIRECT),
        ("router baseline", router, frame("fc00:2:0:1::1"), XDP_REDIRECT),
        ("rlb pinned", dp.prog_fd, frame("fc00:2:0:1::1"), XDP_REDIRECT),
        ("rlb weighted (3 members)", dp.prog_fd, frame("fc00:2:0:2::1"), XDP_REDIRECT),
        ("rlb spray (3 members)", dp.prog_fd, frame("fc00:2:0:5::1"), XDP_REDIRECT),
        ("rlb dlb (flowlet hit)", dp.prog_fd, frame("fc00:2:0:3::1"), XDP_REDIRECT),
        ("rlb pinned, primary down", dp.prog_fd, frame("fc00:2:0:4::1"), XDP_REDIRECT),
        ("rlb connected host", dp.prog_fd, frame("fc00:9::5"), XDP_REDIRECT),
        ("rlb no route (to kernel)", dp.prog_fd, frame("fd00::1"), XDP_PASS),
    ]
    return ns_per_packet(cases, repeat, rounds)


def router_route(ref, prefix: str, nh: int, port: int, dmac: str, smac: str):
    """A route of the router reference (xdp_router): prefix -> next hop nh on devmap slot port."""
    net = ipaddress.IPv6Network(prefix)
    key = ref[b"bench_routes"].Key()
    key.prefixlen = net.prefixlen
    key.addr[:] = list(net.network_address.packed)
    ref[b"bench_routes"][key] = ctypes.c_uint32(nh)
    v = ref[b"bench_nexthops"].Leaf()
    v.port = port
    v.dmac[:] = list(P.mac_bytes(dmac))
    v.smac[:] = list(P.mac_bytes(smac))
    ref[b"bench_nexthops"][ctypes.c_int(nh)] = v


def run_host_cases(ref, host, rounds: int) -> list[tuple[str, float]]:
    """The host programs with four paths; QPs already placed (the steady state)."""
    from bcc import BPF
    a = {k: f"fc00:1:1:{k}::a" for k in range(1, 5)}
    host.load()
    host.set_paths(a, field=3)
    host.set_config(expiry_ms=3_600_000)
    host.set_weights({1: 0, 2: 0, 3: 1, 4: 0})      # the QP lands on path 3: a real rewrite
    empty = ref.load_func(b"tc_empty", BPF.SCHED_CLS).fd
    out = P.roce_frame(a[1], "fc00:1:2:1::b", 49152, 77, payload_len=1024)
    back = P.roce_frame("fc00:1:2:3::b", a[3], 49152, 78, payload_len=1024)
    prog_test_run(host.prog_fd("egress"), out)     # place the QP
    cases = [("empty TC", empty, out), ("rlbhost egress (rewrite)", host.prog_fd("egress"), out),
             ("rlbhost ingress (restore)", host.prog_fd("ingress"), back)]
    # Repeats run on one buffer: after the first, the packet already carries path (or base)
    # addresses and would take a cheaper exit. So one packet per run for all three, the
    # reference included; per-run timer overhead is in every figure alike.
    return ns_per_packet([(name, fd, frame, 0) for name, fd, frame in cases], 1, rounds * 5)


def run_ports_cases(ref, gpu, repeat: int, rounds: int) -> list[tuple[str, float]]:
    """A scale-up GPU's egress in ports mode: 4 planes x 2 sub-ports, a QP already placed on its
    sub-port (the steady state), and a reorder-tolerant peer sprayed per packet."""
    from bcc import BPF
    from rlbfabric.base import add_loopback_device
    from rlbhost.dataplane import PortPath
    ports = [PortPath((p - 1) * 2 + i, f"eth-p{p}-{i}", f"02:00:00:00:{p:02x}:{i:02x}", True)
             for p in range(1, 5) for i in (1, 2)]
    for name in ["rlb0", *(p.ifname for p in ports)]:
        add_loopback_device(name)
    gpu.attach_ports("rlb0", "fc00:0:ff::1", ports, group_size=2)
    gpu.set_config(expiry_ms=3_600_000)
    gpu.apply_weights({"::/0": ({p.value: 1 for p in ports}, False),
                       "fc00:0:ff::3/128": ({p.value: 1 for p in ports}, True)})
    ref[b"bench_tc_tx"][ctypes.c_int(0)] = ctypes.c_int(gpu.ifindex("eth-p1-1"))
    redirect = ref.load_func(b"tc_parse_redirect", BPF.SCHED_CLS).fd
    qp = P.roce_frame("fc00:0:ff::1", "fc00:0:ff::2", 49152, 77, payload_len=1024)
    spray = P.roce_frame("fc00:0:ff::1", "fc00:0:ff::3", 49152, 78, payload_len=1024)
    egress = gpu.prog_fd("egress")
    if prog_test_run(egress, qp).retval != TC_ACT_REDIRECT:       # places the QP
        raise SystemExit("ports mode: the QP was not redirected to a port: the setup is wrong")
    # the program only rewrites MACs, which a redirect leaves the same: repeats are alike
    cases = [("TC parse+redirect", redirect, qp), ("rlbhost ports (placed QP)", egress, qp),
             ("rlbhost ports (spray)", egress, spray)]
    return ns_per_packet([(name, fd, frame, TC_ACT_REDIRECT) for name, fd, frame in cases],
                         repeat, rounds)


def report(args, results, now, record):
    print(f"BPF_PROG_TEST_RUN, {args.rounds} runs x {args.repeat} packets per case (median of runs)"
          + (f", medians of {args.runs} measurements" if args.runs > 1 else "") + ", "
          f"1024-byte RoCEv2 payload; ratios against the group's reference in this run, and as "
          f"{compared_with()} record in bench/{RECORD.name}")
    for g, cases in results.items():
        print(f"\n{g + ' (x ' + REFERENCES[g] + ')':<44}{'ns/pkt':>8}{'ratio':>8}{'recorded':>10}{'change':>8}")
        for c, v in cases.items():
            r, old = now[g][c], record.get(g, {}).get(c)
            flag = "  REGRESSED" if old and r > old * WARN else ""
            rec = f"{old:>10.2f}{(r / old - 1) * 100:>+7.0f}%" if old else f"{'-':>10}{'':>8}"
            print(f"{c:<44}{v:>8.1f}{r:>8.2f}{rec}{flag}")
    print("\n" + over_line(now, record))


if __name__ == "__main__":
    sys.exit(main())
