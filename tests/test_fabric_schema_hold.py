"""Bad fabric files get a clear error naming the file, line and field, and change nothing
(rlbfabric/schema.py before clos.py's rules); generated input never crashes the fabric parser or
the agents' message parsers (hypothesis)."""
from __future__ import annotations

import copy
import tomllib
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from rlbfabric.fabric import FabricError, load, parse
from rlbhost.verbs import protocol as P
from rlbhost.verbs.peerauth import Unsealer

ROOT = Path(__file__).resolve().parent.parent
LAB = (ROOT / "lab" / "fabric.toml").read_text()


@pytest.mark.parametrize("old,new,message", [
    ("link_mbps = 10000", 'link_mbps = "fast"', r':6: \[fabric\]: link_mbps "fast" must be a whole number'),
    ("link_mbps = 10000", "link_mbps = -5", r":6: \[fabric\]: link_mbps -5 must be a whole number 1-"),
    ("pathbw_subtype = 0x88", 'pathbw_subtype = "x"', r":8: \[fabric\]: pathbw_subtype \"x\" must be a whole number 0-255"),
    ("pathbw_subtype = 0x88", "pathbw_subtype = 300", r":8: \[fabric\]: pathbw_subtype 300 must be a whole number 0-255"),
    ("bfd = true", 'bfd = "yes"', r":7: \[fabric\]: bfd \"yes\" must be true or false"),
    ("paths = 4", "pathz = 4", r":3: \[fabric\]: no field 'pathz' \(did you mean 'paths'\?\)"),
    ('hosts = ["h3", "h4"]', 'hosts = "h3"', r":30: \[\[leaf\]\] 2 \(l2\): hosts \"h3\" must be a list of names"),
    ("asn = 65002", 'asn = "x"', r":29: \[\[leaf\]\] 2 \(l2\): asn \"x\" must be a 2-byte AS number 1-65535"),
    ("asn = 65002", "asn = 65000", r"leaf l2 has AS 65000, as s\d does: a leaf's sessions to its spines are eBGP"),
    ("[[leaf]]\nname = \"l2\"", "[[leef]]\nname = \"l2\"", r":27: \[leef\]: no such table \(did you mean 'leaf'\?\)"),
])
def test_hold_a_bad_fabric_file_names_file_line_and_field(tmp_path, old, new, message):
    assert old in LAB
    f = tmp_path / "fabric.toml"
    f.write_text(LAB.replace(old, new, 1))
    with pytest.raises(FabricError, match=str(f).replace(".", r"\.") + message if message.startswith(":") else message):
        load(f)


def test_hold_ten_thousand_hosts_on_a_leaf_are_refused():
    data = tomllib.loads(LAB)
    data["leaf"][0]["hosts"] = [f"x{i}" for i in range(10000)]
    with pytest.raises(FabricError, match="10000 host ports: at most 9999"):
        parse(data, "fab")


VALUES = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70), st.text(max_size=12),
                   st.lists(st.text(max_size=5), max_size=3), st.dictionaries(st.text(max_size=5), st.integers(), max_size=2))
BASE = tomllib.loads(LAB)
PLACES = [("fabric", None, k) for k in BASE["fabric"]] + [("fabric", None, "kind")] + \
    [(t, i, k) for t in ("spine", "leaf") for i in range(2) for k in BASE[t][i]] + [("leaf", 0, "pod"), ("leaf", 1, "hosts")]


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.sampled_from(PLACES), VALUES), min_size=1, max_size=3))
def test_hold_generated_fabric_values_are_taken_or_refused_never_a_crash(changes):
    data = copy.deepcopy(BASE)
    for (table, i, key), value in changes:
        (data[table] if i is None else data[table][i])[key] = value
    try:
        fab = parse(data, "generated")
    except FabricError:
        return
    # taken: then what it says has the types and ranges the agents rely on
    assert fab.leaves and fab.spines and 1 <= fab.paths <= 16
    assert type(fab.link_mbps) is int and fab.link_mbps > 0 and type(fab.bfd) is bool


@settings(max_examples=600, deadline=None)
@given(st.binary(max_size=300) | st.text(max_size=200).map(str.encode) |
       st.lists(st.sampled_from([b"ASK", b"CHECK", b"USED", b"CONFIRM", b"HAS", b"REPLY", b"PATHS", b"1", b"-1",
                                 b"fc00::1", b"ACK", b"YES", b"1,2", b"-", b"99999999999999999999999"]),
                max_size=10).map(b" ".join))
def test_hold_no_datagram_crashes_the_agents_message_parsers(data):
    for line in P.unpack_peer(data):
        try:
            m = P.parse_peer(line)
        except P.BadMessage:
            continue
        assert P.parse_peer(m.encode()) == m          # what is taken reads back the same
    try:
        Unsealer().open(data, [bytes(16)], 1_000_000)
    except P.BadMessage:
        pass
    try:
        P.parse_local(data)                           # what a library sends its agent
    except P.BadMessage:
        pass


def test_hold_birds_log_in_memory_is_capped(tmp_path):
    """bird logs into the run directory (tmpfs): past 8 MiB it moves to one backup, so a switch's
    or GPU's bird never holds more than 16 MiB of memory in logs (bird itself parses the line:
    test_fabric_config's test_every_rendered_config_parses_in_bird)."""
    from rlbfabric.bird import conf
    fab = load(ROOT / "lab" / "fabric.toml")
    for node in ("l1", "s1"):
        text = conf.render(fab, node, tmp_path)
        assert f'log "{tmp_path}/{node}.bird.log" {8 << 20} "{tmp_path}/{node}.bird.log.1" all;' in text


def test_hold_secret_files_others_can_read_are_refused(tmp_path):
    """The BGP password and the etcd passwords are read only from files their owner alone can
    read: a group- or world-readable one is an error naming the file and the fix."""
    from rlbfabric.bgpsec import BgpSecurity
    from rlbcoord import etcdauth
    f = tmp_path / "secret"
    f.write_text("s3cret\n")
    f.chmod(0o644)
    with pytest.raises(FabricError, match=r"BGP password file .*secret is readable by others \(mode 0o644\): chmod 600"):
        BgpSecurity(password_file=str(f)).secret()
    with pytest.raises(ValueError, match="etcd password file .*readable by others"):
        etcdauth.read_password(f)
    f.chmod(0o600)
    assert BgpSecurity(password_file=str(f)).secret() == "s3cret" == etcdauth.read_password(f)
