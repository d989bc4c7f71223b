"""What every fabric kind is made of, and the registry of kinds.

A fabric file's [fabric] kind names one module of rlbfabric/kinds/ (clos.py, scaleup.py,
railonly.py), which registers its parser with @kind; rlbfabric/fabric.py loads a file through the
registry. A kind's fabric follows the `Fabric` protocol below: what every layer may ask of any
kind; a kind whose switches run BGP follows `SwitchedFabric` too. What only one kind has (a Clos
fabric's leaves, a scale-up fabric's planes) is asked of that kind's class, by code registered for
that kind."""
from __future__ import annotations

import ipaddress
import re
import subprocess
from dataclasses import dataclass, field
from typing import Callable, ClassVar, Protocol

from .bgpsec import BgpSecurity
from .errors import FabricError

__all__ = ["ByKind", "Fabric", "SwitchedFabric", "OneHostAMachine", "FabricError", "Link", "Node", "Port", "KINDS", "kind", "node_name_asn", "one_hextet_prefix",
           "SWITCH_LL", "GPU_LL", "LOOPBACK_DEVICE", "SWITCH_ROLES", "add_loopback_device"]

# A GPU's point-to-point ports (scale-up planes, rail-only rails) carry these link-local
# addresses at each end; its own address lives on a dummy device.
SWITCH_LL, GPU_LL = "fe80::1", "fe80::2"
LOOPBACK_DEVICE = "rlb0"      # where a GPU's loopback lives and the peers' loopbacks are routed

SWITCH_ROLES = ("leaf", "spine", "superspine")     # a scale-up plane switch is a "spine"

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
    daemon: str = "bird"          # its routing daemon: bird (with rlbswitch), or frr (ROUTING_DAEMONS)


# what a switch's BGP runs on: bird, fed to XDP by rlbswitch; or FRR, a spine of another make
# (the kernel forwards; rlbfabric/frr renders its config)
ROUTING_DAEMONS = ("bird", "frr")


@dataclass(frozen=True)
class Port:
    """One side of a fabric link."""
    peer: "Node"
    link: int          # 1..parallel between a leaf and a spine, else 1
    ifname: str        # this side: eth-<peer>, or eth-<peer>-<link> with parallel links
    peer_ifname: str
    colour: int        # a leaf's uplink: the colour id it carries AIGP for; else 0
    bgp_name: str      # bird protocol name for the session on this port



Link = tuple[str, str, str, str, int]     # (a, a's ifname, b, b's ifname, Mb/s)


class Fabric(Protocol):
    """What any fabric kind offers every layer: the layers ask these, never the kind's name."""
    kind: ClassVar[str]
    bgp: BgpSecurity
    # hosts take one address per path (SLAAC) and run Soft-RoCE and the verbs library in the VM
    # lab; else GPUs whose ports hang off a loopback device
    paths_by_address: ClassVar[bool]
    # a fabric-wide service the hosts report to: the QP coordinator or the h-score registry
    # (rlbcoord: COORDINATORS)
    coordinated: ClassVar[bool]
    # rlbdeploy.units renders its systemd units (and so the VM lab can run it)
    rendered_units: ClassVar[bool]
    # its switches run BGP (bird fed to rlbswitch, or FRR): it is a SwitchedFabric as well
    bgp_switches: ClassVar[bool]

    def summary(self) -> str:
        """The fabric in one phrase, for people (rlblab up and status, logs)."""

    def links(self) -> list[Link]:
        """Every point-to-point link, switch links first (lower tier up), then host ports."""

    def switch_port_mbps(self, switch: str) -> int:
        """The speed of a switch's fabric ports (what its path bandwidth starts from)."""

    def net_commands(self, node: str) -> list[list[str]]:
        """Boot-time link setup of one machine (idempotent): what rlb-net.service runs; a
        FabricError for a kind without rendered units."""

    @property
    def switches(self) -> list[Node]: ...

    @property
    def hosts(self) -> list[str]:
        """Where traffic enters the fabric: a host (GPU) port, or each NIC of a server."""

    @property
    def machines(self) -> list[str]:
        """The machines hosts run on, one agent each (a server of several NICs is one)."""

    def endpoints(self, machine: str) -> list[str]:
        """A machine's hosts (a server's NICs; else the machine itself)."""

    def machine_of(self, host: str) -> str: ...

    def source_prefixes(self, machine: str) -> list[ipaddress.IPv6Network]:
        """Where a machine's signed messages (verbs agents', probe answers) come from: what the
        keys it shares with others are filed under (rlbfabric host-keys); [] when it signs none."""

    def node(self, name: str) -> Node: ...

    def is_gpu(self, node: str) -> bool: ...


class SwitchedFabric(Fabric, Protocol):
    """A kind whose switches run BGP (bgp_switches): what the switch agent, the bird and FRR
    renderers and the policy compiler ask of it, beyond what every kind has. A kind without BGP
    switches (rail-only: static rails) has none of this and says so with bgp_switches False."""
    policy: str                   # the default forwarding policy (POLICIES), per prefix: policy_for
    link_mbps: int
    parallel: int                 # links between two switches (1: one)
    bfd: bool
    bfd_ms: int
    graceful_restart_s: int
    pathbw_subtype: int           # FARE's path bandwidth extended community (the draft's TBD)
    linkbw_subtype: int

    @property
    def stages(self) -> int:
        """Switch tiers a packet crosses at most upwards (3-stage Clos: 1; 5-stage: 2)."""

    def ports_up(self, node: Node) -> list[Port]:
        """A switch's ports towards the tier above ([] at the top)."""

    def ports_down(self, node: Node) -> list[Port]:
        """A switch's ports towards the tier below, hosts' ports excluded."""

    def edge_ports(self, node: str) -> set[str]:
        """A switch's ports that face hosts (their punts are policed apart)."""

    def switch_ports(self, node: Node) -> list[str]: ...

    def port(self, node: Node, ifname: str) -> Port | None: ...

    def uplinks(self, node: Node) -> list[Node]: ...

    def downlinks(self, node: Node) -> list[Node]: ...

    def link_mbps_between(self, a: str, b: str) -> int: ...

    def policy_for(self, net: str) -> str: ...

    def asns(self) -> list[int]: ...

    def all_prefixes(self):
        """(the node that announces it, its port, its path, the prefix) of every host prefix."""


class OneHostAMachine:
    """A kind whose every host is a machine of its own (a GPU with its ports)."""

    @property
    def machines(self) -> list[str]:
        return self.hosts

    def endpoints(self, machine: str) -> list[str]:
        return [machine]

    def machine_of(self, host: str) -> str:
        return host


KINDS: dict[str, Callable[[dict, str], Fabric]] = {}     # [fabric] kind -> its parser


def kind(name: str):
    """Registers a fabric kind's parser: parse(data, where) -> that kind's fabric."""
    def register(parse: Callable[[dict, str], Fabric]):
        if name in KINDS:
            raise ValueError(f"fabric kind {name!r} registered twice")
        KINDS[name] = parse
        return parse
    return register


class ByKind(dict):
    """What one layer runs per fabric kind (a coordinator, a host agent), filled by
    @REGISTRY.register(kind) in the module that implements it: adding a kind adds modules and
    edits no `if kind ==` elsewhere."""

    def __init__(self, what: str):
        super().__init__()
        self.what = what

    def register(self, name: str):
        def add(obj):
            if name in self:
                raise ValueError(f"{self.what} for fabric kind {name!r} registered twice")
            self[name] = obj
            return obj
        return add

    def of(self, fabric: Fabric):
        try:
            return self[fabric.kind]
        except KeyError:
            raise FabricError(f"a {fabric.kind} fabric has no {self.what} (kinds that have one: "
                              f"{', '.join(sorted(self)) or 'none'})") from None


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


def add_loopback_device(name: str = LOOPBACK_DEVICE, netns: str | None = None):
    """The GPU's loopback device: a dummy, or (kernels built without dummy) an ifb; both are
    NOARP, always up and deliver nothing themselves: the host's TC egress program sends every
    packet routed to it out of a fabric port."""
    ns = ["-n", netns] if netns else []
    if subprocess.run(["ip", *ns, "link", "show", name], capture_output=True).returncode == 0:
        return "existing"
    for devtype in ("dummy", "ifb"):
        if subprocess.run(["ip", *ns, "link", "add", name, "type", devtype], capture_output=True).returncode == 0:
            return devtype
    raise FabricError(f"cannot create {name}: this kernel has neither dummy nor ifb devices")
