"""A fabric kind is a module that registers itself: a toy fourth kind, defined only here, is
loaded from a fabric file, rendered into link setup, planned into VMs and given a host agent,
without a line of the project changed; the layers that cannot serve it say so by name. And no
layer compares kind names any more."""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

import pytest

from rlbdeploy import units as deploy
from rlbfabric import kinds
from rlbfabric.base import KINDS, Fabric, FabricError, Node, OneHostAMachine, SwitchedFabric, kind
from rlbfabric.bgpsec import BgpSecurity
from rlbcoord import COLLECTORS, COORDINATORS, ETCD_RUNNERS, kinds as coord_kinds
from rlbcoord import cli as coord_cli  # noqa: F401 - what rlbcoord runs: the coordinators registered
from rlbfabric.fabric import load, parse
from rlbhost import kinds as host_kinds
from rlblab import kinds as lab_kinds
from rlblab.labs import LABS, open_lab
from rlblab.scenarios import SCENARIOS
from rlbhost.assemble import HOST_AGENTS, Assembled, Options, assembler
from rlblab.vm.plan import plan

ROOT = Path(__file__).resolve().parent.parent


def members(protocol) -> set[str]:
    """What a protocol class itself declares (fields and methods; not what it inherits)."""
    return {n for n, v in vars(protocol).items() if not n.startswith("_") and (callable(v) or isinstance(v, property))
            } | set(vars(protocol).get("__annotations__", {}))


@dataclass
class ToyFabric(OneHostAMachine):
    """One switch, hosts on it (each host one link, each its own machine)."""
    hosts_: list[str]
    mbps: int
    kind: ClassVar[str] = "toy"
    paths_by_address: ClassVar[bool] = True
    coordinated: ClassVar[bool] = False
    rendered_units: ClassVar[bool] = True
    bgp_switches: ClassVar[bool] = False
    bgp: BgpSecurity = field(default_factory=BgpSecurity)

    @property
    def switches(self):
        return [Node("t1", "leaf", 65001, 1, hosts=self.hosts_)]

    @property
    def hosts(self):
        return list(self.hosts_)

    def node(self, name):
        return next(n for n in self.switches if n.name == name)

    def is_gpu(self, node):
        return False

    def links(self):
        return [("t1", f"eth-{h}", h, "eth-t1", self.mbps) for h in self.hosts_]

    def switch_port_mbps(self, switch):
        return self.mbps

    def summary(self):
        return f"toy: one switch, {len(self.hosts_)} hosts"

    def source_prefixes(self, machine):
        return []

    def net_commands(self, node):
        ports = [f"eth-{h}" for h in self.hosts_] if node == "t1" else ["eth-t1"]
        return [["ip", "link", "set", p, "up"] for p in ports]


@pytest.fixture
def toy():
    @kind("toy")
    def parse_toy(data, where):
        t = data.get("toy", {})
        if not t.get("hosts"):
            raise FabricError(f"{where}: [toy] hosts: at least one")
        return ToyFabric(list(t["hosts"]), int(t.get("mbps", 1000)))

    def assemble_toy(dp, fabric, opts, health):
        return Assembled(agent=None, summary=f"toy host {opts.node} of {len(fabric.hosts)}")

    HOST_AGENTS.register("toy")(assemble_toy)
    try:
        yield parse({"fabric": {"kind": "toy"}, "toy": {"hosts": ["a1", "a2"], "mbps": 2500}}, "toy.toml")
    finally:
        KINDS.pop("toy")
        HOST_AGENTS.pop("toy")


def test_a_fourth_kind_is_added_by_registering_it(toy):
    assert isinstance(toy, ToyFabric) and toy.hosts == ["a1", "a2"]
    # link setup and the VM lab's plan come from the kind's own methods
    assert deploy.net_commands(toy, "a2") == [["ip", "link", "set", "eth-t1", "up"]]
    vms = {vm.name: vm for vm in plan(toy)}
    assert sorted(vms) == ["a1", "a2", "mon", "t1"]
    assert [(e.ifname, e.peer, e.mbps) for e in vms["t1"].links] == [("eth-a1", "a1", 2500), ("eth-a2", "a2", 2500)]
    # the host agent it registered is the one `rlbhost run` builds
    built = assembler(toy)(None, toy, Options(["eth-t1"], node="a1"), None)
    assert built.summary == "toy host a1 of 2"
    # a layer that has nothing for it names the kind and the kinds it serves
    with pytest.raises(FabricError, match=r"a toy fabric has no coordinator \(kinds that have one: clos, rail-only\)"):
        COORDINATORS.of(toy)


def test_the_kinds_are_the_modules_of_one_folder_and_each_has_what_its_protocol_says(toy):
    """rlbfabric/kinds/: one module a kind, found by listing the folder; each kind's fabric has
    every member of Fabric, and a kind with BGP switches every member of SwitchedFabric, while a
    kind without (rail-only) claims none: nothing is faked to look like another kind."""
    folder = sorted(p.stem for p in (ROOT / "rlbfabric" / "kinds").glob("*.py") if not p.stem.startswith("_"))
    assert sorted(m.__name__.rsplit(".", 1)[1] for m in kinds.MODULES) == folder == ["clos", "railonly", "scaleup"]
    assert sorted(KINDS) == ["clos", "rail-only", "scaleup", "toy"]
    # the host layer finds its agents the same way: one module a kind in rlbhost/kinds/
    assert sorted(m.__name__.rsplit(".", 1)[1] for m in host_kinds.MODULES) == folder
    assert sorted(HOST_AGENTS) == ["clos", "rail-only", "scaleup", "toy"]
    # and the coordinator's: a kind without a module there (scale-up) has no coordinator
    assert sorted(m.__name__.rsplit(".", 1)[1] for m in coord_kinds.MODULES) == ["clos", "railonly"]
    assert sorted(COORDINATORS) == sorted(COLLECTORS) == ["clos", "rail-only"] and sorted(ETCD_RUNNERS) == ["clos"]
    # and the labs': each kind's lab and scenarios
    assert sorted(m.__name__.rsplit(".", 1)[1] for m in lab_kinds.MODULES) == folder
    assert sorted(LABS) == ["clos", "rail-only", "scaleup"]
    assert {s.run.__module__.rsplit(".", 1)[1] for s in SCENARIOS.values()} == set(folder)


def test_a_kind_without_a_lab_is_refused_by_name(toy, tmp_path):
    f = tmp_path / "toy.toml"
    f.write_text('[fabric]\nkind = "toy"\n[toy]\nhosts = ["a1"]\n')
    with pytest.raises(FabricError, match=r"toy.toml: a toy fabric has no lab \(kinds that have one: clos, rail-only, scaleup\)"):
        open_lab(f, "toylab")
    fabrics = {name: load(ROOT / "lab" / name) for name in ("fabric.toml", "scaleup.toml", "rail-only.toml")}
    fabrics["toy"] = toy
    switched = {}
    for name, fab in fabrics.items():
        assert {m for m in members(Fabric) if not hasattr(fab, m)} == set(), name
        switched[name] = {m for m in members(SwitchedFabric) if hasattr(fab, m)}
        assert switched[name] == (members(SwitchedFabric) if fab.bgp_switches else set()), name
    assert [n for n, f in fabrics.items() if f.bgp_switches] == ["fabric.toml", "scaleup.toml"]
    # a scale-up fabric has planes, not a Clos fabric's tiers
    assert not any(hasattr(fabrics["scaleup.toml"], m) for m in ("leaves", "spines", "superspines"))


def test_an_unknown_kind_lists_the_registered_ones(toy):
    with pytest.raises(FabricError, match="kind 'ring': clos .*rail-only, scaleup, toy"):
        parse({"fabric": {"kind": "ring"}}, "ring.toml")
    with pytest.raises(ValueError, match="registered twice"):
        kind("toy")(lambda data, where: None)


def test_no_layer_compares_fabric_kind_names():
    """Kind names appear only where a kind registers itself (or declares its own KIND)."""
    compare = re.compile(r"""(==|!=|\bin)\s*\(?["'](clos|scaleup|rail-only)["']|["'](clos|scaleup|rail-only)["']\s*(==|!=)""")
    found = []
    for path in sorted(ROOT.glob("rlb*/**/*.py")):
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if compare.search(line):
                found.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
    assert found == []


@pytest.mark.parametrize("name, phrase", [
    ("fabric.toml", "3-stage leaf-spine: 4 spines, 2 leaves, 4 hosts"),
    ("fabric-5stage.toml", "5-stage leaf-spine"),
    ("scaleup.toml", "scale-up: 4 planes, 8 GPUs of 2 sub-ports a plane"),
    ("rail-only.toml", "rail-only: 4 domains of 4 GPUs, 4 rails"),
])
def test_every_kind_says_what_it_is_in_one_phrase(name, phrase):
    """What `rlblab up` and `rlblab status` print (a rail-only fabric has no stages: `up` used
    to stop on that with an internal error)."""
    assert load(Path(__file__).resolve().parent.parent / "lab" / name).summary().startswith(phrase)
