"""The bird follower's bookkeeping that needs no bird: includes whose configure failed are given
to bird again, bird's start times, and its route changes followed on netlink."""
from __future__ import annotations

import logging
import threading
import time
import uuid

import pytest

from rlbcommon import netns
from rlbcommon.health import Health
from rlbcommon.runtime import AgentRuntime
from rlbfabric.bird.ctl import BirdError
from rlblab import topo
from rlbswitch.birdwatch import RouteEvents, restarted
from rlbswitch.includes import BirdIncludes


class FlakyBird:
    def __init__(self):
        self.calls = 0

    def configure(self) -> str:
        self.calls += 1
        if self.calls == 1:
            raise BirdError("bird control socket: Connection refused")
        return "Reconfigured"


def test_an_include_whose_configure_failed_is_configured_again(tmp_path):
    incs = BirdIncludes(FlakyBird())
    inc = tmp_path / "l1.neighbors.conf"
    assert incs.write(inc, "protocol bgp s1 ...\n")
    with pytest.raises(BirdError):
        incs.configure("neighbours", inc)
    # the same content is on disk, but bird never read it: written and configured again
    assert incs.write(inc, "protocol bgp s1 ...\n")
    incs.configure("neighbours", inc)
    assert incs.bird.calls == 2
    assert not incs.write(inc, "protocol bgp s1 ...\n")
    assert inc.read_text() == "protocol bgp s1 ...\n"


def test_a_bird_whose_printed_start_time_drifts_has_not_restarted():
    """Seen in the VM lab: bird prints its start time from its monotonic clock and the wall
    clock, so one bird's start time moved by 22 ms back and forth between reads and the switch
    agent held its routes as if bird had restarted, every second. Only a later start is a new bird."""
    assert not restarted("2026-11-23 06:02:02.586", "2026-11-23 06:02:02.564")
    assert not restarted("2026-11-23 06:02:02.564", "2026-11-23 06:02:02.586")
    assert restarted("2026-11-23 06:02:02.586", "2026-11-23 07:09:40.120")
    assert restarted("", "2026-11-23 07:09:40.120") and restarted("garbled", "other")
    assert not restarted("2026-11-23 06:02:02.586", "2026-11-23 06:02:02.586")


def test_birds_route_changes_are_followed_on_the_runtime_and_nothing_else(tmp_path):
    """RouteEvents on the agent's runtime, in a namespace of its own: a route bird installs
    (proto 12) and its removal are taken, a route of anyone else is not; the follower is started
    once however often the reader starts it, with its hang watch."""
    ns = f"rlbbw{uuid.uuid4().hex[:6]}"
    topo.add_ns(ns)
    rt = AgentRuntime(logging.getLogger("test"), Health())
    lost, stats = [], {"events": 0}
    events = RouteEvents(lambda: lost.append(1), stats)
    try:
        topo.run(ns, "ip", "link", "add", "d0", "type", "veth", "peer", "name", "d1")
        topo.run(ns, "ip", "link", "set", "d0", "up")
        with netns.inside(ns):
            assert events.start(rt).wait(5) and events.start(rt) is events.start(rt)
        assert lost == [1] and "bird-events" in rt.health.expected      # read everything once subscribed

        def taken(want: set[str]) -> set[str]:
            got, deadline = set(), time.monotonic() + 5
            while not want <= got and time.monotonic() < deadline:
                events.wake.wait(0.2)
                events.wake.clear()
                got |= events.take()
            return got

        topo.run(ns, "ip", "-6", "route", "add", "fc00:77::/64", "dev", "d0", "proto", "12")
        topo.run(ns, "ip", "-6", "route", "add", "fc00:78::/64", "dev", "d0", "proto", "static")
        assert taken({"fc00:77::/64"}) == {"fc00:77::/64"}
        topo.run(ns, "ip", "-6", "route", "del", "fc00:77::/64", "dev", "d0", "proto", "12")
        assert taken({"fc00:77::/64"}) == {"fc00:77::/64"} and stats["events"] == 2
        assert [t.name for t in threading.enumerate()].count("bird-events") == 1
    finally:
        rt.stop.set()
        topo.del_ns(ns)
