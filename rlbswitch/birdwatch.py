"""Following bird2 (the switch agent's reading side): which prefixes bird just changed (its
kernel routes, proto 12, seen on netlink), whether bird restarted (then the programmed routes
are held until it has converged), and which of the paths it reports can be trusted."""
from __future__ import annotations

import logging
import socket
import threading
import time
from datetime import datetime
from typing import Callable

from pyroute2.netlink.rtnl import RTMGRP_IPV6_ROUTE

from rlbcommon.runtime import AgentRuntime
from rlbfabric.base import Node, SwitchedFabric
from rlbfabric.bird.ctl import BirdClient

from .dataplane import SwitchDataplane

log = logging.getLogger("rlbswitch.birdsync")
RTPROT_BIRD = 12        # rtnetlink protocol id of routes bird installs
ROUTE_EVENTS = ("RTM_NEWROUTE", "RTM_DELROUTE")


def restarted(before: str, now: str, slack_s: float = 1.0) -> bool:
    """Whether bird's start time moved on: a new bird (restarted or replaced). bird derives the
    time it prints from its monotonic clock and the wall clock, so the same bird's start time
    drifts by milliseconds whenever the wall clock is slewed (NTP; under emulation, every few
    reads): only a later start, by more than slack_s, is a new bird."""
    try:
        return (datetime.fromisoformat(now) - datetime.fromisoformat(before)).total_seconds() > slack_s
    except ValueError:                  # not a time bird printed: any change is a new bird
        return now != before


class RouteEvents:
    """The prefixes whose kernel route bird added, changed or removed since the last take(),
    followed on the agent's runtime (one netlink loop for every agent: its supervisor, its hang
    watch); `lost()` is called once subscribed and whenever events may have been lost (ENOBUFS
    in a storm, a restarted follower), and the reader then reads everything."""

    def __init__(self, lost: Callable[[], None], stats: dict):
        self.lost, self.stats = lost, stats
        self.wake = threading.Event()
        self._dirty: set[str] = set()
        self._lock = threading.Lock()
        self._ready: threading.Event | None = None

    def on_route_event(self, msg):
        if msg["event"] not in ROUTE_EVENTS or msg["proto"] != RTPROT_BIRD or msg["family"] != socket.AF_INET6:
            return
        dst = msg.get_attr("RTA_DST")
        if not dst:
            return
        with self._lock:
            self._dirty.add(f"{dst}/{msg['dst_len']}")
        self.stats["events"] += 1
        self.wake.set()

    def take(self) -> set[str]:
        with self._lock:
            nets, self._dirty = self._dirty, set()
        return nets

    def _changed(self, msgs: list) -> bool:
        for msg in msgs:
            self.on_route_event(msg)
        return False              # the prefixes are in the messages: nothing to read again here

    def _resync(self):
        self.lost()
        self.wake.set()

    def start(self, runtime: AgentRuntime) -> threading.Event:
        """Follow bird's routes (once: a restarted reader finds the follower running); set once
        subscribed."""
        if self._ready is None:
            self._ready = threading.Event()
            runtime.follow("bird-events", RTMGRP_IPV6_ROUTE, self._changed, self._resync, self._ready)
        return self._ready


class RestartHold:
    """A restarted bird starts with an empty table: keep everything programmed (stale) until
    its sessions are back and its table has stopped changing for a second, or the fabric's
    graceful-restart time is over."""

    def __init__(self, bird: BirdClient, dp: SwitchDataplane, fabric: SwitchedFabric, node: Node,
                 program: bool, stats: dict):
        self.bird, self.dp, self.fabric, self.node = bird, dp, fabric, node
        self.program, self.stats = program, stats
        self.boot: str | None = None            # bird's start time, as last seen
        self.since: float | None = None         # a restarted bird is converging since
        self._table, self._stable_since = None, None

    def bird_boot(self) -> str:
        """bird's own start time, as `show status` says it."""
        for _, text in self.bird.command("show status"):
            if text.startswith("Last reboot on "):
                return text[len("Last reboot on "):].strip()
        return ""

    def check(self, programmed: int):
        boot = self.bird_boot()
        if self.boot is not None and restarted(self.boot, boot):
            self.since = time.monotonic()
            self._table, self._stable_since = None, None
            self.stats["holding"] = 1
            self.stats["bird_restarts"] += 1
            log.warning("bird restarted (%s): holding %d programmed routes until it has converged "
                        "(at most %d s)", boot, programmed, self.fabric.graceful_restart_s)
        self.boot = boot

    def _expected_sessions_up(self) -> bool:
        """Every fabric port whose link is up has an Established session again (a spine's
        dynamic sessions are named <port>_<n>)."""
        sessions = {p["name"]: p["info"] for p in self.bird.protocols() if p["proto"] == "BGP"}
        self.stats["sessions"] = sessions
        links = {p.ifname: p.up for p in self.dp.ports()} if self.program else {}
        for port in self.fabric.ports_up(self.node) + self.fabric.ports_down(self.node):
            if links and not links.get(port.ifname, False):
                continue                        # a dead link has no session to wait for
            names = [n for n in sessions if n == port.bgp_name or n.startswith(port.bgp_name + "_")]
            if not any(sessions[n].startswith("Established") for n in names):
                return False
        return True

    def holding(self, table_key: str | None = None) -> bool:
        if self.since is None:
            return False
        now = time.monotonic()
        if table_key is not None and table_key != self._table:
            self._table, self._stable_since = table_key, now
        waited = now - self.since
        if waited >= self.fabric.graceful_restart_s:
            log.warning("bird restarted %.0f s ago and has not converged: programming what it has", waited)
        elif not (self._expected_sessions_up() and self._stable_since is not None
                  and now - self._stable_since >= 1.0):
            return True
        else:
            log.info("bird has recovered after %.1f s: programming its table", waited)
        self.since = None
        self.stats["holding"] = 0
        return False


class TrustedPaths:
    """Paths whose attributes can be trusted; each bad one is logged once and left out."""

    def __init__(self, fabric: SwitchedFabric, stats: dict):
        self.subtypes = (fabric.pathbw_subtype, fabric.linkbw_subtype)
        self.stats = stats
        self._reported: set = set()

    def __call__(self, paths) -> list:
        out = []
        for p in paths:
            problems = p.check(self.subtypes)
            if not problems:
                out.append(p)
                continue
            key = (p.net, p.proto, tuple(problems))
            if key not in self._reported:
                self._reported.add(key)
                log.warning("%s via %s from %s ignored: %s", p.net, p.iface, p.proto, "; ".join(problems))
            self.stats["bad_paths"] += 1
        return out
