"""What both agents' data-plane classes share: a pin directory of maps opened with bcc's
layouts, a lock for read-modify-write between the CLI and the agent, netlink sockets, cleanup."""
from __future__ import annotations

import contextlib
import shutil
import socket
import threading

from . import bpfprog
from .filelock import held
from .paths import pin_dir


class NotAttached(RuntimeError):
    pass


class PinnedState:
    component = ""        # "switch" or "host": the pin directory's last part
    source = ""           # the bpf/ program whose maps these are
    marker = ""           # a map that exists once the program was loaded
    error = RuntimeError  # what the agent's operator-facing errors are
    hint = ""             # how to create the state

    def __init__(self, instance: str | None = None):
        self.instance = instance or "default"
        self.pins = pin_dir(self.component, self.instance)
        self.bpf = None
        self._maps = None
        self._thread_lock = threading.RLock()
        self._lock_depth = 0
        self._part_locks: dict[str, threading.Lock] = {}

    @staticmethod
    @contextlib.contextmanager
    def netlink():
        """A netlink socket for one step, closed after it. Never one shared between threads:
        pyroute2's IPRoute keeps an event loop and a transport per thread that uses it and frees
        neither when the thread ends, so a shared one leaked a file descriptor on every scrape
        (the metrics server runs each request in a new thread) until the agent ran out of them
        (about 30 min at 2 s scrapes, under systemd's limit of 1024). A fresh one costs ~0.3 ms.
        pyroute2 is loaded here, by the first step that needs it: importing it is a third of the
        start of a command that never does (`rlbswitch route apply` is timed end to end)."""
        from pyroute2 import IPRoute
        with IPRoute() as ipr:
            yield ipr

    def _once(self, attr: str, make):
        """self.<attr>, made by make() on first use, once for all threads: the agents' threads
        first ask at about the same instant, and two of something that keeps state (the
        switch's route model) means one of them goes stale behind the other's writes."""
        made = getattr(self, attr)
        if made is None:
            with self._thread_lock:
                made = getattr(self, attr)
                if made is None:
                    made = make()
                    setattr(self, attr, made)
        return made

    @property
    def maps(self):
        return self._once("_maps", self._open_maps)

    def _open_maps(self):
        if not self.exists():
            raise self.error(f"no {self.component} data plane at {self.pins}: {self.hint}")
        return bpfprog.open_maps(self.source, self.pins)

    def exists(self) -> bool:
        return (self.pins / self.marker).exists()

    @contextlib.contextmanager
    def locked(self):
        """Serialise read-modify-write of the maps between the CLI and the agent (a file lock)
        and between this process's threads; re-entrant, so a locked step may call another."""
        with self._thread_lock:
            if self._lock_depth:
                self._lock_depth += 1
                try:
                    yield
                finally:
                    self._lock_depth -= 1
                return
            with held(f"{self.instance}-{self.component}.lock"):
                self._lock_depth = 1
                try:
                    yield
                finally:
                    self._lock_depth = 0

    @contextlib.contextmanager
    def locked_part(self, part: str):
        """A lock of its own for one small map that a hot path rewrites (the switch's port
        liveness), so that it never waits behind a long step under locked() such as a
        reload of the route model. Taken after locked() when both are needed, never before."""
        with self._part_locks.setdefault(part, threading.Lock()), \
                held(f"{self.instance}-{self.component}-{part}.lock"):
            yield

    def compile(self, cflags: list[str] | None = None):
        """bcc-compile the program against the pins (maps created or adopted)."""
        self.bpf = bpfprog.compile_program(self.source, self.pins, cflags)
        self._maps = None
        return self.bpf

    def ifindex(self, ifname: str) -> int:
        """The interface's index in this namespace (one ioctl: route programming asks per next hop)."""
        try:
            return socket.if_nametoindex(ifname)
        except OSError:
            raise self.error(f"no interface {ifname!r} here") from None

    def remove_pins(self):
        """Close, and delete every pinned map (with the record of their layouts)."""
        self.close()
        shutil.rmtree(self.pins, ignore_errors=True)
        with contextlib.suppress(OSError):
            self.pins.parent.rmdir()
        bpfprog.forget_pinned_layouts(self.pins)

    def close(self):
        """Close fds only: attached programs and pinned maps stay."""
        for m in (self._maps or {}).values():
            m.close()
        self._maps = None
        if self.bpf is not None:
            self.bpf.cleanup()
            self.bpf = None
