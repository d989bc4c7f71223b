"""Netlink framing, for the readers that speak a netlink family themselves (the carrier watcher's
rtnetlink, the verbs service's rdma netlink): message headers, errors and attributes."""
from __future__ import annotations

import os
import struct

NLMSG_ERROR, NLMSG_DONE = 2, 3
NLM_F_REQUEST, NLM_F_DUMP = 0x1, 0x300
HDR = struct.Struct("=IHHII")        # nlmsghdr: len, type, flags, seq, pid
NLA = struct.Struct("=HH")           # nlattr / rtattr: len, type
NLA_TYPE_MASK = 0x3FFF               # without NLA_F_NESTED / NLA_F_NET_BYTEORDER
IFF_UP, IFF_LOWER_UP = 0x1, 0x10000  # <linux/if.h>: a link set up, and its carrier


def link_up(flags: int) -> bool:
    """A link's ifi_flags say it forwards: set up and with carrier."""
    return flags & (IFF_UP | IFF_LOWER_UP) == (IFF_UP | IFF_LOWER_UP)


def messages(buf: bytes):
    """(type, seq, payload) of each whole message in a datagram (an error is a message too:
    error() reads it, so a reader can tell whose question it answers first)."""
    off = 0
    while off + HDR.size <= len(buf):
        length, kind, _flags, seq, _pid = HDR.unpack_from(buf, off)
        if length < HDR.size:
            return
        yield kind, seq, buf[off + HDR.size:off + length]
        off += (length + 3) & ~3


def error(payload: bytes) -> OSError | None:
    """An NLMSG_ERROR message's error (None: an acknowledgement)."""
    (err,) = struct.unpack_from("=i", payload)
    return OSError(-err, f"netlink: {os.strerror(-err)}") if err else None


def attributes(buf: bytes):
    """(type, payload) of each attribute at one level, as far as they are whole."""
    off = 0
    while off + NLA.size <= len(buf):
        n, kind = NLA.unpack_from(buf, off)
        if n < NLA.size or off + n > len(buf):
            return
        yield kind & NLA_TYPE_MASK, buf[off + NLA.size:off + n]
        off += (n + 3) & ~3
