"""Shared fixtures. Everything here needs root (BPF, namespaces); the suite runs as root in CI."""
from __future__ import annotations

import contextlib
import os
import random
import shutil
import subprocess
import uuid

import pytest

from rlbcommon import netns
from rlbcommon.paths import pin_dir
from rlbcommon import packets as P
from rlbcommon.testrun import prog_test_run
from rlbswitch.dataplane import SwitchDataplane
from rlbfabric import balance, workloads
from rlbfabric.policy import localrule
from rlblab import topo
from rlblab.vm.driver import VagrantLab

if os.geteuid() != 0:
    pytest.exit("the RLB test suite needs root (BPF programs, network namespaces)", returncode=2)

# `make test` runs the modules on pytest-xdist workers, a module whole on one worker (its lab is
# module-scoped). A namespace module waits more than it computes (about 40 % of 2 cores busy), so
# two share 2 cores well; each holds a lab of agents (180 MB of LLVM apiece), so more than
# WORKERS_MAX is not taken without asking (RLB_TEST_WORKERS=N).
WORKERS_ENV, WORKERS_MAX = "RLB_TEST_WORKERS", 2


CALL_FAILED = pytest.StashKey[bool]()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Remember a test whose body failed, for the fixtures that act on it at teardown. A VM
    lab fixture's set-up error (a wait that ran out) saves the VMs' units here: the module's
    fixtures were set up before any of the test's own, which never ran. The error repeats for
    every test of the module (the fixture's error is cached): saved for the first only."""
    report = (yield).get_result()
    if report.when == "call" and report.failed:
        item.stash[CALL_FAILED] = True
    if report.when == "setup" and report.failed:
        for lab in _labs_made(item):
            if not getattr(lab, "setup_journals_saved", False):
                lab.setup_journals_saved = True
                into = item.config._tmp_path_factory.mktemp("journals")
                print(f"the VMs' rlb units when {item.name}'s set-up failed: {lab.save_journals(into, lines=3000)}")


def _labs_made(item) -> list[VagrantLab]:
    """The VM labs a test's fixtures had made before its set-up failed (pytest's cached values)."""
    labs = []
    for defs in item._fixtureinfo.name2fixturedefs.values():
        for d in defs:
            got = getattr(d, "cached_result", None)
            if got and isinstance(got[0], VagrantLab) and got[0] not in labs:
                labs.append(got[0])
    return labs


@pytest.fixture(autouse=True)
def vm_journals_of_a_failed_test(request, tmp_path_factory):
    """A VM test that failed saves the VMs' rlb units as they were then (status and journal)
    beside its own files: the lab goes on to the next test and is destroyed at the end, and
    the agents' side of a failure (why a QP kept the application's addresses) was lost."""
    yield
    if not request.node.stash.get(CALL_FAILED, False):
        return
    for lab in [v for v in request.node.funcargs.values() if isinstance(v, VagrantLab)]:
        into = tmp_path_factory.mktemp("journals")
        print(f"the VMs' rlb units when {request.node.name} failed: {lab.save_journals(into, lines=3000)}")


@pytest.hookimpl(optionalhook=True)        # (a plain `pytest` without xdist has no such hook)
def pytest_xdist_auto_num_workers(config):
    """`-n auto`: RLB_TEST_WORKERS if set, else one a CPU up to WORKERS_MAX."""
    asked = os.environ.get(WORKERS_ENV)
    if asked:
        if not asked.isdigit() or int(asked) < 1:
            raise pytest.UsageError(f"{WORKERS_ENV}={asked!r}: a number of workers, 1 or more")
        return int(asked)
    return max(1, min(len(os.sched_getaffinity(0)), WORKERS_MAX))


def pytest_collection_modifyitems(session, config, items):
    """Modules without namespaces first (a broken parser or program fails in the first minutes),
    then the namespace modules; each module's tests in their own order. A `*_netns.py` module is
    a namespace module whether or not it says so (`-m "not netns"` leaves it out)."""
    for item in items:
        if item.path.name.endswith("_netns.py") and not item.get_closest_marker("netns"):
            item.add_marker(pytest.mark.netns)
    lab_files = {item.path for item in items if item.get_closest_marker("netns")}
    items.sort(key=lambda item: item.path in lab_files)      # stable: files stay in their order


class XdpHarness:
    """The switch program loaded in a private namespace with four registered ports p0..p3
    whose next hops have fixed MACs 02:00:00:00:01:0k. No traffic leaves: packets go
    through BPF_PROG_TEST_RUN and come back with their verdict."""

    def __init__(self, ns: str):
        self.ns = ns
        self.dp = SwitchDataplane(ns)
        self.dp.load()
        self.ifindex = {}
        for k in range(4):
            self.ifindex[k] = self.dp.ifindex(f"p{k}")
            self.dp.register_port(self.ifindex[k])
        self.dp.set_config(hash_seed=0x5EED1234)
        self.police_off()

    def police_off(self):
        """Every punt reaches the kernel, so verdicts compare one to one; the policer's own
        tests turn it on (tests/test_xdp_policer.py)."""
        from rlbswitch.abi import POLICE
        for name in POLICE.values():
            self.dp.set_police(name, 0, 1)

    @staticmethod
    def nh(k: int, weight: int = 1) -> str:
        return f"p{k}@02:00:00:00:01:0{k}" + (f"={weight}" if weight != 1 else "")

    @staticmethod
    def member_of(mac: str) -> int:
        return int(mac.split(":")[-1])

    def run(self, frame: bytes):
        r = prog_test_run(self.dp.prog_fd, frame)
        return r.retval, r.data

    def reasons(self) -> dict:
        return self.dp.stats()["reasons"]

    def port_up(self, k: int, up: bool):
        self.dp.set_port_up(self.ifindex[k], up)

    def clear_routes(self):
        for r in self.dp.routes():
            self.dp.del_route(r["prefix"])


@contextlib.contextmanager
def scratch_netns(prefix: str):
    """A private namespace this process works inside for the block; removed afterwards."""
    ns = f"{prefix}-{uuid.uuid4().hex[:6]}"
    subprocess.run(["ip", "netns", "add", ns], check=True)
    try:
        with netns.inside(ns):
            yield ns
    finally:
        subprocess.run(["ip", "netns", "del", ns])


@pytest.fixture(scope="module")
def xdp():
    # one CPU for the module: per-CPU state (spray's sequence, the policer's buckets) must be
    # one CPU's, or a test run that migrates mid-count is off by one (a flaky exact split)
    cpus = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(cpus)})
    with scratch_netns("rlbt") as ns:
        topo.veth_ports(4)
        h = None
        try:
            h = XdpHarness(ns)
            yield h
        finally:
            os.sched_setaffinity(0, cpus)
            if h is not None:
                h.dp.destroy()
            else:                       # the program did not load: its pins must not stay
                shutil.rmtree(pin_dir("switch", ns).parent, ignore_errors=True)


@pytest.fixture
def fresh(xdp):
    """Per test: no routes, all ports up, counters as they are (tests compare deltas)."""
    xdp.clear_routes()
    for k in range(4):
        xdp.port_up(k, True)
    yield xdp
    xdp.clear_routes()


@contextlib.contextmanager
def fabric_lab(fabric_file, name: str, timeout: float = 120, **kw):
    """A namespace fabric of any kind (leaf-spine, scale-up, rail-only), converged; torn down
    afterwards even when a test fails, and checked to have left no namespace behind."""
    from rlblab import kinds  # noqa: F401 - each kind's module registers its lab
    from rlblab.labs import open_lab
    lab = open_lab(fabric_file, name, **kw)
    try:
        lab.up()
        lab.wait_converged(timeout)
        yield lab
    finally:
        lab.down()
    assert not [ns for ns in topo.list_ns() if ns.startswith(f"{name}-")]


def scenario_passes(name: str, lab) -> list:
    """Run a registered scenario (what `rlblab scenario NAME` runs) on a test's lab; every
    check must pass. Returns the checks for assertions of the test's own."""
    from rlblab.scenarios import SCENARIOS, format_checks
    checks = SCENARIOS[name].run(lab)
    print("\n" + format_checks(SCENARIOS[name], checks))
    assert checks and all(c.ok for c in checks), format_checks(SCENARIOS[name], checks)
    return checks


def roce(dst="fc00:2::1", sport=49152, qp=1, **kw) -> bytes:
    return P.roce_frame("fc00:1::1", dst, sport, qp, **kw)


def h1_to_h3_during(lab, packets_per_qp: int, rate: int, during, seed: int, lead_s: float = 0.5,
                    payload_len: int = 128, src: str = "h1", dst: str = "h3"):
    """4 QPs h1 -> h3 (or src -> dst; path-1 addresses) at `rate` packets/s in all, sent by raw
    frames on the sender's port and counted by the application on the receiver; `during()` runs
    `lead_s` after the start. Returns (sent, received, longest gap between arrivals in ms)."""
    import random
    import threading
    import time
    from rlblab.traffic import Flow, QpReceiver, open_raw, send
    rnd = random.Random(seed)
    a, b = lab.host_addresses(src)[1], lab.host_addresses(dst)[1]
    flows = [Flow(a, b, rnd.randrange(49152, 65536), rnd.getrandbits(24)) for _ in range(4)]
    rx = QpReceiver(lab.ns(dst))
    sock = open_raw(lab.ns(src), "eth0")
    leaf = lab.fabric.leaf_of_host(src)[0].name
    dmac, smac = topo.mac(lab.ns(leaf), f"eth-{src}"), topo.mac(lab.ns(src), "eth0")
    out = {}
    t = threading.Thread(target=lambda: out.setdefault("sent", send(
        sock, flows, packets_per_qp, dmac, smac, payload_len, rate_pps=rate, burst=4)))
    t.start()
    try:
        time.sleep(lead_s)
        during()
        t.join()
        time.sleep(0.3)
    finally:
        t.join()
        rx.close()
        sock.close()
    times = sorted(tm for tm, _ in rx.arrivals)
    gap = max((y - x for x, y in zip(times, times[1:])), default=0.0) * 1000
    return out["sent"], len(rx.seen), gap


def local_rule_off_the_best(fab, tries: int = 200) -> tuple[int, list]:
    """(seed, connections) of the first random permutation where the hosts' local rule alone
    (its model, which the program follows QP by QP) leaves a link at least 0.9 above the best:
    what a coordinator must fix."""
    for seed in range(tries):
        conns = workloads.connections("permutation", fab.hosts, random.Random(seed))
        local = [(a, b, p) for (a, b), p in zip(conns, localrule.simulate(fab, conns))]
        if max(balance.figures(*balance.leaf_loads(fab, local))) >= max(balance.best_figures(fab, conns)) + 0.9:
            return seed, conns
    pytest.fail("no permutation where the local rule is off the best")
