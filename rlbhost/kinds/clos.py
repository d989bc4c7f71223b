"""The host agent of a leaf-spine host or GPU server, for each of its fabric NICs: follows the
NIC's addresses (an RA adds or withdraws a prefix -> a path appears or disappears), sweeps its
connection-tracking table (idle QPs expire, the active counts are re-derived, QPs are released or
reinstated to match the weights), and, given the fabric file, knows the NIC's place in the fabric:
where its ties between paths start (the local rule's rotation), QPs to its own leaf counted apart,
and a coordinator to report to. NICs are independent: one that goes away (link down, driver
reset) loses its own paths, and only its QPs move."""
from __future__ import annotations

import logging
import subprocess
import threading

from pyroute2.netlink.rtnl import RTMGRP_IPV6_IFADDR

from rlbcommon.health import Health
from rlbcommon.runtime import AgentRuntime
from rlbfabric.policy import localrule
from rlbfabric.kinds.clos import ClosFabric
from rlbcoord import etcdauth, keys

from ..addrevents import AddressChanges
from ..assemble import HOST_AGENTS, Assembled, Options, apply_config, verbs_service
from ..coordclient import CoordinatorClient
from ..etcdclient import EtcdCoordinatorClient, Lease
from ..dataplane import HostDataplane, HostError, sweep_period
from ..nics import Nic, fabric_nics, open_nics
from ..verbs.advice import FabricView

log = logging.getLogger(__name__)


class ClosHostAgent:
    def __init__(self, nics: list[Nic], path_field: int | None = None, base_value: int | None = None,
                 fabric: ClosFabric | None = None, health: Health | None = None, tc: bool = True):
        self.nics = nics
        self.path_field, self.base_value = path_field, base_value
        self.fabric, self.tc = fabric, tc
        self.runtime = AgentRuntime(log, health)
        self.health, self.stop = self.runtime.health, self.runtime.stop
        self._dirty: set[int] | None = None          # ifindexes whose addresses changed (None: all)
        self._addresses = AddressChanges()            # a lifetime refreshed by an RA is no change
        self._heard = False                           # the next resync is for events (not a (re)start)

    @staticmethod
    def _named(nic: Nic, what: str) -> str:
        return f"{nic.ifname}: {what}" if nic.label else what

    def sync(self, nics: list[Nic] | None = None):
        """Each NIC's paths from its addresses, and its place; one NIC failing (gone, renamed)
        leaves the others as they are."""
        failed = None
        for nic in nics or self.nics:
            try:
                self._sync(nic)
            except (HostError, OSError) as e:
                failed = e
                log.warning(self._named(nic, "%s (its other state stays)"), e)
        if failed is None:
            self.health.ok("addresses")
        else:
            self.health.failed("addresses", failed, log, (HostError, OSError))

    def _sync(self, nic: Nic):
        dp = nic.dp
        try:
            idx = dp.ifindex(nic.ifname)
        except HostError:
            if nic.label and any(p.valid for p in dp.paths()):   # the NIC went away: its paths with it
                dp.set_paths({}, dp.config()["path_field"])
                log.warning("%s is gone: its paths are out of use, its QPs released", nic.ifname)
            raise
        if nic.ifindex and idx != nic.ifindex and self.tc:
            dp.attach(nic.ifname, self.path_field, self.base_value)   # made anew: its programs again
            log.info("%s was made anew (index %d, was %d): programs attached again", nic.ifname, idx, nic.ifindex)
        nic.ifindex = idx
        allowed = None
        if self.fabric:       # only this NIC's prefixes in the fabric file are paths
            allowed = self.fabric.host_prefixes(*self.fabric.leaf_of_host(nic.host))
        dp.sync_paths(nic.ifname, self.path_field, self.base_value, allowed)
        if self.fabric:
            self.place(nic)
            self.route(nic)

    def route(self, nic: Nic):
        """A server's NIC sends what it originates from its addresses out of itself (the rule
        and table rlbfabric renders for rlb-net): put back when missing, as the kernel deletes a
        NIC's routes when it goes down, and rlb-net ran once at boot."""
        hosts = self.fabric.endpoints(self.fabric.machine_of(nic.host))
        if len(hosts) < 2 or not any(p.valid for p in nic.dp.paths()):
            return
        cmds = self.fabric.nic_routing(nic.host, hosts.index(nic.host))
        table = cmds[0][cmds[0].index("table") + 1]
        have = subprocess.run(["ip", "-6", "route", "show", "table", table, "default"], capture_output=True, text=True)
        rules = subprocess.run(["ip", "-6", "rule", "show", "priority", table], capture_output=True, text=True)
        if have.stdout.strip() and rules.stdout.strip():
            return
        for cmd in cmds:
            res = subprocess.run(cmd, capture_output=True, text=True)
            if res.returncode and "File exists" not in res.stderr:
                raise HostError(f"{' '.join(cmd)}: {res.stderr.strip()}")
        log.info("%s: its source route put back (table %s: what it sends from its addresses leaves through it)",
                 nic.ifname, table)

    def place(self, nic: Nic):
        """The NIC's place in the fabric: the rotation where its ties start, a weight entry
        of its own for QPs to hosts on the same leaf (they never reach a spine, so they must not
        turn the rotation the fabric-crossing QPs follow), and weights by link speed for leaves
        reached over paths of unequal speed."""
        dp, host = nic.dp, nic.host
        leaf, port = self.fabric.leaf_of_host(host)
        index = {p.value: p.index for p in dp.paths() if p.valid}
        start = localrule.rotation(self.fabric, host) + 1          # a path value
        if start in index and dp.config()["rotation"] != index[start]:
            dp.set_config(rotation=index[start])
            log.info("ties between paths start at path %d (%s, port %d of %s)", start, host, port, leaf.name)
        own = str(self.fabric.leaf_prefix(leaf))
        have = {w["prefix"] for w in dp.weights()}
        if own not in have:
            dp.set_weights({}, prefix=own)
            log.info(self._named(nic, "QPs to %s (hosts on %s) counted apart"), own, leaf.name)
        # leaves reached over slower links: their paths weighed by speed, so the local rule splits
        # by capacity too (an operator's own entry for a prefix is never overwritten)
        for prefix, ws in localrule.path_weights(self.fabric, host).items():
            ws = {k: w for k, w in ws.items() if k in index}
            if ws and prefix not in have:
                dp.set_weights(ws, prefix=prefix)
                log.info(self._named(nic, "QPs to %s weighed by the fabric file's link speeds: %s"), prefix,
                         ", ".join(f"path {k} {w:g}" for k, w in sorted(ws.items())))

    def _changed(self, msgs) -> bool:
        """Address events of our NICs (or of an interface unknown: a NIC made anew) mark them,
        unless the address was seen as it is (addrevents.py: each RA refreshes its lifetimes)."""
        ours = {n.ifindex for n in self.nics}
        hit = False
        for m in msgs:
            if m["event"] not in ("RTM_NEWADDR", "RTM_DELADDR"):   # DAD completing is RTM_NEWADDR too
                continue
            if not self._addresses.changed(m):
                continue
            hit = self._heard = True
            if self._dirty is not None:
                if m["index"] in ours:
                    self._dirty.add(m["index"])
                else:
                    self._dirty = None
        return hit

    def _resync(self):
        if not self._heard:                 # following afresh: every address is read again
            self._addresses.forget()
        self._heard = False
        dirty, self._dirty = self._dirty, set()
        self.sync(None if dirty is None else [n for n in self.nics if n.ifindex in dirty] or None)

    def sweep(self):
        for nic in self.nics:
            nic.dp.rebalance()

    def run(self):
        """Address events (an RA adds or withdraws a prefix) resync the NICs they are on; the
        sweep runs in the foreground every expiry / 2."""
        ready = threading.Event()
        self._dirty = None
        self.runtime.follow("address-events", RTMGRP_IPV6_IFADDR, self._changed, self._resync, ready)
        ready.wait()
        log.info("following addresses of %s; %s", ", ".join(n.ifname for n in self.nics),
                 ", ".join(self._named(n, f"{sum(p.valid for p in n.dp.paths())} paths") for n in self.nics))
        self.runtime.every("sweep", lambda: sweep_period(min(n.dp.config()["expiry_ms"] for n in self.nics)),
                           self.sweep, (HostError, OSError), foreground=True)


def check_place(fabric: ClosFabric, node: str):
    if node not in fabric.machines:
        raise HostError(f"{node!r} is not a host or server in the fabric file (have: {', '.join(fabric.machines)})")


@HOST_AGENTS.register("clos")
def assemble(dp: HostDataplane, fabric: ClosFabric | None, opts: Options, health: Health) -> Assembled:
    """A leaf-spine host or GPU server (or one without a fabric file): TC programs on each fabric
    NIC (--no-tc: only followed, for RNICs that build the packets), the coordinator's client for
    each NIC and the verbs library's agent for all of them beside the host agent."""
    node = opts.node if fabric else None
    if fabric:
        check_place(fabric, node)
        interfaces = fabric_nics(fabric, node, opts.interfaces)
    else:
        if not opts.interfaces:
            raise HostError("name the fabric interfaces")
        interfaces = {i: None for i in opts.interfaces}
    if len(set(interfaces)) != len(interfaces):
        raise HostError("an interface is named twice")
    several = len(interfaces) > 1 or bool(fabric and fabric.is_server(node))
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
    nics = open_nics(dp.instance, interfaces, several)
    for nic in nics:                 # every NIC there before anything is loaded
        nic.ifindex = nic.dp.ifindex(nic.ifname)
    for nic in nics:
        if opts.tc:
            nic.dp.attach(nic.ifname, opts.path_field, opts.base_path)
        else:
            nic.dp.prepare(nic.ifname, opts.path_field, opts.base_path)
        apply_config(nic.dp, opts)
    agent = ClosHostAgent(nics, opts.path_field, opts.base_path, fabric, health, opts.tc)
    if fabric:
        for nic in nics:
            agent.place(nic)
    summary = "; ".join(_summary(n, opts.tc) for n in nics)
    if opts.once:
        return Assembled(agent, summary, dataplanes=[n.dp for n in nics])
    views = {n.ifname: FabricView(fabric, n.host) for n in nics} if (opts.coordinator or opts.etcd) and opts.verbs \
        else {}
    clients = []
    lease = Lease(etcd, opts.etcd_lease_s) if etcd is not None else None
    for nic in nics:
        loop = f"coordinator-{nic.ifname}" if nic.label else "coordinator"
        if opts.coordinator:
            clients.append(CoordinatorClient(nic.dp, nic.host, opts.coordinator, opts.report_ms / 1000,
                                             opts.qp_memory_s, health=health, view=views.get(nic.ifname),
                                             tls=opts.coordinator_tls))
        elif etcd is not None:
            clients.append(EtcdCoordinatorClient(nic.dp, nic.host, etcd, opts.report_ms / 1000, opts.qp_memory_s,
                                                 health=health, view=views.get(nic.ifname), lease=lease))
        if clients:
            clients[-1].loop = loop
    service = verbs_service(nics, opts, health, views, agent.runtime) if opts.verbs else None

    def close():
        if service is not None:
            service.shutdown()
            service.close()
    return Assembled(agent, summary, {"coordinators": clients, "verbs": service}, close,
                     dataplanes=[n.dp for n in nics])


def _summary(nic: Nic, tc: bool) -> str:
    paths = [p for p in nic.dp.paths() if p.valid]
    return (f"{'attached to' if tc else 'following'} {nic.ifname}: {len(paths)} paths "
            f"({', '.join(f'{p.value}:{p.address}' for p in paths)})")
