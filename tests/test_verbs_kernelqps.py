"""The kernel's word on QPs (rlbhost/verbs/kernelqps.py): its constants against the installed
uapi headers, its reading of answers laid out as the kernel's nldev.c lays them out (built here
byte by byte, not with the module's own encoder), and the stand-in table the tests use."""
from __future__ import annotations

import os
import socket
import struct
import subprocess
import threading
import time
from pathlib import Path

from rlbhost.verbs import kernelqps as K

NAMES = ["NETLINK_RDMA", "RDMA_NL_NLDEV", "RDMA_NLDEV_CMD_GET", "RDMA_NLDEV_CMD_RES_QP_GET",
         "RDMA_NLDEV_ATTR_DEV_INDEX", "RDMA_NLDEV_ATTR_DEV_NAME", "RDMA_NLDEV_ATTR_PORT_INDEX",
         "RDMA_NLDEV_ATTR_RES_QP", "RDMA_NLDEV_ATTR_RES_QP_ENTRY", "RDMA_NLDEV_ATTR_RES_LQPN",
         "RDMA_NLDEV_ATTR_RES_PID", "RDMA_NLDEV_ATTR_RES_KERN_NAME"]
OURS = [K.NETLINK_RDMA, K.RDMA_NL_NLDEV, K.CMD_GET, K.CMD_RES_QP_GET, K.ATTR_DEV_INDEX, K.ATTR_DEV_NAME,
        K.ATTR_PORT_INDEX, K.ATTR_RES_QP, K.ATTR_RES_QP_ENTRY, K.ATTR_RES_LQPN, K.ATTR_RES_PID,
        K.ATTR_RES_KERN_NAME]


def test_the_constants_are_the_installed_headers(tmp_path):
    src = tmp_path / "c.c"
    src.write_text("#include <stdio.h>\n#include <linux/netlink.h>\n#include <rdma/rdma_netlink.h>\n"
                   "int main(void) {\n" + "".join(f'    printf("%d\\n", {n});\n' for n in NAMES) + "}\n")
    subprocess.run(["gcc", "-o", str(tmp_path / "c"), str(src)], check=True)
    got = [int(x) for x in subprocess.run([str(tmp_path / "c")], capture_output=True, text=True,
                                          check=True).stdout.split()]
    assert dict(zip(NAMES, got)) == dict(zip(NAMES, OURS))


def nla(kind: int, payload: bytes, nest: bool = False) -> bytes:
    """One attribute as the kernel's nla_put writes it (nested ones flagged as nla_nest_start does)."""
    n = 4 + len(payload)
    return struct.pack("=HH", n, kind | (0x8000 if nest else 0)) + payload + bytes(-n % 4)


def u32(kind: int, v: int) -> bytes:
    return nla(kind, struct.pack("=I", v))


def qp_entry(qpn: int, port: int | None, pid: int | None, kern: str | None = None) -> bytes:
    body = (u32(K.ATTR_PORT_INDEX, port) if port is not None else b"") + u32(K.ATTR_RES_LQPN, qpn) + \
        u32(22, 0x1234) + nla(26, b"\x03")          # RQPN and TYPE: read past, not used
    if pid is not None:
        body += u32(K.ATTR_RES_PID, pid)
    if kern is not None:
        body += nla(K.ATTR_RES_KERN_NAME, kern.encode() + b"\0")
    return body


def handle(index: int, name: str) -> bytes:
    return u32(K.ATTR_DEV_INDEX, index) + nla(K.ATTR_DEV_NAME, name.encode() + b"\0")


def test_a_dump_answer_gives_every_qp_of_its_table():
    table = nla(K.ATTR_RES_QP_ENTRY, qp_entry(0x11, 1, 4242), nest=True) + \
        nla(K.ATTR_RES_QP_ENTRY, qp_entry(0x12, None, None, kern="ib_core"), nest=True) + \
        nla(K.ATTR_RES_QP_ENTRY, qp_entry(0x13, 1, 7), nest=True)
    got = K.qps_of_message(handle(3, "mlx5_2") + nla(K.ATTR_RES_QP, table, nest=True))
    assert got == [K.KernelQp("mlx5_2", 0x11, 1, 4242), K.KernelQp("mlx5_2", 0x12, None, None),
                   K.KernelQp("mlx5_2", 0x13, 1, 7)]


def test_a_query_answer_gives_its_one_qp_beside_the_device():
    assert K.qps_of_message(handle(0, "rxe0") + qp_entry(0x2a, 1, 99)) == [K.KernelQp("rxe0", 0x2a, 1, 99)]


def test_truncated_or_odd_answers_give_what_is_whole_and_never_raise():
    whole = handle(0, "rxe0") + nla(K.ATTR_RES_QP, nla(K.ATTR_RES_QP_ENTRY, qp_entry(5, 1, 1), nest=True), nest=True)
    for cut in range(len(whole)):
        K.qps_of_message(whole[:cut])
    assert K.qps_of_message(b"") == [] and K.qps_of_message(b"\xff" * 7) == []


def test_a_thread_is_owned_by_its_process():
    """rdma netlink names the thread that made a QP (NCCL makes them in a proxy thread)."""
    tid, stop = {}, threading.Event()
    t = threading.Thread(target=lambda: (tid.setdefault("tid", threading.get_native_id()), stop.wait()))
    t.start()
    try:
        while "tid" not in tid:
            time.sleep(0.01)
        assert tid["tid"] != os.getpid() and K.tgid(tid["tid"]) == os.getpid()
    finally:
        stop.set(), t.join()
    ended = subprocess.Popen(["true"])
    ended.wait()
    assert K.tgid(ended.pid) is None                     # ended (and reaped): no owner


def test_the_stand_in_table_answers_as_the_kernel_would(tmp_path: Path):
    (tmp_path / "stub0").mkdir()
    (tmp_path / "stub1").mkdir()
    worker_tid = {}
    stop = threading.Event()
    t = threading.Thread(target=lambda: (worker_tid.setdefault("tid", threading.get_native_id()), stop.wait()))
    t.start()
    try:
        while "tid" not in worker_tid:
            time.sleep(0.01)
        (tmp_path / "stub0" / "11").write_text(f"{worker_tid['tid']}\n")     # made in a thread of ours
        ended = subprocess.Popen(["true"])
        ended.wait()
        (tmp_path / "stub1" / "11").write_text(f"{ended.pid}\n")              # its process has ended
        kq = K.KernelQps(K.ResDir(tmp_path), K.ResDir(tmp_path))
        assert kq.tracks("stub0") and kq.tracks("stub1") and not kq.tracks("mlx5_0")
        assert kq.owner("stub0", 0x11) == os.getpid()
        assert kq.owner("stub0", 0x12) == K.MISSING
        assert kq.owner("stub1", 0x11) == K.MISSING                # the kernel freed it with its process
        assert kq.owner("mlx5_0", 0x11) is None                     # not the kernel's device: no word
        before = time.monotonic()
        kq.look()
        began, seen = kq.seen
        assert seen == {"stub0": {0x11}, "stub1": {0x11}} and began >= before
    finally:
        stop.set()
        t.join()


def test_without_rdma_netlink_there_is_no_authority_and_no_refusal():
    kq = K.KernelQps(None)
    assert not kq.available and not kq.tracks("rxe0")
    kq.look()
    assert kq.owner("rxe0", 17) is None and kq.seen is None
    assert "what processes say" in kq.describe()


def test_opening_rdma_netlink_never_raises():
    got = K.RdmaNetlink.open()
    if os.path.exists("/sys/class/infiniband"):
        assert got is not None
        got.devices()
        got.close()
    else:                        # this kernel: no RDMA core, so no authority (the agent says so)
        assert got is None


def nlmsg(kind: int, seq: int, payload: bytes) -> bytes:
    n = 16 + len(payload)
    return struct.pack("=IHHII", n, kind, 0, seq, 0) + payload + bytes(-n % 4)


def test_answers_are_read_by_their_question_and_a_late_error_is_not_this_ones():
    """The reader over a socket pair standing in for the kernel: a late error for an earlier
    question is skipped, ENOENT for this one is 'no such QP', and a query's answer is its QP."""
    ours, kernel = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    nl = K.RdmaNetlink(ours)
    qtype = K.msg_type(K.CMD_RES_QP_GET)
    enoent = struct.pack("=i", -2) + bytes(16)
    kernel.send(nlmsg(2, 7, enoent) + nlmsg(qtype, 1, handle(0, "rxe0") + qp_entry(0x2a, 1, 99)))
    assert nl.qp(0, 0x2a) == K.KernelQp("rxe0", 0x2a, 1, 99)
    assert struct.unpack_from("=IHHII", kernel.recv(4096))[1:4] == (qtype, 0x1, 1)    # asked once, as a query
    kernel.send(nlmsg(2, 2, enoent))
    assert nl.qp(0, 0x2b) is None
    ours.close(), kernel.close()
