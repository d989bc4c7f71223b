"""The coordinator with etcd in the loop, at fabric scale (issue 31): a real etcd member (Debian's),
one coordinator following it (EtcdCoordination, in this process), and simulated hosts in
processes of their own that write QPs the way rlbhost --etcd does (one transaction per host: its
report and its QPs' keys, under its lease; each QP first on the path the host's local rule
gives it, as the data plane does before any placement comes) and watch their placements.
Measured: from a host's write to its placements being read (median, p99), for every host at
once, then for collectives of the given sizes in the full fabric, then for single hosts; keys
written; the CPU of the coordinator, of etcd and of the hosts' writers; next to today's HTTP
coordinator on the same workload (each host posting its full report).

    .venv/bin/python bench/etcd_placement.py [--leaves 128 --hosts 32 --spines 8 --qps 8
                                              --collective 16,64,128,256,512] [--tls]

No etcd authentication here (a user per simulated host would cost a bcrypt hash each to create);
the lab and the tests run with it."""
from __future__ import annotations

import argparse
import json
import math
import multiprocessing
import os
import random
import shutil
import statistics
import sys
import tempfile
import threading
import time
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from rlbcommon.etcd import Etcd, tls_context  # noqa: E402
from rlbfabric import workloads  # noqa: E402
from rlbfabric.policy import localrule  # noqa: E402
from rlbcoord import keys  # noqa: E402
from rlbcoord import etcdrun, etcdtls  # noqa: E402
from rlbcoord.etcdrun import EtcdCoordination  # noqa: E402
from rlbcoord.service import Coordinator  # noqa: E402
from rlbcoord.shards import Shard  # noqa: E402
from rlblab.etcdserver import EtcdServer  # noqa: E402

from placement_sim import model_fabric  # noqa: E402


# --tls: the directory of etcdtls's certificates, every client showing root's (as the agents
# show their own; set before the hosts' processes are forked)
TLS_DIR: Path | None = None


def client_of(url: str) -> Etcd:
    tls = tls_context(etcdtls.ca_file(TLS_DIR), etcdtls.client_file(TLS_DIR, "root")) if TLS_DIR else None
    return Etcd(url, timeout=30.0, tls=tls)


def free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LocalRule:
    """The path each host's agent gives a new QP before any placement arrives (localrule.py, as
    bpf/rlb_host.c does it: a host's QPs split evenly, hosts' ties spread by their rotation), or
    path 1 for every QP (`one`: the coordinator has to move 7 of 8, its worst case)."""

    def __init__(self, fabric, mode: str):
        self.fabric, self.mode, self.active = fabric, mode, {}

    def path(self, host: str) -> int:
        if self.mode == "one":
            return 1
        n = self.fabric.paths
        active = self.active.setdefault(host, [0] * n)
        i = localrule.choose(active, [1.0] * n, localrule.rotation(self.fabric, host))
        active[i] += 1
        return i + 1


class HostKeys:
    """What rlbhost --etcd keeps of its QPs in etcd: the QPs, and the keys they are written in
    (`parts`: a few keys a host, as it does; `per-qp`: one key each, as hosts did before)."""

    def __init__(self, mode: str):
        self.mode = mode
        self.qps: dict[str, dict] = {}            # host -> {QpId: value}
        self.parts: dict[str, int] = {}
        self.text: dict[str, dict[str, str]] = {}  # host -> {key: value} as last written

    def write(self, host: str, new: dict) -> dict[str, str]:
        """The keys a host writes once `new` QPs join its own: only those that changed."""
        qps = self.qps.setdefault(host, {})
        qps.update(new)
        if self.mode == "per-qp":
            return {keys.qp_key(host, q): json.dumps(v, sort_keys=True) for q, v in new.items()}
        n = self.parts[host] = keys.host_part_count(len(qps), self.parts.get(host, 1))
        want = {keys.qp_part_key(host, k): v for k, v in keys.qp_parts(qps, n).items()}
        had = self.text.get(host, {})
        self.text[host] = want
        return {k: v for k, v in want.items() if had.get(k) != v}


@dataclass
class HostWrite:
    puts: dict[str, str]                       # one transaction of the host's
    new: dict[str, int]                        # its new QPs, by name: the path its rule gave each


def host_writes(fabric, host: str, peers: list[str], qps: int, rnd: random.Random,
                rule: LocalRule, hk: HostKeys) -> tuple[HostWrite, dict]:
    """The keys rlbhost --etcd writes for `qps` QPs of `host` towards peers (each on the path its
    host's rule gave it), and the same as one HTTP report."""
    leaf, port = fabric.leaf_of_host(host)
    nets = fabric.host_prefixes(leaf, port)
    addr = {k + 1: str(n.network_address + 1) for k, n in enumerate(nets)}
    report = {"paths": {str(k): a for k, a in addr.items()},
              "weights": [{"prefix": "::/0", "weights": {str(k): 1 for k in addr}}], "peers": []}
    body = dict(report, qps=[])
    new = {}
    for i in range(qps):
        p = peers[i % len(peers)]
        pl, pp = fabric.leaf_of_host(p)
        peer = str(fabric.host_prefixes(pl, pp)[0].network_address + 1)
        q = (peer, 49152 + rnd.randrange(16384), rnd.getrandbits(24))
        new[q] = {"active": True, "path": rule.path(host)}
        body["qps"].append({"peer": q[0], "sport": q[1], "qp": q[2], "path": new[q]["path"], "bytes": 0,
                            "active": True})
    puts = {keys.report_key(host): json.dumps(report, sort_keys=True), **hk.write(host, new)}
    return HostWrite(puts, {keys.qp_name(q): v["path"] for q, v in new.items()}), body


def write_slice(url: str, writes: dict[str, dict], lease: int, threads: int) -> tuple[dict, float]:
    """One writer process: its hosts' transactions, `threads` at a time (hosts are machines of
    their own: thousands write at once, and etcd batches what arrives together); when each was
    sent and when etcd acknowledged it (CLOCK_MONOTONIC is the machine's, so the parent
    compares it with its own), and the CPU seconds this process spent on them."""
    cpu = time.process_time()
    client, ex = _writer(url, threads)
    out = {}

    def one(item):
        host, puts = item
        sent = time.monotonic()
        client.apply(puts, lease=lease)
        out[host] = (sent, time.monotonic())
    list(ex.map(one, writes.items()))
    return out, time.process_time() - cpu


_WRITER: dict = {}


def _writer(url: str, threads: int) -> tuple[Etcd, ThreadPoolExecutor]:
    """This writer process's client and threads, kept from one write to the next: hosts keep
    their connections (over TLS a new one is a handshake a running host does not pay)."""
    if (url, threads) not in _WRITER:
        _WRITER[(url, threads)] = (client_of(url), ThreadPoolExecutor(threads))
    return _WRITER[(url, threads)]


class PlacementWatch:
    """Follows every placement key as hosts do and notes when each QP's placement first
    appeared ({(host, QP name): when}) and where the last one put it."""

    def __init__(self, client: Etcd):
        self.client, self.stop = client, threading.Event()
        self.seen: dict[tuple[str, str], float] = {}
        self.path: dict[tuple[str, str], int] = {}
        self.cond = threading.Condition()
        _, rev = client.get_prefix(keys.placements_root())
        threading.Thread(target=self._run, args=(rev,), daemon=True).start()

    def _run(self, rev: int):
        for events, _ in self.client.watch_prefix(keys.placements_root(), rev + 1, self.stop, idle_s=60):
            now = time.monotonic()
            with self.cond:
                for e in events:
                    if e.kind == "delete":
                        continue
                    _, host, part = keys.split(e.kv.key)
                    for q, path in keys.read_placements(part, e.kv.value).items():
                        self.seen.setdefault((host, keys.qp_name(q)), now)
                        self.path[(host, keys.qp_name(q))] = path
                self.cond.notify_all()

    def wait(self, wanted: set[tuple[str, str]], timeout: float) -> bool:
        with self.cond:
            return self.cond.wait_for(lambda: wanted <= self.seen.keys(), timeout)


class HostsWatch:
    """PlacementWatch in a process of its own, as hosts' watches run on hosts: its decoding does
    not share the coordinator's interpreter. wait() brings back what it saw of the QPs asked."""

    def __init__(self, url: str, cpus: set[int] | None):
        self.seen: dict[tuple[str, str], float] = {}
        self.path: dict[tuple[str, str], int] = {}
        self.conn, child = multiprocessing.Pipe()
        self.proc = multiprocessing.get_context("fork").Process(target=_watch_main, args=(url, child, cpus),
                                                                 daemon=True)
        self.proc.start()
        self.conn.recv()                               # watching from here on

    def wait(self, wanted: set[tuple[str, str]], timeout: float) -> bool:
        self.conn.send((wanted, timeout))
        ok, seen, path = self.conn.recv()
        self.seen.update(seen)
        self.path.update(path)
        return ok

    def close(self):
        self.conn.send(None)
        self.proc.join(5)


def _watch_main(url: str, conn, cpus: set[int] | None):
    if cpus:
        os.sched_setaffinity(0, cpus)
    w = PlacementWatch(client_of(url))
    conn.send("ready")
    while (msg := conn.recv()) is not None:
        wanted, timeout = msg
        ok = w.wait(wanted, timeout)
        with w.cond:
            conn.send((ok, {k: w.seen[k] for k in wanted if k in w.seen},
                       {k: w.path[k] for k in wanted if k in w.path}))
    w.stop.set()


class Writers:
    """The hosts' writers: processes of their own, as hosts are machines of their own (threads of
    this process would share the coordinator's interpreter and measure Python, not etcd),
    started before anything is measured."""

    def __init__(self, url: str, workers: int, threads: int, cpus: set[int] | None):
        self.url, self.workers, self.threads = url, workers, threads
        self.cpu_s = 0.0                               # CPU seconds spent writing, all processes
        self.ex = ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("fork"),
                                      initializer=_pin, initargs=(cpus,))
        list(self.ex.map(time.sleep, [0.05] * workers * 2))      # every process up

    def write(self, writes: dict[str, HostWrite], lease: int) -> dict[str, tuple]:
        hosts = list(writes)
        slices = [{h: writes[h].puts for h in hosts[i::self.workers]} for i in range(self.workers)]
        written_at: dict[str, tuple] = {}
        for got, cpu in self.ex.map(write_slice, [self.url] * self.workers, slices, [lease] * self.workers,
                                    [self.threads] * self.workers):
            written_at.update(got)
            self.cpu_s += cpu
        return written_at

    def close(self):
        self.ex.shutdown()


def _pin(cpus: set[int] | None):
    if cpus:
        os.sched_setaffinity(0, cpus)


def proc_cpu(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        utime, stime = f.read().rsplit(")", 1)[1].split()[11:13]
    return (int(utime) + int(stime)) / os.sysconf("SC_CLK_TCK")


def cpu_now(server: EtcdServer, hosts: Writers, coords: "InProcess | Processes") -> tuple:
    """CPU seconds so far of the coordinators (their follower, placer and writer; the watch and
    the writers run elsewhere), of etcd, of the hosts' writers, and of the busiest shard's
    coordinator (with --shards)."""
    mine = coords.cpu()
    return sum(mine), proc_cpu(server.proc.pid), hosts.cpu_s, max(mine)


def cpu_spent(a: tuple, b: tuple) -> str:
    out = ", ".join(f"{y - x:.2f}" for x, y in zip(a[:3], b[:3]))
    return out + (f" (the busiest shard {b[3] - a[3]:.2f})" if len(a) > 3 and SHARDS > 1 else "")


SHARDS = 1
FLOOR = False                                  # --floor: Echo in the coordinator's place


class InProcess:
    """The coordinator in this process (one, placing the whole fabric)."""

    def __init__(self, fabric, url: str):
        self.coord = EtcdCoordination(Coordinator(fabric, host_timeout_s=1e9), client_of(url), "bench", lease_ttl_s=10)
        self.coord.start()
        while not self.coord.leading.is_set():
            time.sleep(0.01)

    def cpu(self) -> list[float]:
        return [time.process_time()]

    def settled(self):
        settled(self.coord)

    def counters(self) -> dict:
        return {**self.coord.counters, "solves": self.coord.coord.counters["solves"],
                "solve s": self.coord.coord.counters["solve_seconds"]}

    def close(self):
        self.coord.stop.set()


class Processes:
    """Coordinators (or the floor's stand-in) in processes of their own, as on machines of their
    own: `main(fabric, url, k, n, conn)` runs the k-th of n and answers the pipe (_serve)."""

    def __init__(self, fabric, url: str, n: int, main):
        ctx = multiprocessing.get_context("fork")
        self.conns, self.procs = [], []
        for k in range(1, n + 1):
            conn, child = ctx.Pipe()
            p = ctx.Process(target=main, args=(fabric, url, k, n, child), daemon=True)
            p.start()
            self.conns.append(conn)
            self.procs.append(p)
        for c in self.conns:
            c.recv()                                   # leading

    def _ask(self, what: str) -> list:
        for c in self.conns:
            c.send(what)
        return [c.recv() for c in self.conns]

    def cpu(self) -> list[float]:
        return [proc_cpu(p.pid) for p in self.procs]

    def settled(self):
        self._ask("settled")

    def counters(self) -> dict:
        out: dict = {}
        for c in self._ask("counters"):
            for k, v in c.items():
                out[k] = out.get(k, 0) + v
        return out

    def close(self):
        for c in self.conns:
            c.send(None)
        for p in self.procs:
            p.join(5)


def _serve(conn, settle, counters):
    """A coordinator process's side of Processes' pipe, until told to stop."""
    conn.send("leading")
    while (msg := conn.recv()) is not None:
        if msg == "settled":
            settle()
            conn.send(True)
        else:
            conn.send(counters())


def _shard_main(fabric, url: str, k: int, n: int, conn):
    """--shards N: the leader of shard k of n (rlbcoord run --shard K/N)."""
    shard = Shard(k, n)
    coord = EtcdCoordination(Coordinator(fabric, host_timeout_s=1e9), client_of(url), f"bench-{shard.index}",
                             lease_ttl_s=10, shard=shard)
    coord.start()
    while not coord.leading.is_set():
        time.sleep(0.01)
    _serve(conn, lambda: settled(coord), lambda: {**coord.counters, "solves": coord.coord.counters["solves"],
                                                  "solve s": coord.coord.counters["solve_seconds"]})
    coord.stop.set()


class Echo:
    """--floor: what the loop costs with no placing at all. It follows the hosts' keys as the
    coordinator does and writes each host's placements back at once, every QP on the path its
    host gave it, batched as the coordinator batches (whatever came while the last write was
    out goes in the next); no model, no solve, no link loads, no fencing. Its latency is the
    floor this machine puts under any coordinator: etcd's two transactions, two watches, and
    the CPU they share with the hosts' writers."""

    def __init__(self, url: str):
        self.etcd = client_of(url)
        self.stop, self.cond = threading.Event(), threading.Condition()
        self.qps: dict[str, dict[str, dict]] = {}      # host -> part -> {QpId: path}
        self.written: dict[str, str] = {}              # placement key -> value as written
        self.dirty: set[str] = set()
        self.busy = False
        self.counters = {"placements_written": 0, "batches": 0, "solves": 0, "solve s": 0.0}
        _, rev = self.etcd.get_prefix(keys.hosts_root())
        threading.Thread(target=self._follow, args=(rev,), daemon=True).start()
        threading.Thread(target=self._write, daemon=True).start()

    def _follow(self, rev: int):
        for events, _ in self.etcd.watch_prefix(keys.hosts_root(), rev + 1, self.stop):
            with self.cond:
                for e in events:
                    _, host, rest = keys.split(e.kv.key)
                    if e.kind == "put" and rest.startswith("qps/"):
                        got = keys.read_qps(rest[4:], e.kv.value)
                        self.qps.setdefault(host, {})[rest] = {q: v["path"] for q, v in got.items()}
                        self.dirty.add(host)
                self.cond.notify_all()

    def _write(self):
        while not self.stop.is_set():
            with self.cond:
                self.cond.wait_for(lambda: self.dirty or self.stop.is_set())
                hosts, self.dirty, self.busy = self.dirty, set(), True
                placed = {h: {q: p for part in self.qps[h].values() for q, p in part.items()} for h in hosts}
            out = {}
            for h, qps in placed.items():
                for k, v in keys.placement_parts(qps).items():
                    if self.written.get(keys.placement_key(h, k)) != v:
                        out[keys.placement_key(h, k)] = v
            self.etcd.apply_parallel(out)
            self.written.update(out)
            with self.cond:
                self.counters["placements_written"] += len(out)
                self.counters["batches"] += 1
                self.busy = False
                self.cond.notify_all()

    def settled(self):
        with self.cond:
            self.cond.wait_for(lambda: not self.dirty and not self.busy)


def _echo_main(fabric, url: str, k: int, n: int, conn):
    echo = Echo(url)
    _serve(conn, echo.settled, lambda: dict(echo.counters))
    echo.stop.set()


def settled(coord: EtcdCoordination):
    """Wait until the placer has finished its batch and counted it (its last writes can reach
    the watch before the writing call returns)."""
    while True:
        with coord.placing:
            pass
        time.sleep(0.05)
        with coord.lock:
            idle = not coord.dirty
        if idle and not coord.wake.is_set() and coord.placing.acquire(blocking=False):
            coord.placing.release()
            if coord.flushed(60):
                return


def placement_keys(host: str, w: HostWrite) -> set[tuple[str, str]]:
    """The QPs a host's write brings, as PlacementWatch notes them."""
    return {(host, name) for name in w.new}


def moved(watch: HostsWatch, writes: dict[str, HostWrite]) -> tuple[int, int]:
    """(QPs the placement put on another path than their host's rule, QPs written)."""
    n = out = 0
    for h, w in writes.items():
        for name, path in w.new.items():
            n += 1
            out += watch.path.get((h, name)) != path
    return out, n


def share(got: tuple[int, int]) -> str:
    return f"{got[0]} of {got[1]} ({100 * got[0] / max(1, got[1]):.0f} %)"


def latencies(watch: HostsWatch, writes: dict[str, HostWrite], written_at: dict[str, tuple[float, float]],
              acked: bool = False) -> list[float]:
    """Per host: from its write (sent, or `acked` by etcd: the coordinator's and the watch's
    share alone) to the last of its QPs' placements appearing."""
    return sorted(max(watch.seen[k] for k in placement_keys(h, w)) - written_at[h][acked]
                  for h, w in writes.items() if placement_keys(h, w) <= watch.seen.keys())


def figures(lat: list[float]) -> str:
    if not lat:
        return "none placed"
    p99 = lat[math.ceil(0.99 * len(lat)) - 1]          # nearest rank: never below the median
    return f"{statistics.median(lat) * 1000:.0f} / {p99 * 1000:.0f} ms (max {lat[-1] * 1000:.0f})"


def run_etcd(fabric, writes: dict[str, HostWrite], collectives: list[dict[str, HostWrite]], workers: int,
             threads: int, singles: int, rule: LocalRule, hk: HostKeys, pin: bool = False,
             tls: bool = False) -> tuple[dict, dict]:
    """The burst (every host at once), then in the loaded fabric each collective's hosts adding
    QPs at once (one collective after another), then `singles` hosts adding QPs one after
    another. `pin`: the coordinator (this process) alone on the last CPU, etcd and the writers
    on the others, as when each runs on machines of its own (on 2 cores etcd and the hosts'
    writers then share one, which starves etcd: meant for machines with more)."""
    work = Path(tempfile.mkdtemp(prefix="rlb-etcdbench-"))
    cpus = others = None
    if pin:
        cpus = sorted(os.sched_getaffinity(0))
        if len(cpus) < 2:
            raise SystemExit("--pin needs 2 CPUs or more")
        others = set(cpus[:-1])
        os.sched_setaffinity(0, others)              # etcd inherits the others
    global TLS_DIR
    if tls:
        TLS_DIR = work / "pki"
        etcdtls.issue(None, TLS_DIR, ["127.0.0.1"])
    server = EtcdServer(work, client_port=free_port(), peer_port=free_port(), tls=TLS_DIR).start()
    if pin:
        os.sched_setaffinity(0, {cpus[-1]})          # the coordinator's threads
    hosts = watch = coords = None
    try:
        client = client_of(server.url)
        # the hosts' processes first: forked before the coordinator's threads exist
        # processes before threads: the shards' coordinators, the hosts' writers, their watch
        coords = (Processes(fabric, server.url, 1, _echo_main) if FLOOR else
                  Processes(fabric, server.url, SHARDS, _shard_main) if SHARDS > 1 else None)
        hosts = Writers(server.url, workers, threads, others)
        watch = HostsWatch(server.url, others)
        coords = coords or InProcess(fabric, server.url)
        lease = client.lease_grant(600)
        time.sleep(0.3)
        t0, cpu0 = time.monotonic(), cpu_now(server, hosts, coords)
        written_at = hosts.write(writes, lease)
        t_written = time.monotonic() - t0
        watch.wait(set().union(*(placement_keys(h, w) for h, w in writes.items())), 600)
        total = time.monotonic() - t0
        coords.settled()
        lat = latencies(watch, writes, written_at)
        c = coords.counters()
        n_keys = sum(len(w.puts) for w in writes.values())
        cpu = cpu_now(server, hosts, coords)
        out = {"hosts placed": f"{len(lat)}/{len(writes)}",
               "latency median / p99 (max)": figures(lat),
               "... from etcd's acknowledgement": figures(latencies(watch, writes, written_at, acked=True)),
               "all placed after s": round(total, 2), "writes took s": round(t_written, 2),
               "host keys written": n_keys, "placement keys written": c["placements_written"],
               "QPs moved from their host's path": share(moved(watch, writes)),
               "etcd keys/s (in + out)": round((n_keys + c["placements_written"]) / total),
               "transactions in": len(writes), "coordinator batches": c["batches"],
               "solves": c["solves"],
               "solve s": round(c["solve s"], 2),
               "CPU s: coordinator, etcd, hosts' writers": cpu_spent(cpu0, cpu),
               # nothing changes, nothing is written: lease keepalives go to etcd alone
               "steady state: coordinator cores": 0}
        # collectives start beside the placed ones, one after another
        more = {}
        for later in collectives:
            cpu0, t0 = cpu_now(server, hosts, coords), time.monotonic()
            at = hosts.write(later, lease)
            watch.wait(set().union(*(placement_keys(h, w) for h, w in later.items())), 600)
            t_c = time.monotonic() - t0
            coords.settled()
            lat_c = latencies(watch, later, at)
            cpu1 = cpu_now(server, hosts, coords)
            more[f"a collective of {len(later)} hosts x {len(next(iter(later.values())).new)} QPs beside them"] = (
                f"{figures(lat_c)} ({figures(latencies(watch, later, at, acked=True))} from etcd's "
                f"acknowledgement); all after {t_c:.2f} s, CPU s: coordinator, etcd, writers {cpu_spent(cpu0, cpu1)}; "
                f"moved from their host's path {share(moved(watch, later))}")
        # one host at a time, the fabric full
        lat_1 = []
        later = collectives[-1]
        for h in list(later)[:singles]:
            _, w = _more_qps(h, later[h], random.Random(h), rule, hk)
            sent = time.monotonic()
            client.apply(w.puts, lease=lease)
            watch.wait(placement_keys(h, w), 30)
            lat_1 += latencies(watch, {h: w}, {h: (sent, sent)})
        lat_1.sort()
        more[f"one host's {len(next(iter(later.values())).new)} new QPs, {singles} hosts in turn"] = figures(lat_1)
        return out, more
    finally:
        if coords is not None:
            coords.close()
        if watch is not None:
            watch.close()
        if hosts is not None:
            hosts.close()
        server.stop()
        shutil.rmtree(work, ignore_errors=True)


def _more_qps(host: str, like: HostWrite, rnd: random.Random, rule: LocalRule,
              hk: HostKeys) -> tuple[str, HostWrite]:
    """New QPs of `host` towards the peers of `like` (fresh source ports and QP numbers), each
    on the path its host's rule gives it."""
    new = {}
    for name in like.new:
        peer, _, _ = keys.parse_qp_name(name)
        new[(peer, 49152 + rnd.randrange(16384), rnd.getrandbits(24))] = {"active": True, "path": rule.path(host)}
    return host, HostWrite(hk.write(host, new), {keys.qp_name(q): v["path"] for q, v in new.items()})


def run_http(fabric, bodies: dict[str, dict], workers: int) -> dict:
    """The same reports to the in-process HTTP coordinator's model (no network: its cost alone)."""
    coord = Coordinator(fabric, host_timeout_s=1e9)
    lat = []
    t0 = time.monotonic()
    cpu0 = time.process_time()
    lock = threading.Lock()

    def post(host):
        t = time.monotonic()
        coord.report(host, bodies[host])
        with lock:
            lat.append(time.monotonic() - t)
    with ThreadPoolExecutor(workers) as ex:
        list(ex.map(post, list(bodies)))
    total = time.monotonic() - t0
    cpu = time.process_time() - cpu0
    lat.sort()
    return {"hosts placed": f"{len(lat)}/{len(bodies)}",
            "latency median / p99 (max)": figures(lat),
            "all placed after s": round(total, 2), "solves": coord.counters["solves"],
            "solve s": round(coord.counters["solve_seconds"], 2),
            "CPU s: coordinator, etcd, hosts' writers": f"{cpu:.2f}, -, -",
            # every host reports every QP every 250 ms whether or not anything changed
            "steady state: coordinator cores": round(cpu * 4, 2),
            "reports/s to keep it current (every 250 ms)": len(bodies) * 4,
            "QP records/s": sum(len(b["qps"]) for b in bodies.values()) * 4}


def _sizes(text: str) -> list[int]:
    try:
        sizes = [int(x) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: host counts separated by commas, e.g. 64,512") from None
    if not sizes or min(sizes) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: each collective has 1 host or more")
    return sizes


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--leaves", type=int, default=32)
    ap.add_argument("--hosts", type=int, default=32, help="hosts per leaf")
    ap.add_argument("--spines", type=int, default=8)
    ap.add_argument("--qps", type=int, default=8, help="fabric QPs per host (a permutation's peers)")
    ap.add_argument("--workers", type=int, default=8, help="writer processes for etcd (threads for HTTP)")
    ap.add_argument("--threads", type=int, default=16, help="hosts writing at once in each etcd writer process")
    ap.add_argument("--collective", type=_sizes, default=[512], help="hosts of the collective that starts "
                    "once the first QPs are placed")
    ap.add_argument("--singles", type=int, default=30, help="hosts that then add QPs one after another")
    ap.add_argument("--qp-keys", choices=("parts", "per-qp"), default="parts",
                    help="how hosts write their QPs: a few keys a host (as rlbhost does), or one key "
                    "per QP (as it did before; the coordinator still reads them)")
    ap.add_argument("--start", choices=("local", "one"), default="local",
                    help="the path a host puts a new QP on before its placement comes: its local rule's "
                    "(as rlbhost does), or path 1 for all (the coordinator moves most: its worst case)")
    ap.add_argument("--pin", action="store_true", help="the coordinator alone on the last CPU, etcd and "
                    "the hosts' writers on the others (its share measured apart from theirs; on 2 CPUs "
                    "etcd starves)")
    ap.add_argument("--place-every-ms", type=float, default=None,
                    help="the coordinator's PLACE_EVERY_S, in ms (default: the code's; 0: a solve "
                    "whenever anything changed, as before batching)")
    ap.add_argument("--tls", action="store_true", help="etcd over TLS with client certificates "
                    "(--client-cert-auth), as a site runs it: what TLS costs etcd, the coordinator and the hosts")
    ap.add_argument("--shards", type=int, default=1, help="coordinators placing a run of the leaves each "
                    "(rlbcoord run --shard K/N), each in a process of its own")
    ap.add_argument("--floor", action="store_true", help="no coordinator: a stand-in that writes each "
                    "host's placements back as it wrote them, at once (Echo): the latency this machine's "
                    "etcd, watches and writers alone put under any coordinator")
    a = ap.parse_args()
    global SHARDS, FLOOR
    SHARDS, FLOOR = a.shards, a.floor
    if a.place_every_ms is not None:
        etcdrun.PLACE_EVERY_S = a.place_every_ms / 1000
    fabric = model_fabric(a.leaves, a.hosts, a.spines)
    rnd = random.Random(1)
    rule = LocalRule(fabric, a.start)
    hk = HostKeys(a.qp_keys)
    conns = workloads.connections("permutation", fabric.hosts, rnd)
    peer_of = {}
    for s, d in conns:
        peer_of.setdefault(s, []).append(d)
    writes, bodies = {}, {}
    for h in fabric.hosts:
        peers = [p for p in peer_of.get(h, []) if fabric.leaf_of_host(p)[0] is not fabric.leaf_of_host(h)[0]]
        if peers:
            writes[h], bodies[h] = host_writes(fabric, h, peers, a.qps, rnd, rule, hk)
    first = "the path its host's rule gives it" if a.start == "local" else "path 1"
    print(f"{a.leaves} leaves x {a.hosts} hosts x {a.spines} spines: {len(writes)} hosts start "
          f"{a.qps} fabric QPs each at once ({len(writes) * a.qps} QPs), each first on {first}"
          f"{'; etcd over TLS with client certificates' if a.tls else ''}")
    http = run_http(fabric, bodies, a.workers)
    collectives, at, order = [], 0, list(writes)
    for n in a.collective:                     # each collective's hosts, apart from the others'
        names = [order[(at + i) % len(order)] for i in range(n)]
        collectives.append(dict(_more_qps(h, writes[h], rnd, rule, hk) for h in names))
        at += n
    etcd, more = run_etcd(fabric, writes, collectives, a.workers, a.threads, a.singles, rule, hk, a.pin, a.tls)
    names = list(dict.fromkeys([*etcd, *http]))
    print(f"{'every host at once':<44}{'etcd (rlbcoord --etcd)':>30}{'HTTP (rlbcoord)':>30}")
    for n in names:
        print(f"{n:<44}{str(etcd.get(n, '')):>30}{str(http.get(n, '')):>30}")
    print("then, with every QP above placed (etcd):")
    for n, v in more.items():
        print(f"  {n}: {v}")


if __name__ == "__main__":
    main()
