"""A leaf finds the switch on each uplink (rlbswitch/discovery.py) on a real veth between two
namespaces: by an echo to all-nodes; from a peer that ignores such echoes (switches of other
makes may), by the router advertisement a router solicitation brings (bird's radv with the
fabric's settings, FABRIC_RA); never from an advertisement that was routed (hop limit below 255),
nor from a silent peer."""
from __future__ import annotations

import socket
import struct
import subprocess
import threading
import time

import pytest

from rlbcommon import netns
from rlbfabric.bird.conf import FABRIC_RA
from rlblab.bird import Bird
from rlbswitch.discovery import echo_peer, router_peer

pytestmark = pytest.mark.netns
A, B = "rlbdsc-a", "rlbdsc-b"


def ip(*args):
    subprocess.run(["ip", *args], check=True, capture_output=True)


@pytest.fixture
def link():
    for ns in (A, B):
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        ip("netns", "add", ns)
        ip("-n", ns, "link", "set", "lo", "up")
        subprocess.run(["ip", "netns", "exec", ns, "sysctl", "-qw", "net.ipv6.conf.all.accept_dad=0",
                        "net.ipv6.conf.default.accept_dad=0"], check=True)
    try:
        ip("link", "add", "va", "netns", A, "type", "veth", "peer", "name", "vb", "netns", B)
        for ns, dev in ((A, "va"), (B, "vb")):
            ip("-n", ns, "link", "set", dev, "up")
        deadline = time.time() + 5
        while not (_ll(A, "va") and _ll(B, "vb")):
            assert time.time() < deadline, "no link-local addresses"
            time.sleep(0.05)
        yield
    finally:
        for ns in (A, B):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def _ll(ns: str, dev: str) -> str | None:
    out = subprocess.run(["ip", "-n", ns, "-6", "-br", "addr", "show", "dev", dev], capture_output=True, text=True).stdout
    words = [w.split("/")[0] for w in out.split()[2:] if w.startswith("fe80")]
    return words[0] if words else None


def find(how) -> str | None:
    with netns.inside(A):
        return how("va", socket.if_nametoindex("va"), {_ll(A, "va")})


def test_a_peer_answering_echoes_is_found_by_one(link):
    assert find(echo_peer) == _ll(B, "vb")


def test_a_peer_ignoring_echoes_is_found_by_its_router_advertisement(link, tmp_path):
    subprocess.run(["ip", "netns", "exec", B, "sysctl", "-qw", "net.ipv6.icmp.echo_ignore_multicast=1"], check=True)
    assert find(echo_peer) is None
    assert find(router_peer) is None                       # nobody advertises yet
    bird = Bird(B, f'router id 10.0.0.2;\nprotocol device {{ scan time 1; }}\n'
                   f'protocol radv {{ interface "vb" {{ {FABRIC_RA} }}; }}\n', tmp_path, name="b")
    bird.start()
    try:
        deadline = time.time() + 10                        # bird's radv up on the interface
        got = None
        while got is None and time.time() < deadline:
            got = find(router_peer)
        assert got == _ll(B, "vb")
    finally:
        bird.stop()


def test_a_routed_advertisement_is_not_a_neighbour(link):
    """An RA that arrives with hop limit 64 (sent from further away) is ignored, as RFC 4861 has it."""
    subprocess.run(["ip", "netns", "exec", B, "sysctl", "-qw", "net.ipv6.icmp.echo_ignore_multicast=1"], check=True)
    stop = threading.Event()

    def advertise():
        with netns.inside(B):
            s = socket.socket(socket.AF_INET6, socket.SOCK_RAW, socket.IPPROTO_ICMPV6)
            s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_MULTICAST_HOPS, 64)
            ra = struct.pack("!BBHBBHII", 134, 0, 0, 64, 0, 0, 0, 0)
            while not stop.is_set():
                s.sendto(ra, ("ff02::1", 0, 0, socket.if_nametoindex("vb")))
                stop.wait(0.05)
            s.close()
    t = threading.Thread(target=advertise, daemon=True)
    t.start()
    try:
        assert find(router_peer) is None
    finally:
        stop.set()
        t.join()
