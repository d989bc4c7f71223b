"""The agents' UDP agreement (protocol.py's ASK/CHECK/... on port 4798), authenticated with the
fabric's keys (rlbhost/probekeys.py: the same file as the plane probes'). A sealed message is

    <message> @<sender's clock, ms> <HMAC-SHA256 over both, first 16 bytes, hex>

so a process that can send UDP to a host but does not hold the key can neither forge a question
(which would take a path on the host's behalf) nor an answer; a copy replayed later is refused
for its age, and within the window for having been seen (every resend carries a new budget, so
it is a new message). The window assumes the fleet's clocks within a second of each other, as a
GPU cluster's NTP or PTP keeps them.

During a key's first rollout a host without keys takes sealed messages (it cannot check them) and
a host with keys refuses unsealed ones: the pairs of the two kinds keep their addresses until
every host has the file, and nothing is lost."""
from __future__ import annotations

import collections
import hashlib
import hmac
import time

from .protocol import BadMessage

WINDOW_MS = 2000          # how old (or how far ahead) a sealed message may be
TAG_LEN = 16
SEAL_MAX = len(b" @") + 20 + 1 + 2 * TAG_LEN     # what seal() adds at most (a 64-bit clock)


def seal(body: bytes, key: bytes, now_ms: int | None = None) -> bytes:
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    head = body + b" @%d" % now_ms
    return head + b" " + hmac.new(key, head, hashlib.sha256).digest()[:TAG_LEN].hex().encode()


def split(data: bytes) -> tuple[bytes, int, bytes] | None:
    """(message, clock, tag) of a sealed message, None if it carries no seal."""
    head, _, tag = data.rpartition(b" ")
    body, _, at = head.rpartition(b" @")
    if not body or len(tag) != 2 * TAG_LEN or not at.isdigit():
        return None
    try:
        return body, int(at), bytes.fromhex(tag.decode("ascii"))
    except ValueError:
        return None


class Unsealer:
    """Checks what arrives: the message without its seal, or BadMessage with the reason."""

    def __init__(self, window_ms: int = WINDOW_MS):
        self.window_ms = window_ms
        self._seen: collections.OrderedDict[bytes, int] = collections.OrderedDict()   # tag -> clock

    def open(self, data: bytes, keys: list[bytes], now_ms: int | None = None) -> bytes:
        now_ms = int(time.time() * 1000) if now_ms is None else now_ms
        parts = split(data)
        if not keys:
            return parts[0] if parts else data          # nothing to check with (first rollout)
        if parts is None:
            raise BadMessage("not sealed (this host has the fabric's keys)")
        body, at, tag = parts
        head = data[:len(data) - 2 * TAG_LEN - 1]
        if not any(hmac.compare_digest(hmac.new(k, head, hashlib.sha256).digest()[:TAG_LEN], tag) for k in keys):
            raise BadMessage("the seal matches none of the fabric's keys")
        if abs(now_ms - at) > self.window_ms:
            raise BadMessage(f"sealed {now_ms - at} ms from now (the window is {self.window_ms} ms)")
        while self._seen and next(iter(self._seen.values())) < now_ms - 2 * self.window_ms:
            self._seen.popitem(last=False)
        if tag in self._seen:
            raise BadMessage("a replay")
        self._seen[tag] = now_ms
        return body
