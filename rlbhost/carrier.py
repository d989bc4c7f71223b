"""The carrier watcher: the fast path of a plane failure seen locally (draft-fare-scale-up §3).

A GPU's ports lose carrier when their plane switch (or its cable) fails. The host agent follows
that too, but it is a large Python process whose every reaction (weights, bird, rebalance) takes
milliseconds, and longer on a busy host. This watcher does one thing: it follows the kernel's link
events on a raw netlink socket and keeps the `port_down` map (bit i = path i's port has no
carrier) equal to the ports' carrier, one map write per change. The data plane reads that map on
every packet, so a QP on a dead port moves with its next packet, before the agent has even read
the event. It is stateless (the map is recomputed from the kernel's view on start), runs at a
real-time priority when it may, and dies with the agent that started it (which restarts it).

The kernel publishes a carrier change through its link watcher, which needs the RTNL lock and
rate-limits a physical port's down events to one batch a second: this watcher reacts to the
event within its own wake-up, but cannot see a carrier change before the kernel reports it.

Run by the agent: python -m rlbhost.carrier --pins DIR --port eth-p1-1=0 --port ...
"""
from __future__ import annotations

import argparse
import ctypes as ct
import logging
import os
import signal
import socket
import struct
import sys
import time
from pathlib import Path

from rlbcommon import nlmsg

log = logging.getLogger("rlbhost.carrier")

NETLINK_ROUTE, RTMGRP_LINK = 0, 1
RTM_NEWLINK, RTM_DELLINK, RTM_GETLINK = 16, 17, 18
IFLA_IFNAME = 3
IFINFOMSG = struct.Struct("=BxHiII")      # family, type, index, flags, change
PR_SET_PDEATHSIG = 1
MAP_NAME = "port_down"


def link_events(buf: bytes):
    """(event, ifindex, name or None, carrier) for each link message in a netlink datagram;
    ("done", ...) at the end of a dump. Carrier = administratively up and lower layer up."""
    for mtype, _seq, body in nlmsg.messages(buf):
        if mtype == nlmsg.NLMSG_DONE:
            yield "done", 0, None, False
        elif mtype == nlmsg.NLMSG_ERROR and (err := nlmsg.error(body)):
            raise err
        elif mtype in (RTM_NEWLINK, RTM_DELLINK):
            _fam, _type, index, flags, _change = IFINFOMSG.unpack_from(body)
            name = next((v.split(b"\0", 1)[0].decode() for k, v in nlmsg.attributes(body[IFINFOMSG.size:])
                         if k == IFLA_IFNAME), None)
            up = mtype == RTM_NEWLINK and nlmsg.link_up(flags)
            yield ("del" if mtype == RTM_DELLINK else "new"), index, name, bool(up)


def down_mask(ports: dict[str, int], carrier: dict[str, bool]) -> int:
    """Bit i set for the path i whose port has no carrier (or does not exist)."""
    mask = 0
    for name, index in ports.items():
        if not carrier.get(name, False):
            mask |= 1 << index
    return mask


class CarrierWatch:
    def __init__(self, pins: Path, ports: dict[str, int]):
        from rlbcommon import libbpf  # ctypes only: no compiler in this process
        self.libbpf = libbpf
        self.fd = libbpf.obj_get(str(pins / MAP_NAME))
        self.ports = ports
        self.carrier: dict[str, bool] = {}
        self.names: dict[int, str] = {}
        self.mask: int | None = None

    def write(self):
        mask = down_mask(self.ports, self.carrier)
        if mask == self.mask:
            return
        key, val = ct.c_uint32(0), ct.c_uint32(mask)
        self.libbpf.check(self.libbpf.lib.bpf_map_update_elem(self.fd, ct.byref(key), ct.byref(val), 0),
                          "update port_down")
        if self.mask is not None:
            down = sorted(n for n in self.ports if not self.carrier.get(n, False))
            log.info("ports without carrier: %s", ", ".join(down) or "none")
        self.mask = mask

    def apply(self, event: str, index: int, name: str | None, up: bool) -> bool:
        """One link message; True when it concerns one of the ports."""
        name = name or self.names.get(index)
        if name is None or name not in self.ports:
            return False
        self.names[index] = name
        self.carrier[name] = up and event == "new"
        return True

    def dump(self):
        with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_ROUTE) as s:
            s.bind((0, 0))
            req = nlmsg.HDR.pack(nlmsg.HDR.size + 16, RTM_GETLINK, nlmsg.NLM_F_REQUEST | nlmsg.NLM_F_DUMP, 1, 0)
            s.send(req + struct.pack("=BxHiII", socket.AF_UNSPEC, 0, 0, 0, 0))
            self.carrier.clear()
            while True:
                for ev in link_events(s.recv(1 << 16)):
                    if ev[0] == "done":
                        return
                    self.apply(*ev)

    def run(self, stop=lambda: False):
        while not stop():
            with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_ROUTE) as mon:
                mon.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
                mon.bind((0, RTMGRP_LINK))    # subscribe first: nothing falls between the two
                self.dump()
                self.write()
                try:
                    while not stop():
                        data = mon.recv(1 << 16)
                        if any([self.apply(*ev) for ev in link_events(data) if ev[0] != "done"]):
                            self.write()
                except OSError as e:        # ENOBUFS: events were lost, read the state again
                    log.warning("link events: %s; reading every port again", e)


def _die_with_parent():
    libc = ct.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    if os.getppid() == 1:      # the parent is already gone
        sys.exit(0)


def _realtime(priority: int):
    if priority <= 0:
        return
    try:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(priority))
    except OSError as e:
        log.warning("no real-time priority (%s): carrier reactions wait for the CPU", e)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m rlbhost.carrier", description=__doc__.split("\n\n")[1],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pins", required=True, type=Path, help="the host data plane's pin directory")
    ap.add_argument("--port", action="append", default=[], metavar="IFNAME=PATH",
                    help="a port and the path index (0-based) it carries; repeat for each port")
    ap.add_argument("--rt-priority", type=int, default=10, help="SCHED_FIFO priority (0: normal)")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s carrier %(levelname)s %(message)s")
    ports = {}
    for spec in args.port:
        name, sep, index = spec.partition("=")
        if not sep or not index.isdigit() or int(index) >= 32:
            ap.error(f"--port {spec!r}: expected IFNAME=PATH with PATH 0..31")
        ports[name] = int(index)
    if not ports:
        ap.error("no --port given")
    _die_with_parent()
    _realtime(args.rt_priority)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    watch = CarrierWatch(args.pins, ports)
    log.info("following carrier of %d ports (%s)", len(ports), ", ".join(sorted(ports)))
    while True:
        try:
            watch.run()
        except OSError as e:
            log.error("%s; again in 0.1 s", e)
            time.sleep(0.1)


if __name__ == "__main__":
    sys.exit(main())
