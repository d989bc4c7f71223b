"""The switch's routing model (rlbswitch/tables.py) against the real pinned maps of a loaded
program: shared groups, capacity, random churn with every invariant checked against the maps,
minimal diffs, orphans reclaimed at adoption, one writer at a time, and SIGKILL at random instants."""
from __future__ import annotations

import ctypes as ct
import ipaddress
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from types import SimpleNamespace

import pytest

from rlbcommon import bpfprog, maps
from rlbfabric.routes import NextHop, Route, RouteError
from rlbswitch import abi, dlbscan
from rlbswitch.dataplane import NH_VALID, DataplaneError, SwitchDataplane

NH = [f"p{k}@02:00:00:00:01:0{k}" for k in range(4)]


@pytest.fixture
def tables(fresh):
    fresh.dp._tables = None          # a model loaded from the maps as they are now
    yield fresh.dp.tables
    fresh.clear_routes()


def pinned(net: str, primary: int, backups: list[int]) -> Route:
    return Route(net, "pinned", [NextHop.parse(NH[primary])], [NextHop.parse(NH[b]) for b in backups])


def check(dp: SwitchDataplane):
    """The maps hold no orphan and no dangling reference, and the model mirrors them."""
    nhs = {i: nh for i, nh in enumerate(dp.maps["nexthops"].array_values()) if i and nh is not None and nh.flags & NH_VALID}
    groups = {i: g for i, g in enumerate(dp.maps["groups"].array_values()) if i and g is not None and g.n_members}
    used_nh, used_g = set(), set()
    routes = {}
    for k, r in dp.maps["routes"].items():
        routes[ipaddress.IPv6Network((bytes(k.addr), k.prefixlen))] = r
        if r.nexthop:
            assert r.nexthop in nhs
            used_nh.add(r.nexthop)
        if r.group:
            assert r.group in groups
            used_g.add(r.group)
    for gid in used_g:
        for nid in groups[gid].member_nh[:groups[gid].n_members]:
            assert nid in nhs
            used_nh.add(nid)
    assert set(groups) == used_g, f"orphan groups {set(groups) - used_g}"
    assert set(nhs) == used_nh, f"orphan next hops {set(nhs) - used_nh}"
    t = dp.tables
    assert set(t.routes) == set(routes) and set(t.group_by_id) == used_g and set(t.nh_by_id) == used_nh
    for gid, g in t.group_by_id.items():
        assert g.refs == sum(1 for r in routes.values() if r.group == gid)
    assert not set(t.free_group.free) & used_g and not set(t.free_nh.free) & used_nh
    assert len(t.free_group) + len(used_g) == abi.C["RLB_MAX_GROUPS"] - 1
    assert len(t.free_nh) + len(used_nh) == abi.C["RLB_MAX_NEXTHOPS"] - 1


def test_identical_backup_sets_share_one_group(tables, fresh):
    ch = tables.apply([pinned(f"fc00:2:{i:x}:1::/64", i % 4, [b for b in range(4) if b != i % 4])
                       for i in range(400)])
    assert len(ch.added) == 400
    assert tables.usage()["groups"] == 4 and tables.usage()["nexthops"] == 4
    check(fresh.dp)


def test_sixteen_thousand_routes_fit_and_forward(tables, fresh):
    """16384 pinned prefixes with three backups each (today's code stopped at 1023): all
    programmed with 4 groups and 4 next hops; packets to a sample go out their primary; one
    change among them rewrites that route alone. (Timing: bench/switch_tables.py.)"""
    from rlbcommon import packets as P
    from .conftest import roce
    routes = [pinned(f"fc00:{i // 4096 + 2:x}:{i % 4096:x}:1::/64", i % 4, [b for b in range(4) if b != i % 4])
              for i in range(16384)]
    ch = tables.apply(routes)
    assert len(ch.added) == 16384 and tables.usage()["groups"] == 4 and tables.usage()["nexthops"] == 4
    xdp = fresh.dp
    for i in range(0, 16384, 1237):
        ret, out = harness_run(xdp, roce(dst=f"fc00:{i // 4096 + 2:x}:{i % 4096:x}:1::9"))
        assert ret == 4 and int(P.parse(out).dmac.split(":")[-1]) == i % 4      # XDP_REDIRECT, primary
    writes = tables.operator_writes
    one = pinned("fc00:2:5:1::/64", 2, [0, 1])
    assert tables.apply([one], merge=True).changed == ["fc00:2:5:1::/64"] and tables.operator_writes == writes + 1
    assert tables.usage()["groups"] == 5
    check(fresh.dp)


def harness_run(dp, frame):
    from rlbcommon.testrun import prog_test_run
    r = prog_test_run(dp.prog_fd, frame)
    return r.retval, r.data


def test_the_same_table_again_writes_nothing(tables, fresh):
    routes = [pinned("fc00:2::/64", 0, [1, 2]),
              Route("fc00:3::/64", "ecmp", [NextHop.parse(NH[1]), NextHop.parse(NH[2])]),
              Route("fc00:4::/64", "weighted", [NextHop.parse(NH[1] + "=3"), NextHop.parse(NH[3])]),
              Route("fc00:5::/64", "dlb", [NextHop.parse(h) for h in NH])]
    tables.apply(routes)
    batches = tables.batches
    ch = tables.apply(routes)
    assert not ch and ch.unchanged == 4 and tables.batches == batches        # no batch at all
    # adopted from the maps by a fresh model, ECMP (stored as weighted) still compares equal
    fresh.dp._tables = None
    assert fresh.dp.tables.apply(routes).unchanged == 4


def random_route(rnd: random.Random, net: str) -> Route:
    mode = rnd.choice(["pinned", "pinned", "weighted", "ecmp", "dlb", "local"])
    members = rnd.sample(range(4), rnd.randint(1, 4))
    if mode == "pinned":
        return pinned(net, members[0], members[1:])
    if mode == "local":
        return Route(net, "local")
    return Route(net, mode, [NextHop.parse(NH[m] + (f"={rnd.randint(1, 4)}" if mode == "weighted" else ""))
                             for m in members])


def test_random_churn_leaks_nothing(tables, fresh):
    rnd = random.Random(11)
    nets = [f"fc00:{i:x}::/64" for i in range(1, 300)]
    for _ in range(40):
        batch = {n: random_route(rnd, n) for n in rnd.sample(nets, rnd.randint(0, 120))}
        ch = tables.apply(list(batch.values()), merge=rnd.random() < 0.5)
        assert not ch.failed
        check(fresh.dp)
    tables.apply([])
    check(fresh.dp)
    assert tables.usage() == {"routes": 0, "groups": 0, "nexthops": 0,
                              "groups_free": abi.C["RLB_MAX_GROUPS"] - 1,
                              "nexthops_free": abi.C["RLB_MAX_NEXTHOPS"] - 1}


def test_a_route_that_cannot_be_programmed_is_reported_and_the_rest_go_in(tables, fresh):
    routes = [pinned("fc00:2::/64", 0, [1]), Route("fc00:3::/64", "dlb", [NextHop.parse("lo@02:00:00:00:00:01")])]
    ch = tables.apply(routes, keep_going=True)
    assert ch.added == ["fc00:2::/64"] and "not attached" in ch.failed["fc00:3::/64"]
    check(fresh.dp)


def test_orphans_left_by_a_crash_are_reclaimed_at_adoption(tables, fresh):
    tables.apply([pinned("fc00:2::/64", 0, [1, 2])])
    dp = fresh.dp
    # what a process killed between writing a group and switching its route leaves
    g = dp.maps["groups"].leaf_type()
    g.n_members = 2
    g.member_nh[0], g.member_nh[1] = 1, 2
    dp.maps["groups"].set(77, g)
    nh = dp.maps["nexthops"].get(1)
    dp.maps["nexthops"].set(99, nh)
    dp._tables = None
    assert dp.tables.load() == (0, 0)           # the first load already reclaimed both
    check(dp)
    assert dp.maps["groups"].get(77).n_members == 0 and not dp.maps["nexthops"].get(99).flags


def test_threads_that_ask_for_the_model_at_once_share_one(tables, fresh):
    """The agent's threads (bird follower, link watcher, heartbeats, control socket) first ask for
    the model at about the same instant. Each must get the same one: a second model, loaded
    while the first was about to write, stays behind the maps and later frees next hops that
    routes still use (CI: `route show` found a pinned route whose next hop was zeroed)."""
    tables.apply([pinned("fc00:2::/64", 0, [1])])
    dp = fresh.dp
    for _ in range(3):
        dp._tables = None                          # as at the agent's start: nobody asked yet
        start, got = threading.Barrier(4), []

        def ask():
            start.wait()
            got.append(dp.tables)
        threads = [threading.Thread(target=ask) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len({id(m) for m in got}) == 1 and got[0] is dp.tables, f"{len({id(m) for m in got})} models"
    # what one thread writes through its model, the model every thread now has holds
    got[0].apply([pinned("fc00:2::/64", 1, [2])])
    assert dp.tables.apply([pinned("fc00:2::/64", 1, [2])]).unchanged == 1
    check(dp)


def test_one_writer_at_a_time_and_the_next_starts_from_what_the_last_left(tables, fresh):
    """The tables have one writer (the agent; a command when none runs): another process is told
    who writes, and once the writer lets go, the next one's model starts from what it left."""
    tables.apply([pinned("fc00:2::/64", 0, [1])])
    dp = fresh.dp
    assert dp.owns() and dp.owner_pid() == os.getpid()
    other = SwitchDataplane(dp.instance)                   # e.g. a command, while the agent runs
    try:
        with pytest.raises(DataplaneError, match=f"pid {os.getpid()}"):
            other.claim(timeout=0.1)
        with pytest.raises(DataplaneError, match=f"pid {os.getpid()}"):
            other.claim(timeout=0)
            other.tables.apply([Route("fc00:7::/64", "dlb", [NextHop.parse(NH[3])])], merge=True)
        assert "fc00:7::/64" not in {r["prefix"] for r in dp.routes()}
        dp.disown()                                        # the agent stopped
        other.tables.apply([Route("fc00:7::/64", "dlb", [NextHop.parse(NH[3])])], merge=True)
        assert other.owns() and not dp.owns()
    finally:
        other.close()
    ch = dp.tables.apply([pinned("fc00:2::/64", 0, [1]), pinned("fc00:8::/64", 1, [2])], merge=True)
    assert dp.owns() and ch.added == ["fc00:8::/64"] and ch.unchanged == 1
    assert "fc00:7::/64" in {str(n) for n in dp.tables.routes}      # read at its first write
    check(dp)


def test_the_agent_yields_to_an_operators_route_written_after_it_looked(tables, fresh):
    """The bird follower decides which prefixes are its own, then writes: an operator's route for
    one of them written in between (a command served by the agent's control thread) must stay
    the operator's; the agent's own write is what checks, under the lock it writes with. (CI: a
    leaf agent restarted with an operator's route for a bird prefix found the route recorded as
    the agent's.)"""
    tables.apply([pinned("fc00:2::/64", 0, [1])], owner="agent")
    assert tables.owner("fc00:2::/64") == "agent"           # what the agent saw when it looked
    writes = tables.operator_writes
    tables.apply([Route("fc00:2::/64", "dlb", [NextHop.parse(NH[3])])], merge=True, owner="operator")
    assert tables.operator_writes == writes + 1             # the bird follower syncs again after it
    ch = tables.apply([pinned("fc00:2::/64", 1, [0]), pinned("fc00:8::/64", 1, [2])], merge=True,
                      owner="agent", only_own=True)
    assert ch.yielded == ["fc00:2::/64"] and ch.added == ["fc00:8::/64"]
    routes = {r["prefix"]: r for r in fresh.dp.routes()}
    assert routes["fc00:2::/64"]["owner"] == "operator" and routes["fc00:2::/64"]["mode"] == "dlb"
    check(fresh.dp)


CHURN = r"""
import random, sys
from rlbcommon import netns
netns.enter(sys.argv[1])
from rlbswitch.dataplane import SwitchDataplane
from rlbfabric.routes import NextHop, Route
NH = [f"p{k}@02:00:00:00:01:0{k}" for k in range(4)]
rnd = random.Random(int(sys.argv[2]))
dp = SwitchDataplane(sys.argv[1])
nets = [f"fc00:{i:x}::/64" for i in range(1, 200)]
print("ready", flush=True)
while True:
    batch = []
    for n in rnd.sample(nets, 60):
        m = rnd.sample(range(4), rnd.randint(1, 4))
        batch.append(Route(n, "pinned", [NextHop.parse(NH[m[0]])], [NextHop.parse(NH[b]) for b in m[1:]])
                     if rnd.random() < 0.5 else
                     Route(n, "weighted", [NextHop.parse(NH[b] + f"={rnd.randint(1, 3)}") for b in m]))
    dp.tables.apply(batch, merge=rnd.random() < 0.7)
"""


def test_sigkill_at_random_instants_under_churn_leaves_nothing_adoption_cannot_reclaim(tables, tmp_path, fresh):
    script = tmp_path / "churn.py"
    script.write_text(CHURN)
    rnd = random.Random(5)
    reclaimed = []
    dp = fresh.dp
    for run in range(8):
        dp.disown()                     # the churning process is the writer until it is killed
        p = subprocess.Popen([sys.executable, str(script), dp.instance, str(run)],
                             stdout=subprocess.PIPE, text=True)
        assert p.stdout.readline().strip() == "ready"
        time.sleep(rnd.uniform(0.2, 1.0))
        p.send_signal(signal.SIGKILL)
        p.wait()
        assert dp.claim(timeout=1)      # the dead writer's lock went with it
        t = dp.tables                   # adoption: reclaims what the killed writer left
        reclaimed.append((len(t.group_by_id), len(t.nh_by_id)))
        check(dp)
        # and the tables are usable: the next batch goes in and leaves no orphan
        t.apply([pinned("fc00:ffff::/64", 0, [1, 2])], merge=True)
        check(dp)
    print(f"\nafter each kill: (groups, next hops) in use {reclaimed}")


def test_a_freed_id_is_reused_last():
    """A packet that read a route just before its switch-over may still look its old group up:
    the freed id must not be handed out (and rewritten) while other ids are free."""
    from rlbswitch.tables import _FreeIds
    ids = _FreeIds(5, {1})
    a = ids.take("x")
    ids.give(a)
    assert [ids.take("x") for _ in range(3)] == [3, 4, a]


@pytest.mark.parametrize("keep_going", [True, False])
def test_a_full_route_table_still_applies_the_withdrawals_and_leaks_nothing(tables, keep_going, fresh):
    """The route map refusing a write (full: ENOSPC) used to abort the batch before its
    withdrawals, and left the refused route's next hops and group referenced. Now withdrawals
    go first, the refused route takes nothing with it, and the rest of the batch goes in."""
    import errno
    from rlbcommon.libbpf import BpfError
    tables.apply([pinned(f"fc00:{i:x}::/64", i % 4, [(i + 1) % 4]) for i in range(1, 9)])
    routes_map = fresh.dp.maps["routes"]
    refused = abi.lpm_key_bytes(ipaddress.IPv6Network("fc00:100::/64"))
    put_many, size = routes_map.put_many, len(refused)

    def full(keys: bytes, values: bytes, n: int):
        """The map as it answers when full, at fc00:100::/64's entry (a batch stops there)."""
        at = next((i for i in range(n) if keys[i * size:(i + 1) * size] == refused), None)
        if at is None:
            return put_many(keys, values, n)
        done, err = put_many(keys[:at * size], values[:at * len(values) // n], at)
        return done, err or BpfError(errno.ENOSPC, "batch update routes: No space left on device")

    routes_map.put_many = full
    try:
        desired = [pinned(f"fc00:{i:x}::/64", i % 4, [(i + 1) % 4]) for i in range(1, 5)] + \
                  [pinned("fc00:101::/64", 0, [1, 2, 3]),           # written before the refusal
                   Route("fc00:100::/64", "weighted", [NextHop.parse(NH[k]) for k in range(4)]),
                   # the refused route's next-hop set again: its group was freed with it, so the
                   # batch's memory of that set must not hand out the freed group
                   Route("fc00:102::/64", "weighted", [NextHop.parse(NH[k]) for k in range(4)])]
        if keep_going:
            ch = tables.apply(desired, keep_going=True)
            assert "route table full" in ch.failed["fc00:100::/64"]
            assert ch.added == ["fc00:101::/64", "fc00:102::/64"]
            g = tables.routes[ipaddress.IPv6Network("fc00:102::/64")].group
            assert fresh.dp.maps["groups"].get(g).n_members == 4
        else:
            with pytest.raises(RouteError, match="route table full"):
                tables.apply(desired)
    finally:
        del routes_map.put_many
    routes = {r["prefix"] for r in fresh.dp.routes()}
    assert not routes & {f"fc00:{i:x}::/64" for i in range(5, 9)}        # withdrawn all the same
    assert "fc00:101::/64" in routes and ("fc00:102::/64" in routes) == keep_going
    assert "fc00:100::/64" not in routes
    check(fresh.dp)                                                     # no orphan, no dangling ref


def test_a_kernel_without_batch_writes_for_the_trie_gets_one_write_each(tables, monkeypatch, fresh):
    """Where the kernel refuses BPF_MAP_UPDATE_BATCH for the LPM trie (ENOTSUPP, the count left
    as given), the new routes' entries go in one update each, with the same result, and the
    batch is not tried again for that map type."""
    routes_fd, real = fresh.dp.maps["routes"].fd, maps.lib

    class OlderKernel:
        def __getattr__(self, name):
            return getattr(real, name)

        @staticmethod
        def bpf_map_update_batch(fd, *args):
            if fd != routes_fd:
                return real.bpf_map_update_batch(fd, *args)
            ct.set_errno(524)
            return -524

    monkeypatch.setattr(maps, "lib", OlderKernel())
    monkeypatch.setattr(maps, "_NO_BATCH_UPDATE", set())
    ch = tables.apply([pinned(f"fc00:{i:x}::/64", i % 4, [(i + 1) % 4]) for i in range(1, 301)])
    assert len(ch.added) == 300 and not ch.failed
    assert maps._NO_BATCH_UPDATE == {fresh.dp.maps["routes"].map_type}
    assert {r["prefix"] for r in fresh.dp.routes()} == {f"fc00:{i:x}::/64" for i in range(1, 301)}
    check(fresh.dp)


def hops(n: int) -> list[NextHop]:
    """n distinct next hops over the four ports (static MACs of their own)."""
    return [NextHop.parse(f"p{k % 4}@02:00:00:00:02:{k:02x}") for k in range(n)]


def test_groups_wider_than_the_kernels_dlb_scan_are_refused_for_the_modes_that_scan(tables, tmp_path, monkeypatch, fresh):
    """Where the kernel took the switch program's DLB scan only 8 members wide (as 6.1 takes
    16), a dlb or spray route of 9 next hops and a pinned route of 9 backups are refused with the
    reason; 8 go in, and weighted routes, which do not scan, take any width."""
    record = tmp_path / "switch-dlb-scan.json"
    record.write_text(json.dumps({"kernel": os.uname().release, "program": dlbscan.program(), "scan": 8}))
    monkeypatch.setattr(dlbscan, "RECORD", record)
    fresh.dp._tables = None
    t = fresh.dp.tables
    assert t.dlb_scan == 8
    for route in (Route("fc00:5::/64", "dlb", hops(9)), Route("fc00:6::/64", "spray", hops(9)),
                  Route("fc00:7::/64", "pinned", hops(1), hops(10)[1:])):
        with pytest.raises(RouteError, match="at most 8 .* on this kernel"):
            t.apply([route], merge=True)
    ch = t.apply([Route("fc00:5::/64", "dlb", hops(8)), Route("fc00:7::/64", "pinned", hops(1), hops(9)[1:]),
                  Route("fc00:8::/64", "weighted", hops(20))], merge=True)
    assert sorted(ch.added) == ["fc00:5::/64", "fc00:7::/64", "fc00:8::/64"]
    check(fresh.dp)


def test_a_kernel_refusing_the_widest_dlb_scan_gets_the_program_built_narrower(tmp_path, monkeypatch):
    """The verifier's E2BIG at 64 members (Debian 12's kernel): the loader builds the program
    again for 32, loads it, and records the width for this kernel, which the next load starts
    from and the route model reads."""
    from bcc import BPF
    record = tmp_path / "switch-dlb-scan.json"
    monkeypatch.setattr(dlbscan, "RECORD", record)
    real, widths = BPF.load_func, []

    def refuse_the_widest(self, name, kind, *args, **kw):
        widths.append(self.rlb_scan)
        if self.rlb_scan == dlbscan.MAX_MEMBERS:
            raise Exception(f"Failed to load BPF program {name!r}: Argument list too long")
        return real(self, name, kind, *args, **kw)

    compile_program = bpfprog.compile_program

    def compiled(source, pins, cflags=None, **kw):
        bpf = compile_program(source, pins, cflags, **kw)
        bpf.rlb_scan = int(next(f for f in cflags if f.startswith("-DRLB_DLB_SCAN=")).split("=")[1])
        return bpf

    monkeypatch.setattr(BPF, "load_func", refuse_the_widest)
    monkeypatch.setattr(bpfprog, "compile_program", compiled)
    dp = SwitchDataplane(f"rlbscan{os.getpid()}")
    try:
        assert dp.load() > 0 and widths == [dlbscan.MAX_MEMBERS, 32]
        assert json.loads(record.read_text()) == {"kernel": os.uname().release, "program": dlbscan.program(),
                                                  "scan": 32}
        assert dlbscan.to_try() == [32, 16, 8] and dp.tables.dlb_scan == 32
    finally:
        dp.remove_pins()


def test_the_dlb_scan_recorded_for_this_kernel_is_kept_across_reboots_but_not_across_programs(tmp_path, monkeypatch,
                                                                                           caplog):
    """The width is recorded in the state directory (kept across reboots: on Debian 12 each width
    refused costs a compile and the verifier's million-instruction walk at every start), for this
    kernel and this program's source: a record of another kernel, of another version of the
    program, or of a width the program does not build starts from the widest again."""
    from rlbcommon.constants import STATE_DIR
    assert dlbscan.RECORD.parent == STATE_DIR
    record = tmp_path / "switch-dlb-scan.json"
    monkeypatch.setattr(dlbscan, "RECORD", record)
    dlbscan.record(16)
    assert json.loads(record.read_text()) == {"kernel": os.uname().release, "program": dlbscan.program(), "scan": 16}
    assert dlbscan.width() == 16 and dlbscan.to_try() == [16, 8]
    for other in ({"kernel": "6.1.0-99-amd64"}, {"program": "0" * 16}, {"scan": 12}, {"program": None}):
        record.write_text(json.dumps({**json.loads(record.read_text()), "kernel": os.uname().release,
                                      "program": dlbscan.program(), "scan": 16, **other}))
        assert dlbscan.width() == dlbscan.MAX_MEMBERS, other
    record.write_text("{half a file")
    assert dlbscan.width() == dlbscan.MAX_MEMBERS
    monkeypatch.setattr(dlbscan, "RECORD", tmp_path / "not-a-dir" / "x.json")
    (tmp_path / "not-a-dir").write_text("")
    dlbscan.record(32)                    # unwritable: said, and the load goes on
    assert "cannot record the DLB scan this kernel takes in" in caplog.text


def test_a_fresh_start_on_a_kernel_series_measured_begins_at_the_width_it_took(tmp_path, monkeypatch):
    """Debian 12's 6.1 refuses 64 and 32 (each a compile and a million-instruction walk: 23 of a
    VM lab leaf's 35 minutes to forward): with no record, a 6.1 kernel starts at 16 and may still
    go narrower; a record for the running kernel and program still wins; 6.10 and 6.18 are not
    6.1 and start from the widest."""
    monkeypatch.setattr(dlbscan, "RECORD", tmp_path / "switch-dlb-scan.json")
    release = ["6.1.0-57-amd64"]
    monkeypatch.setattr(dlbscan.os, "uname", lambda: SimpleNamespace(release=release[0]))
    assert dlbscan.width() == 16 and dlbscan.to_try() == [16, 8]
    dlbscan.record(8)                     # this program refused even 16 here once: 8 from now on
    assert dlbscan.to_try() == [8]
    for other in ("6.10.3-1", "6.18.0-1-amd64", "5.15.0-91-generic"):
        release[0] = other
        assert dlbscan.to_try()[0] == dlbscan.MAX_MEMBERS, other
