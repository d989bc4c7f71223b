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
