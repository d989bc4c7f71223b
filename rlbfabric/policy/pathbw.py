"""FARE path bandwidth arithmetic (draft-xu-idr-fare, 2026 text §4.1 and §4.2), bytes per second.

Every hop weights a route by min(bandwidth of the link towards the advertiser, the route's path
bandwidth) and readvertises the sum of those weights; a prefix homed on several leaves has its
path bandwidth divided by their number first. Weighted ECMP is used only when every equal-cost
route carries the community; otherwise plain ECMP."""
from __future__ import annotations

from typing import Sequence


def route_weight(link_bw: float, path_bw: float, homing: int = 1) -> float:
    """Weight of one route at a receiving node."""
    return min(link_bw, path_bw / max(1, homing))


def weights(link_bws: Sequence[float], path_bws: Sequence[float | None], homing: int = 1) -> list[float] | None:
    """Weights of a prefix's equal-cost routes, or None (plain ECMP) unless all carry one."""
    if not path_bws or any(p is None for p in path_bws):
        return None
    return [route_weight(lb, pb, homing) for lb, pb in zip(link_bws, path_bws)]


def readvertised(link_bws: Sequence[float], path_bws: Sequence[float | None], homing: int = 1) -> float | None:
    """Path bandwidth a node sends on: the sum of its routes' weights (3-stage spine, pod spine
    towards super-spines)."""
    w = weights(link_bws, path_bws, homing)
    return None if w is None else sum(w)


def superspine_nontransitive(link_bw_to_spine: float) -> float:
    """§4.2: a super-spine leaves the transitive value alone and may attach a non-transitive
    one: the bandwidth of its link towards the advertising spine."""
    return link_bw_to_spine


def remote_pod_spine_weights(link_bws: Sequence[float], nontransitive: Sequence[float | None]) -> list[float] | None:
    """§4.2: a spine in another pod weights routes from super-spines by min(link, the
    non-transitive value) when every route has one; otherwise ECMP."""
    return weights(link_bws, nontransitive)


def to_weight_units(values: Sequence[float]) -> list[int]:
    """Integer data-plane weights (Mb/s, at least 1) from bytes per second."""
    return [max(1, round(v * 8 / 1e6)) for v in values]


def node_values(fabric, node, paths, link_bw) -> dict[str, float]:
    """The path bandwidth a switch readvertises per prefix, from bird's paths (every path, not only
    the best) and link_bw(iface) in bytes per second.

    Spine: the prefixes its own leaves advertise get the sum of min(link, received) (§4.1); another
    pod's prefixes (learnt from super-spines) get, as §4.2's option, the transitive value lowered
    to the total towards the next-next hop (each route min(link, the link bandwidth its super-spine
    attached)) when that is smaller, and pass untouched unless every route carries it.
    Super-spine: the bandwidth of its link towards the advertising spine (§4.2)."""
    down = {p.ifname for p in fabric.ports_down(node)}
    up = {p.ifname for p in fabric.ports_up(node)}
    below: dict[str, list] = {}
    above: dict[str, list] = {}
    for p in paths:
        if p.source == "BGP" and p.iface in down:
            below.setdefault(p.net, []).append(p)
        elif p.source == "BGP" and p.iface in up:
            above.setdefault(p.net, []).append(p)
    values: dict[str, float] = {}
    for net, ps in below.items():
        if node.role == "superspine":
            best = next((p for p in ps if p.best), ps[0])
            values[net] = superspine_nontransitive(link_bw(best.iface))
            continue
        v = readvertised([link_bw(p.iface) for p in ps], [p.path_bandwidth(fabric.pathbw_subtype) for p in ps])
        if v is not None:
            values[net] = v
    if node.role == "spine":
        for net, ps in above.items():
            total = readvertised([link_bw(p.iface) for p in ps], [p.path_bandwidth(fabric.linkbw_subtype) for p in ps])
            carried = [p.path_bandwidth(fabric.pathbw_subtype) for p in ps]
            if total is not None and None not in carried:
                values[net] = min(min(carried), total)
    return values
