"""Fabric files from a few numbers, for `rlblab up --spines 4 --leaves 2 --hosts 2 --stages 3`."""
from __future__ import annotations


def make_fabric(spines: int = 4, leaves: int = 2, hosts: int = 2, stages: int = 3,
                link_mbps: int = 10000, policy: str = "dpf", parallel: int = 1) -> str:
    """TOML text. 3-stage: one pod. 5-stage: two pods of leaves/2 leaves each (at least one)
    and one super-spine per plane."""
    if stages not in (3, 5):
        raise ValueError("stages must be 3 or 5")
    if not 1 <= spines <= 8 or not 1 <= leaves <= 8 or not 0 <= hosts <= 4:
        raise ValueError("spines and leaves 1-8, hosts 0-4 per leaf")
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
        for _ in range(hosts):
            h += 1
            names.append(f'"h{h}"')
        lines += ["[[leaf]]", f'name = "l{i}"', f"asn = {65000 + 100 + i}", f"pod = {pod}",
                  f"hosts = [{', '.join(names)}]", ""]
    return "\n".join(lines)
