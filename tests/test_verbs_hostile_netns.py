"""Local users who misbehave, against the real agent (`rlbhost attach`, its verbs service) in the
namespace lab of tests/test_verbs_netns.py: each gets a bounded, counted refusal, and a well-behaved
job's QPs on the same host are placed as before.

The hostile processes run as user nobody (65534); the socket's group is a group made for the test
(and removed after). Whose QP is whose is the kernel's word (rdma netlink's resource tracking); this
kernel has no RDMA, so the stand-in libibverbs keeps the table the agent reads instead
(tests/verbs_tools.py qp_table), as the kernel would: each QP under the thread that made it."""
from __future__ import annotations

import grp
import json
import os
import socket
import stat
import subprocess
import sys
import time

import pytest

from rlbcommon import filelock
from rlbhost.verbs import protocol as P
from rlbhost.verbs import service as S
from rlbhost.verbs.clients import MAX_CLIENTS_PER_UID
from rlbhost.verbs.peerlink import NOTIFY_FOR_NS
from rlbhost.verbs.paths import socket_path

from .test_verbs_netns import App, VLab, agreed, pair, split, verbs_lab, wait_for
from .verbs_tools import kernel_drops, kernel_has, qp_table

pytestmark = pytest.mark.netns
GROUP = "rlbtest-verbs"
NOBODY = 65534


@pytest.fixture(scope="module")
def v(tmp_path_factory):
    subprocess.run(["groupadd", "--system", GROUP], capture_output=True)
    try:
        yield from verbs_lab(tmp_path_factory, "rlbvh", "--verbs-group", GROUP)
    finally:
        subprocess.run(["groupdel", GROUP], capture_output=True)


def nobody(code: str, *args: str, groups: bool = True) -> list[str]:
    """The command that runs Python code as nobody (with the socket's group, or none), with room
    for 4096 files."""
    gid = grp.getgrnam(GROUP).gr_gid
    return ["prlimit", "--nofile=4096:4096", "setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}",
            f"--groups={gid}" if groups else "--clear-groups", sys.executable, "-c",
            "import json, os, socket, sys, time\n" + code, *args]


def as_nobody(code: str, *args: str, groups: bool = True, timeout: float = 60) -> dict:
    """Run it; it prints one JSON line, returned."""
    r = subprocess.run(nobody(code, *args, groups=groups), capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


def counters(v: VLab, host: int) -> dict:
    time.sleep(1.2)                          # the status file is written every second
    return v.status(host)["counters"]


def placed_as_before(v: VLab):
    """A well-behaved job of root's: 8 QPs, both ends on one path each, 2 a path, within budget."""
    a, b = pair(v, 8, None)
    try:
        assert split(agreed(a, b)) == {1: 2, 2: 2, 3: 2, 4: 2}
    finally:
        a.close(), b.close()
    wait_for("the QPs gone", lambda: not v.rows(1) and not v.rows(2))


CONNECT = """
path, n = sys.argv[1], int(sys.argv[2])
held, refused = [], 0
for _ in range(n):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        s.connect(path)
        held.append(s)
    except PermissionError:
        print(json.dumps({"denied": True}))
        sys.exit(0)
time.sleep(2.5)                       # the agent has read every connection by now
for s in held:                        # a connection the agent closed reads as its end
    s.setblocking(False)
    try:
        if s.recv(64) == b"":
            refused += 1
    except BlockingIOError:
        pass
    except OSError:
        refused += 1
print(json.dumps({"denied": False, "connected": len(held), "closed_by_agent": refused}))
"""


def test_verbs_hostile_a_user_outside_the_group_cannot_reach_the_socket(v):
    path = socket_path(v.lab.h[1])
    st = os.stat(path)
    assert stat.S_IMODE(st.st_mode) == 0o660 and st.st_uid == 0
    assert st.st_gid == grp.getgrnam(GROUP).gr_gid
    assert as_nobody(CONNECT, str(path), "1", groups=False) == {"denied": True}
    assert as_nobody(CONNECT, str(path), "1")["connected"] == 1


def test_verbs_hostile_2000_idle_connections_are_capped_per_user(v):
    """nobody opens 2000 connections and says nothing: it is held to its share, the rest closed
    and counted, and root's job connects and is placed as before."""
    before = counters(v, 1)
    got = as_nobody(CONNECT, str(socket_path(v.lab.h[1])), "2000")
    after = counters(v, 1)
    assert got["connected"] == 2000                      # the backlog takes them: the agent decides
    assert got["closed_by_agent"] == 2000 - MAX_CLIENTS_PER_UID
    assert after["refused_clients"] - before["refused_clients"] == 2000 - MAX_CLIENTS_PER_UID
    placed_as_before(v)                                  # (nobody's connections are gone with it)
    # none left: the status is written every STATUS_EVERY_S, so the job's own last connection
    # can still be in the one read just after it ended
    wait_for("no connection left", lambda: v.status(1)["clients"] == 0, timeout=S.STATUS_EVERY_S + 2)


def test_verbs_hostile_an_agents_cap_on_a_question_is_its_verbs_max_timeout_ms(v):
    """Started with --verbs-max-timeout-ms 400, an agent gives up a question that asks 60 s of a
    peer whose agent is stopped after 0.4 s (answered keep), not after the default 2 s."""
    args = v.agent_args
    v.lab.kill_agent(2)
    v.lab.kill_agent(1)
    v.agent_args = (*args, "--verbs-max-timeout-ms", "400")
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        v.start(1)
        s.connect(str(socket_path(v.lab.h[1])))
        s.send(f"HELLO {P.VERSION} {os.getpid()} 0".encode())
        assert s.recv(P.MSG_MAX).startswith(b"HELLO")
        kernel_has(v.sysfs[1], 0x900, os.getpid())
        s.send(b"INIT stub0 1 2304")
        now = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
        s.send(f"RTR 1 stub0 1 {0x900} {v.gid[1][1]} {v.lab.base(1)} {v.lab.base(2)} {0xa00} "
               f"{now + 60 * 10**9} {60 * 10**9}".encode())
        s.settimeout(10)
        answer = s.recv(P.MSG_MAX).decode()
        took = (time.clock_gettime_ns(time.CLOCK_MONOTONIC) - now) / 1e9
        print(f"a 60 s question to a stopped peer, the agent's cap 400 ms: {answer!r} after {took:.3f} s")
        assert answer.startswith("KEEP ") and 0.35 <= took < 1.2, (answer, took)
    finally:
        s.close()
        kernel_drops(v.sysfs[1], 0x900)
        v.agent_args = args
        v.lab.kill_agent(1)
        v.start(1)
        v.start(2)


def test_verbs_hostile_deadlines_far_off_are_worked_on_for_2_s_at_most(v):
    """256 questions with 11-day deadlines to a peer whose agent is stopped: the agent gives them
    up 2 s later (answered keep), and stops sending their questions to the peer."""
    before = counters(v, 1)
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    s.connect(str(socket_path(v.lab.h[1])))
    v.lab.kill_agent(2)
    try:
        s.send(f"HELLO {P.VERSION} {os.getpid()} 0".encode())
        assert s.recv(P.MSG_MAX).startswith(b"HELLO")
        ours, theirs = v.lab.base(1), v.lab.base(2)
        now = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
        far = now + 11 * 86400 * 10**9
        for i in range(256):
            kernel_has(v.sysfs[1], 0x700 + i, os.getpid())      # this process's QPs, as the kernel says
            s.send(f"INIT stub0 1 {0x700 + i}".encode())
            s.send(f"RTR {i + 1} stub0 1 {0x700 + i} {v.gid[1][1]} {ours} {theirs} {0x800 + i} {far} "
                   f"{60 * 10**9}".encode())
        s.settimeout(5)
        answers = [s.recv(P.MSG_MAX).decode() for _ in range(256)]
        took = (time.clock_gettime_ns(time.CLOCK_MONOTONIC) - now) / 1e9
        assert all(a.startswith("KEEP ") for a in answers) and took < S.MAX_TIMEOUT_NS / 1e9 + 5   # (not 11 days)
        # and the peer is told (USED) for NOTIFY_FOR_NS, less and less often: then nothing is pending
        wait_for("nothing pending", lambda: v.status(1)["pending"] == 0, timeout=NOTIFY_FOR_NS / 1e9 + 3)
        resent = counters(v, 1)["resent"] - before["resent"]
        print(f"256 questions with 11-day deadlines: answered keep in {took:.2f} s, {resent} messages sent again")
        assert resent < 256 * 80
    finally:
        s.close()
        for i in range(256):
            kernel_drops(v.sysfs[1], 0x700 + i)
        v.start(2)
    wait_for("the questions' QPs gone", lambda: not v.rows(1))


SQUAT = """
path, version, first, n, sgid_index, ours, theirs = sys.argv[1:8]
first, n = int(first, 0), int(n)
s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
s.connect(path)
s.send(("HELLO %s %d 0" % (version, os.getpid())).encode())
s.recv(4096)
seq = 0
for line in sys.stdin:                # each line: claim the QP numbers and ask a path for each
    answers = []
    for q in range(first, first + n):
        seq += 1
        s.send(("INIT stub0 1 %d" % q).encode())
        s.send(("RTR %d stub0 1 %d %s %s %s %d %d 1000000000" % (seq, q, sgid_index, ours, theirs, q + 0x100,
                time.clock_gettime_ns(time.CLOCK_MONOTONIC) + 10**9)).encode())
        answers.append(s.recv(4096).decode().split()[0])
    print(json.dumps({"answers": answers}), flush=True)
"""


def test_verbs_hostile_squatting_another_users_qp_numbers_gets_nothing(v):
    """QP numbers are predictable. nobody claims root's job's numbers before the job makes its QPs
    (the kernel has no such QPs) and again after (the kernel says the job's thread made them), and
    stays connected: every claim is refused and counted, and the job is placed as before. Without
    the kernel's word the first claim held the numbers and the job was refused as foreign."""
    before = counters(v, 1)
    squat = subprocess.Popen(nobody(SQUAT, str(socket_path(v.lab.h[1])), str(P.VERSION), "0x100", "8",
                                    str(v.gid[1][1]), v.lab.base(1), v.lab.base(2)),
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def claim() -> list[str]:
        squat.stdin.write("go\n")
        squat.stdin.flush()
        return json.loads(squat.stdout.readline())["answers"]

    try:
        assert claim() == ["KEEP"] * 8                      # before: no such QPs
        a = App(v, 1, 8, 0x100, 0x200)                       # the job's QPs made, at INIT
        assert claim() == ["KEEP"] * 8                      # after: the job's
        b = App(v, 2, 8, 0x200, 0x100)
        try:
            for app in (a, b):
                app.p.stdin.write("go\n")
                app.p.stdin.flush()
            a.out = [a.p.stdout.readline() for _ in range(8)]
            b.out = [b.p.stdout.readline() for _ in range(8)]
            assert split(agreed(a, b)) == {1: 2, 2: 2, 3: 2, 4: 2}
        finally:
            a.close(), b.close()
    finally:
        squat.stdin.close()
        squat.wait(timeout=10)
    after = counters(v, 1)
    # each claim is an INIT and a question, each refused: 8 QPs x 2 before, and as many after
    assert after["unknown_qps"] - before["unknown_qps"] == 16
    assert after["foreign_qps"] - before["foreign_qps"] == 16
    text = v.lab.cli(1, "verbs", "status")
    assert f"QP owners: the table in {qp_table(v.sysfs[1])}: devices stub0;" in text, text
    wait_for("the QPs gone", lambda: not v.rows(1) and not v.rows(2))


def test_verbs_hostile_a_qp_the_kernel_no_longer_has_is_let_go(v):
    """Two QPs placed, then gone from the kernel's table while their process lives on and says
    nothing (its GONE lost, or never sent): the agent lets them go at its next look (every
    second), their decisions with them, and counts them."""
    before = counters(v, 1)
    a, b = pair(v, 2, None)
    try:
        agreed(a, b)
        assert sorted(r["qp"] for r in v.rows(1)) == [0x100, 0x101]
        t0 = time.monotonic()
        for q in (0x100, 0x101):
            kernel_drops(v.sysfs[1], q)
        wait_for("let go", lambda: not v.rows(1), timeout=5)
        took = time.monotonic() - t0
        print(f"2 QPs gone from the kernel: let go after {took:.2f} s")
        assert a.p.poll() is None                           # the process lives: nothing was said
        assert len(v.rows(2)) == 2                          # the peer's QPs are the peer's
    finally:
        a.close(), b.close()
    assert counters(v, 1)["released_qps"] - before["released_qps"] == 2
    wait_for("the QPs gone", lambda: not v.rows(2))


NEVER_READS = """
path, n = sys.argv[1], int(sys.argv[2])
s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
s.connect(path)
s.setblocking(False)
s.send(("HELLO %s %d 0" % (sys.argv[3], os.getpid())).encode())
sent = 0
for i in range(n):                    # questions about a pair that is not the fabric's: answered
    try:                              # at once, into a socket this process never reads
        s.send(("RTR %d stub0 1 %d 0 fc00::1 fc00::2 1 %d 1000000000" % (i + 1, 0x900 + i,
                time.clock_gettime_ns(time.CLOCK_MONOTONIC) + 10**9)).encode())
        sent += 1
    except BlockingIOError:
        time.sleep(0.001)
time.sleep(3)
print(json.dumps({"sent": sent}))
"""


def test_verbs_hostile_a_process_that_never_reads_its_answers_stalls_nobody(v):
    """nobody asks 20000 questions and reads no answer (its socket fills): the agent's sends to it
    fail at once, and root's job alongside is placed as before."""
    p = subprocess.Popen(nobody(NEVER_READS, str(socket_path(v.lab.h[1])), "20000", str(P.VERSION)),
                         stdout=subprocess.PIPE, text=True)
    try:
        time.sleep(0.5)
        t0 = time.monotonic()
        placed_as_before(v)
        assert time.monotonic() - t0 < 15
    finally:
        out, _ = p.communicate(timeout=60)
    assert json.loads(out)["sent"] > 1000


def test_verbs_hostile_the_map_locks_are_roots_alone(v):
    """The agents' lock files: 0600 in a 0700 directory, so no other user can take one and hold
    the agent's maps; and a lock held too long is reported, not waited on forever."""
    d = filelock.lock_dir()
    assert stat.S_IMODE(d.stat().st_mode) == 0o700
    locks = list(d.glob("*.lock"))
    assert locks and all(stat.S_IMODE(f.stat().st_mode) == 0o600 for f in locks)
    got = as_nobody("try:\n    open(sys.argv[1]).close(); print(json.dumps({'opened': True}))\n"
                       "except PermissionError:\n    print(json.dumps({'opened': False}))\n", str(locks[0]))
    assert got == {"opened": False}
    with filelock.held("rlbtest.lock"):
        child = subprocess.run([sys.executable, "-c", "from rlbcommon import filelock\n"
                                "try:\n    filelock.held('rlbtest.lock', timeout=0.3).__enter__()\n"
                                "except filelock.LockTimeout as e:\n    print('timeout:', e)\n"],
                               capture_output=True, text=True, timeout=30)
    assert child.stdout.startswith("timeout:") and "held by another process for 0.3 s" in child.stdout
    (d / "rlbtest.lock").unlink()
