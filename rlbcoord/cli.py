"""rlbcoord: the fabric coordinator. Host agents (rlbhost attach --coordinator URL) report their
QPs to it, leaf agents (rlbswitch run --coordinator URL) their uplinks; it answers each host with
a placement of its QPs that balances every leaf uplink and spine downlink of the fabric. Hosts
apply placements to new and idle QPs only and decide alone while it is unreachable, so it can be
stopped or restarted at any time without loss."""
from __future__ import annotations

import json
import logging
import signal
import socket
import threading
from pathlib import Path
from typing import Optional

import typer

from rlbcommon import cli as common, coordapi
from rlbcommon import tls as tlsmod
from rlbcommon.health import Health
from rlbcommon.heap import Heap
from rlbcommon.runtime import AgentRuntime
from rlbcommon.watchdog import Watchdog
from rlbfabric.fabric import FabricError, load

# the modules of each kind's coordinator, its runner on etcd and its metrics register themselves
from . import COORDINATORS, ETCD_RUNNERS, etcdauth, keys, kinds, service  # noqa: F401 - kinds: each registers its coordinator
from .metrics import exposition
from .service import make_server
from .shards import Shard

log = logging.getLogger("rlbcoord")
app = typer.Typer(help=__doc__, no_args_is_help=True, pretty_exceptions_enable=False)
URL_HELP = "The coordinator's URL."
DEFAULT_URL = coordapi.url_for("::1")


@app.callback()
def main_options(verbose: bool = typer.Option(False, "--verbose", "-v", help="Debug logging."),
                 version: bool = common.VERSION_OPTION):
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")


@app.command()
def run(
    fabric: Path = typer.Option(..., help="The fabric description (TOML): who may report, and the "
                                "links and speeds placements balance."),
    listen: str = typer.Option("::1", help="Address to listen on: loopback, or the management "
                               "network's (never a fabric address)."),
    port: int = typer.Option(coordapi.DEFAULT_PORT, min=1, max=65535, help="TCP port (API and /metrics)."),
    host_timeout_s: float = typer.Option(5.0, min=0.5, help="A host silent this long is forgotten "
                                         "(without --etcd; with it, a host's lease says)."),
    etcd: Optional[str] = typer.Option(None, help="The fabric's etcd (comma-separated client URLs): "
                                       "state, placements and leadership there; run as many "
                                       "coordinators as you like, one leads. Without it: one "
                                       "coordinator, hosts report over HTTP."),
    etcd_user: str = typer.Option(keys.COORDINATOR_USER, help="With --etcd: the etcd user (rlbfabric etcd-users)."),
    etcd_password_file: Optional[Path] = typer.Option(None, help="With --etcd: its password "
                                                      "(a file only root reads; none: no authentication)."),
    etcd_ca: Optional[Path] = common.ETCD_CA_OPTION,
    etcd_cert: Optional[Path] = common.ETCD_CERT_OPTION,
    name: str = typer.Option(socket.gethostname(), help="With --etcd: this coordinator's name in the "
                             "election (unique among them)."),
    lease_ttl_s: int = typer.Option(2, min=1, max=60, help="With --etcd: the leader's lease; a dead "
                                    "leader is replaced within it (etcd raises it to its own minimum)."),
    shard: str = typer.Option("1/1", help="With --etcd: place the QPs of one share of the fabric's leaves (every N-th), "
                              "K/N (the K-th of N; every coordinator of the fabric with the same N, "
                              "at least one per shard, two for a standby): one process places at most "
                              "what one core solves in time (docs/operations.md)."),
    host_qps_max: int = typer.Option(service.HOST_QPS_MAX, min=1, help="The QPs of one host placed at "
                                     "most: a host reporting more is refused (its earlier state kept, its "
                                     "QPs on its local rule) and logged."),
    tls_cert: Optional[Path] = typer.Option(None, help="Serve HTTPS with this certificate and its key in "
                                            "one PEM file (mode 600; rlbfabric etcd-tls --coordinator "
                                            "issues coordinator-server.pem)."),
    tls_ca: Optional[Path] = typer.Option(None, help="With --tls-cert: the CA of the machines' "
                                          "certificates (rlbfabric etcd-tls's ca.pem). A report is then "
                                          "taken only from the machine it is about; status and metrics "
                                          "stay readable without a certificate."),
    hang_s: float = common.HANG_OPTION,
):
    """Run the coordinator in the foreground: the command of the rlb-coord unit.

    A leaf-spine fabric gets QP placement; a rail-only fabric the h-score registry.

    Example: rlbcoord run --fabric /etc/rlb/fabric.toml --listen fd00:99::1"""
    fab = load(fabric)
    # its loops (the HTTP mode's expiry; on etcd the follower, leadership, placer and writer) on
    # the runtime the agents use: supervised, watched for hangs, systemd told while all are alive
    health = Health(hang_s=hang_s)
    runtime = AgentRuntime(log, health)
    try:
        coord = COORDINATORS.of(fab)(fab, host_timeout_s, host_qps_max)
    except FabricError as e:
        raise CoordError(f"{fabric}: {e}") from None
    runner = None
    if (etcd_ca or etcd_cert) and etcd is None:
        raise CoordError("--etcd-ca and --etcd-cert go with --etcd")
    if shard != "1/1" and etcd is None:
        raise CoordError("--shard goes with --etcd (over HTTP one coordinator places everything)")
    if etcd is not None:
        try:
            on_etcd = ETCD_RUNNERS.of(fab)
        except FabricError as e:
            raise CoordError(f"{fabric}: --etcd: {e}; run without it") from None
        try:
            part = Shard.parse(shard)
            part.leaves(fab)                   # more shards than leaves: refused here
        except ValueError as e:
            raise CoordError(f"--shard: {e}") from None
        try:
            client = etcdauth.client(etcd, etcd_user, etcd_password_file, etcd_ca, etcd_cert)
        except ValueError as e:
            raise CoordError(str(e)) from None
        runner = on_etcd(coord, client, name, lease_ttl_s=lease_ttl_s, shard=part, health=health)
    if tls_ca and not tls_cert:
        raise CoordError("--tls-ca goes with --tls-cert (clients' certificates are read over HTTPS only)")
    try:
        tls = tlsmod.server_context(tls_cert, tls_ca) if tls_cert else None
    except ValueError as e:
        raise CoordError(str(e)) from None
    if tls_cert and not tls_ca and runner is None:
        log.warning("HTTPS without --tls-ca: reports are taken from anybody who reaches %s", listen)
    try:
        server = make_server(coord, listen, port, exposition(coord, runner.status if runner else None, health, name),
                             reports=runner is None,
                             extra_status=runner.status if runner else None, tls=tls)
    except OSError as e:
        raise CoordError(f"cannot listen on {coordapi.url_for(listen, port)}: {e.strerror}") from None
    Watchdog(health, log, runtime.stop).start()
    if runner is not None:
        runner.start(runtime)
        log.info("%s: following %s as %s; placements go there, reports come from there", name, etcd,
                 etcd_user if etcd_password_file else "nobody (no authentication)")

    heap = Heap()

    def expire():
        coord.expire()
        # reports come all the time over HTTP: the model out of the collector's sight each
        # second, its full collection once an hour (rlbcommon/heap.py)
        heap.settle()
        heap.collect_if_due(idle=True)

    if runner is None:                 # with etcd, leases end hosts
        runtime.every("expire", 1.0, expire, expected=())
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=server.shutdown).start())
    log.info("%s from %s; listening on %s%s", coord.summary(), fabric,
             coordapi.url_for(listen, port, https=tls is not None),
             "; reports only with their machine's certificate" if tls_ca else "")
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    runtime.stop.set()
    server.server_close()
    if runner is not None:             # the lease revoked: a standby leads at once
        runner.join(5.0)
        log.info("%s stopped; a standby coordinator leads (or hosts decide locally)", name)
        return
    log.info("coordinator stopped; hosts decide locally")


@app.command()
def status(url: str = typer.Option(DEFAULT_URL, help=URL_HELP),
           as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
           ca: Optional[Path] = typer.Option(None, help="With an https:// URL: the CA of the "
                                             "coordinator's certificate (default: the system's CAs).")):
    """What the coordinator holds: hosts reporting, QPs, load per link, balance (or h-scores).

    Example: rlbcoord status --url http://[fd00:99::1]:9473 --json"""
    try:
        tls = coordapi.client_tls(url, ca)
    except ValueError as e:
        raise CoordError(str(e)) from None
    s = coordapi.call(url, coordapi.STATUS, tls=tls)
    if as_json:
        typer.echo(json.dumps(s, indent=2))
        return
    if "rails" in s:            # a rail-only fabric's h-score registry
        typer.echo(f"{len(s['reporting'])} GPUs reporting; h-scores (1 = idle at line rate):")
        for part in ("rails", "domains"):
            typer.echo(f"  {part:<8} " + "  ".join(f"{k}: {v:.3f}" for k, v in s[part].items()))
        return
    b = s["balance"]
    shard = (s.get("etcd") or {}).get("shard", "1/1")
    if shard != "1/1":
        typer.echo(f"shard {shard}: the QPs of this shard's hosts (the others' leaders place theirs)")
    typer.echo(f"{len(s['hosts'])} hosts, {s['qps']['fabric']} QPs across the fabric, "
               f"{s['qps']['local']} within a leaf; last placement {s['last_solve_ms']} ms")
    typer.echo(f"worst leaf max/mean: uplinks {b['up']:.2f} (best {b['best_up']:.2f}), "
               f"downlinks {b['down']:.2f} (best {b['best_down']:.2f}); QPs over target: {s['over_target']}")
    n = s.get("balance_newest")
    if n and s["qps"].get("newest") != s["qps"]["fabric"]:
        typer.echo(f"the {s['qps']['newest']} QPs active now (older idle ones fill the room left): uplinks "
                   f"{n['up']:.2f} (best {n['best_up']:.2f}), downlinks {n['down']:.2f} (best {n['best_down']:.2f})")
    if s["dead_links"]:
        typer.echo(f"dead uplinks: {', '.join(s['dead_links'])}")
    typer.echo(f"{'leaf':<8}{'QPs per uplink':<28}{'QPs per downlink':<28}")
    for leaf, v in s["links"].items():
        typer.echo(f"{leaf:<8}{' '.join(f'{x:>3}' for x in v['up']):<28}{' '.join(f'{x:>3}' for x in v['down']):<28}")
    for h, e in s["hosts"].items():
        typer.echo(f"  {h}: {e['qps']} QPs, last report {e['age_s']:.1f} s ago")
    for m, e in (s.get("servers") or {}).items():
        typer.echo(f"  server {m}: {len(e['nics'])} NICs reporting, {e['qps']} QPs")


class CoordError(RuntimeError):
    pass


def main():
    common.run(app, "rlbcoord", (coordapi.CoordinatorError, CoordError, FabricError))


if __name__ == "__main__":
    main()
