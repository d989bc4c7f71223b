"""Will a job's QPs be placed on this node? `rlbhost verbs check` answers from what decides it: the
RDMA ports' GID tables (which GID a job takes, and whether it is one the agent places), the agent
(running, serving which NICs, with which paths) and the job's environment (the library loaded,
NCCL's GID selection settings, QPs per connection).

NCCL picks a GID per device by NCCL_IB_GID_INDEX when set, else the RoCE v2 GID of family
NCCL_IB_ADDR_FAMILY (AF_INET unless set) within NCCL_IB_ADDR_RANGE. On a NIC that has an IPv4
address too it then picks an IPv4-mapped GID, which the fabric's IPv6 paths cannot carry: the
library leaves such QPs alone (counted as `ipv4`). The specification's rule is QPs = addresses =
uplinks: NCCL_IB_QPS_PER_CONNECTION equal to the paths (a multiple of them) gives every path its
share of each connection."""
from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field

from ..gids import GidTable, is_roce_v2

OK, WARN, FAIL = "ok", "warn", "fail"


@dataclass
class Finding:
    level: str                     # ok, warn, fail
    what: str
    fix: str = ""


@dataclass
class PortCheck:
    device: str
    port: int
    netdev: str
    gid_index: int | None = None   # the one the job would take
    gid: str = ""
    findings: list[Finding] = field(default_factory=list)

    @property
    def placed(self) -> bool:
        return not any(f.level == FAIL for f in self.findings)


@dataclass
class NicPaths:
    """A fabric NIC as the agent keeps it: its valid paths {path value: address}."""
    name: str
    paths: dict[int, str]


def _v4mapped(addr: str) -> bool:
    return ipaddress.IPv6Address(addr).ipv4_mapped is not None


def _fabric_candidate(addr: str) -> bool:
    a = ipaddress.IPv6Address(addr)
    return a.ipv4_mapped is None and not (a.is_link_local or a.is_multicast or a.is_unspecified)


def nccl_gid(entries: dict[int, tuple[str, str, str]], env: dict[str, str]) -> tuple[int | None, str]:
    """The GID index NCCL would take on a port ({index: (address, type, netdev)}), and how: as
    its net_ib transport walks the table (from index 0, a candidate of the wanted family replaces
    one of the other family; among the wanted family's configured, not link-local GIDs within the
    range, one of the wanted RoCE version replaces one of another version or a link-local one)."""
    if env.get("NCCL_IB_GID_INDEX", "").lstrip("-").isdigit() and int(env["NCCL_IB_GID_INDEX"]) >= 0:
        return int(env["NCCL_IB_GID_INDEX"]), "NCCL_IB_GID_INDEX"
    family = env.get("NCCL_IB_ADDR_FAMILY", "AF_INET")
    version = 1 if env.get("NCCL_IB_ROCE_VERSION_NUM", "2") == "1" else 2
    net = None
    if env.get("NCCL_IB_ADDR_RANGE"):
        try:
            net = ipaddress.ip_network(env["NCCL_IB_ADDR_RANGE"].split(",")[0].strip(), strict=False)
        except ValueError:
            net = None

    def fam(addr: str) -> str:
        return "AF_INET" if _v4mapped(addr) else "AF_INET6"

    def in_range(addr: str) -> bool:
        a = ipaddress.IPv6Address(addr)
        ip = a.ipv4_mapped or a
        return net is None or (ip.version == net.version and ip in net)

    def valid(addr: str) -> bool:
        a = ipaddress.IPv6Address(addr)
        return not a.is_unspecified and not a.is_link_local

    def ver(gtype: str) -> int:
        return 2 if is_roce_v2(gtype) else 1
    how = f"NCCL's choice ({family}, RoCE v{version}" + (f", range {net}" if net else "") + ")"
    if 0 not in entries:
        return None, how
    cur = 0
    for idx in sorted(i for i in entries if i > 0):
        addr, gtype, _ = entries[idx]
        caddr, ctype, _ = entries[cur]
        if fam(addr) != fam(caddr) and fam(addr) == family and in_range(addr):
            cur = idx
        elif fam(addr) == family and valid(addr) and in_range(addr) and \
                (ver(ctype) != ver(gtype) or not valid(caddr)) and ver(gtype) == version:
            cur = idx
    return cur, how


def check(env: dict[str, str], nics: list[NicPaths], agent: dict, socket: str,
          gids: GidTable | None = None) -> tuple[list[Finding], list[PortCheck]]:
    """What the node and the job's environment say: findings for the job, and per RDMA port.
    `agent`: the verbs service's status (empty if none ran), `socket` where it answers."""
    gids = gids or GidTable()
    gids.refresh()
    job: list[Finding] = []
    preload = env.get("LD_PRELOAD", "") + " " + env.get("NCCL_IBVERBS_LIB", "")
    if "librlbverbs" not in preload:
        job.append(Finding(FAIL, "the job does not load the library (neither LD_PRELOAD nor NCCL_IBVERBS_LIB "
                           "names librlbverbs)", "add `rlbhost verbs env` to the job's environment"))
    else:
        job.append(Finding(OK, "the job loads the library"))
    if env.get("RLB_VERBS", "").lower() in ("0", "off", "no"):
        job.append(Finding(FAIL, f"RLB_VERBS={env['RLB_VERBS']} turns the library off", "unset RLB_VERBS"))
    want_socket = env.get("RLB_VERBS_SOCKET") or "/run/rlb/verbs.sock"
    if want_socket != socket:
        job.append(Finding(FAIL, f"the library asks at {want_socket}; this agent answers at {socket}",
                           f"RLB_VERBS_SOCKET={socket}"))
    if not agent:
        job.append(Finding(FAIL, "no agent serves the library here", "rlbhost attach (without --no-verbs)"))
    elif agent.get("age_s", 0) > 5:
        job.append(Finding(FAIL, f"the agent's verbs service last wrote its status {agent['age_s']:.0f} s ago: "
                           "it is not running", "systemctl restart rlb-host"))
    else:
        job.append(Finding(OK, f"the agent answers at {socket} for NICs {', '.join(n.name for n in nics) or 'none'}"))
    paths = {len(n.paths) for n in nics if n.paths}
    qpc = env.get("NCCL_IB_QPS_PER_CONNECTION", "1")
    if paths:
        k = max(paths)
        if not qpc.isdigit() or int(qpc) % k:
            job.append(Finding(WARN, f"NCCL_IB_QPS_PER_CONNECTION={qpc}: each connection's QPs cannot cover the "
                               f"{k} paths (QPs = addresses = uplinks)", f"NCCL_IB_QPS_PER_CONNECTION={k}"))
        else:
            job.append(Finding(OK, f"NCCL_IB_QPS_PER_CONNECTION={qpc}: a multiple of the {k} paths"))
    hca = [h.split(":")[0].lstrip("=^") for h in env.get("NCCL_IB_HCA", "").split(",") if h.strip()]
    by_nic = {n.name: n for n in nics}
    ports: list[PortCheck] = []
    for (dev, port), entries in sorted(gids.table.items()):
        netdev = next((nd for _, _, nd in entries.values() if nd), "")
        pc = PortCheck(dev, port, netdev)
        ports.append(pc)
        if hca and not env.get("NCCL_IB_HCA", "").startswith("^") and dev not in hca:
            pc.findings.append(Finding(WARN, f"not in NCCL_IB_HCA: NCCL does not use {dev}"))
            continue
        nic = by_nic.get(netdev)
        if nic is None:
            pc.findings.append(Finding(FAIL, f"{dev}/{port} is on {netdev or 'no netdev'}, not a fabric NIC the agent "
                                       "serves (kept: othernic)", "attach the agent to every fabric NIC"))
            continue
        if not nic.paths:
            pc.findings.append(Finding(FAIL, f"{netdev} has no paths (no fabric addresses: SLAAC from its leaf?)",
                                       "rlbhost status; check the leaf's RAs"))
            continue
        missing = [k for k, a in sorted(nic.paths.items()) if gids.index_of(dev, port, a) is None]
        if missing:
            pc.findings.append(Finding(WARN, f"paths {missing} have no RoCE v2 GID on {dev}/{port}: no QP goes there",
                                       "the GID table follows the addresses: check ibv_devinfo -v"))
        idx, how = nccl_gid(entries, env)
        if idx is None or idx not in entries:
            family = env.get("NCCL_IB_ADDR_FAMILY", "AF_INET")
            pc.findings.append(Finding(FAIL if family != "AF_INET" else WARN,
                                       f"{how}: no GID of {dev}/{port} matches", "NCCL_IB_ADDR_FAMILY=AF_INET6"))
            continue
        addr, gtype, _ = entries[idx]
        pc.gid_index, pc.gid = idx, addr
        fabric = set(nic.paths.values())
        if ipaddress.IPv6Address(addr).is_link_local:
            pc.findings.append(Finding(FAIL, f"{how} takes GID {idx} ({addr}), link-local: not routed across the "
                                       "fabric (kept: linklocal)", "NCCL_IB_ADDR_FAMILY=AF_INET6"))
        elif _v4mapped(addr):
            pc.findings.append(Finding(FAIL, f"{how} takes GID {idx} ({addr}), IPv4: the fabric's paths are IPv6 "
                                       "(kept: ipv4)", "NCCL_IB_ADDR_FAMILY=AF_INET6"))
        elif not is_roce_v2(gtype):
            pc.findings.append(Finding(FAIL, f"{how} takes GID {idx} ({addr}), {gtype}: not RoCE v2 (kept: notrocev2)",
                                       "a RoCE v2 GID index (rlbhost paths)"))
        elif addr not in fabric:
            pc.findings.append(Finding(FAIL, f"{how} takes GID {idx} ({addr}), not a fabric address of {netdev} "
                                       "(kept: notfabric)", "NCCL_IB_ADDR_RANGE=<the fabric prefix>, or "
                                       "NCCL_IB_GID_INDEX of a fabric GID (rlbhost paths)"))
        else:
            k = next(k for k, a in nic.paths.items() if a == addr)
            pc.findings.append(Finding(OK, f"{how} takes GID {idx} ({addr}, path {k} of {netdev}): placed on "
                                       f"{netdev}'s {len(nic.paths)} paths"))
            others = [a for a, t, _ in entries.values() if is_roce_v2(t) and _fabric_candidate(a) and a not in fabric]
            if others and how.startswith("NCCL's choice") and "RANGE" not in how:
                pc.findings.append(Finding(WARN, f"{dev}/{port} also has IPv6 GIDs outside the fabric ({others[0]}...): "
                                           "NCCL may take one", "NCCL_IB_ADDR_RANGE=<the fabric prefix>"))
    return job, ports
