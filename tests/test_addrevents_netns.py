"""The host agent's filter of address events, fed by the kernel: an RA's lifetime refresh is an
RTM_NEWADDR the kernel sends for an address unchanged, and must not resynchronise a NIC; an
address new, gone, deprecated or back is a change."""
from __future__ import annotations

import os
import subprocess

import pytest
from pyroute2.netlink.rtnl import RTMGRP_IPV6_IFADDR

from rlbcommon import netns
from rlbcommon.netlinkevents import NetlinkEvents
from rlbhost.addrevents import AddressChanges

NS = f"rlbae{os.getpid()}"
ADDR = "fc00:1:1:1::5/64"


def ip(*args: str):
    subprocess.run(["ip", "-n", NS, *args], check=True)


@pytest.fixture
def events():
    subprocess.run(["ip", "netns", "add", NS], check=True)
    try:
        ip("link", "add", "d0", "type", "veth", "peer", "name", "d1")
        ip("link", "set", "d1", "up")
        ip("link", "set", "d0", "up")
        with netns.inside(NS), NetlinkEvents(RTMGRP_IPV6_IFADDR) as ev:
            yield ev
    finally:
        subprocess.run(["ip", "netns", "del", NS], check=False)


def judged(ev, changes: AddressChanges, *cmd: str) -> list[bool]:
    """The verdicts on the address events one `ip` command makes (at least one: the kernel's)."""
    ip("-6", "addr", *cmd)
    msgs = [m for m in ev.batch(timeout=2) if m["event"] in ("RTM_NEWADDR", "RTM_DELADDR")
            and m.get_attr("IFA_ADDRESS") == ADDR.split("/")[0]]
    assert msgs, f"no event for ip addr {' '.join(cmd)}"
    return [changes.changed(m) for m in msgs]


def test_a_refreshed_lifetime_is_no_change_and_every_real_change_is(events):
    c = AddressChanges()
    assert judged(events, c, "add", ADDR, "dev", "d0", "nodad", "valid_lft", "300", "preferred_lft", "200") == [True]
    # what every router advertisement does to the address it made: the same address, longer lifetimes
    for lft in ("400", "500"):
        assert judged(events, c, "change", ADDR, "dev", "d0", "nodad", "valid_lft", lft, "preferred_lft", lft) == [False]
    # deprecated (a prefix being withdrawn: no longer a path), then usable again
    assert judged(events, c, "change", ADDR, "dev", "d0", "nodad", "valid_lft", "300", "preferred_lft", "0") == [True]
    assert judged(events, c, "change", ADDR, "dev", "d0", "nodad", "valid_lft", "300", "preferred_lft", "0") == [False]
    assert judged(events, c, "change", ADDR, "dev", "d0", "nodad", "valid_lft", "300", "preferred_lft", "200") == [True]
    # another prefix length is another path set
    assert judged(events, c, "del", ADDR, "dev", "d0") == [True]
    assert judged(events, c, "add", ADDR.replace("/64", "/80"), "dev", "d0", "nodad") == [True]
    assert judged(events, c, "del", ADDR.replace("/64", "/80"), "dev", "d0") == [True]
    # gone and back: a change both ways
    assert judged(events, c, "add", ADDR, "dev", "d0", "nodad", "valid_lft", "300", "preferred_lft", "200") == [True]
    assert judged(events, c, "change", ADDR, "dev", "d0", "nodad", "valid_lft", "600", "preferred_lft", "600") == [False]
    # followed afresh (the start, or events the kernel dropped): the next sighting counts again
    c.forget()
    assert judged(events, c, "change", ADDR, "dev", "d0", "nodad", "valid_lft", "700", "preferred_lft", "700") == [True]


def test_an_address_still_in_dad_is_not_the_address_done(events):
    """Tentative, then DAD done: two events, both changes (the path exists only after the second)."""
    c = AddressChanges()
    ip("link", "set", "d0", "down")
    ip("-6", "addr", "add", ADDR, "dev", "d0")                 # DAD waits for the link
    first = [c.changed(m) for m in events.batch(timeout=2) if m["event"] == "RTM_NEWADDR"
             and m.get_attr("IFA_ADDRESS") == ADDR.split("/")[0]]
    assert first == [True]
    ip("link", "set", "d0", "up")                              # DAD runs (about a second)
    done = []
    for _ in range(10):
        done += [c.changed(m) for m in events.batch(timeout=1) if m["event"] == "RTM_NEWADDR"
                 and m.get_attr("IFA_ADDRESS") == ADDR.split("/")[0]]
        if True in done:
            break
    assert True in done
