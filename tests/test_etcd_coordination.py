"""Coordinators on a real etcd (Debian's etcd-server, authentication on), run as the `rlbcoord run
--etcd` processes an operator starts: hosts' and leaves' keys in, placements out, one leader and a
standby that takes over without moving a placed QP, a host whose lease ends leaves the model.
Hosts are written here as their own etcd users (what rlbhost --etcd writes)."""
from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from collections import Counter
from pathlib import Path

import pytest

from rlbcommon import coordapi
from rlbcommon.etcd import PERMISSION_DENIED, Etcd, EtcdError
from rlbcommon.health import Health
from rlbcommon.runtime import AgentRuntime
from rlbcoord import etcdauth, etcdrun, keys
from rlbcoord.etcdrun import EtcdCoordination
from rlbcoord.metrics import EtcdCollector
from rlbcoord.service import Coordinator
from rlbfabric.fabric import load
from rlblab.etcdserver import EtcdServer

from .relay import Relay
from .test_coordinator import FakeHostDataplane, addr, paths
from .test_etcd_identity import free_port

FABRIC_FILE = Path(__file__).resolve().parent.parent / "lab" / "fabric.toml"
FABRIC = load(FABRIC_FILE)


def etcd_with_users(fabric, tmp_path_factory):
    """A real etcd member with a user for every machine of `fabric` (their passwords in
    server.creds) and authentication on, until the generator ends."""
    work = tmp_path_factory.mktemp("etcd")
    # the lab's timing (rlblab): a lease's floor is 1.5 election timeouts
    server = EtcdServer(work, client_port=free_port(), peer_port=free_port(), fast=True).start()
    creds = tmp_path_factory.mktemp("creds")
    try:
        etcdauth.issue(fabric, [server.url], creds)
        server.creds = creds
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def etcd(tmp_path_factory):
    yield from etcd_with_users(FABRIC, tmp_path_factory)


def user(etcd, name: str) -> Etcd:
    return Etcd(etcd.url, name, etcdauth.read_password(etcdauth.password_file(etcd.creds, name)))


class Coord:
    """One `rlbcoord run --etcd` process."""

    def __init__(self, etcd, name: str, work: Path, fabric_file: Path = FABRIC_FILE, args: tuple = ()):
        self.port = free_port()
        self.log = work / f"coord-{name}.log"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "rlbcoord.cli", "run", "--fabric", str(fabric_file),
             "--listen", "::1", "--port", str(self.port), "--etcd", etcd.url, "--name", name,
             "--lease-ttl-s", "1", *args,
             "--etcd-password-file", str(etcdauth.password_file(etcd.creds, keys.COORDINATOR_USER))],
            stdout=open(self.log, "w"), stderr=subprocess.STDOUT, start_new_session=True)
        self.url = coordapi.url_for("::1", self.port)

    def status(self) -> dict | None:
        try:
            return coordapi.call(self.url, coordapi.STATUS, timeout=1.0)
        except coordapi.CoordinatorError:
            return None

    def leading(self) -> bool:
        s = self.status()
        return bool(s and s["etcd"]["leading"])

    def kill(self):
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


@pytest.fixture
def coords(etcd, tmp_path):
    admin = user(etcd, etcdauth.ROOT_USER)
    admin.delete_prefix(keys.ROOT)
    started = [Coord(etcd, n, tmp_path) for n in ("ca", "cb")]
    try:
        wait(lambda: sum(c.leading() for c in started) == 1, 15, "one leader")
        yield started
    finally:
        for c in started:
            c.kill()
        admin.delete_prefix(keys.ROOT)


def wait(cond, timeout: float, what: str) -> float:
    t0 = time.monotonic()
    while not cond():
        if time.monotonic() - t0 > timeout:
            raise AssertionError(f"waited {timeout} s for {what}")
        time.sleep(0.01)
    return time.monotonic() - t0


def write_host(client: Etcd, host: str, qps: list[tuple[str, int, int, int]], lease: int) -> None:
    """A host's report and QPs (peer host, sport, qp, path it is on), as rlbhost --etcd writes them."""
    puts = {keys.report_key(host): json.dumps({"paths": paths(host), "weights": [
        {"prefix": "::/0", "weights": {"1": 1, "2": 1, "3": 1, "4": 1}}]})}
    puts.update(qp_parts(host, {(addr(peer, 1), sport, qp): {"path": path, "active": True}
                                for peer, sport, qp, path in qps}))
    client.apply(puts, lease=lease)


def qp_parts(host: str, qps: dict) -> dict[str, str]:
    """A host's QP keys and values, as rlbhost --etcd writes them."""
    n = keys.host_part_count(len(qps))
    return {keys.qp_part_key(host, k): v for k, v in keys.qp_parts(qps, n).items()}


def placements(etcd, host: str) -> dict:
    """{QP: (path value, revision its key was last written at)}, as the host reads them."""
    kvs, _ = user(etcd, keys.host_user(host)).get_prefix(keys.placements_prefix(host))
    return {q: (p, kv.mod_revision) for kv in kvs
            for q, p in keys.read_placements(kv.key[len(keys.placements_prefix(host)):], kv.value).items()}


def test_placements_come_back_through_etcd_and_a_standby_takes_over_without_moving_any(etcd, coords):
    h1 = user(etcd, keys.host_user("h1"))
    lease = h1.lease_grant(10)
    write_host(h1, "h1", [("h3", 50000 + i, i, 1) for i in range(8)], lease)
    took = wait(lambda: len(placements(etcd, "h1")) == 8, 5, "h1's 8 placements")
    placed = placements(etcd, "h1")
    assert sorted(Counter(p for p, _ in placed.values()).values()) == [2, 2, 2, 2], placed
    print(f"\n8 QPs placed {took * 1000:.0f} ms after they were written")
    leader = next(c for c in coords if c.leading())
    standby = next(c for c in coords if c is not leader)
    # the hosts move their QPs where they were placed (what rlbhost does for idle or new QPs)
    write_host(h1, "h1", [("h3", 50000 + i, i, placed[(addr("h3", 1), 50000 + i, i)][0])
                          for i in range(8)], lease)
    time.sleep(0.5)
    assert placements(etcd, "h1") == placed                      # nothing to rewrite
    leader.kill()                                                # no goodbye: the lease must end
    took = wait(standby.leading, 5, "the standby to lead")
    assert took < 2.0, took
    time.sleep(0.5)                                              # it has solved and compared
    s = standby.status()
    assert s["etcd"]["counters"]["takeovers"] == 1 and s["qps"]["fabric"] == 8, s
    assert placements(etcd, "h1") == placed                      # not one QP moved, nothing rewritten
    print(f"standby leads {took:.2f} s after the leader was killed")
    # and it places: a new QP of h2's is placed by the new leader
    h2 = user(etcd, keys.host_user("h2"))
    write_host(h2, "h2", [("h4", 40000, 77, 1)], h2.lease_grant(10))
    wait(lambda: len(placements(etcd, "h2")) == 1, 3, "h2's placement from the new leader")


def test_a_dead_uplink_reported_by_its_leaf_takes_its_path_away(etcd, coords):
    h1, l1 = user(etcd, keys.host_user("h1")), user(etcd, keys.switch_user("l1"))
    lease = h1.lease_grant(10)
    l1.put(keys.uplinks_key("l1"), json.dumps({"eth-s1": True, "eth-s2": True, "eth-s3": True, "eth-s4": False}))
    write_host(h1, "h1", [("h3", 50000 + i, i, 4) for i in range(6)], lease)
    wait(lambda: len(placements(etcd, "h1")) == 6, 5, "h1's placements")
    got = Counter(p for p, _ in placements(etcd, "h1").values())
    assert 4 not in got and sorted(got.values()) == [2, 2, 2], got
    # another leaf cannot say l1's links are down
    l2 = user(etcd, keys.switch_user("l2"))
    with pytest.raises(EtcdError) as e:
        l2.put(keys.uplinks_key("l1"), json.dumps({"eth-s1": False}))
    assert e.value.code == PERMISSION_DENIED


def test_a_host_whose_lease_ends_leaves_the_model_and_its_placements_go(etcd, coords):
    h1, h2 = user(etcd, keys.host_user("h1")), user(etcd, keys.host_user("h2"))
    l1, l2 = h1.lease_grant(10), h2.lease_grant(10)
    write_host(h1, "h1", [("h3", 50000 + i, i, 1) for i in range(4)], l1)
    write_host(h2, "h2", [("h4", 40000 + i, i, 1) for i in range(4)], l2)
    wait(lambda: len(placements(etcd, "h1")) == 4 and len(placements(etcd, "h2")) == 4, 5, "placements")
    h1.lease_revoke(l1)                                          # as its expiry would, at once
    wait(lambda: not placements(etcd, "h1"), 3, "h1's placements to go")
    leader = next(c for c in coords if c.leading())
    s = leader.status()
    assert s["qps"]["fabric"] == 4 and "h1" not in s["hosts"], s
    # a report over HTTP is refused: reports come through etcd, each writer known
    with pytest.raises(coordapi.CoordinatorError, match="403"):
        coordapi.call(leader.url, coordapi.REPORT.format("h1"), {"paths": paths("h1"), "qps": []})


def test_the_host_client_writes_changes_only_and_applies_watched_placements(etcd, coords):
    """rlbhost --etcd's client (the data plane in memory, as in test_coordinator): 4 QPs on path
    1 are placed one per path; a round with nothing new writes nothing; a QP going idle is one
    write; etcd gone, the placements stay for fallback_s, then the local rule decides."""
    from rlbhost.etcdclient import EtcdCoordinatorClient
    live = [{"peer": addr("h3", 1), "sport": 50000 + i, "qp": i, "path": 0, "idle_ms": 1, "active": True,
             "bytes": 10} for i in range(4)]
    dp = FakeHostDataplane("h1", live)
    client = EtcdCoordinatorClient(dp, "h1", user(etcd, keys.host_user("h1")), fallback_s=0.0)
    try:
        assert client.report_once() == 2                         # the report, and one key for 4 QPs
        kvs, _ = user(etcd, keys.host_user("h1")).get_prefix(keys.qps_prefix("h1"))
        assert [len(keys.read_qps(kv.key[len(keys.qps_prefix("h1")):], kv.value)) for kv in kvs] == [4]
        wait(lambda: sorted(dp.placed.values()) == [0, 1, 2, 3], 3, "placements in the data plane")
        moved = 0
        for q in live:                                           # the host moves them (idle, then new)
            new = dp.placed[(q["peer"], q["sport"], q["qp"])]
            moved += new != q["path"]
            q["path"] = new
        assert moved == 3 and client.report_once() == 1         # their key, once
        assert client.report_once() == 0                         # nothing changed: nothing written
        dp._qps = live[1:]                                       # one idle: swept from conntrack
        live[0]["active"] = False
        idle = client.memory[(live[0]["peer"], live[0]["sport"], live[0]["qp"])]
        idle["active"] = False
        assert client.report_once() == 0                         # a pause between iterations: no news
        idle["seen"] -= 1.0                                      # idle for a second: one write
        assert client.report_once() == 1
        time.sleep(0.3)
        assert sorted(dp.placed.values()) == [0, 1, 2, 3]        # nothing moved for it
        client.etcd = client.leases.etcd = Etcd("http://127.0.0.1:1", timeout=0.2)   # etcd gone: seen
        wait(lambda: client.leases.failing, 3, "a keepalive unanswered")     # at the next keepalive
        client.leases.kept_alive -= 3.0                          # (and none answered for 2/3 of the lease)
        with pytest.raises(coordapi.CoordinatorError):
            client.report_once()
        client._failed(coordapi.CoordinatorError("gone"))
        assert dp.placed == {} and client.counters["fallbacks"] == 1
    finally:
        client.stop.set()
        client.leases.stop.set()


def test_a_host_with_many_qps_writes_them_in_parts_that_split_and_merge(etcd):
    """200 QPs are 4 keys (64 a key or fewer on average); a QP that moves rewrites one of them;
    down to 20 QPs they are one key again and the others are deleted. etcd holds exactly the
    host's QPs throughout."""
    from rlbhost.etcdclient import EtcdCoordinatorClient
    admin = user(etcd, etcdauth.ROOT_USER)
    admin.delete_prefix(keys.ROOT)
    live = [{"peer": addr("h3", 1 + i % 4), "sport": 50000 + i, "qp": i, "path": 0, "idle_ms": 0,
             "active": True, "bytes": 10} for i in range(200)]           # all on path 1 (index 0)
    dp = FakeHostDataplane("h1", live)
    client = EtcdCoordinatorClient(dp, "h1", user(etcd, keys.host_user("h1")), memory_s=0.3)

    def in_etcd() -> tuple[int, dict]:
        kvs, _ = admin.get_prefix(keys.qps_prefix("h1"))
        qps = {}
        for kv in kvs:
            got = keys.read_qps(kv.key[len(keys.qps_prefix("h1")):], kv.value)
            assert not qps.keys() & got.keys()
            qps.update(got)
        return len(kvs), {q: v["path"] for q, v in qps.items()}
    try:
        assert client.report_once() == 5                         # the report and 4 parts
        n, qps = in_etcd()
        assert n == 4 and qps == {(q["peer"], q["sport"], q["qp"]): 1 for q in live}
        live[7]["path"] = 1                                      # to path 2
        assert client.report_once() == 1                         # one part rewritten
        assert in_etcd()[1][(live[7]["peer"], live[7]["sport"], 7)] == 2
        dp._qps = live[:20]
        time.sleep(0.4)                                          # the others forgotten
        client.report_once()
        n, qps = in_etcd()
        assert n == 1 and qps == {(q["peer"], q["sport"], q["qp"]): q["path"] + 1 for q in live[:20]}
    finally:
        client.stop.set()
        admin.delete_prefix(keys.ROOT)


def test_the_coordinators_link_loads_reach_the_verbs_librarys_view_through_etcd(etcd, coords):
    """A verbs QP decided on h1 (path 2, fixed) is written as h1's; the leader writes l1's and
    l2's link loads, which h1's view (what new verbs QPs are placed by) receives by its watch."""
    from rlbhost.dataplane import VerbsQp
    from rlbhost.etcdclient import EtcdCoordinatorClient
    from rlbhost.verbs.advice import FabricView
    dp = FakeHostDataplane("h1", [])
    h3 = addr("h3", 1)
    dp._verbs = [VerbsQp(h3, addr("h3", 2), 0x11, 0x21, 1, 0, 1, flags=1)]   # decided here, path 2
    view = FabricView(FABRIC, "h1")
    client = EtcdCoordinatorClient(dp, "h1", user(etcd, keys.host_user("h1")), view=view)
    try:
        client.report_once()
        wait(lambda: view.links is not None and view.links["up"]["load"] == [0, 1, 0, 0], 3, "l1's loads")
        assert view.links["down"]["l2"]["load"] == [0, 1, 0, 0]
        assert view.best(addr("h4", 1), {1, 2, 3, 4}) == {1, 3, 4}      # path 2 holds the fixed QP
        client.report_once()                                            # fresh while the watch is
        assert view.best(addr("h4", 1), {1, 2, 3, 4}) == {1, 3, 4}
        with pytest.raises(EtcdError) as e:                             # hosts read loads, never write
            user(etcd, keys.host_user("h1")).put(keys.links_prefix() + "l1", "{}")
        assert e.value.code == PERMISSION_DENIED
    finally:
        client.stop.set()


def test_a_coordinator_etcd_refuses_says_so_once_waits_and_never_leads(etcd, coords, tmp_path):
    """A wrong password (or authentication not on yet, the first seconds of a lab): one log
    line for the cause, retried once a second rather than in a tight loop, never the leader;
    /metrics says who leads and counts the refusals."""
    wrong = tmp_path / "wrong.password"
    wrong.write_text("not-the-password\n")
    wrong.chmod(0o600)
    port = free_port()
    log = tmp_path / "coord-wrong.log"
    proc = subprocess.Popen(
        [sys.executable, "-m", "rlbcoord.cli", "run", "--fabric", str(FABRIC_FILE), "--listen", "::1",
         "--port", str(port), "--etcd", etcd.url, "--name", "cw", "--etcd-password-file", str(wrong)],
        stdout=open(log, "w"), stderr=subprocess.STDOUT, start_new_session=True)
    try:
        url = coordapi.url_for("::1", port)

        wait(lambda: _answers(lambda: etcd_metrics(url)), 15, "the refused coordinator's /metrics")
        time.sleep(3.0)
        m = etcd_metrics(url)
        assert m["rlb_coord_etcd_leading"] == 0 and 2 <= m["rlb_coord_etcd_refusals_total"] <= 6, m
        lines = [ln for ln in log.read_text().splitlines() if "refuses" in ln]
        assert len(lines) == 1 and "authentication failed" in lines[0], log.read_text()
        leader = next(c for c in coords if c.leading())
        assert etcd_metrics(leader.url)["rlb_coord_etcd_leading"] == 1
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def etcd_metrics(url: str) -> dict[str, float]:
    """A coordinator's rlb_coord_etcd_* samples from its /metrics."""
    with urllib.request.urlopen(url + "/metrics", timeout=2) as r:
        text = r.read().decode()
    return {ln.split()[0].split("{")[0]: float(ln.split()[1]) for ln in text.splitlines()
            if ln.startswith("rlb_coord_etcd_")}


def _answers(fn) -> bool:
    try:
        return bool(fn())
    except OSError:
        return False


def test_a_host_whose_etcd_answers_slowly_keeps_its_lease_and_writes_only_changes(etcd):
    """Every request to etcd held 1.6 s, more than half the host's 3 s lease, its writes as slow
    as its keepalives: over 12 s of rounds, each writing a QP's new path, the host keeps its first
    lease (never writing everything again) and no round fails. The keepalive used to be sent by
    the report loop between writes: every 3.2 s here, and the lease ended each time."""
    from rlbhost.etcdclient import EtcdCoordinatorClient
    live = [{"peer": addr("h3", 1), "sport": 50000 + i, "qp": i, "path": 0, "idle_ms": 1, "active": True,
             "bytes": 10} for i in range(4)]
    dp = FakeHostDataplane("h1", live)
    proxy = Relay(urllib.parse.urlsplit(etcd.url).port, hold_s=1.6)
    slow = Etcd(proxy.url, keys.host_user("h1"),
                etcdauth.read_password(etcdauth.password_file(etcd.creds, keys.host_user("h1"))), timeout=3.0)
    client = EtcdCoordinatorClient(dp, "h1", slow, lease_ttl_s=3)
    failed, rounds, t0 = 0, 0, time.monotonic()
    try:
        while time.monotonic() - t0 < 12:
            live[rounds % 4]["path"] = (live[rounds % 4]["path"] + 1) % 4      # news every round
            try:
                client.report_once()
            except coordapi.CoordinatorError as e:
                failed += 1
                print("round failed:", e)
            rounds += 1
        lease = client.leases
        print(f"{rounds} rounds in 12 s, {client.counters['writes']} keys written, leases {client.counters['leases']}, "
              f"keepalives {lease.keepalives} ({lease.unanswered} unanswered), {proxy.held} requests held")
        assert failed == 0 and client.counters["leases"] == 1 and lease.unanswered == 0
        assert lease.keepalives >= 5                             # every 1.6 s, not every 3.2
        assert client.counters["writes"] <= rounds + 2           # the report and a QP key at first, then one a round
        assert user(etcd, keys.host_user("h1")).lease_keepalive(lease.id) > 0     # the first lease, alive
    finally:
        client.stop.set()
        client.leases.stop.set()
        proxy.close()


def test_a_host_etcd_refuses_asks_again_only_after_a_second(etcd):
    """Each authentication costs etcd a password hash: a host with a wrong password (or before
    authentication is on) must not ask ten times a second."""
    from rlbhost.etcdclient import REFUSED_BACKOFF_S, EtcdCoordinatorClient
    dp = FakeHostDataplane("h1", [])
    client = EtcdCoordinatorClient(dp, "h1", Etcd(etcd.url, keys.host_user("h1"), "wrong"))
    try:
        for _ in range(5):                                       # five rounds of 100 ms
            with pytest.raises(coordapi.CoordinatorError, match="authentication failed"):
                client.report_once()
        assert client.counters["refusals"] == 1
        time.sleep(REFUSED_BACKOFF_S)
        with pytest.raises(coordapi.CoordinatorError):
            client.report_once()
        assert client.counters["refusals"] == 2
    finally:
        client.stop.set()
        client.leases.stop.set()


@pytest.fixture
def inproc(etcd):
    """A coordinator in this process, leading, with nothing of an earlier test's in etcd."""
    admin = user(etcd, etcdauth.ROOT_USER)
    admin.delete_prefix(keys.ROOT)
    coord = EtcdCoordination(Coordinator(FABRIC, host_timeout_s=1e9), user(etcd, keys.COORDINATOR_USER),
                             "inproc", lease_ttl_s=1)
    coord.start()
    try:
        wait(coord.leading.is_set, 10, "the in-process coordinator to lead")
        assert coord.flushed(5)
        yield coord
    finally:
        coord.stop.set()
        coord.join(3.0)
        admin.delete_prefix(keys.ROOT)


def test_a_qp_that_changes_is_all_the_leader_reads_of_its_host(etcd, inproc, monkeypatch):
    """The follower feeds single QPs to the model: h1's 32 QPs are one key; h1 rewrites it with
    one QP idle and one gone, and the leader reads that one QP (not h1's 32), its placement of
    the gone one goes in one write of h1's placement key, and the rest stay where they were. An
    older host's key for one QP is read alike."""
    coord, admin = inproc, user(etcd, etcdauth.ROOT_USER)
    h1 = user(etcd, keys.host_user("h1"))
    lease = h1.lease_grant(10)
    write_host(h1, "h1", [("h3", 50000 + i, i, 1) for i in range(32)], lease)
    wait(lambda: len(placements(etcd, "h1")) == 32, 5, "h1's 32 placements")
    before = placements(etcd, "h1")
    assert len({rev for _, rev in before.values()}) == 1          # one key holds h1's 32
    assert len(admin.get_prefix(keys.qps_prefix("h1"))[0]) == 1  # and one key h1's QPs
    written = dict(coord.counters)
    read = []
    real = coord.coord._qp
    monkeypatch.setattr(coord.coord, "_qp", lambda *a: read.append(a[2]) or real(*a))
    h3 = addr("h3", 1)
    qps = {(h3, 50000 + i, i): {"path": 1, "active": True} for i in range(32)}
    qps[(h3, 50000, 0)] = {"path": 1, "active": False, "since": time.time()}
    gone = (h3, 50001, 1)
    del qps[gone]
    h1.apply(qp_parts("h1", qps), lease=lease)
    wait(lambda: gone not in placements(etcd, "h1"), 5, "the gone QP's placement to go")
    time.sleep(0.3)
    after = placements(etcd, "h1")
    assert len(read) == 1 and len(coord.coord.hosts["h1"]["keys"]) == 31, read
    assert {q: p for q, (p, _) in after.items()} == {q: p for q, (p, _) in before.items() if q != gone}
    assert coord.counters["placements_written"] - written["placements_written"] == 1
    assert coord.counters["placements_deleted"] == written["placements_deleted"]
    new = (h3, 50099, 99)                                       # as an older rlbhost writes it
    h1.put(keys.qp_key("h1", new), json.dumps({"path": 2, "active": True}), lease=lease)
    wait(lambda: new in placements(etcd, "h1"), 5, "the older key's QP placed")
    assert len(read) == 2 and len(coord.coord.hosts["h1"]["keys"]) == 32, read



def test_a_host_writing_more_qps_than_the_limit_is_refused_once_and_read_whole_when_within(etcd, inproc, caplog):
    """A host's etcd role bounds whose keys it writes, not how many QPs: a change that leaves h1
    more than the coordinator's host_qps_max is refused (said once while it lasts), h1's earlier
    placements kept; h1's next write within the limit is read whole, so the model holds exactly
    the QPs h1 then has (read as a change, it would miss those the refused writes brought)."""
    coord = inproc
    coord.coord.host_qps_max = 8
    h1 = user(etcd, keys.host_user("h1"))
    lease = h1.lease_grant(10)
    h3 = addr("h3", 1)
    write_host(h1, "h1", [("h3", 50000 + i, i, 1) for i in range(6)], lease)
    wait(lambda: len(placements(etcd, "h1")) == 6, 5, "h1's 6 placements")
    bad = coord.coord.counters["bad"]
    qps = {(h3, 50000 + i, i): {"path": 1, "active": True} for i in range(12)}
    with caplog.at_level(logging.WARNING, logger=etcdrun.__name__):
        h1.apply(qp_parts("h1", qps), lease=lease)
        wait(lambda: coord.coord.counters["bad"] == bad + 1, 5, "h1's 12 QPs refused")
        qps[(h3, 50012, 12)] = {"path": 2, "active": True}
        h1.apply(qp_parts("h1", qps), lease=lease)
        wait(lambda: coord.coord.counters["bad"] == bad + 2, 5, "h1's 13 QPs refused")
    said = [r.getMessage() for r in caplog.records if "report of h1 refused" in r.getMessage()]
    assert len(said) == 1 and "12 QPs: more than the 8" in said[0], said
    assert len(placements(etcd, "h1")) == 6 and len(coord.coord.hosts["h1"]["keys"]) == 6
    with coord.lock:                                            # the copy counts them, keeps none
        assert coord.reports["h1"]["qps"] == {} and sum(coord.reports["h1"]["over"].values()) == 13
    assert coord.status()["hosts_over"] == ["h1"]
    within = {(h3, 50000 + i, i): {"path": 1, "active": True} for i in range(6, 14)}   # 6-11 written before
    h1.apply(qp_parts("h1", within), lease=lease)
    wait(lambda: set(placements(etcd, "h1")) == set(within), 5, "h1's 8 QPs placed")
    assert {k[1:] for k in coord.coord.hosts["h1"]["keys"]} == set(within)
    assert "h1" not in coord._refused_hosts and coord.status()["hosts_over"] == []


def test_hold_a_host_writing_far_more_qps_than_allowed_costs_the_coordinator_a_count(etcd, inproc):
    """A host's etcd role bounds whose keys it writes, not how many QPs: h2 writes 40,000 (a host
    may have 1,000 placed here). The coordinator's copy of etcd keeps a count per key of h2's, not
    its QPs; h2's earlier placements stay, h1's are placed as before, the refusal is counted and
    exported (rlb_coord_etcd_hosts_over, alert RlbCoordHostOverQpLimit)."""
    coord = inproc
    coord.coord.host_qps_max = 1000
    h1, h2 = user(etcd, keys.host_user("h1")), user(etcd, keys.host_user("h2"))
    l1, l2 = h1.lease_grant(10), h2.lease_grant(10)
    write_host(h2, "h2", [("h4", 40000 + i, i, 1) for i in range(16)], l2)
    wait(lambda: len(placements(etcd, "h2")) == 16, 5, "h2's 16 placements")
    before = placements(etcd, "h2")
    h4 = addr("h4", 1)
    many = {(h4, 1024 + i % 60000, i): {"path": 1, "active": True} for i in range(40000)}
    parts = qp_parts("h2", many)
    assert len(parts) > 100                                     # written as a host writes them
    items = list(parts.items())
    for i in range(0, len(items), 64):                          # etcd takes 128 operations a txn
        h2.apply(dict(items[i:i + 64]), lease=l2)
    wait(lambda: coord.status()["hosts_over"] == ["h2"], 10, "h2 dropped from the copy")
    write_host(h1, "h1", [("h3", 50000 + i, i, 1) for i in range(8)], l1)
    wait(lambda: len(placements(etcd, "h1")) == 8, 5, "h1's 8 placements")
    with coord.lock:
        kept = sum(len(h["qps"]) for h in coord.reports.values())
        counted = sum(coord.reports["h2"]["over"].values())
    assert kept == 8 and counted >= 40000, (kept, counted)
    assert placements(etcd, "h2") == before                    # its earlier state kept
    assert len(coord.coord.hosts["h2"]["keys"]) == 16
    assert coord.counters["hosts_over"] >= 1
    got = {m.name: m.samples[0].value for m in EtcdCollector(coord.status).collect()}
    assert got["rlb_coord_etcd_hosts_over"] == 1


def test_placing_goes_on_while_etcd_holds_a_write_and_the_newest_placement_lands_last(etcd, inproc, monkeypatch):
    """A write etcd is slow to take does not hold up placing: while it waits, the placer places
    the next hosts; their placements wait in the outbox, a newer one replacing one not yet sent;
    then they go, in order, and etcd ends with the model's placements, each key written once
    per value that was sent."""
    coord = inproc
    gate, held = threading.Event(), threading.Event()
    real = coord.etcd.apply_parallel

    def slow(*a, **kw):
        held.set()
        # held until the test lets go (finally: gate.set()), however long its three waits of up
        # to 5 s take: with a hold of 10 s one CI run counted 2 below, which is what a hold that
        # ran out gives (h1's first write fails in the writer, only the newest two go)
        assert gate.wait(60)
        return real(*a, **kw)
    monkeypatch.setattr(coord.etcd, "apply_parallel", slow)
    h1, h2 = user(etcd, keys.host_user("h1")), user(etcd, keys.host_user("h2"))
    l1, l2 = h1.lease_grant(10), h2.lease_grant(10)
    written = coord.counters["placements_written"]
    try:
        write_host(h1, "h1", [("h3", 50000 + i, i, 1) for i in range(8)], l1)
        wait(held.is_set, 5, "the writer to hold h1's placements")
        batches = coord.counters["batches"]
        write_host(h2, "h2", [("h4", 40000 + i, i, 1) for i in range(8)], l2)
        wait(lambda: coord.counters["batches"] > batches, 5, "h2 placed while h1's write waits")
        batches = coord.counters["batches"]
        write_host(h2, "h2", [("h4", 40000 + i, i, 1) for i in range(6)], l2)    # 2 of h2's end
        write_host(h1, "h1", [("h3", 50000 + i, i, 1) for i in range(4)], l1)    # 4 of h1's end
        wait(lambda: coord.counters["batches"] > batches and len(json.loads(
            coord.outbox.get(keys.placement_key("h2", "part0"), "{}"))) == 6
            and len(json.loads(coord.outbox.get(keys.placement_key("h1", "part0"), "{}"))) == 4, 5,
            "the newest placements of both in the outbox")
        assert not placements(etcd, "h1") and not placements(etcd, "h2")      # nothing sent yet
    finally:
        gate.set()
    assert coord.flushed(5)
    model = coord.coord.all_placements()
    for host, n in (("h1", 4), ("h2", 6)):
        got = {q: p for q, (p, _) in placements(etcd, host).items()}
        assert len(got) == n and got == model[host], (host, got, model[host])
    # h1's first placements, then h1's and h2's newest: h2's first never went
    assert coord.counters["placements_written"] - written == 3


def test_link_loads_go_at_most_every_quarter_second_and_the_last_ones_arrive(etcd, inproc):
    """Every host watches the leaves' link loads: placements changing in every batch must not
    rewrite them every batch. 12 hosts' writes 20 ms apart make a dozen batches; the loads of
    each leaf are written at most once per LINKS_EVERY_S of it, and the last ones, held back,
    still arrive: etcd ends with the model's loads."""
    from rlbcoord.etcdrun import LINKS_EVERY_S
    coord = inproc
    before, batches = coord.counters["links_written"], coord.counters["batches"]
    h1 = user(etcd, keys.host_user("h1"))
    lease = h1.lease_grant(10)
    t0 = time.monotonic()
    for n in range(1, 13):
        write_host(h1, "h1", [("h3", 50000 + i, i, 1) for i in range(n)], lease)
        time.sleep(0.02)
    wait(lambda: len(placements(etcd, "h1")) == 12, 5, "h1's 12 placements")
    assert coord.flushed(5)
    time.sleep(LINKS_EVERY_S + 0.1)                  # the held-back loads are due
    assert coord.flushed(5)
    took = time.monotonic() - t0
    rounds = int(took / LINKS_EVERY_S) + 1
    leaves = len(FABRIC.leaves)
    assert coord.counters["batches"] - batches >= 6
    assert 0 < coord.counters["links_written"] - before <= rounds * leaves, (coord.counters, took)
    kvs, _ = user(etcd, etcdauth.ROOT_USER).get_prefix(keys.links_prefix())
    got = {kv.key[len(keys.links_prefix()):]: json.loads(kv.value)["loads"] for kv in kvs}
    assert got == json.loads(json.dumps(coord.coord.link_table()))
    assert got["l1"]["up"]["load"] == [3, 3, 3, 3] and got["l2"]["down"]["load"] == [3, 3, 3, 3]


def test_changes_that_keep_coming_are_placed_together_and_a_lone_one_at_once(etcd, inproc, monkeypatch):
    """A change after a quiet spell is placed at once; changes that follow it within
    PLACE_EVERY_S wait for the rest of it and go in one solve and one write, however many
    transactions they came in. Here the period is stretched to 0.6 s so that the three hosts'
    separate writes surely fall in it."""
    monkeypatch.setattr(etcdrun, "PLACE_EVERY_S", 0.6)
    coord = inproc
    time.sleep(0.7)                                  # quiet: the fixture's own solve is long past
    hs = {h: user(etcd, keys.host_user(h)) for h in ("h1", "h2", "h3")}
    leases = {h: c.lease_grant(10) for h, c in hs.items()}
    batches = coord.counters["batches"]
    t0 = time.monotonic()
    write_host(hs["h1"], "h1", [("h4", 50000 + i, i, 1) for i in range(4)], leases["h1"])
    first = wait(lambda: len(placements(etcd, "h1")) == 4, 5, "h1 placed")
    assert coord.counters["batches"] == batches + 1
    write_host(hs["h2"], "h2", [("h4", 40000 + i, i, 1) for i in range(4)], leases["h2"])
    write_host(hs["h3"], "h3", [("h1", 30000 + i, i, 1) for i in range(4)], leases["h3"])
    wait(lambda: len(placements(etcd, "h2")) == 4 and len(placements(etcd, "h3")) == 4, 5, "h2 and h3 placed")
    took = time.monotonic() - t0
    assert first < 0.5, first                        # not held back: nothing came before it
    assert took >= 0.6, took                         # the two that followed waited for the period
    assert coord.counters["batches"] == batches + 2, coord.counters   # ... and went in one solve


def test_what_an_earlier_term_of_leadership_left_unsent_is_never_written_in_a_later_one(etcd):
    """A coordinator that lost the leader key and won it again (a new term: a new create
    revision) drops what its earlier term left in the outbox, and a batch of the earlier term
    that reaches etcd late is refused by the fence without deposing the new term."""
    admin = user(etcd, etcdauth.ROOT_USER)
    admin.delete_prefix(keys.ROOT)
    me = user(etcd, keys.COORDINATOR_USER)
    coord = EtcdCoordination(Coordinator(FABRIC, host_timeout_s=1e9), me, "terms", lease_ttl_s=5)
    lease = me.lease_grant(5)

    def term() -> int:
        assert me.create(keys.leader_key(), "terms", lease)
        return me.get(keys.leader_key()).create_revision
    try:
        coord.leader_rev = first = term()
        coord.leading.set()
        stale, fresh = keys.placement_key("h1", "part0"), keys.placement_key("h2", "part0")
        coord._enqueue({stale: '{"fd00::1_1_1":1}'})
        admin.delete(keys.leader_key())                       # lost, and won again
        coord.leader_rev = term()
        assert coord._pending() == {}
        coord._enqueue({fresh: '{"fd00::2_2_2":2}'})
        assert coord.outbox == {fresh: '{"fd00::2_2_2":2}'}
        threading.Thread(target=coord.write, daemon=True).start()
        assert coord.flushed(5)
        assert admin.get(fresh) is not None and admin.get(stale) is None
        coord._fenced({stale: '{"fd00::1_1_1":1}'}, [], first)    # the earlier term's, late
        assert admin.get(stale) is None and coord.leading.is_set() and coord.counters["fenced"] == 1
    finally:
        coord.stop.set()
        me.lease_revoke(lease)
        admin.delete_prefix(keys.ROOT)


def _small_bench(script: str, *args: str) -> tuple[dict[str, list[str]], int, str]:
    """A bench of bench/ run at a small size (4 leaves x 4 hosts): its table's rows by name (the
    etcd column, then HTTP's), how many hosts it started, and all it printed."""
    bench = Path(__file__).resolve().parent.parent / "bench" / script
    out = subprocess.run([sys.executable, str(bench), *args, "--leaves", "4", "--hosts", "4", "--spines", "2",
                          "--collective", "4", "--singles", "2"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    rows = {line[:44].strip(): line[44:].split() for line in out.stdout.splitlines()}
    return rows, int(out.stdout.split(" hosts start ")[0].split()[-1]), out.stdout


def test_the_placement_bench_runs_with_etcd_in_the_loop():
    """`bench/placement_sim.py --etcd` (the issue's bench, grown to etcd: a real member, simulated
    hosts) at a small size: every host's QPs placed through etcd and over HTTP, none moved from
    the path its host's rule gave it, each host's keys written once."""
    rows, hosts, out = _small_bench("placement_sim.py", "--etcd")
    assert rows["hosts placed"] == [f"{hosts}/{hosts}"] * 2 and hosts > 8
    assert rows["QPs moved from their host's path"][:3] == ["0", "of", str(hosts * 8)]
    assert rows["host keys written"] == [str(2 * hosts)]            # its report and one part of QPs
    assert "moved from their host's path 0 of 32 (0 %)" in out      # the collective of 4 hosts


def test_the_placement_bench_measures_its_floor():
    """`--floor`: the same bench with a stand-in that writes each host's placements back as it
    wrote them (no coordinator): every host's QPs come back, one placement key a host, in
    batches, and nothing is solved."""
    rows, hosts, out = _small_bench("etcd_placement.py", "--floor")
    assert rows["hosts placed"][0] == f"{hosts}/{hosts}" and hosts > 8
    assert rows["placement keys written"] == [str(hosts)] and rows["solves"][0] == "0"
    assert 1 <= int(rows["coordinator batches"][0]) <= hosts
    assert rows["QPs moved from their host's path"][:3] == ["0", "of", str(hosts * 8)]
    assert "moved from their host's path 0 of 32 (0 %)" in out


@pytest.mark.parametrize("how", ["unreachable", "refused"])
def test_a_coordinator_waiting_on_etcd_is_not_taken_for_hung(etcd, how):
    """etcd down (nothing listens) or refusing (a wrong password) for longer than a round may
    take: the follower and the leadership loop retry, and the watchdog must not count them hung
    (it restarted the VM lab's coordinator every 10 minutes while its etcd timed out handshakes).
    Before: both loops hung after hang_s."""
    client = (Etcd(f"http://[::1]:{free_port()}", keys.COORDINATOR_USER, "x", timeout=0.3) if how == "unreachable"
              else Etcd(etcd.url, keys.COORDINATOR_USER, "not-the-password"))
    health = Health(hang_s=2.0)                # the refused retry waits 1 s
    coord = EtcdCoordination(Coordinator(FABRIC, host_timeout_s=1e9), client, "waits", lease_ttl_s=1,
                             retry_s=0.1, health=health)
    coord.start(AgentRuntime(logging.getLogger("test"), health))
    try:
        seen = set()
        for _ in range(60):                      # 6 s: three times what a round may take
            time.sleep(0.1)
            seen |= {name for name, _, _ in health.hung()}
        assert not seen, seen
        assert not coord.synced.is_set() and not coord.leading.is_set()
        assert health.snapshot().get("etcd-follower", {}).get("last_ok", 0.0) == 0.0   # waiting is not ok
    finally:
        coord.stop.set()
        coord.join(3.0)
