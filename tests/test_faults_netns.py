"""Control-plane faults during traffic, on the default fabric with real bird2, XDP switches and
rlbhost: 4 QPs h1 -> h3 at 2000 packets/s, every packet counted by the receiving application on h3.
Each fault prints packets lost and the longest gap in arrivals."""
from __future__ import annotations

import time
from pathlib import Path

import pytest

from rlbfabric.bird.ctl import BirdClient
from rlbfabric.fabric import load
from rlblab.faults import HungSwitch

from .conftest import fabric_lab, h1_to_h3_during

pytestmark = pytest.mark.netns
FABRIC = Path(__file__).resolve().parent.parent / "lab" / "fabric.toml"
RATE = 2000                      # packets/s, all 4 QPs together
RESULTS: dict[str, tuple[int, int, float]] = {}


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    # a short restart time, so that "down for longer than the restart time" fits in a test
    f = tmp_path_factory.mktemp("fab") / "fabric.toml"
    f.write_text(FABRIC.read_text().replace("bfd = true", "bfd = true\ngraceful_restart_s = 6"))
    with fabric_lab(f, "rlbfx", coordinator=False) as lab:
        yield lab
    print("\nfault                                   sent   lost  longest gap (ms)")
    for name, (sent, lost, gap) in RESULTS.items():
        print(f"{name:<38}{sent:>6}{lost:>7}{gap:>18.1f}")


def traffic(lab, seconds: float, during, seed: int):
    """Send for `seconds` while `during` runs; (sent, received, longest gap in ms)."""
    return h1_to_h3_during(lab, int(RATE * seconds / 4), RATE, during, seed)


def record(name, sent, got, gap):
    RESULTS[name] = (sent, sent - got, gap)
    print(f"\n{name}: {sent - got} of {sent} lost, longest gap {gap:.1f} ms")


def converged_again(lab):
    lab.wait_converged(60)
    time.sleep(2)


@pytest.mark.parametrize("switch", ["l1", "l2", "s1"])
def test_bird_killed_and_restarted_loses_nothing(lab, switch):
    """kill -9 and a new bird 1 s later on the source leaf, the destination leaf, a spine: peers
    keep the routes (graceful restart) and the agent keeps what is programmed until the new bird
    has converged."""
    def fault():
        lab.birds[switch].kill()
        time.sleep(1.0)
        lab.birds[switch].start()
    sent, got, gap = traffic(lab, 5.0, fault, seed=hash(switch) % 1000)
    record(f"bird kill -9 + restart on {switch}", sent, got, gap)
    assert got == sent
    with open(lab.work / f"agent-{switch}.log") as f:
        log = f.read()
    assert "bird restarted" in log and "bird has recovered" in log
    converged_again(lab)


def test_bird_down_longer_than_the_restart_time_routes_around_a_spine(lab):
    """A spine whose bird stays dead: its peers keep its routes for the restart time (6 s here) while
    its data plane goes on forwarding, then routes move off it; nothing is lost on the way."""
    fab = load(lab.fabric_file)
    moved = {}

    def fault():
        lab.birds["s1"].kill()
        t0 = time.monotonic()
        while time.monotonic() - t0 < fab.graceful_restart_s + 6:
            r = lab.routes("l1")["fc00:2:1:1::/64"]
            if not r.get("nexthop", {}).get("via", "").endswith("%eth-s1"):
                moved["after_s"] = time.monotonic() - t0
                break
            time.sleep(0.2)
    try:
        sent, got, gap = traffic(lab, fab.graceful_restart_s + 5.0, fault, seed=7)
    finally:
        lab.birds["s1"].start()
    record("bird on s1 down past the restart time", sent, got, gap)
    print(f"l1 moved colour 1 off s1 {moved.get('after_s', float('nan')):.1f} s after the kill "
          f"(restart time {fab.graceful_restart_s} s)")
    assert fab.graceful_restart_s - 1 <= moved["after_s"] <= fab.graceful_restart_s + 4
    assert got == sent
    converged_again(lab)


def test_a_peer_sending_poison_spoils_its_path_only(lab):
    """A test-only export filter on s1 adds a NaN FARE path bandwidth to l2's colour-1 prefix: l1
    ignores that path (one log line), DLBs the prefix over the other spines without loss, and
    keeps programming the rest; when s1 is sane again the prefix is pinned through it again."""
    poisoned = "fc00:2:1:1::/64"
    lab.kill_agent("s1")                          # or it would rewrite its export filter
    inc = lab.work / "s1.pathbw.conf"
    saved = inc.read_text()
    inc.write_text("function pathbw_export()\n{\n"
                   f"  if net = {poisoned} then bgp_ext_community.add((generic, 0x88fde8, 0x7fc00000));\n"
                   "  return true;\n}\n")

    def fault():
        BirdClient(str(lab.work / "s1.ctl")).configure()
        time.sleep(2.0)
    try:
        sent, got, gap = traffic(lab, 4.0, fault, seed=11)
        record("peer sends a NaN path bandwidth", sent, got, gap)
        assert got == sent
        with open(lab.work / "agent-l1.log") as f:
            assert f"{poisoned} via eth-s1 from s1 ignored: path bandwidth nan" in f.read()
        routes = lab.routes("l1")
        assert routes[poisoned]["mode"] == "dlb"
        assert all(r["mode"] == "pinned" for p, r in routes.items() if p.startswith("fc00:2:") and p != poisoned)
    finally:
        inc.write_text(saved)
        lab.start_agent("s1")
        BirdClient(str(lab.work / "s1.ctl")).configure()
    deadline = time.time() + 20
    while time.time() < deadline and lab.routes("l1")[poisoned]["mode"] != "pinned":
        time.sleep(0.3)
    assert lab.routes("l1")[poisoned]["mode"] == "pinned"


def test_host_agent_killed_mid_traffic_loses_nothing(lab):
    """The TC programs and the QP table stay; a new agent adopts them."""
    def fault():
        lab.kill_agent("h1")
        time.sleep(1.0)
        lab.start_host_agent("h1")
    sent, got, gap = traffic(lab, 4.0, fault, seed=13)
    record("host agent kill -9 + restart on h1", sent, got, gap)
    assert got == sent


@pytest.mark.parametrize("heartbeat", [False, True], ids=["heartbeat_off", "heartbeat_on"])
def test_hold_a_spine_hung_with_carrier_up(lab, heartbeat):
    """The spine carrying most of h1's traffic hangs: bird and agent stopped, its XDP dropping
    every frame, carrier up. The leaves' BFD goes down, and `bfd graceful` keeps its routes for
    the restart time (6 s here), so what goes through it dies for all of it; with the leaves'
    heartbeats it is taken out within about 5 heartbeats (0.5 s). Measured as the outage: the
    packets lost over the rate the spine carried before."""
    leaves = ("l1", "l2")
    if not heartbeat:                   # agents without it, side by side
        for leaf in leaves:
            lab.kill_agent(leaf)
            lab.start_agent(leaf, extra=("--heartbeat-ms", "0"))
    time.sleep(1.0)
    hung = HungSwitch(lab)
    logs = {leaf: (lab.work / f"agent-{leaf}.log").stat().st_size for leaf in leaves}
    before = lab.spine_packets("l1")
    share = {}

    def fault():                        # 0.5 s into the traffic: the spine that carries most
        now = lab.spine_packets("l1")
        carried = {s: now[s] - before[s] for s in now}
        spine = max(carried, key=carried.get)
        share["of"] = carried[spine] / sum(carried.values())
        hung.on(spine)
        time.sleep(3.0)
    try:
        sent, got, gap = traffic(lab, 4.0, fault, seed=17)
    finally:
        hung.off()
        if not heartbeat:
            for leaf in leaves:
                lab.kill_agent(leaf)
                lab.start_agent(leaf)
    outage_ms = (sent - got) / (RATE * share["of"]) * 1000
    record(f"{hung.node} hung, carrier up (heartbeat {'on' if heartbeat else 'off'})", sent, got, gap)
    print(f"{hung.node} carried {share['of']:.0%} of h1's packets: {outage_ms:.0f} ms of them lost")
    said = {leaf: (lab.work / f"agent-{leaf}.log").read_text()[logs[leaf]:] for leaf in leaves}
    if heartbeat:
        assert f"eth-{hung.node}: neighbour" in said["l1"] and "taken out of forwarding" in said["l1"], said["l1"]
        assert outage_ms < 1000, (sent, got, share)
    else:                               # the fault is real: its share lost past 3 s
        assert outage_ms > 2500, (sent, got, share)
    converged_again(lab)
    lab.wait_for(lambda: all(r["mode"] == "pinned" for p, r in lab.routes("l1").items()
                             if p.startswith("fc00:2:")), 30, "l1's routes pinned again")
