"""Heartbeats between two real switch data planes (two namespaces, a veth pair per port, the real
XDP program on both ends): a neighbour answering is judged and kept; one whose program drops
everything is taken out of forwarding within MISS rounds and given back after BACK answers; all
neighbours silent at once is suspected as this switch's own fault (nothing taken out); a
neighbour without our program (the kernel alone answers) is never judged."""
from __future__ import annotations

import json
import logging
import subprocess
import time
import uuid

import pytest

from rlbcommon import netns
from rlblab import topo
from rlblab.faults import XDP_DROP_ALL, XDP_FLAGS_DRV_MODE
from rlbswitch.dataplane import SwitchDataplane
from rlbswitch.heartbeat import BACK, MISS, Heartbeat

from .conftest import scratch_netns

pytestmark = pytest.mark.netns
PORTS = ["p0", "p1"]


class Pair:
    """Switch A (this process's namespace, ports p0 p1) and switch B (q0 q1 in its own)."""

    def __init__(self, a: str, b: str):
        self.a, self.b = a, b
        self.dp_a = SwitchDataplane(a)
        for p in PORTS:
            self.dp_a.attach(p, edge=False)
        with netns.inside(b):
            self.dp_b = SwitchDataplane(b)
            for q in ("q0", "q1"):
                self.dp_b.attach(q, edge=False)
        from bcc import BPF
        self.drop = BPF(text=XDP_DROP_ALL).load_func(b"drop_all", BPF.XDP)

    def hang(self, q: str):
        """B's port q drops every frame, carrier up."""
        with netns.inside(self.b):
            subprocess.run(["ip", "link", "set", "dev", q, "xdpdrv", "off"], check=True)
            from pyroute2 import IPRoute
            with IPRoute() as ipr:
                ipr.link("set", index=ipr.link_lookup(ifname=q)[0], xdp_fd=self.drop.fd,
                         xdp_flags=XDP_FLAGS_DRV_MODE)

    def restore(self, q: str):
        with netns.inside(self.b):
            self.dp_b.attach(q, edge=False)

    def bare(self, q: str):
        """B's port q without any program: the kernel alone (another make of switch)."""
        with netns.inside(self.b):
            self.dp_b.detach(q)
            subprocess.run(["ethtool", "-K", q, "gro", "on"], capture_output=True)

    def up(self, p: str) -> bool:
        return next(x.up for x in self.dp_a.ports() if x.ifname == p)

    def close(self):
        with netns.inside(self.b):
            self.dp_b.destroy()
        self.dp_a.destroy()


@pytest.fixture
def pair(tmp_path):
    b = f"rlbhb-b-{uuid.uuid4().hex[:6]}"
    with scratch_netns("rlbhb-a") as a:
        topo.veth_ports(2)
        subprocess.run(["ip", "netns", "add", b], check=True)
        try:
            for q in ("q0", "q1"):
                subprocess.run(["ip", "link", "set", q, "netns", b], check=True)
                subprocess.run(["ip", "-n", b, "link", "set", q, "up"], check=True)
            for dev in PORTS:                       # both ends: the link-local addresses settle
                subprocess.run(["ip", "link", "set", dev, "up"], check=True)
            for ns, devs in ((a, PORTS), (b, ["q0", "q1"])):
                for dev in devs:
                    topo.link_local(ns, dev)
            p = Pair(a, b)
            try:
                yield p
            finally:
                p.close()
        finally:
            subprocess.run(["ip", "netns", "del", b])


def rounds(hb: Heartbeat, n: int):
    for _ in range(n):
        hb.round()
        time.sleep(0.02)                           # the answers' time to come back


def test_an_answering_neighbour_is_judged_and_kept(pair, tmp_path):
    hb = Heartbeat(pair.dp_a, PORTS, tmp_path / "hb.json", interval_ms=20)
    rounds(hb, 10)
    st = hb.status()
    assert all(s["judged"] and not s["silent"] and 0 < s["rtt_us"] < 20_000 for s in st.values()), st
    assert pair.up("p0") and pair.up("p1")
    assert set(json.loads((tmp_path / "hb.json").read_text())) == set(PORTS)


def test_a_hung_neighbour_is_taken_out_and_given_back(pair, tmp_path, caplog):
    hb = Heartbeat(pair.dp_a, PORTS, tmp_path / "hb.json", interval_ms=20)
    rounds(hb, 5)
    pair.hang("q0")
    with caplog.at_level(logging.WARNING, logger="rlbswitch.heartbeat"):
        rounds(hb, MISS)
        assert pair.up("p0")                       # not before MISS asks went unanswered
        rounds(hb, 2)
        assert not pair.up("p0") and pair.up("p1") and hb.status()["p0"]["silent"]
        assert pair.dp_a.silent_ports() == {pair.dp_a.ifindex("p0")}
        pair.restore("q0")
        rounds(hb, BACK + 2)
    assert pair.up("p0") and not hb.status()["p0"]["silent"] and hb.status()["p0"]["silences"] == 1
    said = [r.getMessage() for r in caplog.records]
    assert any("p0: neighbour" in m and "taken out of forwarding" in m for m in said), said
    assert any("p0: neighbour" in m and "back in forwarding" in m for m in said), said
    # a carrier event while silent must not put it back, nor the other way round
    pair.hang("q0")
    rounds(hb, MISS + 2)
    pair.dp_a.set_port_up(pair.dp_a.ifindex("p0"), True)
    assert not pair.up("p0")
    pair.restore("q0")
    rounds(hb, BACK + 2)
    assert pair.up("p0")


def test_every_neighbour_silent_at_once_takes_nothing_out(pair, tmp_path, caplog):
    hb = Heartbeat(pair.dp_a, PORTS, tmp_path / "hb.json", interval_ms=20)
    rounds(hb, 5)
    pair.hang("q0")
    pair.hang("q1")
    with caplog.at_level(logging.WARNING, logger="rlbswitch.heartbeat"):
        rounds(hb, MISS + 3)
    assert pair.up("p0") and pair.up("p1") and not pair.dp_a.silent_ports()
    assert any("own receive path" in r.getMessage() for r in caplog.records)


def test_a_neighbour_without_our_program_is_never_judged(pair, tmp_path):
    pair.bare("q1")
    hb = Heartbeat(pair.dp_a, PORTS, tmp_path / "hb.json", interval_ms=20)
    rounds(hb, MISS + 5)
    st = hb.status()
    assert st["p0"]["judged"] and not st["p1"]["judged"] and st["p1"]["peer"] is not None, st
    assert pair.up("p1")


def test_a_remembered_neighbour_is_judged_at_once_after_a_restart(pair, tmp_path):
    """The neighbours that answered are kept in the run directory: an agent started afresh while
    one hangs takes it out, though it never heard it answer."""
    hb = Heartbeat(pair.dp_a, PORTS, tmp_path / "hb.json", interval_ms=20)
    rounds(hb, 5)
    pair.hang("q0")
    again = Heartbeat(pair.dp_a, PORTS, tmp_path / "hb.json", interval_ms=20)
    rounds(again, MISS + 2)
    assert again.status()["p0"]["silent"] and not pair.up("p0")
