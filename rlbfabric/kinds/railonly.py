"""The rail-only fabric kind (outshift-hscore-rail-routing): D high-bandwidth domains of K GPUs
and K rail switches, no spine. GPU (d, k) has an r-interface to rail switch k and a d-interface
into domain d's interconnect; GPUs relay for each other between the two (as PXN does), so a GPU
reaches another domain by its own rail (then the far domain: rd), by its domain to the GPU of the
far GPU's rail (dr), or by its domain to any rail x and the far domain (drd).

    [fabric]
    kind = "rail-only"
    prefix = "fc00"           # GPU (d, k): <prefix>:<d>::<k>; domain d: <prefix>:<d>::/64
    domains = 4               # D
    rails = 4                 # K: GPUs per domain, one rail switch each
    rail_mbps = 10            # a GPU's link to its rail switch (what utilisation is measured against)
    domain_mbps = 40          # a GPU's link into its domain: the higher speed
    delta = 0.0               # > 0: spray new QPs over the rails with m < H <= m + delta
    tau_ms = 400              # h-score smoothing (rlbfabric/hscore.HScores): 98 % of a step in 1.6 s

Names: rail switch k is r<k>, GPU (d, k) is d<d>g<k>, domain d's interconnect dom<d>.

Forwarding, all plain Linux apart from the GPU's first hop:
- a rail switch (the RLB XDP switch) routes domain d's /64 to the GPU (d, k) on its port eth-d<d>;
- a GPU routes its own domain's /64 on its d-interface (eth-dom), every other fc00 address to
  its rail switch (eth-rail) - that is the relay: what arrives from the domain for another
  domain goes up its rail, what arrives from its rail for its domain goes across it;
- what the GPU itself sends (policy rule `iif lo`) is routed to its loopback device rlb0, where
  the host data plane (ports mode) picks the first hop per QP: path 1 = eth-rail to the rail
  switch, path 1 + y = eth-dom to GPU (d, y). That choice alone makes the path rd, dr or drd."""
from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from typing import ClassVar

from rlbcommon.cheader import constants

from ..bgpsec import BgpSecurity
from ..base import GPU_LL, LOOPBACK_DEVICE, SWITCH_LL, FabricError, Link, Node, OneHostAMachine, kind, one_hextet_prefix
from ..hscore import Gpu

RAIL_IF, DOMAIN_IF = "eth-rail", "eth-dom"
LOCAL_TABLE = 100                             # what this GPU sends: to rlb0
MAX_PATHS = constants("rlb_host.h")["RLBH_MAX_PATHS"]
RAIL_PATH = 1                                 # path values on a GPU; 1 + y: the domain towards (d, y)


@dataclass(frozen=True)
class RailPort:
    """A first hop of a GPU: its value in the host data plane, the port, and who is behind it."""
    value: int
    ifname: str
    via: str                  # "rail" or the GPU name on the domain


@dataclass
class RailOnlyFabric(OneHostAMachine):
    domains: int
    rails: int
    prefix: str
    rail_mbps: int
    domain_mbps: int
    delta: float
    tau_s: float
    kind: ClassVar[str] = "rail-only"
    paths_by_address: ClassVar[bool] = False
    coordinated: ClassVar[bool] = True       # the h-score registry
    # its rail switches take static routes to the GPUs' MACs, which the namespace lab sets up
    # (rlblab/raillab.py); rendering them as units is not built
    rendered_units: ClassVar[bool] = False
    bgp_switches: ClassVar[bool] = False
    bgp: BgpSecurity = field(default_factory=BgpSecurity)   # no BGP here (static routes); labs set it alike

    # ---- names ---------------------------------------------------------------------------
    def summary(self) -> str:
        return f"rail-only: {self.domains} domains of {self.rails} GPUs, {self.rails} rails"

    @property
    def switches(self) -> list[Node]:
        return [Node(f"r{k}", "rail", 0, k) for k in range(1, self.rails + 1)]

    @property
    def hosts(self) -> list[str]:
        return [self.gpu_name(Gpu(d, k)) for d in range(1, self.domains + 1) for k in range(1, self.rails + 1)]

    def is_gpu(self, node: str) -> bool:
        return node in self.hosts

    @staticmethod
    def gpu_name(g: Gpu) -> str:
        return f"d{g.domain}g{g.rail}"

    def gpu(self, name: str) -> Gpu:
        try:
            d, k = name[1:].split("g")
            g = Gpu(int(d), int(k))
        except ValueError:
            g = None
        if g is None or not (1 <= g.domain <= self.domains and 1 <= g.rail <= self.rails) or name != self.gpu_name(g):
            raise FabricError(f"no GPU {name!r} in the fabric (d1g1 .. d{self.domains}g{self.rails})")
        return g

    def node(self, name: str) -> Node:
        for n in self.switches:
            if n.name == name:
                return n
        raise FabricError(f"no rail switch {name!r} in the fabric (r1 .. r{self.rails})")

    # ---- addresses -----------------------------------------------------------------------
    def address(self, gpu: str | Gpu) -> str:
        g = self.gpu(gpu) if isinstance(gpu, str) else gpu
        return str(ipaddress.IPv6Address(f"{self.prefix}:{g.domain:x}::{g.rail:x}"))

    loopback = address          # what QPs run between, as on the other fabric kinds

    def source_prefixes(self, machine: str) -> list[ipaddress.IPv6Network]:
        return []               # its GPUs sign nothing (no probes, no verbs agents)

    def domain_net(self, d: int) -> ipaddress.IPv6Network:
        return ipaddress.IPv6Network(f"{self.prefix}:{d:x}::/64")

    def cluster_net(self) -> ipaddress.IPv6Network:
        return ipaddress.IPv6Network(f"{self.prefix}::/16")

    def gpu_of(self, addr: str) -> Gpu | None:
        a = ipaddress.IPv6Address(addr)
        for d in range(1, self.domains + 1):
            if a in self.domain_net(d):
                k = int(a) & 0xFFFF
                return Gpu(d, k) if 1 <= k <= self.rails and a == ipaddress.IPv6Address(self.address(Gpu(d, k))) else None
        return None

    # ---- links ---------------------------------------------------------------------------
    def links(self) -> list[Link]:
        """Each GPU's rail port, by rail (a domain's scale-up links are not RLB's)."""
        return [(f"r{k}", port, gpu, RAIL_IF, self.rail_mbps)
                for k in range(1, self.rails + 1) for port, gpu in self.rail_ports(k)]

    def switch_port_mbps(self, switch: str) -> int:
        return self.rail_mbps

    def net_commands(self, node: str) -> list[list[str]]:
        return gpu_net_commands(self, node) if self.is_gpu(node) else rail_net_commands(self, node)

    def rail_ports(self, rail: int) -> list[tuple[str, str]]:
        """A rail switch's ports: (its port, the GPU there), one per domain."""
        return [(f"eth-d{d}", self.gpu_name(Gpu(d, rail))) for d in range(1, self.domains + 1)]

    def first_hops(self, gpu: str) -> list[RailPort]:
        g = self.gpu(gpu)
        return [RailPort(RAIL_PATH, RAIL_IF, "rail")] + [
            RailPort(RAIL_PATH + y, DOMAIN_IF, self.gpu_name(Gpu(g.domain, y)))
            for y in range(1, self.rails + 1) if y != g.rail]

    def path_for(self, gpu: str, first_hop_rail: int | None) -> int:
        """The path value of a first hop: None = the GPU's own rail, y = the domain towards (d, y)."""
        return RAIL_PATH if first_hop_rail is None else RAIL_PATH + first_hop_rail


@kind("rail-only")
def parse(data: dict, where: str = "fabric") -> RailOnlyFabric:
    f = data.get("fabric", {})
    for role in ("spine", "leaf", "superspine", "plane", "gpu"):
        if role in data:
            raise FabricError(f"{where}: a rail-only fabric is described by domains and rails in "
                              f"[fabric], not [[{role}]] tables")

    def whole(key, default, lo, hi):
        v = f.get(key, default)
        if not isinstance(v, int) or isinstance(v, bool) or not lo <= v <= hi:
            raise FabricError(f"{where}: {key} {v!r}: a whole number from {lo} to {hi}")
        return v
    domains = whole("domains", 4, 2, 0xFFFF)
    rails = whole("rails", 4, 2, MAX_PATHS - 1)      # path 1 is the rail, 1 + y the domain peers
    rail_mbps = whole("rail_mbps", 100000, 1, 10 ** 7)
    domain_mbps = whole("domain_mbps", 4 * rail_mbps, 1, 10 ** 8)
    delta = f.get("delta", 0.0)
    if not isinstance(delta, (int, float)) or isinstance(delta, bool) or not 0 <= delta <= 1:
        raise FabricError(f"{where}: delta {delta!r}: an h-score window, 0 (best fit only) to 1")
    tau_ms = whole("tau_ms", 400, 10, 60000)
    prefix = one_hextet_prefix(f, where)
    return RailOnlyFabric(domains, rails, prefix, rail_mbps, domain_mbps, float(delta), tau_ms / 1000)


def gpu_net_commands(fabric: RailOnlyFabric, gpu: str) -> list[list[str]]:
    """A GPU's link and routing setup (idempotent; the loopback device rlb0 must exist)."""
    addr, net, cluster = fabric.address(gpu), fabric.domain_net(fabric.gpu(gpu).domain), fabric.cluster_net()
    out = [["sysctl", "-qw", "net.ipv6.conf.all.forwarding=1"],          # the relay
           ["sysctl", "-qw", "net.ipv6.conf.all.keep_addr_on_down=1"]]
    for ifname in (RAIL_IF, DOMAIN_IF):
        out += [["ip", "link", "set", ifname, "up"], ["ethtool", "-K", ifname, "tx", "off"]]
    out += [["ethtool", "-K", RAIL_IF, "gro", "on"],     # a rail switch's XDP redirect lands here
            ["ip", "addr", "replace", f"{GPU_LL}/64", "dev", RAIL_IF, "nodad"],
            ["ip", "addr", "replace", f"{addr}/{net.prefixlen}", "dev", DOMAIN_IF, "nodad"],
            ["ip", "link", "set", LOOPBACK_DEVICE, "up"],
            ["ip", "-6", "route", "replace", str(cluster), "via", SWITCH_LL, "dev", RAIL_IF],
            ["ip", "-6", "route", "replace", str(cluster), "dev", LOOPBACK_DEVICE, "table", str(LOCAL_TABLE)],
            ["sh", "-c", f"ip -6 rule del pref {LOCAL_TABLE} 2>/dev/null; "
                         f"ip -6 rule add pref {LOCAL_TABLE} iif lo lookup {LOCAL_TABLE}"]]
    return out


def rail_net_commands(fabric: RailOnlyFabric, rail: str) -> list[list[str]]:
    out = [["sysctl", "-qw", "net.ipv6.conf.all.forwarding=1"]]
    for port, _ in fabric.rail_ports(fabric.node(rail).index):
        out += [["ip", "link", "set", port, "up"],
                ["ip", "addr", "replace", f"{SWITCH_LL}/64", "dev", port, "nodad"],
                ["ethtool", "-K", port, "tx", "off"]]
    return out


def rail_routes(fabric: RailOnlyFabric, rail: str, gpu_macs: dict[str, str]) -> list[dict]:
    """Rail switch k's routes (rlbswitch route apply): domain d's /64 pinned to GPU (d, k)."""
    k = fabric.node(rail).index
    return [{"prefix": str(fabric.domain_net(d)), "mode": "pinned",
             "nexthops": [f"{port}@{gpu_macs[gpu]}"]}
            for d, (port, gpu) in enumerate(fabric.rail_ports(k), start=1)]
