"""What an operator installs on real switches and GPU hosts, rendered from the fabric file: the
systemd units of every role and the boot-time link setup. The Vagrant lab installs exactly these.

    rlbfabric units --fabric F --node l1 --mgmt-ip 10.0.0.11 \\
        --coordinator http://10.0.0.2:9473 -o /etc/systemd/system
    rlbfabric units ... --etcd http://10.0.0.2:2379   # the coordinator on the fabric's etcd instead
    rlbfabric net --fabric F --node l1        # what rlb-net.service runs at boot

Roles and units:
    leaf, spine, super-spine   rlb-net (forwarding, fabric ports up, a leaf's gateway addresses),
                               rlb-bird (bird2, config rendered at start), rlb-switch (the agent;
                               leaves also tell the coordinator their uplinks)
    host                       rlb-net (SLAAC on the fabric port), rlb-host (the agent, reporting
                               to the coordinator)
    coordinator (any machine on the management network)   rlb-coord
With the coordinator on etcd (issue 31) every agent gets `--etcd URLS --etcd-password-file
/etc/rlb/etcd.password` instead of `--coordinator URL`: each machine's own etcd user, whose
password `rlbfabric etcd-users` issues and the operator copies there (docs/operations.md).
A scale-up fabric (kind = "scaleup"):
    plane switch               rlb-net (forwarding, sub-ports up with their link-local), rlb-bird,
                               rlb-switch (ports at the plane's speed)
    GPU                        rlb-net (the loopback device and address, the route to the peers'
                               loopbacks, sub-ports up with their link-local), rlb-bird (the GPU
                               as a BGP speaker), rlb-host (`rlbhost attach rlb0`: ports mode,
                               probes, carrier watcher)"""
from __future__ import annotations

import enum
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

from rlbcommon.constants import RUN_DIR, VERBS_GROUP
from rlbcommon.health import HANG_ENV

from rlbfabric.base import LOOPBACK_DEVICE, SWITCH_ROLES, Fabric, FabricError, add_loopback_device



class XdpMode(str, enum.Enum):
    """How the switch program attaches: native, or generic (skb) for NICs without native XDP."""
    native = "native"
    generic = "generic"


@dataclass
class Site:
    """What the fabric file does not say: where things are on the machines."""
    bin: Path = Path("/opt/rlb/venv/bin")     # rlbswitch, rlbhost, rlbcoord, python
    run_dir: Path = RUN_DIR
    xdp: str = "native"                       # or generic, for NICs without native XDP
    bfd_ms: int = 0                           # instead of the fabric file's (slow emulation)
    probe_ms: float = 0                       # scale-up GPUs' probes instead of the agent's
    probe_dead_ms: float = 0                  # defaults (0: rlbhost's), for slow emulation
    hang_s: float = 0                         # how long an agent's loop may take a round (0: the
                                              # agents' 60 s; emulated VMs run 10-100x slower)
    expiry_ms: float = 0                      # hosts' idle-QP expiry (0: rlbhost's 200 ms); also
                                              # sets the sweep's cadence (half of it)
    etcd_lease_s: int = 0                     # hosts' etcd lease (0: rlbhost's 3 s)
    verbs_max_timeout_ms: int = 0             # the longest GPU servers' agents work on a verbs
                                              # question (0: rlbhost's 2 s)
    heartbeat_ms: int = 0                     # switches' asks of their neighbours' data planes
                                              # (0: rlbswitch's 100 ms; silent after 5 missed)
    bgp_hold_s: int = 0                       # BGP hold time instead of the fabric file's


def _verbs_cap(site: Site) -> str:
    return f" --verbs-max-timeout-ms {site.verbs_max_timeout_ms}" if site.verbs_max_timeout_ms else ""


# where every machine keeps its own etcd user's password (rlbfabric etcd-users issues them)
ETCD_PASSWORD_FILE = Path("/etc/rlb/etcd.password")
# with https:// etcd URLs: the CA of etcd's certificate and the machine's own (rlbfabric etcd-tls)
ETCD_CA_FILE = Path("/etc/rlb/etcd-ca.pem")
ETCD_CERT_FILE = Path("/etc/rlb/etcd.pem")
# an https:// coordinator URL: the same CA and machine certificate, and the coordinator's own
COORDINATOR_TLS_FILE = Path("/etc/rlb/coordinator-server.pem")


@dataclass(frozen=True)
class Coordination:
    """How the agents reach the coordinator: its HTTP URL, or the fabric's etcd (comma-separated
    client URLs; each machine authenticates as its own user with the password in
    password_file; with https:// URLs over TLS, with ca_file and cert_file). Neither: hosts
    decide by the local rule alone."""
    url: str | None = None
    etcd: str | None = None
    password_file: Path = ETCD_PASSWORD_FILE
    ca_file: Path = ETCD_CA_FILE
    cert_file: Path = ETCD_CERT_FILE

    def __post_init__(self):
        if self.url and self.etcd:
            raise FabricError("the coordinator runs over HTTP or on etcd, not both")

    def agent_args(self) -> str:
        """What rlbhost attach and a leaf's rlbswitch run are given."""
        if self.etcd:
            return self.etcd_args()
        if not self.url:
            return ""
        tls = (f" --coordinator-ca {unit_arg(self.ca_file)} --coordinator-cert {unit_arg(self.cert_file)}"
               if self.url.startswith("https://") else "")
        return f" --coordinator {unit_arg(self.url)}{tls}"

    def coordinator_args(self) -> str:
        """What an HTTP coordinator is given: over https://, its certificate and the machines' CA."""
        if self.url and self.url.startswith("https://"):
            return f" --tls-cert {unit_arg(COORDINATOR_TLS_FILE)} --tls-ca {unit_arg(self.ca_file)}"
        return ""

    def etcd_args(self) -> str:
        tls = f" --etcd-ca {unit_arg(self.ca_file)} --etcd-cert {unit_arg(self.cert_file)}" if "https://" in self.etcd else ""
        return f" --etcd {unit_arg(self.etcd)} --etcd-password-file {unit_arg(self.password_file)}{tls}"


def deployable(fabric: Fabric):
    if not fabric.rendered_units:
        raise FabricError(f"{fabric.kind} fabrics have no rendered units or link setup yet: its namespace "
                          "lab (rlblab/labs.py) shows what each node runs")


def role(fabric: Fabric, node: str) -> str:
    if node in fabric.machines:
        return "host"
    return fabric.node(node).role


# Every long-running unit: restarted however often it fails (the default start limit gave up after
# five fast failures: a switch agent that cannot reach a restarting bird must keep trying), and
# confined where that cannot break the data plane: read-only system, no home, private /tmp, no new
# privileges, and root's capabilities bounded to what the process uses. The agents keep
# CAP_SYS_ADMIN: bcc loads programs and maps, they enter namespaces and mount bpffs; the rest is
# the data plane's (NET_ADMIN, BPF, PERFMON, RAW), locked memory for maps, SCHED_FIFO for the GPU
# carrier watcher (SYS_NICE), the verbs socket's group (CHOWN, FOWNER). The namespace labs run
# every agent, bird and the coordinator under the same sets (rlblab: confined()), so the suite
# proves they suffice.
AGENT_CAPS = ("CAP_SYS_ADMIN", "CAP_NET_ADMIN", "CAP_BPF", "CAP_PERFMON", "CAP_NET_RAW", "CAP_SYS_RESOURCE",
              "CAP_IPC_LOCK", "CAP_SYS_NICE", "CAP_CHOWN", "CAP_FOWNER", "CAP_DAC_OVERRIDE")
BIRD_CAPS = ("CAP_NET_ADMIN", "CAP_NET_BIND_SERVICE", "CAP_NET_RAW")    # routes, port 179, BFD sockets
COORDINATOR_CAPS: tuple[str, ...] = ()                                 # an HTTP server on 9473: none
RESTART = """Restart=always
RestartSec=1"""
HARDENING = """NoNewPrivileges=yes
ProtectSystem=full
ProtectHome=yes
PrivateTmp=yes
ProtectControlGroups=yes
LockPersonality=yes
SystemCallArchitectures=native"""
NO_START_LIMIT = "StartLimitIntervalSec=0"
# an agent tells systemd each second that every one of its loops finishes rounds (a loop that
# hangs makes it start afresh by itself: rlbcommon/watchdog.py); a process frozen whole, that
# thread too, is killed and started again by systemd after this long. The watch begins when
# the agent says it is ready (Type=notify: its watchdog thread, first thing after its imports),
# so a slow start is not taken for a hang: under emulation the imports alone passed 60 s, and
# systemd killed every start before it could load its program
WATCHDOG_S = 60


def agent_watchdog(site: Site) -> str:
    """The unit's watch: WatchdogSec at least the agent's hang time, so that a CPU slow enough
    to need a longer one (emulated VMs: a process starved for a minute by its neighbours was
    killed by systemd while its loops were fine) is not killed sooner than its loops are judged."""
    return f"""Type=notify
NotifyAccess=main
TimeoutStartSec=10min
WatchdogSec={max(WATCHDOG_S, round(site.hang_s))}"""
# the users whose jobs may use the verbs socket: the group exists before the agent binds it
VERBS_GROUP_PRE = f"ExecStartPre=/usr/sbin/groupadd --system --force {VERBS_GROUP}"
# bird answers BFD and BGP keepalives before anything else on the machine wants the CPU: an
# agent's start compiles its programs with LLVM (minutes of CPU on a slow control-plane CPU, as
# in an upgrade), and a bird starved past 3 BFD intervals takes every session down
BIRD_NICE = "Nice=-10"


UNIT_SAFE = re.compile(r"^[A-Za-z0-9_@+=:,./\[\]-]+$")


def unit_arg(value) -> str:
    """One argument of an ExecStart= line, as systemd reads it back: quoted (C-style) when it
    holds anything but plain characters, % and $ doubled (systemd's specifiers and variables);
    a control character (a newline would start a unit line of its own) is refused."""
    text = str(value)
    if any(ord(c) < 32 or ord(c) == 127 for c in text):
        raise FabricError(f"{text[:60]!r}: a control character (a newline?) cannot go into a unit file")
    text = text.replace("%", "%%").replace("$", "$$")
    if UNIT_SAFE.match(text):
        return text
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def capabilities(caps: tuple[str, ...]) -> str:
    """The unit line bounding a root process to caps (empty: none at all)."""
    return "CapabilityBoundingSet=" + " ".join(caps)


def hang_line(site: Site) -> str:
    """Every agent's (and the coordinator's) hang time, where the site sets one: in the
    environment, so a drop-in can set another (as the VM lab's hold test does)."""
    return f"Environment={HANG_ENV}={site.hang_s:g}\n" if site.hang_s else ""


def agent_tail(site: Site) -> str:
    """How every agent's unit ends: restarted, watched, hardened, bounded to the agents'
    capabilities."""
    return f"""{RESTART}
{agent_watchdog(site)}
{HARDENING}
{capabilities(AGENT_CAPS)}
[Install]
WantedBy=multi-user.target"""


def confined(cmd: list[str], caps: tuple[str, ...]) -> list[str]:
    """cmd run as a unit with CapabilityBoundingSet=caps runs it: root bounded to those (setpriv
    from util-linux; what the labs start their processes with)."""
    return ["setpriv", "--bounding-set", ",".join(["-all"] + [f"+{c[4:].lower()}" for c in caps]), "--", *cmd]


def units(fabric: Fabric, fabric_file: Path, node: str, mgmt_ip: str,
          coordinator: str | Coordination | None, site: Site = Site()) -> dict[str, str]:
    """{unit name: unit file} for one machine of the fabric. coordinator: its HTTP URL, or a
    Coordination (HTTP or etcd)."""
    deployable(fabric)
    r = role(fabric, node)
    args = f"--fabric {unit_arg(fabric_file)} --node {unit_arg(node)}"
    mgmt_ip = unit_arg(mgmt_ip)
    if not isinstance(coordinator, Coordination):
        coordinator = Coordination(url=coordinator)
    coord = coordinator.agent_args()
    timers = (f" --bfd-ms {site.bfd_ms}" if site.bfd_ms else "") + \
        (f" --hold-s {site.bgp_hold_s}" if site.bgp_hold_s else "")        # bird-config, switch or GPU
    hang = hang_line(site)
    out = {"rlb-net": f"""[Unit]
Description=RLB fabric links of {node} ({r})
After=systemd-udev-settle.service networking.service
[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart={site.bin}/rlbfabric net {args}
[Install]
WantedBy=multi-user.target
"""}
    if r in SWITCH_ROLES and fabric.node(node).daemon == "frr":
        return out          # a spine of another make: its own FRR (rlbfabric frr-config), the kernel forwarding
    if r in SWITCH_ROLES:
        ports = " ".join(fabric.switch_ports(fabric.node(node)))
        mbps = fabric.switch_port_mbps(node)
        run = site.run_dir
        heartbeat = f" --heartbeat-ms {site.heartbeat_ms}" if site.heartbeat_ms else ""
        out["rlb-bird"] = _bird_unit(f"fabric switch {node}", f"{site.bin}/rlbswitch bird-config {args}{timers}",
                                     node, run)
        out["rlb-switch"] = f"""[Unit]
{NO_START_LIMIT}
Description=RLB switch agent (XDP data plane fed by bird2) on {node}
Wants=rlb-bird.service
After=rlb-bird.service
[Service]
ExecStart={site.bin}/rlbswitch run {ports} {args} --run-dir {run} --metrics-addr {mgmt_ip} --speed-mbps {mbps}{heartbeat}{' --generic' if site.xdp == 'generic' else ''}{coord if r == 'leaf' else ''}
{hang}{agent_tail(site)}
"""
    elif fabric.is_gpu(node):
        run = site.run_dir
        probes = (f" --probe-ms {site.probe_ms:g}" if site.probe_ms else "") + \
            (f" --probe-dead-ms {site.probe_dead_ms:g}" if site.probe_dead_ms else "")
        out["rlb-bird"] = _bird_unit(f"GPU {node} (its loopback into every plane, with its path bandwidth)",
                                     f"{site.bin}/rlbhost bird-config {args}{timers}", node, run)
        out["rlb-host"] = f"""[Unit]
{NO_START_LIMIT}
Description=RLB GPU agent (QPs across planes and sub-ports, probes, carrier watcher) on {node}
Requires=rlb-net.service
Wants=rlb-bird.service
After=rlb-net.service rlb-bird.service
[Service]
{VERBS_GROUP_PRE}
ExecStart={site.bin}/rlbhost attach {LOOPBACK_DEVICE} {args} --run-dir {run} --metrics-addr {mgmt_ip}{probes} --verbs-group {VERBS_GROUP}
{hang}{agent_tail(site)}
"""
    else:
        nics = " ".join(fabric.host_port(h) for h in fabric.endpoints(node))   # a server: every fabric NIC
        slow = (f" --expiry-ms {site.expiry_ms:g}" if site.expiry_ms else "") + \
            (f" --etcd-lease-s {site.etcd_lease_s}" if site.etcd_lease_s and coordinator.etcd else "")
        out["rlb-host"] = f"""[Unit]
{NO_START_LIMIT}
Description=RLB host agent (per-QP path selection) on {nics}
Requires=rlb-net.service
After=rlb-net.service
[Service]
{VERBS_GROUP_PRE}
ExecStart={site.bin}/rlbhost attach {nics} {args}{coord}{slow}{_verbs_cap(site)} --metrics-addr {mgmt_ip} --verbs-group {VERBS_GROUP}
{hang}{agent_tail(site)}
"""
    return out


def _bird_unit(what: str, render: str, node: str, run: Path) -> str:
    """bird2 with its config rendered from the fabric file at every start."""
    return f"""[Unit]
{NO_START_LIMIT}
Description=bird2 for {what}
Requires=rlb-net.service
After=rlb-net.service
[Service]
ExecStartPre={render} --run-dir {run} -o {run}/{node}.conf
ExecStart=/usr/sbin/bird -f -c {run}/{node}.conf -s {run}/{node}.ctl
ExecReload=/usr/sbin/birdc -s {run}/{node}.ctl configure
Restart=on-failure
RestartSec=1
{BIRD_NICE}
{HARDENING}
{capabilities(BIRD_CAPS)}
[Install]
WantedBy=multi-user.target
"""


def coordinator_unit(fabric_file: Path, listen: str, site: Site = Site(),
                     coordination: Coordination = Coordination(), name: str | None = None,
                     after: tuple[str, ...] = (), shard: str = "1/1") -> dict[str, str]:
    """rlb-coord: over HTTP, or on etcd (any number of machines run it, `name` unique among them:
    one leads; `shard` K/N: one of N shards of placement, coord/shards.py). `after`: units of the
    same machine it waits for (the lab's etcd)."""
    extra = ""
    if shard != "1/1" and not coordination.etcd:
        raise FabricError("a coordinator's shard goes with etcd: over HTTP one coordinator places everything")
    if coordination.etcd:
        extra = coordination.etcd_args() + (f" --name {name}" if name else "") + (
            f" --shard {shard}" if shard != "1/1" else "")
    else:
        extra = coordination.coordinator_args()
    return {"rlb-coord": f"""[Unit]
{NO_START_LIMIT}
Description=RLB fabric coordinator (QP placements for the whole fabric{", on etcd" if coordination.etcd else ""})
After={" ".join(("network-online.target", *after))}
[Service]
ExecStart={site.bin}/rlbcoord run --fabric {fabric_file} --listen {listen}{extra}
{hang_line(site)}{RESTART}
{agent_watchdog(site)}
{HARDENING}
{capabilities(COORDINATOR_CAPS)}
[Install]
WantedBy=multi-user.target
"""}


def net_commands(fabric: Fabric, node: str) -> list[list[str]]:
    """Boot-time link setup of one machine (idempotent): the fabric kind's own."""
    deployable(fabric)
    return fabric.net_commands(node)


def net(fabric: Fabric, node: str):
    deployable(fabric)
    if fabric.is_gpu(node):
        add_loopback_device()
    for cmd in net_commands(fabric, node):
        res = subprocess.run(cmd, capture_output=True, text=True)
        if cmd[:4] == ["ip", "-6", "rule", "add"] and "File exists" in res.stderr:
            continue                                          # a NIC's rule from an earlier start
        if res.returncode and cmd[0] != "ethtool":           # a NIC may not let tx offload be set
            raise RuntimeError(f"{' '.join(cmd)}: {res.stderr.strip()}")
