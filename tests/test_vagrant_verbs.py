"""Opt-in (RLB_VAGRANT=1, `make vagrant-test-verbs`): the verbs library over real RoCEv2 (Soft-RoCE,
Debian's kernel) in the Vagrant lab, as on hosts whose NICs build the packets.

The 2x2 fabric's hosts run the rlb-host unit (its verbs service answers on /run/rlb/verbs.sock)
and have librlbverbs.so installed the operator's way (`rlbhost verbs install`). Unmodified
perftest, and a program that dlopens libibverbs and resolves its verbs with dlvsym as NCCL does,
run with LD_PRELOAD on both sides: first with rlbhost's TC programs detached from both hosts
(their counters prove they saw nothing to rewrite), then attached as well; the spines' interface
counters must show the QPs split over both spines, the agents must show each QP on the same path
at both ends, and a leaf-spine cable pulled mid-transfer must not fail it."""
import os
import re
import time
from pathlib import Path

import pytest

from rlbfabric.fabric import load

from .test_vagrant_lab import ITERS, SIZE, base_gid, spine_bytes, vlab  # noqa: F401 (the lab fixture)

pytestmark = [pytest.mark.vagrant,
              pytest.mark.skipif(os.environ.get("RLB_VAGRANT") != "1", reason="opt-in: RLB_VAGRANT=1")]

LIB = "/usr/local/lib/rlb/librlbverbs.so"
RLBHOST = "/opt/rlb/venv/bin/rlbhost"
PORT = {"h1": "eth-l1", "h2": "eth-l2"}
# under software emulation an agent's answer can take a few hundred ms
PRELOAD = f"env LD_PRELOAD={LIB} RLB_VERBS_TIMEOUT_MS=1500 RLB_VERBS_LOG=2"


def reasons(lab, host) -> dict:
    return lab.json(host, f"{RLBHOST} status --json")["reasons"]


def verbs_status(lab, host) -> dict:
    """The agent's verbs service as it last wrote itself down (a file: the rlbhost command takes
    tens of seconds to start under software emulation)."""
    return lab.json(host, "cat /run/rlb/default-host-verbs.json")


def agent_decisions(lab, host) -> dict[int, tuple[int, int]]:
    """{QP: (peer QP, path)}: the agent's latest decision per QP of this host."""
    return {d["qp"]: (d["peer_qp"], d["path"]) for d in verbs_status(lab, host)["decisions"]}


def tc_filters(lab, host) -> str:
    port = PORT[host]
    return lab.sh(host, f"tc filter show dev {port} egress; tc filter show dev {port} ingress").stdout


def run_pair(lab, tmp_path, server_cmd: str, client_cmd: str, during=None, timeout=1800):
    """server on h2, client on h1 (towards h2's management address), both with the library;
    (output, spine byte deltas, {h1's QP: path}) once both ends' libraries and agents agree."""
    before = spine_bytes(lab)
    port = int(m[1]) if (m := re.search(r"-p (\d+)", server_cmd)) else 18515     # perftest's default
    server = lab.spawn("h2", f"{PRELOAD} {server_cmd}", tmp_path / "server.out")
    try:
        # the client starts once the server listens (a fixed wait was too short on a busy VM)
        lab.wait(f"perftest listens on h2:{port}", lambda: f":{port} " in lab.sh("h2", "ss -ltnH").stdout,
                 timeout=300, every=1)
        client = lab.spawn("h1", f"{PRELOAD} {client_cmd} {lab.vm('h2').mgmt_ip}", tmp_path / "client.out")
        if during:
            during()
        rc_client, rc_server = client.wait(timeout=timeout), server.wait(timeout=300)
    except BaseException:
        # a failed run leaves no perftest holding its port for the next test
        for vm in ("h1", "h2"):
            lab.sh(vm, "pkill -f 'ib_(write|send|read)_(bw|lat)' || true")
        raise
    c_out, s_out = (tmp_path / "client.out").read_text(), (tmp_path / "server.out").read_text()
    assert (rc_client, rc_server) == (0, 0), c_out + s_out
    after = spine_bytes(lab)
    logged = logged_paths(c_out, s_out)
    time.sleep(2)                                         # the agents write themselves down every second
    d1, d2 = agent_decisions(lab, "h1"), agent_decisions(lab, "h2")
    for qp, path in logged.items():                       # the agents' view is the libraries'
        peer_qp, p1 = d1[qp]
        assert p1 == path and d2[peer_qp] == (qp, path), (hex(qp), path, d1.get(qp), d2.get(peer_qp))
    for host in ("h1", "h2"):       # who made each QP was the kernel's word (rdma netlink on rxe0),
        st = verbs_status(lab, host)  # and it named every process that spoke as its QPs' owner
        assert st["qp_owners"].startswith("the kernel (rdma netlink)") and "rxe0" in st["qp_owners"], st["qp_owners"]
        assert (st["counters"].get("unknown_qps", 0), st["counters"].get("foreign_qps", 0)) == (0, 0), st["counters"]
    return c_out + s_out, {s: after[s] - before[s] for s in after}, logged


DECISION = re.compile(r"QP 0x([0-9a-f]+) on \S+: path (\d+), GID index \d+, peer \S+ \(QP 0x([0-9a-f]+)\)")


def logged_paths(client_out: str, server_out: str) -> dict[int, int]:
    """{client QP: path} from the libraries' own lines (RLB_VERBS_LOG=2), after checking that the
    server's end of each QP was given the same path."""
    c = {int(m[1], 16): (int(m[2]), int(m[3], 16)) for m in DECISION.finditer(client_out)}
    s = {int(m[1], 16): (int(m[2]), int(m[3], 16)) for m in DECISION.finditer(server_out)}
    for qp, (path, peer) in c.items():
        assert s.get(peer) == (path, qp), (hex(qp), path, hex(peer), s.get(peer))
    assert len(s) == len(c)
    return {qp: path for qp, (path, _) in c.items()}


def capacity_shares(n: int) -> dict[int, float]:
    """n QPs from l1 to l2 shared by path as the coordinator places them: by the capacity of the
    narrower of l1's uplink and l2's downlink (lab/fabric-2x2.toml: l1-s2 at half speed)."""
    fab = load(Path(__file__).resolve().parent.parent / "lab" / "fabric-2x2.toml")
    caps = {k: min(fab.link_mbps_between("l1", f"s{k}"), fab.link_mbps_between("l2", f"s{k}")) for k in (1, 2)}
    return {k: n * c / sum(caps.values()) for k, c in caps.items()}


def check_split(paths: dict[int, int], delta: dict[str, int]):
    """Each path within one QP of its capacity share, and the spines' bytes to match."""
    count = {k: sum(1 for p in paths.values() if p == k) for k in (1, 2)}
    share = capacity_shares(len(paths))
    assert all(abs(count[k] - share[k]) < 1 for k in (1, 2)), (count, share)
    total = sum(delta.values())
    assert total > 0 and all(abs(delta[f"s{k}"] / total - count[k] / len(paths)) < 0.1 for k in (1, 2)), \
        (delta, count)


def write_bw(qps: int, extra: str) -> str:
    return f"ib_write_bw -d rxe0 -i 1 -q {qps} -s {SIZE} -t 2 -F --report_gbits {extra}"


def test_verbs_write_bw_with_the_tc_programs_detached(vlab, tmp_path):
    for h, port in PORT.items():
        vlab.sh(h, f"{RLBHOST} detach {port}")
    try:
        for h in PORT:
            assert "rlb_host" not in tc_filters(vlab, h)
        tc_before = {h: reasons(vlab, h) for h in PORT}
        placed = {h: verbs_status(vlab, h)["counters"]["placed_rtr"] for h in PORT}
        cmd = write_bw(8, "-D 25")
        out, delta, paths = run_pair(vlab, tmp_path, f"{cmd} -x {base_gid(vlab, 'h2')}",
                                     f"{cmd} -x {base_gid(vlab, 'h1')}")
        print(f"-q 8, TC detached: spine bytes {delta}, paths {paths}\n{out}")
        check_split(paths, delta)
        assert sum(delta.values()) >= 8 * SIZE * 100
        assert re.search(rf"^\s*{SIZE}\s+\d+", out, re.M)
        for h in PORT:               # the TC programs saw nothing: nothing rewritten or restored
            after = reasons(vlab, h)
            assert after["rewritten"] == tc_before[h]["rewritten"]
            assert after["restored"] == tc_before[h]["restored"]
            assert verbs_status(vlab, h)["counters"]["placed_rtr"] >= placed[h] + 8
    finally:
        for h in PORT:
            vlab.sh(h, "systemctl restart rlb-host")
        for h in PORT:
            vlab.wait(f"{h}: TC attached again", lambda: "rlb_host" in tc_filters(vlab, h), timeout=300)


def test_verbs_write_bw_with_the_tc_programs_attached_too(vlab, tmp_path):
    tc_before = {h: reasons(vlab, h) for h in PORT}
    cmd = write_bw(8, "-D 25")
    out, delta, paths = run_pair(vlab, tmp_path, f"{cmd} -x {base_gid(vlab, 'h2')}",
                                 f"{cmd} -x {base_gid(vlab, 'h1')}")
    print(f"-q 8, TC attached: spine bytes {delta}, paths {paths}")
    check_split(paths, delta)
    for h in PORT:    # TC left the verbs QPs' packets as the NIC built them
        after = reasons(vlab, h)
        assert after["rewritten"] == tc_before[h]["rewritten"]
        assert after["restored"] == tc_before[h]["restored"]
        assert after["pass_app_chose"] > tc_before[h]["pass_app_chose"]


def test_verbs_send_bw(vlab, tmp_path):
    cmd = f"ib_send_bw -d rxe0 -i 1 -q 8 -s {SIZE} -t 2 -F --report_gbits -D 20"
    out, delta, paths = run_pair(vlab, tmp_path, f"{cmd} -x {base_gid(vlab, 'h2')}",
                                 f"{cmd} -x {base_gid(vlab, 'h1')}")
    print(f"ib_send_bw -q 8: spine bytes {delta}, paths {paths}")
    check_split(paths, delta)
    assert re.search(rf"^\s*{SIZE}\s+\d+", out, re.M)


def test_verbs_a_program_that_dlopens_libibverbs(vlab, tmp_path):
    src = "/opt/rlb/src/tests/verbs/rdma_pingpong.c"
    for h in PORT:
        vlab.sh(h, f"gcc -O2 -o /usr/local/bin/rdma_pingpong {src} -ldl")
    cmd = f"rdma_pingpong -d rxe0 -q 8 -n 300 -s {SIZE} -t 2"     # 2 outstanding, as perftest's -t 2
    out, delta, paths = run_pair(vlab, tmp_path, f"{cmd} -x {base_gid(vlab, 'h2')}",
                                 f"{cmd} -x {base_gid(vlab, 'h1')}")
    print(f"rdma_pingpong (dlopen + dlvsym) -q 8: spine bytes {delta}, paths {paths}\n{out}")
    assert out.count("pingpong: ok: 8 QPs, 300 messages of 16384 bytes each, 2400 checked good, 0 bad") == 2
    check_split(paths, delta)
    for h in PORT:
        assert verbs_status(vlab, h)["counters"]["disagreements"] == 0


def test_verbs_transfer_survives_a_pulled_leaf_spine_cable(vlab, tmp_path):
    marks = {}

    def cut():
        time.sleep(15)                                   # the QPs set up and sending
        marks["cut"] = spine_bytes(vlab)
        vlab.set_link("l1", "s2", up=False)
        time.sleep(8)
        marks["later"] = spine_bytes(vlab)

    cmd = write_bw(8, "-D 30")
    try:
        out, _, paths = run_pair(vlab, tmp_path, f"{cmd} -x {base_gid(vlab, 'h2')}",
                                 f"{cmd} -x {base_gid(vlab, 'h1')}", during=cut)
    finally:
        vlab.set_link("l1", "s2", up=True)
    moved = {s: marks["later"][s] - marks["cut"][s] for s in marks["cut"]}
    print(f"cable l1-s2 pulled under 8 verbs QPs {paths}: spine bytes in the 8 s after {moved}")
    assert 2 in paths.values()                           # QPs were on the path whose cable went
    assert re.search(rf"^\s*{SIZE}\s+\d+", out, re.M)
    # the pinned prefix of path 2 fell back to the leaf's DLB group: the QPs on it rode s1
    assert moved["s2"] < 0.1 * moved["s1"] and moved["s1"] > 50 * SIZE
