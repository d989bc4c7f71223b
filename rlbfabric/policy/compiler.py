"""From bird's paths to data-plane routes, per policy.

    dpf   Juniper BGP-DPF: pin the path with the lowest AIGP (no AIGP = infinite, as RFC 7311
          selection has it; ties to bird's best), the other paths as its DLB backup group. When
          no path carries AIGP, the colour says the spine: a spine that drops AIGP (optional,
          non-transitive: FRR before 8.5, many vendors) still passes the colour community
          (transitive), so the path arriving by this leaf's uplink of the prefix's colour is
          pinned. DLB over the rest only when that path is gone too (the pinned spine withdrew)
    fare  weighted by FARE path bandwidth (plain ECMP unless every path carries it)
    ecmp  equal weights
    dlb   flowlet DLB over all paths
    spray per packet, weighted by FARE path bandwidth (equal without it): draft-fare-scale-up
          §3.2, for planes whose QPs tolerate reordering
Only BGP paths with a next hop are compiled; connected prefixes come from interface addresses."""
from __future__ import annotations

import logging
from collections import defaultdict
from dataclasses import dataclass
from typing import Callable, Iterable

from rlbcommon.constants import POLICIES
from rlbfabric.bird.ctl import DEFAULT_PATHBW_SUBTYPE, BirdPath

from . import pathbw
from ..routes import NextHop, Route

log = logging.getLogger(__name__)
INFINITE = float("inf")


@dataclass
class Compiled:
    route: Route
    why: str


def homing(paths: list[BirdPath]) -> int:
    """Leaves a prefix is homed on, as far as these paths show (distinct origin ASes). A remote
    leaf sees one path per spine, so the fabric description is the better source."""
    return max(1, len({p.as_path[-1] for p in paths if p.as_path}))


def compile_prefix(net: str, paths: list[BirdPath], policy: str, link_bw: Callable[[str], float],
                   subtype: int = DEFAULT_PATHBW_SUBTYPE, homes: int | None = None,
                   colour_port: Callable[[int], str | None] = lambda colour: None) -> Compiled | None:
    """colour_port(colour): this switch's port a path of that colour is pinned to (a leaf's
    uplink of the colour), None where colours pin nothing."""
    seen, usable = set(), []
    for p in sorted((p for p in paths if p.via and p.iface and p.source == "BGP"),
                    key=lambda p: (p.iface, p.via, not p.best)):
        if (p.iface, p.via) not in seen:   # one next hop per neighbour
            seen.add((p.iface, p.via))
            usable.append(p)
    if not usable:
        return None
    homes = homes or homing(usable)
    hops = [NextHop(p.iface, gateway=p.via) for p in usable]
    if policy == "dpf" and all(p.aigp is None for p in usable):
        colour = next((c for p in usable for c in p.colours), None)
        port = colour_port(colour) if colour is not None else None
        on_port = [i for i, p in enumerate(usable) if port is not None and p.iface == port]
        if on_port:
            best = min(on_port, key=lambda i: (not usable[i].best, i))
            return _pinned(net, hops, best, f"pinned to {usable[best].proto} by colour {colour} (no AIGP on "
                                            "any path: a spine that drops it)")
        if len(usable) > 1:
            # the pinned path is gone: Juniper falls back to DLB over the remaining paths
            return Compiled(Route(net, "dlb", hops), f"DLB over {len(hops)} paths: no AIGP path, none by "
                            f"colour {colour if colour is not None else '-'} (pinned path lost)")
    if policy == "dpf":
        best = min(range(len(usable)), key=lambda i: (
            usable[i].aigp if usable[i].aigp is not None else INFINITE, not usable[i].best, i))
        p = usable[best]
        return _pinned(net, hops, best, f"pinned to {p.proto} (AIGP {p.aigp}, colour {p.colours or '-'})"
                       if p.aigp is not None else f"pinned to {p.proto} (bird's best; no AIGP)")
    if policy == "dlb":
        return Compiled(Route(net, "dlb", hops), f"DLB over {len(hops)} paths")
    if policy in ("fare", "spray"):
        mode, how = ("weighted", "FARE") if policy == "fare" else ("spray", "spray, FARE")
        bws = [p.path_bandwidth(subtype) for p in usable]
        w = pathbw.weights([link_bw(p.iface) for p in usable], bws, homes)
        if w is None:
            if policy == "spray":
                return Compiled(Route(net, "spray", hops),
                                f"spray evenly over {len(hops)} paths: not every path carries path bandwidth")
            return Compiled(Route(net, "ecmp", hops), "ECMP: not every path carries path bandwidth")
        units = pathbw.to_weight_units(w)
        return Compiled(Route(net, mode, [NextHop(h.ifname, h.gateway, weight=u)
                                          for h, u in zip(hops, units)]),
                        f"{how} weights {units} Mb/s (homed on {homes})")
    if policy == "ecmp":
        return Compiled(Route(net, "ecmp", hops), f"ECMP over {len(hops)} paths")
    raise ValueError(f"policy {policy!r}: choose one of {', '.join(POLICIES)}")


def _pinned(net: str, hops: list[NextHop], best: int, why: str) -> Compiled:
    """hops[best] pinned, the others its DLB backup group."""
    backups = [h for i, h in enumerate(hops) if i != best]
    return Compiled(Route(net, "pinned", [hops[best]], backups), f"{why}, {len(backups)} DLB backups")


def compile_all(paths: Iterable[BirdPath], policy_for: Callable[[str], str],
                link_bw: Callable[[str], float], subtype: int = DEFAULT_PATHBW_SUBTYPE,
                homes_of: Callable[[str], int | None] = lambda net: None,
                colour_port: Callable[[int], str | None] = lambda colour: None) -> dict[str, Compiled]:
    by_net: dict[str, list[BirdPath]] = defaultdict(list)
    for p in paths:
        by_net[p.net].append(p)
    out = {}
    for net, ps in by_net.items():
        try:
            c = compile_prefix(net, ps, policy_for(net), link_bw, subtype, homes_of(net), colour_port)
        except (ValueError, ArithmeticError) as e:     # one prefix, never the table
            log.warning("%s: not compiled (%s); left as programmed", net, e)
            continue
        if c is not None:
            out[net] = c
    return out


def compile_for_node(fabric, node, paths: list[BirdPath], link_bw: Callable[[str], float]) -> dict[str, Compiled]:
    """A switch's whole policy: leaves (and spines for their own pod) follow the fabric's policy
    per prefix. A spine's routes learnt from super-spines (other pods) are weighted by FARE on the
    link bandwidth the super-spines attached (each pod's prefix is homed on one leaf), ECMP
    without it."""
    if node.role == "leaf":
        return compile_all(paths, fabric.policy_for, link_bw, fabric.pathbw_subtype,
                           colour_port=colour_ports(fabric, node))
    if node.role != "spine" or not fabric.uplinks(node):
        return compile_all(paths, fabric.policy_for, link_bw, fabric.pathbw_subtype)
    up = {p.ifname for p in fabric.ports_up(node)}
    remote = {p.net for p in paths if p.iface in up}
    out = compile_all([p for p in paths if p.net not in remote], fabric.policy_for, link_bw,
                      fabric.pathbw_subtype)
    out.update(compile_all([p for p in paths if p.net in remote], lambda n: "fare", link_bw,
                           fabric.linkbw_subtype, lambda n: 1))
    return out


def colour_ports(fabric, leaf) -> Callable[[int], str | None]:
    """colour k -> the leaf's uplink a path of colour k is pinned to (the one the originating
    leaf gives AIGP: port_id)."""
    by_id = {p.colour: p.ifname for p in fabric.ports_up(leaf)}
    return lambda k: by_id.get(fabric.port_id(k, leaf)) if k >= 1 else None
