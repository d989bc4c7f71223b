"""The plane probes' keys: a file of 32-hex-digit keys (16 bytes each), one per line, readable by
root only. The echo signs its answers with the first; the prober accepts an answer signed with
any of them. Rolling a key without a false "plane down" anywhere: add the new key as a second line
on every GPU, then swap the lines everywhere, then drop the old one (each step reaches every GPU
before the next; the agent reads the file again within a second of a change)."""
from __future__ import annotations

import logging
import os
from pathlib import Path

log = logging.getLogger(__name__)

DEFAULT_KEY_FILE = Path("/etc/rlb/probe-key")


class ProbeKeyError(ValueError):
    pass


def read_keys(path: Path) -> list[bytes]:
    """The keys in the file, signing key first; [] if the file does not exist."""
    try:
        text = path.read_text()
        st = path.stat()
    except FileNotFoundError:
        return []
    if st.st_mode & 0o077:
        raise ProbeKeyError(f"{path}: readable by others (mode {oct(st.st_mode & 0o777)}): chmod 600 it")
    keys = []
    for n, line in enumerate(text.split(), start=1):
        try:
            key = bytes.fromhex(line)
        except ValueError:
            key = b""
        if len(key) != 16:
            raise ProbeKeyError(f"{path}: line {n}: a key is 32 hexadecimal digits")
        keys.append(key)
    return keys


class KeyFile:
    """The key file as last read; reread when it changes. Once keys were read, a file that goes
    away, empties or cannot be read (half edited, mode too open) is a fault, not a change: the
    keys read before stay in use (`bad` says so, for the metrics and alerts, until a good file is
    read); an agent that should check nothing is restarted without the file."""

    def __init__(self, path: Path | None):
        self.path = path
        self.keys: list[bytes] = []
        self.missing = False           # gone or empty
        self.unreadable = ""           # why the file as it is now cannot be read
        self._stamp = None
        self.refresh()

    @property
    def bad(self) -> bool:
        return self.missing or bool(self.unreadable)

    def refresh(self) -> bool:
        """True when the keys changed."""
        if self.path is None:
            return False
        try:
            st = os.stat(self.path)
            stamp = (st.st_mtime_ns, st.st_size, st.st_ino)
        except FileNotFoundError:
            stamp = None
        if stamp == self._stamp:
            return False
        self._stamp = stamp
        try:
            keys = read_keys(self.path)
        except ProbeKeyError as e:
            self.unreadable = str(e)   # until the file changes again: the next refresh sees the same stamp
            raise
        self.unreadable = ""
        if not keys and self.keys:
            if not self.missing:
                log.error("%s is gone or empty: the fabric's keys read before stay in use (restart the agent "
                          "to run without keys)", self.path)
            self.missing = True
            return False
        self.missing = False
        changed = keys != self.keys
        self.keys = keys
        return changed
