"""A neighbouring switch's heartbeat is answered by the switch's XDP program itself
(BPF_PROG_TEST_RUN, the real program and maps): out of the port it came in by, addresses, MACs
and UDP ports swapped, a valid checksum; only asks from one hop away on a fabric port; nothing
else changes verdict."""
from __future__ import annotations

import struct

import pytest

from rlbcommon import packets as P
from rlbcommon.testrun import XdpMd, prog_test_run
from rlbfabric.routes import NextHop, Route
from rlbswitch.heartbeat import ANSWER, ASK, MAGIC, PORT, WIRE

XDP_DROP, XDP_PASS, XDP_TX, XDP_REDIRECT = 1, 2, 3, 4
ME, PEER = "fe80::1", "fe80::2"
MY_MAC, PEER_MAC = "02:00:00:00:00:01", "02:00:00:00:00:02"


def ask(seq=7, kind=ASK, magic=MAGIC, hop_limit=255, src=PEER, dst=ME, dport=PORT, zero_checksum=False) -> bytes:
    payload = WIRE.pack(magic, kind, 0, 5, seq, 123456789)
    seg = P.udp6(src, dst, 40000, dport, payload, zero_checksum)
    return P.ipv6_frame(src, dst, 17, seg, dmac=MY_MAC, smac=PEER_MAC, hop_limit=hop_limit)


def from_port(xdp, k: int, frame: bytes):
    ctx = XdpMd(data=0, data_end=len(frame), ingress_ifindex=xdp.ifindex[k])
    r = prog_test_run(xdp.dp.prog_fd, frame, ctx=bytes(ctx))
    return r.retval, r.data


@pytest.fixture
def classed(fresh):
    fresh.dp.set_port_class(fresh.ifindex[0], edge=False)      # p0 faces a switch
    fresh.dp.set_port_class(fresh.ifindex[1], edge=True)       # p1 a host
    yield fresh


def test_an_ask_goes_back_as_an_answer_with_a_valid_checksum(classed):
    before = classed.reasons().get("ev_heartbeat", 0)
    verdict, out = from_port(classed, 0, ask(seq=7))
    assert verdict == XDP_TX
    p = P.parse(out)
    assert (p.dmac, p.smac, p.src, p.dst, p.hop_limit) == (PEER_MAC, MY_MAC, ME, PEER, 255)
    sport, dport = struct.unpack("!HH", out[54:58])
    assert (sport, dport) == (PORT, 40000)
    magic, kind, _, port, seq, t_ns = WIRE.unpack_from(out, 62)
    assert (magic, kind, port, seq, t_ns) == (MAGIC, ANSWER, 5, 7, 123456789)
    assert P.udp_checksum_ok(out) and struct.unpack("!H", out[60:62])[0] != 0
    assert classed.reasons().get("ev_heartbeat", 0) == before + 1


@pytest.mark.parametrize("why, frame, port", [
    ("from a host port", ask(), 1),
    ("an answer, not an ask", ask(kind=ANSWER), 0),
    ("another magic", ask(magic=0x12345678), 0),
    ("from further than one hop", ask(hop_limit=254), 0),
    ("another UDP port", ask(dport=PORT + 1), 0),
    ("to a global address from a link-local one", ask(dst="fc00:9::1"), 0),
])
def test_anything_else_goes_to_the_kernel_untouched(classed, why, frame, port):
    verdict, out = from_port(classed, port, frame)
    assert verdict == XDP_PASS and out == frame, why


def test_an_ask_without_a_checksum_is_answered_without_one(classed):
    """The prober sends none (RFC 6936, UDP_NO_CHECK6_TX): a checksum a NIC left partial would
    come back wrong."""
    verdict, out = from_port(classed, 0, ask(seq=9, zero_checksum=True))
    assert verdict == XDP_TX and struct.unpack("!H", out[60:62])[0] == 0
    assert WIRE.unpack_from(out, 62)[1] == ANSWER and P.parse(out).dst == PEER


def test_a_global_destination_is_forwarded_not_answered(classed):
    """Only a link-local ask is answered: one routed to a global address is traffic."""
    classed.dp.add_route(Route("fc00:9::/64", "pinned", [NextHop.parse(classed.nh(2))]))
    verdict, out = from_port(classed, 0, ask(src="fc00:1::1", dst="fc00:9::1"))
    assert verdict == XDP_REDIRECT and P.parse(out).dmac == "02:00:00:00:01:02"
