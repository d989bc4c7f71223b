"""What an operator (or the bird2-fed agent) asks the switch data plane for: routes and next hops.

Text forms, as the CLI takes them:
  next hop   fe80::1%eth1      neighbour on eth1 (MAC from the kernel's neighbour table)
             eth1@02:00:00:00:00:02   fixed MAC, no neighbour lookup
             ...=3             with weight 3 (weighted mode)
"""
from __future__ import annotations

import functools
import ipaddress
import re
from dataclasses import dataclass, field

from rlbcommon.constants import U32_MAX
from rlbcommon.ipv6 import ipv6_network

MODES = ("pinned", "weighted", "ecmp", "dlb", "spray", "connected", "local")
_MAC = re.compile(r"^([0-9a-fA-F]{2}:){5}[0-9a-fA-F]{2}$")
_IFNAME = re.compile(r"^[A-Za-z0-9_.:-]{1,15}$")


class RouteError(ValueError):
    """Bad route or next-hop input; the message is meant for the operator."""


@dataclass(frozen=True)
class NextHop:
    ifname: str
    gateway: str | None = None   # IPv6 address of the neighbour
    mac: str | None = None       # static MAC instead of a neighbour lookup
    weight: int = 1

    @classmethod
    def parse(cls, text: str) -> "NextHop":
        return _parse_nexthop(cls, text)

    def __str__(self) -> str:
        base = f"{self.gateway}%{self.ifname}" if self.gateway else f"{self.ifname}@{self.mac}"
        return base if self.weight == 1 else f"{base}={self.weight}"


@functools.lru_cache(maxsize=4096)
def _parse_nexthop(cls, text: str) -> NextHop:
    """NextHop.parse, remembered: a table of routes names a few next hops many times (16384
    pinned routes with three backups each name four), and a NextHop is frozen."""
    spec, weight = text, 1
    if "=" in text:
        spec, _, w = text.rpartition("=")
        try:
            weight = int(w)
        except ValueError:
            raise RouteError(f"next hop {text!r}: weight {w!r} is not a whole number") from None
        if not 1 <= weight <= U32_MAX:
            raise RouteError(f"next hop {text!r}: weight must be at least 1 and at most {U32_MAX}")
    if "%" in spec:
        addr, _, ifname = spec.partition("%")
        try:
            gw = ipaddress.IPv6Address(addr)
        except ValueError:
            raise RouteError(f"next hop {text!r}: {addr!r} is not an IPv6 address") from None
        nh = cls(ifname, gateway=str(gw), weight=weight)
    elif "@" in spec:
        ifname, _, mac = spec.partition("@")
        if not _MAC.match(mac):
            raise RouteError(f"next hop {text!r}: {mac!r} is not a MAC address")
        nh = cls(ifname, mac=mac.lower(), weight=weight)
    else:
        raise RouteError(f"next hop {text!r}: use ADDRESS%IFACE or IFACE@MAC (optionally =WEIGHT)")
    if not _IFNAME.match(nh.ifname):
        raise RouteError(f"next hop {text!r}: {nh.ifname!r} is not an interface name")
    return nh


@dataclass
class Route:
    prefix: ipaddress.IPv6Network
    mode: str
    nexthops: list[NextHop] = field(default_factory=list)  # pinned: exactly one (the primary)
    backups: list[NextHop] = field(default_factory=list)   # pinned: the DLB backup group
    dev: str | None = None                                 # connected: the host port

    def __post_init__(self):
        if isinstance(self.prefix, str):
            try:
                self.prefix = ipv6_network(self.prefix)
            except ValueError as e:
                raise RouteError(f"prefix: {e}") from None
        if self.mode not in MODES:
            raise RouteError(f"mode {self.mode!r}: choose one of {', '.join(MODES)}")
        n = len(self.nexthops)
        if self.mode == "pinned" and n != 1:
            raise RouteError("pinned needs exactly one --via (the primary); add --backup for the rest")
        if self.mode in ("weighted", "ecmp", "dlb", "spray") and n == 0:
            raise RouteError(f"{self.mode} needs at least one --via")
        if self.mode == "connected" and not self.dev:
            raise RouteError("connected needs --dev")
        if self.mode in ("connected", "local") and (n or self.backups):
            raise RouteError(f"{self.mode} takes no next hops")
        if self.backups and self.mode != "pinned":
            raise RouteError("--backup is only for pinned routes")
        for h in self.nexthops + list(self.backups or []):
            if not isinstance(h.weight, int) or not 1 <= h.weight <= U32_MAX:
                raise RouteError(f"next hop {h.ifname}: weight {h.weight!r} must be a whole number 1..{U32_MAX}")
        if self.mode == "ecmp":
            self.nexthops = [NextHop(h.ifname, h.gateway, h.mac, 1) for h in self.nexthops]
        if len({(h.ifname, h.gateway, h.mac) for h in self.nexthops}) != n:
            raise RouteError("the same next hop is given twice")

    @classmethod
    def from_json(cls, e: dict) -> "Route":
        """A route from JSON: what `route show --json` prints (programmed state, with ids and
        counters, which are ignored) or the plain form of to_dict()."""
        if not isinstance(e, dict) or "prefix" not in e or "mode" not in e:
            raise RouteError(f"a route needs a prefix and a mode: {e!r}")
        mode = e["mode"]
        if mode == "connected":
            return cls(e["prefix"], mode, dev=e.get("dev"))
        if mode == "local":
            return cls(e["prefix"], mode)

        def hops(items):
            out = []
            for h in items or []:
                if isinstance(h, str):
                    out.append(NextHop.parse(h))
                elif isinstance(h, dict) and "via" in h:
                    w = h.get("weight", 1)
                    out.append(NextHop.parse(h["via"] if w == 1 else f"{h['via']}={w}"))
                else:
                    raise RouteError(f"{e['prefix']}: next hop {h!r}: a string or an object with 'via'")
            return out

        if "nexthops" in e:
            via = hops(e["nexthops"])
        elif "nexthop" in e:
            via = hops([e["nexthop"]])
        else:
            via = hops(e.get("members"))
        return cls(e["prefix"], mode, via, hops(e.get("backups")), e.get("dev"))

    def to_dict(self) -> dict:
        return {"prefix": str(self.prefix), "mode": self.mode,
                "nexthops": [str(h) for h in self.nexthops],
                "backups": [str(h) for h in self.backups], "dev": self.dev}
