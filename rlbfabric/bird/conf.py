"""bird2 configuration for one node, rendered from the fabric description.

Every fabric port sends router advertisements with lifetime 0 (FABRIC_RA: unnumbered peers
learn the switch's link-local address from them). Leaves: radv on host ports (bird 2.0.12
advertises the prefixes of the addresses on the interface, so the leaf's gateway address per
prefix is part of the plan), prefix k exported to
every uplink with colour k and, only towards the spine of colour k, AIGP (igp_metric >= 2^31
suppresses AIGP: unset(bgp_aigp) does not, and a direct route's implicit metric 0 would pin the
prefix to the wrong spine), FARE path bandwidth originated at its maximum. Neighbours are in an
include the agent writes after neighbour discovery. Spines: one dynamic BGP protocol per port
(unnumbered, link-local), AIGP on, and an include with the FARE path bandwidth the agent computes.
The kernel gets single paths (merge paths would ignore AIGP)."""
from __future__ import annotations

import ipaddress
import struct
from pathlib import Path

from rlbcommon.constants import COLOUR_COMMUNITY, MAX_BANDWIDTH
from rlbfabric.base import LOOPBACK_DEVICE, SWITCH_LL, Node, SwitchedFabric

NO_AIGP_METRIC = 2147483648


def pathbw_hi(subtype: int, asn: int, transitive: bool = True) -> int:
    return ((0x00 if transitive else 0x40) << 24) | (subtype << 16) | asn


def float_bits(v: float) -> int:
    return int.from_bytes(struct.pack(">f", v), "big")


def leaf_advertisements(fabric: SwitchedFabric, leaf: Node) -> dict[tuple[str, str], tuple[int, bool]]:
    """(prefix, spine) -> (colour, carries AIGP): Juniper's Table 2 for this leaf."""
    out = {}
    for port, _, _ in fabric.host_ports(leaf):
        for k, net in enumerate(fabric.host_prefixes(leaf, port), start=1):
            pinned = fabric.spine_for_path(leaf, k)
            for spine in fabric.pod_spines(leaf.pod):
                out[(str(net), spine.name)] = (k, spine is pinned)
    return out


# bird's log lives in the run directory (memory on a switch): at this size it moves to one backup
# and starts again, so it never holds more than twice this
LOG_LIMIT = 8 << 20


def _common(router_id: str, run_dir: Path, name: str, ecmp: bool = False) -> str:
    return f"""# rendered by rlbswitch bird-config for {name}: edit the fabric file, not this
router id {router_id};
log "{run_dir}/{name}.bird.log" {LOG_LIMIT} "{run_dir}/{name}.bird.log.1" all;
debug protocols {{ states, events }};
protocol device {{ scan time 1; }}
protocol kernel {{
  {"merge paths on;    # baseline: the kernel's own ECMP" if ecmp else
   "merge paths off;   # on would ECMP AIGP and non-AIGP paths (bgp_rte_mergable ignores AIGP)"}
  graceful restart on; # after a restart, leave the kernel's routes until BGP has recovered
  ipv6 {{ import none; export where source = RTS_BGP; }};
}}
"""


# Router advertisements on fabric links, as the specification's BGP auto-discovery has them:
# a peer configured the standard unnumbered way (FRR's `neighbor IF interface`, most vendors')
# learns this switch's link-local address from them. Router lifetime 0: nobody's default router;
# a fabric port has no prefix to advertise (link-local only).
FABRIC_RA = "min ra interval 3; max ra interval 4; default lifetime 0;"


def _fabric_radv(ifnames: list[str]) -> str:
    return "\n".join(f'  interface "{i}" {{ {FABRIC_RA} }};' for i in ifnames)


def _bfd(fabric: SwitchedFabric, pattern: str) -> str:
    if not fabric.bfd:
        return ""
    return f'protocol bfd {{ interface "{pattern}" {{ min rx interval {fabric.bfd_ms} ms; min tx interval {fabric.bfd_ms} ms; multiplier 3; }}; }}\n'


# ---- what each peer may announce ---------------------------------------------------------
# A leaf announces its host ports' prefixes, a scale-up GPU its loopback; a spine passes on what
# its leaves (and, in a 5-stage fabric, the super-spines) announce; a super-spine what one pod's
# spines do. Every session imports only that, and at most as many routes as the peer may send:
# one more and bird restarts the session (a peer gone wrong loses its session, not the fabric).

def _covering(nets: list[ipaddress.IPv6Network]) -> ipaddress.IPv6Network:
    """The smallest prefix holding all of nets (a host port's /64s: its /48 in the plan)."""
    top = nets[0]
    while not all(n.subnet_of(top) for n in nets):
        top = top.supernet()
    return top


def announced(fabric, node) -> tuple[list[str], int]:
    """(bird prefix patterns, route count) that node may announce to its BGP peers of the next
    tier up: a leaf its hosts' /64s, a scale-up GPU its loopback."""
    if fabric.is_gpu(node.name):
        return [f"{fabric.loopback_net(node.name)}{{128,128}}"], 1
    pats, count = [], 0
    for port, _, _ in fabric.host_ports(node):
        nets = fabric.host_prefixes(node, port)
        pats.append(f"{_covering(nets)}{{64,64}}")
        count += len(nets)
    return pats, count


def _leaves_set(fabric, leaves) -> tuple[list[str], int]:
    pats, count = [], 0
    for lf in leaves:
        p, n = announced(fabric, lf)
        pats += p
        count += n
    return pats, count


def _filter(pats: list[str], count: int) -> str:
    """A channel's import: only these prefixes, at most `count` of them; a peer that floods is
    cut at twice that (bird counts what it receives, filtered or not)."""
    if not pats:
        return "import none;"
    return (f"import where net ~ [ {', '.join(pats)} ]; import limit {count} action restart; "
            f"receive limit {2 * count + 64} action restart;")


def _timers(fabric: SwitchedFabric) -> str:
    """Fast timers; graceful restart (peers keep a restarting switch's routes for
    graceful_restart_s, and it keeps theirs), with BFD loss handled as a restart too: a dead bird
    stops its BFD, which must not tear routes down while the switch still forwards. A link that
    loses carrier still drops its sessions at once. GTSM and TCP MD5 as the fabric file says
    (rlbfabric/bgpsec.py)."""
    out = (f"hold time {fabric.bgp.hold_s}; keepalive time {fabric.bgp.keepalive_s}; "
           "connect delay time 1; connect retry time 2; "
           f"error wait time 1, 5; graceful restart on; graceful restart time {fabric.graceful_restart_s};"
           + (" bfd graceful;" if fabric.bfd else ""))
    if fabric.bgp.ttl_security:
        out += " ttl security on;"
    secret = fabric.bgp.secret()
    if secret:
        out += f' password "{secret}";'
    return out


def _leaf_import(fabric: SwitchedFabric, leaf: Node) -> str:
    """With parallel links, AIGP picks the spine but not which of its links: prefer the link whose
    colour the route carries (LOCAL_PREF on import, the notes' equivalent of AIGP pinning)."""
    if fabric.parallel == 1:
        return ""
    lines = []
    for k in range(1, fabric.paths + 1):
        lines.append(f"  if uplink = {fabric.port_id(k, leaf)} && (generic, {COLOUR_COMMUNITY:#x}, {k}) ~ bgp_ext_community "
                     f"then bgp_local_pref = 200;")
    return "function leaf_import(int uplink)\n{\n" + "\n".join(lines) + "\n  return true;\n}\n"


def render_leaf(fabric: SwitchedFabric, leaf: Node, run_dir: Path, baseline: bool = False) -> str:
    """baseline: the fabric as people run it today, for comparison: no AIGP pinning, bird
    merges the equal paths into kernel ECMP routes."""
    hports = fabric.host_ports(leaf)
    cases = []
    for port, _, _ in hports:
        for k, net in enumerate(fabric.host_prefixes(leaf, port), start=1):
            cases.append(f"  if net = {net} then k = {k};")
    ifs = ", ".join(f'"{ifname}"' for _, _, ifname in hports)
    radv = "\n".join([*(f'  interface "{ifname}" {{ min ra interval 3; max ra interval 4; }};'
                        for _, _, ifname in hports), _fabric_radv([p.ifname for p in fabric.ports_up(leaf)])])
    hi = pathbw_hi(fabric.pathbw_subtype, leaf.asn)
    port_of_k = "\n".join(f"  if k = {k} then uplink_k = {fabric.port_id(k, leaf)};"
                          for k in range(1, fabric.paths + 1))
    aigp = (f"if uplink_k = uplink then igp_metric = 10; else igp_metric = {NO_AIGP_METRIC};"
            if not baseline else f"igp_metric = {NO_AIGP_METRIC};   # baseline: no pinning")
    return _common(f"10.255.{leaf.index}.1", run_dir, leaf.name, ecmp=baseline) + f"""protocol direct {{ ipv6; interface {ifs}; }}
protocol radv {{
{radv}
}}
{_bfd(fabric, "eth-*")}
# prefix k: colour k to every uplink, AIGP only on the uplink of colour k (Juniper Table 2),
# FARE path bandwidth originated at its maximum
function leaf_export(int uplink)
int k; int uplink_k;
{{
  if source != RTS_DEVICE then return false;
  k = 0;
{chr(10).join(cases)}
  if k = 0 then return false;
{port_of_k}
  bgp_ext_community.add((generic, {COLOUR_COMMUNITY:#x}, k));
  bgp_ext_community.add((generic, {hi:#x}, {float_bits(MAX_BANDWIDTH):#x}));
  {aigp}
  return true;
}}

{_leaf_import(fabric, leaf)}
template bgp spine {{
  local as {leaf.asn};
  {_timers(fabric)}
  ipv6 {{ import none; aigp originate; }};
}}
include "{neighbors_file(run_dir, leaf.name)}";   # written by the agent from neighbour discovery
"""


def _dynamic(fabric, ports, template: str, imports=None) -> str:
    """One passive, unnumbered protocol per port: whoever connects on it over link-local, with
    the peer's AS and importing only what that peer may announce."""
    out = []
    for p in ports:
        pats, n = imports(p.peer) if imports else announced(fabric, p.peer)
        out.append(f'protocol bgp {p.bgp_name} from {template} {{ interface "{p.ifname}"; '
                   f'neighbor range fe80::/10 as {p.peer.asn}; dynamic name "{p.bgp_name}_"; '
                   f'ipv6 {{ {_filter(pats, n)} }}; }}')
    return "\n".join(out)


def spine_router_id(spine: Node) -> str:
    """A spine's router id, whichever daemon runs it (rlbfabric/frr renders FRR's with it)."""
    return f"10.255.{100 + spine.pod}.{spine.plane}"


def render_spine(fabric: SwitchedFabric, spine: Node, run_dir: Path, baseline: bool = False) -> str:
    up = ""
    if fabric.uplinks(spine):
        up = f"""
template bgp superspine {{
  local as {spine.asn};
  {_timers(fabric)}
  ipv6 {{ import none; export where pathbw_export(); aigp on; next hop self; }};
}}
include "{neighbors_file(run_dir, spine.name)}";   # super-spines: written by the agent
"""
    fabric_ports = [p.ifname for p in (*fabric.ports_down(spine), *fabric.ports_up(spine))]
    return _common(spine_router_id(spine), run_dir, spine.name, ecmp=baseline) + f"""{_bfd(fabric, "eth-*")}
include "{pathbw_file(run_dir, spine.name)}";   # FARE: written by the agent
protocol radv {{
{_fabric_radv(fabric_ports)}
}}

template bgp leaf {{
  local as {spine.asn};
  {_timers(fabric)}
  ipv6 {{ import none; export where pathbw_export(); aigp on; next hop self; }};
}}
{_dynamic(fabric, fabric.ports_down(spine), "leaf")}
{up}"""


def render_superspine(fabric: SwitchedFabric, ss: Node, run_dir: Path, baseline: bool = False) -> str:
    return _common(f"10.255.200.{ss.index}", run_dir, ss.name, ecmp=baseline) + f"""{_bfd(fabric, "eth-*")}
include "{pathbw_file(run_dir, ss.name)}";   # FARE link bandwidth: written by the agent
protocol radv {{
{_fabric_radv([p.ifname for p in fabric.ports_down(ss)])}
}}

template bgp spine {{
  local as {ss.asn};
  {_timers(fabric)}
  ipv6 {{ import none; export where pathbw_export(); aigp on; next hop self; }};
}}
{_dynamic(fabric, fabric.ports_down(ss), "spine", lambda sp: _leaves_set(fabric, [lf for lf in fabric.leaves if lf.pod == sp.pod]))}
"""


def render_gpu(fabric, gpu: str, run_dir: Path) -> str:
    """A GPU host of a scale-up fabric (draft-fare-scale-up §3): one eBGP session per sub-port to
    its plane's switch (unnumbered: the switch is fe80::1 on every link), BFD on each, its
    loopback exported into every plane with the path bandwidth of its live sub-ports there (an
    include the host agent rewrites when a sub-port goes up or down), every peer's loopback
    learnt per plane with the plane switch's FARE value. bird programs no kernel routes: the
    loopback prefix is routed to the loopback device, whose TC program chooses the port."""
    g = fabric.gpu(gpu)
    lo = fabric.loopback_prefix()
    sessions = "\n".join(
        f'protocol bgp {port.plane.name}s{port.sub} from plane {{ interface "{port.ifname}"; '
        f'neighbor {SWITCH_LL} as {port.plane.asn}; ipv6 {{ export where gpu_export({port.plane.index}); }}; }}'
        for port in fabric.gpu_ports(gpu))
    return f"""# rendered by rlbhost bird-config for GPU {gpu}: edit the fabric file, not this
router id 10.254.{g.index >> 8}.{g.index & 255};
log "{run_dir}/{gpu}.bird.log" {LOG_LIMIT} "{run_dir}/{gpu}.bird.log.1" all;
debug protocols {{ states, events }};
protocol device {{ scan time 1; }}
protocol direct {{ ipv6; interface "{LOOPBACK_DEVICE}"; }}
{_bfd(fabric, "eth-*")}
include "{pathbw_file(run_dir, gpu)}";   # gpu_export(plane): written by rlbhost

template bgp plane {{
  local as {g.asn};
  {_timers(fabric)}
  ipv6 {{ import where net ~ [ {lo}{{128,128}} ] && net != {fabric.loopback_net(gpu)}; import limit {max(1, len(fabric.gpus) - 1)} action restart; receive limit {2 * len(fabric.gpus) + 64} action restart; export none; }};
}}
{sessions}
"""


def render_gpu_pathbw(fabric, gpu: str, plane_bw: dict[int, float]) -> str:
    """gpu_export(plane): the GPU's loopback, with the path bandwidth of its live sub-ports into
    that plane (bytes/s; a plane left out gets its full bandwidth)."""
    g = fabric.gpu(gpu)
    hi = pathbw_hi(fabric.pathbw_subtype, g.asn)
    cases = "\n".join(
        f"  if plane = {p.index} then bgp_ext_community.add((generic, {hi:#x}, "
        f"{float_bits(plane_bw.get(p.index, fabric.subports * fabric.sub_mbps(p.name) * 1e6 / 8)):#x}));"
        for p in fabric.planes)
    return f"""# written by rlbhost: {gpu}'s loopback into each plane, path bandwidth = its live sub-ports there
function gpu_export(int plane)
{{
  if source != RTS_DEVICE || net != {fabric.loopback_net(gpu)} then return false;
{cases}
  return true;
}}
"""


def render(fabric: SwitchedFabric, node: str, run_dir: Path, baseline: bool = False) -> str:
    if fabric.is_gpu(node):
        return render_gpu(fabric, node, run_dir)
    n = fabric.node(node)
    fn = {"leaf": render_leaf, "spine": render_spine, "superspine": render_superspine}[n.role]
    return fn(fabric, n, run_dir, baseline)


def neighbors_file(run_dir: Path, node: str) -> Path:
    """The include with the BGP sessions to the discovered uplink neighbours."""
    return run_dir / f"{node}.neighbors.conf"


def pathbw_file(run_dir: Path, node: str) -> Path:
    """The include with the FARE export filter (path or link bandwidth per prefix)."""
    return run_dir / f"{node}.pathbw.conf"


def initial_includes(fabric: SwitchedFabric, node: Node | str, run_dir: Path) -> dict[Path, str]:
    """The includes a node's bird.conf names, as they start before the agent has found or
    computed anything: neighbours where the node has uplinks, path bandwidth on spines and
    super-spines (and, on a scale-up GPU, its loopback's path bandwidth per plane)."""
    if isinstance(node, str):
        if fabric.is_gpu(node):
            return {pathbw_file(run_dir, node): render_gpu_pathbw(fabric, node, {})}
        node = fabric.node(node)
    out = {}
    if fabric.uplinks(node):
        out[neighbors_file(run_dir, node.name)] = render_neighbors(fabric, node, {})
    if node.role != "leaf":
        out[pathbw_file(run_dir, node.name)] = render_pathbw(fabric, node, {})
    return out


def render_neighbors(fabric: SwitchedFabric, node: Node, found: dict[str, str]) -> str:
    """Sessions on the uplink ports whose peer link-local address was discovered
    {port's bgp name: addr}: a leaf's spines (exporting its prefixes by colour), a spine's
    super-spines."""
    out = ["# written by rlbswitch from neighbour discovery"]
    for port in fabric.ports_up(node):
        addr = found.get(port.bgp_name)
        if not addr:
            continue
        if node.role == "leaf":
            # from a spine: every other leaf's hosts (its own come back only with its AS in the path)
            pats, n = _leaves_set(fabric, [lf for lf in fabric.leaves if lf is not node])
            imp = _filter(pats, n)
            if fabric.parallel > 1:
                imp = imp.replace("import where ", f"import where leaf_import({port.colour}) && ", 1)
            out.append(f'protocol bgp {port.bgp_name} from spine {{ interface "{port.ifname}"; '
                       f'neighbor {addr} as {port.peer.asn}; ipv6 {{ {imp} export where leaf_export({port.colour}); }}; }}')
        else:
            # from a super-spine: the leaves of the other pods
            pats, n = _leaves_set(fabric, [lf for lf in fabric.leaves if lf.pod != node.pod])
            out.append(f'protocol bgp {port.bgp_name} from superspine {{ interface "{port.ifname}"; '
                       f'neighbor {addr} as {port.peer.asn}; ipv6 {{ {_filter(pats, n)} }}; }}')
    return "\n".join(out) + "\n"


def render_pathbw(fabric: SwitchedFabric, node: Node, values: dict[str, float]) -> str:
    """Export filter with the FARE values the agent computed per prefix.

    spine: the transitive path bandwidth (min(link, received), summed over the prefix's routes)
    replaces any there; the one-hop link-bandwidth community of a super-spine is removed.
    super-spine: the transitive value passes untouched; the bandwidth of the link towards the
    advertising spine is attached (the draft's non-transitive community, sent one hop)."""
    asns = fabric.asns()
    link_deletes = ", ".join(f"(generic, {pathbw_hi(fabric.linkbw_subtype, a):#x}, *)" for a in asns)
    if node.role == "superspine":
        hi = pathbw_hi(fabric.linkbw_subtype, node.asn)
        cases = "\n".join(f"  if net = {net} then bgp_ext_community.add((generic, {hi:#x}, {float_bits(v):#x}));"
                          for net, v in sorted(values.items()))
        return f"""# written by rlbswitch: link bandwidth towards the advertising spine, per prefix
function pathbw_export()
{{
  bgp_ext_community.delete([{link_deletes}]);
{cases}
  return true;
}}
"""
    hi = pathbw_hi(fabric.pathbw_subtype, node.asn)
    deletes = ", ".join(f"(generic, {pathbw_hi(fabric.pathbw_subtype, a):#x}, *)" for a in asns)
    cases = "\n".join(
        f"  if net = {net} then {{ bgp_ext_community.delete([{deletes}]); "
        f"bgp_ext_community.add((generic, {hi:#x}, {float_bits(v):#x})); }}"
        for net, v in sorted(values.items()))
    return f"""# written by rlbswitch: FARE path bandwidth per prefix (bytes/s as float32)
function pathbw_export()
{{
  bgp_ext_community.delete([{link_deletes}]);   # one hop only
{cases}
  return true;
}}
"""


def prepare(fabric: SwitchedFabric, node: str, run_dir: Path) -> tuple[str, list[Path], str | None]:
    """What `bird-config` does on a switch or a GPU: bird.conf's text, the includes it names
    (written where missing: what the agent found before outlives a bird restart), and a note for
    the operator when the sessions would run without TCP MD5."""
    text = render(fabric, node, run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    incs = initial_includes(fabric, node, run_dir)
    for inc, body in incs.items():
        if not inc.exists():
            inc.write_text(body)
    note = None
    if not fabric.bgp.secret():
        where = fabric.bgp.password_file or "the file bgp_password_file names"
        note = (f"note: BGP sessions without TCP MD5: put one shared secret in {where} on every "
                f"switch and GPU (docs/operations.md)")
    return text, list(incs), note
