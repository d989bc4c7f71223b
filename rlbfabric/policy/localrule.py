"""The rule every host applies on its own when no coordinator answers (bpf/rlb_host.c implements
it; this is its model for simulations, checked against the program in the test-run tests).

A new QP goes to the path with the fewest of this host's active QPs for its weight (Webster's
rule: (active + 1/2) / weight; so a host's own QPs are always split by weight within one QP), and a tie is broken by a rotation: the search starts
at a path given by the host's place in the fabric. Hosts of one leaf start half, a quarter,
three quarters ... of the way round (the van der Corput sequence of their port, so any number
of hosts is spread), shifted by the leaf's index so equal ports of different leaves differ too.
QPs to hosts on the same leaf never reach a spine; they are counted apart (a weight entry of their
own) so they do not turn the rotation."""
from __future__ import annotations

from ..kinds.clos import ClosFabric


def van_der_corput(i: int) -> float:
    """0, 1/2, 1/4, 3/4, 1/8, ...: the bits of i mirrored behind the binary point."""
    out, f = 0.0, 0.5
    while i:
        out += f * (i & 1)
        i >>= 1
        f /= 2
    return out


def rotation(fabric: ClosFabric, host: str) -> int:
    """The path index (0-based, path k = index k-1) where this host's ties start."""
    leaf, port = fabric.leaf_of_host(host)
    n = fabric.colours()
    return (int(van_der_corput(port - 1) * n) + leaf.index - 1) % n


def path_weights(fabric: ClosFabric, host: str) -> dict[str, dict[int, float]]:
    """{destination leaf's prefix: {path value: weight}} for the leaves this host reaches over
    paths of unequal speed: each path weighs its narrowest leaf-spine link (FARE's path bandwidth,
    from the fabric file), relative to the fastest. Leaves reached over equal paths are left out
    (the ::/0 weights apply), so is the host's own leaf."""
    src, _ = fabric.leaf_of_host(host)
    out = {}
    for dst in fabric.leaves:
        if dst is src:
            continue
        bw = {k: min(fabric.link_mbps_between(src.name, fabric.spine_for_path(src, k).name),
                     fabric.link_mbps_between(dst.name, fabric.spine_for_path(dst, k).name))
              for k in range(1, fabric.paths + 1)}
        if len(set(bw.values())) > 1:
            top = max(bw.values())
            out[str(fabric.leaf_prefix(dst))] = {k: v / top for k, v in bw.items()}
    return out


def choose(active: list[int], weights: list[float], start: int) -> int | None:
    """Weighted least-active with ties to the first path from start (the program's loop):
    minimise (active + 1/2) / weight over paths with a positive weight (Webster's divisors, so
    2 QPs over a 10 and a 5 Gb/s path split one each, the nearest to 1.33:0.67; with equal
    weights this is plain least-active)."""
    n = len(active)
    best = None
    for j in range(n):
        i = (start + j) % n
        if weights[i] <= 0:
            continue
        if best is None or (2 * active[i] + 1) * weights[best] < (2 * active[best] + 1) * weights[i]:
            best = i
    return best


def simulate(fabric: ClosFabric, qps: list[tuple[str, str]], weights: list[float] | None = None) -> list[int | None]:
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
