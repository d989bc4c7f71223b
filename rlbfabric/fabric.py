"""The fabric description: one TOML file describes the whole fabric (roles, ASes, links, hosts,
address plan); bird configs, agents and labs are all derived from it.

    [fabric]
    paths = 4                 # prefixes (colours) per host port = spines
    prefix = "fc00"           # host port prefix: <prefix>:<leaf>:<port>:<path>::/64
    policy = "dpf"            # dpf | fare | ecmp | dlb (per-prefix overrides in [policy])
    link_mbps = 10000         # default link bandwidth (veths report none)
    bfd = true
    bfd_ms = 50               # BFD interval (detection: 3 intervals)
    pathbw_subtype = 0x88     # FARE path bandwidth ext community sub-type (the draft says TBD)

    [[spine]]                 # colour k = k-th spine
    name = "s1"
    asn = 65000

    [[leaf]]
    name = "l1"
    asn = 65001
    hosts = ["h1", "h2"]      # host ports eth-h1 ... on the leaf, eth0 on the host

    parallel = 1              # links between each leaf and spine (ports eth-<peer>-<n> if > 1);
                              # colour k rides link ((k-1) mod parallel)+1 of spine ceil(k/parallel)

    [[link]]                  # optional: a slower leaf-spine link
    between = ["l1", "s2"]
    mbps = 5000

    [[stripe]]                # GPU servers with one NIC per rail (rlbfabric/servers.py): server
    leaves = ["l1", "l2"]     # i's NIC gpu<r>_eth on leaves[r]; each NIC a host of its own
    servers = ["a1", "a2"]    # (a1-gpu0_eth, ...), each server one agent; or [[server]] with
                              # nics = { gpu0_eth = "l1", gpu1_eth = "l2" }

5-stage: give leaves and spines a `pod` (default 1) and add super-spines with a `plane`; the k-th
spine of every pod (its plane) connects to every super-spine of plane k. Spines of one pod share
an AS, each pod its own, so routes can cross pods.

    [[superspine]]
    name = "ss1"
    asn = 65100
    plane = 1

Interfaces: a node's port towards node X is eth-X.

`kind = "scaleup"` in [fabric] describes a multi-plane scale-up fabric instead (rlbfabric/kinds/scaleup.py),
`kind = "rail-only"` domains and rails without a spine (rlbfabric/kinds/railonly.py)."""
from __future__ import annotations

import tomllib
from pathlib import Path

from . import kinds, schema  # noqa: F401 - kinds: each module in it registers its kind in base.KINDS
from .base import KINDS, Fabric, FabricError
from .kinds.clos import ClosFabric

DEFAULT_KIND = ClosFabric.kind     # a fabric file without [fabric] kind

__all__ = ["Fabric", "FabricError", "ClosFabric", "load", "parse"]


def load(path: str | Path) -> Fabric:
    try:
        text = Path(path).read_text()
        data = tomllib.loads(text)
    except FileNotFoundError:
        raise FabricError(f"fabric file {path} not found") from None
    except (OSError, UnicodeDecodeError) as e:
        raise FabricError(f"fabric file {path}: {e}") from None
    except tomllib.TOMLDecodeError as e:
        raise FabricError(f"{path}: {e}") from None
    return parse(data, str(path), text)


def parse(data: dict, where: str = "fabric", text: str | None = None) -> Fabric:
    """The fabric `data` describes (`text`: its file's source, for line numbers in errors)."""
    f = data.get("fabric", {})
    kind = f.get("kind", DEFAULT_KIND) if isinstance(f, dict) else DEFAULT_KIND
    if not isinstance(kind, str) or kind not in KINDS:
        raise FabricError(f"{where}: kind {kind!r}: {DEFAULT_KIND} (leaf-spine, the default), "
                          f"{', '.join(k for k in sorted(KINDS) if k != DEFAULT_KIND)}")
    if kind == ClosFabric.kind:
        schema.check(data, where, text)
    return KINDS[kind](data, where)


def uniform_clos(leaves: int, hosts: int, spines: int) -> Fabric:
    """A leaf-spine fabric of equal parts (l1.., h1.., s1..; one path a spine) for models,
    benches and tests: what a site's file would say with every link alike."""
    h = iter(range(1, leaves * hosts + 1))
    return parse({
        "fabric": {"paths": spines},
        "spine": [{"name": f"s{k}", "asn": 65000} for k in range(1, spines + 1)],
        "leaf": [{"name": f"l{i}", "asn": 65100 + i, "hosts": [f"h{next(h)}" for _ in range(hosts)]}
                 for i in range(1, leaves + 1)],
    }, "model")
