"""The fabric's etcd identities against a real etcd (Debian's etcd-server): each host and switch
may write only its own subtree and read its own placements; a report forged in another's name,
or a placement written by anyone but the coordinator, is refused by etcd itself (issue 31)."""
from __future__ import annotations

import stat
import threading
import time
from pathlib import Path

import pytest

from rlbcommon.etcd import PERMISSION_DENIED, Etcd, EtcdError, prefix_end
from rlbcoord import etcdauth, keys
from rlbfabric.fabric import load
from rlblab.etcdserver import EtcdServer

from .ports import free_port

LAB = Path(__file__).resolve().parent.parent / "lab"


@pytest.fixture(scope="module")
def etcd(tmp_path_factory):
    work = tmp_path_factory.mktemp("etcd")
    server = EtcdServer(work, client_port=free_port(), peer_port=free_port()).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def issued(etcd, tmp_path_factory):
    fabric = load(LAB / "fabric.toml")
    d = tmp_path_factory.mktemp("creds")
    first = etcdauth.issue(fabric, [etcd.url], d)
    return fabric, d, first


def as_user(etcd, d: Path, user: str) -> Etcd:
    return Etcd(etcd.url, user, etcdauth.read_password(etcdauth.password_file(d, user)))


def refused(call) -> bool:
    with pytest.raises(EtcdError) as e:
        call()
    return e.value.code == PERMISSION_DENIED


def test_prefix_end_covers_exactly_the_prefix():
    assert prefix_end("/rlb/hosts/h1/") == b"/rlb/hosts/h10"
    assert prefix_end(b"a\xff") == b"b" and prefix_end(b"\xff") == b"\0"


def test_every_machine_gets_a_user_and_a_password_only_root_reads(issued):
    fabric, d, first = issued
    want = {keys.host_user(h) for h in fabric.hosts} | {keys.switch_user(s.name) for s in fabric.switches} | \
        {keys.COORDINATOR_USER}
    assert set(first.users_added) == want and first.auth_enabled
    for user in [*want, etcdauth.ROOT_USER]:
        f = etcdauth.password_file(d, user)
        assert stat.S_IMODE(f.stat().st_mode) == 0o600 and len(f.read_text().strip()) >= 24
    assert stat.S_IMODE(d.stat().st_mode) == 0o700


def test_a_host_writes_its_own_keys_and_nobody_elses(etcd, issued):
    _, d, _ = issued
    h1 = as_user(etcd, d, keys.host_user("h1"))
    h1.put(keys.host_prefix("h1") + "qps/x", "1")
    assert h1.get(keys.host_prefix("h1") + "qps/x").value == b"1"
    assert refused(lambda: h1.put(keys.host_prefix("h2") + "qps/x", "forged"))      # h2's report
    assert refused(lambda: h1.delete_prefix(keys.host_prefix("h2")))                # erasing h2's
    assert refused(lambda: h1.put(keys.placements_prefix("h1") + "x", "2"))         # its own placement
    assert refused(lambda: h1.put(keys.switch_prefix("l1") + "links", "{}"))         # a leaf's links
    assert refused(lambda: h1.put(keys.leader_key(), "h1"))                          # leadership


def test_a_leaf_writes_only_its_links_and_the_coordinator_alone_places(etcd, issued):
    _, d, _ = issued
    l1, l2 = as_user(etcd, d, keys.switch_user("l1")), as_user(etcd, d, keys.switch_user("l2"))
    l1.put(keys.switch_prefix("l1") + "links", '{"up": [1, 1, 1, 1]}')
    assert refused(lambda: l2.put(keys.switch_prefix("l1") + "links", '{"up": [0, 0, 0, 0]}'))
    coord = as_user(etcd, d, keys.COORDINATOR_USER)
    coord.put(keys.placements_prefix("h1") + "x", "3")
    h1 = as_user(etcd, d, keys.host_user("h1"))
    assert h1.get(keys.placements_prefix("h1") + "x").value == b"3"                  # reads its own
    assert refused(lambda: h1.get(keys.placements_prefix("h2") + "x"))              # not another's
    assert coord.get(keys.switch_prefix("l1") + "links").value == b'{"up": [1, 1, 1, 1]}'


def test_without_credentials_nothing_is_read_or_written(etcd, issued):
    anon = Etcd(etcd.url)
    with pytest.raises(EtcdError):
        anon.put(keys.host_prefix("h1") + "qps/y", "1")
    with pytest.raises(EtcdError):
        Etcd(etcd.url, keys.host_user("h1"), "wrong password").put(keys.host_prefix("h1") + "qps/y", "1")


def test_issuing_again_keeps_users_and_passwords(etcd, issued):
    fabric, d, first = issued
    before = etcdauth.password_file(d, keys.host_user("h1")).read_text()
    again = etcdauth.issue(fabric, [etcd.url], d)
    assert again.users_added == [] and set(again.users_kept) == set(first.users_added)
    assert not again.auth_enabled                                  # it was on already
    assert etcdauth.password_file(d, keys.host_user("h1")).read_text() == before
    as_user(etcd, d, keys.host_user("h1")).put(keys.host_prefix("h1") + "qps/z", "1")


def test_a_lease_ends_a_silent_hosts_keys_and_a_watch_sees_it(etcd, issued):
    """Liveness is the lease: a host that stops refreshing loses its keys; the coordinator's
    watch hears every change in order, from the revision it read at."""
    _, d, _ = issued
    h3, coord = as_user(etcd, d, keys.host_user("h3")), as_user(etcd, d, keys.COORDINATOR_USER)
    _, rev = coord.get_prefix(keys.host_prefix("h3"))
    lease = h3.lease_grant(2)
    h3.put(keys.host_prefix("h3") + "qps/a", "1", lease=lease)
    stop, seen = threading.Event(), []

    def watch():
        for events, _ in coord.watch_prefix(keys.host_prefix("h3"), rev + 1, stop, idle_s=1.0):
            seen.extend((e.kind, e.kv.key) for e in events)
    t = threading.Thread(target=watch, daemon=True)
    t.start()
    t0 = time.monotonic()
    while coord.get(keys.host_prefix("h3") + "qps/a") is not None and time.monotonic() - t0 < 10:
        time.sleep(0.2)
    gone = time.monotonic() - t0
    time.sleep(0.5)
    stop.set()
    assert 1.0 <= gone <= 5.0, gone                  # the 2 s lease, as etcd's lessor rounds it
    assert seen == [("put", keys.host_prefix("h3") + "qps/a"), ("delete", keys.host_prefix("h3") + "qps/a")]
