"""The fabric's keys: a file of keys readable by root only, one a line. A line is either

    <32 hex digits>                      a fabric-wide key (16 bytes)
    <IPv6 prefix> <32 hex digits>        a key shared with the host whose addresses are in the prefix

The plane probes' echo (scale-up GPUs, in the kernel) signs with the first fabric-wide key and the
prober accepts any of them. The verbs agents seal a message to a peer with the key shared with that
peer (the longest prefix holding its address) and check one from it with that key alone, so a host
that leaks its file can speak only as itself; a peer with no line of its own falls back to the
fabric-wide keys (a rollout), and a host that has shared keys but none for a sender and no
fabric-wide key refuses it. `rlbfabric host-keys` writes every machine's file from a master key
kept off the hosts. Rolling a key without a false "plane down" or a refused message anywhere: add
the new key as a further line on every host, then put it first everywhere, then drop the old one
(each step reaches every host before the next; the agent reads the file again within a second of
a change)."""
from __future__ import annotations

import ipaddress
import logging
import os
from pathlib import Path

log = logging.getLogger(__name__)

DEFAULT_KEY_FILE = Path("/etc/rlb/probe-key")
MEMO_MAX = 65536       # peers remembered by KeyFile.shared (a fabric's hosts; emptied when full)


class ProbeKeyError(ValueError):
    pass


Pair = tuple[ipaddress.IPv6Network, bytes]


def read_keys(path: Path) -> tuple[list[bytes], list[Pair]]:
    """(fabric-wide keys, signing key first; keys shared with a peer's prefix) in the file; both
    empty if the file does not exist."""
    try:
        text = path.read_text()
        st = path.stat()
    except FileNotFoundError:
        return [], []
    if st.st_mode & 0o077:
        raise ProbeKeyError(f"{path}: readable by others (mode {oct(st.st_mode & 0o777)}): chmod 600 it")
    keys, pairs = [], []
    for n, line in enumerate(text.splitlines(), start=1):
        words = line.split()
        if not words or words[0].startswith("#"):
            continue
        try:
            key = bytes.fromhex(words[-1])
            net = ipaddress.IPv6Network(words[0], strict=False) if len(words) == 2 else None
        except ValueError:
            key, net = b"", None
        if len(key) != 16 or len(words) > 2 or (len(words) == 2 and net is None):
            raise ProbeKeyError(f"{path}: line {n}: a key is 32 hexadecimal digits, alone or after the "
                                "IPv6 prefix of the host it is shared with")
        if net is None:
            keys.append(key)
        else:
            pairs.append((net, key))
    return keys, pairs


class KeyFile:
    """The key file as last read; reread when it changes. Once keys were read, a file that goes
    away, empties or cannot be read (half edited, mode too open) is a fault, not a change: the
    keys read before stay in use (`bad` says so, for the metrics and alerts, until a good file is
    read); an agent that should check nothing is restarted without the file."""

    def __init__(self, path: Path | None):
        self.path = path
        self.keys: list[bytes] = []
        self.pairs: list[Pair] = []    # keys shared with one peer each (by its prefix)
        self._lengths: list[int] = []  # the pairs' prefix lengths, longest first
        self._by_net: dict[ipaddress.IPv6Network, list[bytes]] = {}
        self._memo: dict[str, list[bytes] | None] = {}   # address -> shared(): every message asks
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
            keys, pairs = read_keys(self.path)
        except ProbeKeyError as e:
            self.unreadable = str(e)   # until the file changes again: the next refresh sees the same stamp
            raise
        self.unreadable = ""
        if not keys and not pairs and (self.keys or self.pairs):
            if not self.missing:
                log.error("%s is gone or empty: the fabric's keys read before stay in use (restart the agent "
                          "to run without keys)", self.path)
            self.missing = True
            return False
        self.missing = False
        changed = (keys, pairs) != (self.keys, self.pairs)
        self.keys, self.pairs = keys, pairs
        self._by_net, self._memo = {}, {}
        for net, key in pairs:
            self._by_net.setdefault(net, []).append(key)
        self._lengths = sorted({net.prefixlen for net in self._by_net}, reverse=True)
        return changed

    def shared(self, addr: str) -> list[bytes] | None:
        """The keys shared with the host at `addr` (the longest prefix holding it), or None."""
        try:
            return self._memo[addr]
        except KeyError:
            pass
        a = ipaddress.IPv6Address(addr.split("%")[0])
        got = None
        for length in self._lengths:
            got = self._by_net.get(ipaddress.IPv6Network((a, length), strict=False))
            if got is not None:
                break
        if len(self._memo) >= MEMO_MAX:
            self._memo.clear()
        self._memo[addr] = got
        return got

    def to_check(self, addr: str) -> list[bytes] | None:
        """The keys a message from `addr` must be sealed with: the ones shared with it, else the
        fabric-wide ones; [] when this host has no keys at all (the first rollout: anything is
        taken); None when it has shared keys but none for this sender and no fabric-wide key
        (refused)."""
        got = self.shared(addr)
        if got is not None:
            return got
        if self.keys or not self.pairs:
            return self.keys
        return None

    def to_seal(self, addr: str) -> bytes | None:
        """The key a message to `addr` is sealed with (None: sent unsealed)."""
        got = self.shared(addr)
        if got is not None:
            return got[0]
        return self.keys[0] if self.keys else None
