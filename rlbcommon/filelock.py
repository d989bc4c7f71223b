"""File locks between the agents and the CLI: only root can open them, and nobody holds one forever.

The locks live in RUN_DIR/locks (0700) as files of mode 0600: flock() works on a read-only
descriptor, so a lock file any user could open is a lock any user could hold, stalling the agent.
Taking one waits at most `timeout` seconds, then fails saying so (a CLI step that hung with the lock
held must not freeze the agent that places QPs)."""
from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import time
from pathlib import Path

from .paths import RUN_DIR

LOCK_DIR = RUN_DIR / "locks"
TIMEOUT_S = 10.0


class LockTimeout(RuntimeError):
    pass


def lock_dir() -> Path:
    LOCK_DIR.mkdir(mode=0o700, parents=True, exist_ok=True)
    if LOCK_DIR.stat().st_mode & 0o077:
        os.chmod(LOCK_DIR, 0o700)
    return LOCK_DIR


@contextlib.contextmanager
def held(name: str, timeout: float = TIMEOUT_S):
    """The lock `name` (a file in the lock directory), held for the block."""
    path = lock_dir() / name
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    try:
        os.fchmod(fd, 0o600)
        deadline = time.monotonic() + timeout
        pause = 0.0005
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError as e:
                if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                    raise
            if time.monotonic() >= deadline:
                raise LockTimeout(f"{path} has been held by another process for {timeout:g} s "
                                  f"(a hung `rlbhost`/`rlbswitch` command? `fuser -v {path}` names it)")
            time.sleep(pause)
            pause = min(2 * pause, 0.05)
        try:
            yield
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)
