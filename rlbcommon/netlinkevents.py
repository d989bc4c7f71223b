"""Netlink multicast events (links, neighbours, addresses) read straight from the socket.

pyroute2's IPRoute.get() costs about 3 ms per message (each call runs its asyncio core), so
an agent following a storm of a few thousand events fell seconds behind the kernel. This
reads datagrams itself and parses them with pyroute2's marshal: about 0.2 ms per message.
The receive buffer is raised so that a storm is queued rather than dropped (ENOBUFS)."""
from __future__ import annotations

import select
import socket

from pyroute2.netlink.rtnl.marshal import MarshalRtnl

NETLINK_ROUTE = 0
SO_RCVBUFFORCE = 33          # as root: above net.core.rmem_max
RCVBUF = 16 << 20            # a few thousand link events (a few kB each in the queue)


class NetlinkEvents:
    """One subscription: `with NetlinkEvents(groups) as ev: ev.batch()`."""

    def __init__(self, groups: int, rcvbuf: int = RCVBUF):
        self.sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_ROUTE)
        try:
            self.sock.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, rcvbuf)
        except PermissionError:        # not root: as much as rmem_max allows
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        self.sock.bind((0, groups))
        self.sock.setblocking(False)
        self.marshal = MarshalRtnl()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def close(self):
        self.sock.close()

    def fileno(self) -> int:
        return self.sock.fileno()

    def batch(self, most: int = 4096, timeout: float | None = None) -> list:
        """Wait for events (up to `timeout` s; None: as long as it takes), then take whatever
        else is already queued until it holds `most` messages: a storm is handled as one batch.
        Raises OSError(ENOBUFS) when the kernel dropped events (reported once, so it is not
        caught here): the caller resynchronises, which covers this batch too."""
        if not select.select([self.sock], [], [], timeout)[0]:
            return []
        msgs = []
        while len(msgs) < most:
            try:
                data = self.sock.recv(1 << 16, socket.MSG_DONTWAIT)
            except BlockingIOError:
                break
            msgs.extend(self.marshal.parse(data))
        return msgs
