"""The host agent: follows the interface's addresses (an RA adds or withdraws a prefix -> a
path appears or disappears), sweeps the connection-tracking table (idle QPs expire, the
active counts are re-derived, QPs are released or reinstated to match the weights), and, given
the fabric file, knows its place in the fabric: where its ties between paths start (the local
rule's rotation), QPs to its own leaf counted apart, and a coordinator to report to."""
from __future__ import annotations

import logging
import threading

from pyroute2.netlink.rtnl import RTMGRP_IPV6_IFADDR

from rlbcommon.health import Health
from rlbcommon.runtime import AgentRuntime
from rlbfabric.policy import localrule
from rlbfabric.clos import ClosFabric
from rlbfabric.coord import etcdauth, keys

from .assemble import HOST_AGENTS, Assembled, Options, apply_config, verbs_service
from .coordclient import CoordinatorClient
from .etcdclient import EtcdCoordinatorClient
from .dataplane import HostDataplane, HostError
from .verbs.advice import FabricView

log = logging.getLogger(__name__)


class ClosHostAgent:
    def __init__(self, dp: HostDataplane, ifname: str, path_field: int | None = None,
                 base_value: int | None = None, fabric: ClosFabric | None = None, node: str | None = None,
                 health: Health | None = None):
        self.dp, self.ifname = dp, ifname
        self.path_field, self.base_value = path_field, base_value
        self.fabric, self.node = fabric, node
        self.runtime = AgentRuntime(log, health)
        self.health, self.stop = self.runtime.health, self.runtime.stop

    def sync(self):
        try:
            allowed = None
            if self.fabric:       # only this host's prefixes in the fabric file are paths
                allowed = self.fabric.host_prefixes(*self.fabric.leaf_of_host(self.node))
            self.dp.sync_paths(self.ifname, self.path_field, self.base_value, allowed)
            if self.fabric:
                self.place()
            self.health.ok("addresses")
        except Exception as e:
            self.health.failed("addresses", e, log, (HostError, OSError))

    def place(self):
        """The host's place in the fabric: the rotation where its ties start, a weight entry
        of its own for QPs to hosts on the same leaf (they never reach a spine, so they must not
        turn the rotation the fabric-crossing QPs follow), and weights by link speed for leaves
        reached over paths of unequal speed."""
        leaf, port = self.fabric.leaf_of_host(self.node)
        index = {p.value: p.index for p in self.dp.paths() if p.valid}
        start = localrule.rotation(self.fabric, self.node) + 1          # a path value
        if start in index and self.dp.config()["rotation"] != index[start]:
            self.dp.set_config(rotation=index[start])
            log.info("ties between paths start at path %d (%s, port %d of %s)", start, self.node, port, leaf.name)
        own = str(self.fabric.leaf_prefix(leaf))
        have = {w["prefix"] for w in self.dp.weights()}
        if own not in have:
            self.dp.set_weights({}, prefix=own)
            log.info("QPs to %s (hosts on %s) counted apart", own, leaf.name)
        # leaves reached over slower links: their paths weighed by speed, so the local rule splits
        # by capacity too (an operator's own entry for a prefix is never overwritten)
        for prefix, ws in localrule.path_weights(self.fabric, self.node).items():
            ws = {k: w for k, w in ws.items() if k in index}
            if ws and prefix not in have:
                self.dp.set_weights(ws, prefix=prefix)
                log.info("QPs to %s weighed by the fabric file's link speeds: %s", prefix,
                         ", ".join(f"path {k} {w:g}" for k, w in sorted(ws.items())))

    def run(self):
        """Address events (an RA adds or withdraws a prefix) resync the paths; the sweep runs
        in the foreground every expiry / 2."""
        ready = threading.Event()
        self.runtime.follow("address-events", RTMGRP_IPV6_IFADDR,
                            lambda msgs: any(m["event"] in ("RTM_NEWADDR", "RTM_DELADDR") for m in msgs),
                            self.sync, ready)   # DAD completing also arrives as RTM_NEWADDR
        ready.wait()
        log.info("following addresses of %s; %d paths", self.ifname,
                 sum(p.valid for p in self.dp.paths()))
        self.runtime.every("sweep", lambda: max(0.05, self.dp.config()["expiry_ms"] / 2000), self.dp.rebalance,
                           (HostError, OSError), foreground=True)


def check_place(fabric: ClosFabric, node: str):
    if node not in fabric.hosts:
        raise HostError(f"{node!r} is not a host in the fabric file (hosts: {', '.join(fabric.hosts)})")


@HOST_AGENTS.register("clos")
def assemble(dp: HostDataplane, fabric: ClosFabric | None, opts: Options, health: Health) -> Assembled:
    """A leaf-spine host (or one without a fabric file): TC programs on the fabric interface
    (--no-tc: only followed, for RNICs that build the packets), the coordinator's client and
    the verbs library's agent beside the host agent."""
    node = opts.node if fabric else None
    if fabric:
        check_place(fabric, node)
    if (opts.coordinator or opts.etcd) and not fabric:
        raise HostError("--coordinator and --etcd need --fabric (and --node unless the host name is the fabric's)")
    if (opts.etcd_ca or opts.etcd_cert) and not opts.etcd:
        raise HostError("--etcd-ca and --etcd-cert go with --etcd")
    etcd = None
    if opts.etcd:
        try:
            etcd = etcdauth.client(opts.etcd, keys.host_user(node), opts.etcd_password_file,
                                   opts.etcd_ca, opts.etcd_cert)
        except ValueError as e:
            raise HostError(str(e)) from None
    dp.ifindex(opts.interface)   # before anything is loaded
    if opts.tc:
        dp.attach(opts.interface, opts.path_field, opts.base_path)
    else:
        dp.prepare(opts.interface, opts.path_field, opts.base_path)
    apply_config(dp, opts)
    agent = ClosHostAgent(dp, opts.interface, opts.path_field, opts.base_path, fabric, node, health)
    if fabric:
        agent.place()
    paths = [p for p in dp.paths() if p.valid]
    summary = (f"{'attached to' if opts.tc else 'following'} {opts.interface}: {len(paths)} paths "
               f"({', '.join(f'{p.value}:{p.address}' for p in paths)})")
    if opts.once:
        return Assembled(agent, summary)
    view = FabricView(fabric, node) if (opts.coordinator or opts.etcd) and opts.verbs else None
    client = None
    if opts.coordinator:
        client = CoordinatorClient(dp, node, opts.coordinator, opts.report_ms / 1000, opts.qp_memory_s,
                                   health=health, view=view)
    elif etcd is not None:
        client = EtcdCoordinatorClient(dp, node, etcd, opts.report_ms / 1000, opts.qp_memory_s,
                                       lease_ttl_s=opts.etcd_lease_s, health=health, view=view)
    service = verbs_service(dp, opts, health, view) if opts.verbs else None

    def close():
        if service is not None:
            service.shutdown()
            service.close()
    return Assembled(agent, summary, {"coordinator": client, "verbs": service}, close)

