"""The fabric description: one TOML file describes the whole fabric (roles, ASes, links, hosts,
address plan); bird configs, agents and labs are all derived from it.

    [fabric]
    paths = 4                 # prefixes (colours) per host port = spines
    prefix = "fc00"           # host port prefix: <prefix>:<leaf>:<port>:<path>::/64
    policy = "dpf"            # dpf | fare | ecmp | dlb (per-prefix overrides in [policy])
    link_mbps = 10000         # default link bandwidth (veths report none)
    bfd = true
    pathbw_subtype = 0x88     # FARE path bandwidth ext community sub-type (the draft says TBD)

    [[spine]]                 # colour k = k-th spine
    name = "s1"
    asn = 65000

    [[leaf]]
    name = "l1"
    asn = 65001
    hosts = ["h1", "h2"]      # host ports eth-h1 ... on the leaf, eth0 on the host

    [[link]]                  # optional: a slower leaf-spine link
    between = ["l1", "s2"]
    mbps = 5000

Interfaces: a leaf's port to spine S is eth-S, a spine's port to leaf L is eth-L."""
from __future__ import annotations

import ipaddress
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

NAME = re.compile(r"^[a-z][a-z0-9]{0,9}$")
POLICIES = ("dpf", "fare", "ecmp", "dlb")


class FabricError(ValueError):
    pass


@dataclass
class Node:
    name: str
    role: str
    asn: int
    index: int                    # 1-based within its role
    hosts: list[str] = field(default_factory=list)


@dataclass
class Fabric:
    spines: list[Node]
    leaves: list[Node]
    paths: int
    prefix: str
    policy: str
    link_mbps: int
    bfd: bool
    pathbw_subtype: int
    link_overrides: dict[frozenset, int]
    policy_overrides: dict[str, str]

    # ---- lookups ----------------------------------------------------------------------
    def node(self, name: str) -> Node:
        for n in self.spines + self.leaves:
            if n.name == name:
                return n
        raise FabricError(f"no node {name!r} in the fabric (have {', '.join(n.name for n in self.spines + self.leaves)})")

    def colour(self, spine: Node) -> int:
        return spine.index

    def link_mbps_between(self, a: str, b: str) -> int:
        return self.link_overrides.get(frozenset((a, b)), self.link_mbps)

    def host_ports(self, leaf: Node) -> list[tuple[int, str, str]]:
        """(port number, host name, leaf interface) for each host of a leaf."""
        return [(i + 1, h, f"eth-{h}") for i, h in enumerate(leaf.hosts)]

    def host_prefixes(self, leaf: Node, port: int) -> list[ipaddress.IPv6Network]:
        """One /64 per path on a host port; path k is colour k."""
        return [ipaddress.IPv6Network(f"{self.prefix}:{leaf.index}:{port}:{k}::/64")
                for k in range(1, self.paths + 1)]

    def leaf_of_host(self, host: str) -> tuple[Node, int]:
        for leaf in self.leaves:
            for port, h, _ in self.host_ports(leaf):
                if h == host:
                    return leaf, port
        raise FabricError(f"no host {host!r}")

    def all_prefixes(self):
        """(leaf, port, path k, prefix) for every host prefix in the fabric."""
        for leaf in self.leaves:
            for port, _, _ in self.host_ports(leaf):
                for k, net in enumerate(self.host_prefixes(leaf, port), start=1):
                    yield leaf, port, k, net

    def policy_for(self, net: str) -> str:
        n = ipaddress.IPv6Network(net)
        best = None
        for prefix, pol in self.policy_overrides.items():
            p = ipaddress.IPv6Network(prefix)
            if n.subnet_of(p) and (best is None or p.prefixlen > best[0]):
                best = (p.prefixlen, pol)
        return best[1] if best else self.policy

    def asns(self) -> list[int]:
        return sorted({n.asn for n in self.spines + self.leaves})


def load(path: str | Path) -> Fabric:
    try:
        data = tomllib.loads(Path(path).read_text())
    except FileNotFoundError:
        raise FabricError(f"fabric file {path} not found") from None
    except tomllib.TOMLDecodeError as e:
        raise FabricError(f"{path}: {e}") from None
    return parse(data, str(path))


def parse(data: dict, where: str = "fabric") -> Fabric:
    f = data.get("fabric", {})
    spines, leaves, seen = [], [], set()
    for role, out in (("spine", spines), ("leaf", leaves)):
        for i, n in enumerate(data.get(role, []), start=1):
            name, asn = n.get("name"), n.get("asn")
            if not isinstance(name, str) or not NAME.match(name):
                raise FabricError(f"{where}: {role} {i}: name must be lowercase letters/digits, at most 10")
            if name in seen:
                raise FabricError(f"{where}: node name {name!r} used twice")
            seen.add(name)
            if not isinstance(asn, int) or not 1 <= asn <= 65535:
                raise FabricError(f"{where}: {name}: asn must be a 2-byte AS number (1-65535)")
            hosts = n.get("hosts", [])
            if role == "spine" and hosts:
                raise FabricError(f"{where}: spine {name} cannot have hosts")
            for h in hosts:
                if not NAME.match(h) or h in seen:
                    raise FabricError(f"{where}: host name {h!r} invalid or used twice")
                seen.add(h)
            out.append(Node(name, role, asn, i, list(hosts)))
    if not spines or not leaves:
        raise FabricError(f"{where}: needs at least one [[spine]] and one [[leaf]]")
    paths = f.get("paths", len(spines))
    if not isinstance(paths, int) or not 1 <= paths <= 16:
        raise FabricError(f"{where}: paths must be 1-16")
    if paths % len(spines):
        raise FabricError(f"{where}: paths ({paths}) must be a multiple of the spines ({len(spines)})")
    policy = f.get("policy", "dpf")
    overrides = data.get("policy", {})
    for p in [policy, *overrides.values()]:
        if p not in POLICIES:
            raise FabricError(f"{where}: policy {p!r}: choose one of {', '.join(POLICIES)}")
    links = {}
    for ln in data.get("link", []):
        a, b = ln.get("between", [None, None])
        for x in (a, b):
            if x not in seen:
                raise FabricError(f"{where}: link between {a!r} and {b!r}: unknown node")
        links[frozenset((a, b))] = int(ln["mbps"])
    prefix = f.get("prefix", "fc00")
    try:
        ipaddress.IPv6Network(f"{prefix}:1:1:1::/64")
    except ValueError:
        raise FabricError(f"{where}: prefix {prefix!r} must be one hextet, e.g. 'fc00'") from None
    return Fabric(spines, leaves, paths, prefix, policy, int(f.get("link_mbps", 10000)),
                  bool(f.get("bfd", True)), int(f.get("pathbw_subtype", 0x88)), links, overrides)
