"""rlbswitch: the XDP switch data plane of RLB.

State lives in pinned BPF maps: every command works on what is programmed now, and forwarding goes on whether or not any rlbswitch process is running."""
from __future__ import annotations

import json
import logging
import signal
import sys
from pathlib import Path
from typing import List, Optional

import typer

from rlbcommon import cli as common, health
from rlbcommon.constants import METRICS_PORT
from rlbcommon.health import Health
from rlbcommon.watchdog import Watchdog
from rlbfabric.bird.command import add_bird_config
from rlbfabric.bird.ctl import BirdError
from rlbfabric.errors import FabricError
from rlbfabric.routes import MODES, NextHop, Route, RouteError

from . import control
from .dataplane import OWNER_WAIT_S, DataplaneError, SwitchDataplane
from .heartbeat import INTERVAL_MS
from .runfiles import health_file, why_file

log = logging.getLogger("rlbswitch")
AGENT_CLAIM_S = 30.0     # an agent starting waits this long for a command writing the tables
app, ctx = common.agent_app(__doc__, SwitchDataplane, log)
route_app = typer.Typer(help="Install, remove and show routes.", no_args_is_help=True)
app.add_typer(route_app, name="route")


def run(
    command: typer.Context,
    interfaces: Optional[List[str]] = typer.Argument(None, help="Ports to attach (run: optional, "
        "the ports pinned before are adopted)."),
    once: bool = typer.Option(False, "--once", help="Attach and return, without the agent: then "
        "nothing follows link state, neighbours or bird (for scripts that program routes by hand)."),
    generic: bool = typer.Option(False, help="Generic XDP for the ports given here."),
    speed_mbps: Optional[int] = typer.Option(None, min=1, help="Capacity of the ports given here "
        "(for DLB quality bands) when the driver reports none or a wrong one."),
    metrics_port: int = typer.Option(METRICS_PORT["switch"], help="Prometheus port (0: no metrics)."),
    metrics_addr: str = typer.Option("127.0.0.1", help="Address the metrics bind to."),
    fabric_file: Optional[Path] = typer.Option(None, "--fabric", help="Fabric description: with "
        "--node, follow bird2's routes and program them by the fabric's policy."),
    node: Optional[str] = typer.Option(None, help="This switch's name in the fabric file."),
    bird_socket: Optional[str] = typer.Option(None, help="bird2's control socket "
        "(default: <run-dir>/<node>.ctl)."),
    run_dir: Path = typer.Option(Path("/run/rlb"), help="Where bird's config and includes live."),
    control_only: bool = typer.Option(False, help="Only serve bird (neighbour discovery, path "
        "bandwidth): no XDP, the kernel forwards. For comparing with today's fabrics."),
    resync_s: float = typer.Option(1.0, min=0.1, help="Full read of bird's table this often; changes "
        "of best routes are followed at once from netlink, this catches the rest (backup paths, "
        "path bandwidth)."),
    coordinator: Optional[str] = typer.Option(None, help="A leaf: tell the fabric coordinator at "
        "this URL (e.g. http://[fd00:99::1]:9473) which uplinks are up, so it never places QPs on "
        "a dead one. Needs --fabric and --node."),
    coordinator_ca: Optional[Path] = common.COORDINATOR_CA_OPTION,
    coordinator_cert: Optional[Path] = common.COORDINATOR_CERT_OPTION,
    etcd: Optional[str] = typer.Option(None, help="A leaf, instead of --coordinator: write its uplinks "
        "to the fabric's etcd (comma-separated client URLs) under its own user, where the "
        "coordinators read them."),
    etcd_password_file: Optional[Path] = typer.Option(None, help="With --etcd: the password of this "
        "switch's etcd user rlb-switch-<node> (`rlbfabric etcd-users` issues it)."),
    etcd_ca: Optional[Path] = common.ETCD_CA_OPTION,
    etcd_cert: Optional[Path] = common.ETCD_CERT_OPTION,
    hang_s: float = common.HANG_OPTION,
    heartbeat_ms: int = typer.Option(INTERVAL_MS, min=0, max=10000, help="Ask each neighbouring "
        "switch's data plane this often whether it forwards (answered by its XDP program, not its "
        "bird or agent); a neighbour that keeps carrier but misses 5 in a row is taken out of "
        "forwarding until it answers again (0: off). Neighbours that never answered (other makes) "
        "are not judged."),
):
    """Run the switch agent in the foreground: `attach` with the ports optional (adopted).

    The command of the rlb-switch unit: after a restart or an upgrade it adopts the pinned state
    and the ports attached before; ports named are attached first.

    Examples:\n
      rlbswitch run eth1 eth2 eth3 --fabric /etc/rlb/fabric.toml --node l1\n
      rlbswitch run                  # after a restart or upgrade: adopt what is pinned
    """
    common.attach_or_run(command, interfaces)
    # the agent (netlink followers, bird, metrics, etcd) and the fabric model are loaded by the
    # commands that use them: they are most of every other command's start, and `route apply`
    # is timed end to end
    from rlbfabric.fabric import load

    from .agent import SwitchAgent, SwitchOptions, attach_ports
    opts = SwitchOptions([] if control_only else list(interfaces or []), generic, speed_mbps,
                         fabric_file, None, node, bird_socket, run_dir, control_only, resync_s,
                         coordinator, 0 if control_only else metrics_port, metrics_addr, ctx.node_label,
                         etcd, etcd_password_file, etcd_ca, etcd_cert, heartbeat_ms, coordinator_ca,
                         coordinator_cert)
    opts.check(once)
    opts.fabric = load(fabric_file) if fabric_file else None
    dp = ctx.dataplane()
    if not control_only:     # the tables' one writer, before anything is written (control.py)
        dp.claim(timeout=AGENT_CLAIM_S if not once else OWNER_WAIT_S)
    adopted = dp.exists()
    agent_health = Health(health_file(dp.instance), hang_s)
    if not once:
        Watchdog(agent_health, log).start()    # systemd hears from it while the program compiles, too
    attached = attach_ports(dp, opts)
    if once:
        typer.echo(f"attached to {', '.join(opts.interfaces)}; state pinned at {dp.pins}; no agent runs")
        return
    if opts.interfaces:
        typer.echo(f"attached to {', '.join(opts.interfaces)}; state pinned at {dp.pins}; agent running "
                   "(stop it with ^C or SIGTERM: forwarding goes on)")
    if adopted:
        log.info("adopted pinned state at %s: %d routes, %d ports", dp.pins, len(dp.routes()), len(dp.ports()))
    elif not opts.interfaces and not control_only:
        raise DataplaneError("nothing to run: no pinned state and no interfaces given")
    agent = SwitchAgent(dp, opts, attached, agent_health)
    agent.start()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        if not agent.run():
            log.critical("a netlink follower stopped: exiting so that systemd restarts the agent")
            sys.exit(1)
    except KeyboardInterrupt:
        pass
    log.info("agent stopping; forwarding continues from the pinned maps")


ATTACH_HELP = """Attach the XDP program to ports and run the switch agent in the foreground.

The switch then works fully: link and neighbour changes followed, bird's routes programmed with
--fabric/--node, metrics served. Stopping the agent leaves forwarding running from the pinned
maps; attaching again replaces the program atomically and adopts the state. --once attaches
without the agent.

Examples:\n
  rlbswitch attach eth1 eth2 eth3 eth4\n
  rlbswitch attach eth1 eth2 --fabric /etc/rlb/fabric.toml --node l1\n
  rlbswitch attach --once eth1 eth2      # then: rlbswitch route add ...
"""
app.command("attach", help=ATTACH_HELP)(run)
app.command("run")(run)


@app.command()
def detach(
    interfaces: Optional[List[str]] = typer.Argument(None, help="Ports to detach."),
    all_: bool = typer.Option(False, "--all", help="Detach every port and delete all pinned state."),
):
    """Remove the XDP program from ports (--all: from every port, and all pinned state).

    Without --all, routes and counters stay pinned, so attaching again adopts them.

    Examples:\n
      rlbswitch detach eth3          # take one port out; the others keep forwarding\n
      rlbswitch detach --all         # remove RLB from this switch entirely
    """
    dp = ctx.dataplane()
    if all_:
        try:
            dp.claim(0)
        except DataplaneError:
            raise DataplaneError(f"pid {dp.owner_pid()} (the switch's agent, or a command) writes this "
                                 "switch's tables: stop it first (an agent would attach again)") from None
        common.detach(dp, interfaces, all_, "routes stay pinned")
        return
    if not interfaces:
        raise DataplaneError("name the interfaces to detach, or use --all")
    control.submit(dp, "detach", interfaces=list(interfaces))
    typer.echo(f"detached from {', '.join(interfaces)}; routes stay pinned")


@route_app.command("add")
def route_add(
    prefix: str = typer.Argument(..., help="IPv6 prefix, e.g. fc00:1:1:1::/64"),
    mode: str = typer.Option(..., "--mode", "-m", help=f"One of: {', '.join(MODES)}."),
    via: Optional[List[str]] = typer.Option(None, "--via", help="Next hop: ADDR%IFACE or IFACE@MAC, "
        "with =WEIGHT for weighted and spray. Pinned: the primary. Repeat for groups."),
    backup: Optional[List[str]] = typer.Option(None, "--backup", help="Pinned: a backup next hop "
        "(DLB over the backups when the primary's port is down). Repeat."),
    dev: Optional[str] = typer.Option(None, help="Connected: the port the hosts are on."),
):
    """Install or replace a route (make-before-break).

    Examples:\n
      rlbswitch route add fc00:2:1:1::/64 -m pinned --via fe80::1%eth1 --backup fe80::2%eth2\n
      rlbswitch route add fc00:2::/32 -m weighted --via fe80::1%eth1=3 --via fe80::2%eth2=1\n
      rlbswitch route add fc00:2::/32 -m dlb --via fe80::1%eth1 --via fe80::2%eth2\n
      rlbswitch route add fc00:2::/32 -m spray --via fe80::1%eth1=2 --via fe80::2%eth2=1\n
    Modes: pinned (BGP-DPF), weighted and ecmp (per flow by slot table), dlb (flowlets),
    spray (per packet by weight: only for peers that tolerate reordering), connected, local.
    """
    route = Route(prefix, mode, [NextHop.parse(v) for v in via or []],
                  [NextHop.parse(b) for b in backup or []], dev)
    control.submit(ctx.dataplane(), "add", route=route)
    typer.echo(f"{route.prefix}: {SwitchDataplane.describe(route)}")


@route_app.command("del")
def route_del(prefix: str = typer.Argument(..., help="The route's prefix, exactly.")):
    """Remove a route.

    Example: rlbswitch route del fc00:2:1:1::/64"""
    if not control.submit(ctx.dataplane(), "del", prefix=prefix):
        raise RouteError(f"no route {prefix}")
    typer.echo(f"removed {prefix}")


@route_app.command("apply")
def route_apply(
    file: str = typer.Argument(..., help="JSON list of routes ('-' for stdin): what 'route show "
                               "--json' prints, or {prefix, mode, nexthops: [...], backups: [...], dev}."),
    merge: bool = typer.Option(False, help="Only add and replace the routes given; keep the rest."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Check the file and show nothing but errors."),
):
    """Make the operator's routes equal to a file, in one batch (make-before-break).

    Prints what changed. Routes in the file that are programmed already, by anyone, stay as they
    are; without --merge the operator's routes not in the file are removed. The agent's routes
    (bird's) and the connected ones are left to their owners, unless the file changes them.

    Examples:\n
      rlbswitch route show --json > saved.json; rlbswitch route apply saved.json\n
      rlbswitch route apply --merge extra.json
    """
    text = sys.stdin.read() if file == "-" else Path(file).read_text()
    try:
        data = json.loads(text)
    except ValueError as e:
        raise RouteError(f"{file}: not JSON ({e})") from None
    if not isinstance(data, list):
        raise RouteError(f"{file}: a JSON list of routes expected")
    routes = []
    for i, e in enumerate(data):
        try:
            routes.append(Route.from_json(e))
        except RouteError as err:
            raise RouteError(f"{file}: route {i + 1}: {err}") from None
    if dry_run:
        typer.echo(f"{len(routes)} routes read; nothing applied")
        return
    ch = control.submit(ctx.dataplane(), "apply", routes=routes, merge=merge)
    lines = [f"{label:<8} {p}" for label, items in (("added", ch.added), ("changed", ch.changed),
                                                     ("removed", ch.removed)) for p in items]
    typer.echo("\n".join([*lines, ch.summary()]))      # one write: 16384 echoes took 0.1 s


@route_app.command("show")
def route_show(as_json: bool = typer.Option(False, "--json", help="Machine-readable output.")):
    """Programmed routes and why each is as it is.

    Mode, pinned next hop, backups, weights and slot shares, and the reason: the agent's decision
    from bird, the addresses, or an operator.

    Examples:\n
      rlbswitch route show\n
      rlbswitch route show --json > routes.json      # what 'route apply' takes back
    """
    dp = ctx.dataplane()
    f = why_file(dp.instance)
    why = json.loads(f.read_text()) if f.exists() else {}
    routes = dp.routes()
    for r in routes:
        r["why"] = why.get(r["prefix"], "connected/local from addresses" if r["mode"] in ("connected", "local")
                           else "set by an operator")
    if as_json:
        typer.echo(json.dumps(routes, indent=2))
        return

    def hop(h):
        state = "" if h["resolved"] and h["port_up"] else \
            " (port down)" if not h["port_up"] else " (unresolved)"
        w = f" weight {h['weight']} slots {h['slots']}" if "slots" in h else ""
        return f"{h['via']}{w}{state}"

    for r in routes:
        line = f"{r['prefix']:<28} {r['mode']:<9}"
        if r["mode"] == "connected":
            line += f" dev {r['dev']}"
        if "nexthop" in r:
            line += f" via {hop(r['nexthop'])}"
        typer.echo(line)
        for h in r.get("members", []):
            typer.echo(f"{'':38} member {hop(h)}")
        for h in r.get("backups", []):
            typer.echo(f"{'':38} backup {hop(h)}")
        typer.echo(f"{'':38} why: {r['why']}")


def _switch(fab, node: str, fabric_file: Path) -> str:
    return f"{fab.node(node).role} {node}"


add_bird_config(app, """Render a complete bird.conf for one node of the fabric.

    Also writes the include files the agent keeps up to date (empty to start with).

    Example: rlbswitch bird-config --fabric /etc/rlb/fabric.toml --node l1 -o /etc/bird/bird.conf""",
                "The node to render for.", _switch)


@app.command()
def status(as_json: bool = typer.Option(False, "--json", help="Machine-readable output.")):
    """What is programmed and its health: ports, tables, next hops, counters, agent loops.

    Ports (up, rx/tx), route and table use, next hops, per-reason counters (summed over CPUs),
    and the running agent's loops.

    Example: rlbswitch status --json | jq '.ports[] | {interface, up, tx_bytes}'"""
    dp = ctx.dataplane()
    s = dp.stats()
    s["tables"] = dp.tables.usage()
    s["agent_loops"] = health.read(health_file(dp.instance))
    s["writer_pid"] = dp.owner_pid()
    if as_json:
        typer.echo(json.dumps(s, indent=2))
        return
    t = s["tables"]
    writer = f"written by pid {s['writer_pid']}" if s["writer_pid"] else "no writer running"
    typer.echo(f"state pinned at {dp.pins}: {t['routes']} routes, {t['groups']} groups, "
               f"{t['nexthops']} next hops; {writer}\n")
    typer.echo(f"{'port':<12}{'state':<7}{'rx_pkts':>12}{'rx_bytes':>15}{'tx_pkts':>12}{'tx_bytes':>15}")
    for p in s["ports"]:
        typer.echo(f"{p['interface']:<12}{'up' if p['up'] else 'down':<7}{p['rx_packets']:>12}"
                   f"{p['rx_bytes']:>15}{p['tx_packets']:>12}{p['tx_bytes']:>15}")
    typer.echo(f"\n{'next hop':<36}{'mac':<19}{'packets':>12}{'bytes':>15}")
    for nh in s["nexthops"]:
        typer.echo(f"{nh['via']:<36}{nh['mac']:<19}{nh['packets']:>12}{nh['bytes']:>15}")
    typer.echo("\nreasons and events")
    for k, v in s["reasons"].items():
        if v:
            typer.echo(f"  {k:<24}{v:>12}")
    typer.echo("\nslow path policer (per CPU and port)")
    for k, b in s.get("police", {}).items():
        typer.echo(f"  {k:<16}{b['rate']:>9}/s burst {b['burst']:<7} dropped {b['dropped']}")
    for port, drops in s.get("police_by_port", {}).items():
        if any(drops.values()):
            typer.echo(f"  dropped on {port}: " + ", ".join(f"{k} {v}" for k, v in drops.items() if v))
    typer.echo("\nagent loops" + ("" if s["agent_loops"] else ": no agent has run here"))
    for line in health.describe(s["agent_loops"]):
        typer.echo(line)


@app.command("config")
def config_cmd(
    flowlet_timeout_us: Optional[int] = typer.Option(None, min=1, help="DLB flowlet timeout (default 256)."),
    hash_seed: Optional[int] = typer.Option(None, min=0, max=2**32 - 1, help="Flow hash seed."),
    load_halflife_us: Optional[int] = typer.Option(None, min=1, help="Port-load decay half-life (default 100)."),
    roce_port: Optional[int] = typer.Option(None, min=1, max=65535, help="UDP port whose BTH QP is hashed."),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
):
    """Show or change data-plane settings (in place: forwarding goes on).

    Examples:\n
      rlbswitch config\n
      rlbswitch config --flowlet-timeout-us 128
    """
    dp = ctx.dataplane()
    values = {"flowlet_timeout_ns": None if flowlet_timeout_us is None else flowlet_timeout_us * 1000,
              "hash_seed": hash_seed, "roce_port": roce_port,
              "load_halflife_ns": None if load_halflife_us is None else load_halflife_us * 1000}
    values = {k: v for k, v in values.items() if v is not None}
    common.show(control.submit(dp, "config", values=values) if values else dp.config(), as_json)


def main():
    common.run(app, "rlbswitch", (DataplaneError, RouteError, FabricError, BirdError))
