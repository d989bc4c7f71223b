"""The fabric coordinator: host agents report their QPs, leaf agents their uplinks; it keeps one
placement of every QP that balances every leaf uplink and spine downlink (qpplacer, placement) and
answers each host with where its QPs should go. Hosts apply that to new and idle QPs only, and
decide alone whenever it is unreachable, so the coordinator is never on the data path.

A host that stops reporting for host_timeout_s is forgotten (its QPs leave the placement)."""
from __future__ import annotations

import ipaddress
import json
import logging
import math
import ssl
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from socket import AF_INET6
from typing import Callable

from rlbcommon import coordapi
from rlbcommon import tls as tlsmod
from rlbcommon.ipv6 import ipv6_int
from rlbfabric import balance
from rlbfabric.kinds.clos import ClosFabric
from rlbfabric.policy.placement import DOWN, UP
from rlbfabric.policy.qpplacer import QpInfo, QpPlacer

from . import httpguard, keys

log = logging.getLogger(__name__)
PEER_CACHE = 1 << 17        # peer addresses remembered (a fabric's hosts x paths, with room)
# The QPs of one host the model takes at most: a report, or a change of a host's keys in etcd,
# that would leave it more is refused and the host's earlier state kept (its QPs go by its
# local rule). A role in etcd bounds whose keys a host writes, not how many: a broken or
# hostile agent must not grow the model without end. 8 GPUs with 8192 QPs each fit.
HOST_QPS_MAX = 1 << 16


class Refused(Exception):
    """A well-formed report from somebody the fabric file does not know (HTTP 403)."""


class BadRequest(Exception):
    """A report that cannot be read (HTTP 400)."""


def _int(v, name, field: str, lo: int, hi: int) -> int:
    """`name`.`field` as a whole number lo-hi, or BadRequest (the name is spelt out only then:
    a collective's reports read tens of thousands of fields)."""
    if type(v) is not int or not lo <= v <= hi:
        raise BadRequest(f"{_label(name)}{field} must be a whole number {lo}-{hi}, not {v!r}")
    return v


def _label(name) -> str:
    """A QP's name in a refusal, built only then: text as given, an index into a report's list
    (qps[i]) or (peer, sport, qp)."""
    if isinstance(name, str):
        return name
    if isinstance(name, int):
        return f"qps[{name}]"
    return "QP {} {} {}".format(*name)


def _addr(v, name: str) -> ipaddress.IPv6Address:
    """An IPv6 address as text, or BadRequest."""
    try:
        return ipaddress.IPv6Address(ipv6_int(v))
    except ValueError:                         # ipv6_int turns anything not text into one too
        raise BadRequest(f"{name}: {v!r} is not an IPv6 address") from None


class Coordinator:
    def __init__(self, fabric: ClosFabric, host_timeout_s: float = 5.0,
                 clock: Callable[[], float] = time.monotonic):
        self.fabric, self.host_timeout_s, self.clock = fabric, host_timeout_s, clock
        self.host_qps_max = HOST_QPS_MAX            # rlbcoord run --host-qps-max
        self.placer = QpPlacer(fabric)
        self.lock = threading.Lock()
        self.hosts: dict[str, dict] = {}            # host -> {"seen": time, "keys": set}
        self.counters = {"reports": 0, "refused": 0, "bad": 0, "link_reports": 0, "moves": 0,
                         "solves": 0, "solve_seconds": 0.0, "hosts_expired": 0}
        self.last_solve_s = 0.0
        self._paths_ok: dict[str, tuple] = {}       # host -> (its paths as last reported, valid ones)
        self._context: dict[str, tuple] = {}        # host -> (valid paths, weights, {peer: weights}) of its last report
        self._peers: dict[str, tuple] = {}          # peer address text -> (address, host, canonical text)
        self.changed_hosts: set[str] = set()        # whose placements may differ since take_changed()
        leaves = {lf.name: lf for lf in fabric.leaves}
        self.uplink_colour = {name: {p.ifname: p.colour - 1 for p in fabric.ports_up(lf)}
                              for name, lf in leaves.items()}

    def summary(self) -> str:
        f = self.fabric
        return f"coordinating {len(f.hosts)} hosts on {len(f.leaves)} leaves x {f.colours()} uplinks"

    # ---- host reports -----------------------------------------------------------------
    def report(self, host: str, body: dict) -> dict:
        """A host's paths, weights and QPs; returns its placements."""
        try:
            return self._report(host, body)
        except Refused:
            self.counters["refused"] += 1
            raise
        except BadRequest:
            self.counters["bad"] += 1
            raise

    def _report(self, host: str, body: dict) -> dict:
        seen = self._parse(host, body)
        with self.lock:
            self._apply(host, seen)
            self._solve()
            placed = self.placer.placements(host)
            links = self._links_for(host, {info.dst for info in seen.values()} | self._peer_hosts(body))
            self.counters["reports"] += 1
        return {"placements": [{"peer": k[1], "sport": k[2], "qp": k[3], "path": p}
                               for k, p in sorted(placed.items()) if k in seen and not seen[k].fixed],
                "links": links}

    def apply_reports(self, reports: dict[str, dict | None],
                      changes: dict[str, dict[tuple[str, int, int], dict | None]] | None = None) -> dict[str, str]:
        """Many hosts' reports at once (None: the host is gone, its QPs leave), and single QPs of
        hosts already known (`changes`: {host: {(peer, sport, qp): the QP as in a report's
        list, or None: gone}}, each costing its own reading and placement, not its host's whole
        report), then one solve: what the etcd follower feeds in per batch of changes
        (etcdrun.py). Returns the hosts whose report or QP was refused or unreadable, with why;
        their earlier state stays."""
        parsed, bad = {}, {}
        for host, body in reports.items():
            if body is None:
                continue
            try:
                parsed[host] = self._parse(host, body)
            except (Refused, BadRequest) as e:
                self.counters["refused" if isinstance(e, Refused) else "bad"] += 1
                bad[host] = str(e)
        deltas = {}
        for host, qps in (changes or {}).items():
            try:
                deltas[host] = self._parse_changes(host, qps)
            except (Refused, BadRequest) as e:
                self.counters["refused" if isinstance(e, Refused) else "bad"] += 1
                bad[host] = str(e)
        with self.lock:
            for host, body in reports.items():
                if body is None:
                    self._forget(host)
                elif host in parsed:
                    self._apply(host, parsed[host])
                    self.counters["reports"] += 1
            for host, (seen, gone) in deltas.items():
                have = self.hosts[host]["keys"]
                n = len(have) - len(gone & have) + sum(1 for k in seen if k not in have)
                if n > self.host_qps_max:
                    self.counters["bad"] += 1
                    bad[host] = self.too_many(n)
                    continue
                self._apply_changes(host, seen, gone)
            self._solve()
        return bad

    def too_many(self, n: int) -> str:
        return (f"{n} QPs: more than the {self.host_qps_max} a host may have placed (rlbcoord run "
                "--host-qps-max); its earlier state kept")

    def knows(self, host: str) -> bool:
        """Whether single QPs of `host` can be applied (apply_reports' changes): its report read."""
        return host in self.hosts and host in self._context

    def _parse_changes(self, host: str, qps: dict) -> tuple[dict, set]:
        """({QP key: QpInfo} written, {QP key} gone) of single QPs, read in the context (paths,
        weights) of the host's last report."""
        context = self._context[host]
        received = self.clock()
        seen, gone = {}, set()
        for (peer, sport, qpn), q in qps.items():
            if q is None:
                gone.add((host, self._peer(peer, (peer, sport, qpn))[2], sport, qpn))
                continue
            got = self._qp(host, q, (peer, sport, qpn), context, received)
            if got is not None:
                seen[got[0]] = got[1]
        return seen, gone

    def _apply_changes(self, host: str, seen: dict, gone: set):
        """Single QPs of a known host (under the lock)."""
        self.changed_hosts.add(host)
        entry = self.hosts[host]
        entry["seen"] = self.clock()
        for key in gone & entry["keys"]:
            self.placer.remove(key)
        for key, info in seen.items():
            self.placer.update(key, info)
        entry["keys"] = (entry["keys"] - gone) | set(seen)

    def _forget(self, host: str):
        self.changed_hosts.add(host)
        self._paths_ok.pop(host, None)
        self._context.pop(host, None)
        e = self.hosts.pop(host, None)
        if e is not None:
            for key in e["keys"]:
                self.placer.remove(key)
            log.info("%s is gone: its %d QPs leave the placement", host, len(e["keys"]))

    def all_placements(self, hosts: set[str] | None = None) -> dict[str, dict[tuple[str, int, int], int]]:
        """Every host's placements (or those of `hosts`), {host: {(peer, sport, qp): path}}, for
        the QPs it reported and may move (not those placed through verbs)."""
        with self.lock:
            out = {}
            for host in (self.hosts if hosts is None else hosts):   # a batch's hosts, not all
                e = self.hosts.get(host)
                if e is None:
                    continue
                placed = self.placer.placements(host)
                out[host] = {(k[1], k[2], k[3]): p for k, p in placed.items()
                             if k in e["keys"] and not self.placer.qps[k].fixed}
            return out

    def _apply(self, host: str, seen: dict):
        """A host's QPs as it reported them (under the lock)."""
        self.changed_hosts.add(host)
        now = self.clock()
        entry = self.hosts.setdefault(host, {"seen": now, "keys": set()})
        entry["seen"] = now
        for key in entry["keys"] - set(seen):
            self.placer.remove(key)
        for key, info in seen.items():
            self.placer.update(key, info)
        entry["keys"] = set(seen)

    def _parse(self, host: str, body: dict) -> dict:
        """{QP key: QpInfo} of a report, or Refused / BadRequest."""
        if host not in self.placer.leaf_of_host:
            raise Refused(f"host {host!r} is not in the fabric file")
        if not isinstance(body, dict):
            raise BadRequest("a report is a JSON object")
        valid = self._check_paths(host, body.get("paths"))
        tables = self._weights(body.get("weights", []))
        qps = body.get("qps", [])
        if not isinstance(qps, list):
            raise BadRequest("qps must be a list")
        seen: dict[tuple, QpInfo] = {}
        received = self.clock()
        context = (valid, tables, {})
        for i, q in enumerate(qps):
            got = self._qp(host, q, i, context, received)
            if got is not None:
                seen[got[0]] = got[1]
        if len(seen) > self.host_qps_max:              # counted as a change's are: QPs in the fabric
            raise BadRequest(self.too_many(len(seen)))
        self._context[host] = context
        return seen

    def _qp(self, host: str, q, name, context: tuple, received: float):
        """(QP key, QpInfo) of one QP of a report, None for a peer outside the fabric, or
        BadRequest. `context`: the host's valid paths, weight tables and the weights already
        looked up per peer (a collective names the same peers in QP after QP)."""
        if not isinstance(q, dict):
            raise BadRequest(f"{_label(name)} must be an object")
        valid, tables, by_peer = context
        peer, dst, text = self._peer(q.get("peer"), name)
        sport = _int(q.get("sport"), name, ".sport", 0, 65535)
        qpn = _int(q.get("qp"), name, ".qp", 0, (1 << 24) - 1)
        path = q.get("path")
        if path is not None:
            path = _int(path, name, ".path", 1, self.fabric.paths)
        nbytes = _int(q.get("bytes", 0), name, ".bytes", 0, 1 << 63)
        fixed = q.get("fixed", False)
        if not isinstance(fixed, bool) or (fixed and path is None):
            raise BadRequest(f"{_label(name)}.fixed must be true or false, and a fixed QP needs its path")
        active = q.get("active", True)
        if not isinstance(active, bool):
            raise BadRequest(f"{_label(name)}.active must be true or false")
        idle_ms = q.get("idle_ms", 0)
        if isinstance(idle_ms, bool) or not isinstance(idle_ms, (int, float)) or not 0 <= idle_ms <= 1e9:
            raise BadRequest(f"{_label(name)}.idle_ms must be a number of milliseconds, not {idle_ms!r}")
        if dst is None:
            return None                        # a peer outside the fabric: nothing to place
        if fixed:                              # placed through verbs: its path cannot change
            weights = {k: float(k == path) for k in valid}
        else:                                  # shared by the peer's QPs: nobody changes them in place
            weights = by_peer.get(text)
            if weights is None:
                ws = _lookup(tables, peer)
                weights = {k: max(0.0, ws.get(k, 1.0)) for k in valid}
                if len(by_peer) >= PEER_CACHE:
                    by_peer.clear()
                by_peer[text] = weights
        # when it last carried traffic: None while active (verbs QPs: until destroyed)
        last = None if active or fixed else received - idle_ms / 1000
        return (host, text, sport, qpn), QpInfo(host, dst, path, weights, nbytes, fixed, last)

    def _peer(self, v, name) -> tuple[ipaddress.IPv6Address, str | None, str]:
        """A QP's peer address, the host it belongs to (None: outside the fabric) and the
        address's canonical text (the QP's key), remembered by the text given: every report
        names the same few thousand addresses again."""
        got = self._peers.get(v) if isinstance(v, str) else None
        if got is None:
            a = _addr(v, f"{_label(name)}.peer")
            got = (a, self.placer.host_at(a), str(a))
            if len(self._peers) >= PEER_CACHE:        # foreign addresses must not grow it for good
                self._peers.clear()
            self._peers[v] = got
        return got

    def link_table(self) -> dict[str, dict]:
        """Every leaf's uplinks and downlinks: QPs placed (of the newest generation, which a new
        QP joins) and capacity per colour (0: dead), as _links_for gives one host."""
        with self.lock:
            loads = self.placer.fabric_loads()     # other shards' QPs too (shards.py)
            cap = self.placer.cap
            return {lf.name: {"up": {"load": loads[UP][i], "cap": cap[UP][i]},
                              "down": {"load": loads[DOWN][i], "cap": cap[DOWN][i]}}
                    for i, lf in enumerate(self.fabric.leaves)}

    def _peer_hosts(self, body: dict) -> set[str]:
        """Hosts the reporter is about to place QPs towards (its verbs library's recent peers)."""
        peers = body.get("peers", [])
        if not isinstance(peers, list):
            raise BadRequest("peers must be a list of addresses")
        return {h for h in (self.placer.host_at(_addr(p, "peers[]")) for p in peers[:4096]) if h}

    def _links_for(self, host: str, peers: set[str]) -> dict:
        """What a host needs to place a new QP the coordinator's way: its leaf's uplinks and the
        downlinks into its peers' leaves, in QPs placed and capacity per colour (0: dead)."""
        loads = self.placer.fabric_loads()     # a new QP joins the active ones
        cap = self.placer.cap
        mine = self.placer.leaf_of_host[host]
        leaves = {self.placer.leaf_of_host[h] for h in peers} - {mine}
        name = self.fabric.leaves
        return {"leaf": name[mine].name,
                "up": {"load": loads[UP][mine], "cap": cap[UP][mine]},
                "down": {name[b].name: {"load": loads[DOWN][b], "cap": cap[DOWN][b]} for b in sorted(leaves)}}

    def _check_paths(self, host: str, paths) -> set[int]:
        """The path values the host reports, each address inside its prefix for that path (the
        answer kept until the host reports other paths)."""
        if not isinstance(paths, dict) or not paths:
            raise BadRequest("paths must be an object {path value: address}")
        seen = self._paths_ok.get(host)
        if seen is not None and seen[0] == paths:
            return seen[1]
        out = self._valid_paths(host, paths)
        self._paths_ok[host] = (dict(paths), out)
        return out

    def _valid_paths(self, host: str, paths: dict) -> set[int]:
        nets = self.placer.host_nets[host]
        out = set()
        for k, addr in paths.items():
            try:
                k = int(k)
            except ValueError:
                raise BadRequest(f"path {k!r} is not a number") from None
            a = _addr(addr, f"paths[{k}]")
            if not 1 <= k <= len(nets) or a not in nets[k - 1]:
                raise Refused(f"{a} (path {k}) is not an address of {host} in the fabric file "
                              f"(its prefixes: {', '.join(map(str, nets))})")
            out.add(k)
        return out

    @staticmethod
    def _weights(tables) -> list[tuple[ipaddress.IPv6Network, dict[int, float]]]:
        if not isinstance(tables, list):
            raise BadRequest("weights must be a list of {prefix, weights}")
        out = []
        for t in tables:
            try:
                net = ipaddress.IPv6Network(t["prefix"])
                ws = {int(k): float(v) for k, v in t["weights"].items()}
            except (KeyError, TypeError, ValueError, AttributeError) as e:
                raise BadRequest(f"weights entry {t!r}: {e}") from None
            if not all(math.isfinite(v) and v >= 0 for v in ws.values()):
                raise BadRequest(f"weights entry {t!r}: weights must be finite and not negative")
            out.append((net, ws))
        return sorted(out, key=lambda e: -e[0].prefixlen)

    # ---- leaf reports -------------------------------------------------------------------
    def links(self, switch: str, body: dict) -> dict:
        """A leaf's uplinks {ifname: up}: a dead one takes its colour away from that leaf."""
        self.counters["link_reports"] += 1
        ports = self.uplink_colour.get(switch)
        if ports is None:
            self.counters["refused"] += 1
            raise Refused(f"{switch!r} is not a leaf in the fabric file")
        state = body.get("ports") if isinstance(body, dict) else None
        if not isinstance(state, dict):
            self.counters["bad"] += 1
            raise BadRequest("ports must be an object {ifname: true|false}")
        unknown = set(state) - set(ports)
        if unknown:
            self.counters["refused"] += 1
            raise Refused(f"{switch} has no uplinks {sorted(unknown)} (has {sorted(ports)})")
        with self.lock:
            changed = [ifname for ifname, up in state.items()
                       if self.placer.set_link(switch, ports[ifname], bool(up))]
            if changed:
                log.info("%s: %s", switch, ", ".join(f"{i} {'up' if state[i] else 'down'}" for i in changed))
                self._solve()
        return {"changed": changed}

    # ---- keeping it current -------------------------------------------------------------------
    def take_changed(self) -> set[str]:
        """The hosts whose placements may have changed since the last call (those reported,
        forgotten, or with a QP the placement moved): a writer of placements compares only
        theirs, so its work follows the change, not the fabric's size."""
        with self.lock:
            out, self.changed_hosts = self.changed_hosts, set()
        return out

    def set_outside(self, before: list | None, newest: list | None):
        """Other shards' loads (shards.py): the next solve places ours in the room they leave."""
        with self.lock:
            self.placer.set_outside(before, newest)

    def shard_loads(self) -> list:
        """Our QPs' loads per generation, for the other shards."""
        with self.lock:
            return self.placer.tier_loads()

    def _solve(self):
        t = time.perf_counter()
        moved = self.placer.solve(self.clock())
        self.changed_hosts.update(self.placer.qps[k].src for k in self.placer.last_changed if k in self.placer.qps)
        self.last_solve_s = time.perf_counter() - t
        self.counters["solves"] += 1
        self.counters["solve_seconds"] += self.last_solve_s
        self.counters["moves"] += moved

    def _expire(self, now: float):
        for host, e in list(self.hosts.items()):
            if now - e["seen"] > self.host_timeout_s:
                log.info("%s silent for %.1f s", host, now - e["seen"])
                self._forget(host)
                self.counters["hosts_expired"] += 1

    def expire(self):
        with self.lock:
            before = len(self.hosts)
            self._expire(self.clock())
            if len(self.hosts) != before:
                self._solve()

    def status(self) -> dict:
        """What the model holds now. The lock is held only to copy it: the figures (a bound over
        every QP's leaf pair) are computed after, so a scrape never delays a placement."""
        with self.lock:
            now = self.clock()
            loads = self.placer.link_loads()
            caps = {lf: self.placer.caps(lf) for lf in loads}
            pairs = [(q.src, q.dst) for q in self.placer.qps.values()]
            active = self.placer.active()
            act = self.placer.link_loads(tiers=1)
            pairs_a = [(self.placer.qps[k].src, self.placer.qps[k].dst) for k in active]
            hosts = {h: {"qps": len(e["keys"]), "age_s": round(now - e["seen"], 3)}
                     for h, e in sorted(self.hosts.items())}
            n_local = len(self.placer.local)
            excess, dead = self.placer.excess(), self.placer.dead_links()
            last, counters = self.last_solve_s, dict(self.counters)
        up = {lf: v["up"] for lf, v in loads.items()}
        down = {lf: v["down"] for lf, v in loads.items()}
        got = balance.figures(up, down, caps)
        best = balance.best_figures(self.fabric, pairs, caps)
        got_a = balance.figures({lf: v["up"] for lf, v in act.items()},
                                {lf: v["down"] for lf, v in act.items()}, caps)
        best_a = balance.best_figures(self.fabric, pairs_a, caps)
        servers: dict[str, dict] = {}        # a GPU server: its NICs (each a host here) summed
        for h, e in hosts.items():
            m = self.fabric.machine_of(h)
            if m != h:
                s = servers.setdefault(m, {"nics": [], "qps": 0, "age_s": 0.0})
                s["nics"].append(h)
                s["qps"] += e["qps"]
                s["age_s"] = max(s["age_s"], e["age_s"])
        return {
            "hosts": hosts,
            "servers": servers,
            "qps": {"fabric": len(pairs), "local": n_local, "newest": len(active)},
            "links": {lf: {**loads[lf], "capacity_mbps": caps[lf]} for lf in loads},
            "balance": {"up": got[0], "down": got[1], "best_up": best[0], "best_down": best[1]},
            # the newest generation alone (the QPs active now and those idle just as long):
            # placed as if the older ones did not exist
            "balance_newest": {"up": got_a[0], "down": got_a[1], "best_up": best_a[0], "best_down": best_a[1]},
            "over_target": excess,
            "dead_links": [f"{lf}/{c + 1}" for lf, c in dead],
            "last_solve_ms": round(last * 1000, 3),
            "counters": counters,
        }


def _lookup(tables, addr: ipaddress.IPv6Address) -> dict[int, float]:
    """The longest prefix's weights for an address (tables sorted longest first)."""
    for net, ws in tables:
        if addr in net:
            return ws
    return {}


# ---- HTTP ---------------------------------------------------------------------------------

def make_server(coord, addr: str = "::1", port: int = coordapi.DEFAULT_PORT,
                metrics: Callable[[], bytes] | None = None, reports: bool = True,
                extra_status: Callable[[], dict] | None = None,
                tls: ssl.SSLContext | None = None) -> ThreadingHTTPServer:
    """An HTTP server for the API (serve_forever() to run it): `coord` is the Coordinator of a
    leaf-spine fabric or the HRegistry of a rail-only one (hregistry.py). reports False: status
    and metrics only (with etcd, reports come from there, each writer known by its user);
    extra_status adds its dict under "etcd". `tls` (rlbcommon.tls.server_context): HTTPS; one
    that checks clients' certificates takes a report only from the machine it is about
    (keys.reporter: its certificate's unit), status and metrics from anybody."""
    identities = tls is not None and tls.verify_mode != ssl.CERT_NONE

    class Handler(BaseHTTPRequestHandler):
        server_version = "rlbcoord"
        timeout = httpguard.IDLE_S           # a client silent this long (mid-request too) is cut off

        def _admitted(self) -> bool:
            if self.server.limiter.allow(self.client_address[0]):
                return True
            self.server.counters["rate"] += 1
            self.close_connection = True
            self._send(429, {"error": f"more than {httpguard.RATE_PER_S:g} requests a second from {self.client_address[0]}"})
            return False

        def _identified(self, tree: str, name: str) -> bool:
            """The client's certificate names the machine the report is about (one the fabric
            does not know is refused by the report itself)."""
            want = keys.reporter(coord.fabric, tree, name)
            got = tlsmod.peer_unit(self.connection)
            if want is None or got == want:
                return True
            self.server.counters["identity"] += 1
            self.close_connection = True
            log.warning("refused %s from %s: its certificate is %s's, not %s's", self.path, self.address_string(),
                        got or "nobody", want)
            self._send(403, {"error": f"a report about {name} is taken only with {want}'s certificate, "
                                      f"not {got or 'none'}"})
            return False

        def log_message(self, fmt, *args):
            log.debug("%s %s", self.address_string(), fmt % args)

        def _send(self, code: int, obj=None, body: bytes | None = None, ctype="application/json"):
            data = body if body is not None else json.dumps(obj).encode()
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            if not self._admitted():
                return
            if self.path == coordapi.STATUS:
                st = coord.status()
                st["http"] = dict(self.server.counters)
                if extra_status is not None:
                    st["etcd"] = extra_status()
                self._send(200, st)
            elif self.path == "/healthz":
                self._send(200, {"ok": True})
            elif self.path == "/metrics" and metrics:
                self._send(200, body=metrics() + httpguard.exposition(self.server.counters),
                           ctype="text/plain; version=0.0.4")
            else:
                self._send(404, {"error": f"no {self.path}"})

        def do_POST(self):
            if not self._admitted():
                return
            parts = self.path.strip("/").split("/")
            try:
                length = httpguard.body_length(self.headers)
            except httpguard.BadLength as e:
                self.server.counters["length"] += 1
                self.close_connection = True         # what follows the headers cannot be framed
                log.warning("bad request %s from %s: %s", self.path, self.address_string(), e)
                self._send(e.code, {"error": str(e)})
                return
            if not reports:
                self._send(403, {"error": "this coordinator takes reports through etcd (rlbhost --etcd, "
                                          "rlbswitch --etcd), where each writer is known"})
                return
            if identities and len(parts) == 4 and not self._identified(parts[1], parts[2]):
                return
            try:
                body = json.loads(self.rfile.read(length) or b"{}")
                if len(parts) == 4 and parts[:2] == ["v1", "hosts"] and parts[3] == "report":
                    self._send(200, coord.report(parts[2], body))
                elif len(parts) == 4 and parts[:2] == ["v1", "switches"] and parts[3] == "links":
                    self._send(200, coord.links(parts[2], body))
                elif len(parts) == 4 and parts[:2] == ["v1", "gpus"] and parts[3] == "load" and hasattr(coord, "load"):
                    self._send(200, coord.load(parts[2], body))   # a rail-only fabric's h-score registry
                else:
                    self._send(404, {"error": f"no {self.path}"})
            except Refused as e:
                log.warning("refused %s from %s: %s", self.path, self.address_string(), e)
                self._send(403, {"error": str(e)})
            except (BadRequest, ValueError) as e:
                if not isinstance(e, BadRequest):
                    coord.counters["bad"] += 1       # not JSON at all
                log.warning("bad request %s from %s: %s", self.path, self.address_string(), e)
                self._send(400, {"error": str(e)})

    cls = httpguard.GuardedServer
    if ":" in addr:
        cls = type("GuardedServer6", (cls,), {"address_family": AF_INET6})
    server = cls((addr, port), Handler)
    if tls is not None:
        server.use_tls(tls)
    return server


def for_clos(fabric: ClosFabric, host_timeout_s: float, host_qps_max: int = HOST_QPS_MAX) -> Coordinator:
    """The leaf-spine kind's coordinator (rlbcoord/kinds/clos.py)."""
    coord = Coordinator(fabric, host_timeout_s)
    coord.host_qps_max = host_qps_max
    return coord
