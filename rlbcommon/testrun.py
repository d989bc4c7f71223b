"""Run a loaded BPF program on a packet without a network (BPF_PROG_TEST_RUN via libbpf)."""
from __future__ import annotations

import ctypes as ct
from dataclasses import dataclass

from .libbpf import TestRunOpts, check, lib

XDP_ABORTED, XDP_DROP, XDP_PASS, XDP_TX, XDP_REDIRECT = range(5)
XDP_VERDICTS = {0: "aborted", 1: "drop", 2: "pass", 3: "tx", 4: "redirect"}
TC_ACT_OK, TC_ACT_SHOT, TC_ACT_REDIRECT = 0, 2, 7


@dataclass
class RunResult:
    retval: int
    data: bytes
    duration_ns: int  # mean per repeat, as the kernel measures it


def prog_test_run(prog_fd: int, packet: bytes, repeat: int = 1, ctx: bytes | None = None,
             headroom: int = 256) -> RunResult:
    """Feed one packet to the program; returns its verdict and the packet as it left."""
    inbuf = ct.create_string_buffer(bytes(packet), len(packet))
    outbuf = ct.create_string_buffer(len(packet) + headroom)
    opts = TestRunOpts(sz=ct.sizeof(TestRunOpts), data_in=ct.cast(inbuf, ct.c_void_p),
                       data_out=ct.cast(outbuf, ct.c_void_p), data_size_in=len(packet),
                       data_size_out=len(outbuf), repeat=repeat)
    if ctx is not None:
        ctxbuf = ct.create_string_buffer(ctx, len(ctx))
        opts.ctx_in = ct.cast(ctxbuf, ct.c_void_p)
        opts.ctx_size_in = len(ctx)
    check(lib.bpf_prog_test_run_opts(prog_fd, ct.byref(opts)), "BPF_PROG_TEST_RUN")
    return RunResult(opts.retval, outbuf.raw[:opts.data_size_out], opts.duration)


BPF_F_TEST_XDP_LIVE_FRAMES = 1 << 1


class XdpMd(ct.Structure):
    _fields_ = [("data", ct.c_uint32), ("data_end", ct.c_uint32), ("data_meta", ct.c_uint32),
                ("ingress_ifindex", ct.c_uint32), ("rx_queue_index", ct.c_uint32),
                ("egress_ifindex", ct.c_uint32)]


def live_frames(prog_fd: int, frame: bytes, count: int, ifindex: int, batch: int = 0) -> None:
    """Run an XDP program `count` times on real frames received on `ifindex` (in the caller's
    network namespace): XDP_TX and XDP_REDIRECT really transmit. The kernel recycles the pages,
    so the program must rewrite every frame it sends (they come back as the receiver left them)."""
    inbuf = ct.create_string_buffer(bytes(frame), len(frame))
    md = XdpMd(data=0, data_end=len(frame), ingress_ifindex=ifindex)
    opts = TestRunOpts(sz=ct.sizeof(TestRunOpts), data_in=ct.cast(inbuf, ct.c_void_p),
                       data_size_in=len(frame), ctx_in=ct.cast(ct.pointer(md), ct.c_void_p),
                       ctx_size_in=ct.sizeof(md), repeat=count, flags=BPF_F_TEST_XDP_LIVE_FRAMES,
                       batch_size=batch)
    check(lib.bpf_prog_test_run_opts(prog_fd, ct.byref(opts)), "BPF_PROG_RUN (live frames)")
