"""What CPUs forwarding to one port cost each other in the switch program, on real packets.

    g0 (CPU a) -> in0 \\
                       [rlbswitch, pinned route] -> out0 -> s0 (sink)
    g1 (CPU b) -> in1 /

bench/wire_bench.py's chain with a second generator link: each generator is driven by
BPF_PROG_RUN + BPF_F_TEST_XDP_LIVE_FRAMES from a thread pinned to its own CPU, and veth NAPI runs
on the sending CPU, so CPU a forwards everything that enters in0 and CPU b everything that
enters in1, both to out0. The program's cost is the kernel's accounting (run_time_ns / run_cnt
over both CPUs, kernel.bpf_stats_enabled=1). Each round measures one CPU alone and then both at
once; a line of memory the program writes for every packet on both CPUs (an atomic counter of
the egress port) moves between their caches at every packet and shows as the difference.

    .venv/bin/python bench/xdp_cpus_bench.py [--packets 2000000] [--rounds 5]"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.wire_bench import DST, IN_MAC, STATS_SYSCTL, Chain, switch_on  # noqa: E402
from rlbcommon import netns  # noqa: E402
from rlbcommon.libbpf import prog_info  # noqa: E402
from rlbcommon.testrun import live_frames  # noqa: E402
from rlblab import topo  # noqa: E402


def send(chain: Chain, frame: bytes, packets: int, plan: list[tuple[int, int]]):
    """Each (CPU, generator ifindex) of `plan` sends `packets` at the same time."""
    start = threading.Barrier(len(plan))

    def worker(cpu: int, ifindex: int):
        os.sched_setaffinity(0, {cpu})
        with netns.inside(chain.gen):
            start.wait()
            live_frames(chain.gen_fd, frame, packets, ifindex)
    threads = [threading.Thread(target=worker, args=p) for p in plan]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def program_ns(chain: Chain, fd: int, frame: bytes, packets: int, plan) -> float:
    before = prog_info(fd)
    send(chain, frame, packets, plan)
    after = prog_info(fd)
    return (after.run_time_ns - before.run_time_ns) / max(1, after.run_cnt - before.run_cnt)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--packets", type=int, default=2_000_000, help="packets per CPU per run")
    ap.add_argument("--rounds", type=int, default=5, help="rounds (each: one CPU, then two; median taken)")
    args = ap.parse_args()
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        ap.error("needs two CPUs")
    if os.geteuid():
        ap.error("run as root (namespaces, XDP)")
    stats_was = STATS_SYSCTL.read_text().strip()
    STATS_SYSCTL.write_text("1")
    chain = Chain(128)
    try:
        topo.link(chain.gen, "g1", chain.fwd, "in1", "02:00:00:00:0a:03", IN_MAC)
        with netns.inside(chain.gen):
            g = [Chain._ifindex("g0"), Chain._ifindex("g1")]
        frame = chain.frame(DST["pinned"])
        chain.set_traffic(frame, 1)
        with switch_on(chain, ("in0", "in1"), outs=2) as (dp, _):
            one, two = [], []
            for _ in range(args.rounds):
                one.append(program_ns(chain, dp.prog_fd, frame, args.packets, [(cpus[0], g[0])]))
                two.append(program_ns(chain, dp.prog_fd, frame, args.packets,
                                      [(cpus[0], g[0]), (cpus[1], g[1])]))
    finally:
        chain.close()
        STATS_SYSCTL.write_text(stats_was)
    a, b = statistics.median(one), statistics.median(two)
    print(f"rlbswitch pinned, 128-byte frames, {args.packets} packets a CPU a run, median of {args.rounds} rounds")
    print(f"{'one CPU forwarding to out0':<40}{a:8.1f} ns/pkt   (runs: {', '.join(f'{x:.1f}' for x in one)})")
    print(f"{'two CPUs at once, both to out0':<40}{b:8.1f} ns/pkt   (runs: {', '.join(f'{x:.1f}' for x in two)})")
    print(f"{'two over one':<40}{b / a:8.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
