"""Keys shared by each pair of machines, for the verbs agents' messages and the scale-up GPUs' probe
answers (rlbhost/probekeys.py reads them): derived from a master key that stays on the operator's
machine, so a host holds only the keys of the pairs it is in and a leaked file lets its reader
speak as that host alone.

    key(a, b) = HMAC-SHA256(master, "rlb-pair" 0 min(a, b) 0 max(a, b))[:16]

Each machine's file has one line per source prefix of every other machine (Fabric.source_prefixes:
a NIC's /48 holding every path's addresses, a scale-up GPU's loopback) and the key of the pair."""
from __future__ import annotations

import hashlib
import hmac
from pathlib import Path

from rlbcommon.paths import private_dir, write_private
from rlbcommon.secretfile import SecretFileError, read_secret

from rlbfabric.errors import FabricError

MASTER_MIN_BYTES = 16


def read_master(path: Path) -> bytes:
    """The master key: 32 or more hex digits in a file only its owner can read."""
    try:
        text = read_secret(path, "master key")
        key = bytes.fromhex(text)
    except SecretFileError as e:
        raise FabricError(str(e)) from None
    except ValueError:
        raise FabricError(f"master key {path}: hexadecimal digits (make one: openssl rand -hex 32)") from None
    if len(key) < MASTER_MIN_BYTES:
        raise FabricError(f"master key {path}: {len(key)} bytes, at least {MASTER_MIN_BYTES}")
    return key


def pair_key(master: bytes, a: str, b: str) -> bytes:
    lo, hi = sorted((a, b))
    return hmac.new(master, b"rlb-pair\0" + lo.encode() + b"\0" + hi.encode(), hashlib.sha256).digest()[:16]


def files(fabric, master: bytes) -> dict[str, str]:
    """{machine: its key file's text}."""
    machines = list(fabric.machines)
    nets = {m: fabric.source_prefixes(m) for m in machines}
    if not any(nets.values()):
        raise FabricError(f"the machines of a {fabric.kind} fabric sign nothing: no host keys to make")
    out = {}
    for me in machines:
        lines = [f"# {me}: keys shared with each other machine (rlbfabric host-keys)"]
        for peer in machines:
            if peer == me:
                continue
            key = pair_key(master, me, peer).hex()
            lines += [f"{net} {key}" for net in nets[peer]]
        out[me] = "\n".join(lines) + "\n"
    return out


def write(fabric, master_file: Path, out: Path) -> list[Path]:
    """Every machine's file as <out>/<machine>.key (0600, in a 0700 directory)."""
    problem = private_dir(out)
    if problem:
        raise FabricError(problem)
    written = []
    for machine, text in files(fabric, read_master(master_file)).items():
        path = out / f"{machine}.key"
        write_private(path, text)
        written.append(path)
    return written
