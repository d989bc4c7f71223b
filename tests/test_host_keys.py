"""Keys per pair of machines (rlbdeploy/hostkeys.py) and how an agent reads and picks them
(rlbhost/probekeys.py): each pair's key in both its machines' files and nowhere else, the sender's
own pair chosen by its address, a sender without a pair refused once the host has pair keys."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from rlbdeploy import hostkeys
from rlbfabric.errors import FabricError
from rlbfabric.fabric import load
from rlbhost.probekeys import KeyFile, ProbeKeyError, read_keys

ROOT = Path(__file__).resolve().parent.parent
FABRIC = load(ROOT / "lab" / "fabric-rails-2x2.toml")       # two servers of two NICs each
MASTER = bytes(range(32))


def test_each_pair_shares_one_key_and_each_file_holds_only_its_own_pairs():
    files = hostkeys.files(FABRIC, MASTER)
    assert set(files) == set(FABRIC.machines) and len(files) == 2
    a, b = sorted(files)
    pairs = {m: read_lines(files[m]) for m in files}
    k_ab = hostkeys.pair_key(MASTER, a, b)
    assert k_ab == hostkeys.pair_key(MASTER, b, a) != hostkeys.pair_key(bytes(32), a, b)
    # a's file: one line per NIC of b, each b's NIC /48 with the pair's key; none of a's own
    assert {net for net, _ in pairs[a]} == {str(n) for n in FABRIC.source_prefixes(b)}
    assert {key for _, key in pairs[a]} == {key for _, key in pairs[b]} == {k_ab.hex()}
    assert len(pairs[a]) == len(FABRIC.endpoints(b)) == 2


def read_lines(text: str) -> list[tuple[str, str]]:
    return [tuple(line.split()) for line in text.splitlines() if line and not line.startswith("#")]


def test_an_agent_checks_a_sender_with_its_pairs_key_alone(tmp_path):
    a, b = sorted(FABRIC.machines)
    path = tmp_path / "key"
    path.write_text(hostkeys.files(FABRIC, MASTER)[a])
    path.chmod(0o600)
    keys = KeyFile(path)
    k_ab = hostkeys.pair_key(MASTER, a, b)
    b_nic = FABRIC.host_prefixes(*FABRIC.leaf_of_host(FABRIC.endpoints(b)[1]))[-1]    # b's 2nd NIC, last path
    addr = str(b_nic.network_address + 0x1234)
    assert keys.to_check(addr) == [k_ab] and keys.to_seal(addr) == k_ab
    assert keys.to_check("fd00::1") is None and keys.to_seal("fd00::1") is None   # no pair, no fabric key
    # a fabric-wide key during a rollout: the senders without a pair of their own are checked with it
    path.write_text(path.read_text() + "00" * 16 + "\n")
    assert keys.refresh() and keys.to_check("fd00::1") == [bytes(16)] and keys.to_check(addr) == [k_ab]
    assert read_keys(path)[0] == [bytes(16)] and len(read_keys(path)[1]) == 2


@pytest.mark.parametrize("line", ["fc00::/48", "fc00::/48 00 11", "nonsense " + "00" * 16, "00" * 15])
def test_a_bad_line_is_refused_with_its_number(tmp_path, line):
    path = tmp_path / "key"
    path.write_text("00" * 16 + "\n" + line + "\n")
    path.chmod(0o600)
    with pytest.raises(ProbeKeyError, match="line 2"):
        read_keys(path)


def test_the_command_writes_private_files_and_refuses_a_master_others_can_read(tmp_path):
    master = tmp_path / "master.key"
    master.write_text(MASTER.hex() + "\n")
    master.chmod(0o644)
    cmd = [sys.executable, "-m", "rlbdeploy.cli", "host-keys", "--fabric", str(ROOT / "lab" / "fabric-rails-2x2.toml"),
           "--master", str(master), "-o", str(tmp_path / "out")]
    r = subprocess.run(cmd, capture_output=True, text=True)
    assert r.returncode == 2 and "chmod 600" in r.stderr + r.stdout
    master.chmod(0o600)
    r = subprocess.run(cmd, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    files = sorted((tmp_path / "out").iterdir())
    assert [f.name for f in files] == [f"{m}.key" for m in sorted(FABRIC.machines)]
    assert all(f.stat().st_mode & 0o777 == 0o600 for f in files)
    assert (tmp_path / "out").stat().st_mode & 0o777 == 0o700


def test_scaleup_gpus_share_a_key_per_pair_filed_under_each_peers_loopback():
    """A scale-up GPU's file: one line per other GPU, its loopback /128 and the pair's key (what
    the GPU's echo signs that peer's probe answers with, and what its prober checks with)."""
    fab = load(ROOT / "lab" / "scaleup-small.toml")
    files = hostkeys.files(fab, MASTER)
    a, b = fab.machines[:2]
    lines = dict(read_lines(files[a]))
    assert set(lines) == {f"{fab.loopback(g)}/128" for g in fab.machines if g != a}
    assert lines[f"{fab.loopback(b)}/128"] == hostkeys.pair_key(MASTER, a, b).hex()


def test_a_fabric_whose_machines_sign_nothing_has_no_host_keys():
    from rlbfabric.kinds.railonly import RailOnlyFabric
    fab = RailOnlyFabric(domains=2, rails=2, prefix="fd70", rail_mbps=100_000, domain_mbps=900_000,
                         delta=0.1, tau_s=1.0)
    with pytest.raises(FabricError, match="sign nothing"):
        hostkeys.files(fab, MASTER)


def test_a_gpu_with_a_leaked_file_cannot_answer_probes_for_another(tmp_path):
    """g3's file leaked: its keys sign answers "from g2" to g1's probe exactly as an echo would.
    g1 checks g2's answers with the g1-g2 key alone, so none is taken; the real echo's is."""
    import socket
    import struct
    from rlbcommon.siphash import siphash24
    from rlbhost import probes
    fab = load(ROOT / "lab" / "scaleup-small.toml")
    g1, g2, g3 = fab.machines[:3]
    files = hostkeys.files(fab, MASTER)
    path = tmp_path / "g1.key"
    path.write_text(files[g1])
    path.chmod(0o600)
    prober = probes.Prober(1, fab.loopback(g1), {2: fab.loopback(g2)}, probes.PROBE_PORT, dict,
                           lambda *a: None, keys=KeyFile(path).to_check)
    seq, t_ns, plane = 77, 123456789, 2
    msg = (struct.pack("!IQBHx", seq, t_ns, plane, 1) + socket.inet_pton(socket.AF_INET6, fab.loopback(g2))
           + socket.inet_pton(socket.AF_INET6, fab.loopback(g1)))

    def tag(key: bytes) -> bytes:
        return siphash24(key, msg).to_bytes(8, "little")
    leaked = [bytes.fromhex(k) for _, k in read_lines(files[g3])]
    assert len(leaked) == len(fab.machines) - 1
    assert not any(prober.verify(fab.loopback(g2), plane, seq, t_ns, tag(k)) for k in leaked)
    assert prober.verify(fab.loopback(g2), plane, seq, t_ns, tag(hostkeys.pair_key(MASTER, g1, g2)))
