"""The verbs path selector on GPU servers of two NICs, each with an RDMA device of its own whose QP
numbers collide with the other's (Soft-RoCE numbers every device's QPs from the same start): two
servers behind a router, NIC i of each on its own prefixes (a rail each), one `rlbhost attach eth0
eth1` per server answering for both devices, the stand-in libibverbs giving each process one
device (STUB_DEVICE) and the same QP numbers on both. Each QP must get its own device's GID for its
path, both ends of every QP must agree, both devices' QPs must spread by weight over their own
NIC's paths, and nothing may be refused as another process's QP."""
from __future__ import annotations

import ipaddress
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from rlbfabric import addrplan
from rlbhost.verbs.paths import socket_path, table_path
from rlblab import topo
from rlblab.hostlab import HostLab

from .verbs_tools import Built, agent_env, app_env, app_lines, build_all, fake_sysfs, rtrs, table_lookup

pytestmark = pytest.mark.netns
KEY = bytes(range(16))
DEVS = ("stub0", "stub1")          # device i on NIC eth<i> of each server


@dataclass
class Rails:
    lab: HostLab
    built: Built
    sysfs: dict[int, Path]                   # server -> its fake /sys/class/infiniband
    gid: dict[tuple[int, int], dict[int, int]]   # (server, NIC) -> {path: RoCE v2 GID index}
    tmp: Path

    def status(self, host: int) -> dict:
        return json.loads(self.lab.cli(host, "verbs", "status", "--json"))


@pytest.fixture(scope="module")
def r(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("rails-verbs")
    built = build_all(tmp / "build")
    lab = HostLab("rlbrv", nics=2)
    try:
        lab.up()
        sysfs = {k: tmp / f"sys-h{k}" for k in (1, 2)}
        gid = {(k, i): fake_sysfs(sysfs[k], lab.addresses(k, i), dev=DEVS[i], netdev=lab.nic(i))
               for k in (1, 2) for i in (0, 1)}
        key = tmp / "fabric-key"
        key.write_text(KEY.hex() + "\n")
        key.chmod(0o600)
        for k in (1, 2):
            lab.start_agent(k, "--fabric-key", str(key), env=agent_env(sysfs[k]))
        yield Rails(lab, built, sysfs, gid, tmp)
    finally:
        lab.down()
    assert not [ns for ns in topo.list_ns() if ns.startswith("rlbrv-")]


class App:
    """verbs_app on one server's device `nic`: n QPs from `qpn` on, towards the other server's NIC
    `peer_nic`, QP dest + i."""

    def __init__(self, r: Rails, host: int, nic: int, peer_nic: int, n: int, qpn: int, dest: int):
        self.r, self.host, self.nic, self.n = r, host, nic, n
        self.log = r.tmp / f"stub-h{host}-{DEVS[nic]}-{time.monotonic_ns()}.log"
        dgid = r.lab.addresses(3 - host, peer_nic)[1]
        args = [str(r.built.linked), str(n), str(r.gid[(host, nic)][1]), dgid, hex(dest), "sync", "hold"]
        env = app_env(r.built, r.sysfs[host], self.log, qpn, socket_path(r.lab.h[host]),
                      STUB_DEVICE=DEVS[nic], RLB_VERBS_TIMEOUT_MS="1000")
        self.p = subprocess.Popen(["ip", "netns", "exec", r.lab.h[host], *args], env=env, stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert self.p.stdout.readline().strip() == "READY", self.p.stderr.read()

    def go(self):
        self.p.stdin.write("go\n")
        self.p.stdin.flush()

    def lines(self) -> list[dict]:
        return app_lines("".join(self.p.stdout.readline() for _ in range(self.n)))

    def got(self) -> dict[int, tuple[int, str]]:
        """{QP: (source GID index, destination)} as the device took them at RTR."""
        return rtrs(self.log)

    def close(self):
        if self.p.poll() is None:
            self.p.stdin.close()
            self.p.wait(timeout=20)


def wait_for(what, cond, timeout=10.0):
    deadline = time.time() + timeout
    while not cond():
        assert time.time() < deadline, f"timed out: {what}"
        time.sleep(0.1)


def path_of(r: Rails, host: int, nic: int, gid_index: int) -> int:
    """The path whose RoCE v2 GID index on that server's device this is (0: none of them)."""
    return next((k for k, i in r.gid[(host, nic)].items() if i == gid_index), 0)


def test_rails_verbs_each_device_s_colliding_qps_get_their_own_nics_paths_and_both_ends_agree(r):
    """Same-rail pairs (NIC 0 to NIC 0, NIC 1 to NIC 1) with the very same QP numbers on both
    devices of both servers: 8 QPs each, every one on its own device's GID for its path, both ends
    agreeing, 2 a path on each NIC, nothing refused."""
    before = {k: r.status(k)["service"]["counters"] for k in (1, 2)}
    apps = {(k, i): App(r, k, i, i, 8, 0x100 if k == 1 else 0x200, 0x200 if k == 1 else 0x100)
            for k in (1, 2) for i in (0, 1)}
    try:
        for a in apps.values():
            a.go()
        for a in apps.values():
            assert [ln["rc"] for ln in a.lines()] == [0] * 8
        for i in (0, 1):
            got1, got2 = apps[(1, i)].got(), apps[(2, i)].got()
            assert sorted(got1) == list(range(0x100, 0x108)) and sorted(got2) == list(range(0x200, 0x208))
            split: dict[int, int] = {}
            for q, (idx, dgid) in got1.items():
                k = path_of(r, 1, i, idx)
                assert k, f"QP 0x{q:x} on {DEVS[i]} kept its addresses or took another device's GID ({idx})"
                # the destination: the other server's NIC i on the same path
                assert dgid == r.lab.addresses(2, i)[k]
                idx2, dgid2 = got2[q + 0x100]
                assert path_of(r, 2, i, idx2) == k and dgid2 == r.lab.addresses(1, i)[k], (hex(q), k)
                split[k] = split.get(k, 0) + 1
            assert split == {1: 2, 2: 2, 3: 2, 4: 2}, (DEVS[i], split)
        for k in (1, 2):
            s = r.status(k)
            c = s["service"]["counters"]
            assert c["foreign_qps"] == before[k]["foreign_qps"] and c["disagreements"] == before[k]["disagreements"]
            # accounted per NIC: 8 verbs QPs on each, 2 a path
            per_path = {"1": 2, "2": 2, "3": 2, "4": 2}
            assert s["placed_per_nic"] == {"eth0": per_path, "eth1": per_path}
            st = json.loads(r.lab.cli(k, "status", "--json"))
            assert [(n["nic"], [p["verbs_qps"] for p in n["paths"]]) for n in st["nics"]] == \
                [("eth0", [2, 2, 2, 2]), ("eth1", [2, 2, 2, 2])]
        # the decision table holds each device's pair under its own device
        t2 = table_path(r.lab.h[2])
        for i in (0, 1):
            rec = table_lookup(t2, 0x200, 0x100, r.lab.base(1, i), dev=DEVS[i])
            assert rec is not None and path_of(r, 2, i, rec[1]) == rec[0]
    finally:
        for a in apps.values():
            a.close()
    wait_for("destroyed QPs leave both NICs", lambda: all(
        not json.loads(r.lab.cli(k, "qps", "--json")) for k in (1, 2)))


def test_rails_verbs_cross_rail_qps_leave_from_their_own_device_s_nic(r):
    """Device stub0 of server 1 to NIC eth1 of server 2 and stub1 to eth0, same QP numbers: each
    end takes its own NIC's GID and the peer NIC's address on the same path."""
    a0, b1 = App(r, 1, 0, 1, 4, 0x100, 0x300), App(r, 2, 1, 0, 4, 0x300, 0x100)
    a1, b0 = App(r, 1, 1, 0, 4, 0x100, 0x400), App(r, 2, 0, 1, 4, 0x400, 0x100)
    try:
        for a in (a0, b1, a1, b0):
            a.go()
        for a in (a0, b1, a1, b0):
            assert [ln["rc"] for ln in a.lines()] == [0] * 4
        for (x, xi), (y, yi), off in (((a0, 0), (b1, 1), 0x200), ((a1, 1), (b0, 0), 0x300)):
            got, peer = x.got(), y.got()
            paths = set()
            for q, (idx, dgid) in got.items():
                k = path_of(r, 1, xi, idx)
                assert k and dgid == r.lab.addresses(2, yi)[k]
                pidx, pdgid = peer[q + off]
                assert path_of(r, 2, yi, pidx) == k and pdgid == r.lab.addresses(1, xi)[k]
                paths.add(k)
            assert paths == {1, 2, 3, 4}
    finally:
        for a in (a0, b1, a1, b0):
            a.close()
    wait_for("gone", lambda: all(not json.loads(r.lab.cli(k, "qps", "--json")) for k in (1, 2)))


def test_rails_verbs_a_nic_the_agent_does_not_serve_keeps_its_addresses_and_says_so(r):
    """A third device on a netdev that is not one of the agent's NICs: its QPs keep the
    application's addresses, counted as `othernic`, and the process says once what would help."""
    lo = r.lab.addresses(1, 0)
    fake_sysfs(r.sysfs[1], lo, dev="stub9", netdev="lo")
    r.gid[(1, 9)] = r.gid[(1, 0)]
    before = r.status(1)["service"]["kept"]["othernic"]
    log = r.tmp / "stub-other.log"
    p = subprocess.run(["ip", "netns", "exec", r.lab.h[1], str(r.built.linked), "2", str(r.gid[(1, 0)][1]),
                        r.lab.base(2, 0), "0x200"],
                       env=app_env(r.built, r.sysfs[1], log, 0x100, socket_path(r.lab.h[1]), STUB_DEVICE="stub9"),
                       capture_output=True, text=True, timeout=30)
    assert p.returncode == 0, p.stderr
    assert {v for v in rtrs(log).values()} == {(r.gid[(1, 0)][1], r.lab.base(2, 0))}
    assert "not on a fabric NIC" in p.stderr and "rlbhost status" in p.stderr
    wait_for("counted", lambda: r.status(1)["service"]["kept"]["othernic"] == before + 2, timeout=5)
    assert addrplan.field_value(r.lab.base(2, 0), 3) == 1


def check(r: Rails, host: int, *env: str) -> tuple[int, dict]:
    """`rlbhost verbs check --json` on a server (reading the same GID tables as its agent)."""
    p = subprocess.run([sys.executable, "-m", "rlbhost", "--netns", r.lab.h[host], "verbs", "check", "--json",
                        *[a for e in env for a in ("--env", e)]],
                       env={**os.environ, "RLB_SYSFS_INFINIBAND": str(r.sysfs[host])}, capture_output=True, text=True)
    assert p.returncode in (0, 2), p.stderr
    return p.returncode, json.loads(p.stdout)


def test_rails_verbs_check_says_whether_a_job_will_be_placed_and_what_to_set(r):
    """The GID NCCL takes on each device, from the tables as NCCL walks them: its default family
    (AF_INET) takes the IPv4 GID stub0 has, or the link-local one on stub1, which has none; with
    NCCL_IB_ADDR_FAMILY=AF_INET6 both take their NIC's path-1 GID and the job is placed."""
    root = r.sysfs[1] / "stub0" / "ports" / "1"
    for i, t in ((20, "IB/RoCE v1"), (21, "RoCE v2")):               # the NIC has IPv4 too
        (root / "gids" / str(i)).write_text(ipaddress.IPv6Address("::ffff:10.0.0.1").exploded + "\n")
        (root / "gid_attrs/types" / str(i)).write_text(t + "\n")
        (root / "gid_attrs/ndevs" / str(i)).write_text("eth0\n")
    lib = f"LD_PRELOAD={r.built.lib}"
    sock = f"RLB_VERBS_SOCKET={socket_path(r.lab.h[1])}"
    code, out = check(r, 1, lib, sock)
    ports = {p["device"]: p for p in out["ports"] if p["device"] in DEVS}
    assert code == 2 and not out["placed"]
    assert ports["stub0"]["gid_index"] == 21 and not ports["stub0"]["placed"]
    assert any("IPv4" in f["what"] and f["fix"] == "NCCL_IB_ADDR_FAMILY=AF_INET6" for f in ports["stub0"]["findings"])
    assert ports["stub1"]["gid_index"] == 0 and not ports["stub1"]["placed"]
    assert any("link-local" in f["what"] for f in ports["stub1"]["findings"])
    # QPs = addresses = uplinks
    assert any(f["level"] == "warn" and f["fix"] == "NCCL_IB_QPS_PER_CONNECTION=4" for f in out["job"])

    code, out = check(r, 1, lib, sock, "NCCL_IB_ADDR_FAMILY=AF_INET6", "NCCL_IB_QPS_PER_CONNECTION=4",
                      "NCCL_IB_HCA=stub0,stub1")
    ports = {p["device"]: p for p in out["ports"]}
    assert code == 0 and out["placed"], out
    for i, dev in enumerate(DEVS):
        assert ports[dev]["placed"] and ports[dev]["gid_index"] == r.gid[(1, i)][1]
        assert ports[dev]["gid"] == r.lab.addresses(1, i)[1]
    assert not [f for f in out["job"] if f["level"] != "ok"]

    code, out = check(r, 1, lib, sock, "NCCL_IB_GID_INDEX=1", "NCCL_IB_QPS_PER_CONNECTION=8",
                      "NCCL_IB_HCA=stub0,stub1")
    assert code == 2 and all(any("not RoCE v2" in f["what"] for f in p["findings"])
                             for p in out["ports"] if p["device"] in DEVS)
    code, out = check(r, 1, sock, "NCCL_IB_ADDR_FAMILY=AF_INET6", "NCCL_IB_HCA=stub0,stub1")
    assert code == 2 and any("does not load the library" in f["what"] for f in out["job"])
