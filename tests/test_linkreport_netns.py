"""A leaf's uplink reports, from the kernel's link events to a real coordinator: the first report
carries the kernel's state, a carrier change reaches the coordinator within milliseconds, and
nothing is sent between changes but the refresh (no polling)."""
from __future__ import annotations

import logging
import subprocess
import threading
import time
from pathlib import Path

import pytest

from rlbcommon import coordapi
from rlbcommon.runtime import AgentRuntime
from rlbcoord import kinds  # noqa: F401 - each kind registers its coordinator and metrics
from rlbcoord.metrics import exposition
from rlbcoord.service import Coordinator, make_server
from rlbfabric.fabric import load
from rlbswitch.linkreport import HttpUplinks, LinkReporter

from .conftest import scratch_netns

pytestmark = pytest.mark.netns
FABRIC = load(Path(__file__).resolve().parent.parent / "lab" / "fabric.toml")


def ip(*args):
    subprocess.run(["ip", *args], check=True)


@pytest.fixture
def leaf():
    """l1's four uplinks as veths (their far ends up) in a namespace of their own, with a coordinator on its
    loopback; the reporter's threads are started inside (they inherit the namespace)."""
    with scratch_netns("rlblr"):
        ip("link", "set", "lo", "up")
        for k in range(1, 5):
            ip("link", "add", f"eth-s{k}", "type", "veth", "peer", "name", f"spine{k}")
            ip("link", "set", f"spine{k}", "up")
            ip("link", "set", f"eth-s{k}", "up")
        ip("link", "set", "eth-s3", "down")
        coord = Coordinator(FABRIC)
        server = make_server(coord, "::1", 0, exposition(coord))
        threading.Thread(target=server.serve_forever, daemon=True).start()
        url = coordapi.url_for("::1", server.server_address[1])
        runtime = AgentRuntime(logging.getLogger("test"))
        reporter = LinkReporter(FABRIC, "l1", HttpUplinks(url, "l1"), runtime, refresh_s=30.0)
        try:
            reporter.start()
            yield coord, url, reporter
        finally:
            runtime.stop.set()
            server.shutdown()
            server.server_close()


def dead(url) -> list:
    return coordapi.call(url, coordapi.STATUS)["dead_links"]


def wait(cond, timeout=2.0) -> float:
    t0 = time.monotonic()
    while not cond():
        assert time.monotonic() - t0 < timeout, "not within the time"
        time.sleep(0.005)
    return time.monotonic() - t0


def test_uplink_changes_reach_the_coordinator_at_once_and_nothing_is_sent_between(leaf):
    coord, url, reporter = leaf
    wait(lambda: dead(url) == ["l1/3"])            # the first report: the kernel's state
    reports = coord.counters["link_reports"]
    ip("link", "set", "eth-s1", "down")
    took = wait(lambda: dead(url) == ["l1/1", "l1/3"])
    assert took < 0.5, took
    ip("link", "set", "eth-s3", "up")
    wait(lambda: dead(url) == ["l1/1"])
    ip("link", "del", "eth-s1")                    # a removed uplink is a dead one
    ip("link", "set", "eth-s3", "down")
    wait(lambda: dead(url) == ["l1/1", "l1/3"])
    changes = coord.counters["link_reports"] - reports
    assert 3 <= changes <= 4, coord.counters       # the last two changes may come as one
    time.sleep(1.0)                                # quiet: no report without a change
    assert coord.counters["link_reports"] - reports == changes, coord.counters
    assert reporter.up == {"eth-s1": False, "eth-s2": True, "eth-s3": False, "eth-s4": True}
