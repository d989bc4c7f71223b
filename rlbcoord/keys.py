"""Where the coordinator's shared state lives in etcd, and who may write what (issue 31).

One tree per fabric, under ROOT:

    hosts/<host>/...          a host's own reports (its paths, weights, QPs): that host writes
    switches/<switch>/...     a switch's own reports (a leaf's uplinks): that switch writes
    placements/<host>/partN   the coordinator's placements for one host: that host reads
    links/<leaf>              the coordinator's loads per leaf link: every host reads
    coordinator/...           the coordinators' election and state: coordinators only

Each host and switch is an etcd user of its own whose role may write only its own subtree and
read its placements, so a report forged in another's name is refused by etcd itself; only the
coordinator's user writes placements. Kubernetes gives each kubelet the same shape (a node may
write only its own Node and Lease objects, the NodeRestriction admission)."""
from __future__ import annotations

import json
import zlib
from dataclasses import dataclass

from rlbcommon.etcd import prefix_end
from rlbfabric.base import Fabric

ROOT = "/rlb/"
COORDINATOR_USER = "rlb-coordinator"
READ, READWRITE = "READ", "READWRITE"


def host_prefix(host: str) -> str:
    return f"{ROOT}hosts/{host}/"


def switch_prefix(switch: str) -> str:
    return f"{ROOT}switches/{switch}/"


def placements_prefix(host: str) -> str:
    return f"{ROOT}placements/{host}/"


def coordinator_prefix() -> str:
    return f"{ROOT}coordinator/"


def leader_key(shard: int = 1, of: int = 1) -> str:
    """The election's key: one for the whole fabric, or one per shard of placement
    (shards.py) named with how many there are, so coordinators started with different counts
    do not share a key and each can see the others'."""
    return coordinator_prefix() + ("leader" if of == 1 else f"leader/{shard}-of-{of}")


def parse_leader_key(key: str) -> tuple[int, int] | None:
    """(shard, of) of an election key (1, 1: the whole fabric's); None for any other key."""
    if key == leader_key():
        return 1, 1
    rest = key.removeprefix(coordinator_prefix() + "leader/")
    if rest == key:
        return None
    try:
        shard, of = (int(x) for x in rest.split("-of-"))
    except ValueError:
        return None
    return shard, of


def shard_loads_key(shard: int) -> str:
    """A shard's leader publishes its QPs' loads per link here (under its lease): the room the
    other shards place theirs in (etcdrun.py)."""
    return coordinator_prefix() + f"shards/{shard}"


def parse_shard_loads_key(key: str) -> int | None:
    rest = key.removeprefix(coordinator_prefix() + "shards/")
    return int(rest) if rest != key and rest.isdigit() else None


# ---- what lives under each prefix ------------------------------------------------------
# A host writes its report (paths, weights, verbs peers: changes rarely) and its QPs (written
# when one appears or changes path or activity, dropped when it is forgotten: the bytes it
# carries are not state), all under its lease; the coordinator writes a host's placements. A QP
# is named by (peer address, UDP source port, QP number) as in the data plane.
QpId = tuple[str, int, int]


def report_key(host: str) -> str:
    return host_prefix(host) + "report"


def qps_prefix(host: str) -> str:
    return host_prefix(host) + "qps/"


def qp_name(q: QpId) -> str:
    return f"{q[0]}_{q[1]}_{q[2]}"


def parse_qp_name(name: str) -> QpId:
    """ValueError for a name that is not one."""
    peer, sport, qp = name.rsplit("_", 2)
    return peer, int(sport), int(qp)


def qp_key(host: str, q: QpId) -> str:
    """An older host's key for one QP (one key per QP), still read: read_qps."""
    return qps_prefix(host) + qp_name(q)


# A host's QPs are a few keys, not one per QP: qps/partN = {QP name: {"path", "active", ...}},
# each QP in the part its name hashes to, HOST_PART_QPS or fewer a part on average. A job
# starting on every GPU of 4k hosts (128 QPs each) is then 4k transactions of 3 keys (the
# report and 2 parts), not 512k keys: etcd's cost is per key and per transaction (512 hosts
# writing their report and 8 QPs cost this machine's etcd 0.31 s of CPU as 2 keys a host, 0.46 s
# as 9: docs/results.md), and the coordinator's watch brings one event per part. A change
# rewrites the one part its QP is in (a few kB). Parts are a power of two that doubles when the
# QPs outgrow them and halves below a quarter, so a host near a boundary does not rewrite
# everything at each QP.
HOST_PART_QPS = 64


def host_part_count(n_qps: int, have: int = 1) -> int:
    """How many parts `n_qps` QPs take, for a host that has `have` now."""
    n = 1 << max(0, have - 1).bit_length()           # a power of two
    while n * HOST_PART_QPS < n_qps:
        n *= 2
    while n > 1 and n_qps <= n * HOST_PART_QPS // 4:
        n //= 2
    return n


def qp_parts(qps: dict[QpId, dict], n: int) -> dict[str, str]:
    """A host's QPs in `n` parts: the keys' names below qps_prefix and their values (canonical
    text: equal QPs give equal values, so a writer compares text)."""
    return _parts(qps, n)


def _parts(values: dict[QpId, object], n: int) -> dict[str, str]:
    """QPs' values in n keys, each QP in the one its name hashes to: {"partK": canonical text}."""
    parts: dict[str, dict] = {}
    for q, v in values.items():
        name = qp_name(q)
        parts.setdefault(f"part{zlib.crc32(name.encode()) % n}", {})[name] = v
    return {k: json.dumps(v, sort_keys=True, separators=(",", ":")) for k, v in parts.items()}


def qp_part_key(host: str, part: str) -> str:
    return qps_prefix(host) + part


def read_qps(name: str, value: bytes) -> dict[QpId, dict]:
    """One key below qps_prefix: a part ({QP name: QP}) or an older host's key for one QP (named
    for it, holding the QP). ValueError for anything else."""
    v = json.loads(value)
    if not isinstance(v, dict):
        raise ValueError(f"not a JSON object: {value[:60]!r}")
    if not name.startswith("part"):
        return {parse_qp_name(name): v}
    out = {}
    for n, q in v.items():
        if not isinstance(q, dict):
            raise ValueError(f"{n}: {q!r} is not a QP")
        out[parse_qp_name(n)] = q
    return out


# The coordinator writes a host's placements as one JSON object {QP name: path value} per key: a
# collective's hosts cost etcd one write each, not one per QP (512 hosts x 8 QPs: 38 ms of etcd
# here against 250 ms as 4096 keys, and a host's watch gets one event). A host with more than
# PART_QPS QPs gets ceil(QPs / PART_QPS) keys, each QP in the one its name hashes to, so a value
# stays far below etcd's 1.5 MiB request limit and a change rewrites one part.
PART_QPS = 1024


def placement_parts(placed: dict[QpId, int]) -> dict[str, str]:
    """A host's placements as its placement keys' names and values (none: no key at all). The
    text is canonical: equal placements give equal values, so a writer compares text."""
    return _parts(placed, -(-len(placed) // PART_QPS))


def placement_key(host: str, part: str) -> str:
    return placements_prefix(host) + part


def read_placements(name: str, value: bytes) -> dict[QpId, int]:
    """One placement key's QPs (`name`: the key below placements_prefix). A key named for a QP
    holding its path is an older coordinator's (one key per QP): read alike, so hosts follow
    either during a rolling upgrade. ValueError for anything else."""
    v = json.loads(value)
    if isinstance(v, int) and not isinstance(v, bool):
        return {parse_qp_name(name): v}
    if not isinstance(v, dict):
        raise ValueError(f"not a JSON object: {value[:60]!r}")
    out = {}
    for n, path in v.items():
        if not isinstance(path, int) or isinstance(path, bool):
            raise ValueError(f"{n}: path {path!r} is not a number")
        out[parse_qp_name(n)] = path
    return out


def uplinks_key(switch: str) -> str:
    return switch_prefix(switch) + "uplinks"


def hosts_root() -> str:
    return f"{ROOT}hosts/"


def switches_root() -> str:
    return f"{ROOT}switches/"


def placements_root() -> str:
    return f"{ROOT}placements/"


def links_prefix() -> str:
    """links/<leaf>: the coordinator's QPs placed per uplink and downlink of a leaf, with their
    capacity: what a host's verbs library places a new QP by (every host reads them all)."""
    return f"{ROOT}links/"


def split(key: str) -> tuple[str, str, str]:
    """/rlb/<tree>/<node>/<rest> -> (tree, node, rest); ValueError for a key outside."""
    if not key.startswith(ROOT):
        raise ValueError(key)
    tree, node, rest = key[len(ROOT):].split("/", 2)
    return tree, node, rest


def host_user(host: str) -> str:
    return f"rlb-host-{host}"


def switch_user(switch: str) -> str:
    return f"rlb-switch-{switch}"


# what a coordinator HTTP report is about (POST /v1/<tree>/<name>/...) -> whose it is
REPORTERS = {"hosts": lambda fabric, name: host_user(fabric.machine_of(name)),
             "gpus": lambda fabric, name: host_user(fabric.machine_of(name)),
             "switches": lambda fabric, name: switch_user(name)}


def reporter(fabric: Fabric, tree: str, name: str) -> str | None:
    """The identity (certificate unit, etcd user) a report about `name` must come from; None for
    a path that is no report."""
    rule = REPORTERS.get(tree)
    return rule(fabric, name) if rule else None


@dataclass(frozen=True)
class Grant:
    prefix: str
    perm: str

    @property
    def range_end(self) -> bytes:
        return prefix_end(self.prefix)


@dataclass(frozen=True)
class Identity:
    """One etcd user, its role (named as the user) and what the role may touch."""
    user: str
    grants: tuple[Grant, ...]


def identities(fabric: Fabric) -> list[Identity]:
    """Every machine of the fabric that reports, and the coordinator. A server with several NICs
    is one user that writes for each of its NICs (each a host of the fabric) and nobody else."""
    out = [Identity(host_user(m), tuple(g for h in fabric.endpoints(m)
                                        for g in (Grant(host_prefix(h), READWRITE), Grant(placements_prefix(h), READ)))
                    + (Grant(links_prefix(), READ),))
           for m in fabric.machines]
    out += [Identity(switch_user(s.name), (Grant(switch_prefix(s.name), READWRITE),)) for s in fabric.switches]
    out.append(Identity(COORDINATOR_USER, (Grant(ROOT, READWRITE),)))
    return out
