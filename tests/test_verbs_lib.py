"""librlbverbs.so against a stand-in libibverbs (no device): the verbs program linked against it and
the one that dlopens it and resolves every verb with dlvsym (as NCCL does) both reach the
wrappers; the application's addresses are kept whenever no good answer comes in time (no agent,
a silent one, a refused or stale answer) and never asked about for traffic that is not the
fabric's; the answer an agent gives is applied exactly, to a copy of the application's struct.

The agent here is a scripted socket server that answers as told, including wrongly: the real
agent, and two of them agreeing, are tests/test_verbs_netns.py."""
from __future__ import annotations

import ipaddress
import os
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest

from rlbhost.verbs import protocol as P

from .verbs_tools import app_env, app_lines, build_all, fake_sysfs, rtrs

A = {k: f"fc00:1:1:{k}::a" for k in range(1, 5)}        # this host, one address per path
B = {k: f"fc00:1:2:{k}::b" for k in range(1, 5)}        # the peer
BASE_GID = 2                                            # RoCE v2 GID of A[1] (fake_sysfs)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    return build_all(tmp_path_factory.mktemp("verbs-build"))


@pytest.fixture
def host(tmp_path):
    sysfs = tmp_path / "sys"
    return sysfs, fake_sysfs(sysfs, A)


class ScriptedAgent:
    """A SEQPACKET server speaking the agent's side of the protocol as `answer` says: answer(msg)
    returns the reply (bytes, a list of them, or None for silence)."""

    def __init__(self, path: Path, answer):
        self.path, self.answer = path, answer
        self.messages: list[str] = []
        self.arrived: list[int] = []    # when each message was read (CLOCK_MONOTONIC, as deadlines are)
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.sock.bind(str(path))
        self.sock.listen(8)
        self.stop = False
        self.open_conns = 0
        self.cond = threading.Condition()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        while not self.stop:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with self.cond:
                self.open_conns += 1
            threading.Thread(target=self._client, args=(conn,), daemon=True).start()

    def _client(self, conn):
        try:
            self._converse(conn)
        except OSError:                 # the library hung up while an answer was on its way
            pass
        finally:
            with self.cond:
                self.open_conns -= 1
                self.cond.notify_all()

    def _converse(self, conn):
        with conn:
            while True:
                data = conn.recv(P.MSG_MAX)
                if not data:
                    return
                text = data.decode()
                self.arrived.append(time.monotonic_ns())
                self.messages.append(text)
                if text.startswith("HELLO"):
                    conn.send(P.hello_reply([("stub0", 1)]))
                    continue
                out = self.answer(text)
                for reply in (out if isinstance(out, list) else [out] if out else []):
                    conn.send(reply)

    def kinds(self, kind: str) -> list[list[str]]:
        return [m.split() for m in self.messages if m.split()[0] == kind]

    def close(self):
        """Stop listening, once every library that connected has hung up and all it said is read."""
        with self.cond:
            self.cond.wait_for(lambda: self.open_conns == 0, timeout=10)
        self.stop = True
        self.sock.close()


def path_answer(text: str, path_of=lambda qpn: 1, index=lambda k: 2 * k, saddr=None):
    """Answer an RTR question with a path (per QP number)."""
    f = text.split()
    if f[0] != "RTR":
        return None
    k = path_of(int(f[4]))
    return P.path_reply(int(f[1]), k, index(k), saddr or A[k], B[k])


def run(built, how, tmp_path, sysfs, agent_socket, n=4, dgid=B[1], timeout=30, args=(), **env):
    log = tmp_path / "stub.log"
    log.unlink(missing_ok=True)
    r = subprocess.run([str(built.app(how)), str(n), str(BASE_GID), dgid, "0x200", *args],
                       env=app_env(built, sysfs, log, 0x100, agent_socket, **env),
                       capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, r.stdout + r.stderr
    return app_lines(r.stdout), rtrs(log), r.stderr


@pytest.mark.parametrize("how", ["linked", "dlopen"])
def test_verbs_without_an_agent_the_application_addresses_are_kept(built, how, tmp_path, host):
    sysfs, _ = host
    lines, got, err = run(built, how, tmp_path, sysfs, tmp_path / "no-agent.sock")
    assert got == {0x100 + i: (BASE_GID, B[1]) for i in range(4)}
    assert [ln["rc"] for ln in lines] == [0] * 4
    # the library did act (dlopen too): one line for the cause, not one per QP
    assert err.count("rlbverbs[") == 1 and "no agent answers" in err
    assert max(ln["ns"] for ln in lines) < 20e6        # a missing socket costs no wait


@pytest.mark.parametrize("how", ["linked", "dlopen"])
def test_verbs_the_agents_answer_is_applied_per_qp_to_a_copy(built, how, tmp_path, host):
    sysfs, v2 = host
    agent = ScriptedAgent(tmp_path / "agent.sock", lambda t: path_answer(t, lambda q: (q - 0x100) % 4 + 1))
    try:
        lines, got, err = run(built, how, tmp_path, sysfs, agent.path, n=8)
    finally:
        agent.close()
    assert got == {0x100 + i: (v2[i % 4 + 1], B[i % 4 + 1]) for i in range(8)}
    # the application's own struct is as it made it
    assert {(ln["sgid_index"], ln["dgid"]) for ln in lines} == {(BASE_GID, B[1])}
    assert err == ""
    # what the agent was told: each QP at INIT, each question, what each got, and its end
    # (each QP named by its device, port and number: numbers repeat across a server's devices)
    assert sorted((m[1], int(m[2]), int(m[3])) for m in agent.kinds("INIT")) == \
        [("stub0", 1, q) for q in range(0x100, 0x108)]
    rtr = agent.kinds("RTR")
    assert [(m[2], int(m[3]), int(m[4]), int(m[5]), m[6], m[7], int(m[8])) for m in rtr] == \
        [("stub0", 1, 0x100 + i, BASE_GID, A[1], B[1], 0x200 + i) for i in range(8)]
    assert [(m[1], int(m[2]), int(m[3]), int(m[4]), int(m[5])) for m in agent.kinds("USED")] == \
        [("stub0", 1, 0x100 + i, i % 4 + 1, 0) for i in range(8)]
    assert sorted(int(m[2]) for m in agent.kinds("GONE")) == list(range(0x100, 0x108))


def test_verbs_a_silent_agent_costs_two_waits_not_one_per_qp(built, tmp_path, host):
    sysfs, _ = host
    agent = ScriptedAgent(tmp_path / "agent.sock", lambda t: None)
    try:
        lines, got, err = run(built, "linked", tmp_path, sysfs, agent.path, n=6, RLB_VERBS_TIMEOUT_MS="300")
    finally:
        agent.close()
    assert got == {0x100 + i: (BASE_GID, B[1]) for i in range(6)}
    waits = [ln["ns"] / 1e6 for ln in lines]
    # one unanswered question may be a slow answer; two in a row are a stalled agent: the rest
    # of the second are not asked, nor waited for
    assert all(300 <= w < 3000 for w in waits[:2])
    assert max(waits[2:]) < 150
    assert "no answer in time" in err
    # every QP's question still goes, so that an agent that catches up keeps the pair at both ends
    # (never a path for the peer this end gave up on), but only the first two had time to wait
    rtr = [(int(m.split()[9]), at) for m, at in zip(agent.messages, agent.arrived) if m.startswith("RTR")]
    assert len(rtr) == 6
    assert all(deadline - at > 200_000_000 for deadline, at in rtr[:2])
    assert all(deadline <= at for deadline, at in rtr[2:])
    assert [int(m[5]) for m in agent.kinds("USED")] == [P.KEEP["timeout"]] * 6


def test_verbs_the_library_builds_and_answers_without_glibc_2_30s_clocklock(tmp_path, host):
    """RHEL 8's glibc (2.28) has no pthread_mutex_clocklock: built as there (strict warnings), the
    library takes its lock by the wall clock and answers as it does here."""
    sysfs, v2 = host
    old = build_all(tmp_path / "old-glibc", defines=("RLBV_NO_CLOCKLOCK",))
    syms = subprocess.run(["readelf", "-W", "--dyn-syms", str(old.lib)], capture_output=True, text=True).stdout
    assert "pthread_mutex_clocklock" not in syms and "pthread_mutex_timedlock" in syms
    agent = ScriptedAgent(tmp_path / "agent.sock", lambda t: path_answer(t, lambda q: 2))
    try:
        lines, got, err = run(old, "linked", tmp_path, sysfs, agent.path, n=3, RLB_VERBS_TIMEOUT_MS="2000")
    finally:
        agent.close()
    assert got == {0x100 + i: (v2[2], B[2]) for i in range(3)}, err


def test_verbs_wait_extends_a_question_up_to_its_bound_and_no_further(built, tmp_path, host):
    """An agent holding a question for the other end's word says WAIT: the library waits past its
    timeout for the answer, but never past rlbv_wait_ns() (RLBV_WAIT_MAX timeouts, at least
    RLBV_WAIT_MIN_MS), however far the WAIT asks."""
    sysfs, v2 = host
    timeout_ms = 200

    def answer(text):
        f = text.split()
        if f[0] != "RTR":
            return None
        seq, deadline, qpn = int(f[1]), int(f[9]), int(f[4])
        if qpn == 0x100:            # waits, and the answer comes at 2.5 timeouts: taken
            threading.Timer(2.5 * timeout_ms / 1000, lambda: conn_send(path_answer(text, lambda q: 3))).start()
            return P.wait_reply(seq, deadline + 3 * timeout_ms * 1_000_000)
        # asks for twice the bound: held to rlbv_wait_ns(), and nothing comes
        return P.wait_reply(seq, deadline + 2 * P.wait_ns(timeout_ms * 1_000_000))

    sent = []

    def conn_send(data):
        sent[0].send(data)

    class Agent(ScriptedAgent):
        def _converse(self, conn):
            sent.append(conn)
            super()._converse(conn)
    agent = Agent(tmp_path / "agent.sock", answer)
    try:
        lines, got, err = run(built, "linked", tmp_path, sysfs, agent.path, n=2, RLB_VERBS_TIMEOUT_MS=str(timeout_ms))
    finally:
        agent.close()
    assert got == {0x100: (v2[3], B[3]), 0x101: (BASE_GID, B[1])}
    waits = {ln["qpn"]: ln["ns"] / 1e6 for ln in lines}
    assert 2.4 * timeout_ms <= waits[0x100] < 3.5 * timeout_ms
    bound_ms = P.wait_ns(timeout_ms * 1_000_000) / 1e6        # RLBV_WAIT_MIN_MS: more than 4 timeouts here
    assert bound_ms * 0.95 <= waits[0x101] < bound_ms + timeout_ms


def test_verbs_an_answer_given_up_on_is_never_taken_for_the_next_question(built, tmp_path, host):
    sysfs, v2 = host

    def stale_first(text):
        f = text.split()
        if f[0] != "RTR":
            return None
        seq, qpn = int(f[1]), int(f[4])
        # the answer to an earlier question (path 4), then this question's own (path 2)
        return [P.path_reply(seq - 1, 4, v2[4], A[4], B[4]), P.path_reply(seq, 2, v2[2], A[2], B[2])] \
            if qpn > 0x100 else P.path_reply(seq, 2, v2[2], A[2], B[2])
    agent = ScriptedAgent(tmp_path / "agent.sock", stale_first)
    try:
        _, got, _ = run(built, "linked", tmp_path, sysfs, agent.path, n=3)
    finally:
        agent.close()
    assert got == {0x100 + i: (v2[2], B[2]) for i in range(3)}


def test_verbs_addresses_the_device_refuses_fall_back_to_the_applications(built, tmp_path, host):
    sysfs, v2 = host
    agent = ScriptedAgent(tmp_path / "agent.sock", lambda t: path_answer(t, lambda q: 3))
    try:
        lines, got, err = run(built, "linked", tmp_path, sysfs, agent.path, n=2, STUB_REFUSE=str(v2[3]))
    finally:
        agent.close()
    assert [ln["rc"] for ln in lines] == [0, 0]            # never a failure the application did not cause
    assert got == {0x100: (BASE_GID, B[1]), 0x101: (BASE_GID, B[1])}
    assert [int(m[5]) for m in agent.kinds("USED")] == [P.KEEP["refused"]] * 2
    assert "refused" in err


def test_verbs_an_answer_naming_a_gid_the_table_does_not_hold_is_not_applied(built, tmp_path, host):
    sysfs, v2 = host
    agent = ScriptedAgent(tmp_path / "agent.sock", lambda t: path_answer(t, lambda q: 3, saddr=A[2]))
    try:
        _, got, err = run(built, "linked", tmp_path, sysfs, agent.path, n=1)
    finally:
        agent.close()
    assert got == {0x100: (BASE_GID, B[1])}
    assert [int(m[5]) for m in agent.kinds("USED")] == [P.KEEP["gidchanged"]]


@pytest.mark.parametrize("answer", [b"PATH 1 x", b"KEEP 1 99", b"HELLO 1 -", b"nonsense"])
def test_verbs_a_malformed_answer_keeps_the_applications_addresses(built, tmp_path, host, answer):
    sysfs, _ = host
    agent = ScriptedAgent(tmp_path / "agent.sock", lambda t: answer if t.startswith("RTR") else None)
    try:
        lines, got, _ = run(built, "linked", tmp_path, sysfs, agent.path, n=1)
    finally:
        agent.close()
    assert got == {0x100: (BASE_GID, B[1])} and lines[0]["rc"] == 0


@pytest.mark.parametrize("dgid", ["fe80::2", "::ffff:10.0.0.2", "ff02::1"])
def test_verbs_traffic_that_is_not_the_fabrics_is_not_even_asked_about(built, tmp_path, host, dgid):
    sysfs, _ = host
    agent = ScriptedAgent(tmp_path / "agent.sock", lambda t: path_answer(t, lambda q: 2))
    try:
        _, got, err = run(built, "dlopen", tmp_path, sysfs, agent.path, n=2, dgid=dgid)
    finally:
        agent.close()
    assert {ipaddress.IPv6Address(v[1]) for v in got.values()} == {ipaddress.IPv6Address(dgid)}
    assert {v[0] for v in got.values()} == {BASE_GID}
    assert agent.kinds("RTR") == []
    if dgid.startswith(("::ffff:", "fe80:")):
        # NCCL's default (AF_INET) takes an IPv4-mapped GID on a NIC with IPv4 too, GID 0 (link-local)
        # on one without: left alone, but counted by the agent and said once, with the setting that
        # would change it
        keep = P.KEEP["ipv4" if dgid.startswith("::ffff:") else "linklocal"]
        assert [int(m[5]) for m in agent.kinds("USED")] == [keep] * 2
        assert err.count("rlbverbs[") == 1 and "NCCL_IB_ADDR_FAMILY=AF_INET6" in err
    else:
        assert agent.kinds("USED") == [] and err == ""


def test_verbs_off_in_the_environment_means_untouched(built, tmp_path, host):
    sysfs, _ = host
    agent = ScriptedAgent(tmp_path / "agent.sock", lambda t: path_answer(t, lambda q: 2))
    try:
        _, got, _ = run(built, "linked", tmp_path, sysfs, agent.path, n=2, RLB_VERBS="0")
    finally:
        agent.close()
    assert got == {0x100: (BASE_GID, B[1]), 0x101: (BASE_GID, B[1])}
    assert agent.messages == []


def test_verbs_address_handles_take_the_agents_path(built, tmp_path, host):
    sysfs, v2 = host

    def answer(text):
        f = text.split()
        return P.path_reply(int(f[1]), 4, v2[4], A[4], B[4]) if f[0] == "AH" else None
    agent = ScriptedAgent(tmp_path / "agent.sock", answer)
    log = tmp_path / "stub.log"
    try:
        r = subprocess.run([str(built.linked), "2", str(BASE_GID), B[1], "0", "ah"],
                           env=app_env(built, sysfs, log, 0x100, agent.path), capture_output=True, text=True,
                           timeout=30)
    finally:
        agent.close()
    assert r.returncode == 0, r.stderr
    ahs = [ln.split() for ln in log.read_text().splitlines() if ln.startswith("AH ")]
    assert [(a[2], a[3]) for a in ahs] == [(f"sgid_index={v2[4]}", f"dgid={B[4]}")] * 2
    used = agent.kinds("AHUSED")
    assert [int(u[3]) for u in used] == [4, 4]
    assert sorted(int(u[2]) for u in used) == sorted(int(g[1]) for g in agent.kinds("AHGONE"))


def test_verbs_dlopen_of_other_libraries_keeps_the_callers_runpath(built, tmp_path):
    """dlopen is wrapped: every other library must still be found as the application would find
    it (its RUNPATH, $ORIGIN), which only a tail call to the real dlopen preserves."""
    (tmp_path / "sub").mkdir()
    (tmp_path / "foo.c").write_text("int foo(void) { return 42; }\n")
    (tmp_path / "main.c").write_text(
        '#include <dlfcn.h>\n#include <stdio.h>\nint main(void) { void *h = dlopen("libfoo.so", RTLD_NOW);\n'
        'if (!h) { puts(dlerror()); return 1; } int (*f)(void) = dlsym(h, "foo"); printf("%d\\n", f()); return 0; }\n')
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(tmp_path / "sub" / "libfoo.so"), str(tmp_path / "foo.c")],
                   check=True)
    subprocess.run(["gcc", "-o", str(tmp_path / "main"), str(tmp_path / "main.c"), "-ldl",
                    "-Wl,--enable-new-dtags,-rpath,$ORIGIN/sub"], check=True)
    env = {"PATH": os.environ["PATH"], "LD_PRELOAD": str(built.lib)}
    r = subprocess.run([str(tmp_path / "main")], env=env, capture_output=True, text=True)
    assert (r.returncode, r.stdout.strip()) == (0, "42"), r.stdout + r.stderr


def test_verbs_the_decision_table_is_laid_out_and_hashed_alike_in_the_agent_and_the_library(built, tmp_path):
    """The agent writes the table in Python, the library reads it in C: the record's layout and
    the slot of a key must be the same on both sides, and what the agent writes reads back."""
    import ctypes
    import struct
    from rlbhost.verbs import table as T
    lib = ctypes.CDLL(str(built.lib))
    lib.rlb_verbs_record_layout.restype = ctypes.c_char_p
    lib.rlb_verbs_slot.restype = ctypes.c_uint32
    lib.rlb_verbs_slot.argtypes = [ctypes.c_uint32, ctypes.c_uint32, ctypes.c_uint32, ctypes.c_char_p]
    lib.rlb_verbs_device.restype = ctypes.c_uint32
    lib.rlb_verbs_device.argtypes = [ctypes.c_char_p, ctypes.c_int]
    head, size, *offsets = map(int, lib.rlb_verbs_record_layout().split())
    assert (head, size) == (T.HEAD.size, T.RECORD.size)
    fields = ["I", "I", "I", "I", "I", "8s", "H", "H", "I", "16s", "16s"]       # T.RECORD, field by field
    assert "<" + "".join(fields) == T.RECORD.format.replace("5I", "IIIII")
    assert offsets == [struct.calcsize("<" + "".join(fields[:i])) for i in range(len(fields))]
    devices = [("rxe0", 1), ("rxe1", 1), ("mlx5_0", 1), ("mlx5_0", 2), ("rocep1s0f0", 1)]
    assert [lib.rlb_verbs_device(d.encode(), p) for d, p in devices] == [T.device(d, p) for d, p in devices]
    assert len({T.device(d, p) for d, p in devices}) == len(devices)
    for key in [(T.device("rxe0", 1), 0x11, 0x12, bytes(range(8))), (0, 0xFFFFFF, 0, b"\xff" * 8),
                (0xFFFFFFFF, 256, 512, b"\x52\x4c\xff\xfe\0\6\2\0")]:
        assert lib.rlb_verbs_slot(*key) == T.slot(*key)
    t = T.DecisionTable(tmp_path / "t")
    # two devices' QP 0x11 towards the same peer QP: two records, each found under its own device
    assert t.put("rxe0", 1, 0x11, 0x12, "fc00:1:2:3::b", 3, 6, 0, "fc00:1:1:3::a", "fc00:1:2:3::b")
    assert t.put("rxe1", 1, 0x11, 0x12, "fc00:1:2:3::b", 2, 4, 0, "fc00:2:1:2::a", "fc00:1:2:2::b")
    for dev, want in (("rxe0", (3, 6, 0)), ("rxe1", (2, 4, 0))):
        d = T.device(dev, 1)
        off = T.HEAD.size + T.slot(d, 0x11, 0x12, T.iid_of("fc00:1:2:1::b")) * T.RECORD.size
        rec = T.RECORD.unpack_from(t.map, off)
        assert rec[0] % 2 == 0 and rec[1:9] == (T.LIVE, d, 0x11, 0x12, T.iid_of("fc00::b"), *want)
    t.remove("rxe0", 1, 0x11, 0x12, "fc00:1:2:1::b")
    off = T.HEAD.size + T.slot(T.device("rxe0", 1), 0x11, 0x12, T.iid_of("fc00::b")) * T.RECORD.size
    assert T.RECORD.unpack_from(t.map, off)[1] == T.REMOVED
    t.close()


def test_verbs_a_table_of_another_layout_is_replaced_by_rename_never_rewritten_under_its_readers(tmp_path):
    """A job that mapped the file an older agent wrote keeps reading what it mapped: the new agent
    puts a new file in its place; a file of this layout is reused (records and all) on restart."""
    import mmap
    from rlbhost.verbs import table as T
    old = tmp_path / "t"
    old.write_bytes(b"\x01" * 4096)                      # another layout (an older release's)
    with open(old, "rb") as f:
        reader = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)
    t = T.DecisionTable(old)
    assert reader[:] == b"\x01" * 4096                    # untouched under its reader
    assert os.stat(old).st_size == T.DecisionTable.SIZE and stat_mode(old) == 0o644
    assert t.put("rxe0", 1, 0x11, 0x12, "fc00:1:2:3::b", 3, 6)
    t.close()
    ino = os.stat(old).st_ino
    again = T.DecisionTable(old)                          # the same layout: the same file
    assert os.stat(old).st_ino == ino and again.map[:T.HEAD.size] == T.HEAD.pack(*T.DecisionTable.HEAD_NOW)
    again.close()
    reader.close()


def test_verbs_a_tables_record_is_fenced_step_by_step_where_cpus_may_reorder_stores(tmp_path, monkeypatch):
    """Where CPUs may show each other a record's stores out of order (aarch64), each step of a
    write is fenced with libatomic's release fence (the real one, watched here): the count odd
    before any of the body, the whole body before the count even. x86 needs no fence; a weak
    machine without libatomic gets no table (the agent answers every pair itself)."""
    from rlbhost.verbs import table as T
    fence = T.release_fence()
    assert fence is not None                          # libatomic1 comes with gcc, which builds the library
    peer = "fc00:1:2:3::b"
    off = T.HEAD.size + T.slot(T.device("rxe0", 1), 0x11, 0x12, T.iid_of(peer)) * T.RECORD.size
    seen = []

    def watched():
        fence()
        rec = T.RECORD.unpack_from(t.map, off)
        seen.append((rec[0], rec[1], rec[6]))

    t = T.DecisionTable(tmp_path / "t", fence=watched, in_order=False)
    t.clear()
    assert t.put("rxe0", 1, 0x11, 0x12, peer, 3, 6)
    # (seq, state, path) at each fence: odd with the old body, then odd with the new one
    assert seen == [(1, T.EMPTY, 0), (1, T.LIVE, 3)], seen
    assert T.RECORD.unpack_from(t.map, off)[:2] == (2, T.LIVE)
    t.remove("rxe0", 1, 0x11, 0x12, peer)
    assert seen[2:] == [(3, T.LIVE, 3), (3, T.REMOVED, 0)] and T.RECORD.unpack_from(t.map, off)[0] == 4
    t.close()
    assert T.DecisionTable(tmp_path / "u", in_order=False).fence is not None
    assert T.STORES_IN_ORDER and T.DecisionTable(tmp_path / "v").fence is None     # this x86 machine
    monkeypatch.setattr(T, "release_fence", lambda: None)
    with pytest.raises(T.NoFence, match="libatomic"):
        T.DecisionTable(tmp_path / "w", in_order=False)


def stat_mode(path) -> int:
    return os.stat(path).st_mode & 0o777


def test_verbs_the_library_exports_the_wrapped_verbs_and_dlopen_in_their_versions(built):
    out = subprocess.run(["objdump", "-T", str(built.lib)], capture_output=True, text=True, check=True).stdout
    exported = {(f[-1], f[-2]) for f in (ln.split() for ln in out.splitlines())
                if len(f) >= 7 and f[2] == "DF" and f[3] == ".text"}
    assert exported == {("ibv_modify_qp", "IBVERBS_1.1"), ("ibv_destroy_qp", "IBVERBS_1.1"),
                        ("ibv_create_ah", "IBVERBS_1.1"), ("ibv_destroy_ah", "IBVERBS_1.1"),
                        ("dlopen", "GLIBC_2.34"), ("dlopen", "(GLIBC_2.2.5)"),
                        ("rlb_verbs_keep_name", "RLB_VERBS_1"), ("rlb_verbs_slot", "RLB_VERBS_1"),
                        ("rlb_verbs_device", "RLB_VERBS_1"),
                        ("rlb_verbs_record_layout", "RLB_VERBS_1")}


def test_verbs_every_keep_reason_has_a_name_in_the_library(built):
    import ctypes
    lib = ctypes.CDLL(str(built.lib))
    lib.rlb_verbs_keep_name.restype = ctypes.c_char_p
    names = [lib.rlb_verbs_keep_name(v) for v in sorted(P.KEEP.values())]
    assert all(names) and len(set(names)) == len(P.KEEP)
    assert lib.rlb_verbs_keep_name(len(P.KEEP)) is None


@pytest.mark.parametrize("how", ["preload", "NCCL_IBVERBS_LIB"])
def test_verbs_a_dlopened_libibverbs_resolves_the_wrapped_verbs_to_the_library(built, tmp_path, how):
    """What dlsym/dlvsym find in the handle: the four wrapped verbs in librlbverbs.so, every other
    verb in libibverbs itself; whether the program dlopens libibverbs under LD_PRELOAD, or opens
    the library given in libibverbs' place (NCCL_IBVERBS_LIB) with nothing preloaded."""
    (tmp_path / "resolve.c").write_text(r'''
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
int main(int argc, char **argv) {
    void *h = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    if (!h) { puts(dlerror()); return 1; }
    const char *names[] = {"ibv_modify_qp", "ibv_destroy_qp", "ibv_create_ah", "ibv_destroy_ah",
                           "ibv_query_gid", "ibv_open_device", "ibv_create_qp"};
    for (int i = 0; i < 7; i++) {
        Dl_info v, s;
        void *f = dlvsym(h, names[i], "IBVERBS_1.1"), *g = dlsym(h, names[i]);
        if (!f || !g || !dladdr(f, &v) || !dladdr(g, &s)) { printf("%s missing\n", names[i]); return 1; }
        printf("%s %s %s\n", names[i], v.dli_fname, s.dli_fname);
    }
    return 0;
}
''')
    subprocess.run(["gcc", "-o", str(tmp_path / "resolve"), str(tmp_path / "resolve.c"), "-ldl"], check=True)
    env = {"PATH": os.environ["PATH"], "LD_LIBRARY_PATH": str(built.stub_dir)}
    if how == "preload":
        env["LD_PRELOAD"], target = str(built.lib), "libibverbs.so.1"
    else:
        target = str(built.lib.parent / "librlbverbs-ibverbs.so")
    r = subprocess.run([str(tmp_path / "resolve"), target], env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    found = {f[0]: {Path(f[1]).name, Path(f[2]).name} for f in (ln.split() for ln in r.stdout.splitlines())}
    wrapped = {"ibv_modify_qp", "ibv_destroy_qp", "ibv_create_ah", "ibv_destroy_ah"}
    assert found == {n: {"librlbverbs.so"} if n in wrapped else {"libibverbs.so.1"} for n in found}
    assert len(found) == 7


def test_verbs_an_agent_silent_for_a_moment_is_asked_again_once_it_speaks(built, tmp_path, host):
    """The agent lets two questions time out (judged stalled: the next are not waited for), then
    answers again, the late-sent question included: the library asks it again from the next QP
    on, not a second later. One RTR every 20 ms: before, the 6 QPs after the two were all kept."""
    sysfs, v2 = host
    seen = []

    def answer(text):
        if not text.startswith("RTR"):
            return None
        seen.append(text)
        return None if len(seen) <= 2 else path_answer(text, lambda q: 3)

    agent = ScriptedAgent(tmp_path / "agent.sock", answer)
    try:
        lines, got, err = run(built, "linked", tmp_path, sysfs, agent.path, n=8, RLB_VERBS_TIMEOUT_MS="100",
                              args=("paced",))
    finally:
        agent.close()
    kept = {0x100 + i: (BASE_GID, B[1]) for i in range(3)}
    placed = {0x100 + i: (v2[3], B[3]) for i in range(3, 8)}
    assert got == {**kept, **placed}, err
    waits = [ln["ns"] / 1e6 for ln in lines]
    assert all(100 <= w < 1000 for w in waits[:2]) and waits[2] < 50
    assert [int(m.split()[5]) for m in agent.messages if m.startswith("USED")] == \
        [P.KEEP["timeout"]] * 3 + [0] * 5
