"""An agent's etcd client against a 3-member etcd cluster whose member it talks to is cut off
from the other two (each member in a network namespace of its own on one bridge; the cut is a
route in the member's namespace, so this machine still reaches it): the member answers no more
with the cluster's state. A watch held open on it must end (etcd ends a require-leader stream
once its member has no leader) and the client must go on with another member, missing nothing;
requests too. Without that, a host's placements and a coordinator's mirror would freeze in
silence while the member stays up."""
from __future__ import annotations

import subprocess
import threading
import time

import pytest

from rlbcommon.etcd import Etcd, EtcdUnavailable
from rlblab.etcdserver import EtcdServer

from .test_etcd_coordination import wait

NS = "rlbpart"
NET = "198.18.99"                  # a benchmarking range: nothing of the labs' or the machine's
MEMBERS = ("m1", "m2", "m3")


def ip(*args: str):
    subprocess.run(["ip", *args], check=True, capture_output=True)


def addr(m: str) -> str:
    return f"{NET}.{MEMBERS.index(m) + 1}"


def teardown():
    subprocess.run(["ip", "link", "del", f"{NS}-c"], capture_output=True)
    for n in ("hub", *MEMBERS):
        subprocess.run(["ip", "netns", "del", f"{NS}-{n}"], capture_output=True)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    teardown()
    hub = f"{NS}-hub"
    members = {}
    try:
        ip("netns", "add", hub)
        ip("-n", hub, "link", "add", "br0", "type", "bridge")
        ip("-n", hub, "link", "set", "br0", "up")
        for m in MEMBERS:
            ns = f"{NS}-{m}"
            ip("netns", "add", ns)
            ip("link", "add", f"{NS}-{m}", "netns", hub, "type", "veth", "peer", "name", "eth0", "netns", ns)
            ip("-n", hub, "link", "set", f"{NS}-{m}", "master", "br0", "up")
            ip("-n", ns, "addr", "add", f"{addr(m)}/24", "dev", "eth0")
            ip("-n", ns, "link", "set", "eth0", "up")
            ip("-n", ns, "link", "set", "lo", "up")
        # this machine's leg on the bridge: the clients' side
        ip("link", "add", f"{NS}-c", "type", "veth", "peer", "name", "client", "netns", hub)
        ip("-n", hub, "link", "set", "client", "master", "br0", "up")
        ip("addr", "add", f"{NET}.254/24", "dev", f"{NS}-c")
        ip("link", "set", f"{NS}-c", "up")
        work = tmp_path_factory.mktemp("etcd-cluster")
        peers = {m: f"http://{addr(m)}:2380" for m in MEMBERS}
        for m in MEMBERS:
            members[m] = EtcdServer(work, host=addr(m), netns=f"{NS}-{m}", name=m, fast=True,
                                    cluster=peers).start(wait=False)
        for m in MEMBERS:
            members[m].wait_ready(30)
        yield members
    finally:
        for s in members.values():
            s.kill()
        teardown()


def cut_off(m: str):
    """m and the other members reach each other no more (a route to nowhere both ways)."""
    for other in MEMBERS:
        if other != m:
            ip("-n", f"{NS}-{m}", "route", "add", "blackhole", f"{addr(other)}/32")
            ip("-n", f"{NS}-{other}", "route", "add", "blackhole", f"{addr(m)}/32")


def heal(m: str):
    for other in MEMBERS:
        if other != m:
            for ns, to in ((m, other), (other, m)):
                subprocess.run(["ip", "-n", f"{NS}-{ns}", "route", "del", "blackhole", f"{addr(to)}/32"],
                               capture_output=True)


class Follower:
    """What an agent's watch loop does (etcdrun.follow, rlbhost's placement watch): watch from
    the last revision read; when etcd is unavailable, note it and watch again."""

    def __init__(self, client: Etcd, prefix: str, rev: int):
        self.client, self.prefix, self.rev = client, prefix, rev
        self.seen: dict[str, float] = {}
        self.unavailable: list[tuple[float, str]] = []
        self.stop = threading.Event()
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self):
        while not self.stop.is_set():
            try:
                for events, rev in self.client.watch_prefix(self.prefix, self.rev, self.stop):
                    for e in events:
                        self.seen.setdefault(e.kv.key, time.monotonic())
                    self.rev = rev
            except EtcdUnavailable as e:
                self.unavailable.append((time.monotonic(), str(e)))
                self.stop.wait(0.2)


def _put(client: Etcd, key: str, value: str) -> bool:
    try:
        client.put(key, value)
        return True
    except EtcdUnavailable:
        return False


def test_a_watch_on_a_member_cut_off_from_its_cluster_ends_and_goes_on_through_another(cluster):
    urls = [cluster[m].url for m in ("m3", "m1", "m2")]          # m3 first: the one to be cut off
    writer = Etcd([cluster["m1"].url], timeout=5)
    _, rev = writer.get_prefix("/part/")
    agent = Etcd(urls, timeout=2)
    follower = Follower(agent, "/part/", rev + 1)
    try:
        writer.put("/part/before", "1")
        wait(lambda: "/part/before" in follower.seen, 5, "an event through m3 while the cluster is whole")
        cut_off("m3")
        t_cut = time.monotonic()
        # m1 and m2 are still a quorum (when m3 led, once they have elected one of them)
        wait(lambda: _put(writer, "/part/after", "1"), 15, "m1 and m2 to take a write")
        took = wait(lambda: "/part/after" in follower.seen, 20, "the event written after the cut")
        assert follower.unavailable, "the watch never ended: a cut-off member kept it open"
        print(f"\nthe watch on m3 ended after {follower.unavailable[0][0] - t_cut:.2f} s "
              f"({follower.unavailable[0][1]}); the write after the cut read {took:.2f} s after it")
        assert took < 10
        # and requests: the agent's reads and writes go to a member that has a leader, also
        # from a client that starts with the cut-off member (m3 answers "no leader", or not at all)
        assert agent.get("/part/after").value == b"1"
        fresh = Etcd(urls, timeout=2)
        t0 = time.monotonic()
        fresh.put("/part/from-agent", "2")
        assert time.monotonic() - t0 < 5 and fresh.endpoints[fresh._good] != cluster["m3"].url
        assert writer.get("/part/from-agent").value == b"2"
        lease = fresh.lease_grant(5)
        assert fresh.lease_keepalive(lease) > 0            # a host's lease stays alive through m1
        # a watch opened first at the cut-off member: m3 refuses the stream ("no leader", inside
        # an {"error": ...} body) and the open goes on to m1 (this refusal once ended the loop)
        late = Follower(Etcd(urls, timeout=2), "/part/", rev + 1)
        try:
            wait(lambda: "/part/from-agent" in late.seen, 10, "a watch opened while m3 is cut off")
            assert late.client.endpoints[late.client._good] != cluster["m3"].url
        finally:
            late.stop.set()
    finally:
        follower.stop.set()
        heal("m3")
