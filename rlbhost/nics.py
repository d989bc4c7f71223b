"""A host's fabric NICs. A GPU server cables one NIC to each rail leaf (gpu0_eth ... gpu7_eth);
one agent serves them all, each NIC with a data plane of its own (its paths, weights, QP table and
counters: HostDataplane(instance, nic)) and, with a fabric file, its own name among the fabric's
hosts (<server>-<nic>), which the coordinator places and the address plan gives prefixes. A host
with one NIC keeps the one data plane it always had (HostDataplane(instance))."""
from __future__ import annotations

from dataclasses import dataclass

from rlbfabric.base import Fabric

from .dataplane import HostDataplane, HostError


@dataclass
class Nic:
    ifname: str
    dp: HostDataplane
    host: str | None = None        # its name among the fabric's hosts (None without a fabric file)
    ifindex: int = 0               # as last attached: a NIC made anew (driver reset) gets another

    @property
    def label(self) -> str:
        """The `nic` label of metrics and the heading of status lines ('' on a one-NIC host)."""
        return self.dp.label


def fabric_nics(fabric: Fabric, node: str, given: list[str]) -> dict[str, str | None]:
    """{interface: its host in the fabric} of a machine: a server's NICs (all, or those given,
    each of which must be one), or a one-NIC host's one interface (named as the operator likes)."""
    hosts = fabric.endpoints(node)
    if len(hosts) == 1 and fabric.machine_of(hosts[0]) == hosts[0]:      # a one-NIC host
        if len(given) > 1:
            raise HostError(f"{node} has one fabric NIC in the fabric file; {len(given)} interfaces given "
                            f"({', '.join(given)})")
        return {(given or [fabric.host_port(hosts[0])])[0]: hosts[0]}
    by_if = {fabric.host_port(h): h for h in hosts}
    unknown = [i for i in given if i not in by_if]
    if unknown:
        raise HostError(f"{', '.join(unknown)}: not a NIC of server {node} in the fabric file (its NICs: "
                        f"{', '.join(by_if)})")
    return {i: by_if[i] for i in (given or list(by_if))}


def open_nics(instance: str, interfaces: dict[str, str | None], several: bool) -> list[Nic]:
    """The NICs' data planes: one per NIC when the host has several (or is a server), else the
    one-NIC data plane."""
    if not several:
        (ifname, host), = interfaces.items()
        return [Nic(ifname, HostDataplane(instance), host)]
    return [Nic(ifname, HostDataplane(instance, ifname), host) for ifname, host in interfaces.items()]


def pinned_dataplanes(instance: str, nic: str | None = None) -> list[HostDataplane]:
    """What a command shows or changes: every NIC with pinned state here, or the one named."""
    have = HostDataplane.pinned(instance)
    if nic is not None:
        if nic not in have:
            names = [n for n in have if n]
            raise HostError(f"no NIC {nic!r} has RLB state here" + (f" (NICs: {', '.join(names)})" if names else
                                                                   " (this host has one NIC: leave out --nic)"))
        return [HostDataplane(instance, nic)]
    return [HostDataplane(instance, n) for n in have] or [HostDataplane(instance)]
