"""The switch's netlink follower: which thread applies which kernel snapshot.

A snapshot of the neighbour table applied by any thread but the one that applies neighbour
events can land after a newer event and undo it (seen once in the netlink storm test: a next
hop on a port set down stayed "resolved"). So each follower resynchronises its own share,
in its own thread, after it has bound its socket, including after a storm's ENOBUFS."""
import contextlib
import errno
import subprocess
import threading
import time
from types import SimpleNamespace

from pyroute2.netlink.rtnl import RTMGRP_LINK

from rlbcommon import netlinkevents
from rlbswitch.watcher import Watcher


class Log:
    def __init__(self):
        self.lock = threading.Lock()
        self.events: list[tuple[str, str]] = []     # (thread, what)

    def add(self, what: str):
        with self.lock:
            self.events.append((threading.current_thread().name, what))

    def threads(self, what: str) -> set[str]:
        return {t for t, w in self.events if w == what}


class FakeLink(dict):
    def get_attr(self, name):
        return 1500          # IFLA_MTU


class FakeDataplane:
    def __init__(self, log: Log):
        self.log = log
        self.port = SimpleNamespace(ifindex=3, ifname="up3", up=1)
        self.ipr = SimpleNamespace(get_links=lambda: [FakeLink(index=3)], get_addr=lambda family: [])
        self.tables = SimpleNamespace(gateways=lambda ifindex: ["fe80::1"])

    @contextlib.contextmanager
    def netlink(self):
        yield self.ipr

    def ports(self):
        return [self.port]

    def _link_up(self, link):
        return True

    def set_port_up(self, ifindex, up, mtu=None):
        self.log.add("links")
        return False

    def sync_neighbours(self):
        self.log.add("neighbours")
        return 0

    def routes(self):
        return []

    def ifname(self, ifindex):
        return self.port.ifname

    def solicit(self, ifname, gw):
        pass


def fake_events(log: Log, storms: dict[int, int]):
    """NetlinkEvents whose subscription to `groups` fails with ENOBUFS storms[groups] times."""
    class FakeEvents:
        def __init__(self, groups):
            self.groups = groups
            log.add("bind")

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def batch(self, most=4096, timeout=None):
            if storms.get(self.groups, 0) > 0:
                storms[self.groups] -= 1
                raise OSError(errno.ENOBUFS, "No buffer space available")
            time.sleep(0.01)
            return []
    return FakeEvents


def run_watcher(monkeypatch, storms, until=None):
    """The watcher run until its storms are spent and `until(log)` holds (each follower bound and
    resynced once, by default), or 5 s."""
    log = Log()
    monkeypatch.setattr(netlinkevents, "NetlinkEvents", fake_events(log, storms))   # the followers' sockets (imported by follow() when it runs)
    w = Watcher(FakeDataplane(log))
    t = threading.Thread(target=w.run, name="agent")
    t.start()
    until = until or (lambda log: {"links", "neighbours"} <= {what for _, what in log.events})
    deadline = time.monotonic() + 5
    # (after a storm the follower binds again after the supervisor's back-off: waited for, not
    # slept on, since a busy machine stretches it)
    while (any(storms.values()) or not until(log)) and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.05)
    w.stop.set()
    t.join(5)
    assert not t.is_alive()
    return w, log


def test_a_storm_on_the_liveness_socket_resyncs_links_there_and_neighbours_only_in_their_thread(monkeypatch):
    w, log = run_watcher(monkeypatch, {RTMGRP_LINK: 3},
                         until=lambda log: [w for t, w in log.events if t == "liveness"].count("links") >= 4)
    assert w.health.snapshot()["liveness"]["errors"] == 3 and "neighbours" not in w.health.hangs
    assert w.health.snapshot()["neighbours"]["errors"] == 0
    assert log.threads("neighbours") == {"neighbours"}
    assert log.threads("links") == {"liveness"}
    liveness = [what for t, what in log.events if t == "liveness"]
    assert liveness.count("bind") == 4 and liveness.count("links") == 4   # each bind, then a resync
    for i, what in enumerate(liveness):
        if what == "links":
            assert liveness[i - 1] == "bind"


def test_each_follower_resyncs_after_its_own_bind_before_the_next_starts(monkeypatch):
    _, log = run_watcher(monkeypatch, {})
    first = [(t, w) for t, w in log.events][:4]
    assert first == [("liveness", "bind"), ("liveness", "links"),
                     ("neighbours", "bind"), ("neighbours", "neighbours")]


class Msg(dict):
    """A netlink message as pyroute2 hands it over: fields by key, attributes by get_attr."""
    def __init__(self, attrs=None, **fields):
        super().__init__(**fields)
        self.attrs = attrs or {}

    def get_attr(self, name):
        return self.attrs.get(name)


IFF_UP, IFF_LOWER_UP = 0x1, 0x10000


def link(index, up, event="RTM_NEWLINK"):
    return Msg({"IFLA_IFNAME": f"up{index}", "IFLA_MTU": 1500}, event=event, index=index,
               flags=(IFF_UP | IFF_LOWER_UP) if up else IFF_UP)


class RecordingDataplane(FakeDataplane):
    def __init__(self, log):
        super().__init__(log)
        self.writes, self.neighbours, self.solicited = [], [], []
        self.live = {}

    @staticmethod
    def _link_up(msg):
        from rlbswitch.dataplane import SwitchDataplane
        return SwitchDataplane._link_up(msg)

    def set_port_up(self, ifindex, up, mtu=None):
        self.writes.append((ifindex, up))
        changed = self.live.get(ifindex) != up
        self.live[ifindex] = up
        return changed

    def update_neighbour(self, ifindex, dst, mac):
        self.neighbours.append((ifindex, dst, mac))
        return 1

    def solicit(self, ifname, gw):
        self.solicited.append(gw)


def test_a_batch_of_flaps_writes_each_ports_last_state_once():
    dp = RecordingDataplane(Log())
    dp.live = {1: True, 2: True, 3: True}
    w = Watcher(dp)
    batch = [link(k, up) for _ in range(500) for k in (1, 2, 3) for up in (False, True)]
    batch.append(link(3, False))                   # the storm ends with up3 down
    w.on_links(batch)
    assert sorted(dp.writes) == [(1, True), (2, True), (3, False)]
    # up1 and up2 ended up as they began, but they went down meanwhile, which flushed their
    # neighbours: their next hops are solicited again. up3 is down: nothing to solicit there.
    assert dp.solicited == ["fe80::1", "fe80::1"]


def test_a_batch_of_neighbour_changes_applies_each_neighbours_last_state():
    dp = RecordingDataplane(Log())
    w = Watcher(dp)
    mac = "02:00:00:00:00:01"

    def neigh(dst, event, state=0x02):
        return Msg({"NDA_DST": dst, "NDA_LLADDR": mac}, event=event, ifindex=3, family=10, state=state)
    batch = [neigh(f"fc00:99::{i:x}", "RTM_NEWNEIGH") for i in range(500)]
    batch += [neigh("fc00:99::0", "RTM_DELNEIGH"), neigh("fe80::1", "RTM_NEWNEIGH"),
              neigh("fe80::1", "RTM_DELNEIGH")]
    w.on_others(batch)
    assert len(dp.neighbours) == 501
    assert (3, "fc00:99::0", None) in dp.neighbours and (3, "fc00:99::1", mac) in dp.neighbours
    assert (3, "fe80::1", None) in dp.neighbours      # the gateway's last state: gone...
    assert dp.solicited == ["fe80::1"]                # ...so it is asked for again


def test_netlink_events_hand_over_a_storm_as_one_batch_parsed():
    """The real socket in a namespace of its own: 200 flaps queued, one call returns them all
    (RCVBUF holds them: no ENOBUFS), parsed into messages the handlers read; `most` caps it."""
    from rlbcommon.netlinkevents import NetlinkEvents
    from rlbcommon.netns import inside
    from rlblab import topo
    ns = "rlbwu-events"
    topo.run(None, "ip", "netns", "add", ns)
    try:
        topo.run(ns, "ip", "link", "add", "w0", "type", "veth", "peer", "name", "w1")
        topo.run(ns, "ip", "link", "set", "w1", "up")
        with inside(ns), NetlinkEvents(RTMGRP_LINK) as events:
            assert events.batch(timeout=0.05) == []               # nothing yet: the timeout
            script = "".join("link set w0 up\nlink set w0 down\n" for _ in range(200))
            subprocess.run(["ip", "-n", ns, "-batch", "-"], input=script, text=True, check=True)
            time.sleep(0.5)
            first = events.batch(most=10, timeout=1)
            rest = events.batch(timeout=1)
        assert len(first) == 10 and len(first) + len(rest) >= 400
        w0 = [m for m in first + rest if m.get_attr("IFLA_IFNAME") == "w0"]
        assert {m["event"] for m in w0} == {"RTM_NEWLINK"}
        assert w0[-1]["flags"] & 0x1 == 0                           # it ended down
    finally:
        topo.run(None, "ip", "netns", "del", ns)


def test_a_ports_link_local_address_usable_again_resolves_its_next_hops():
    """The kernel refuses to send from a port before its link-local address is back (and out of
    DAD): the address event is when the watcher asks again. Tentative, global or foreign-family
    addresses are not that event."""
    from rlbswitch.watcher import usable_link_local
    dp = RecordingDataplane(Log())
    w = Watcher(dp)

    def addr(address, flags=0x80, family=10, event="RTM_NEWADDR"):
        return Msg({"IFA_ADDRESS": address, "IFA_FLAGS": flags}, event=event, index=3,
                   family=family, flags=flags & 0xff)
    assert not usable_link_local(addr("fe80::2", flags=0x40))           # tentative (DAD running)
    assert not usable_link_local(addr("fe80::2", flags=0x08))           # DAD failed
    assert not usable_link_local(addr("fc00::2"))
    assert not usable_link_local(addr("169.254.0.1", family=2))
    assert usable_link_local(addr("fe80::2"))
    w.sync_addresses = lambda: None          # the global addresses' part has tests of its own
    w.on_others([addr("fe80::2", flags=0x40), addr("fc00::2"), addr("fe80::2", event="RTM_DELADDR")])
    assert dp.solicited == []
    w.on_others([addr("fe80::2", flags=0x40), addr("fe80::2")])
    assert dp.solicited == ["fe80::1"]                 # once, for the port's one gateway
