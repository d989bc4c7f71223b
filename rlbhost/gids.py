"""RoCE v2 GIDs per RDMA port, read from sysfs: which GID index holds which address, and which
ports sit on a network interface. The verbs library is told a GID index; the agent finds it here
(RLB_SYSFS_INFINIBAND moves the tree, for tests)."""
from __future__ import annotations

import ipaddress
import os
import time
from pathlib import Path

SYSFS = Path(os.environ.get("RLB_SYSFS_INFINIBAND", "/sys/class/infiniband"))
REFRESH_S = 0.1          # a miss re-reads the table at most this often


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:          # an empty entry's attributes cannot be read
        return None


def read_port(dev: str, port: int, sysfs: Path = SYSFS) -> dict[int, tuple[str, str, str]]:
    """{index: (address, type, netdev)} of the port's populated GID entries."""
    base = sysfs / dev / "ports" / str(port)
    out = {}
    try:
        names = os.listdir(base / "gids")
    except OSError:
        return out
    for name in names:
        gid = _read(base / "gids" / name)
        if not gid or gid.replace("0", "").replace(":", "") == "":
            continue
        out[int(name)] = (str(ipaddress.IPv6Address(gid)), _read(base / "gid_attrs" / "types" / name) or "",
                          _read(base / "gid_attrs" / "ndevs" / name) or "")
    return out


def ports(sysfs: Path = SYSFS) -> list[tuple[str, int]]:
    out = []
    try:
        devs = sorted(os.listdir(sysfs))
    except OSError:
        return out
    for dev in devs:
        try:
            out += [(dev, int(p)) for p in sorted(os.listdir(sysfs / dev / "ports"))]
        except (OSError, ValueError):
            continue
    return out


def is_roce_v2(gid_type: str) -> bool:
    return "v2" in gid_type.lower()


class GidTable:
    """The RoCE v2 GIDs of the RDMA ports on the given interfaces (all: None), cached; re-read on
    a miss (at most every REFRESH_S) and when the agent says the interfaces' addresses changed.
    Each RoCE port sits on one netdev (sysfs gid_attrs/ndevs): a server's eight NICs are eight
    ports, each on its NIC."""

    def __init__(self, ifnames: list[str] | str | None = None, sysfs: Path = SYSFS):
        self.ifnames = [ifnames] if isinstance(ifnames, str) else ifnames
        self.sysfs = sysfs
        self.table: dict[tuple[str, int], dict[int, tuple[str, str, str]]] = {}
        # looked up per QP: {ifname: ports on it}, {(dev, port, address): lowest RoCE v2 index}
        self._idx: tuple[dict[str, list[tuple[str, int]]], dict[tuple[str, int, str], int]] = ({}, {})
        self.read_at = 0.0

    def refresh(self):
        """Read again, into a new table (readers in other threads see the old one or the new)."""
        table = {}
        for dev, port in ports(self.sysfs):
            entries = read_port(dev, port, self.sysfs)
            if self.ifnames is None or any(nd in self.ifnames for _, _, nd in entries.values()):
                table[(dev, port)] = entries
        on: dict[str, list[tuple[str, int]]] = {}
        v2: dict[tuple[str, int, str], int] = {}
        for (dev, port), entries in sorted(table.items()):
            for nd in sorted({nd for _, _, nd in entries.values() if nd}):
                on.setdefault(nd, []).append((dev, port))
            for idx, (addr, gtype, _) in sorted(entries.items()):
                if is_roce_v2(gtype):
                    v2.setdefault((dev, port, addr), idx)
        self.table, self._idx = table, (on, v2)       # each swapped whole: readers see old or new
        self.read_at = time.monotonic()

    def served(self) -> list[tuple[str, int]]:
        """The RDMA ports on the interfaces (what the agent places QPs for)."""
        if not self.read_at:
            self.refresh()
        return sorted(self.table)

    def netdev(self, dev: str, port: int, index: int | None = None) -> str | None:
        """The interface an RDMA port (or its GID `index`) is on; None if not one of ours. Looked
        up again once on a miss (a NIC whose device came up after the agent)."""
        for attempt in (0, 1):
            entries = self.table.get((dev, port), {})
            if index is not None and index in entries and entries[index][2]:
                return entries[index][2]
            got = next((nd for _, _, nd in entries.values() if nd), None)
            if got is not None or attempt or time.monotonic() - self.read_at < REFRESH_S:
                return got
            self.refresh()
        return None

    def ports_on(self, ifname: str) -> list[tuple[str, int]]:
        """The RDMA ports on one interface (one, for a RoCE NIC)."""
        if not self.read_at:
            self.refresh()
        return list(self._idx[0].get(ifname, ()))

    def index_of(self, dev: str, port: int, address: str) -> int | None:
        """The RoCE v2 GID index of address on dev/port, or None."""
        for attempt in (0, 1):
            got = self._idx[1].get((dev, port, address))
            if got is not None or attempt or time.monotonic() - self.read_at < REFRESH_S:
                return got
            self.refresh()
        return None

    def by_address(self) -> dict[str, list[dict]]:
        """{address: [{device, port, gid_index}]} of every RoCE v2 GID (for `rlbhost paths`)."""
        if not self.read_at:
            self.refresh()
        out: dict[str, list[dict]] = {}
        for (dev, port), entries in sorted(self.table.items()):
            for idx, (addr, gtype, _) in sorted(entries.items()):
                if is_roce_v2(gtype):
                    out.setdefault(addr, []).append({"device": dev, "port": port, "gid_index": idx})
        return out
