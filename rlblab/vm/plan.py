"""The Vagrant lab's plan, derived from the same fabric file as the namespace lab: which VMs,
their management addresses and their point-to-point fabric links (UDP tunnels under libvirt,
internal networks under VirtualBox). The Vagrantfile reads it as JSON on the host and the
provisioning reads the same plan inside each VM, so both sides agree on names, MACs and ports.

    python -m rlblab.vm.plan --fabric lab/fabric-2x2.toml        # JSON on stdout

Interfaces in the VMs: eth0 is Vagrant's, eth1 the lab's management network (metrics,
Prometheus, the perftest handshake), then one NIC per fabric link, renamed after its MAC to
the fabric's name: a switch's port towards X is eth-X, a host's port towards its leaf eth-<leaf>.
A scale-up fabric (kind = "scaleup") has plane switches and GPUs: a GPU's sub-port i into plane P
is eth-P-i, the plane switch's end eth-<GPU>-i."""
from __future__ import annotations

import ipaddress
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

import typer

from rlbdeploy.units import deployable
from rlbfabric.fabric import Fabric, FabricError, load

MONITOR = "mon"
TUNNEL_BASE_PORT = 17000
# everyone else compiles BPF programs with clang: 1 GiB (a 2-NIC GPU server used at most 413 MiB
# through a whole rails VM run, rlb-lab-load's lines, 2026-12-01)
MEMORY_MIB = {"monitor": 768}
DEFAULT_MEMORY_MIB = 1024
SERIAL_LOG_DIR = "/var/log/libvirt/qemu"     # libvirt's own; the file is on the host, not the VM
# on every VM: the script of its load record (rlblab.vm.node.LOAD_LINE), run by rlb-lab-load and by
# the journal save (rlblab.vm.driver.VagrantLab.save_journals)
ETC = Path("/etc/rlb")                   # the lab's files on every VM
LOAD_SCRIPT = str(ETC / "lab-load.sh")


@dataclass
class LinkEnd:
    name: str          # the link, the same on both ends: rlb-<a>-<b>
    ifname: str        # this end's interface in the VM
    peer: str
    peer_ifname: str
    mac: str
    local_port: int    # UDP tunnel: this end listens here ...
    remote_port: int   # ... and sends to the peer's port
    mbps: int


@dataclass
class VmNode:
    name: str
    role: str          # spine | superspine | leaf | host | monitor
    mgmt_ip: str
    memory: int
    links: list[LinkEnd] = field(default_factory=list)

    @property
    def serial_log(self) -> str:
        """Where the host keeps what the VM writes to its serial port (the Vagrantfile's serial
        console; rlblab.vm.node.load_unit's lines): readable when the VM no longer answers."""
        return f"{SERIAL_LOG_DIR}/rlb-serial-{self.name}.log"


def _mac(link: int, side: int) -> str:
    # locally administered, "RL", the link number and the side: unique within the lab
    return f"02:52:4c:{link >> 8 & 0xff:02x}:{link & 0xff:02x}:{side:02x}"


VM_ROLE_ORDER = ("spine", "superspine", "leaf")    # the switches' VMs (and addresses) in this order


def fabric_links(fabric: Fabric) -> list[tuple[str, str, str, str, int]]:
    """Every point-to-point link as (a, a's ifname, b, b's ifname, Mb/s): the fabric kind's own."""
    return fabric.links()


def plan(fabric: Fabric, mgmt_net: str = "10.77.0.0/24") -> list[VmNode]:
    deployable(fabric)            # the VMs run the rendered units
    net = ipaddress.IPv4Network(mgmt_net)
    hosts = list(fabric.machines)          # a GPU server of several NICs is one VM
    order = [(n.name, n.role) for role in VM_ROLE_ORDER for n in fabric.switches if n.role == role]
    order += [(h, "host") for h in hosts] + [(MONITOR, "monitor")]
    if len(order) + 10 > net.num_addresses - 2:
        raise FabricError(f"management network {mgmt_net} too small for {len(order)} VMs")
    nodes = {name: VmNode(name, role, str(net.network_address + 10 + i),
                          MEMORY_MIB.get(role, DEFAULT_MEMORY_MIB))
             for i, (name, role) in enumerate(order)}
    used: set[str] = set()
    for i, (a, a_if, b, b_if, mbps) in enumerate(fabric_links(fabric), start=1):
        link = f"rlb-{a}-{b}" + (a_if[len(f"eth-{b}"):] if a_if.startswith(f"eth-{b}-") else "")
        if link in used:                   # a server's second NIC on the same leaf
            link += f"-{sum(1 for u in used if u.startswith(link))}"
        used.add(link)
        pa, pb = TUNNEL_BASE_PORT + 2 * i, TUNNEL_BASE_PORT + 2 * i + 1
        nodes[a].links.append(LinkEnd(link, a_if, b, b_if, _mac(i, 1), pa, pb, mbps))
        nodes[b].links.append(LinkEnd(link, b_if, a, a_if, _mac(i, 2), pb, pa, mbps))
    return list(nodes.values())


def node(vms: list[VmNode], name: str) -> VmNode:
    for vm in vms:
        if vm.name == name:
            return vm
    raise FabricError(f"no VM {name!r} in the lab (have {', '.join(v.name for v in vms)})")


def main(
    fabric: Path = typer.Option(..., help="Fabric description (TOML)."),
    mgmt_net: str = typer.Option("10.77.0.0/24", help="IPv4 network for the lab's management NICs."),
):
    """The Vagrant lab's VMs from a fabric file, as JSON (what the Vagrantfile reads).

    Example: python -m rlblab.vm.plan --fabric lab/fabric-2x2.toml"""
    try:
        vms = plan(load(fabric), mgmt_net)
    except (FabricError, OSError, ValueError) as e:
        typer.echo(f"rlblab.vm.plan: error: {e}", err=True)
        raise typer.Exit(2)
    typer.echo(json.dumps({"fabric": str(fabric), "monitor": MONITOR, "nodes": [{**asdict(v), "serial_log": v.serial_log} for v in vms]}, indent=2))


if __name__ == "__main__":
    typer.run(main)
