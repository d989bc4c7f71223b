"""rlblab: an RLB fabric on one machine (network namespaces, veths, bird2, XDP, rlbhost), and the
demo that compares it with kernel ECMP."""
from __future__ import annotations

import json
import random
import shutil
import sys
from pathlib import Path
from typing import Optional

import typer

from rlbcommon import cli as common, netns
from rlbcommon.netns import run
from rlbcommon.paths import PIN_ROOT, RUN_DIR
from rlbfabric import workloads
from rlbfabric.bird.ctl import BirdClient, BirdError
from rlbcoord import cli as coord_cli
from rlbfabric.fabric import FabricError

from . import demo as clos_demo, switchdemo, topo
from .fabricgen import make_fabric
from .labs import open_lab
from .matrix import report, run_matrix
from .scenarios import SCENARIOS, run_scenario

app = common.program_app(__doc__)
DEFAULT_FABRIC = Path(__file__).resolve().parent.parent / "lab" / "fabric.toml"


def _state(name: str) -> Path:
    return RUN_DIR / f"lab-{name}.json"


def _lab(name: str):
    st = _state(name)
    if not st.exists():
        raise typer.BadParameter(f"no lab {name!r} is up (rlblab up)")
    s = json.loads(st.read_text())
    return open_lab(s["fabric"], name, mode=s["mode"], shape=s["shape"], monitor=s.get("monitor", False),
                    coordinator=s.get("coordinator", False), etcd=s.get("etcd", False),
                    shards=s.get("shards", 1))


@app.command()
def up(
    fabric: Optional[Path] = typer.Option(None, help="Fabric description (default: Juniper's example, "
                                          "4 spines, 2 leaves, 2 hosts per leaf, 4 prefixes per host port)."),
    spines: Optional[int] = typer.Option(None, help="Generate a fabric instead: spines (per pod)."),
    leaves: int = typer.Option(2, help="With --spines: leaves."),
    hosts: int = typer.Option(2, help="With --spines: GPU hosts per leaf."),
    stages: int = typer.Option(3, help="With --spines: 3 or 5 (two pods and super-spines)."),
    parallel: int = typer.Option(1, help="With --spines: links between each leaf and spine."),
    rails: int = typer.Option(0, min=0, help="With --spines: GPU servers of this many NICs instead of one-NIC "
                              "hosts, rail-optimised (server i's NIC r on leaf r of its stripe of --rails "
                              "leaves; --hosts servers a stripe)."),
    mode: str = typer.Option("rlb", help="rlb, or baseline: kernel ECMP as fabrics run today."),
    shape: bool = typer.Option(False, help="tbf on fabric links at their configured rate."),
    monitor: bool = typer.Option(False, help="A management network (<name>-mon, fd00:99::/64) with "
                                 "a real Prometheus scraping every agent (needs Debian's prometheus)."),
    coordinator: bool = typer.Option(True, help="The fabric coordinator (rlbcoord) in <name>-mon: "
                                     "hosts report QPs and take its placements. --no-coordinator "
                                     "shows the hosts' local rule alone."),
    etcd: bool = typer.Option(True, help="The coordinator on etcd: an etcd member in <name>-mon, "
                              "an etcd user per host, leaf and coordinator, two coordinators (one "
                              "leads); hosts and leaves write their state there. --no-etcd: one "
                              "coordinator taking reports over HTTP."),
    coord_shards: int = typer.Option(1, min=1, help="With etcd: placement split over this many "
                                     "shards of the leaves (rlbcoord run --shard K/N), two "
                                     "coordinators each."),
    name: str = typer.Option("rlb", help="Lab name (namespace prefix)."),
):
    """Build the fabric: namespaces, links, bird2 everywhere, agents; wait until converged.

    A scale-up fabric file (kind = "scaleup", e.g. lab/scaleup.toml) builds planes and GPUs, a
    rail-only one (lab/rail-only.toml) domains, rails and the h-score registry.

    Examples:\n
      rlblab up                                  # Juniper's example fabric, with RLB\n
      rlblab up --mode baseline --name ecmp      # the same fabric with kernel ECMP\n
      rlblab up --spines 4 --leaves 4 --hosts 2 --monitor\n
      rlblab up --spines 4 --leaves 2 --hosts 2 --rails 2    # 2 servers, each a NIC on both rail leaves\n
      rlblab up --fabric lab/scaleup.toml --name su
    """
    if spines is not None:
        RUN_DIR.mkdir(parents=True, exist_ok=True)
        fabric = RUN_DIR / f"lab-{name}.toml"
        try:
            fabric.write_text(make_fabric(spines, leaves, hosts, stages, parallel=parallel, rails=rails))
        except ValueError as e:
            raise typer.BadParameter(str(e)) from None
    fabric = (fabric or DEFAULT_FABRIC).resolve()
    try:
        lab = open_lab(fabric, name, mode=mode, shape=shape, monitor=monitor, coordinator=coordinator, etcd=etcd,
                       shards=coord_shards)
    except ValueError as e:
        raise typer.BadParameter(f"--coord-shards {coord_shards}: {e}") from None
    typer.echo(f"==> building {lab.fabric.summary()} from {fabric} ({mode}"
               f"{', coordinator' if lab.coordinator else ''}{' on etcd' if getattr(lab, 'etcd', False) else ''})")
    RUN_DIR.mkdir(parents=True, exist_ok=True)
    _state(name).write_text(json.dumps({"fabric": str(fabric), "mode": mode, "shape": shape,
                                        "monitor": monitor, "coordinator": lab.coordinator,
                                        "etcd": getattr(lab, "etcd", False),
                                        "shards": getattr(lab, "shards", 1)}))
    lab.up()
    typer.echo("==> waiting for BGP to converge")
    lab.wait_converged(120)
    if monitor:
        lab.start_prometheus()
        typer.echo(f"Prometheus: ip netns exec {lab.ns('mon')} curl -s 127.0.0.1:9090/api/v1/targets "
                   f"(config {lab.work / 'prometheus.yml'}; dashboards in grafana/)")
    if getattr(lab, "etcd", False):
        typer.echo(f"etcd: {lab.etcd_url} in {lab.ns('mon')} (TLS; users' passwords, CA and certificates in {lab.etcd_creds}); "
                   f"coordinators {', '.join(lab.coordinator_urls().values())}, one leads"
                   f"{f' each of {lab.shards} shards' if lab.shards > 1 else ''}")
    elif lab.coordinator:
        typer.echo(f"coordinator: {lab.coordinator_url} in {lab.ns('mon')} (rlblab coordinator)")
    typer.echo(f"up: {', '.join(lab.namespaces())}; logs and bird sockets in {lab.work}")


@app.command()
def scenario(
    name: Optional[str] = typer.Argument(None, help="The scenario to run (see --list)."),
    list_: bool = typer.Option(False, "--list", help="List the scenarios: name, source, what it shows."),
    as_json: bool = typer.Option(False, "--json", help="With --list: machine-readable output."),
    lab_name: str = typer.Option("rlbsn", "--name", help="Name of the lab the scenario builds (and tears down)."),
    fabric: Optional[Path] = typer.Option(None, help="Another fabric file of the kind the scenario needs "
                                          "(the scale-up ones take their expected figures from it)."),
    repeat: int = typer.Option(1, min=1, help="Run it this many times on the one lab (a spread of "
                               "figures); exit 1 if any run fails."),
):
    """Run one of the seeds' worked examples on the lab it needs and print what was measured,
    with PASS/FAIL against the document's expectation (exit 1 on FAIL).

    Examples:\n
      rlblab scenario --list\n
      rlblab scenario juniper-fig13\n
      rlblab scenario scaleup-3.1-subcable --fabric lab/scaleup-small.toml\n
      rlblab scenario scaleup-silent --repeat 5
    """
    if list_ and as_json:
        typer.echo(json.dumps([{"name": s.name, "source": s.source, "summary": s.summary,
                                "fabric": f"lab/{s.fabric}", "minutes": s.minutes} for s in SCENARIOS.values()],
                              indent=2))
        return
    if list_ or name is None:
        for s in SCENARIOS.values():
            typer.echo(f"{s.name:<20} {s.source:<36} {s.summary} [lab/{s.fabric}, ~{s.minutes:g} min]")
        if name is None and not list_:
            raise typer.Exit(2)
        return
    if name not in SCENARIOS:
        raise typer.BadParameter(f"no scenario {name!r}; choose one of: {', '.join(SCENARIOS)}",
                                 param_hint="NAME")
    if not run_scenario(name, lab_name, echo=typer.echo, fabric=fabric, repeat=repeat):
        raise typer.Exit(1)


@app.command()
def down(name: str = typer.Option("rlb", help="Lab name.")):
    """Tear the lab down: agents, bird, namespaces, pinned maps. Leaves nothing behind.

    Example: rlblab down --name ecmp"""
    if _state(name).exists():
        _lab(name).down()
        _state(name).unlink()
    left = [ns for ns in topo.list_ns() if ns.startswith(f"{name}-")]
    for ns in left:
        topo.del_ns(ns)
    for d in PIN_ROOT.glob(f"{name}-*"):      # pins of agents that died with their namespace
        shutil.rmtree(d, ignore_errors=True)
    typer.echo(f"lab {name} is down")


@app.command()
def status(name: str = typer.Option("rlb", help="Lab name."),
           as_json: bool = typer.Option(False, "--json", help="Machine-readable output.")):
    """Namespaces, BGP sessions and what each leaf programmed.

    Example: rlblab status --name ecmp --json"""
    lab = _lab(name)
    out = {"fabric": str(lab.fabric_file), "summary": lab.fabric.summary(), "mode": lab.mode, "switches": {}}
    for sw in lab.switches:
        e = out["switches"][sw.name] = {"role": sw.role}
        try:
            sess = [p for p in BirdClient(str(lab.work / f"{sw.name}.ctl")).protocols() if p["proto"] == "BGP"]
            e["bgp_established"] = sum(p["info"].startswith("Established") for p in sess)
        except BirdError as err:
            e["bird_error"] = str(err)
        if lab.mode == "rlb" and sw.role == "leaf":
            modes = [r["mode"] for r in lab.routes(sw.name).values()]
            e["routes"] = {m: modes.count(m) for m in sorted(set(modes))}
    if as_json:
        typer.echo(json.dumps(out, indent=2))
        return
    typer.echo(f"{out['summary']}, mode {out['mode']}, fabric {out['fabric']}")
    for sw_name, e in out["switches"].items():
        bgp = (f"bird unreachable: {e['bird_error']}" if "bird_error" in e else
               f"BGP {e['bgp_established']} established")
        routes = ", ".join(f"{n} {m}" for m, n in e.get("routes", {}).items())
        typer.echo(f"  {e['role']:<10} {sw_name:<6} {bgp}{'; ' + routes if routes else ''}")


@app.command()
def traffic(
    src: Optional[str] = typer.Option(None, "--from", help="One sending GPU host (with --to)."),
    dst: Optional[str] = typer.Option(None, "--to", help="One receiving GPU host."),
    workload: Optional[str] = typer.Option(None, help="A traffic matrix instead: pairs, all-to-all, "
                                           "ring, permutation, moe, tree."),
    hosts: Optional[str] = typer.Option(None, help="With --workload: the hosts taking part, "
                                        "comma-separated, in order (default: all)."),
    qps: int = typer.Option(4, min=1, max=256, help="QPs per connection."),
    packets: int = typer.Option(200, min=1, help="Packets per QP and burst."),
    bursts: int = typer.Option(2, min=1, max=20, help="Bursts (iterations of the collective); the last "
                               "is reported. Between bursts QPs go idle and take placements."),
    seed: int = typer.Option(1, help="Source ports, QP numbers and random matrices come from this seed."),
    churn_gap: Optional[float] = typer.Option(None, min=0.0, max=30.0, help="Churn: first run the matrix "
                                              "with other QPs (a job that ends), then these this many "
                                              "seconds after its last packet; only the new QPs are reported."),
    compare: Optional[str] = typer.Option(None, help="Another lab (e.g. one brought up with --mode "
                                          "baseline) to run the same matrix through, side by side."),
    name: str = typer.Option("rlb", help="Lab name."),
):
    """Send RoCEv2-like QPs (raw frames, as a NIC would) and show every leaf uplink and spine
    downlink from the spines' kernel counters, next to the best possible for that matrix.

    Examples:\n
      rlblab traffic --from h1 --to h3 --qps 8\n
      rlblab traffic --workload all-to-all --qps 2\n
      rlblab traffic --workload pairs --qps 2 --churn-gap 0.6     # a new job 0.6 s after the last\n
      rlblab up --mode baseline --name ecmp; rlblab traffic --workload ring --qps 3 --compare ecmp"""
    lab = _lab(name)
    if workload:
        members = hosts.split(",") if hosts else lab.hosts
        unknown = [h for h in members if h not in lab.hosts]
        if unknown:
            raise typer.BadParameter(f"no hosts {unknown} in this lab (have {', '.join(lab.hosts)})")
        try:
            conns = workloads.connections(workload, members, random.Random(seed))
        except ValueError as e:
            raise typer.BadParameter(str(e)) from None
    elif src and dst:
        conns = [(src, dst)]
    else:
        raise typer.BadParameter("give --from and --to, or --workload")
    labs = [lab] + ([_lab(compare)] if compare else [])
    for lb in labs:
        r = run_matrix(lb, conns, qps, packets, seed, bursts, churn_gap_s=churn_gap)
        churn = "" if churn_gap is None else f", new QPs {churn_gap:g} s after a job on other QPs ended"
        typer.echo(f"==> {lb.name} ({lb.mode}{', coordinator' if lb.coordinator else ''}): "
                   f"{workload or f'{src} -> {dst}'}, {qps} QPs per connection{churn}, burst {len(r.bursts)} of {bursts}")
        for line in report(lb, r):
            typer.echo(line)


@app.command()
def coordinator(name: str = typer.Option("rlb", help="Lab name."),
                as_json: bool = typer.Option(False, "--json", help="Machine-readable output.")):
    """The lab coordinator's view: hosts reporting, QPs placed per link, balance.

    Example: rlblab coordinator --json"""
    lab = _lab(name)
    if not lab.coordinator:
        raise typer.BadParameter(f"lab {name} runs without a coordinator")
    if not getattr(lab, "etcd", False):
        with netns.inside(lab.ns("mon")):
            coord_cli.status(lab.coordinator_url, as_json, getattr(lab, "coordinator_ca", None))
        return
    leaders = lab.leading_coordinators() or [next(iter(lab.coordinator_urls()))]
    for key in leaders:                # one a shard: each places its leaves' hosts
        if lab.shards > 1 and not as_json:
            typer.echo(f"== shard {lab.shard_of(key.split('-', 1)[1])} ({key}): its hosts' QPs")
        with netns.inside(lab.ns("mon")):
            coord_cli.status(lab.coordinator_urls()[key], as_json, None)   # (not typer: every option passed)


def _set_link(name: str, leaf: str, spine: str, link: int, state: str):
    lab = _lab(name)
    ifname = f"eth-{spine}-{link}" if link else f"eth-{spine}"
    run(lab.ns(leaf), "ip", "link", "set", ifname, state)
    typer.echo(f"{leaf} {ifname} {state}")


LINK_HELP = "Which of parallel links (1..n)."


@app.command("fail-link")
def fail_link(leaf: str, spine: str, link: int = typer.Option(0, help=LINK_HELP),
              name: str = typer.Option("rlb", help="Lab name.")):
    """Take a leaf-spine link down (the leaf's side).

    Example: rlblab fail-link l1 s2          # then: rlblab traffic --from h1 --to h3"""
    _set_link(name, leaf, spine, link, "down")


@app.command("restore-link")
def restore_link(leaf: str, spine: str, link: int = typer.Option(0, help=LINK_HELP),
                 name: str = typer.Option("rlb", help="Lab name.")):
    """Bring a leaf-spine link back.

    Example: rlblab restore-link l1 s2"""
    _set_link(name, leaf, spine, link, "up")


@app.command()
def demo(keep: bool = typer.Option(False, help="Leave the RLB lab running afterwards."),
         chart: Path = typer.Option(Path("rlb-demo.png"), help="Where to draw the load chart (PNG).")):
    """The main demo: kernel ECMP against RLB on Juniper's example fabric, side by side.

    Then a leaf-spine link failure during traffic. About 3 minutes.

    Example: rlblab demo --keep      # leave the RLB lab up to explore (rlblab status)"""
    sys.exit(clos_demo.main(keep=keep, chart=chart))


@app.command("switch-demo")
def switch_demo(keep: bool = typer.Option(False, help="Leave the lab running afterwards.")):
    """One XDP switch and four parallel links: the same QPs under each forwarding mode.

    Example: rlblab switch-demo"""
    sys.exit(switchdemo.main(keep=keep))


def main():
    common.run(app, "rlblab", (FabricError, RuntimeError, TimeoutError))
