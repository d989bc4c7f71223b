"""The scale-up fabric kind (draft-fare-scale-up §3): P planes of one switch each, G GPU hosts
with m sub-port links (a port split by a Y-cable) into every plane, and a loopback per GPU. QPs
run between loopbacks; every GPU is a BGP speaker that advertises its loopback into each plane
with the path bandwidth of its live sub-ports there, and learns every peer's loopback per plane.

    [fabric]
    kind = "scaleup"
    prefix = "fc00"           # GPU loopbacks: <prefix>:0:ff::<gpu number>/128
    subports = 2              # m: links per GPU per plane
    link_mbps = 10000         # one sub-port link (a plane may say otherwise)
    policy = "fare"           # what plane switches do per prefix: fare | ecmp | dlb | spray
    bfd = true
    bfd_ms = 50

    [[plane]]                 # one switch per plane, a plain 3-stage "spine" to the agents
    name = "p1"
    asn = 65101
    mbps = 10000              # optional: this plane's sub-port speed

    [[gpu]]
    name = "g1"
    asn = 65201
    spray = false             # true: g1's QPs tolerate reordering (§3.2): sprayed per packet

Links: GPU G's sub-port i into plane P is G's eth-P-i and the switch's eth-G-i. On every link the
switch's link-local address is fe80::1 and the GPU's fe80::2 (set at boot), so a GPU's BGP
sessions know their neighbour without discovery. A plane switch is, to the switch agent and to
bird, a 3-stage spine whose leaves are the GPUs: it weights each GPU's loopback by FARE's
min(link, path bandwidth) per sub-port and readvertises the sum (rlbfabric/policy/pathbw.py).

Path numbering on a GPU (the host data plane's path values): (plane - 1) x m + sub-port."""
from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from typing import ClassVar

from rlbcommon.cheader import constants
from rlbcommon.constants import POLICIES

from .. import bgpsec
from ..bgpsec import GRACEFUL_RESTART_S, BgpSecurity
from ..base import (GPU_LL, LOOPBACK_DEVICE, SWITCH_LL, FabricError, Link, Node, OneHostAMachine, Port, kind,
                   node_name_asn, one_hextet_prefix)

MAX_PATHS = constants("rlb_host.h")["RLBH_MAX_PATHS"]   # the host data plane's path table


@dataclass(frozen=True)
class GpuPort:
    plane: Node
    sub: int                  # 1..m
    value: int                # the host data plane's path value
    ifname: str               # the GPU's end
    switch_ifname: str        # the plane switch's end


@dataclass
class ScaleupFabric(OneHostAMachine):
    planes: list[Node]
    gpus: list[Node]
    subports: int
    prefix: str
    policy: str
    link_mbps: int
    bfd: bool
    pathbw_subtype: int
    plane_mbps: dict[str, int]
    spray_gpus: set[str]
    bfd_ms: int = 50
    graceful_restart_s: int = GRACEFUL_RESTART_S
    linkbw_subtype: int = 0x89
    parallel: int = 1
    kind: ClassVar[str] = "scaleup"
    paths_by_address: ClassVar[bool] = False
    coordinated: ClassVar[bool] = False
    rendered_units: ClassVar[bool] = True
    bgp_switches: ClassVar[bool] = True
    link_overrides: dict = field(default_factory=dict)
    bgp: BgpSecurity = field(default_factory=BgpSecurity)     # GTSM, TCP MD5 (bgpsec.py)

    def is_gpu(self, node: str) -> bool:
        return node in self.hosts

    # ---- what the switch agent and bird rendering ask of any fabric ----------------------
    @property
    def switches(self) -> list[Node]:
        return self.planes

    @property
    def hosts(self) -> list[str]:
        return [g.name for g in self.gpus]

    def summary(self) -> str:
        return f"scale-up: {len(self.planes)} planes, {len(self.gpus)} GPUs of {self.subports} sub-ports a plane"

    @property
    def stages(self) -> int:
        return 1

    def node(self, name: str) -> Node:
        for n in self.planes:
            if n.name == name:
                return n
        raise FabricError(f"no plane switch {name!r} in the fabric (have {', '.join(self.names(self.planes))})")

    @staticmethod
    def names(nodes) -> list[str]:
        return [n.name for n in nodes]

    def gpu(self, name: str) -> Node:
        for g in self.gpus:
            if g.name == name:
                return g
        raise FabricError(f"no GPU {name!r} in the fabric (have {', '.join(self.names(self.gpus))})")

    def uplinks(self, node: Node) -> list[Node]:
        return []

    def downlinks(self, node: Node) -> list[Node]:
        return list(self.gpus) if node.role == "spine" else []

    def ports_up(self, node: Node) -> list[Port]:
        return []

    def ports_down(self, node: Node) -> list[Port]:
        """A plane switch's ports: m per GPU, each its own passive BGP session."""
        if node.role != "spine":
            return []
        return [Port(g, i, f"eth-{g.name}-{i}", f"eth-{node.name}-{i}", 0, f"{g.name}p{i}")
                for g in self.gpus for i in range(1, self.subports + 1)]

    def edge_ports(self, node: str) -> set[str]:
        """Every port of a plane switch faces a GPU."""
        return {p.ifname for p in self.ports_down(self.node(node))}

    def switch_ports(self, node: Node) -> list[str]:
        return [p.ifname for p in self.ports_down(node)]

    def port(self, node: Node, ifname: str) -> Port | None:
        return next((p for p in self.ports_down(node) if p.ifname == ifname), None)

    def link_mbps_between(self, a: str, b: str) -> int:
        """A sub-port link's speed: its plane's."""
        return self.plane_mbps.get(a, self.plane_mbps.get(b, self.link_mbps))

    def asns(self) -> list[int]:
        return sorted({n.asn for n in self.planes + self.gpus})

    def all_prefixes(self):
        for g in self.gpus:
            yield g, 1, 1, self.loopback_net(g.name)

    def policy_for(self, net: str) -> str:
        """A spray GPU's loopback is sprayed (§3.2); everything else takes the fabric's policy."""
        n = ipaddress.IPv6Network(net)
        for g in self.gpus:
            if g.name in self.spray_gpus and n == self.loopback_net(g.name):
                return "spray"
        return self.policy

    # ---- the GPUs' side -----------------------------------------------------------------
    def loopback(self, gpu: str) -> str:
        return str(ipaddress.IPv6Address(f"{self.prefix}:0:ff::{self.gpu(gpu).index:x}"))

    def loopback_net(self, gpu: str) -> ipaddress.IPv6Network:
        return ipaddress.IPv6Network(f"{self.loopback(gpu)}/128")

    def source_prefixes(self, machine: str) -> list[ipaddress.IPv6Network]:
        """A GPU probes and answers from its loopback."""
        return [self.loopback_net(self.gpu(machine).name)]

    def loopback_prefix(self) -> ipaddress.IPv6Network:
        """Every GPU loopback: what a GPU routes to its loopback device."""
        return ipaddress.IPv6Network(f"{self.prefix}:0:ff::/64")

    def gpu_ports(self, gpu: str) -> list[GpuPort]:
        g = self.gpu(gpu)
        return [GpuPort(p, i, (p.index - 1) * self.subports + i, f"eth-{p.name}-{i}", f"eth-{g.name}-{i}")
                for p in self.planes for i in range(1, self.subports + 1)]

    def sub_mbps(self, plane: str) -> int:
        return self.plane_mbps.get(plane, self.link_mbps)

    def net_commands(self, node: str) -> list[list[str]]:
        """Boot-time link setup of a GPU or plane switch (idempotent; the GPU's loopback device must
        exist: add_loopback_device). Every sub-port carries the fixed link-local of its end, so no
        session needs discovery; a GPU keeps its addresses across a flap, has its loopback on the
        loopback device and routes every peer's loopback there (where its TC program picks the
        port). Transmit checksum offload off: redirected frames must not carry partial ones. The
        namespace lab and rlb-net.service both run exactly these."""
        out = []
        if self.is_gpu(node):
            out.append(["sysctl", "-qw", "net.ipv6.conf.all.keep_addr_on_down=1"])
            ports = [(p.ifname, GPU_LL) for p in self.gpu_ports(node)]
        else:
            out.append(["sysctl", "-qw", "net.ipv6.conf.all.forwarding=1"])
            ports = [(name, SWITCH_LL) for name in self.switch_ports(self.node(node))]
        for ifname, ll in ports:
            out += [["ip", "link", "set", ifname, "up"],
                    ["ip", "addr", "replace", f"{ll}/64", "dev", ifname, "nodad"],
                    ["ethtool", "-K", ifname, "tx", "off"]]
        if self.is_gpu(node):
            out += [["ip", "addr", "replace", f"{self.loopback(node)}/128", "dev", LOOPBACK_DEVICE, "nodad"],
                    ["ip", "link", "set", LOOPBACK_DEVICE, "up"],
                    ["ip", "-6", "route", "replace", str(self.loopback_prefix()), "dev", LOOPBACK_DEVICE]]
        return out

    def links(self) -> list[Link]:
        """A GPU's sub-port links (the plane switch's end first)."""
        return [(p.plane.name, p.switch_ifname, g.name, p.ifname, self.sub_mbps(p.plane.name))
                for g in self.gpus for p in self.gpu_ports(g.name)]

    def switch_port_mbps(self, switch: str) -> int:
        return self.sub_mbps(switch)


@kind("scaleup")
def parse(data: dict, where: str = "fabric") -> ScaleupFabric:
    f = data.get("fabric", {})
    seen: set[str] = set()
    nodes: dict[str, list[Node]] = {"plane": [], "gpu": []}
    plane_mbps, spray = {}, set()
    for role in ("plane", "gpu"):
        for i, n in enumerate(data.get(role, []), start=1):
            name, asn = node_name_asn(n, role, i, where, seen)
            if role == "plane":
                nodes["plane"].append(Node(name, "spine", asn, i, pod=1, plane=i))
                mbps = n.get("mbps", f.get("link_mbps", 10000))
                if not isinstance(mbps, int) or mbps <= 0:
                    raise FabricError(f"{where}: plane {name}: mbps must be a positive whole number")
                plane_mbps[name] = mbps
            else:
                nodes["gpu"].append(Node(name, "gpu", asn, i))
                if n.get("spray", False):
                    spray.add(name)
    planes, gpus = nodes["plane"], nodes["gpu"]
    if not planes or len(gpus) < 2:
        raise FabricError(f"{where}: a scale-up fabric needs at least one [[plane]] and two [[gpu]]s")
    if len({p.asn for p in planes}) != len(planes) or {p.asn for p in planes} & {g.asn for g in gpus}:
        raise FabricError(f"{where}: every plane switch needs its own AS, apart from the GPUs'")
    if len({g.asn for g in gpus}) != len(gpus):
        raise FabricError(f"{where}: every GPU needs its own AS (eBGP between GPU and plane)")
    m = f.get("subports", 1)
    if not isinstance(m, int) or m < 1:
        raise FabricError(f"{where}: subports must be a positive whole number")
    if len(planes) * m > MAX_PATHS:
        raise FabricError(f"{where}: {len(planes)} planes x {m} sub-ports = {len(planes) * m} paths; "
                          f"a GPU's data plane holds at most {MAX_PATHS}")
    if len(gpus) > 0xFFFF:
        raise FabricError(f"{where}: at most 65535 GPUs (one hextet numbers the loopbacks)")
    policy = f.get("policy", "fare")
    if policy not in POLICIES or policy == "dpf":
        raise FabricError(f"{where}: policy {policy!r}: a plane switch does fare, ecmp, dlb or spray")
    prefix = one_hextet_prefix(f, where)
    bfd_ms = f.get("bfd_ms", 50)
    if not isinstance(bfd_ms, int) or not 10 <= bfd_ms <= 10000:
        raise FabricError(f"{where}: bfd_ms {bfd_ms!r}: an interval in ms, 10 to 10000")
    for key in ("parallel", "paths"):
        if key in f:
            raise FabricError(f"{where}: {key} is for leaf-spine fabrics; a scale-up fabric has subports")
    return ScaleupFabric(planes, gpus, m, prefix, policy, int(f.get("link_mbps", 10000)),
                         bool(f.get("bfd", True)), int(f.get("pathbw_subtype", 0x88)), plane_mbps, spray,
                         bfd_ms, int(f.get("graceful_restart_s", GRACEFUL_RESTART_S)), int(f.get("linkbw_subtype", 0x89)),
                         bgp=bgpsec.parse(f, where))
