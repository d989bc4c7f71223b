"""GPU servers with several fabric NICs, as the specification builds them (Juniper's JVD: H100
servers whose eight GPU NICs gpu0_eth ... gpu7_eth are cabled to eight leaves, rail-optimised:
NIC r of every server of a stripe on leaf r of that stripe).

A NIC is where a QP enters the fabric: it has its own leaf port, its own prefixes (one /64 per
path, as a one-NIC host's port has) and is placed by the coordinator as a host of its own. In the
fabric's host list (ClosFabric.hosts) it is named `<server>-<nic>`; the server is the machine
that runs one agent for all its NICs.

    [[server]]                            # one server, its NICs and the leaf each is cabled to
    name = "a1"
    nics = { gpu0_eth = "l1", gpu1_eth = "l2" }     # or [{ name = "gpu0_eth", leaf = "l1" }, ...]

    [[stripe]]                            # the common case: server i's NIC r on leaves[r]
    leaves = ["l1", "l2", "l3", "l4"]     # rail r (counted from 0, as in gpu0_eth) -> its leaf
    servers = ["a1", "a2"]
    nic = "gpu{rail}_eth"                 # the NICs' names (default); rails = 4 is optional

A leaf's port towards a server's NIC is eth-<server> (eth-<server>_<k> when several NICs of that
server share the leaf); on the server the port is the NIC's own name."""
from __future__ import annotations

import re
from dataclasses import dataclass

from .base import NAME, FabricError, Node

NIC_NAME = re.compile(r"^[a-z][a-z0-9_]{0,14}$")     # an interface name (IFNAMSIZ - 1), no '-'
DEFAULT_NIC = "gpu{rail}_eth"
MAX_PORTS = 9999          # host ports on a leaf: the address plan writes the port in one hextet


@dataclass(frozen=True)
class Nic:
    server: str
    name: str             # the NIC's interface on the server, e.g. gpu0_eth
    leaf: str
    rail: int | None      # its rail (0-based) when it came from a stripe
    leaf_ifname: str      # the leaf's port towards it

    @property
    def endpoint(self) -> str:
        return endpoint_name(self.server, self.name)


def endpoint_name(server: str, nic: str) -> str:
    """A NIC's name among the fabric's hosts."""
    return f"{server}-{nic}"


def parse_servers(data: dict, leaves: list[Node], seen: set[str], where: str) -> list[Nic]:
    """Every [[stripe]]'s and [[server]]'s NICs, in file order; their endpoints are appended to
    their leaves' hosts (the leaf's ports after its one-NIC hosts)."""
    by_name = {lf.name: lf for lf in leaves}
    declared: list[tuple[str, list[tuple[str, str, int | None]]]] = []   # (server, [(nic, leaf, rail)])
    for i, st in enumerate(_tables(data, "stripe", where), start=1):
        declared += _stripe(st, i, by_name, where)
    for i, sv in enumerate(_tables(data, "server", where), start=1):
        declared.append(_server(sv, i, where))
    out: list[Nic] = []
    for server, nics in declared:
        if not isinstance(server, str) or not NAME.match(server):
            raise FabricError(f"{where}: server name {server!r}: lowercase letters and digits, at most 10")
        if server in seen:
            raise FabricError(f"{where}: server name {server!r} used twice (names are unique across "
                              "switches, hosts and servers)")
        seen.add(server)
        if not nics:
            raise FabricError(f"{where}: server {server} has no NICs")
        leaf_of: dict[str, str] = {}
        for nic, leaf, _ in nics:
            if not isinstance(nic, str) or not NIC_NAME.match(nic):
                raise FabricError(f"{where}: server {server}: NIC name {nic!r}: an interface name of lowercase "
                                  "letters, digits and '_', at most 15, starting with a letter")
            if nic in leaf_of:
                raise FabricError(f"{where}: server {server}: NIC {nic} on two leaves ({leaf_of[nic]} and "
                                  f"{leaf}): a NIC has one cable" if leaf_of[nic] != leaf else
                                  f"{where}: server {server}: NIC {nic} named twice")
            if leaf not in by_name:
                raise FabricError(f"{where}: server {server}: NIC {nic} is cabled to {leaf!r}, which is not a "
                                  f"leaf (leaves: {', '.join(by_name)})")
            leaf_of[nic] = leaf
        per_leaf: dict[str, int] = {}
        for nic, leaf, _ in nics:
            per_leaf[leaf] = per_leaf.get(leaf, 0) + 1
        k: dict[str, int] = {}
        for nic, leaf, rail in nics:
            k[leaf] = k.get(leaf, 0) + 1
            ifname = f"eth-{server}" if per_leaf[leaf] == 1 else f"eth-{server}_{k[leaf]}"
            if len(ifname) > 15:
                raise FabricError(f"{where}: server {server} has {per_leaf[leaf]} NICs on {leaf}: the leaf's "
                                  f"port {ifname} would exceed 15 characters (name the server in at most 8)")
            out.append(Nic(server, nic, leaf, rail, ifname))
    for nic in out:
        by_name[nic.leaf].hosts.append(nic.endpoint)
    for lf in leaves:
        if len(lf.hosts) > MAX_PORTS:
            raise FabricError(f"{where}: leaf {lf.name} has {len(lf.hosts)} host ports: at most {MAX_PORTS} "
                              "(the address plan writes the port in one hextet)")
    return out


def _tables(data: dict, key: str, where: str) -> list[dict]:
    v = data.get(key, [])
    if not isinstance(v, list) or not all(isinstance(t, dict) for t in v):
        raise FabricError(f"{where}: {key} must be [[{key}]] tables")
    return v


def _stripe(st: dict, i: int, leaves: dict[str, Node], where: str) -> list[tuple[str, list]]:
    what = f"{where}: stripe {st.get('name', i)}"
    names = st.get("leaves")
    if not isinstance(names, list) or not names or not all(isinstance(n, str) for n in names):
        raise FabricError(f"{what}: leaves must list the leaf of each rail, rail 0 first")
    for n in names:
        if n not in leaves:
            raise FabricError(f"{what}: {n!r} is not a leaf (leaves: {', '.join(leaves)})")
    if len(set(names)) != len(names):
        raise FabricError(f"{what}: a leaf is named for two rails ({', '.join(names)})")
    rails = st.get("rails", len(names))
    if type(rails) is not int or rails < 1:
        raise FabricError(f"{what}: rails must be a positive whole number")
    if rails > len(names):
        raise FabricError(f"{what}: rail {len(names)} has no leaf (rails = {rails}, leaves {', '.join(names)}; "
                          "rails count from 0)")
    if rails < len(names):
        raise FabricError(f"{what}: {len(names)} leaves for {rails} rails: one leaf a rail")
    servers = st.get("servers")
    if not isinstance(servers, list) or not servers:
        raise FabricError(f"{what}: servers must list the stripe's servers")
    template = st.get("nic", DEFAULT_NIC)
    if not isinstance(template, str) or "{rail}" not in template:
        raise FabricError(f"{what}: nic {template!r} must contain {{rail}}, e.g. {DEFAULT_NIC!r}")
    try:
        nics = [(template.format(rail=r), names[r], r) for r in range(rails)]
    except (KeyError, IndexError, ValueError) as e:
        raise FabricError(f"{what}: nic {template!r}: {e}") from None
    return [(s, nics) for s in servers]


def _server(sv: dict, i: int, where: str) -> tuple[str, list]:
    name = sv.get("name")
    nics = sv.get("nics")
    if isinstance(nics, dict):
        out = [(n, leaf, None) for n, leaf in nics.items()]
    elif isinstance(nics, list) and all(isinstance(n, dict) for n in nics):
        out = [(n.get("name"), n.get("leaf"), None) for n in nics]
    else:
        raise FabricError(f"{where}: server {name or i}: nics must map each NIC to its leaf, e.g. "
                          "nics = { gpu0_eth = \"l1\", gpu1_eth = \"l2\" }")
    return name, out
