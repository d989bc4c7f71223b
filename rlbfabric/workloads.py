"""Traffic matrices as collectives make them: which host sends to which, each connection with the
same number of QPs. Hosts are named as in the fabric file, in its order."""
from __future__ import annotations

import random

KINDS = ("pairs", "all-to-all", "ring", "permutation", "moe", "tree")


def connections(kind: str, hosts: list[str], rnd: random.Random | None = None,
                fanout: int = 3) -> list[tuple[str, str]]:
    """(source, destination) per connection.

    pairs        the first half of the hosts each to its counterpart in the second half
                 (h1->h3, h2->h4 on a 2x2-host fabric)
    all-to-all   every ordered pair
    ring         each host to the next (NCCL ring), the last to the first
    permutation  a random derangement: every host sends to one other, every host receives once
    moe          every host to `fanout` random others (mixture-of-experts dispatch)
    tree         binary tree over the host order, both ways (NCCL tree reduce + broadcast)"""
    n = len(hosts)
    if n < 2:
        raise ValueError("a traffic matrix needs at least two hosts")
    rnd = rnd or random.Random(0)
    if kind == "pairs":
        half = n // 2
        return [(hosts[i], hosts[i + half]) for i in range(half)]
    if kind == "all-to-all":
        return [(a, b) for a in hosts for b in hosts if a != b]
    if kind == "ring":
        return [(hosts[i], hosts[(i + 1) % n]) for i in range(n)] if n > 2 else [(hosts[0], hosts[1])]
    if kind == "permutation":
        while True:
            perm = list(range(n))
            rnd.shuffle(perm)
            if all(perm[i] != i for i in range(n)):
                return [(hosts[i], hosts[perm[i]]) for i in range(n)]
    if kind == "moe":
        k = min(fanout, n - 1)
        return [(a, b) for a in hosts for b in rnd.sample([h for h in hosts if h != a], k)]
    if kind == "tree":
        out = []
        for i in range(1, n):
            parent = (i - 1) // 2
            out += [(hosts[i], hosts[parent]), (hosts[parent], hosts[i])]
        return out
    raise ValueError(f"workload {kind!r}: choose one of {', '.join(KINDS)}")
