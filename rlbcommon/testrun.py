"""Run a loaded BPF program on a packet without a network (BPF_PROG_TEST_RUN via libbpf)."""
from __future__ import annotations

import ctypes as ct
from dataclasses import dataclass

from .libbpf import TestRunOpts, check, lib

XDP_ABORTED, XDP_DROP, XDP_PASS, XDP_TX, XDP_REDIRECT = range(5)
XDP_VERDICTS = {0: "aborted", 1: "drop", 2: "pass", 3: "tx", 4: "redirect"}
TC_ACT_OK, TC_ACT_SHOT = 0, 2


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
