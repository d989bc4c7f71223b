"""rlbhost: puts each RoCEv2 QP of this host on its own fabric path by address rewrite.

Needs one global address per fabric path on the interface (SLAAC from the leaf's RAs). Works for traffic the kernel builds (Soft-RoCE, UDP): hardware RoCE NICs build packets without the kernel, so TC never sees them; there, use 'rlbhost paths --json' to pick a GID per QP."""
from __future__ import annotations

import json
import logging
import signal
import sys
from pathlib import Path
from typing import List, Optional

import typer

from rlbcommon import cli as common
from rlbfabric.constants import METRICS_PORT, RUN_DIR

from . import probes
from .dataplane import HostDataplane, HostError

log = logging.getLogger("rlbhost")
app, ctx = common.agent_app(__doc__, HostDataplane, log)
weights_app = typer.Typer(help="Per-path weights (optionally per destination prefix).",
                          no_args_is_help=True)
app.add_typer(weights_app, name="weights")


def run(
    command: typer.Context,
    interface: Optional[str] = typer.Argument(None, help="The fabric interface, e.g. eth0 (run: "
        "optional, the interface attached before is adopted)."),
    path_field: Optional[int] = typer.Option(None, min=0, max=3, help="Hextet (0-3) that numbers "
        "the paths in the /64 prefixes; detected when there are two or more."),
    base_path: Optional[int] = typer.Option(None, help="Path whose address applications use "
        "(default: the lowest)."),
    expiry_ms: Optional[float] = typer.Option(None, help="Idle QP entries are re-assigned after "
        "this (default 200 ms: between collective bursts)."),
    roce_port: Optional[List[int]] = typer.Option(None, help="UDP destination ports to handle "
        "(default 4791). Repeat for several."),
    fabric: Optional[Path] = typer.Option(None, help="The fabric description: with --node, this "
        "host's place in the fabric (where its ties between paths start, so hosts spread before "
        "they meet; QPs within its leaf counted apart). Needed for --coordinator."),
    node: Optional[str] = typer.Option(None, help="This host's name in the fabric file "
        "(default: the host name)."),
    coordinator: Optional[str] = typer.Option(None, help="The fabric coordinator's URL, e.g. "
        "http://[fd00:99::1]:9473: QPs are reported to it and new or idle QPs take its placements."),
    report_ms: int = typer.Option(250, min=50, help="How often to report to the coordinator."),
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
    carrier_rt_priority: int = typer.Option(10, min=0, max=99, help="Scale-up GPUs: SCHED_FIFO "
        "priority of the carrier watcher, which takes a port that loses carrier out of use "
        "(0: normal scheduling, slower on a busy host)."),
):
    """Run the host agent in the foreground: `attach` with the interface optional (adopted).

    The command of the rlb-host unit: after a restart or an upgrade it adopts the pinned state
    (QPs keep their paths) and the interface attached before.

    Examples:\n
      rlbhost run eth0 --fabric /etc/rlb/fabric.toml --node h1\n
      rlbhost run                    # adopt: the interface that has the programs
    """
    common.attach_or_run(command, interface)
    interface = interface or _attached(ctx.dataplane())
    import socket
    from rlbfabric.fabric import load
    from .agent import HostAgent, check_place
    fab = load(fabric) if fabric else None
    node = node or socket.gethostname()
    if fab is not None and fab.kind == "rail-only":
        return _attach_rail(fab, node, interface, expiry_ms, roce_port, coordinator, metrics_port,
                            metrics_addr, once)
    if fab is not None and fab.kind == "scaleup":
        return _attach_gpu(fab, node, interface, expiry_ms, roce_port, run_dir, probe_ms, probe_dead_ms,
                           metrics_port, metrics_addr, once, carrier_rt_priority)
    if fab:
        check_place(fab, node)
    if coordinator and not fab:
        raise HostError("--coordinator needs --fabric (and --node unless the host name is the fabric's)")
    dp = ctx.dataplane()
    dp.ifindex(interface)   # before anything is loaded
    dp.attach(interface, path_field, base_path)
    if expiry_ms is not None or roce_port:
        dp.set_config(expiry_ms=expiry_ms, roce_ports=roce_port or None)
    from rlbcommon.health import Health
    health = Health(health_file(dp.instance))
    agent = HostAgent(dp, interface, path_field, base_path, fab, node if fab else None, health)
    if fab:
        agent.place()
    paths = [p for p in dp.paths() if p.valid]
    typer.echo(f"attached to {interface}: {len(paths)} paths "
               f"({', '.join(f'{p.value}:{p.address}' for p in paths)})")
    if once:
        return
    from .coordclient import CoordinatorClient
    client = CoordinatorClient(dp, node, coordinator, report_ms / 1000, qp_memory_s, health=health) \
        if coordinator else None
    _run_agent(agent, dp, health, metrics_port, metrics_addr, coordinator=client)


ATTACH_HELP = """Attach to an interface and run the host agent in the foreground.

The host then works fully: each QP placed on a path (one address per path, from the leaf's RAs),
paths followed as addresses and carrier come and go, weights from the fabric, metrics served.
Stopping the agent leaves the programs and the QP table in place; attaching again replaces the
programs in place and QPs keep their paths. --once attaches without the agent.

On a GPU of a scale-up fabric (kind = "scaleup") the interface is the loopback device: each QP
is placed on a plane's sub-port, weighted by the path bandwidth bird learns per plane. On a GPU of
a rail-only fabric (kind = "rail-only") too: each new QP takes the first hop the h-scores from the
coordinator choose (rd, dr or a remote rail: `rlbhost why`).

Examples:\n
  rlbhost attach eth0\n
  rlbhost attach eth0 --fabric /etc/rlb/fabric.toml --node h1 --coordinator http://[fd00:99::1]:9473\n
  rlbhost attach rlb0 --fabric scaleup.toml --node g1\n
  rlbhost attach rlb0 --fabric rail-only.toml --node d1g1 --coordinator URL
"""
app.command("attach", help=ATTACH_HELP)(run)
app.command("run")(run)


def _attached(dp) -> str:
    """The one interface that has this host's programs (what `run` adopts)."""
    found = dp.attached_interfaces()
    if len(found) != 1:
        raise HostError(f"run: {'no interface has' if not found else 'several interfaces have'} the programs"
                        f"{' (' + ', '.join(found) + ')' if found else ''}: name the interface")
    return found[0]


def _run_agent(agent, dp, health, metrics_port: int, metrics_addr: str, **collect):
    """The agent in the foreground, with its metrics served (0: none), until SIGTERM or ^C:
    `collect` names what the metrics read besides the data plane (coordinator client, prober,
    rail agent); a coordinator client starts reporting first."""
    if metrics_port:
        from rlbcommon.metrics import serve
        from .metrics import HostCollector
        serve(HostCollector(dp, ctx.node_label, health=health, **collect), metrics_port, metrics_addr)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    if collect.get("coordinator"):
        collect["coordinator"].start()
    try:
        agent.run()
    except KeyboardInterrupt:
        pass
    log.info("agent stopping; the programs and QP table stay in place")


def why_file(instance: str) -> Path:
    """Where a rail-only GPU's agent writes its decisions (read by `rlbhost why`)."""
    return RUN_DIR / f"{instance}-host-why.json"


def _attach_rail(fab, node, interface, expiry_ms, roce_port, coordinator, metrics_port, metrics_addr, once):
    from . import rails

    def start(dp, health):
        agent = rails.attach(dp, fab, node, coordinator, health=health, why_file=why_file(dp.instance))
        return agent, f"rail-only: {len(agent.hops)} first hops, address {fab.address(node)}", {"rails": agent}
    _run_gpu_agent(interface, start, expiry_ms, roce_port, metrics_port, metrics_addr, once)


@app.command()
def why(peer: Optional[str] = typer.Argument(None, help="Only this destination GPU, e.g. d2g2."),
        as_json: bool = typer.Option(False, "--json", help="Machine-readable output.")):
    """Rail-only GPUs: the path to each destination and the numbers behind it.

    Example: `rlbhost why d2g2` -> drd via rail 3: gamma(src) 0.40, gamma(dst) 0.50, H(rail 3)
    0.80 is the lowest above max(gamma) = 0.50 (the Remote Rail Theorem's best fit)."""
    import json
    path = why_file(ctx.dataplane().instance)
    if not path.exists():
        raise HostError(f"no decisions at {path}: is the agent running on a rail-only GPU?")
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


def _num(x) -> str:
    return "inf" if x is None else f"{x:.3f}"


def _attach_gpu(fab, node, interface, expiry_ms, roce_port, run_dir, probe_ms, probe_dead_ms,
                metrics_port, metrics_addr, once, carrier_rt_priority=10):
    from . import planes

    def start(dp, health):
        agent = planes.attach(dp, fab, node, run_dir, health=health, probe_ms=probe_ms,
                              probe_dead_ms=probe_dead_ms, carrier_rt_priority=carrier_rt_priority)
        live = [p for p in dp.paths() if p.valid]
        return (agent, f"{len(live)} of {len(agent.ports)} sub-ports usable, loopback {agent.loopback}",
                {"prober": agent.prober})
    _run_gpu_agent(interface, start, expiry_ms, roce_port, metrics_port, metrics_addr, once)


def _run_gpu_agent(interface, start, expiry_ms, roce_port, metrics_port, metrics_addr, once):
    """A GPU of a scale-up or rail-only fabric: ports mode on the loopback device, where the
    fabric's addresses are routed; start(dp, health) -> (agent, what it has, metrics kwargs)."""
    from rlbcommon.health import Health
    from rlbfabric.scaleup import LOOPBACK_DEVICE
    if interface != LOOPBACK_DEVICE:
        raise HostError(f"on a GPU attach to the loopback device {LOOPBACK_DEVICE!r}, not {interface!r}: "
                        "the fabric's addresses are routed there")
    dp = ctx.dataplane()
    dp.ifindex(interface)
    health = Health(health_file(dp.instance))
    agent, summary, collect = start(dp, health)
    if expiry_ms is not None or roce_port:
        dp.set_config(expiry_ms=expiry_ms, roce_ports=roce_port or None)
    typer.echo(f"attached to {interface} (ports mode): {summary}")
    if once:
        return
    _run_agent(agent, dp, health, metrics_port, metrics_addr, **collect)


@app.command("bird-config")
def bird_config(
    fabric_file: Path = typer.Option(..., "--fabric", help="The fabric description (kind scaleup)."),
    node: str = typer.Option(..., help="This GPU's name in the fabric file."),
    run_dir: Path = typer.Option(Path(str(RUN_DIR)), help="Where bird's log and includes live."),
    out: Optional[Path] = typer.Option(None, "-o", "--out", help="Write here (default: stdout)."),
    bfd_ms: Optional[int] = typer.Option(None, min=10, max=10000, help="BFD interval instead of the "
        "fabric file's (slower for emulated VMs, whose timers jitter by hundreds of ms)."),
):
    """Render bird.conf for a GPU of a scale-up fabric.

    Its path-bandwidth include starts at full bandwidth; the agent rewrites it as sub-ports come
    and go.

    Example: rlbhost bird-config --fabric scaleup.toml --node g1 -o /etc/bird/bird.conf"""
    from rlbfabric.bird.conf import initial_includes, render
    from rlbfabric.fabric import load
    fab = load(fabric_file)
    if not fab.is_gpu(node):
        raise HostError(f"{node!r} is not a GPU of a scale-up fabric in {fabric_file}")
    if bfd_ms:
        fab.bfd_ms = bfd_ms
    run_dir.mkdir(parents=True, exist_ok=True)
    for inc, body in initial_includes(fab, node, run_dir).items():
        if not inc.exists():
            inc.write_text(body)
    text = render(fab, node, run_dir)
    if out:
        out.write_text(text)
        typer.echo(f"wrote {out} (GPU {node})")
    else:
        typer.echo(text, nl=False)


def health_file(instance: str) -> Path:
    """Where the running agent keeps its loops' health (read by `rlbhost status`)."""
    return RUN_DIR / f"{instance}-host-health.json"


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
    common.detach(ctx.dataplane(), interfaces, all_, "pinned state kept")


@app.command()
def status(as_json: bool = typer.Option(False, "--json", help="Machine-readable output.")):
    """What is programmed and its health: paths, weights, QPs per path, counters, agent loops.

    Example: rlbhost status --json | jq '.paths[] | {path, address, weight, active_qps}'"""
    from rlbcommon import health
    dp = ctx.dataplane()
    s = dp.status()
    s["agent_loops"] = health.read(health_file(dp.instance))
    if as_json:
        typer.echo(json.dumps(s, indent=2))
        return
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
    typer.echo("agent loops" + ("" if s["agent_loops"] else ": no agent has run here"))
    for line in health.describe(s["agent_loops"]):
        typer.echo(line)


@app.command()
def qps(as_json: bool = typer.Option(False, "--json", help="Machine-readable output.")):
    """Every QP in the connection-tracking table: peer, UDP source port, QP, path, idle time.

    Example: rlbhost qps --json | jq 'group_by(.path) | map({path: .[0].path, qps: length})'"""
    rows = sorted(ctx.dataplane().qps(), key=lambda q: (q["peer"], q["sport"], q["qp"]))
    if as_json:
        typer.echo(json.dumps(rows, indent=2))
        return
    for q in rows:
        typer.echo(f"{q['peer']:<40} sport {q['sport']:<6} qp {q['qp']:<9} path {q['path'] + 1:<3} "
                   f"idle {q['idle_ms']:.0f} ms{'' if q['active'] else ' (expired)'}")


@app.command()
def paths(as_json: bool = typer.Option(False, "--json", help="Machine-readable output.")):
    """Path index, address and RoCE GID index (where an RDMA device has one) per path.

    Example: rlbhost paths        # then ib_write_bw -x GID_INDEX to pin a hardware QP to a path"""
    rows = ctx.dataplane().paths_with_gids()
    if as_json:
        typer.echo(json.dumps(rows, indent=2))
        return
    for r in rows:
        gids = ", ".join(f"{g['device']}/{g['port']} gid {g['gid_index']}" for g in r["gids"]) or "no RDMA GID"
        typer.echo(f"path {r['path']:<4} {r['address']:<40} {gids}")


@app.command("config")
def config_cmd(
    expiry_ms: Optional[float] = typer.Option(None, help="Idle QP entries are re-assigned after this."),
    roce_port: Optional[List[int]] = typer.Option(None, help="UDP destination ports to handle. Repeat."),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
):
    """Show or change settings (in place: QPs keep their paths).

    Examples:\n
      rlbhost config\n
      rlbhost config --expiry-ms 500 --roce-port 4791
    """
    dp = ctx.dataplane()
    if expiry_ms is not None or roce_port:
        dp.set_config(expiry_ms=expiry_ms, roce_ports=roce_port or None)
    common.show(dp.config(), as_json)


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
):
    """Set weights; QPs are released from degraded paths (the fewest needed) or reinstated.

    Examples:\n
      rlbhost weights set 1=1 2=1 3=1 4=0.5          # path 4 at half capacity\n
      rlbhost weights set 1=1 2=1 --prefix fc00:2::/32 --spray
    """
    dp = ctx.dataplane()
    before = dp.stats()["reasons"]["ev_released"]
    dp.set_weights(parse_weights(weights), prefix, spray)
    moved = dp.stats()["reasons"]["ev_released"] - before
    typer.echo(f"weights for {prefix} set; {moved} QPs moved")


@weights_app.command("del")
def weights_del(prefix: str = typer.Argument(..., help="The prefix given to 'weights set'.")):
    """Remove per-destination weights (the default ::/0 stays).

    Example: rlbhost weights del fc00:2::/32"""
    if not ctx.dataplane().del_weights(prefix):
        raise HostError(f"no weights for {prefix}")
    typer.echo(f"removed weights for {prefix}")


@weights_app.command("show")
def weights_show(as_json: bool = typer.Option(False, "--json", help="Machine-readable output.")):
    """Weights per destination prefix.

    Example: rlbhost weights show --json"""
    w = ctx.dataplane().weights()
    typer.echo(json.dumps(w, indent=2) if as_json else
               "\n".join(f"{e['prefix']:<24} {e['weights']}{' spray' if e['spray'] else ''}" for e in w))


def main():
    from rlbfabric.bird.ctl import BirdError
    from rlbfabric.fabric import FabricError
    common.run(app, "rlbhost", (HostError, FabricError, BirdError))
