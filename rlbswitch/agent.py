"""The switch agent: what `rlbswitch run` starts beside the pinned data plane.

It attaches the ports it was given, then follows link state and neighbours (watcher.py), bird2's
routes with --fabric/--node (birdsync.py), reports a leaf's uplinks to the coordinator
(linkreport.py), serves metrics and makes the operator's changes (control.py: the agent is its
tables' one writer). Built from options here, so the CLI only parses them and a
test or a lab can run the same agent. Stopping it leaves forwarding running from the maps."""
from __future__ import annotations

import logging
import ssl
import threading
from dataclasses import dataclass, field
from pathlib import Path

from rlbcommon import coordapi
from rlbcommon.constants import RUN_DIR
from rlbcommon.health import Health
from rlbcommon.metrics import serve
from rlbcommon.runtime import AgentRuntime
from rlbfabric.base import Fabric, SwitchedFabric
from rlbcoord import etcdauth, keys

from . import abi, neightable
from .birdsync import BirdSync
from .control import ControlServer
from .dataplane import DataplaneError, SwitchDataplane
from .heartbeat import INTERVAL_MS, Heartbeat
from .linkreport import EtcdUplinks, HttpUplinks, LinkReporter
from .metrics import SwitchCollector
from .watcher import Watcher

log = logging.getLogger("rlbswitch")


@dataclass
class SwitchOptions:
    """What `rlbswitch run` was given (its --help says what each is for)."""
    interfaces: list[str] = field(default_factory=list)
    generic: bool = False
    speed_mbps: int | None = None
    fabric_file: Path | None = None
    fabric: Fabric | None = None      # read from fabric_file once the options are checked
    node: str | None = None
    bird_socket: str | None = None
    run_dir: Path = RUN_DIR
    control_only: bool = False
    resync_s: float = 1.0
    coordinator: str | None = None
    metrics_port: int = 0
    metrics_addr: str = "127.0.0.1"
    node_label: str = ""
    etcd: str | None = None               # the coordinator through the fabric's etcd instead
    etcd_password_file: Path | None = None
    etcd_ca: Path | None = None
    etcd_cert: Path | None = None
    heartbeat_ms: int = INTERVAL_MS       # neighbours' data-plane liveness (heartbeat.py); 0: off
    coordinator_ca: Path | None = None    # with an https:// coordinator: its CA, this switch's certificate
    coordinator_cert: Path | None = None
    coordinator_tls: ssl.SSLContext | None = None     # made from the two by check()

    def check(self, once: bool):
        """Refuse what the options cannot do together, before anything is attached."""
        if once and (self.fabric_file is not None or self.node or self.coordinator or self.etcd
                     or self.control_only):
            raise DataplaneError("--once only attaches: --fabric, --node, --coordinator, --etcd and "
                                 "--control-only need the agent")
        if self.coordinator and self.etcd:
            raise DataplaneError("--coordinator or --etcd, not both: the coordinator runs on one or the other")
        if (self.etcd_ca or self.etcd_cert) and not self.etcd:
            raise DataplaneError("--etcd-ca and --etcd-cert go with --etcd")
        try:
            self.coordinator_tls = coordapi.client_tls(self.coordinator, self.coordinator_ca, self.coordinator_cert)
        except ValueError as e:
            raise DataplaneError(str(e)) from None
        if once and not self.interfaces:
            raise DataplaneError("--once: name the ports to attach")
        if (self.fabric_file is None) != (self.node is None):
            raise DataplaneError("--fabric and --node go together")
        if (self.control_only or self.coordinator or self.etcd) and self.fabric_file is None:
            what = "--control-only" if self.control_only else "--coordinator" if self.coordinator else "--etcd"
            raise DataplaneError(f"{what} needs --fabric and --node")


def attach_ports(dp: SwitchDataplane, opts: SwitchOptions) -> dict[str, dict]:
    """Attach the ports named (all must exist before anything is loaded). Returns how each was
    attached, so the watcher attaches a port again the same way if it is removed and made anew;
    host ports (from the fabric file) have their punts policed apart from the fabric's control
    traffic."""
    for ifname in opts.interfaces:
        dp.ifindex(ifname)
    fab = opts.fabric
    edge = fab.edge_ports(opts.node) if fab is not None and fab.bgp_switches else set()
    how = {i: {"generic": opts.generic, "speed_mbps": opts.speed_mbps,
               "edge": i in edge if fab is not None else None} for i in opts.interfaces}
    for ifname, o in how.items():
        dp.attach(ifname, **o)
    return how


def switch_facing_ports(dp: SwitchDataplane, fabric: SwitchedFabric, node: str) -> list[str]:
    """The attached ports whose far end is a switch (the fabric file's links, not its hosts')."""
    n = fabric.node(node)
    edge = fabric.edge_ports(node)
    attached = {p.ifname for p in dp.ports()}
    return [p.ifname for p in fabric.ports_up(n) + fabric.ports_down(n)
            if p.ifname not in edge and p.ifname in attached]


class SwitchAgent:
    """The agent's loops over one data plane: started by start(), run() blocks on the netlink
    followers (the foreground) and returns False when one of them could not go on."""

    def __init__(self, dp: SwitchDataplane, opts: SwitchOptions, attached: dict[str, dict],
                 health: Health):
        self.dp, self.opts, self.attached, self.health = dp, opts, attached, health
        self.sync: BirdSync | None = None
        self.runtime: AgentRuntime | None = None
        self.heartbeat: Heartbeat | None = None
        self.control: ControlServer | None = None

    def start(self):
        o = self.opts
        # one runtime for every loop of the agent: the bird follower's too
        self.runtime = AgentRuntime(log, self.health)
        if not o.control_only:
            # commands change the tables through the agent, their one writer (control.py)
            self.control = ControlServer(self.dp)
            self.runtime.every("control", 0, self.control.round)
            neightable.size_for(len(self.dp.ports()), abi.C["RLB_MAX_NEIGHBORS"])
            if o.fabric is not None:
                self.dp.set_gtsm(o.fabric.bgp.ttl_security)
        if o.fabric is not None:
            self.sync = BirdSync(self.dp, o.fabric, o.node, o.bird_socket or str(o.run_dir / f"{o.node}.ctl"),
                                 o.run_dir, self.runtime, resync_s=o.resync_s, program=not o.control_only)
        if self.sync is not None:
            self.runtime.supervisor.start("bird-follower", self.sync.run)   # adoption included: restarted if it fails
            self.runtime.supervisor.exit_when_fatal()
            log.info("following bird2 at %s for %s", self.sync.bird.path, o.node)
        reporter = None
        if o.coordinator or o.etcd:
            try:
                publish = (HttpUplinks(o.coordinator, o.node, o.coordinator_tls) if o.coordinator else
                           EtcdUplinks(etcdauth.client(o.etcd, keys.switch_user(o.node), o.etcd_password_file,
                                                       o.etcd_ca, o.etcd_cert), o.node))
                reporter = LinkReporter(self.sync.fabric, o.node, publish, self.runtime, silent=self.silent_ports)
                reporter.start()
            except ValueError as e:
                raise DataplaneError(str(e)) from None
        # control only: no data plane to take a port out of, nor to answer the neighbours'
        fabric_ports = (switch_facing_ports(self.dp, o.fabric, o.node)
                        if o.fabric is not None and not o.control_only and o.heartbeat_ms else [])
        if fabric_ports:
            self.heartbeat = Heartbeat(self.dp, fabric_ports, o.run_dir / f"{o.node}-heartbeat.json",
                                       o.heartbeat_ms, changed=reporter.changed.set if reporter else None)
            self.runtime.every("heartbeat", o.heartbeat_ms / 1000, self.heartbeat.round)
            log.info("heartbeats every %d ms on %s", o.heartbeat_ms, ", ".join(fabric_ports))
        if o.metrics_port:
            serve(SwitchCollector(self.dp, o.node_label, self.sync, self.health, self.heartbeat),
                  o.metrics_port, o.metrics_addr)

    def silent_ports(self) -> set[str]:
        """Fabric ports whose neighbour has stopped answering heartbeats (carrier up)."""
        return {self.dp.ifname(i) for i in self.dp.silent_ports()}

    def run(self) -> bool:
        if self.opts.control_only:
            log.info("following links, neighbours and addresses (control only: the kernel forwards)")
            threading.Event().wait()
        return Watcher(self.dp, self.health, self.attached, self.runtime).run()
