"""FRR's configuration for a spine of an RLB fabric (`daemon = "frr"` in the fabric file), with
what such a spine needs to work beside ours (docs/operations.md §FRR):

- unnumbered peering the standard way: `neighbor IF interface remote-as N`, each leaf's link-local
  address learnt from its router advertisements (our switches send them: FABRIC_RA);
- the fabric's TCP MD5 password, GTSM (`ttl-security hops 1`: only a directly attached peer)
  and the fabric's fast timers (hold `bgp_hold_s`, 3 s by default; 1 s connect retry), BFD when the fabric has it;
- each leaf's session imports only that leaf's hosts' /64s, at most as many as it has
  (`maximum-prefix ... restart`: a leaf gone wrong loses its session, not the fabric);
- extended communities passed on (FRR sends them to eBGP peers by default): the colour, which
  our leaves pin by when AIGP is missing (FRR before 8.5 drops AIGP), and the FARE path
  bandwidth, which FRR passes unchanged (it does not lower it to its own link's speed);
- multipath across leaves with different AS paths (a host prefix homed on two leaves).

FRR forwards with the kernel; nothing of RLB runs on it."""
from __future__ import annotations

import ipaddress
from pathlib import Path

from ..base import Node
from ..bird.conf import announced, spine_router_id

CONNECT_S = 1


def _prefix_list(name: str, pats: list[str]) -> list[str]:
    """bird's `prefix{64,64}` patterns as an FRR prefix list."""
    out = []
    for seq, pat in enumerate(pats, start=1):
        net, _, lens = pat.partition("{")
        lo, hi = (int(x) for x in lens.rstrip("}").split(","))
        n = ipaddress.IPv6Network(net)
        ge = f" ge {lo}" if lo > n.prefixlen else ""
        le = f" le {hi}" if hi > n.prefixlen else ""
        out.append(f"ipv6 prefix-list {name} seq {seq * 5} permit {n}{ge}{le}")
    return out


def render_spine(fabric, spine: Node, log: Path) -> str:
    """frr.conf for `spine` (its leaves below; a 5-stage spine's super-spines are not done),
    logging to `log`."""
    if fabric.uplinks(spine):
        raise ValueError(f"{spine.name}: an FRR spine with super-spines above is not supported (3-stage only)")
    secret = fabric.bgp.secret()          # checked there: printable, no quote, at most 80 bytes
    lines = ["! rendered by rlbfabric frr-config for " + spine.name + ": edit the fabric file, not this",
             "frr defaults datacenter", f"hostname {spine.name}",
             f"log file {log} informational", "!"]
    ports = fabric.ports_down(spine)
    for p in ports:
        # bgpd turns RAs on for an interface neighbour itself; the interval as our switches send
        lines += [f"interface {p.ifname}", " ipv6 nd ra-interval 3", " no ipv6 nd suppress-ra", "!"]
    lines += [f"router bgp {spine.asn}", f" bgp router-id {spine_router_id(spine)}",
              " no bgp ebgp-requires-policy", " no bgp default ipv4-unicast",
              " bgp bestpath as-path multipath-relax", f" timers bgp {fabric.bgp.keepalive_s} {fabric.bgp.hold_s}",
              f" bgp graceful-restart restart-time {fabric.graceful_restart_s}"]
    for p in ports:
        n = p.ifname
        lines += [f" neighbor {n} interface remote-as {p.peer.asn}", f" neighbor {n} timers connect {CONNECT_S}"]
        if fabric.bgp.ttl_security:
            lines.append(f" neighbor {n} ttl-security hops 1")
        if secret:
            lines.append(f" neighbor {n} password {secret}")
        if fabric.bfd:
            lines.append(f" neighbor {n} bfd profile rlb")
    lines += [" !", " address-family ipv6 unicast", "  maximum-paths 64"]
    lists = []
    for p in ports:
        pats, count = announced(fabric, p.peer)
        name = f"from-{p.peer.name}"
        lists += _prefix_list(name, pats) or [f"ipv6 prefix-list {name} seq 5 deny any"]
        lines += [f"  neighbor {p.ifname} activate", f"  neighbor {p.ifname} prefix-list {name} in",
                  f"  neighbor {p.ifname} maximum-prefix {max(1, count)} restart 1"]
    lines += [" exit-address-family", "exit", "!", *lists, "!"]
    if fabric.bfd:                 # the fabric's BFD timers (bfdd's default is 300 ms)
        lines += ["bfd", " profile rlb", f"  receive-interval {fabric.bfd_ms}",
                  f"  transmit-interval {fabric.bfd_ms}", "  detect-multiplier 3", " exit", "exit", "!"]
    return "\n".join(lines) + "\n"
