"""GPU servers of two NICs in a namespace fabric (lab/fabric-rails.toml: 4 spines, 2 rail leaves,
servers a1 and a2 with gpu0_eth on l1 and gpu1_eth on l2), one `rlbhost attach` per server, the
coordinator on etcd: the worked example (rails-stripe), and what an operator of such a server
relies on: each NIC's QPs spread over its own paths and accounted apart, weights set on one NIC
leave the other's QPs where they are, a NIC that goes down takes only its own QPs, and a restarted
agent adopts both NICs without losing a packet. Traffic is QPs from kernel sockets bound to each
NIC's base address (what leaves by each NIC's source route, through TC egress)."""
from __future__ import annotations

import json
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import pytest

from rlbcommon.netns import run
from rlblab.traffic import QpReceiver, QpSender

from .conftest import fabric_lab, scenario_passes

pytestmark = pytest.mark.netns
LAB = Path(__file__).resolve().parent.parent / "lab"
RATE = 160          # packets/s a NIC's 8 QPs send: a packet a QP every 50 ms, within the 200 ms expiry


@pytest.fixture(scope="module")
def lab():
    with fabric_lab(LAB / "fabric-rails.toml", "rlbrn", etcd=True) as lab:
        yield lab


def nic_status(lab, server: str) -> dict[str, dict]:
    return {n["nic"]: n for n in json.loads(lab.cli(server, "status", "--json"))["nics"]}


def active(lab, server: str) -> dict[str, dict[int, int]]:
    """{NIC: {path: active QPs}}."""
    return {nic: {p["path"]: p["active_qps"] for p in s["paths"] if p["valid"]}
            for nic, s in nic_status(lab, server).items()}


def qp_paths(lab, server: str, nic: str, sender: QpSender) -> dict[int, int]:
    """{QP number: path} of a sender's QPs in that NIC's connection-tracking table."""
    mine = set(sender.qps)
    return {q["qp"]: q["path"] + 1 for q in json.loads(lab.cli(server, "qps", "--json", "--nic", nic))
            if q.get("source") != "verbs" and q["qp"] in mine}


def wait_for(what, cond, timeout=15.0, show=None):
    deadline = time.time() + timeout
    while not cond():
        assert time.time() < deadline, f"timed out: {what}" + (f" ({show()})" if show else "")
        time.sleep(0.2)


@contextmanager
def sending(lab, nics: list[int], qps: int = 8, seed: int = 0):
    """a1's NICs `nics` each send `qps` QPs to a2's other NIC (across the rails, over the
    spines) until the block ends; yields {nic index: (sender, stop)}; after it, every packet sent
    must have arrived (the receiver sinks them on a2)."""
    a1, a2 = lab.fabric.endpoints("a1"), lab.fabric.endpoints("a2")
    rx = QpReceiver(lab.ns("a2"))
    out, threads, sent = {}, [], {}
    for i in nics:
        s = QpSender(lab.ns("a1"), lab.host_addresses(a1[i])[1], lab.host_addresses(a2[1 - i])[1], qps,
                     base_sport=50000 + 1000 * i, seed=seed * 10 + i)
        stop = threading.Event()
        out[i] = (s, stop)
        t = threading.Thread(target=lambda s=s, stop=stop, i=i: sent.__setitem__(i, s.send_until(stop, RATE)))
        t.start()
        threads.append(t)
    try:
        time.sleep(0.5)
        yield out
    finally:
        for _, stop in out.values():
            stop.set()
        for t in threads:
            t.join()
        time.sleep(0.5)
        rx.close()
        for s, _ in out.values():
            s.close()
    for i, (s, _) in out.items():
        got = sum(1 for _, _, qp in rx.seen if qp in set(s.qps))
        assert got == sent[i], f"NIC {i}: {sent[i] - got} of {sent[i]} packets lost"


def test_rails_the_worked_example_passes(lab):
    scenario_passes("rails-stripe", lab)


def test_rails_each_nic_s_qps_spread_over_its_own_paths_and_are_accounted_apart(lab):
    with sending(lab, [0, 1], seed=1) as s:
        wait_for("both NICs' QPs counted", lambda: active(lab, "a1") == {"gpu0_eth": {1: 2, 2: 2, 3: 2, 4: 2},
                                                                         "gpu1_eth": {1: 2, 2: 2, 3: 2, 4: 2}})
        for i, nic in enumerate(("gpu0_eth", "gpu1_eth")):
            assert sorted(qp_paths(lab, "a1", nic, s[i][0]).values()) == [1, 1, 2, 2, 3, 3, 4, 4]
            # the other NIC's table has none of them
            assert qp_paths(lab, "a1", ("gpu1_eth", "gpu0_eth")[i], s[i][0]) == {}
        tx = {nic: sum(p["tx_packets"] for p in st["paths"]) for nic, st in nic_status(lab, "a1").items()}
        assert tx["gpu0_eth"] > 0 and tx["gpu1_eth"] > 0


def test_rails_weights_on_one_nic_leave_the_other_nic_s_qps_where_they_are(lab):
    with sending(lab, [0, 1], seed=2) as s:
        wait_for("spread", lambda: active(lab, "a1")["gpu1_eth"] == {1: 2, 2: 2, 3: 2, 4: 2})
        before = qp_paths(lab, "a1", "gpu0_eth", s[0][0])
        lab.cli("a1", "weights", "set", "1=1", "2=1", "3=1", "4=0", "--nic", "gpu1_eth")
        try:
            wait_for("gpu1_eth's QPs off path 4", lambda: 4 not in qp_paths(lab, "a1", "gpu1_eth", s[1][0]).values())
            moved = qp_paths(lab, "a1", "gpu1_eth", s[1][0])
            assert sorted(moved.values()).count(4) == 0 and len(moved) == 8
            assert max(sorted(moved.values()).count(k) for k in (1, 2, 3)) == 3
            assert qp_paths(lab, "a1", "gpu0_eth", s[0][0]) == before        # untouched
            w = {e["nic"]: e["weights"] for e in json.loads(lab.cli("a1", "weights", "show", "--json"))
                 if e["prefix"] == "::/0"}
            assert w == {"gpu0_eth": {"1": 1.0, "2": 1.0, "3": 1.0, "4": 1.0},
                         "gpu1_eth": {"1": 1.0, "2": 1.0, "3": 1.0, "4": 0.0}}
        finally:
            lab.cli("a1", "weights", "set", "1=1", "2=1", "3=1", "4=1", "--nic", "gpu1_eth")
        wait_for("reinstated", lambda: active(lab, "a1")["gpu1_eth"] == {1: 2, 2: 2, 3: 2, 4: 2})
        assert qp_paths(lab, "a1", "gpu0_eth", s[0][0]) == before


def test_rails_a_nic_that_goes_down_takes_only_its_own_qps(lab):
    with sending(lab, [0], seed=3) as s:
        wait_for("spread", lambda: active(lab, "a1")["gpu0_eth"] == {1: 2, 2: 2, 3: 2, 4: 2})
        before = qp_paths(lab, "a1", "gpu0_eth", s[0][0])
        run(lab.ns("a1"), "ip", "link", "set", "gpu1_eth", "down")
        try:
            wait_for("gpu1_eth's paths gone", lambda: not any(
                p["valid"] for p in nic_status(lab, "a1")["gpu1_eth"]["paths"]))
            time.sleep(0.5)
            assert qp_paths(lab, "a1", "gpu0_eth", s[0][0]) == before
            assert active(lab, "a1")["gpu0_eth"] == {1: 2, 2: 2, 3: 2, 4: 2}
        finally:
            run(lab.ns("a1"), "ip", "link", "set", "gpu1_eth", "up")
        wait_for("gpu1_eth's paths back (SLAAC again)", lambda: sum(
            p["valid"] for p in nic_status(lab, "a1")["gpu1_eth"]["paths"]) == 4, timeout=30)
        assert qp_paths(lab, "a1", "gpu0_eth", s[0][0]) == before
    st = nic_status(lab, "a1")["gpu1_eth"]
    assert st["config"]["base_index"] == 0            # its base is path 1 again, whatever came back first
    # the kernel dropped gpu1_eth's source route with the link; the agent put it back: what it
    # sends leaves through it again (TC on gpu1_eth counts it) and arrives
    tx = sum(p["tx_packets"] for p in st["paths"])
    with sending(lab, [1], seed=5):
        wait_for("gpu1_eth sends", lambda: sum(p["tx_packets"] for p in nic_status(lab, "a1")["gpu1_eth"]["paths"])
                 > tx + 100)


def test_rails_a_restarted_agent_adopts_every_nic_and_no_packet_is_lost(lab):
    with sending(lab, [0, 1], seed=4) as s:
        wait_for("spread", lambda: active(lab, "a1") == {"gpu0_eth": {1: 2, 2: 2, 3: 2, 4: 2},
                                                         "gpu1_eth": {1: 2, 2: 2, 3: 2, 4: 2}},
                 show=lambda: (active(lab, "a1"), json.loads(lab.cli("a1", "qps", "--json")),
                               json.loads(lab.cli("a1", "status", "--json"))))
        before = {nic: qp_paths(lab, "a1", nic, s[i][0]) for i, nic in enumerate(("gpu0_eth", "gpu1_eth"))}
        lab.kill_agent("a1")                       # SIGKILL: the programs and maps stay
        time.sleep(0.5)
        lab.start_host_agent("a1")
        time.sleep(0.5)
        after = {nic: qp_paths(lab, "a1", nic, s[i][0]) for i, nic in enumerate(("gpu0_eth", "gpu1_eth"))}
        assert after == before
    log = (lab.work / "agent-a1.log").read_text()
    assert log.count("following addresses of gpu0_eth, gpu1_eth") >= 2
