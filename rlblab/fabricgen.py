"""Fabric files from a few numbers, for `rlblab up --spines 4 --leaves 2 --hosts 2 --stages 3`, and
uneven ones (hosts per leaf, slower leaf-spine links) for tests and benches that must not depend
on the even fabrics in lab/."""
from __future__ import annotations

import random


def make_fabric(spines: int = 4, leaves: int = 2, hosts: int | list[int] = 2, stages: int = 3,
                link_mbps: int = 10000, policy: str = "dpf", parallel: int = 1,
                slow: dict[tuple[int, int], int] | None = None, rails: int = 0) -> str:
    """TOML text. 3-stage: one pod. 5-stage: two pods of leaves/2 leaves each (at least one)
    and one super-spine per plane. `hosts`: per leaf, or one number for all; `slow`: {(leaf
    number, spine number): Mb/s} for leaf-spine links slower than link_mbps (3-stage).
    `rails` R: GPU servers of R NICs instead of one-NIC hosts, rail-optimised: the leaves in
    stripes of R (leaves a multiple of R), `hosts` servers a stripe (srv1, srv2, ...), server i's
    NIC gpu<r>_eth on leaf r of its stripe."""
    if stages not in (3, 5):
        raise ValueError("stages must be 3 or 5")
    if rails:
        if rails < 1 or leaves % rails or not isinstance(hosts, int) or not 1 <= hosts <= 4:
            raise ValueError(f"rails {rails}: leaves ({leaves}) must be a multiple of the rails, and 1-4 servers "
                             "a stripe")
        text = make_fabric(spines, leaves, 0, stages, link_mbps, policy, parallel, slow)
        lines, n = [text], 0
        for s in range(leaves // rails):
            names = [f'"srv{n + i + 1}"' for i in range(hosts)]
            n += hosts
            lines += ["[[stripe]]", f'name = "st{s + 1}"',
                      f"leaves = [{', '.join(f'{chr(34)}l{s * rails + r + 1}{chr(34)}' for r in range(rails))}]",
                      f"servers = [{', '.join(names)}]", ""]
        return "\n".join(lines)
    per_leaf = list(hosts) if isinstance(hosts, (list, tuple)) else [hosts] * leaves
    if not 1 <= spines <= 8 or not 1 <= leaves <= 8 or len(per_leaf) != leaves or \
            not all(0 <= h <= 4 for h in per_leaf):
        raise ValueError("spines and leaves 1-8, hosts 0-4 per leaf")
    if slow and stages != 3:
        raise ValueError("slower links only in 3-stage fabrics")
    pods = 2 if stages == 5 else 1
    lines = ["[fabric]", f"paths = {spines * parallel}", f"parallel = {parallel}", 'prefix = "fc00"', f'policy = "{policy}"',
             f"link_mbps = {link_mbps}", "bfd = true", ""]
    if stages == 5:
        for k in range(1, spines + 1):
            lines += ["[[superspine]]", f'name = "ss{k}"', "asn = 65100", f"plane = {k}", ""]
    for p in range(1, pods + 1):
        for k in range(1, spines + 1):
            name = f"s{p}{k}" if pods > 1 else f"s{k}"
            lines += ["[[spine]]", f'name = "{name}"', f"asn = {65000 + 10 * (p - 1) * (pods > 1)}",
                      f"pod = {p}", ""]
    h = 0
    for i in range(1, max(leaves, pods) + 1):
        pod = 1 + (i - 1) * pods // max(leaves, pods)
        names = []
        for _ in range(per_leaf[min(i, leaves) - 1]):
            h += 1
            names.append(f'"h{h}"')
        lines += ["[[leaf]]", f'name = "l{i}"', f"asn = {65000 + 100 + i}", f"pod = {pod}",
                  f"hosts = [{', '.join(names)}]", ""]
    for (leaf, spine), mbps in sorted((slow or {}).items()):
        if not (1 <= leaf <= leaves and 1 <= spine <= spines) or not 0 < mbps:
            raise ValueError(f"slow link l{leaf}-s{spine}: no such link or a bad speed {mbps}")
        lines += ["[[link]]", f'between = ["l{leaf}", "s{spine}"]', f"mbps = {mbps}", ""]
    return "\n".join(lines)


def random_fabric(rnd: random.Random, spines=(2, 4), leaves=(2, 3), hosts=(1, 3), slow_share: float = 0.25,
                  link_mbps: int = 10000) -> str:
    """An uneven 3-stage fabric: a random number of spines and leaves, hosts per leaf and
    leaf-spine links at half speed (each with probability slow_share)."""
    n_sp, n_lf = rnd.randint(*spines), rnd.randint(*leaves)
    per_leaf = [rnd.randint(*hosts) for _ in range(n_lf)]
    slow = {(lf, sp): link_mbps // 2 for lf in range(1, n_lf + 1) for sp in range(1, n_sp + 1)
            if rnd.random() < slow_share}
    return make_fabric(n_sp, n_lf, per_leaf, link_mbps=link_mbps, slow=slow)
