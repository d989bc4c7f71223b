"""Entering network namespaces from inside the process.

Agents take `--netns NAME` and call setns() themselves instead of running under
`ip netns exec`: that command gives the process a private mount namespace with a fresh
/sys, where /sys/fs/bpf would be a new, empty bpffs and pinned maps would die with it."""
from __future__ import annotations

import contextlib
import ctypes
import os
import subprocess

NETNS_DIR = "/run/netns"
CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(None, use_errno=True)


def _setns(fd: int):
    # os.setns only exists from Python 3.12; Debian 12 has 3.11
    if _libc.setns(fd, CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"setns: {os.strerror(err)}")


def enter(name: str | None):
    """Move this process into the named namespace (no-op for None)."""
    if not name:
        return
    path = os.path.join(NETNS_DIR, name)
    if not os.path.exists(path):
        raise FileNotFoundError(f"network namespace {name!r} does not exist (ip netns list)")
    fd = os.open(path, os.O_RDONLY)
    try:
        _setns(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def inside(name: str | None):
    """Run a block inside a namespace and come back."""
    if not name:
        yield
        return
    back = os.open("/proc/self/ns/net", os.O_RDONLY)
    try:
        enter(name)
        yield
    finally:
        _setns(back)
        os.close(back)


def private_mount_ns() -> bool:
    """True when this process sees a different mount namespace than PID 1 (ip netns exec)."""
    try:
        return os.readlink("/proc/self/ns/mnt") != os.readlink("/proc/1/ns/mnt")
    except OSError:
        return False


def run(ns: str | None, *cmd: str, check: bool = True, capture: bool = True) -> str:
    """Run a command in a namespace (ip netns exec) and return its stdout."""
    full = (["ip", "netns", "exec", ns] if ns else []) + list(cmd)
    res = subprocess.run(full, check=False, capture_output=capture, text=True)
    if check and res.returncode != 0:
        raise subprocess.CalledProcessError(res.returncode, full, res.stdout, res.stderr)
    return res.stdout if capture else ""
