"""Files that hold secrets (the BGP password, etcd passwords; the fabric's keys have their own
reader, rlbhost/probekeys.py): read only when no one but their owner can read them."""
from __future__ import annotations

import os
from pathlib import Path


class SecretFileError(ValueError):
    pass


def read_secret(path: Path | str, what: str) -> str:
    """The file's text, stripped; SecretFileError when it cannot be read or others can read it."""
    path = Path(path)
    try:
        with open(path) as f:
            mode = os.fstat(f.fileno()).st_mode
            text = f.read().strip()
    except OSError as e:
        raise SecretFileError(f"{what} {path}: {e.strerror}") from None
    if mode & 0o077:
        raise SecretFileError(f"{what} {path} is readable by others (mode {oct(mode & 0o777)}): chmod 600 it")
    return text
