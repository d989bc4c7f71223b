"""The verbs agents' datagrams leave marked for a control class (VERBS_TCLASS, DSCP CS6), as a
switch's BGP and BFD do, so that a fabric can queue them apart from the RoCE they place."""
from __future__ import annotations

import selectors
import socket

from rlbcommon.constants import VERBS_TCLASS
from rlbhost.probekeys import KeyFile
from rlbhost.verbs.peerlink import PeerLink

IPV6_RECVTCLASS = getattr(socket, "IPV6_RECVTCLASS", 66)


def test_verbs_the_agents_datagrams_carry_the_network_control_traffic_class():
    sel = selectors.DefaultSelector()
    link = PeerLink(0, KeyFile(None), sel, {}, lambda *a: None)
    rx = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
    try:
        link.open()
        rx.bind(("::1", 0))
        rx.setsockopt(socket.IPPROTO_IPV6, IPV6_RECVTCLASS, 1)
        rx.settimeout(2)
        link.udp.sendto(b"ask", ("::1", rx.getsockname()[1]))
        data, anc, _, _ = rx.recvmsg(64, socket.CMSG_SPACE(4))
        tclass = {t: int.from_bytes(d[:4], "little") for lvl, t, d in anc if lvl == socket.IPPROTO_IPV6}
        assert data == b"ask" and tclass == {socket.IPV6_TCLASS: VERBS_TCLASS}
        assert VERBS_TCLASS >> 2 == 48                    # CS6
    finally:
        rx.close()
        link.close()
        sel.close()


def test_verbs_a_fault_handling_one_peer_message_costs_that_message_alone(caplog):
    """A message whose handling raises (a fault of the agent's) is counted and logged with its
    traceback; the datagram's other messages are handled and read() returns normally. (Raised
    out of the round, it lost them all and held every library's answer for the loop's restart.)"""
    from collections import Counter
    from rlbhost.verbs import protocol as P
    handled = []

    def on_message(m, sender, arrived):
        if m.a_qpn == 0x2:
            raise KeyError("")
        handled.append(m.a_qpn)
    sel = selectors.DefaultSelector()
    counters: Counter = Counter()
    link = PeerLink(0, KeyFile(None), sel, counters, on_message)
    tx = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
    try:
        link.open()
        msgs = [P.PeerMsg("USED", 100 + q, a_base="fd00::1", a_qpn=q, b_base="fd00::2", b_qpn=q, path=1).encode()
                for q in (0x1, 0x2, 0x3)]
        body = P.pack_peer(msgs, P.DATAGRAM_MAX)
        assert len(body) == 1
        tx.sendto(body[0], ("::1", link.udp.getsockname()[1]))
        sel.select(2)
        with caplog.at_level("ERROR", logger="rlbhost.verbs.peerlink"):
            link.read()
        assert handled == [0x1, 0x3]
        assert counters["message_errors"] == 1 and counters["bad_messages"] == 0
        assert "KeyError" in caplog.text and "1 so far" in caplog.text
    finally:
        tx.close()
        link.close()
        sel.close()
