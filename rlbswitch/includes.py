"""What the switch agent tells bird through its include files (a leaf's discovered neighbours,
a spine's FARE path bandwidth): written only when their text changes, and bird reconfigured.
An include whose reconfigure failed counts as not yet given to bird, so the next round writes
and reconfigures again."""
from __future__ import annotations

import logging
from pathlib import Path

from rlbcommon.paths import write_atomic

log = logging.getLogger("rlbswitch.birdsync")


class BirdIncludes:
    def __init__(self, bird):
        self.bird = bird                         # anything with configure() -> bird's reply
        self._written: dict[Path, str] = {}
        self._pending: set[Path] = set()         # written but not yet configured

    def write(self, path: Path, text: str) -> bool:
        """Write `text` to `path` unless it holds it already (and bird has read it). True if
        written."""
        if path not in self._pending and (self._written.get(path) == text
                                          or (path.exists() and path.read_text() == text)):
            self._written[path] = text
            return False
        write_atomic(path, text)
        self._written[path] = text
        return True

    def configure(self, why: str, path: Path):
        """Tell bird to read its includes again; raises what bird raised (the loop backs off)."""
        try:
            reply = self.bird.configure()
        except Exception:
            self._written.pop(path, None)
            self._pending.add(path)
            raise
        self._pending.discard(path)
        log.info("bird reconfigured (%s): %s", why, reply.strip())

    def update(self, path: Path, text: str, why: str):
        if self.write(path, text):
            self.configure(why, path)
