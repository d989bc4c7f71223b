"""GPU servers of several NICs in the fabric file (rlbfabric/servers.py): stripes and servers, the
address plan per NIC, the link setup that sends each NIC's traffic out of it, one etcd identity and
one host unit per server, the VM plan, generated fabrics; and bad files refused with clear errors."""
from __future__ import annotations

import ipaddress
import subprocess
import tomllib
from pathlib import Path

import pytest

from rlbdeploy import units as deploy
from rlbfabric.bird import conf as birdconf
from rlbcoord import keys
from rlbfabric.fabric import FabricError, load, parse
from rlblab.fabricgen import make_fabric
from rlblab.vm.plan import plan

LAB = Path(__file__).resolve().parent.parent / "lab"
BASE = """
[fabric]
paths = 4
[[spine]]
name = "s1"
asn = 65000
[[spine]]
name = "s2"
asn = 65000
[[leaf]]
name = "l1"
asn = 65001
hosts = ["h1"]
[[leaf]]
name = "l2"
asn = 65002
[[leaf]]
name = "l3"
asn = 65003
"""


def fab(extra: str):
    return parse(tomllib.loads(BASE + extra), "test.toml")


def test_rails_a_stripe_cables_nic_r_of_every_server_to_leaf_r():
    f = fab('[[stripe]]\nleaves = ["l2", "l3"]\nservers = ["a1", "a2"]\n')
    assert f.machines == ["h1", "a1", "a2"]
    assert f.servers == {"a1": ["a1-gpu0_eth", "a1-gpu1_eth"], "a2": ["a2-gpu0_eth", "a2-gpu1_eth"]}
    assert f.hosts == ["h1", "a1-gpu0_eth", "a2-gpu0_eth", "a1-gpu1_eth", "a2-gpu1_eth"]
    assert [(h, f.leaf_of_host(h)[0].name, f.leaf_of_host(h)[1]) for h in f.servers["a2"]] == \
        [("a2-gpu0_eth", "l2", 2), ("a2-gpu1_eth", "l3", 2)]
    # each NIC its own leaf port and its own prefixes, one per path, as gpuN_eth has in the JVD
    assert f.host_ports(f.node("l2")) == [(1, "a1-gpu0_eth", "eth-a1"), (2, "a2-gpu0_eth", "eth-a2")]
    assert [str(n) for n in f.host_prefixes(*f.leaf_of_host("a2-gpu1_eth"))] == \
        ["fc00:3:2:1::/64", "fc00:3:2:2::/64", "fc00:3:2:3::/64", "fc00:3:2:4::/64"]
    assert f.host_of_prefix()[ipaddress.IPv6Network("fc00:3:2:4::/64")] == "a2-gpu1_eth"
    assert f.host_port("a1-gpu1_eth") == "gpu1_eth" and f.host_port("h1") == "eth-l1"
    assert f.machine_of("a1-gpu1_eth") == "a1" and f.machine_of("h1") == "h1"
    assert f.endpoints("h1") == ["h1"]
    assert f.summary() == "3-stage leaf-spine: 2 spines, 3 leaves, 2 servers of 2 NICs and 1 host"
    # one-NIC hosts are as they were
    assert [str(n) for n in f.host_prefixes(*f.leaf_of_host("h1"))][0] == "fc00:1:1:1::/64"


def test_rails_servers_name_their_nics_in_either_form_and_may_share_a_leaf():
    f = fab('[[server]]\nname = "b1"\nnics = { x0 = "l1", x1 = "l3" }\n'
            '[[server]]\nname = "b2"\nnics = [{ name = "p0", leaf = "l1" }, { name = "p1", leaf = "l1" }]\n')
    assert f.servers == {"b1": ["b1-x0", "b1-x1"], "b2": ["b2-p0", "b2-p1"]}
    # the leaf's ports towards two NICs of one server are told apart
    assert f.host_ports(f.node("l1")) == [(1, "h1", "eth-h1"), (2, "b1-x0", "eth-b1"), (3, "b2-p0", "eth-b2_1"),
                                          (4, "b2-p1", "eth-b2_2")]
    assert ("l1", "eth-b2_2", "b2", "p1", 10000) in f.links()


@pytest.mark.parametrize("extra, error", [
    ('[[server]]\nname = "b1"\nnics = [{ name = "x0", leaf = "l1" }, { name = "x0", leaf = "l2" }]\n',
     r"server b1: NIC x0 on two leaves \(l1 and l2\)"),
    ('[[stripe]]\nleaves = ["l2", "l3"]\nrails = 3\nservers = ["a1"]\n',
     r"rail 2 has no leaf \(rails = 3, leaves l2, l3; rails count from 0\)"),
    ('[[stripe]]\nleaves = ["l2", "l3"]\nrails = 1\nservers = ["a1"]\n', r"2 leaves for 1 rails"),
    ('[[stripe]]\nleaves = ["l2", "l9"]\nservers = ["a1"]\n', r"'l9' is not a leaf"),
    ('[[stripe]]\nleaves = ["l2", "s1"]\nservers = ["a1"]\n', r"'s1' is not a leaf"),
    ('[[stripe]]\nleaves = ["l2", "l2"]\nservers = ["a1"]\n', r"a leaf is named for two rails"),
    ('[[server]]\nname = "b1"\nnics = { x0 = "l7" }\n', r"NIC x0 is cabled to 'l7', which is not a leaf"),
    ('[[server]]\nname = "b1"\nnics = {}\n', r"server b1 has no NICs"),
    ('[[server]]\nname = "b1"\nnics = "l1"\n', r"nics \"l1\" must map each NIC to its leaf"),
    ('[[server]]\nname = "h1"\nnics = { x0 = "l1" }\n', r"server name 'h1' used twice"),
    ('[[server]]\nname = "l2"\nnics = { x0 = "l1" }\n', r"server name 'l2' used twice"),
    ('[[stripe]]\nleaves = ["l2"]\nservers = ["a1"]\n[[stripe]]\nleaves = ["l3"]\nservers = ["a1"]\n',
     r"server name 'a1' used twice"),
    ('[[server]]\nname = "B1"\nnics = { x0 = "l1" }\n', r"server name 'B1'"),
    ('[[server]]\nname = "b1"\nnics = { "gpu-0" = "l1" }\n', r"NIC name 'gpu-0'"),
    ('[[server]]\nname = "b1"\nnics = { averyveryverylongnic = "l1" }\n', r"at most 15"),
    ('[[stripe]]\nleaves = ["l2"]\nservers = ["a1"]\nnic = "gpu_eth"\n', r"must contain \{rail\}"),
    ('[[stripe]]\nleaves = ["l2"]\nservers = ["a1"]\nnic = "{bad}{rail}"\n', r"nic '\{bad\}\{rail\}'"),
    ('[[server]]\nname = "longname12"\nnics = { x0 = "l1", x1 = "l1" }\n', r"would exceed 15 characters"),
    ('[stripe]\nleaves = ["l2"]\n', r"stripe must be \[\[stripe\]\] tables"),
])
def test_rails_bad_servers_are_refused_with_what_is_wrong(extra, error):
    with pytest.raises(FabricError, match=error):
        fab(extra)


def test_rails_a_leaf_has_at_most_9999_host_ports():
    """The address plan writes the port in one hextet, in decimal digits."""
    servers = ", ".join(f'"g{i}"' for i in range(10000))
    with pytest.raises(FabricError, match=r"leaf l2 has 10000 host ports: at most 9999"):
        fab(f'[[stripe]]\nleaves = ["l2"]\nservers = [{servers}]\n')


def test_rails_each_nic_of_a_server_sends_from_its_addresses_out_of_itself():
    f = load(LAB / "fabric-rails.toml")
    cmds = f.net_commands("a1")
    for nic in ("gpu0_eth", "gpu1_eth"):
        assert ["sysctl", "-qw", f"net.ipv6.conf.{nic}.accept_ra=2"] in cmds
        assert ["ip", "link", "set", nic, "up"] in cmds
    assert ["ip", "-6", "route", "replace", "default", "via", "fc00:1:1:1::1", "dev", "gpu0_eth", "onlink",
            "table", "1000"] in cmds
    assert ["ip", "-6", "rule", "add", "from", "fc00:1:1::/48", "table", "1000", "priority", "1000"] in cmds
    assert ["ip", "-6", "rule", "add", "from", "fc00:2:1::/48", "table", "1001", "priority", "1001"] in cmds
    # a one-NIC host needs none
    one = load(LAB / "fabric.toml")
    assert not [c for c in one.net_commands("h1") if "rule" in c]


def test_rails_the_link_setup_really_routes_each_nic_out_of_itself(tmp_path):
    """The rendered commands, run in a namespace shaped like server a1: a packet from gpu1_eth's
    address to a host on another leaf leaves through gpu1_eth, one from gpu0_eth's through gpu0_eth
    (without the rules both would take the one default route)."""
    from rlbcommon.netns import run
    from rlblab import topo
    f = load(LAB / "fabric-rails.toml")
    ns, peer = "rlbrf-a1", "rlbrf-x"
    try:
        topo.add_ns(ns), topo.add_ns(peer)
        topo.sysctl(ns, "net.ipv6.conf.default.accept_dad", "0")
        for i, nic in enumerate(("gpu0_eth", "gpu1_eth")):
            topo.link(ns, nic, peer, f"p{i}")
        for cmd in f.net_commands("a1"):
            if cmd[0] != "ethtool":
                run(ns, *cmd)
        run(ns, "ip", "addr", "add", "fc00:1:1:1::a/64", "dev", "gpu0_eth", "nodad")
        run(ns, "ip", "addr", "add", "fc00:2:1:1::a/64", "dev", "gpu1_eth", "nodad")
        for src, nic in (("fc00:1:1:1::a", "gpu0_eth"), ("fc00:2:1:1::a", "gpu1_eth")):
            got = run(ns, "ip", "-6", "route", "get", "fc00:9:9:1::1", "from", src)
            assert f"dev {nic}" in got, got
    finally:
        topo.del_ns(ns), topo.del_ns(peer)


def test_rails_a_server_is_one_etcd_user_writing_for_each_of_its_nics_only():
    f = load(LAB / "fabric-rails.toml")
    ids = {i.user: i for i in keys.identities(f)}
    assert set(ids) == {"rlb-host-a1", "rlb-host-a2", "rlb-switch-s1", "rlb-switch-s2", "rlb-switch-s3",
                        "rlb-switch-s4", "rlb-switch-l1", "rlb-switch-l2", keys.COORDINATOR_USER}
    grants = {(g.prefix, g.perm) for g in ids["rlb-host-a1"].grants}
    assert grants == {(keys.host_prefix("a1-gpu0_eth"), keys.READWRITE), (keys.host_prefix("a1-gpu1_eth"), keys.READWRITE),
                      (keys.placements_prefix("a1-gpu0_eth"), keys.READ),
                      (keys.placements_prefix("a1-gpu1_eth"), keys.READ), (keys.links_prefix(), keys.READ)}
    assert not any(g.prefix.startswith(keys.host_prefix("a2-")[:-1]) for g in ids["rlb-host-a1"].grants)


def test_rails_a_server_gets_one_agent_unit_for_every_nic():
    f = load(LAB / "fabric-rails.toml")
    units = deploy.units(f, Path("/etc/rlb/fabric.toml"), "a1", "10.0.0.9", None)
    assert "rlbhost attach gpu0_eth gpu1_eth --fabric /etc/rlb/fabric.toml --node a1" in units["rlb-host"]
    assert "rlbfabric net --fabric /etc/rlb/fabric.toml --node a1" in units["rlb-net"]
    slow = deploy.units(f, Path("/etc/rlb/fabric.toml"), "a1", "10.0.0.9", None, deploy.Site(hang_s=600))
    assert "\nEnvironment=RLB_HANG_S=600\n" in slow["rlb-host"] and "RLB_HANG_S" not in units["rlb-host"]
    # emulated VMs: a slower sweep and a longer etcd lease, the lease only where there is etcd
    site = deploy.Site(expiry_ms=2000, etcd_lease_s=20)
    on_etcd = deploy.units(f, Path("/etc/rlb/fabric.toml"), "a1", "10.0.0.9",
                           deploy.Coordination(etcd="https://10.0.0.1:2379"), site)["rlb-host"]
    assert "--etcd https://10.0.0.1:2379 " in on_etcd and " --expiry-ms 2000 --etcd-lease-s 20 " in on_etcd
    alone = deploy.units(f, Path("/etc/rlb/fabric.toml"), "a1", "10.0.0.9", None, site)["rlb-host"]
    assert " --expiry-ms 2000 " in alone and "--etcd-lease-s" not in alone
    assert "--expiry-ms" not in units["rlb-host"] and "--etcd-lease-s" not in units["rlb-host"]
    # and agents that work longer on a verbs question (an emulated lab's datagrams take seconds)
    capped = deploy.units(f, Path("/etc/rlb/fabric.toml"), "a1", "10.0.0.9", None,
                          deploy.Site(verbs_max_timeout_ms=6000))["rlb-host"]
    assert " --verbs-max-timeout-ms 6000 " in capped and "--verbs-max-timeout-ms" not in units["rlb-host"]
    with pytest.raises(FabricError, match="'a1-gpu0_eth' is NIC gpu0_eth of server a1: units, link setup and "
                                          r"the agent are the server's \(a1\)"):
        deploy.units(f, Path("/etc/rlb/fabric.toml"), "a1-gpu0_eth", "10.0.0.9", None)


def test_rails_bird_configs_of_a_rail_fabric_parse_and_each_leaf_advertises_its_nics(tmp_path):
    f = load(LAB / "fabric-rails.toml")
    for node in f.switches:
        (tmp_path / f"{node.name}.conf").write_text(birdconf.render(f, node.name, tmp_path))
        peers = {p.bgp_name: "fe80::1" for p in f.ports_up(node)}
        (tmp_path / f"{node.name}.neighbors.conf").write_text(birdconf.render_neighbors(f, node, peers))
        (tmp_path / f"{node.name}.pathbw.conf").write_text(birdconf.render_pathbw(f, node, {}))
        res = subprocess.run(["bird", "-p", "-c", str(tmp_path / f"{node.name}.conf")], capture_output=True, text=True)
        assert res.returncode == 0, (node.name, res.stderr)
    leaf = birdconf.render(f, "l2", tmp_path)
    assert 'interface "eth-a1"' in leaf and 'interface "eth-a2"' in leaf


def test_rails_the_vm_lab_makes_one_vm_per_server_with_a_link_per_nic():
    vms = {vm.name: vm for vm in plan(load(LAB / "fabric-rails.toml"))}
    assert sorted(vms) == ["a1", "a2", "l1", "l2", "mon", "s1", "s2", "s3", "s4"]
    assert [(e.ifname, e.peer, e.peer_ifname) for e in vms["a1"].links] == \
        [("gpu0_eth", "l1", "eth-a1"), ("gpu1_eth", "l2", "eth-a1")]
    assert len({e.name for vm in vms.values() for e in vm.links}) == sum(len(vm.links) for vm in vms.values()) // 2


def test_rails_generated_fabrics_cut_leaves_into_stripes_of_rails():
    f = parse(tomllib.loads(make_fabric(2, 4, 2, rails=2)), "gen")
    assert f.servers == {f"srv{i}": [f"srv{i}-gpu0_eth", f"srv{i}-gpu1_eth"] for i in range(1, 5)}
    assert [f.leaf_of_host(h)[0].name for h in f.servers["srv3"]] == ["l3", "l4"]
    with pytest.raises(ValueError, match="leaves .3. must be a multiple of the rails"):
        make_fabric(2, 3, 2, rails=2)
