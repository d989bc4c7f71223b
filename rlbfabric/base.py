"""What every fabric kind is made of, and the registry of kinds.

A fabric file's [fabric] kind names one module (rlbfabric/clos.py, scaleup.py, railonly.py), which
imports only this one and registers its parser with @kind; rlbfabric/fabric.py loads a file
through the registry. A kind's fabric follows the `Fabric` protocol below: what every layer may
ask of any kind. What only one kind has (a Clos fabric's leaves, a scale-up fabric's planes) is
asked of that kind's class, by code registered for that kind."""
from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass, field
from typing import Callable, ClassVar, Protocol

from .bgpsec import BgpSecurity
from .errors import FabricError

__all__ = ["Fabric", "FabricError", "Node", "Port", "KINDS", "kind", "node_name_asn", "one_hextet_prefix",
           "SWITCH_LL", "GPU_LL", "LOOPBACK_DEVICE"]

# A GPU's point-to-point ports (scale-up planes, rail-only rails) carry these link-local
# addresses at each end; its own address lives on a dummy device.
SWITCH_LL, GPU_LL = "fe80::1", "fe80::2"
LOOPBACK_DEVICE = "rlb0"      # where a GPU's loopback lives and the peers' loopbacks are routed

NAME = re.compile(r"^[a-z][a-z0-9]{0,9}$")


@dataclass
class Node:
    name: str
    role: str
    asn: int
    index: int                    # 1-based within its role
    hosts: list[str] = field(default_factory=list)
    pod: int = 1
    plane: int = 0                # spines: position in the pod; super-spines: given


@dataclass(frozen=True)
class Port:
    """One side of a fabric link."""
    peer: "Node"
    link: int          # 1..parallel between a leaf and a spine, else 1
    ifname: str        # this side: eth-<peer>, or eth-<peer>-<link> with parallel links
    peer_ifname: str
    colour: int        # a leaf's uplink: the colour id it carries AIGP for; else 0
    bgp_name: str      # bird protocol name for the session on this port



class Fabric(Protocol):
    """What any fabric kind offers every layer."""
    kind: ClassVar[str]
    bgp: BgpSecurity

    @property
    def switches(self) -> list[Node]: ...

    @property
    def hosts(self) -> list[str]: ...

    def node(self, name: str) -> Node: ...

    def is_gpu(self, node: str) -> bool: ...


KINDS: dict[str, Callable[[dict, str], Fabric]] = {}     # [fabric] kind -> its parser


def kind(name: str):
    """Registers a fabric kind's parser: parse(data, where) -> that kind's fabric."""
    def register(parse: Callable[[dict, str], Fabric]):
        if name in KINDS:
            raise ValueError(f"fabric kind {name!r} registered twice")
        KINDS[name] = parse
        return parse
    return register


def node_name_asn(n: dict, role: str, i: int, where: str, seen: set[str]) -> tuple[str, int]:
    """A node table's name (unique across the file; added to `seen`) and 2-byte AS number."""
    name, asn = n.get("name"), n.get("asn")
    if not isinstance(name, str) or not NAME.match(name):
        raise FabricError(f"{where}: {role} {i}: name must be lowercase letters/digits, at most 10")
    if name in seen:
        raise FabricError(f"{where}: node name {name!r} used twice")
    seen.add(name)
    if not isinstance(asn, int) or not 1 <= asn <= 65535:
        raise FabricError(f"{where}: {name}: asn must be a 2-byte AS number (1-65535)")
    return name, asn


def one_hextet_prefix(f: dict, where: str) -> str:
    """[fabric] prefix of a scale-up or rail-only fabric: the one hextet its addresses start with."""
    prefix = f.get("prefix", "fc00")
    try:
        if not isinstance(prefix, str) or ":" in prefix:
            raise ValueError
        ipaddress.IPv6Network(f"{prefix}::/16")
    except ValueError:
        raise FabricError(f"{where}: prefix {prefix!r} must be one hextet, e.g. 'fc00'") from None
    return prefix
