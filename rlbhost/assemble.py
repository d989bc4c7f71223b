"""Which agent runs on this host, built from the command's options: `rlbhost run` parses them,
the fabric kind's assembler (registered in HOST_AGENTS by the module of that kind's agent in
rlbhost/kinds/: clos.py for leaf-spine hosts and hosts without a fabric file, scaleup.py for
scale-up GPUs, railonly.py for rail-only GPUs) builds the agent and what runs beside it, and the
CLI runs it.
Adding a fabric kind adds an assembler; nothing here names one."""
from __future__ import annotations

import logging
import ssl
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from rlbcommon.constants import RUN_DIR
from rlbcommon.health import Health
from rlbcommon.runtime import AgentRuntime
from rlbfabric.base import LOOPBACK_DEVICE, ByKind, Fabric

from .dataplane import HostDataplane, HostError
from .probekeys import KeyFile, ProbeKeyError
from .verbs.paths import socket_path, status_path, table_path
from .verbs.service import VerbsService

log = logging.getLogger("rlbhost")


@dataclass
class Options:
    """What `rlbhost run` was given (its --help says what each is for)."""
    interfaces: list[str]
    node: str | None = None
    path_field: int | None = None
    base_path: int | None = None
    expiry_ms: float | None = None
    roce_port: list[int] = field(default_factory=list)
    coordinator: str | None = None
    etcd: str | None = None             # the coordinator through the fabric's etcd instead
    etcd_password_file: Path | None = None
    report_ms: int = 250
    qp_memory_s: float = 3.0
    run_dir: Path = RUN_DIR
    probe_ms: float | None = None
    probe_dead_ms: float | None = None
    fabric_key: Path | None = None
    carrier_rt_priority: int = 10
    tc: bool = True
    verbs: bool = True
    verbs_group: str | None = None
    once: bool = False                  # attach and return: no agent runs
    etcd_ca: Path | None = None         # with an https:// --etcd: the CA of its certificate
    etcd_cert: Path | None = None       # ... and this host's (certificate and key, one file)
    etcd_lease_s: int = 3               # its keys' lease: how long a dead host's QPs stay placed
    coordinator_tls: ssl.SSLContext | None = None   # with an https:// --coordinator (coordapi.client_tls)
    verbs_max_timeout_ms: int = 2000    # the longest a library's question is worked on

    @property
    def interface(self) -> str:
        """The one interface of an agent that takes one (a GPU's loopback device)."""
        if len(self.interfaces) != 1:
            raise HostError(f"this agent attaches to one interface, not {len(self.interfaces)} "
                            f"({', '.join(self.interfaces) or 'none'})")
        return self.interfaces[0]


@dataclass
class Assembled:
    agent: object                       # runs in the foreground: run()
    summary: str                        # one line for the operator: what it attached to
    collect: dict = field(default_factory=dict)   # what the metrics read besides the data plane
    close: Callable[[], None] = lambda: None      # after the agent stops
    dataplanes: list[HostDataplane] = field(default_factory=list)   # a server's per NIC (else the one)


# fabric kind -> assemble(dp, fabric or None, Options, Health) -> Assembled
HOST_AGENTS = ByKind("host agent")
NO_FABRIC = "clos"          # a host without a fabric file is a leaf-spine host (ClosFabric.kind)


def assembler(fabric: Fabric | None):
    """The kind's assembler (its module in rlbhost/kinds/ registers it when imported)."""
    return HOST_AGENTS[NO_FABRIC] if fabric is None else HOST_AGENTS.of(fabric)


def apply_config(dp: HostDataplane, opts: Options):
    if opts.expiry_ms is not None or opts.roce_port:
        dp.set_config(expiry_ms=opts.expiry_ms, roce_ports=opts.roce_port or None)


def on_loopback_device(dp: HostDataplane, opts: Options):
    """A GPU (scale-up, rail-only) attaches to the loopback device, where the fabric's addresses
    are routed."""
    if opts.interface != LOOPBACK_DEVICE:
        raise HostError(f"on a GPU attach to the loopback device {LOOPBACK_DEVICE!r}, not {opts.interface!r}: "
                        "the fabric's addresses are routed there")
    dp.ifindex(opts.interface)


def fabric_keys(path: Path | None, without: str) -> KeyFile:
    """The fabric's key file (rlbhost/probekeys.py), read once here so a bad one is an operator
    error at start; the agents reread it when it changes."""
    try:
        keys = KeyFile(path)
    except ProbeKeyError as e:
        raise HostError(str(e)) from None
    if path is not None and not keys.keys and not keys.pairs:
        log.warning("no keys at %s: %s", path, without)
    return keys


def verbs_service(nics, opts: Options, health: Health, advice: dict | None = None,
                  runtime: AgentRuntime | None = None) -> VerbsService:
    """The verbs library's agent for every fabric NIC (`nics`: rlbhost/nics.Nic; `advice`: the
    coordinator's view per NIC), started beside the host agent (an operator error if its socket
    or port cannot be had: a second agent for the same instance, say)."""
    keys = fabric_keys(opts.fabric_key, "the verbs agents' messages are neither signed nor checked")
    instance = nics[0].dp.instance
    service = VerbsService({n.ifname: n.dp for n in nics}, socket_path(instance), group=opts.verbs_group,
                           health=health, status_path=status_path(instance), advice=advice or {},
                           table_path=table_path(instance), keys=keys,
                           max_timeout_ns=opts.verbs_max_timeout_ms * 1_000_000)
    try:
        service.open()
    except KeyError:
        raise HostError(f"--verbs-group {opts.verbs_group}: no such group") from None
    except OSError as e:
        service.close()
        raise HostError(f"verbs: cannot open {service.socket_path} or UDP {service.port}: {e.strerror} "
                        "(another agent for this instance? --no-verbs to run without)") from None
    service.start(runtime)            # its loops on the host agent's runtime
    # the verbs thread answers within milliseconds: let it have the interpreter sooner than the
    # default 5 ms switch interval would when another loop of the agent runs Python
    sys.setswitchinterval(0.0005)
    return service
