"""The rule every host applies on its own when no coordinator answers (bpf/rlb_host.c implements
it; this is its model for simulations, checked against the program in the test-run tests).

A new QP goes to the path with the fewest of this host's active QPs for its weight (so a host's
own QPs are always split exactly by weight), and a tie is broken by a rotation: the search starts
at a path given by the host's place in the fabric. Hosts of one leaf start half, a quarter,
three quarters ... of the way round (the van der Corput sequence of their port, so any number
of hosts is spread), shifted by the leaf's index so equal ports of different leaves differ too.
QPs to hosts on the same leaf never reach a spine; they are counted apart (a weight entry of their
own) so they do not turn the rotation."""
from __future__ import annotations

from ..fabric import Fabric


def van_der_corput(i: int) -> float:
    """0, 1/2, 1/4, 3/4, 1/8, ...: the bits of i mirrored behind the binary point."""
    out, f = 0.0, 0.5
    while i:
        out += f * (i & 1)
        i >>= 1
        f /= 2
    return out


def rotation(fabric: Fabric, host: str) -> int:
    """The path index (0-based, path k = index k-1) where this host's ties start."""
    leaf, port = fabric.leaf_of_host(host)
    n = fabric.colours()
    return (int(van_der_corput(port - 1) * n) + leaf.index - 1) % n


def choose(active: list[int], weights: list[float], start: int) -> int | None:
    """Weighted least-active with ties to the first path from start (the program's loop):
    minimise (active + 1) / weight over paths with a positive weight."""
    n = len(active)
    best = None
    for j in range(n):
        i = (start + j) % n
        if weights[i] <= 0:
            continue
        if best is None or (active[i] + 1) * weights[best] < (active[best] + 1) * weights[i]:
            best = i
    return best


def simulate(fabric: Fabric, qps: list[tuple[str, str]], weights: list[float] | None = None) -> list[int | None]:
    """The path index every QP (source, destination), in arrival order, gets from the local rule
    when all stay active: None for QPs within a leaf (no spine; counted apart)."""
    paths = fabric.paths
    weights = weights or [1.0] * paths
    leaf_of = {h: fabric.leaf_of_host(h)[0].name for h in fabric.hosts}
    active: dict[str, list[int]] = {}
    start = {h: rotation(fabric, h) for h in fabric.hosts}
    out = []
    for src, dst in qps:
        if leaf_of[src] == leaf_of[dst]:
            out.append(None)
            continue
        act = active.setdefault(src, [0] * paths)
        i = choose(act, weights, start[src])
        act[i] += 1
        out.append(i)
    return out
