"""FARE path bandwidth arithmetic (draft-xu-idr-fare, 2026 text §4.1 and §4.2), bytes per second.

Every hop weights a route by min(bandwidth of the link towards the advertiser, the route's path
bandwidth) and readvertises the sum of those weights; a prefix homed on several leaves has its
path bandwidth divided by their number first. Weighted ECMP is used only when every equal-cost
route carries the community; otherwise plain ECMP."""
from __future__ import annotations

from typing import Sequence

MAX_BANDWIDTH = 3.4e38   # what a leaf originates: "a maximum bandwidth value" (float32 max)


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
