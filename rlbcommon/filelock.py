"""File locks between the agents and the CLI: only root can open them, and nobody holds one forever.

The locks live in RUN_DIR/locks (0700) as files of mode 0600: flock() works on a read-only
descriptor, so a lock file any user could open is a lock any user could hold, stalling the agent.
Taking one waits at most `timeout` seconds, then fails saying so (a CLI step that hung with the lock
held must not freeze the agent that places QPs). A `Tenure` is the same kind of lock kept for a
process's life: ownership rather than a step."""
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


def _flock_within(fd: int, timeout: float) -> bool:
    """An exclusive flock on fd, waited for at most timeout seconds (0: one try)."""
    deadline = time.monotonic() + timeout
    pause = 0.0005
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except OSError as e:
            if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise
        if time.monotonic() >= deadline:
            return False
        time.sleep(pause)
        pause = min(2 * pause, 0.05)


def _open(path: Path) -> int:
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    os.fchmod(fd, 0o600)
    return fd


@contextlib.contextmanager
def held(name: str, timeout: float = TIMEOUT_S):
    """The lock `name` (a file in the lock directory), held for the block."""
    path = lock_dir() / name
    fd = _open(path)
    try:
        if not _flock_within(fd, timeout):
            raise LockTimeout(f"{path} has been held by another process for {timeout:g} s "
                              f"(a hung `rlbhost`/`rlbswitch` command? `fuser -v {path}` names it)")
        try:
            yield
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


class Tenure:
    """A lock a process keeps until it lets go or exits (not for one block): who owns something,
    such as the right to write a switch's routing maps. The holder writes its pid into the file,
    for the message of whoever finds it held. The descriptor is close-on-exec: an agent that
    starts afresh in place (exec) lets go and takes it again."""

    def __init__(self, name: str):
        self.path = lock_dir() / name
        self.fd: int | None = None

    @property
    def held(self) -> bool:
        return self.fd is not None

    def take(self, timeout: float) -> bool:
        """Hold it (waiting at most timeout seconds for the holder to let go); False if not."""
        if self.fd is not None:
            return True
        fd = _open(self.path)
        try:
            if not _flock_within(fd, timeout):
                os.close(fd)
                return False
        except BaseException:
            os.close(fd)
            raise
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self.fd = fd
        return True

    def holder(self) -> int | None:
        """The pid of the process holding it (this one included); None when nobody does."""
        if self.fd is None:
            fd = _open(self.path)
            try:
                if _flock_within(fd, 0):           # free: let go at once, nothing written
                    return None
            finally:
                os.close(fd)
        try:
            return int(self.path.read_text().strip() or 0) or None
        except (OSError, ValueError):
            return None

    def release(self):
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
