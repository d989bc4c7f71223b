"""The host's side of the coordinator when the fabric runs it on etcd (rlbhost --etcd): the same
view of this host's QPs as the HTTP client (coordclient.py), written as changes instead of full
reports, and placements watched instead of asked for.

- Under the host's own lease (its etcd user may write nothing else): one report key (paths,
  weights, the verbs library's peers) rewritten when it changes, and its QPs in a few keys
  (keys.qp_parts: 64 QPs a key or fewer on average), a key rewritten when one of its QPs
  appears, changes path or activity or is forgotten. Bytes are not state: a busy QP costs no
  writes. A QP gone idle carries the wall-clock time of its last packet, so the coordinator
  ages it without a write per round.
- Placements: one watch on placements/<host>/ (one key holds them all, more past 1024 QPs),
  applied to the data plane as they change.
- etcd unreachable (or the lease lost): the placements are kept for fallback_s, then dropped
  and the local rule decides, as with the HTTP coordinator; once etcd answers, everything is
  written afresh under a new lease."""
from __future__ import annotations

import json
import logging
import threading
import time

from rlbcommon import coordapi
from rlbcommon.etcd import QUIET_WATCH_S, Etcd, EtcdCompacted, EtcdError, EtcdUnavailable
from rlbcommon.health import Health
from rlbcommon.runtime import AgentRuntime
from rlbcoord import keys

from .coordclient import CoordinatorClient
from .dataplane import HostDataplane
from .verbs.advice import FabricView

log = logging.getLogger(__name__)
IDLE_WRITE_S = 1.0
REFUSED_BACKOFF_S = 1.0


class Lease:
    """The lease a machine's keys live under, one for all its NICs' clients: each keepalive costs
    the etcd leader about half a millisecond (docs/operations.md), so a server of eight NICs
    keeps one lease alive, not eight. A new lease (the old one ended) has a new generation: each
    client then writes everything again under it.

    Kept alive by a loop of its own on the agent's runtime ("etcd-lease"), on its own connection, a third of the lease after the
    last keepalive was sent (at once after a slow answer), and again within RETRY_S after one
    that got no answer: a slow etcd (a write taking seconds) never holds a keepalive back behind
    the clients' writes, and a keepalive that timed out is not the lease's end (it may well have
    reached etcd). The lease has ended when etcd says so (a keepalive answered with no time
    left), or after twice its time without an answer; only then is a new one granted. The
    clients learn that etcd is not answering from keep(): it raises while the last keepalive got
    no answer and none sent in the last two thirds of the lease was answered (a slow answer is
    an answer: a lease renewed every 2.5 s of a 3 s lease holds)."""

    RETRY_S = 0.2                      # after a keepalive that got no answer

    def __init__(self, etcd: Etcd, ttl_s: int):
        self.etcd, self.ttl_s = etcd, ttl_s
        self.id, self.generation = 0, 0
        self.kept_alive = 0.0             # when the last answered keepalive (or the grant) was sent
        self.ended = False
        self.failing = False              # the last keepalive got no answer
        self._told = 0                    # the ended lease the log has named
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self._started = False
        self.keepalives = self.unanswered = 0

    def start(self, runtime: AgentRuntime):
        """Its keepalives in the runtime's loop "etcd-lease" (once, for whichever client starts
        first); they begin with the first lease granted."""
        with self.lock:
            if self._started:
                return
            self._started = True
            self.stop = runtime.stop
        runtime.stream("etcd-lease", self._keep_alive, within_s=max(runtime.health.hang_s, self.ttl_s))

    def keep(self, who: str) -> tuple[int, int]:
        """(lease id, generation): granted at first and anew once ended; EtcdUnavailable while
        etcd does not answer keepalives."""
        with self.lock:
            if self.id and not self.ended:
                silent = time.monotonic() - self.kept_alive
                if self.failing and silent > self.ttl_s * 2 / 3:
                    raise EtcdUnavailable(f"no keepalive of lease {self.id:x} answered for {silent:.1f} s")
                return self.id, self.generation
            if self.id and self._told != self.id:
                self._told = self.id      # once a lease, however many grants fail after it
                log.warning("etcd lease %x of %s ended: writing everything again", self.id, who)
            sent = time.monotonic()
            self.id = self.etcd.lease_grant(self.ttl_s)
            self.kept_alive, self.generation, self.ended, self.failing = sent, self.generation + 1, False, False
            started = self._started
        if not started:                   # a client used without an agent (tests, benches)
            self.start(AgentRuntime(log, stop=self.stop))
        return self.id, self.generation

    def _keep_alive(self, beat):
        due = time.monotonic() + self.ttl_s / 3
        while not self.stop.wait(max(0.0, due - time.monotonic())):
            beat()
            with self.lock:
                lease, since = (0, 0.0) if self.ended else (self.id, self.kept_alive)
            if not lease:
                due = time.monotonic() + self.ttl_s / 3
                continue
            sent = time.monotonic()
            self.keepalives += 1
            try:
                left = self.etcd.lease_keepalive(lease)
            except EtcdError as e:            # no answer in time, or refused: again soon
                self.unanswered += 1
                log.info("etcd lease %x: keepalive not answered (%s)", lease, e)
                left = None
            with self.lock:
                if self.id != lease:
                    continue
                self.failing = left is None
                if left is not None and left > 0:
                    self.kept_alive, due = sent, sent + self.ttl_s / 3
                elif left is not None or time.monotonic() - since >= 2 * self.ttl_s:
                    self.ended = True         # etcd says it is gone, or it surely is by now
                    due = time.monotonic() + self.ttl_s / 3
                else:
                    due = time.monotonic() + self.RETRY_S


class EtcdCoordinatorClient(CoordinatorClient):
    def __init__(self, dp: HostDataplane, node: str, etcd: Etcd, period_s: float = 0.1,
                 memory_s: float = 3.0, fallback_s: float = 3.0, lease_ttl_s: int = 3,
                 health: Health | None = None, view: FabricView | None = None, lease: Lease | None = None):
        super().__init__(dp, node, ",".join(etcd.endpoints), period_s, memory_s, fallback_s, health, view)
        self.leases = lease or Lease(etcd, lease_ttl_s)   # shared by a server's NICs
        self._generation = 0
        self.leaf = view.leaf if view is not None else None
        self.link_table: dict[str, dict] = {}      # leaf -> {"loads": ..., "through": revision}
        self.writes: list[tuple[int, float]] = []  # (revision, when sent) of recent writes
        self.etcd, self.lease_ttl_s = etcd, lease_ttl_s
        self.lease = 0
        self.written: dict[str, str] = {}          # key -> value as last written under this lease
        self.placed: dict[keys.QpId, int] = {}     # path values, as the watch last said
        self._parts: dict[str, dict] = {}          # placement key -> its QPs' path values
        self.qp_parts = 1                          # how many keys this host's QPs are written in
        self.wall_offset = time.time() - time.monotonic()
        self.counters.update({"writes": 0, "deletes": 0, "leases": 0, "watch_events": 0, "refusals": 0})
        self._watching = False
        self._refused_until, self._refusal = 0.0, ""
        self.runtime: AgentRuntime | None = None

    def start(self, runtime: AgentRuntime):
        """Its report round, its watches (once etcd has answered) and the machine's lease, each
        a loop of the agent's runtime."""
        self.runtime = runtime
        self.leases.start(runtime)
        return super().start(runtime)

    # ---- what is written -----------------------------------------------------------------
    def wanted(self) -> dict[str, str]:
        """Every key this host should have in etcd now, with its value."""
        body = self.body()              # the memory of QPs, as the HTTP client keeps it
        report = {"paths": body["paths"], "weights": body["weights"], "peers": body["peers"]}
        out = {keys.report_key(self.node): json.dumps(report, sort_keys=True)}
        now = time.monotonic()
        qps: dict[keys.QpId, dict] = {}
        for k, v in self.memory.items():
            # idle is news only after IDLE_WRITE_S: a collective's QPs pause between iterations
            # longer than the conntrack expiry, and two writes per QP per iteration would be
            # most of etcd's load (docs/operations.md, the arithmetic)
            idle = not v["active"] and now - v["seen"] >= IDLE_WRITE_S
            val = {"path": v["path"], "active": not idle}
            if idle:                     # when it last carried traffic, on the wall clock
                val["since"] = round(v["seen"] + self.wall_offset, 2)
            qps[k] = val
        for q in body["qps"]:
            if q.get("fixed"):           # placed through verbs: never moved, counted on its links
                qps[(q["peer"], 0, q["qp"])] = {"path": q["path"], "active": True, "fixed": True}
        self.qp_parts = keys.host_part_count(len(qps), self.qp_parts)
        out.update({keys.qp_part_key(self.node, part): v for part, v in keys.qp_parts(qps, self.qp_parts).items()})
        return out

    def report_once(self) -> int:
        """Write what changed since the last round (everything under a new lease); returns the
        number of keys written or deleted. After a refusal (a wrong password, authentication
        not on yet) etcd is asked again only after REFUSED_BACKOFF_S: each attempt costs its
        server a password hash."""
        now = time.monotonic()
        if now < self._refused_until:
            raise coordapi.CoordinatorError(f"etcd: {self._refusal} (asking again in "
                                            f"{self._refused_until - now:.1f} s)")
        try:
            self._keep_lease()
            want = self.wanted()
            puts = {k: v for k, v in want.items() if self.written.get(k) != v}
            deletes = [k for k in self.written if k not in want]
            if puts or deletes:
                sent = time.monotonic()
                rev = self.etcd.apply(puts, deletes, lease=self.lease)
                self.writes = [*self.writes[-63:], (rev, sent)]
                self.written = want
                self.counters["writes"] += len(puts)
                self.counters["deletes"] += len(deletes)
            if not self._watching:
                self._start_watch()
            self._tell_view()                # fresh as long as the watch is: nothing else comes
            return len(puts) + len(deletes)
        except EtcdUnavailable as e:
            raise coordapi.CoordinatorError(f"etcd: {e}") from None
        except EtcdError as e:
            self._refusal, self._refused_until = str(e), time.monotonic() + REFUSED_BACKOFF_S
            self.counters["refusals"] += 1
            raise coordapi.CoordinatorError(f"etcd: {e}") from None

    def _keep_lease(self):
        self.lease, generation = self.leases.keep(self.node)
        if generation != self._generation:       # a new lease: nothing written under it yet
            self._generation, self.written = generation, {}
            self.counters["leases"] += 1

    # ---- placements ------------------------------------------------------------------------
    def _start_watch(self):
        self._watching = True
        runtime = self.runtime or AgentRuntime(log, self.health, self.stop)   # (a client without an agent)
        suffix = self.loop[len("coordinator"):]           # a server's NICs: one watch each
        runtime.stream("placements" + suffix, lambda beat: self._watch(
            beat, keys.placements_prefix(self.node), self._placement, self._apply))
        if self.view is not None:
            runtime.stream("links" + suffix, lambda beat: self._watch(
                beat, keys.links_prefix(), self._links, self._tell_view))

    def _watch(self, beat, prefix: str, put, changed):
        """Follow one prefix: put(key, value or None) per key, changed() after each batch; beat()
        after each batch and each quiet QUIET_WATCH_S. Returns (to be called again) after
        what it expects: etcd away, the revision compacted, a refusal."""
        try:
            kvs, rev = self.etcd.get_prefix(prefix)
            if prefix == keys.links_prefix():
                self.link_table = {}
            else:
                self.placed, self._parts = {}, {}
            for kv in kvs:
                put(kv.key, kv.value)
            changed()
            beat()
            for events, rev in self.etcd.watch_prefix(prefix, rev + 1, self.stop, idle_s=QUIET_WATCH_S, quiet=True):
                for e in events:
                    put(e.kv.key, None if e.kind == "delete" else e.kv.value)
                if events:
                    self.counters["watch_events"] += len(events)
                    changed()
                beat()
        except EtcdUnavailable:
            self.stop.wait(0.5)           # the report round notices and falls back
        except EtcdCompacted as e:
            log.info("%s watch: %s; reading them again", prefix, e)
        except EtcdError as e:            # refused: the report round logs and counts it
            log.debug("%s watch: %s", prefix, e)
            self.stop.wait(REFUSED_BACKOFF_S)

    def _placement(self, key: str, value: bytes | None):
        """One placement key (a part of this host's placements, keys.placement_parts) changed."""
        name = key[len(keys.placements_prefix(self.node)):]
        if value is None:
            self._parts.pop(name, None)
        else:
            try:
                self._parts[name] = keys.read_placements(name, value)
            except ValueError as e:
                log.warning("placement key %s: not one of ours (%s); ignored", key, e)
                return
        self.placed = {q: p for part in self._parts.values() for q, p in part.items()}

    def _links(self, key: str, value: bytes | None):
        leaf = key[len(keys.links_prefix()):]
        try:
            if value is None:
                self.link_table.pop(leaf, None)
            else:
                self.link_table[leaf] = json.loads(value)
        except ValueError:
            log.warning("link loads %s: not readable; ignored", key)

    def _tell_view(self):
        """The coordinator's loads as the verbs library's view takes them (what the HTTP reply
        carries): this leaf's uplinks, every other leaf's downlinks; QPs written after the
        revision the loads include stay pending in the view."""
        if self.view is None or self.leaf not in self.link_table:
            return
        table = self.link_table
        try:
            links = {"leaf": self.leaf, "up": table[self.leaf]["loads"]["up"],
                     "down": {lf: v["loads"]["down"] for lf, v in table.items() if lf != self.leaf}}
            through = min(v.get("through", 0) for v in table.values())
        except (KeyError, TypeError):
            return
        included = [t for rev, t in self.writes if rev <= through]
        self.view.answered(links, max(included) if included else 0.0)

    def _apply(self):
        index = {p.value: p.index for p in self.dp.paths() if p.valid}
        want = {q: index[p] for q, p in self.placed.items() if p in index}
        with self.dp.locked():
            self.dp.set_placements(want)
