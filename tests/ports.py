"""Ports for the servers tests start (etcd): below the kernel's ephemeral range, so that another
process's outgoing connection (a worker's lab beside this one) cannot take one between the pick and
the server's bind, as bind(0) then close allowed; and never the same one twice in a process."""
from __future__ import annotations

import random
import socket

_given: set[int] = set()


def free_port() -> int:
    with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
        ephemeral = int(f.read().split()[0])
    while True:
        port = random.randrange(10000, ephemeral)
        if port in _given:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        _given.add(port)
        return port
