"""The kernel's IPv6 neighbour table, sized for the switch it serves.

Linux keeps one neighbour table for the machine (every namespace's entries count towards
gc_thresh3) and defaults it to 1024 entries, forced collection from 512. A leaf resolves its hosts'
addresses (each host port: one per path, and its link-local) and its fabric neighbours; past
gc_thresh3 new entries are refused ("neighbour table overflow") and a new host, or one whose entry
expired, cannot be reached. The agent raises the limits to what the data plane can hold
(RLB_MAX_NEIGHBORS) and keeps every legitimate entry out of forced collection (gc_thresh1 above
the ports' worth of addresses); made-up addresses are kept from filling it by the policer's
new-neighbour bucket (bpf/rlb_switch.c neigh_miss). Limits are only raised, never lowered: an
operator's larger setting stands."""
from __future__ import annotations

import logging
from pathlib import Path

log = logging.getLogger(__name__)

SYSCTL = Path("/proc/sys/net/ipv6/neigh/default")
ADDRESSES_PER_PORT = 32          # a host port's addresses (16 paths at most, link-local, a spare)


def wanted(ports: int, capacity: int) -> dict[str, int]:
    """gc_thresh1..3 for a switch with `ports` ports and a data plane of `capacity` neighbours."""
    t3 = capacity
    t2 = capacity * 3 // 4
    return {"gc_thresh1": min(t2, max(128, ports * ADDRESSES_PER_PORT)), "gc_thresh2": t2, "gc_thresh3": t3}


def size_for(ports: int, capacity: int, root: Path = SYSCTL) -> dict[str, int]:
    """Raise the limits where they are below what is wanted; returns what was changed."""
    changed = {}
    if not root.exists():            # not the host's namespace: the limits are the machine's
        log.info("the neighbour table's limits are the machine's: set them from the host's "
                 "namespace (%s: gc_thresh1-3 %s)", root, "/".join(map(str, wanted(ports, capacity).values())))
        return changed
    for name, value in wanted(ports, capacity).items():
        path = root / name
        try:
            have = int(path.read_text())
            if have < value:
                path.write_text(f"{value}\n")
                changed[name] = value
        except (OSError, ValueError) as e:
            log.warning("cannot size the neighbour table (%s): %s", path, e)
    if changed:
        log.info("neighbour table sized for %d ports: %s", ports,
                 ", ".join(f"{k} {v}" for k, v in changed.items()))
    return changed
