"""A leaf-spine (Clos) fabric, 3 or 5 stages: the [fabric] kind "clos", the default (the file's
format is in rlbfabric/fabric.py)."""
from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from typing import ClassVar

from rlbcommon.constants import POLICIES

from .. import addrplan, bgpsec
from ..base import NAME, ROUTING_DAEMONS, SWITCH_ROLES, FabricError, Link, Node, Port, kind, node_name_asn
from ..bgpsec import GRACEFUL_RESTART_S, BgpSecurity
from ..servers import Nic, parse_servers

# A server with several NICs sends what it originates from a NIC's addresses out of that NIC: a
# rule per NIC (from its ports' /48) to a table of its own whose default is the NIC's leaf.
NIC_TABLE = 1000          # NIC i of a server (0-based): routing table and rule priority NIC_TABLE + i


@dataclass
class ClosFabric:
    spines: list[Node]
    leaves: list[Node]
    superspines: list[Node]
    paths: int
    prefix: str
    policy: str
    link_mbps: int
    bfd: bool
    pathbw_subtype: int
    link_overrides: dict[frozenset, int]
    policy_overrides: dict[str, str]
    parallel: int = 1   # links between each leaf and each spine of its pod
    kind: ClassVar[str] = "clos"   # the others: scaleup.ScaleupFabric, railonly.RailOnlyFabric
    paths_by_address: ClassVar[bool] = True
    coordinated: ClassVar[bool] = True
    rendered_units: ClassVar[bool] = True
    bgp_switches: ClassVar[bool] = True
    # Sub-type of the community a super-spine attaches with the bandwidth of its link towards the
    # advertising spine. The draft makes it non-transitive, but bird 2.0.12 deletes
    # non-transitive ext communities on every eBGP export (ec_set_del_nontrans), so it would never
    # arrive: it is sent transitive and every spine deletes it on export (it travels one hop).
    linkbw_subtype: int = 0x89
    bfd_ms: int = 50      # BFD tx/rx interval (x3 to detect); emulated VMs need slower timers
    # BGP graceful restart (RFC 4724): how long peers keep a restarting switch's routes, and how
    # long an agent keeps what is programmed while its bird restarts (bgpsec.GRACEFUL_RESTART_S)
    graceful_restart_s: int = GRACEFUL_RESTART_S
    bgp: BgpSecurity = field(default_factory=BgpSecurity)     # GTSM, TCP MD5 (bgpsec.py)
    # servers with several NICs (servers.py): {endpoint (<server>-<nic>, one of hosts): its NIC}
    nics: dict[str, Nic] = field(default_factory=dict)
    _host_index: dict | None = field(default=None, repr=False, compare=False)

    # ---- lookups ----------------------------------------------------------------------
    def is_gpu(self, node: str) -> bool:
        """A GPU host of a scale-up or rail-only fabric (ports mode): never here."""
        return False

    @property
    def switches(self) -> list[Node]:
        return self.superspines + self.spines + self.leaves

    def node(self, name: str) -> Node:
        for n in self.switches:
            if n.name == name:
                return n
        if name in self.nics:
            nic = self.nics[name]
            raise FabricError(f"{name!r} is NIC {nic.name} of server {nic.server}: units, link setup and the agent "
                              f"are the server's ({nic.server})")
        raise FabricError(f"no node {name!r} in the fabric (have {', '.join(n.name for n in self.switches)}"
                          f"{', hosts and servers ' + ', '.join(self.machines) if self.machines else ''})")

    def pod_spines(self, pod: int) -> list[Node]:
        return [s for s in self.spines if s.pod == pod]

    def uplinks(self, node: Node) -> list[Node]:
        """Peers this node must find and connect to (the active BGP side)."""
        if node.role == "leaf":
            return self.pod_spines(node.pod)
        if node.role == "spine":
            return [ss for ss in self.superspines if ss.plane == node.plane]
        return []

    def downlinks(self, node: Node) -> list[Node]:
        """Peers that connect to this node (dynamic BGP, passive)."""
        if node.role == "spine":
            return [lf for lf in self.leaves if lf.pod == node.pod]
        if node.role == "superspine":
            return [s for s in self.spines if s.plane == node.plane]
        return []

    def port_id(self, k: int, leaf: Node) -> int:
        """The uplink colour id (1 .. spines x parallel) that path/colour k is pinned to."""
        return (k - 1) % (len(self.pod_spines(leaf.pod)) * self.parallel) + 1

    def spine_for_path(self, leaf: Node, k: int) -> Node:
        """Colour k leaves a leaf through this spine of its pod (link: see port_id)."""
        return self.pod_spines(leaf.pod)[(self.port_id(k, leaf) - 1) // self.parallel]

    def links_between(self, a: Node, b: Node) -> int:
        """Parallel links exist only between a leaf and a spine; other pairs have one."""
        return self.parallel if {a.role, b.role} == {"leaf", "spine"} else 1

    def _ports(self, node: Node, peers: list[Node]) -> list[Port]:
        out = []
        for peer in peers:
            n = self.links_between(node, peer)
            for i in range(1, n + 1):
                sfx = f"-{i}" if n > 1 else ""
                # a leaf's uplink carries AIGP for one colour id: (spine plane, link)
                colour = (peer.plane - 1) * self.parallel + i if node.role == "leaf" else 0
                out.append(Port(peer, i, f"eth-{peer.name}{sfx}", f"eth-{node.name}{sfx}", colour,
                                f"{peer.name}p{i}" if n > 1 else peer.name))
        return out

    def ports_up(self, node: Node) -> list[Port]:
        """Ports towards the peers this node connects to (the active BGP side)."""
        return self._ports(node, self.uplinks(node))

    def ports_down(self, node: Node) -> list[Port]:
        """Ports towards the peers that connect to this node (dynamic BGP, passive)."""
        return self._ports(node, self.downlinks(node))

    def switch_ports(self, node: Node) -> list[str]:
        """Every port of a switch: towards its uplinks, its downlinks, and (a leaf) its hosts."""
        hosts = [i for _, _, i in self.host_ports(node)] if node.role == "leaf" else []
        return [p.ifname for p in self.ports_up(node) + self.ports_down(node)] + hosts

    def port(self, node: Node, ifname: str) -> Port | None:
        return next((p for p in self.ports_up(node) + self.ports_down(node) if p.ifname == ifname), None)

    def link_mbps_between(self, a: str, b: str) -> int:
        return self.link_overrides.get(frozenset((a, b)), self.link_mbps)

    def host_ports(self, leaf: Node) -> list[tuple[int, str, str]]:
        """(port number, host name, leaf interface) for each host of a leaf (a server's NIC: its
        endpoint name and the leaf's port towards it)."""
        return [(i + 1, h, self.nics[h].leaf_ifname if h in self.nics else f"eth-{h}")
                for i, h in enumerate(leaf.hosts)]

    def host_prefixes(self, leaf: Node, port: int) -> list[ipaddress.IPv6Network]:
        """One /64 per path on a host port; path k is colour k (the plan: addrplan)."""
        return [addrplan.host_prefix(self.prefix, leaf.index, port, k) for k in range(1, self.paths + 1)]

    def leaf_prefix(self, leaf: Node) -> ipaddress.IPv6Network:
        """Every host prefix behind one leaf (the /32 of the address plan)."""
        return addrplan.leaf_prefix(self.prefix, leaf.index)

    @property
    def hosts(self) -> list[str]:
        """Where QPs enter the fabric: one-NIC hosts and every NIC of a server (<server>-<nic>)."""
        return [h for leaf in self.leaves for h in leaf.hosts]

    @property
    def servers(self) -> dict[str, list[str]]:
        """{server: its NICs' endpoint names}, in file order."""
        out: dict[str, list[str]] = {}
        for e, nic in self.nics.items():
            out.setdefault(nic.server, []).append(e)
        return out

    @property
    def machines(self) -> list[str]:
        """The machines hosts run on: one-NIC hosts, then servers (one agent each)."""
        return [h for h in self.hosts if h not in self.nics] + list(self.servers)

    def endpoints(self, machine: str) -> list[str]:
        """A machine's hosts in the fabric: a server's NICs, a one-NIC host itself."""
        if machine in self.hosts and machine not in self.nics:
            return [machine]
        got = self.servers.get(machine)
        if not got:
            raise FabricError(f"no host or server {machine!r} (have {', '.join(self.machines)})")
        return got

    def machine_of(self, host: str) -> str:
        return self.nics[host].server if host in self.nics else host

    def source_prefixes(self, machine: str) -> list[ipaddress.IPv6Network]:
        """The /48 of each of a machine's NICs (every path's /64 is in it)."""
        return [self.host_prefixes(*self.leaf_of_host(h))[0].supernet(new_prefix=48) for h in self.endpoints(machine)]

    def is_server(self, machine: str) -> bool:
        return machine in self.servers

    def host_port(self, host: str) -> str:
        """A host's fabric port is named after its leaf, as a switch's ports are after their
        peers; a server's NIC keeps its own name (gpu0_eth)."""
        if host in self.nics:
            return self.nics[host].name
        return f"eth-{self.leaf_of_host(host)[0].name}"

    def nic_routing(self, host: str, index: int) -> list[list[str]]:
        """A server's NIC `index` (0-based): what it originates from its addresses leaves through
        it (its leaf's gateway on its base path, in a table of its own). One-NIC hosts need none."""
        leaf, port = self.leaf_of_host(host)
        gw = self.host_prefixes(leaf, port)[0].network_address + 1
        own = addrplan.port_prefix(self.prefix, leaf.index, port)
        table = str(NIC_TABLE + index)
        return [["ip", "-6", "route", "replace", "default", "via", str(gw), "dev", self.host_port(host), "onlink",
                 "table", table],
                ["ip", "-6", "rule", "add", "from", str(own), "table", table, "priority", table]]

    def links(self) -> list[Link]:
        out = []
        for node in self.leaves + self.spines:
            for port in self.ports_up(node):
                out.append((node.name, port.ifname, port.peer.name, port.peer_ifname,
                            self.link_mbps_between(node.name, port.peer.name)))
        for leaf in self.leaves:
            for _, host, ifname in self.host_ports(leaf):
                out.append((leaf.name, ifname, self.machine_of(host), self.host_port(host), self.link_mbps))
        return out

    def switch_port_mbps(self, switch: str) -> int:
        return self.link_mbps

    def net_commands(self, node: str) -> list[list[str]]:
        """Switches forward, their fabric ports come up without DAD delay (fast restore on
        link-up), a leaf carries its gateway address of every host prefix (bird's radv advertises
        the prefixes of its addresses); a host takes SLAAC on its fabric port. Transmit checksum
        offload off: redirected frames must not carry partial ones."""
        switch = node not in self.machines and self.node(node).role in SWITCH_ROLES
        hosts = [] if switch else self.endpoints(node)
        ports = self.switch_ports(self.node(node)) if switch else [self.host_port(h) for h in hosts]
        out = [["sysctl", "-qw", "net.ipv6.conf.all.forwarding=1"]] if switch else []
        for p in ports:
            key = "accept_dad=0" if switch else "accept_ra=2"
            out += [["sysctl", "-qw", f"net.ipv6.conf.{p}.{key}"], ["ip", "link", "set", p, "up"],
                    ["ethtool", "-K", p, "tx", "off"]]
        if len(hosts) > 1:
            for i, h in enumerate(hosts):
                out += self.nic_routing(h, i)
        if switch and self.node(node).role == "leaf":
            leaf = self.node(node)
            for port, _, ifname in self.host_ports(leaf):
                for net in self.host_prefixes(leaf, port):
                    out.append(["ip", "addr", "replace", f"{net.network_address + 1}/64", "dev", ifname, "nodad"])
        return out

    def host_of_prefix(self) -> dict[ipaddress.IPv6Network, str]:
        """{host /64 (any path): host name}: who owns an address."""
        return {net: leaf.hosts[port - 1] for leaf, port, _, net in self.all_prefixes()}

    def edge_ports(self, node: str) -> set[str]:
        """A switch's ports that face hosts (their punts are policed apart from the fabric's)."""
        n = self.node(node)
        return {ifname for _, _, ifname in self.host_ports(n)} if n.role == "leaf" else set()

    def colours(self) -> int:
        """Uplinks per leaf (spines of a pod x parallel links): the colours QPs are placed on."""
        return len(self.pod_spines(self.leaves[0].pod)) * self.parallel

    def leaf_of_host(self, host: str) -> tuple[Node, int]:
        """(leaf, port) of a host; indexed on first use (a description is not changed after
        loading)."""
        if self._host_index is None:
            self._host_index = {h: (leaf, port) for leaf in self.leaves for port, h, _ in self.host_ports(leaf)}
        try:
            return self._host_index[host]
        except KeyError:
            raise FabricError(f"no host {host!r}") from None

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
        return sorted({n.asn for n in self.switches})

    def summary(self) -> str:
        servers = self.servers
        one_nic = len(self.hosts) - len(self.nics)
        hosts = (_n(one_nic, "host") if not servers else
                 f"{_n(len(servers), 'server')} of {_counts(len(v) for v in servers.values())} NICs"
                 + (f" and {_n(one_nic, 'host')}" if one_nic else ""))
        return f"{self.stages}-stage leaf-spine: {len(self.spines)} spines, {len(self.leaves)} leaves, {hosts}"

    @property
    def stages(self) -> int:
        return 5 if self.superspines else 3



def _n(n: int, what: str) -> str:
    return f"{n} {what}{'' if n == 1 else 's'}"


def _counts(ns) -> str:
    vals = sorted(set(ns))
    return str(vals[0]) if len(vals) == 1 else f"{vals[0]}-{vals[-1]}"


@kind("clos")
def parse(data: dict, where: str = "fabric") -> ClosFabric:
    f = data.get("fabric", {})
    spines, leaves, supers, seen = [], [], [], set()
    for role, out in (("superspine", supers), ("spine", spines), ("leaf", leaves)):
        for i, n in enumerate(data.get(role, []), start=1):
            name, asn = node_name_asn(n, role, i, where, seen)
            hosts = n.get("hosts", [])
            if role != "leaf" and hosts:
                raise FabricError(f"{where}: {role} {name} cannot have hosts")
            for h in hosts:
                if not NAME.match(h) or h in seen:
                    raise FabricError(f"{where}: host name {h!r} invalid or used twice")
                seen.add(h)
            pod = n.get("pod", 1)
            if role != "superspine" and (not isinstance(pod, int) or pod < 1):
                raise FabricError(f"{where}: {name}: pod must be a positive whole number")
            plane = n.get("plane", 0)
            if role == "superspine" and (not isinstance(plane, int) or plane < 1):
                raise FabricError(f"{where}: super-spine {name} needs a plane (1, 2, ...)")
            daemon = n.get("daemon", "bird")
            if daemon not in ROUTING_DAEMONS:
                raise FabricError(f"{where}: {name}: daemon {daemon!r}: one of {', '.join(ROUTING_DAEMONS)}")
            out.append(Node(name, role, asn, i, list(hosts), pod if role != "superspine" else 0, plane, daemon))
    if not spines or not leaves:
        raise FabricError(f"{where}: needs at least one [[spine]] and one [[leaf]]")
    above = {n.asn: n.name for n in spines + supers}
    for lf in leaves:
        if lf.asn in above:
            raise FabricError(f"{where}: leaf {lf.name} has AS {lf.asn}, as {above[lf.asn]} does: a leaf's "
                              "sessions to its spines are eBGP, so its AS must be its own")
    pods = sorted({s.pod for s in spines})
    per_pod = {p: [s for s in spines if s.pod == p] for p in pods}
    if len({len(v) for v in per_pod.values()}) != 1:
        raise FabricError(f"{where}: every pod needs the same number of spines")
    for members in per_pod.values():
        for plane, s in enumerate(members, start=1):
            s.plane = plane
    for lf in leaves:
        if lf.pod not in per_pod:
            raise FabricError(f"{where}: leaf {lf.name} is in pod {lf.pod}, which has no spines")
    for ss in supers:
        if ss.plane > len(per_pod[pods[0]]):
            raise FabricError(f"{where}: super-spine {ss.name}: plane {ss.plane} but pods have "
                              f"{len(per_pod[pods[0]])} spines")
    if len(pods) > 1 and not supers:
        raise FabricError(f"{where}: several pods need [[superspine]]s to connect them")
    spines = [s for p in pods for s in per_pod[p]]
    paths = f.get("paths", len(spines))
    if not isinstance(paths, int) or not 1 <= paths <= 16:
        raise FabricError(f"{where}: paths must be 1-16")
    parallel = f.get("parallel", 1)
    if not isinstance(parallel, int) or not 1 <= parallel <= 4:
        raise FabricError(f"{where}: parallel (links per leaf-spine pair) must be 1-4")
    uplinks = len(per_pod[pods[0]]) * parallel
    if paths % uplinks:
        raise FabricError(f"{where}: paths ({paths}) must be a multiple of a leaf's uplinks "
                          f"({len(per_pod[pods[0]])} spines x {parallel} links)")
    policy = f.get("policy", "dpf")
    overrides = data.get("policy", {})
    for p in [policy, *overrides.values()]:
        if p not in POLICIES:
            raise FabricError(f"{where}: policy {p!r}: choose one of {', '.join(POLICIES)}")
    for key in overrides:
        try:
            ipaddress.IPv6Network(key)
        except ValueError as e:
            raise FabricError(f"{where}: [policy] key {key!r} is not an IPv6 prefix ({e})") from None
    links = {}
    for ln in data.get("link", []):
        a, b = ln.get("between", [None, None])
        for x in (a, b):
            if x not in seen:
                raise FabricError(f"{where}: link between {a!r} and {b!r}: unknown node")
        links[frozenset((a, b))] = int(ln["mbps"])
    bfd_ms = f.get("bfd_ms", 50)
    if not isinstance(bfd_ms, int) or not 10 <= bfd_ms <= 10000:
        raise FabricError(f"{where}: bfd_ms {bfd_ms!r}: an interval in ms, 10 to 10000")
    gr_s = f.get("graceful_restart_s", GRACEFUL_RESTART_S)
    if not isinstance(gr_s, int) or not 1 <= gr_s <= 4095:
        raise FabricError(f"{where}: graceful_restart_s {gr_s!r}: seconds, 1 to 4095 (RFC 4724's 12 bits)")
    prefix = f.get("prefix", "fc00")
    try:
        addrplan.host_prefix(prefix, 1, 1, 1)
    except ValueError:
        raise FabricError(f"{where}: prefix {prefix!r} must be one hextet, e.g. 'fc00'") from None
    nics = {n.endpoint: n for n in parse_servers(data, leaves, seen, where)}
    return ClosFabric(spines, leaves, supers, paths, prefix, policy, int(f.get("link_mbps", 10000)),
                  bool(f.get("bfd", True)), int(f.get("pathbw_subtype", 0x88)), links, overrides,
                  parallel, int(f.get("linkbw_subtype", 0x89)), bfd_ms, graceful_restart_s=gr_s,
                  bgp=bgpsec.parse(f, where), nics=nics)
