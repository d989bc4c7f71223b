"""Fabric files and bird rendering: every node of every lab fabric renders a config that bird2
itself accepts (bird -p), Juniper's Table 2 falls out of the plan, bad files get clear errors."""
import subprocess
import sys
from pathlib import Path

import pytest

from rlbfabric import fabric
from rlbfabric.bird import conf as birdconf

LAB = Path(__file__).resolve().parent.parent / "lab"


@pytest.mark.parametrize("name", ["fabric.toml", "fabric-2x2.toml", "fabric-5stage.toml", "fabric-parallel.toml"])
def test_every_rendered_config_parses_in_bird(name, tmp_path):
    fab = fabric.load(LAB / name)
    for node in fab.switches:
        (tmp_path / f"{node.name}.conf").write_text(birdconf.render(fab, node.name, tmp_path))
        peers = {p.bgp_name: "fe80::1" for p in fab.ports_up(node)}
        (tmp_path / f"{node.name}.neighbors.conf").write_text(birdconf.render_neighbors(fab, node, peers))
        (tmp_path / f"{node.name}.pathbw.conf").write_text(
            birdconf.render_pathbw(fab, node, {"fc00:1:1:1::/64": 1.25e9}))
        res = subprocess.run(["bird", "-p", "-c", str(tmp_path / f"{node.name}.conf")],
                             capture_output=True, text=True)
        assert res.returncode == 0, (node.name, res.stderr)


def test_juniper_table_2_from_the_plan():
    fab = fabric.load(LAB / "fabric.toml")
    adv = birdconf.leaf_advertisements(fab, fab.node("l1"))
    for k in range(1, 5):
        for s in range(1, 5):
            colour, aigp = adv[(f"fc00:1:1:{k}::/64", f"s{s}")]
            assert colour == k and aigp == (s == k)


def test_leaf_config_carries_the_traps_found_on_2_0_12():
    fab = fabric.load(LAB / "fabric.toml")
    conf = birdconf.render(fab, "l1", Path("/run/rlb"))
    assert "igp_metric = 2147483648" in conf and "unset(bgp_aigp)" not in conf
    assert "merge paths off" in conf and "aigp originate" in conf
    assert 'interface "eth-h1"' in conf and "radv" in conf
    spine = birdconf.render(fab, "s1", Path("/run/rlb"))
    assert "aigp on" in spine
    # only the fabric's own peers: each port's expected AS, a cap on prefixes per session
    assert 'interface "eth-l1"; neighbor range fe80::/10 as 65001;' in spine
    assert 'interface "eth-l2"; neighbor range fe80::/10 as 65002;' in spine
    # each session imports only its peer's prefixes, at most as many as it may send
    assert 'import where net ~ [ fc00:1:1::/61{64,64}, fc00:1:2::/61{64,64} ]; import limit 8 action restart' in spine
    assert "receive limit 80 action restart" in spine and "import all" not in spine + conf
    assert "ttl security on;" in spine and "ttl security on;" in conf
    assert "graceful restart on; graceful restart time 10; bfd graceful;" in spine
    assert "neighbor fe80::1 as 65000;" in birdconf.render_neighbors(fab, fab.node("l1"), {"s1": "fe80::1"})


@pytest.mark.parametrize("name", ["fabric.toml", "fabric-5stage.toml", "fabric-parallel.toml"])
def test_every_fabric_port_sends_router_advertisements_as_nobodys_default_router(name):
    """Unnumbered peers of other makes (FRR's `neighbor IF interface`) learn a switch's
    link-local address from its RAs: every fabric port of every switch sends them with lifetime
    0; a leaf's host ports keep the SLAAC ones (hosts' default router, with prefixes)."""
    import re
    fab = fabric.load(LAB / name)
    for node in fab.switches:
        conf = birdconf.render(fab, node.name, Path("/run/rlb"))
        fabric_ports = {p.ifname for p in (*fab.ports_up(node), *fab.ports_down(node))
                        if p.peer.role != "host"} if node.role != "leaf" else {p.ifname for p in fab.ports_up(node)}
        lifetime0 = set(re.findall(r'interface "([^"]+)" \{ min ra interval 3; max ra interval 4; default lifetime 0; \}', conf))
        assert lifetime0 == fabric_ports, (node.name, lifetime0 ^ fabric_ports)
        if node.role == "leaf":
            for _, _, ifname in fab.host_ports(node):
                assert f'interface "{ifname}" {{ min ra interval 3; max ra interval 4; }};' in conf


def test_five_stage_topology():
    fab = fabric.load(LAB / "fabric-5stage.toml")
    assert fab.stages == 5
    s12 = fab.node("s12")
    assert [n.name for n in fab.uplinks(s12)] == ["ss2"] and s12.plane == 2
    assert [n.name for n in fab.downlinks(fab.node("ss1"))] == ["s11", "s21"]
    assert fab.spine_for_path(fab.node("l2"), 2).name == "s22"
    assert fab.link_mbps_between("s12", "ss2") == 5000


@pytest.mark.parametrize("data,msg", [
    ({"leaf": [{"name": "l1", "asn": 1}]}, "at least one"),
    ({"spine": [{"name": "S1", "asn": 1}], "leaf": [{"name": "l1", "asn": 2}]}, "lowercase"),
    ({"spine": [{"name": "s1", "asn": 70000}], "leaf": [{"name": "l1", "asn": 2}]}, "2-byte"),
    ({"spine": [{"name": "s1", "asn": 1}], "leaf": [{"name": "s1", "asn": 2}]}, "used twice"),
    ({"fabric": {"policy": "fast"}, "spine": [{"name": "s1", "asn": 1}], "leaf": [{"name": "l1", "asn": 2}]}, "policy"),
    ({"fabric": {"paths": 3}, "spine": [{"name": "s1", "asn": 1}, {"name": "s2", "asn": 1}],
      "leaf": [{"name": "l1", "asn": 2}]}, "multiple"),
    ({"spine": [{"name": "s1", "asn": 1, "pod": 1}, {"name": "s2", "asn": 1, "pod": 2}],
      "leaf": [{"name": "l1", "asn": 2}]}, "superspine"),
    ({"spine": [{"name": "s1", "asn": 1}], "leaf": [{"name": "l1", "asn": 2, "pod": 3}]}, "no spines"),
    ({"spine": [{"name": "s1", "asn": 1}], "leaf": [{"name": "l1", "asn": 2}],
      "link": [{"between": ["l1", "zz"], "mbps": 1}]}, "unknown node"),
    ({"fabric": {"bfd_ms": 5}, "spine": [{"name": "s1", "asn": 1}], "leaf": [{"name": "l1", "asn": 2}]}, "bfd_ms"),
    ({"fabric": {"bgp_hold_s": 2}, "spine": [{"name": "s1", "asn": 1}], "leaf": [{"name": "l1", "asn": 2}]},
     "bgp_hold_s 2 must be a whole number 3-65535"),
    ({"fabric": {"bgp_hold_s": True}, "spine": [{"name": "s1", "asn": 1}], "leaf": [{"name": "l1", "asn": 2}]},
     "bgp_hold_s True"),
])
def test_bad_fabric_files(data, msg):
    with pytest.raises(fabric.FabricError, match=msg):
        fabric.parse(data)


def test_missing_and_broken_files(tmp_path):
    with pytest.raises(fabric.FabricError, match="not found"):
        fabric.load(tmp_path / "nope.toml")
    (tmp_path / "bad.toml").write_text("[fabric\n")
    with pytest.raises(fabric.FabricError, match="bad.toml"):
        fabric.load(tmp_path / "bad.toml")


def test_bfd_interval_from_the_file_and_the_command_line(tmp_path):
    data = {"fabric": {"bfd_ms": 200}, "spine": [{"name": "s1", "asn": 1}], "leaf": [{"name": "l1", "asn": 2}]}
    assert "min rx interval 200 ms; min tx interval 200 ms" in birdconf.render(fabric.parse(data), "l1", tmp_path)
    out = subprocess.run([sys.executable, "-m", "rlbswitch", "bird-config", "--fabric", str(LAB / "fabric-2x2.toml"),
                          "--node", "s1", "--run-dir", str(tmp_path), "--bfd-ms", "300"],
                         capture_output=True, text=True, check=True).stdout
    assert "min rx interval 300 ms; min tx interval 300 ms; multiplier 3" in out


def test_bgp_hold_time_from_the_file_and_the_command_line_in_bird_and_frr(tmp_path):
    """3 s hold, 1 s keepalives unless the fabric file (bgp_hold_s) or bird-config (--hold-s, the VM
    lab's slow timers) says otherwise; keepalives every third of the hold; FRR spines alike."""
    from rlbfabric.frr.conf import render_spine
    base = {"spine": [{"name": "s1", "asn": 1}], "leaf": [{"name": "l1", "asn": 2}]}
    default = birdconf.render(fabric.parse(base), "l1", tmp_path)
    assert "hold time 3; keepalive time 1; " in default and "hold time 9" not in default
    nine = fabric.parse({"fabric": {"bgp_hold_s": 9}, **base})
    assert "hold time 9; keepalive time 3; " in birdconf.render(nine, "l1", tmp_path)
    frr = fabric.load(LAB / "fabric-frr.toml")
    spine = next(n for n in frr.spines if n.daemon == "frr")
    assert " timers bgp 1 3\n" in render_spine(frr, spine, tmp_path / "frr.log")
    frr.bgp.hold_s = 9
    assert " timers bgp 3 9\n" in render_spine(frr, spine, tmp_path / "frr.log")
    out = subprocess.run([sys.executable, "-m", "rlbswitch", "bird-config", "--fabric", str(LAB / "fabric-2x2.toml"),
                          "--node", "s1", "--run-dir", str(tmp_path), "--hold-s", "30"],
                         capture_output=True, text=True, check=True).stdout
    assert "hold time 30; keepalive time 10; " in out and "hold time 3;" not in out
    bad = subprocess.run([sys.executable, "-m", "rlbswitch", "bird-config", "--fabric", str(LAB / "fabric-2x2.toml"),
                          "--node", "s1", "--run-dir", str(tmp_path), "--hold-s", "2"], capture_output=True, text=True)
    assert bad.returncode == 2 and "--hold-s" in bad.stderr


def test_a_bad_policy_prefix_is_refused_when_the_fabric_is_loaded(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text((LAB / "fabric.toml").read_text() + '\n[policy]\n"fc00:zz::/32" = "fare"\n')
    with pytest.raises(fabric.FabricError, match="key 'fc00:zz::/32' is not an IPv6 prefix"):
        fabric.load(bad)


@pytest.mark.parametrize("tool, fabric_file, node, said", [
    ("rlbswitch", "fabric-2x2.toml", "l1", "(leaf l1); includes "),
    ("rlbhost", "scaleup.toml", "g1", "(GPU g1)"),
])
def test_bird_config_into_a_file_is_its_owner_s_alone(tmp_path, tool, fabric_file, node, said):
    """Both agents' bird-config write through one helper: the file 0600 (it may hold the BGP
    password), a line saying what was written, nothing of the config on stdout."""
    out = tmp_path / "bird.conf"
    res = subprocess.run([sys.executable, "-m", tool, "bird-config", "--fabric", str(LAB / fabric_file), "--node", node,
                          "--run-dir", str(tmp_path), "-o", str(out)], capture_output=True, text=True, check=True)
    assert res.stdout.startswith(f"wrote {out} {said}") and "router id" not in res.stdout
    assert "router id" in out.read_text() and out.stat().st_mode & 0o777 == 0o600
