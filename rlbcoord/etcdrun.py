"""The coordinator on etcd (issue 31): any number run, one leads, the others stand by with the
same state, read from etcd as it changes.

- State: hosts write their report and their QPs (a few keys a host) under their lease,
  leaves their uplinks (keys.py). Every coordinator follows the whole tree with one watch and keeps a mirror, so a
  standby that takes over has nothing to fetch; a host whose lease ended has no keys left, and
  its QPs leave the model (liveness is the lease, not a timer here).
- Leadership: the leader key is created under the coordinator's own lease (etcd's election
  recipe, as Kubernetes' and Cilium's operators do it); the others try again every
  `retry_s`, so a dead leader is replaced within its lease's TTL plus one retry. A graceful stop
  revokes the lease: replaced at once.
- Placements: after each batch of changes the leader solves once and writes only what differs
  from the placement keys (a host's placements in one key, keys.placement_parts; it follows
  them too, its predecessors' included), in transactions that succeed only while it still
  holds the leader key: a deposed leader that has not noticed yet cannot overwrite its
  successor. A new leader starts from where the hosts put their QPs, so nothing placed moves
  unless the balance needs it.
- Writing does not hold up placing: the placer leaves each batch's writes in an outbox (a key's
  newest value replaces one not yet sent) and solves the next batch while a writer thread sends
  them, several transactions at once. During a collective etcd is busy with the hosts' own
  writes, and a write of a few hundred hosts waited there one round trip per 128 keys, in
  turn, while the next hosts' QPs waited for the placer. Each write is fenced by the term
  (leader key revision) it was placed under; what a lost term left unsent is dropped."""
from __future__ import annotations

import json
import logging
import threading
import time

from rlbcommon.etcd import QUIET_WATCH_S, Etcd, EtcdCompacted, EtcdError, EtcdUnavailable, created
from rlbcommon.heap import Heap
from rlbcommon.health import Health
from rlbcommon.runtime import AgentRuntime

from . import keys, shards
from .service import Coordinator
from .shards import WHOLE, Shard

log = logging.getLogger(__name__)
# Link loads (links/<leaf>) are written at most this often: every host watches them all, so a
# write reaches thousands of watchers; during a collective's start placements change in every
# batch, and a placement a verbs library makes on loads a quarter second old is placed again
# by the coordinator anyway.
LINKS_EVERY_S = 0.25
# Solves are at least this far apart while changes keep coming (a change after a quiet spell is
# placed at once): during a collective's start a change arrives every fraction of a millisecond,
# and a solve per host cost a batch's fixed work (compare, write, one transaction) each time.
# Kubernetes' endpoints controller batches its updates the same way (--endpoint-updates-batch-period).
PLACE_EVERY_S = 0.002
# A shard's loads (shards.py) are published at most this often while they keep changing: every
# other shard's leader reads them (2-3 ms for 128 leaves, with encoding them) and places again
# above them, so more often costs every shard solves during a collective's start (at 20 ms:
# a sixth of a shard's CPU) and does not make the first placements sooner, which each shard
# makes on what it knows; a change after a quiet spell goes at once.
SHARE_EVERY_S = 0.1


class EtcdCoordination:
    def __init__(self, coord: Coordinator, etcd: Etcd, name: str, lease_ttl_s: int = 2,
                 retry_s: float = 0.1, health: Health | None = None, heap: Heap | None = None,
                 shard: Shard = WHOLE):
        self.coord, self.etcd, self.name = coord, etcd, name
        # a shard places its leaves' hosts only (shards.py): the others' keys are dropped as they come
        self.shard = shard
        self.leader_key = keys.leader_key(shard.index, shard.of)
        self.mine: set[str] | None = None if shard.whole else shard.hosts(coord.fabric)
        self.my_leaves: set[str] | None = None if shard.whole else set(shard.leaves(coord.fabric))
        self.leaf_names = [lf.name for lf in coord.fabric.leaves]
        self.leaf_index = {n: i for i, n in enumerate(self.leaf_names)}
        self.leaders: dict[tuple[int, int], str] = {}  # (shard, of) -> the name leading it
        self.others: dict[int, list] = {}              # shard -> its loads per generation
        self._outside_due = False                      # others' loads changed since the last solve
        self._shared_at = 0.0                          # when our loads were last published
        self._shared_due = False                       # ... and a change is held back since
        self._shared = ""                              # what we last published (or queued)
        self._foreign_logged = ""
        self._unreadable_logged: dict[str, str] = {}   # a shard's loads key -> why it was not read
        self._uplinks_due = False                      # a switch's state changed since the last solve
        self.heap = heap or Heap()                     # the model out of the collector's sight
        self.lease_ttl_s, self.retry_s = lease_ttl_s, retry_s
        self.health = health or Health()
        self.stop = threading.Event()
        self.leading = threading.Event()
        self.lock = threading.Lock()                   # the mirror, between follower and leader
        self.placing = threading.Lock()
        self.wake = threading.Event()                  # the mirror changed: place
        self.writing = threading.Condition()           # the outbox, between placer and writer
        self.outbox: dict[str, str | None] = {}         # key -> value to write (None: delete)
        self.outbox_term = 0                           # the leader key's revision it was placed under
        self.sending = False                           # the writer holds a batch of the outbox
        self.vacant = threading.Event()                # the leader key was deleted
        self.reports: dict[str, dict] = {}             # host -> {"report": dict | None, "qps": {QpId: dict}}
        self.placed: dict[str, dict] = {}              # host -> {part: its value's text}, as in etcd
        self.dirty: set[str] = set()                   # hosts whose keys changed since the last solve
        self.dirty_report: set[str] = set()            # ... whose report key did (read them whole)
        self.dirty_qps: dict[str, set] = {}            # ... and which of their QP keys
        self.uplinks: dict[str, dict] = {}
        self.links: dict[str, str] = {}                # leaf -> its link loads, as in etcd
        self._link_text: dict[str, tuple] = {}         # leaf -> (its loads, as text): dumped once
        self._links_at = 0.0                           # when link loads were last written
        self._links_due = False                        # ... and some are held back since
        self._placed_at = 0.0                          # when the last solve ended
        self._placed_through = 0                       # the revision the last placement read up to
        self.through = 0                               # the revision the mirror has read up to
        self.lease = 0
        self.leader_rev = 0                            # our leader key's create revision
        self.leader: str | None = None
        self.synced = threading.Event()                # the mirror has been read once
        self.counters = {"batches": 0, "placements_written": 0, "placements_deleted": 0, "links_written": 0,
                         "takeovers": 0, "refused": 0, "fenced": 0, "etcd_refusals": 0,
                         # CPU seconds of the follower (applying changes to the mirror) and the
                         # placer (solving, comparing with etcd's): most of the coordinator's
                         # cost (decoding the watch and sending the writes are not counted)
                         "follow_cpu_s": 0.0, "place_cpu_s": 0.0,
                         "hosts_over": 0}                       # hosts dropped from the mirror for their QPs
        self._reread: set[str] = set()                 # hosts within the limit again: read afresh
        self._down_logged = False
        self._refused_logged = ""
        self._compare_all = True                       # the next write compares every host
        self._refused_hosts: set[str] = set()          # hosts whose keys the model refused: logged once,
                                                       # read whole at their next change

    # ---- following the tree -----------------------------------------------------------------
    def _load(self) -> int:
        kvs, rev = self.etcd.get_prefix(keys.ROOT)
        with self.lock:
            self.reports, self.placed, self.uplinks, self.links = {}, {}, {}, {}
            self.leaders, self.others, self._outside_due = {}, {}, True
            self.dirty = set(self.coord.hosts)         # hosts the model has and etcd may not
            self.dirty_report, self.dirty_qps = set(self.coord.hosts), {}   # read whole
            self._reread = set()
            for kv in kvs:
                self._put(kv.key, kv.value)
        return rev

    def _put(self, key: str, value: bytes | None):
        """One key's new value (None: deleted) into the mirror (under the lock)."""
        if key.startswith(keys.links_prefix()):
            tree, node, rest = "links", key[len(keys.links_prefix()):], ""
        elif key.startswith(keys.coordinator_prefix()):
            self._coordinator_key(key, value)
            return
        else:
            try:
                tree, node, rest = keys.split(key)
            except ValueError:
                return
        if self.mine is not None and tree in ("hosts", "placements") and node not in self.mine:
            return                                     # another shard's host
        try:
            if tree == "hosts":
                h = self.reports.setdefault(node, {"report": None, "qps": {}, "keys": {}, "over": None})
                if rest == "report":
                    h["report"] = _object(value) if value is not None else None
                    self.dirty_report.add(node)
                elif rest.startswith("qps/"):
                    self._qps(node, h, rest[4:], value)
                if h["report"] is None and not h["qps"] and not h["over"]:
                    del self.reports[node]
                self.dirty.add(node)
            elif tree == "placements":                # compared as text (keys.placement_parts)
                p = self.placed.setdefault(node, {})
                if value is None:
                    p.pop(rest, None)
                else:
                    p[rest] = value.decode()
                if not p:
                    del self.placed[node]
            elif tree == "links":
                if value is None:
                    self.links.pop(node, None)
                else:
                    self.links[node] = json.dumps(json.loads(value)["loads"], sort_keys=True)
            elif tree == "switches" and rest == "uplinks" and value is not None:
                self.uplinks[node] = json.loads(value)
                self.dirty.add("")                     # "": solve (here: with the switches' state)
                self._uplinks_due = True
        except (ValueError, TypeError) as e:           # a key no agent of ours writes like this
            self.counters["refused"] += 1
            log.warning("etcd key %s: cannot read it (%s); ignored", key, e)

    def _coordinator_key(self, key: str, value: bytes | None):
        """The coordinators' own keys (under the lock): elections, shards' loads."""
        election = keys.parse_leader_key(key)
        if election is not None:
            if value is None:
                self.leaders.pop(election, None)
            else:
                self.leaders[election] = value.decode(errors="replace")
            if election == (self.shard.index, self.shard.of):
                self.leader = self.leaders.get(election)
                if value is None:
                    self.vacant.set()                # the standbys try at once, not at their next retry
            return
        shard = keys.parse_shard_loads_key(key)
        if shard is None or shard == self.shard.index or not 1 <= shard <= self.shard.of:
            return                                     # ours, or no shard of this count's
        if value is None:
            had = self.others.pop(shard, None) is not None
        else:
            try:
                of, tiers = shards.decode(value, self.leaf_index, len(self.coord.placer.tiers),
                                          self.coord.placer.n_colours)
            except (ValueError, TypeError) as e:       # a shard with another fabric file: said once
                self.counters["refused"] += 1
                if self._unreadable_logged.get(key) != str(e):
                    log.warning("etcd key %s: cannot read it (%s); ignored (is every coordinator's "
                                "fabric file the same?)", key, e)
                    self._unreadable_logged[key] = str(e)
                return
            self._unreadable_logged.pop(key, None)
            if of != self.shard.of:                    # a coordinator of another count: see _try_lead
                return
            had = True
            self.others[shard] = tiers
        if had and not self.shard.whole:
            self._outside_due = True
            self.dirty.add("")                         # place ours again above theirs

    def _qps(self, node: str, h: dict, name: str, value: bytes | None):
        """One of a host's QP keys (a part, or an older host's key for one QP): only the QPs
        whose value changed are marked to be read. A QP the host moved to another part is found
        in it, whichever of the two keys comes first."""
        new = keys.read_qps(name, value) if value is not None else {}
        over = h["over"]
        if over is not None:                           # only counted until it is within again
            if new:
                over[name] = len(new)
            else:
                over.pop(name, None)
            if sum(over.values()) <= self.coord.host_qps_max:
                self._reread.add(node)
            else:
                self._reread.discard(node)
            return
        old = h["keys"].pop(name, {})
        if new:
            h["keys"][name] = new
        dirty = self.dirty_qps.setdefault(node, set())
        for q in old.keys() | new.keys():
            if old.get(q) == new.get(q):
                continue
            v = new.get(q)
            if v is None:
                v = next((part[q] for part in h["keys"].values() if q in part), None)
            if v == h["qps"].get(q):
                continue
            if v is None:
                del h["qps"][q]
            else:
                h["qps"][q] = v
            dirty.add(q)
        if len(h["qps"]) > self.coord.host_qps_max:
            self._drop(node, h)

    def _drop(self, node: str, h: dict):
        """A host over the QPs one host may have (rlbcoord run --host-qps-max) leaves the mirror:
        each key's QPs are counted, not kept, until it is within again and is read afresh (the
        etcd role bounds whose keys a host writes, not how many). The model keeps its earlier
        state, as for a refused report."""
        h["over"] = {name: len(part) for name, part in h["keys"].items()}
        h["qps"], h["keys"] = {}, {}
        self.dirty_qps.pop(node, None)
        self.counters["hosts_over"] += 1

    def _reread_within(self):
        """Read again the QP keys of hosts that were over the limit and are within it now (the
        follower, outside the lock: a get per host; a watch event older than the get puts an
        older value back until the newer event comes, as any event does)."""
        with self.lock:
            nodes, self._reread = self._reread, set()
        for node in nodes:
            kvs, _ = self.etcd.get_prefix(keys.qps_prefix(node))
            with self.lock:
                h = self.reports.get(node)
                if h is None or h["over"] is None or sum(h["over"].values()) > self.coord.host_qps_max:
                    continue
                h["over"] = None
                for kv in kvs:
                    self._put(kv.key, kv.value)
                self.dirty.add(node)
                self.dirty_report.add(node)
            log.info("%s is within %d QPs again: its keys read afresh", node, self.coord.host_qps_max)

    def follow(self):
        """Keep the mirror current (every coordinator, leading or not); the leader places after
        each batch. Returns when stopped; etcd unreachable: retried, the model kept."""
        while not self.stop.is_set():
            try:
                rev = self._load()
                self.heap.settle()
                self.through = rev
                self.synced.set()
                if self._down_logged or self._refused_logged:
                    log.info("etcd reachable again: state read afresh")
                    self._down_logged, self._refused_logged = False, ""
                self.wake.set()
                for events, rev in self.etcd.watch_prefix(keys.ROOT, rev + 1, self.stop, idle_s=QUIET_WATCH_S,
                                                          quiet=True):
                    if not events:                   # quiet: alive all the same
                        self.health.ok("etcd-follower")
                        continue
                    t = time.thread_time()
                    with self.lock:
                        for e in events:
                            self._put(e.kv.key, None if e.kind == "delete" else e.kv.value)
                        self.through = rev - 1           # the store's changes read so far
                    if self._reread:
                        self._reread_within()
                    self.wake.set()      # the placer takes whatever has come by then: one solve
                    self.heap.settle()
                    self.counters["follow_cpu_s"] += time.thread_time() - t
                    self.health.ok("etcd-follower")
            except EtcdUnavailable as e:
                if not self._down_logged:
                    log.warning("etcd: %s; keeping the model, retrying", e)
                    self._down_logged = True
                self.health.waiting("etcd-follower")   # retrying is not hanging: no restart for it
                self.stop.wait(0.5)
            except EtcdCompacted as e:
                log.info("etcd watch: %s; reading the tree again", e)
            except EtcdError as e:                     # refused: authentication, permission
                if str(e) != self._refused_logged:     # once per cause, not every retry
                    log.warning("etcd refuses to let %s read the fabric's state: %s; retrying",
                                self.name, e)
                    self._refused_logged = str(e)
                self.counters["etcd_refusals"] += 1
                self.health.waiting("etcd-follower")
                self.stop.wait(1.0)
            except Exception as e:                     # noqa: BLE001 - logged, counted, again
                self.health.failed("etcd-follower", e, log, ())
                self.stop.wait(0.5)

    # ---- placing ---------------------------------------------------------------------------
    def _body(self, h: dict, now_wall: float) -> dict | None:
        """A host's keys as the report the model takes (None: nothing left of it)."""
        if h["report"] is None:
            return None
        return {**h["report"], "qps": [_qp_body(q, v, now_wall) for q, v in h["qps"].items()]}

    def _place_if_leading(self) -> bool:
        if not self.leading.is_set():
            return False
        with self.placing:                             # follower and campaign: one at a time
            return self._place()

    def _place(self) -> bool:
        """One solve of what changed since the last; False if nothing had."""
        with self.lock:
            if not self.dirty:
                return False
            now = time.time()
            batch, changes = {}, {}
            over = {}
            for h in self.dirty - {""}:
                if h in self.reports and self.reports[h]["over"] is not None:
                    over[h] = self.coord.too_many(sum(self.reports[h]["over"].values()))
                elif h not in self.reports:
                    batch[h] = None                    # its keys are gone (its lease ended)
                elif (h in self.dirty_report or h in self._refused_hosts or not self.coord.knows(h)
                      or self.reports[h]["report"] is None):  # refused before: read whole again
                    batch[h] = self._body(self.reports[h], now)
                else:                                  # only some QPs: only they are read
                    qps = self.reports[h]["qps"]
                    changes[h] = {q: _qp_body(q, qps[q], now) if q in qps else None
                                  for q in self.dirty_qps.get(h, ())}
            uplinks = dict(self.uplinks) if self._uplinks_due else {}
            self._uplinks_due = False
            outside = None
            if self._outside_due and not self.shard.whole:
                p = self.coord.placer
                n_leaves = len(self.leaf_names)
                outside = (shards.before(self.shard.index, self.others, len(p.tiers), n_leaves, p.n_colours),
                           shards.newest(self.others, self.shard.index, n_leaves, p.n_colours))
            self._outside_due = False
            self.dirty.clear()
            self.dirty_report.clear()
            self.dirty_qps.clear()
            through = self.through
        if outside is not None:
            self.coord.set_outside(*outside)
        for switch, state in uplinks.items():
            try:
                self.coord.links(switch, {"ports": state})
            except Exception as e:                     # Refused / BadRequest: counted by the model
                log.warning("uplinks of %s refused: %s", switch, e)
        bad = self.coord.apply_reports(batch, changes)
        self.coord.counters["bad"] += len(over)
        bad.update(over)
        for host, why in bad.items():
            if host not in self._refused_hosts:        # once while it stays refused
                log.warning("report of %s refused: %s", host, why)
        self._refused_hosts = (self._refused_hosts - batch.keys() - changes.keys() - over.keys()) | bad.keys()
        self.counters["batches"] += 1
        self.write_placements(through)
        return True

    def write_placements(self, through: int = 0):
        """The model's placements against etcd's: only the differences, fenced by leadership.
        A leaf's link loads are written when they changed, at most every LINKS_EVERY_S, saying
        which revision of the hosts' writes they include (`through`): a host's verbs library
        counts its own QPs written after that as pending."""
        changed = self.coord.take_changed()
        if self._compare_all:                          # a new leader: everything against etcd
            changed, self._compare_all = set(self.coord.hosts) | set(self.placed), False
            self._links_at = 0.0
        want = self.coord.all_placements(changed)
        parts = {host: keys.placement_parts(want.get(host, {})) for host in changed}
        out: dict[str, str | None] = {}
        pending = self._pending()
        with self.lock:                                # against etcd's, or what is on its way
            for host, new in parts.items():
                have = self.placed.get(host, {})
                for k, v in new.items():
                    key = keys.placement_key(host, k)
                    if pending.get(key, have.get(k)) != v:
                        out[key] = v
                for k in have:
                    key = keys.placement_key(host, k)
                    if k not in new and pending.get(key, "") is not None:
                        out[key] = None
        self._placed_through = through
        if time.monotonic() - self._links_at >= LINKS_EVERY_S:
            out.update(self._link_writes(pending))
        else:
            self._links_due = True
        if not self.shard.whole:
            if time.monotonic() - self._shared_at >= SHARE_EVERY_S:
                out.update(self._share())
            else:
                self._shared_due = True
        self._enqueue(out)

    def _share(self) -> dict[str, str]:
        """Our loads for the other shards, when they changed (shards.py)."""
        self._shared_at, self._shared_due = time.monotonic(), False
        text = shards.encode(self.coord.shard_loads(), self.shard.of, self.leaf_names)
        if text == self._shared:
            return {}
        self._shared = text
        return {keys.shard_loads_key(self.shard.index): text}

    def _pending(self) -> dict[str, str | None]:
        """What waits in the outbox, placed while leading as now (an earlier term's is void)."""
        with self.writing:
            return dict(self.outbox) if self.outbox_term == self.leader_rev else {}

    def _enqueue(self, out: dict[str, str | None]):
        """Writes for the writer; a newer value of a key replaces one not sent yet. What an
        earlier term of leadership left is dropped: the new term compares everything afresh."""
        if not out:
            return
        with self.writing:
            if self.outbox_term != self.leader_rev:
                self.outbox, self.outbox_term = {}, self.leader_rev
            self.outbox.update(out)
            self.writing.notify_all()

    def _link_writes(self, pending: dict) -> dict[str, str]:
        """The leaves' link loads that differ from etcd's (or from what is on its way). Every
        host watches them all, so each write reaches thousands: they go at most every
        LINKS_EVERY_S, however often placements change."""
        self._links_at, self._links_due = time.monotonic(), False
        out = {}
        for leaf, v in self.coord.link_table().items():
            if self.my_leaves is not None and leaf not in self.my_leaves:
                continue                               # another shard's leaf: its leader writes it
            had = self._link_text.get(leaf)          # most leaves' loads did not change: no text
            if had is None or had[0] != v:
                self._link_text[leaf] = had = (v, json.dumps(v, sort_keys=True))
            key = keys.links_prefix() + leaf
            with self.lock:
                differs = self.links.get(leaf) != had[1]
            if differs or key in pending:
                out[key] = json.dumps({"loads": v, "through": self._placed_through}, sort_keys=True)
        return out

    def _links_if_due(self):
        """The link loads held back by LINKS_EVERY_S (and a shard's loads by SHARE_EVERY_S),
        once it has passed."""
        now = time.monotonic()
        links = self._links_due and now - self._links_at >= LINKS_EVERY_S
        share = self._shared_due and now - self._shared_at >= SHARE_EVERY_S
        if not links and not share:
            return
        with self.placing:
            if not self.leading.is_set():
                self._links_due = self._shared_due = False   # a new leader writes them all anyway
                return
            self._enqueue({**(self._link_writes(self._pending()) if links else {}),
                           **(self._share() if share else {})})

    def write(self):
        """The writer: whatever the outbox holds, as one set of fenced transactions sent at once;
        then the next. A failed write leaves the mirror as it was, so the next batch compares
        every host again and writes what is missing."""
        while not self.stop.is_set():
            with self.writing:
                if not self.outbox and not self.writing.wait(0.5):
                    self.health.ok("etcd-writer")      # nothing to write: alive all the same
                    continue
                batch, term, self.outbox, self.sending = self.outbox, self.outbox_term, {}, True
            try:
                if self.leading.is_set():
                    shared = batch.pop(keys.shard_loads_key(self.shard.index), None)
                    self._fenced({k: v for k, v in batch.items() if v is not None},
                                 [k for k, v in batch.items() if v is None], term)
                    if shared is not None:             # under our lease: it ends with our term
                        self.etcd.apply({keys.shard_loads_key(self.shard.index): shared}, lease=self.lease,
                                        compare=[created(self.leader_key, term)])
                self.health.ok("etcd-writer")
            except (EtcdUnavailable, EtcdError) as e:
                log.warning("%s: placements not written (%s); again at the next change", self.name, e)
                self.health.waiting("etcd-writer")
                self._again(0.2)
            except Exception as e:                     # noqa: BLE001 - logged, counted, again
                self.health.failed("etcd-writer", e, log, ())
                self._again(0.5)
            finally:
                with self.writing:
                    self.sending = False
                    self.writing.notify_all()

    def _again(self, pause_s: float):
        """After a failed write: what was not written is compared again at the next batch."""
        with self.lock:
            self.dirty.add("")
            self._uplinks_due = True
            self._compare_all = True
            self._shared = ""                          # our shard's loads too
        self.stop.wait(pause_s)
        self.wake.set()

    def flushed(self, timeout: float) -> bool:
        """Wait until everything placed so far has been sent (tests, benches, a graceful stop)."""
        with self.writing:
            return self.writing.wait_for(lambda: not self.outbox and not self.sending, timeout)

    def _fenced(self, puts: dict[str, str], deletes: list[str], term: int):
        """Writes that apply only while the leader key of `term` (its create revision) is ours."""
        sent = self.etcd.apply_parallel(puts, deletes, compare=[created(self.leader_key, term)])
        done = [(p, d) for p, d, rev in sent if rev]
        if len(done) < len(sent):
            self.counters["fenced"] += 1
            if term == self.leader_rev:                # not an earlier term's leftovers
                self.leading.clear()
                log.warning("%s: no longer the leader (placements not written)", self.name)
        with self.lock:                                # as the watch will bring them back
            for p, d in done:
                for k, v in p.items():
                    if k.startswith(keys.links_prefix()):
                        self.links[k[len(keys.links_prefix()):]] = json.dumps(json.loads(v)["loads"], sort_keys=True)
                        continue
                    _, host, rest = keys.split(k)
                    self.placed.setdefault(host, {})[rest] = v
                for k in d:
                    _, host, rest = keys.split(k)
                    self.placed.get(host, {}).pop(rest, None)
                n_links = sum(1 for k in p if k.startswith(keys.links_prefix()))
                self.counters["links_written"] += n_links
                self.counters["placements_written"] += len(p) - n_links
                self.counters["placements_deleted"] += len(d)

    # ---- leadership ------------------------------------------------------------------------
    def campaign(self):
        """Lead when the leader key is free; keep it alive while leading. Returns when stopped
        (revoking the lease: a successor takes over at once)."""
        while not self.stop.is_set():
            try:
                if not self.leading.is_set():
                    self._try_lead()
                else:
                    if self.etcd.lease_keepalive(self.lease) <= 0:
                        self.leading.clear()
                        log.warning("%s: lease expired; standing by", self.name)
                self.health.ok("etcd-leadership")
            except EtcdUnavailable as e:
                if self.leading.is_set():
                    log.warning("%s: etcd unreachable (%s); placing stops until it answers", self.name, e)
                    self.leading.clear()
                self.health.waiting("etcd-leadership")
            except EtcdError as e:
                log.warning("%s: %s", self.name, e)
                self.leading.clear()
                self.health.waiting("etcd-leadership")
            except Exception as e:                     # noqa: BLE001 - logged, counted, again
                self.health.failed("etcd-leadership", e, log, ())
                self.leading.clear()
            if self.leading.is_set():
                self.stop.wait(self.lease_ttl_s / 4)
            else:
                self.vacant.wait(self.retry_s)
                self.vacant.clear()
        if self.lease:
            try:
                self.etcd.lease_revoke(self.lease)
            except (EtcdError, EtcdUnavailable):
                pass
            self.leading.clear()

    def _try_lead(self):
        if not self.synced.is_set():
            return
        with self.lock:
            foreign = sorted(f"{k}/{of} ({name})" for (k, of), name in self.leaders.items() if of != self.shard.of)
        if foreign:                                    # never two placements of one host
            why = ", ".join(foreign)
            if why != self._foreign_logged:
                log.error("%s (shard %s) stands by: coordinators of another shard count lead: %s. "
                          "Every coordinator of a fabric runs with the same --shard count",
                          self.name, self.shard, why)
                self._foreign_logged = why
            return
        self._foreign_logged = ""
        cur = self.etcd.get(self.leader_key)
        if cur is not None:
            return
        if not self.lease or self.etcd.lease_keepalive(self.lease) <= 0:
            self.lease = self.etcd.lease_grant(self.lease_ttl_s)
        if self.etcd.create(self.leader_key, self.name, self.lease):
            kv = self.etcd.get(self.leader_key)
            if kv is None or kv.lease != self.lease:
                return
            self.leader_rev = kv.create_revision
            with self.lock:
                self.dirty.update(self.reports)        # the whole mirror, against what is written
                self.dirty_report.update(self.reports)
                self.dirty.update(self.coord.hosts)
                self.dirty.add("")
                self._uplinks_due = True
                self._compare_all = True
                self._outside_due, self._shared = True, ""   # our loads published afresh
            self.counters["takeovers"] += 1
            log.info("%s leads the coordination%s (lease %x, TTL %d s)", self.name,
                     "" if self.shard.whole else f" of shard {self.shard} ({len(self.mine)} hosts)",
                     self.lease, self.lease_ttl_s)
            self.leading.set()
            self.wake.set()

    def place(self):
        """The placer: after each change of the mirror, everything that changed meanwhile in one
        solve and one set of writes. While a batch is placed the next accumulates, so a
        collective's thousands of host writes cost a handful of solves, not one each."""
        while not self.stop.is_set():
            wait = 0.5 if not self._links_due else max(0.0, self._links_at + LINKS_EVERY_S - time.monotonic())
            woken = self.wake.wait(wait)
            t = time.thread_time()
            try:
                if woken:
                    self.stop.wait(self._placed_at + PLACE_EVERY_S - time.monotonic())
                    self.wake.clear()
                    if self._place_if_leading():
                        self._placed_at = time.monotonic()
                    self.heap.settle()
                else:
                    with self.lock:
                        idle = not self.dirty
                    self.heap.collect_if_due(idle and not self.wake.is_set())
                self._links_if_due()
                self.health.ok("etcd-placer")
            except Exception as e:                     # noqa: BLE001 - logged, counted, again
                # (no etcd error reaches here: the placer only fills the outbox, the writer sends)
                self.health.failed("etcd-placer", e, log, ())
                self.stop.wait(0.5)
                self.wake.set()
            self.counters["place_cpu_s"] += time.thread_time() - t

    # ---- running ---------------------------------------------------------------------------
    def start(self, runtime: AgentRuntime | None = None) -> list[threading.Thread]:
        """Its four loops on the coordinator's runtime (one stop, the supervisor's restarts, the
        hang watch: each beats at least every half second, or each quiet re-open of its watch)."""
        runtime = runtime or AgentRuntime(log, self.health, self.stop)
        self.stop = runtime.stop
        self.threads = [runtime.stream(name, lambda beat, target=target: target())
                        for name, target in (("etcd-follower", self.follow), ("etcd-leadership", self.campaign),
                                             ("etcd-placer", self.place), ("etcd-writer", self.write))]
        return self.threads

    def join(self, timeout: float):
        for t in getattr(self, "threads", []):
            t.join(timeout)

    def status(self) -> dict:
        with self.lock:
            led = {k for k, of in self.leaders if of == self.shard.of}
        # the other shards of our count with no leader (as last read): nobody places their hosts,
        # and no coordinator of theirs may run to say so
        leaderless = sorted(set(range(1, self.shard.of + 1)) - led - {self.shard.index})
        return {"name": self.name, "leading": self.leading.is_set(), "leader": self.leader,
                "shard": str(self.shard), "other_shards_without_leader": leaderless,
                "hosts_in_etcd": len(self.reports), "counters": dict(self.counters),
                "hosts_over": sorted(h for h, v in self.reports.items() if v["over"] is not None)}


def _qp_body(q: keys.QpId, v: dict, now_wall: float) -> dict:
    """A QP key's value as a report lists it: an idle one's `since` (wall clock) as idle_ms."""
    peer, sport, qp = q
    active = bool(v.get("active", True))
    since = v.get("since") or now_wall
    return {"peer": peer, "sport": sport, "qp": qp, "path": v.get("path"), "bytes": 0, "active": active,
            "fixed": bool(v.get("fixed", False)),
            "idle_ms": 0 if active else round(max(0.0, now_wall - since) * 1000, 1)}


def _object(value: bytes) -> dict:
    """A host's key holds a JSON object; anything else is refused (ValueError)."""
    v = json.loads(value)
    if not isinstance(v, dict):
        raise ValueError(f"not a JSON object: {value[:60]!r}")
    return v
