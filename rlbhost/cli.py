"""rlbhost: puts each RoCEv2 QP of this host on its own fabric path by address rewrite.

Needs one global address per fabric path on the interface (SLAAC from the leaf's RAs). Works for traffic the kernel builds (Soft-RoCE, UDP): hardware RoCE NICs build packets without the kernel, so TC never sees them; there, use 'rlbhost paths --json' to pick a GID per QP."""
from __future__ import annotations

import grp
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import List, Optional

import typer

from rlbcommon import cli as common, coordapi, health as loops
from rlbcommon.constants import METRICS_PORT, RUN_DIR, VERBS_GROUP
from rlbcommon.health import Health
from rlbcommon.metrics import serve
from rlbcommon.watchdog import Watchdog
from rlbfabric.bird.command import add_bird_config
from rlbfabric.bird.ctl import BirdError
from rlbfabric.fabric import FabricError, load

from . import probes
from .assemble import Options, assembler
from .dataplane import HostDataplane, HostError
from .metrics import HostCollector
from .nics import pinned_dataplanes
from .runfiles import health_file, why_file
from .verbs import answertimes
from .verbs.build import BuildError, build
from .verbs.check import NicPaths, check as verbs_checks
from .verbs.paths import socket_path, status_path, table_path

log = logging.getLogger("rlbhost")
app, ctx = common.agent_app(__doc__, HostDataplane, log)
weights_app = typer.Typer(help="Per-path weights (optionally per destination prefix).",
                          no_args_is_help=True)
app.add_typer(weights_app, name="weights")
verbs_app = typer.Typer(help="The verbs path selector: librlbverbs.so, loaded into RDMA jobs, puts each "
                        "QP on a path where the NIC builds the packets (hardware RoCE).", no_args_is_help=True)
app.add_typer(verbs_app, name="verbs")
LIB_DIR = Path("/usr/local/lib/rlb")
NIC_OPTION = typer.Option(None, "--nic", help="A GPU server's fabric NIC, e.g. gpu0_eth (default: every one).")


def _dataplanes(nic: Optional[str]) -> list[HostDataplane]:
    """The data planes a command shows or changes: every fabric NIC's, or the one named."""
    return pinned_dataplanes(ctx.dataplane().instance, nic)


def run(
    command: typer.Context,
    interfaces: Optional[List[str]] = typer.Argument(None, help="The fabric interfaces: one, e.g. eth0, or a "
        "GPU server's NICs, e.g. gpu0_eth ... gpu7_eth (with --fabric and a server's --node: optional, "
        "every NIC the fabric file gives it; run: optional, those attached before are adopted)."),
    path_field: Optional[int] = typer.Option(None, min=0, max=3, help="Hextet (0-3) that numbers "
        "the paths in the /64 prefixes; detected when there are two or more."),
    base_path: Optional[int] = typer.Option(None, help="Path whose address applications use "
        "(default: the lowest)."),
    expiry_ms: Optional[float] = typer.Option(None, help="Idle QP entries are re-assigned after "
        "this (default 200 ms: between collective bursts)."),
    roce_port: Optional[List[int]] = typer.Option(None, min=1, max=65535, help="UDP destination ports "
        "to handle (default 4791). Repeat for several."),
    fabric: Optional[Path] = typer.Option(None, help="The fabric description: with --node, this "
        "host's place in the fabric (where its ties between paths start, so hosts spread before "
        "they meet; QPs within its leaf counted apart). Needed for --coordinator."),
    node: Optional[str] = typer.Option(None, help="This host's or server's name in the fabric file "
        "(default: the host name)."),
    coordinator: Optional[str] = typer.Option(None, help="The fabric coordinator's URL, e.g. "
        "http://[fd00:99::1]:9473: QPs are reported to it and new or idle QPs take its placements."),
    coordinator_ca: Optional[Path] = common.COORDINATOR_CA_OPTION,
    coordinator_cert: Optional[Path] = common.COORDINATOR_CERT_OPTION,
    etcd: Optional[str] = typer.Option(None, help="Instead of --coordinator: the fabric's etcd "
        "(comma-separated client URLs, e.g. http://[fd00:99::1]:2379): this host's QPs are written "
        "there as they change, under its own user, and its placements watched."),
    etcd_password_file: Optional[Path] = typer.Option(None, help="With --etcd: the password of this "
        "host's etcd user rlb-host-<node> (`rlbfabric etcd-users` issues it; none: no authentication)."),
    etcd_ca: Optional[Path] = common.ETCD_CA_OPTION,
    etcd_cert: Optional[Path] = common.ETCD_CERT_OPTION,
    etcd_lease_s: int = typer.Option(3, min=2, max=60, help="With --etcd: the lease of this host's keys. "
        "A dead host's QPs leave the placement when it ends; it is kept alive every third of it, and "
        "each keepalive costs the etcd leader about half a millisecond of CPU (4k hosts at 3 s: "
        "one to two cores; docs/operations.md)."),
    report_ms: int = typer.Option(250, min=50, help="How often to report to the coordinator (with "
        "--etcd: how often to look for changes to write)."),
    qp_memory_s: float = typer.Option(3.0, min=0.1, help="QPs idle up to this long are still "
        "reported (a collective's QPs return burst after burst); then they are forgotten."),
    metrics_port: int = typer.Option(METRICS_PORT["host"], help="Prometheus port (0: none)."),
    metrics_addr: str = typer.Option("127.0.0.1", help="Address the metrics bind to."),
    once: bool = typer.Option(False, "--once", help="Attach and return, without the agent: then "
        "nothing follows addresses, carrier, BGP or the coordinator (for scripts and tests)."),
    run_dir: Path = typer.Option(Path(str(RUN_DIR)), help="Scale-up GPUs: where bird's socket "
        "(<node>.ctl) and the path-bandwidth include (<node>.pathbw.conf) are."),
    probe_ms: float = typer.Option(probes.INTERVAL_MS, min=1, help="Scale-up GPUs: probe every peer over every "
        "plane this often."),
    probe_dead_ms: float = typer.Option(probes.DEAD_MS, min=5, help="Scale-up GPUs: a plane unanswered "
        "this long (while the peer answers on another) is not used towards that peer."),
    probe_key: Path = typer.Option(Path("/etc/rlb/probe-key"), "--fabric-key", "--probe-key", help="The "
        "fabric's keys (32 hex digits a line, mode 600): scale-up GPUs' probe answers and the verbs agents' "
        "messages (UDP 4798) are signed with the first and checked against all. Without the file, "
        "they go unsigned (a warning says so)."),
    carrier_rt_priority: int = typer.Option(10, min=0, max=99, help="Scale-up GPUs: SCHED_FIFO "
        "priority of the carrier watcher, which takes a port that loses carrier out of use "
        "(0: normal scheduling, slower on a busy host)."),
    tc: bool = typer.Option(True, "--tc/--no-tc", help="TC programs on the interface, for RoCE the "
        "kernel builds (Soft-RoCE). --no-tc on hosts whose RDMA NICs build the packets: the agent "
        "still follows the paths and places QPs through the verbs library."),
    verbs: bool = typer.Option(True, "--verbs/--no-verbs", help="Answer the verbs library "
        "(librlbverbs.so, `rlbhost verbs`) on a local socket, and agree on QPs' paths with the "
        "peers' agents (UDP 4798)."),
    hang_s: float = common.HANG_OPTION,
    verbs_group: Optional[str] = typer.Option(None, help="Root and this group's members may use the "
        f"verbs socket (mode 0660; default {VERBS_GROUP}, made by `rlbhost verbs install`; without it "
        "only root's jobs). '*': every local user, who could then make other users' QPs keep their "
        "addresses."),
    verbs_max_timeout_ms: int = typer.Option(2000, min=100, max=60000, help="The longest the agent works "
        "on a library's question, whatever RLB_VERBS_TIMEOUT_MS asks: a QP's RTR waits this long at most "
        "before it keeps the application's addresses. Raise it only where agents answer slowly (an "
        "emulated lab: the VM lab's hosts use 6000 under qemu)."),
):
    """Run the host agent in the foreground: `attach` with the interface optional (adopted).

    The command of the rlb-host unit: after a restart or an upgrade it adopts the pinned state
    (QPs keep their paths) and the interface attached before.

    Examples:\n
      rlbhost run eth0 --fabric /etc/rlb/fabric.toml --node h1\n
      rlbhost run --fabric /etc/rlb/fabric.toml --node a1    # a server: every NIC the file gives it\n
      rlbhost run                    # adopt: the interfaces that have the programs
    """
    fab = load(fabric) if fabric else None
    node = node or socket.gethostname()
    if not (fab and getattr(fab, "is_server", lambda _: False)(node)):
        common.attach_or_run(command, interfaces)
    dp = ctx.dataplane()
    interfaces = list(interfaces or []) or _attached(dp, fab, node)
    if coordinator and etcd:
        raise typer.BadParameter("--coordinator or --etcd, not both: the coordinator runs on one or the other")
    try:
        coordinator_tls = coordapi.client_tls(coordinator, coordinator_ca, coordinator_cert)
    except ValueError as e:
        raise typer.BadParameter(str(e), param_hint="--coordinator-ca/--coordinator-cert") from None
    opts = Options(interfaces, node, path_field, base_path, expiry_ms, roce_port or [],
                   coordinator, etcd, etcd_password_file, report_ms, qp_memory_s, run_dir, probe_ms,
                   probe_dead_ms, probe_key, carrier_rt_priority, tc, verbs, verbs_group, once,
                   etcd_ca=etcd_ca, etcd_cert=etcd_cert, etcd_lease_s=etcd_lease_s,
                   coordinator_tls=coordinator_tls, verbs_max_timeout_ms=verbs_max_timeout_ms)
    health = Health(health_file(dp.instance), hang_s)
    if not once:
        Watchdog(health, log).start()      # systemd hears from it while the programs compile, too
    # each kind's agent (rlbhost/kinds/, found there) registers its assembler: loaded by this
    # command, not by `rlbhost status` and the like (the kinds bring pyroute2: two thirds of a
    # command's start)
    from . import kinds  # noqa: F401
    built = assembler(fab)(dp, fab, opts, health)
    typer.echo(built.summary)
    if once:
        return
    try:
        _run_agent(built.agent, built.dataplanes or [dp], health, metrics_port, metrics_addr, **built.collect)
    finally:
        built.close()


ATTACH_HELP = """Attach to the fabric interfaces and run the host agent in the foreground.

The host then works fully: each QP placed on a path (one address per path, from the leaf's RAs),
paths followed as addresses and carrier come and go, weights from the fabric, metrics served.
Stopping the agent leaves the programs and the QP table in place; attaching again replaces the
programs in place and QPs keep their paths. --once attaches without the agent.

A GPU server with several fabric NICs (one per rail leaf) runs one agent for all of them: each NIC
keeps its own paths, weights, QP table and counters, and one verbs service answers for every RDMA
device on them. With the fabric file and the server's --node the NICs can be left out.

On a GPU of a scale-up fabric (kind = "scaleup") the interface is the loopback device: each QP
is placed on a plane's sub-port, weighted by the path bandwidth bird learns per plane. On a GPU of
a rail-only fabric (kind = "rail-only") too: each new QP takes the first hop the h-scores from the
coordinator choose (rd, dr or a remote rail: `rlbhost why`).

Examples:\n
  rlbhost attach eth0\n
  rlbhost attach eth0 --fabric /etc/rlb/fabric.toml --node h1 --coordinator http://[fd00:99::1]:9473\n
  rlbhost attach gpu0_eth gpu1_eth --fabric /etc/rlb/fabric.toml --node a1\n
  rlbhost attach rlb0 --fabric scaleup.toml --node g1\n
  rlbhost attach rlb0 --fabric rail-only.toml --node d1g1 --coordinator URL
"""
app.command("attach", help=ATTACH_HELP)(run)
app.command("run")(run)


def _attached(dp, fabric, node: str) -> list[str]:
    """What `run` adopts: a server's NICs from the fabric file, else the NICs with pinned state
    here, else the one interface that has this host's programs."""
    if fabric is not None and getattr(fabric, "is_server", lambda _: False)(node):
        return []                    # the assembler takes every NIC the fabric file gives it
    nics = [n for n in HostDataplane.pinned(dp.instance) if n]
    if nics:
        return nics
    found = dp.attached_interfaces()
    if len(found) != 1:
        raise HostError(f"run: {'no interface has' if not found else 'several interfaces have'} the programs"
                        f"{' (' + ', '.join(found) + ')' if found else ''}: name the interface")
    return found


def _run_agent(agent, dps, health, metrics_port: int, metrics_addr: str, **collect):
    """The agent in the foreground, with its metrics served (0: none), until SIGTERM or ^C:
    `collect` names what the metrics read besides the data planes (coordinator clients, prober,
    rail agent); the coordinator clients start reporting first."""
    if metrics_port:
        serve(HostCollector(dps, ctx.node_label, health=health, **collect), metrics_port, metrics_addr)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    for client in collect.get("coordinators") or []:
        client.start(agent.runtime)
    try:
        agent.run()
    except KeyboardInterrupt:
        pass
    log.info("agent stopping; the programs and QP table stay in place")


@app.command()
def why(peer: Optional[str] = typer.Argument(None, help="Rail-only GPUs: only this destination GPU, e.g. "
        "d2g2. Hosts: only this QP (its number, e.g. 0x1a) or this peer address."),
        as_json: bool = typer.Option(False, "--json", help="Machine-readable output.")):
    """Why a path: a rail-only GPU's per destination, a host's QPs placed through verbs.

    Examples:\n
      rlbhost why d2g2       # rail-only: drd via rail 3: gamma(src) 0.40, gamma(dst) 0.50, H(rail 3) 0.80 ...\n
      rlbhost why 0x1a       # a host: QP 0x1a <-> fc00:2:1:1::4 QP 0x33: path 2, decided here: paths both
                             # ends can use [1, 2], QPs on them {1: 3, 2: 2} ..."""
    path = why_file(ctx.dataplane().instance)
    if not path.exists():
        return _why_verbs(peer, as_json)
    w = json.loads(path.read_text())
    if peer:
        if peer not in w["peers"]:
            raise HostError(f"no destination {peer!r} (have {', '.join(w['peers'])})")
        w["peers"] = {peer: w["peers"][peer]}
    if as_json:
        typer.echo(json.dumps(w, indent=2))
        return
    if w["rails"]:
        typer.echo(f"{w['gpu']}: H rails {w['rails']}, domains {w['domains']}, delta {w['delta']}")
    else:
        typer.echo(f"{w['gpu']}: no h-scores from the registry: direct paths")
    for name, e in w["peers"].items():
        nums = "" if e["gamma_src"] is None else \
            f"  [gamma {_num(e['gamma_src'])} -> {_num(e['gamma_dst'])}, H {_num(e['h'])}]"
        typer.echo(f"  {name:<7} {e['kind']:<4} first hop {e['first_hop']:<12} {e['why']}{nums}")


def _why_verbs(which: Optional[str], as_json: bool):
    """A host's recent verbs decisions (the agent keeps the last ones with their reasons)."""
    s = _read_json(status_path(ctx.dataplane().instance))
    if not s:
        raise HostError("no decisions to explain: no rail-only GPU agent and no verbs service runs here")
    rows = s.get("decisions", [])
    if which:
        try:
            qp = int(which, 0)
            rows = [r for r in rows if r["qp"] == qp]
        except ValueError:
            rows = [r for r in rows if r["peer"] == which]
        if not rows:
            raise HostError(f"no recent verbs decision for {which!r}")
    if as_json:
        typer.echo(json.dumps(rows, indent=2))
        return
    for r in rows:
        what = f"path {r['path']}" if r["path"] else "kept the application's addresses"
        where = f" of {r['dev']}/{r['port']}" + (f" ({r['nic']})" if r.get("nic") else "") if r.get("dev") else ""
        typer.echo(f"QP 0x{r['qp']:x}{where} <-> {r['peer']} QP 0x{r['peer_qp']:x}: {what}: {r['why']}")


def _num(x) -> str:
    return "inf" if x is None else f"{x:.3f}"


def _gpu(fab, node: str, fabric_file: Path) -> str:
    if not fab.is_gpu(node):
        raise HostError(f"{node!r} is not a GPU of a scale-up fabric in {fabric_file}")
    return f"GPU {node}"


add_bird_config(app, """Render bird.conf for a GPU of a scale-up fabric.

    Its path-bandwidth include starts at full bandwidth; the agent rewrites it as sub-ports come
    and go.

    Example: rlbhost bird-config --fabric scaleup.toml --node g1 -o /etc/bird/bird.conf""",
                "This GPU's name in the fabric file.", _gpu)


@app.command()
def detach(
    interfaces: Optional[List[str]] = typer.Argument(None, help="Interfaces to detach."),
    all_: bool = typer.Option(False, "--all", help="Detach from every interface and delete all pinned state."),
):
    """Remove the TC programs from interfaces (--all: from every one, and all pinned state).

    Without --all the QP table, paths and weights stay pinned, so attaching again adopts them.

    Examples:\n
      rlbhost detach eth0\n
      rlbhost detach --all           # remove RLB from this host entirely
    """
    dp = ctx.dataplane()
    dps = pinned_dataplanes(dp.instance)
    if all_:
        gone = [i for d in dps for i in d.destroy()]
        typer.echo(f"detached{' from ' + ', '.join(gone) if gone else ''}; pinned state removed")
        for f in (table_path(dp.instance), status_path(dp.instance)):   # the verbs service's table and status
            f.unlink(missing_ok=True)
        return
    if not interfaces:
        raise HostError("name the interfaces to detach, or use --all")
    for ifname in interfaces:
        next((d for d in dps if d.nic == ifname), dp).detach(ifname)
    typer.echo(f"detached from {', '.join(interfaces)}; pinned state kept")


@app.command()
def status(as_json: bool = typer.Option(False, "--json", help="Machine-readable output."), nic: Optional[str] = NIC_OPTION):
    """What is programmed and its health: paths, weights, QPs per path, counters, agent loops; on a
    GPU server each fabric NIC's (--json: {"nics": [...], "agent_loops": ...}).

    Example: rlbhost status --json | jq '.paths[] | {path, address, weight, active_qps}'"""
    dps = _dataplanes(nic)
    agent = loops.read(health_file(dps[0].instance))
    rows = [{"nic": d.nic, **d.status()} for d in dps]
    if as_json:
        out = {**rows[0], "agent_loops": agent} if dps[0].nic is None and len(rows) == 1 else \
            {"nics": rows, "agent_loops": agent}
        typer.echo(json.dumps(out, indent=2))
        return
    for s in rows:
        if s["nic"]:
            typer.echo(f"NIC {s['nic']}:")
        _status_lines(s)
    typer.echo("agent loops" + ("" if agent else ": no agent has run here"))
    for line in loops.describe(agent):
        typer.echo(line)


def _status_lines(s: dict):
    c = s["config"]
    typer.echo(f"path field: hextet {c['path_field']}, expiry {c['expiry_ms']:g} ms, "
               f"RoCE ports {c['roce_ports']}")
    typer.echo(f"{'path':<6}{'address':<42}{'weight':>8}{'QPs':>6}{'tx_pkts':>10}{'rx_pkts':>10}")
    for p in s["paths"]:
        base = " (base)" if p["index"] == c["base_index"] else ""
        state = ("" if p["valid"] else " (gone)") + ("" if p["carrier"] else " (no carrier)")
        typer.echo(f"{p['path']:<6}{p['address'] + base + state:<42}{p['weight']:>8g}"
                   f"{p['active_qps']:>6}{p['tx_packets']:>10}{p['rx_packets']:>10}")
    for w in s["weights"]:
        if w["prefix"] != "::/0" or w["spray"]:
            typer.echo(f"weights {w['prefix']}: {w['weights']}{' spray' if w['spray'] else ''}")
    typer.echo("counters: " + ", ".join(f"{k} {v}" for k, v in s["reasons"].items() if v))
    if any(p["verbs_qps"] for p in s["paths"]):
        typer.echo("verbs QPs (in the QPs column): " + ", ".join(f"path {p['path']}: {p['verbs_qps']}"
                                                              for p in s["paths"] if p["verbs_qps"])
                   + " (rlbhost verbs status)")


@app.command()
def qps(as_json: bool = typer.Option(False, "--json", help="Machine-readable output."), nic: Optional[str] = NIC_OPTION):
    """Every QP: in the connection-tracking table (peer, UDP source port, QP, path, idle time), and
    those the verbs library placed (QP numbers at both ends, path, process); on a GPU server each
    with the fabric NIC it leaves from.

    Example: rlbhost qps --json | jq 'group_by(.path) | map({path: .[0].path, qps: length})'"""
    rows, verbs = [], []
    for dp in _dataplanes(nic):
        rows += [{**q, "nic": dp.nic} for q in sorted(dp.qps(), key=lambda q: (q["peer"], q["sport"], q["qp"]))]
        verbs += [{**v, "nic": dp.nic} for v in sorted(dp.verbs_rows(), key=lambda q: (q["peer"], q["qp"]))]
    if as_json:
        typer.echo(json.dumps(rows + [{**v, "source": "verbs"} for v in verbs], indent=2))
        return
    for q in rows:
        typer.echo(f"{(q['nic'] + ' ') if q['nic'] else ''}{q['peer']:<40} sport {q['sport']:<6} qp {q['qp']:<9} "
                   f"path {q['path'] + 1:<3} idle {q['idle_ms']:.0f} ms{'' if q['active'] else ' (expired)'}")
    for v in verbs:
        what = "address handle" if v["kind"] == "ah" else f"qp 0x{v['qp']:x} <-> 0x{v['peer_qp']:x}"
        typer.echo(f"{(v['nic'] + ' ') if v['nic'] else ''}{v['peer']:<40} verbs {what:<24} path {v['path'] + 1:<3} "
                   f"pid {v['pid']:<7} decided {v['decided']}, {v['age_s']:.0f} s")


@verbs_app.command("install")
def verbs_install(directory: Path = typer.Option(LIB_DIR, "--dir", help="Where the libraries go (a path "
                  "every job can read; a running job keeps the copy it loaded)."),
                  cc: str = typer.Option("gcc", help="The C compiler.")):
    """Build the verbs library for this host (from the source this package carries).

    librlbverbs.so, and librlbverbs-ibverbs.so for programs that dlopen libibverbs (NCCL), built
    against this host's rdma-core and glibc. Needs gcc and rdma-core's headers (apt install gcc libibverbs-dev). Then a job loads it with
    LD_PRELOAD (`rlbhost verbs env` prints the line).

    Example: rlbhost verbs install && rlbhost verbs env"""
    try:
        lib, shim = build(directory, cc)
    except BuildError as e:
        raise HostError(str(e)) from None
    typer.echo(f"built {lib} and {shim}")
    try:
        grp.getgrnam(VERBS_GROUP)
    except KeyError:
        r = subprocess.run(["groupadd", "--system", VERBS_GROUP], capture_output=True, text=True)
        if r.returncode:
            raise HostError(f"cannot make group {VERBS_GROUP}: {r.stderr.strip()}") from None
        typer.echo(f"made group {VERBS_GROUP}: its members' jobs may use the agent's socket "
                   f"(usermod -aG {VERBS_GROUP} USER)")
    typer.echo(f"a job uses it with: {_verbs_env(lib)}")


def _verbs_env(lib: Path) -> str:
    sock = socket_path(ctx.dataplane().instance)
    default = socket_path("default")
    return f"LD_PRELOAD={lib}" + ("" if sock == default else f" RLB_VERBS_SOCKET={sock}")


@verbs_app.command("env")
def verbs_env(directory: Path = typer.Option(LIB_DIR, "--dir", help="Where `verbs install` put the library.")):
    """The environment a job needs to load the library and find this host's agent.

    Examples:\n
      env $(rlbhost verbs env) ib_write_bw -d mlx5_0 -x 3 -q 8 peer\n
      mpirun -x LD_PRELOAD=/usr/local/lib/rlb/librlbverbs.so ... all_reduce_perf -b 1G -e 1G"""
    lib = directory / "librlbverbs.so"
    if not lib.exists():
        raise HostError(f"no {lib}: run 'rlbhost verbs install' first")
    typer.echo(_verbs_env(lib))


@verbs_app.command("status")
def verbs_status(as_json: bool = typer.Option(False, "--json", help="Machine-readable output.")):
    """The agent's verbs service: processes, QPs placed per path, why QPs kept their addresses.

    Example: rlbhost verbs status --json | jq .kept"""
    dps = _dataplanes(None)
    s = _read_json(status_path(dps[0].instance))
    per_nic: dict[str, dict[int, int]] = {}
    for dp in dps:
        values = {p.index: p.value for p in dp.paths()}
        per_path = per_nic.setdefault(dp.nic or "", {})
        for r in dp.verbs_rows():
            per_path[values.get(r["path"], 0)] = per_path.get(values.get(r["path"], 0), 0) + 1
    out = {"service": s, "placed_per_path": dict(sorted(per_nic.get("", {}).items())),
           "placed_per_nic": {n: dict(sorted(v.items())) for n, v in per_nic.items() if n}}
    if as_json:
        typer.echo(json.dumps(out, indent=2))
        return
    if not s:
        typer.echo("verbs: no agent has served the library here (rlbhost attach ... without --no-verbs)")
    else:
        c = s["counters"]
        typer.echo(f"verbs: socket {s['socket']}, RDMA ports {', '.join(s['ports']) or 'none'}, "
                   f"{s['clients']} processes, {s['qps']} QPs known")
        if "qp_owners" in s:
            refused = {k: c.get(f"{k}_qps", 0) for k in ("foreign", "unknown", "released")}
            typer.echo(f"QP owners: {s['qp_owners']}; claims refused: {refused['foreign']} another's, "
                       f"{refused['unknown']} not the kernel's; let go when the kernel had them no more: "
                       f"{refused['released']}")
        if len(s.get("nics", {})) > 1:
            for n, e in s["nics"].items():
                typer.echo(f"  NIC {n}: RDMA ports {', '.join(e['ports']) or 'none'}, {e['qps']} QPs, placed "
                           f"{e['placed']['rtr']} QP ends and {e['placed']['ah']} address handles")
        typer.echo(f"asked: {c['questions_rtr']} QPs, {c['questions_ah']} address handles; placed: "
                   f"{c['placed_rtr']} QP ends, {c['placed_ah']} address handles; disagreements {c['disagreements']}")
        if "answer_times" in s:
            for kind, what in (("rtr", "QPs"), ("ah", "address handles")):
                f = answertimes.summary(answertimes.between(s["answer_times"], None, kind))
                if f["n"]:
                    typer.echo(f"answered {what} in (since the agent started, from the library's asking): median "
                               f"{f['median_ms']:.2f} ms, 99th percentile {f['p99_ms']:.2f} ms, {f['over_5ms']} over 5 ms"
                               + (f"; {c.get('answered_late', 0)} answers came after their library stopped waiting"
                                  if kind == "rtr" and c.get("answered_late") else ""))
        kept = {k: v for k, v in s["kept"].items() if v}
        typer.echo("kept the application's addresses: " +
                   (", ".join(f"{k} {v}" for k, v in kept.items()) if kept else "none")
                   + (" (rlbhost verbs check says what would change it)" if kept else ""))
    for n, per_path in sorted(per_nic.items()):
        typer.echo(f"placed now{' on ' + n if n else ''}, per path: "
                   + (", ".join(f"path {k}: {v}" for k, v in per_path.items()) or "none"))


@verbs_app.command("check")
def verbs_check(
    pid: Optional[int] = typer.Option(None, help="Read the job's environment from this running process "
                                      "(/proc/PID/environ), e.g. a rank of a job that is not placed."),
    env: Optional[List[str]] = typer.Option(None, "--env", help="KEY=VALUE of the job's environment (repeat); "
                                            "without --pid or --env, this command's own environment."),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
):
    """Will a job's QPs be placed here, and if not why: from the RDMA ports' GID tables (the GID
    NCCL takes on each device), the agent (running, its NICs and paths) and the job's environment
    (the library loaded, NCCL_IB_ADDR_FAMILY, NCCL_IB_GID_INDEX, NCCL_IB_HCA,
    NCCL_IB_QPS_PER_CONNECTION). Exit status 0 when every device NCCL uses will be placed, 2 if not.

    Examples:\n
      rlbhost verbs check --env LD_PRELOAD=/usr/local/lib/rlb/librlbverbs.so --env NCCL_IB_ADDR_FAMILY=AF_INET6\n
      rlbhost verbs check --pid 4242        # a running rank's own environment"""
    if pid is not None:
        try:
            raw = Path(f"/proc/{pid}/environ").read_bytes()
        except OSError as e:
            raise HostError(f"cannot read the environment of pid {pid}: {e.strerror}") from None
        job_env = dict(kv.split("=", 1) for kv in raw.decode(errors="replace").split("\0") if "=" in kv)
    elif env:
        bad = [e for e in env if "=" not in e]
        if bad:
            raise HostError(f"--env {bad[0]!r}: KEY=VALUE")
        job_env = dict(e.split("=", 1) for e in env)
    else:
        job_env = dict(os.environ)
    dps = _dataplanes(None)
    instance = dps[0].instance
    status = _read_json(status_path(instance))
    if status:
        status["age_s"] = time.time() - status_path(instance).stat().st_mtime
    names = list(status.get("nics", {}))
    nics = []
    for dp in dps:
        try:
            name = dp.nic or (names[0] if names else (dp.attached_interfaces() or ["?"])[0])
            nics.append(NicPaths(name, {p.value: p.address for p in dp.paths() if p.valid}))
        except HostError:             # no data plane here at all
            continue
    job, ports = verbs_checks(job_env, nics, status, str(socket_path(instance)))
    placed = bool(ports) and all(p.placed for p in ports if not any(f.what.startswith("not in NCCL_IB_HCA")
                                                                   for f in p.findings))
    ok = placed and not any(f.level == "fail" for f in job)
    if as_json:
        typer.echo(json.dumps({"placed": ok, "job": [f.__dict__ for f in job],
                               "ports": [{"device": p.device, "port": p.port, "netdev": p.netdev, "gid_index": p.gid_index,
                                          "gid": p.gid, "placed": p.placed, "findings": [f.__dict__ for f in p.findings]}
                                         for p in ports]}, indent=2))
    else:
        for f in job:
            typer.echo(f"{f.level.upper():<5} {f.what}" + (f"  -> {f.fix}" if f.fix and f.level != "ok" else ""))
        for p in ports:
            typer.echo(f"{p.device}/{p.port} ({p.netdev or 'no netdev'}): "
                       f"{'placed' if p.placed else 'keeps the application addresses'}")
            for f in p.findings:
                typer.echo(f"  {f.level.upper():<5} {f.what}" + (f"  -> {f.fix}" if f.fix and f.level != "ok" else ""))
        if not ports:
            typer.echo("FAIL  no RDMA device here (/sys/class/infiniband is empty)")
        typer.echo("verdict: " + ("the job's QPs will be placed" if ok else "the job's QPs will NOT be placed (above: why)"))
    if not ok:
        raise typer.Exit(2)


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


@app.command()
def paths(as_json: bool = typer.Option(False, "--json", help="Machine-readable output."), nic: Optional[str] = NIC_OPTION):
    """Path index, address and RoCE GID index (where an RDMA device has one) per path, per fabric NIC.

    Example: rlbhost paths        # then ib_write_bw -x GID_INDEX to pin a hardware QP to a path"""
    rows = [{**r, "nic": dp.nic} for dp in _dataplanes(nic) for r in dp.paths_with_gids()]
    if as_json:
        typer.echo(json.dumps(rows, indent=2))
        return
    for r in rows:
        gids = ", ".join(f"{g['device']}/{g['port']} gid {g['gid_index']}" for g in r["gids"]) or "no RDMA GID"
        typer.echo(f"{(r['nic'] + ' ') if r['nic'] else ''}path {r['path']:<4} {r['address']:<40} {gids}")


@app.command("config")
def config_cmd(
    expiry_ms: Optional[float] = typer.Option(None, help="Idle QP entries are re-assigned after this."),
    roce_port: Optional[List[int]] = typer.Option(None, help="UDP destination ports to handle. Repeat."),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
    nic: Optional[str] = NIC_OPTION,
):
    """Show or change settings (in place: QPs keep their paths), of every fabric NIC or one.

    Examples:\n
      rlbhost config\n
      rlbhost config --expiry-ms 500 --roce-port 4791
    """
    dps = _dataplanes(nic)
    for dp in dps:
        if expiry_ms is not None or roce_port:
            dp.set_config(expiry_ms=expiry_ms, roce_ports=roce_port or None)
    if len(dps) == 1 and dps[0].nic is None:
        common.show(dps[0].config(), as_json)
    elif as_json:
        typer.echo(json.dumps({dp.nic: dp.config() for dp in dps}, indent=2))
    else:
        for dp in dps:
            typer.echo(f"NIC {dp.nic}:")
            common.show(dp.config(), False)


def parse_weights(items: List[str]) -> dict[int, float]:
    out = {}
    for item in items:
        path, sep, w = item.partition("=")
        try:
            if not sep:
                raise ValueError
            out[int(path)] = float(w)
        except ValueError:
            raise HostError(f"weight {item!r}: use PATH=WEIGHT, e.g. 3=0.5") from None
    return out


@weights_app.command("set")
def weights_set(
    weights: List[str] = typer.Argument(..., help="PATH=WEIGHT pairs (path field values), e.g. 1=1 4=0.5; 0 = unusable."),
    prefix: str = typer.Option("::/0", help="Destinations these weights apply to."),
    spray: bool = typer.Option(False, help="Destinations tolerate reordering: choose per packet."),
    nic: Optional[str] = NIC_OPTION,
):
    """Set weights (on every fabric NIC, or --nic's); QPs are released from degraded paths (the
    fewest needed) or reinstated.

    Examples:\n
      rlbhost weights set 1=1 2=1 3=1 4=0.5          # path 4 at half capacity\n
      rlbhost weights set 1=1 2=1 --prefix fc00:2::/32 --spray\n
      rlbhost weights set 1=1 2=0 --nic gpu3_eth     # one NIC of a server
    """
    for dp in _dataplanes(nic):
        before = dp.stats()["reasons"]["ev_released"]
        dp.set_weights(parse_weights(weights), prefix, spray)
        moved = dp.stats()["reasons"]["ev_released"] - before
        typer.echo(f"weights for {prefix}{' on ' + dp.nic if dp.nic else ''} set; {moved} QPs moved")


@weights_app.command("del")
def weights_del(prefix: str = typer.Argument(..., help="The prefix given to 'weights set'."),
                nic: Optional[str] = NIC_OPTION):
    """Remove per-destination weights (the default ::/0 stays).

    Example: rlbhost weights del fc00:2::/32"""
    if not [dp for dp in _dataplanes(nic) if dp.del_weights(prefix)]:
        raise HostError(f"no weights for {prefix}")
    typer.echo(f"removed weights for {prefix}")


@weights_app.command("show")
def weights_show(as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
                 nic: Optional[str] = NIC_OPTION):
    """Weights per destination prefix (per fabric NIC on a GPU server).

    Example: rlbhost weights show --json"""
    dps = _dataplanes(nic)
    w = [{**e, "nic": dp.nic} if dp.nic else e for dp in dps for e in dp.weights()]
    typer.echo(json.dumps(w, indent=2) if as_json else
               "\n".join(f"{(e['nic'] + ' ') if e.get('nic') else ''}{e['prefix']:<24} {e['weights']}"
                         f"{' spray' if e['spray'] else ''}" for e in w))


def main():
    common.run(app, "rlbhost", (HostError, FabricError, BirdError))
