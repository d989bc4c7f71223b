"""The host agent on a GPU of a scale-up fabric (draft-fare-scale-up §3, §3.1, §3.2).

It keeps the host data plane in ports mode: each path is one sub-port into one plane
(rlbfabric/kinds/scaleup.py numbers them), used only while it has carrier and the plane switch's MAC
on it is known. It tells bird the path bandwidth of its loopback per plane (its live sub-ports'
speeds summed), reads from bird every peer's loopback per plane with the plane switch's FARE
value, and sets per peer the weights: plane bandwidth = min(its own live sub-ports there, the
value learnt), split evenly over the plane's live sub-ports; a plane whose probes go unanswered
is not used towards that peer. QPs to a peer that tolerates reordering are sprayed per packet.

Fast paths: carrier loss is written to the data plane by the carrier watcher (rlbhost/carrier.py,
a small real-time process this agent starts and restarts), so the data plane moves the QPs on a
dead port with their next packet; the agent's own view of the port, weights and bird follow.
A probe verdict recomputes that peer's weights at once."""
from __future__ import annotations

import contextlib
import logging
import subprocess
import sys
import threading
import time
from pathlib import Path

from pyroute2 import IPRoute
from pyroute2.netlink.rtnl import RTMGRP_LINK

from rlbcommon.health import Health
from rlbcommon.runtime import AgentRuntime
from rlbfabric.bird.conf import pathbw_file, render_gpu_pathbw
from rlbfabric.bird.ctl import BirdClient, BirdError
from rlbfabric.kinds.scaleup import LOOPBACK_DEVICE, SWITCH_LL, ScaleupFabric

from ..assemble import HOST_AGENTS, Assembled, Options, apply_config, fabric_keys, on_loopback_device
from ..dataplane import HostDataplane, HostError, PortPath, sweep_period
from ..links import has_carrier, neighbour_macs
from ..probekeys import KeyFile
from ..probes import DEAD_MS, INTERVAL_MS, PROBE_PORT, Prober

log = logging.getLogger(__name__)

GBPS = 1e9 / 8           # weights are in Gb/s: bytes/s / GBPS


class ScaleupGpuAgent:
    def __init__(self, dp: HostDataplane, fabric: ScaleupFabric, gpu: str, run_dir: Path,
                 bird_socket: str | None = None, health: Health | None = None,
                 probe_ms: float = INTERVAL_MS, probe_dead_ms: float = DEAD_MS, period_s: float = 0.5,
                 carrier_rt_priority: int = 10, keys: KeyFile | None = None):
        self.dp, self.fabric, self.gpu, self.run_dir = dp, fabric, gpu, Path(run_dir)
        self.bird = BirdClient(bird_socket or str(self.run_dir / f"{gpu}.ctl"))
        self.runtime = AgentRuntime(log, health)
        self.health, self.stop = self.runtime.health, self.runtime.stop
        self.ports = fabric.gpu_ports(gpu)
        self.loopback = fabric.loopback(gpu)
        self.peers = {g.index: fabric.loopback(g.name) for g in fabric.gpus if g.name != gpu}
        self.peer_names = {fabric.loopback(g.name): g.name for g in fabric.gpus if g.name != gpu}
        self.peer_index = {addr: n for n, addr in self.peers.items()}
        self.macs: dict[str, str] = {}             # the plane switch's, per port
        self.own_macs: dict[str, str] = {}
        self.carrier: dict[str, bool] = {}
        self.dead: set[tuple[int, int]] = set()            # (peer GPU number, plane) unanswered
        self.dead_lock = threading.Lock()                  # the prober's thread writes it
        self.period_s = period_s
        self.wake = threading.Event()
        self.lock = threading.Lock()
        self.keys = keys or KeyFile(None)
        self.prober = Prober(fabric.gpu(gpu).index, self.loopback, self.peers, PROBE_PORT, self.live_ports,
                             self._probe_verdict, probe_ms / 1000, probe_dead_ms / 1000,
                             on_round=lambda: self.health.ok("probes"), keys=self.keys.to_check)
        self.supervisor = self.runtime.supervisor
        self.last_weights: dict[str, dict[int, float]] = {}
        self._pathbw_text = None
        self._next_resync = 0.0
        self._ports_programmed: list[PortPath] | None = None
        self.carrier_rt_priority = carrier_rt_priority
        self._watch: subprocess.Popen | None = None
        self._watch_started = 0.0
        self._ports_down_failed = False

    # ---- ports ----------------------------------------------------------------------------
    def _read_carrier(self):
        """Carrier and own MAC of every port, from netlink (sysfs shows the namespace it was
        mounted in, not necessarily the agent's)."""
        links = self._port_links()
        for name, link in links.items():
            self.carrier[name] = has_carrier(link)
            self.own_macs[name] = link.get_attr("IFLA_ADDRESS")
        for name in {p.ifname for p in self.ports} - links.keys():
            self.carrier[name] = False

    def _port_links(self) -> dict:
        """{port name: its link message}, one dump for all the ports."""
        names = {p.ifname for p in self.ports}
        with IPRoute() as ipr:
            return {n: link for link in ipr.get_links() if (n := link.get_attr("IFLA_IFNAME")) in names}

    def _learn_macs(self):
        """The plane switch's MAC on each port, from the neighbour table (BGP runs over the link,
        so it is there); a port without one asks for it."""
        self.macs.update(neighbour_macs({p.ifname: (p.ifname, SWITCH_LL) for p in self.ports
                                         if p.ifname not in self.macs}, self.carrier))

    def port_paths(self) -> list[PortPath]:
        return [PortPath(p.value, p.ifname, self.macs.get(p.ifname), self.carrier.get(p.ifname, False))
                for p in self.ports]

    def usable(self) -> dict[int, list]:
        """{plane number: its ports usable now (carrier, the switch's MAC known)}."""
        out: dict[int, list] = {}
        for p in self.ports:
            if self.carrier.get(p.ifname) and p.ifname in self.macs:
                out.setdefault(p.plane.index, []).append(p)
        return out

    def live_ports(self) -> dict[int, list[tuple[str, str, str]]]:
        """{plane number: [(port, switch MAC, own MAC)]} usable now (the probes' view; read from
        the probe thread while the agent's may forget a MAC). A port the carrier watcher has
        marked down is left out at once: the agent's own netlink follower can lag it by tens of
        milliseconds on a loaded host, and probes sent into a dead port meanwhile would count
        against a plane that still works."""
        try:
            down = self.dp.ports_down()
        except Exception as e:                         # noqa: BLE001 - the agent's view alone
            if not self._ports_down_failed:            # once: this runs every probe round
                log.warning("carrier watcher's mask unreadable (%s): probes follow the agent's carrier view", e)
                self._ports_down_failed = True
            down = 0
        out: dict[int, list[tuple[str, str, str]]] = {}
        for plane, ports in self.usable().items():
            for p in ports:
                mac = self.macs.get(p.ifname)
                if mac and not down >> (p.value - 1) & 1:
                    out.setdefault(plane, []).append(
                        (p.ifname, mac, self.own_macs.get(p.ifname, "00:00:00:00:00:00")))
        return out

    def live_bw(self) -> dict[int, float]:
        """{plane number: bytes/s of this GPU's live sub-ports there}."""
        out = {p.index: 0.0 for p in self.fabric.planes}
        for p in self.ports:
            if self.carrier.get(p.ifname):
                out[p.plane.index] += self._port_bw(p)
        return out

    def _port_bw(self, p) -> float:
        """One sub-port's bytes/s."""
        return self.fabric.sub_mbps(p.plane.name) * 1e6 / 8

    # ---- bird -----------------------------------------------------------------------------
    def sync_pathbw(self):
        """Our loopback's path bandwidth per plane, as bird exports it (rewritten on change)."""
        text = render_gpu_pathbw(self.fabric, self.gpu, self.live_bw())
        if text == self._pathbw_text:
            return
        path = pathbw_file(self.run_dir, self.gpu)
        if not path.exists() or path.read_text() != text:
            path.write_text(text)
            try:
                self.bird.configure()
                log.info("path bandwidth per plane now %s Gb/s; bird reconfigured",
                         {k: v / GBPS for k, v in self.live_bw().items()})
            except BirdError as e:
                log.warning("bird not reconfigured (%s): it reads the include when it starts", e)
        self._pathbw_text = text

    def received(self, routes) -> dict[str, dict[int, float]]:
        """{peer loopback: {plane number: path bandwidth learnt there (bytes/s; inf without the
        community)}} from bird's routes."""
        by_port = {p.ifname: p for p in self.ports}
        out: dict[str, dict[int, float]] = {}
        for r in routes:
            port = by_port.get(r.iface or "")
            addr = r.net.split("/")[0]
            if r.source != "BGP" or port is None or addr not in self.peer_index or r.bad:
                continue
            pbw = r.path_bandwidth(self.fabric.pathbw_subtype)
            planes = out.setdefault(addr, {})
            planes[port.plane.index] = max(planes.get(port.plane.index, 0.0), float("inf") if pbw is None else pbw)
        return out

    def weights_from(self, routes, only: str | None = None) -> dict[str, tuple[dict[int, float], bool]]:
        """Per peer loopback (or only that one): weights by path value (Gb/s). A plane's
        bandwidth is min(this GPU's usable sub-ports there, the value learnt), split evenly over
        them; a plane its probes find silent carries nothing to that peer. Usable, not live: a
        sub-port back with carrier is counted once its switch's MAC is known, or its share went
        to its twin first (all of the plane on one sub-port) and QPs moved twice."""
        received = self.received(routes)
        usable = self.usable()
        live = {plane: sum(self._port_bw(p) for p in ports) for plane, ports in usable.items()}
        out = {}
        for addr in [only] if only else self.peer_index:
            peer = self.peer_index[addr]
            learnt = received.get(addr, {})
            # probes shift a peer's traffic between planes, never take the last one away: when
            # every plane BGP offers is unanswered, the likelier cause is this host or the peer
            # being too busy to answer (or the peer gone, which BGP and BFD will say)
            with self.dead_lock:
                dead = {pl for (pe, pl) in self.dead if pe == peer}
            if learnt and set(learnt) <= dead:
                dead = set()
            w = {p.value: 0.0 for p in self.ports}
            for plane, ports in usable.items():
                if plane in learnt and plane not in dead:
                    for p in ports:
                        w[p.value] = min(live[plane], learnt[plane]) / len(ports) / GBPS
            out[f"{addr}/128"] = (w, self.peer_names[addr] in self.fabric.spray_gpus)
        return out

    # ---- the loop -------------------------------------------------------------------------
    def set_echo(self):
        """The echo answers only probes to our loopback and signs with the key shared with the
        prober, else the first fabric-wide key."""
        self.dp.set_echo(self.loopback, self.keys.keys[0] if self.keys.keys else None, self.keys.pairs)

    def step(self):
        """One pass. bird's I/O (the include, `birdc configure`, reading routes) runs outside
        the lock, so a probe verdict never waits behind it."""
        if self.keys.refresh():
            self.set_echo()
            log.info("probe keys reread from %s: %d fabric-wide, %d shared with one peer each", self.keys.path,
                     len(self.keys.keys), len(self.keys.pairs))
        with self.lock:
            if time.monotonic() >= self._next_resync:     # netlink events keep it current between
                self._read_carrier()
                self._next_resync = time.monotonic() + 5
            self._learn_macs()
            ports = self.port_paths()
            if ports != self._ports_programmed:
                self.dp.set_port_paths(self.loopback, ports, echo=True)
                self._ports_programmed = ports
        self.sync_pathbw()
        try:
            routes = self.bird.routes()
            self.health.ok("bird")
        except BirdError as e:
            self.health.failed("bird", e, log)
            return
        with self.lock:
            want = self.weights_from(routes)
            if want != self.last_weights:
                moved0 = self.dp.stats()["reasons"]["ev_released"]

                def latest():        # computed again under the weights' lock: a verdict since counts
                    want.update(self.weights_from(routes))
                    return {"::/0": ({}, False), **want}
                self.dp.apply_weights(latest)
                moved = self.dp.stats()["reasons"]["ev_released"] - moved0
                changed = {k: v for k, v in want.items() if self.last_weights.get(k) != v}
                for k, (w, spray) in sorted(changed.items()):
                    log.info("weights to %s (%s): %s%s", self.peer_names.get(k.split("/")[0]), k,
                             {v: round(x, 3) for v, x in sorted(w.items())}, " spray" if spray else "")
                if moved:
                    log.info("%d QPs moved to match", moved)
                self.last_weights = want

    def _probe_verdict(self, peer: int, plane: int, up: bool):
        """A plane unanswered: that peer's weights on its sub-ports go to zero at once (the data
        plane moves each QP on them with its next packet), without waiting for the agent's step
        or sweep; the full step follows. An answer again waits for the step (a reinstatement
        releases QPs by weight)."""
        with self.dead_lock:
            (self.dead.discard if up else self.dead.add)((peer, plane))
        if not up:
            t0 = time.monotonic()
            values = {p.value for p in self.ports if p.plane.index == plane}
            if self.dp.zero_paths(f"{self.peers[peer]}/128", values):
                took = (time.monotonic() - t0) * 1000
                if took > 20:
                    log.warning("probe verdict on plane %d to GPU %d applied after %.0f ms", plane, peer, took)
        self.wake.set()

    def _read_links(self):
        """Every port's carrier afresh: on start and each time the follower's socket is made again
        (a storm's ENOBUFS loses events, not state)."""
        for m in self._port_links().values():
            self._carrier_event(m)

    def _link_events(self, msgs) -> bool:
        """Carrier changes: the port's paths flip in the map at once, from the batch's last word
        on each port; the rest follows. Nothing to read again (False)."""
        names = {p.ifname for p in self.ports}
        last = {m.get_attr("IFLA_IFNAME"): m for m in msgs if m["event"] == "RTM_NEWLINK"}
        for name, m in last.items():
            if name in names:
                self._carrier_event(m)
        return False

    def _carrier_event(self, m):
        name, up = m.get_attr("IFLA_IFNAME"), has_carrier(m)
        mac = m.get_attr("IFLA_ADDRESS")
        if mac:
            self.own_macs[name] = mac          # a port re-created under its name has a new one
        if self.carrier.get(name) != up:
            self.carrier[name] = up
            if not up:
                # the switch's side may come back as another port (a replaced cable, a re-created
                # link): its MAC is learnt again when carrier returns
                self.macs.pop(name, None)
            self.dp.set_port_up(name, up)
            log.info("%s: carrier %s", name, "up" if up else "lost")
            self.wake.set()

    def _carrier_watch(self):
        """Keep the carrier watcher running (started from the thread that runs the agent: it
        dies with it). A watcher that keeps exiting is restarted at most once a second."""
        if self._watch is not None:
            if self._watch.poll() is None:
                return
            if time.monotonic() - self._watch_started < 1:
                return
            self.health.failed("carrier", OSError(f"carrier watcher exited ({self._watch.returncode}); "
                                                  "starting it again"), log)
        cmd = [sys.executable, "-m", "rlbhost.carrier", "--pins", str(self.dp.pins),
               "--rt-priority", str(self.carrier_rt_priority)]
        for p in self.ports:
            cmd += ["--port", f"{p.ifname}={p.value - 1}"]
        self._watch = subprocess.Popen(cmd, stdin=subprocess.DEVNULL)
        self._watch_started = time.monotonic()

    def _stop_watch(self):
        if self._watch is not None and self._watch.poll() is None:
            self._watch.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._watch.wait(2)

    def run(self):
        try:
            self._run()
        finally:
            self._stop_watch()

    def _run(self):
        self._carrier_watch()
        ready = threading.Event()
        self.runtime.follow("links", RTMGRP_LINK, self._link_events, self._read_links, ready)
        ready.wait(5)
        self.supervisor.start("probes", self.prober.run)
        log.info("following planes of %s: %d planes x %d sub-ports, loopback %s", self.gpu,
                 len(self.fabric.planes), self.fabric.subports, self.loopback)
        self.runtime.every("sweep", lambda: sweep_period(self.dp.config()["expiry_ms"]), self.dp.rebalance,
                           (HostError, OSError))
        self.runtime.every("planes", self.period_s, self._round, (HostError, OSError), wake=self.wake,
                           foreground=True)

    def _round(self):
        self._carrier_watch()
        self.step()


def attach(dp: HostDataplane, fabric: ScaleupFabric, gpu: str, run_dir: Path, **kw) -> ScaleupGpuAgent:
    """Ports mode on the GPU's loopback device, paths from the fabric file."""
    if gpu not in fabric.hosts:
        raise HostError(f"{gpu!r} is not a GPU in the fabric file (GPUs: {', '.join(fabric.hosts)})")
    agent = ScaleupGpuAgent(dp, fabric, gpu, run_dir, **kw)
    agent._read_carrier()
    agent._learn_macs()
    dp.attach_ports(LOOPBACK_DEVICE, agent.loopback, agent.port_paths(), group_size=fabric.subports, echo=True)
    agent.set_echo()
    return agent


@HOST_AGENTS.register("scaleup")
def assemble(dp: HostDataplane, fabric: ScaleupFabric, opts: Options, health: Health) -> Assembled:
    on_loopback_device(dp, opts)
    keys = fabric_keys(opts.fabric_key, "probe answers are neither signed nor checked")
    timers = {k: v for k, v in (("probe_ms", opts.probe_ms), ("probe_dead_ms", opts.probe_dead_ms)) if v is not None}
    agent = attach(dp, fabric, opts.node, opts.run_dir, health=health, carrier_rt_priority=opts.carrier_rt_priority,
                   keys=keys, **timers)
    apply_config(dp, opts)
    live = [p for p in dp.paths() if p.valid]
    return Assembled(agent, f"attached to {opts.interface} (ports mode): {len(live)} of {len(agent.ports)} "
                     f"sub-ports usable, loopback {agent.loopback}", {"prober": agent.prober})

