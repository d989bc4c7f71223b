"""Opt-in (RLB_VAGRANT=1, `make vagrant-test-scaleup`): a scale-up fabric as VMs, from the same
fabric file as the namespace lab — lab/scaleup.toml (4 plane switches, 8 GPUs with 2 sub-port
cables into every plane, and the monitor: 13 VMs), or another scale-up file in RLB_FABRIC
(lab/scaleup-small.toml: 3 planes, 3 GPUs, 7 VMs, for a machine with few cores). The GPUs are BGP
speakers (bird2) and run `rlbhost attach rlb0` in ports mode; the planes run the XDP switch. The
scale-up scenarios run here as the very code `rlblab scenario` runs on namespaces
(rlblab.vm.scaleup adapts the lab), with a pulled cable for a port down, and their expected
figures follow from the fabric file. The VMs are destroyed at the end (RLB_VAGRANT_KEEP=1
keeps them). Under emulation the 13 VMs need about 4 cores (refused on fewer: rlblab.vm.driver)."""
import os
import time

import pytest

from rlblab import scenarios
from rlblab.vm.driver import lab_session
from rlblab.vm.scaleup import VagrantScaleup
from rlbmonitor import dashboards

pytestmark = [pytest.mark.vagrant,
              pytest.mark.skipif(os.environ.get("RLB_VAGRANT") != "1", reason="opt-in: RLB_VAGRANT=1")]


# VMs under TCG on 2 cores: timers slower still than the Vagrantfile's qemu defaults, so that
# neither BFD nor the probes take a healthy plane out of use (the scenarios here pull cables:
# carrier, not timers, is what they test)
SLOW = {"RLB_BFD_MS": "1000", "RLB_PROBE_MS": "500", "RLB_PROBE_DEAD_MS": "5000"}
FABRIC = os.environ.get("RLB_FABRIC", "lab/scaleup.toml")


@pytest.fixture(scope="module")
def slab(tmp_path_factory):
    with lab_session(FABRIC, tmp_path_factory.mktemp("vagrant") / "vagrant.log", SLOW) as vms:
        lab = VagrantScaleup(vms)
        t0 = time.time()
        lab.wait_converged()
        print(f"converged: {time.time() - t0:.0f} s after up")
        yield lab


def test_every_gpu_learns_every_peer_on_every_plane(slab):
    """BGP from the GPUs through the planes: each GPU weights each peer's loopback on every
    plane at the plane's path bandwidth (its sub-ports' speeds summed)."""
    full = slab.full_planes()
    for gpu in slab.gpus:
        programmed = slab.weights(gpu)
        peers = {f"{slab.fabric.loopback(p)}/128" for p in slab.gpus if p != gpu}
        assert peers <= set(programmed), gpu
        assert all(slab.plane_weights(gpu, p, programmed) == full for p in slab.gpus if p != gpu), gpu


@pytest.mark.parametrize("name", ["scaleup-3.1-split", "scaleup-3.1-subcable", "scaleup-3.2-planes"])
def test_scenario(slab, name):
    s = scenarios.SCENARIOS[name]
    checks = s.run(slab)
    print(scenarios.format_checks(s, checks))
    assert checks and all(c.ok for c in checks), scenarios.format_checks(s, checks)


def test_prometheus_on_mon_scrapes_every_gpu_and_plane_and_the_planes_panels_have_data(slab):
    (up,) = slab.lab.prometheus(["up"])
    assert {r["metric"]["instance_node"]: r["value"][1] for r in up} == \
        {n: "1" for n in [*slab.gpus, *(p.name for p in slab.fabric.planes)]}
    queries = dashboards.panel_queries(dashboards.planes_dashboard())
    results = slab.lab.prometheus([dashboards.as_grafana_sends(e) for _, e in queries])
    empty = [title for (title, _), res in zip(queries, results) if not res]
    assert not empty, f"panels without data: {empty}"
    # every GPU probes each peer on each plane, and all are answered
    (probes,) = slab.lab.prometheus(["rlb_host_plane_probe_up"])
    g, p = len(slab.gpus), len(slab.fabric.planes)
    assert len(probes) == g * (g - 1) * p and {r["value"][1] for r in probes} == {"1"}
