"""rlbfabric: what the fabric file means for each machine of a real fabric.

`units` renders the systemd units an operator installs on a switch, a GPU host or the coordinator;
`net` is the boot-time link setup those units run; `prometheus` the scrape configuration of every
agent of the fabric; `etcd-tls` the etcd certificates and `etcd-users` the etcd identities of
every machine; `host-keys` the keys each pair of machines shares; `frr-config` FRR's
configuration for a spine of another make (docs/operations.md walks through them)."""
from __future__ import annotations

import re
from pathlib import Path
from typing import List, Optional

import typer

from rlbcommon import cli as common
from rlbcommon.etcd import EtcdError
from rlbcommon.paths import write_private
from rlbcoord import etcdauth, etcdtls
from rlbcoord.shards import Shard
from rlbfabric.fabric import FabricError, load
from rlbfabric.frr.conf import render_spine as render_frr_spine

from . import hostkeys
from .scrape import fabric_scrape_config, read_addresses
from .units import ETCD_CA_FILE, ETCD_CERT_FILE, ETCD_PASSWORD_FILE, Coordination, Site, XdpMode, coordinator_unit, \
    net as net_setup, units as node_units

app = common.program_app(__doc__)
FABRIC_HELP = "The fabric description (TOML)."


@app.command()
def units(
    fabric: Path = typer.Option(..., help=FABRIC_HELP),
    node: str = typer.Option(..., help="The machine's name in the fabric file, or 'coordinator'."),
    mgmt_ip: str = typer.Option(..., help="Its management address (metrics; the coordinator listens there)."),
    coordinator: Optional[str] = typer.Option(None, help="The coordinator's URL: hosts report to it, "
                                              "leaves tell it their uplinks."),
    etcd: Optional[str] = typer.Option(None, help="Instead of --coordinator: the fabric's etcd "
                                       "(comma-separated client URLs); hosts and leaves write there as "
                                       "their own users, coordinators follow it and one leads."),
    etcd_password_file: Path = typer.Option(ETCD_PASSWORD_FILE, help="With --etcd: where each machine "
                                            "keeps its etcd user's password (rlbfabric etcd-users)."),
    etcd_ca_file: Path = typer.Option(ETCD_CA_FILE, help="With https:// --etcd URLs: where each machine keeps "
                                      "the CA of etcd's certificate (rlbfabric etcd-tls: ca.pem)."),
    etcd_cert_file: Path = typer.Option(ETCD_CERT_FILE, help="With https:// --etcd URLs: where each machine "
                                        "keeps its client certificate and key (rlbfabric etcd-tls: <user>.pem)."),
    bin_dir: Path = typer.Option(Site.bin, "--bin", help="Where rlbswitch, rlbhost, rlbcoord and rlbfabric are."),
    xdp: XdpMode = typer.Option(XdpMode.native, help="native, or generic for NICs without native XDP."),
    out: Optional[Path] = typer.Option(None, "-o", "--out", help="Directory to write to (default: print them)."),
    shard: str = typer.Option("1/1", help="With --node coordinator and --etcd: the shard of placement this "
                              "coordinator takes, K/N (rlbcoord run --shard; the same N on every "
                              "coordinator, two per shard for a standby)."),
):
    """Render the systemd units of one machine of the fabric.

    Examples:\n
      rlbfabric units --fabric /etc/rlb/fabric.toml --node l1 --mgmt-ip 10.0.0.11 \\\n
          --coordinator http://10.0.0.2:9473 -o /etc/systemd/system\n
      rlbfabric units --fabric /etc/rlb/fabric.toml --node coordinator --mgmt-ip 10.0.0.2\n
      rlbfabric units --fabric /etc/rlb/fabric.toml --node h1 --mgmt-ip 10.0.0.21 \\\n
          --etcd https://10.0.0.2:2379,https://10.0.0.3:2379
    """
    if coordinator and etcd:
        raise typer.BadParameter("--coordinator or --etcd, not both: the coordinator runs on one or the other")
    fab = load(fabric)
    site = Site(bin=bin_dir, xdp=xdp.value)
    fabric_file = fabric.resolve()
    coord = Coordination(url=coordinator, etcd=etcd, password_file=etcd_password_file, ca_file=etcd_ca_file,
                         cert_file=etcd_cert_file)
    if shard != "1/1":
        if node != "coordinator" or not etcd:
            raise typer.BadParameter("--shard is a coordinator's, on etcd: give --node coordinator and --etcd")
        try:
            Shard.parse(shard).leaves(fab)
        except ValueError as e:
            raise typer.BadParameter(str(e)) from None
    rendered = (coordinator_unit(fabric_file, mgmt_ip, site, coord, shard=shard) if node == "coordinator"
                else node_units(fab, fabric_file, node, mgmt_ip, coord, site))
    for name, text in rendered.items():
        if out:
            out.mkdir(parents=True, exist_ok=True)
            (out / f"{name}.service").write_text(text)
            typer.echo(f"wrote {out / f'{name}.service'}")
        else:
            typer.echo(f"# {name}.service\n{text}")


@app.command("frr-config")
def frr_config(
    fabric: Path = typer.Option(..., help=FABRIC_HELP),
    node: str = typer.Option(..., help="The spine's name in the fabric file (daemon = \"frr\" there)."),
    log: Path = typer.Option(Path("/var/log/frr/frr.log"), help="Where FRR logs."),
    out: Optional[Path] = typer.Option(None, "-o", "--out", help="File to write (mode 600: it holds the BGP "
                                       "password; default: print it)."),
):
    """Render FRR's configuration for a spine of another make in an RLB fabric.

    What such a spine needs beside RLB's switches: unnumbered sessions to its leaves the standard
    way (each leaf's link-local address from its router advertisements), the fabric's BGP
    password, GTSM and fast timers, BFD at the fabric's interval, each leaf's prefixes only, and
    multipath; the colour and FARE path-bandwidth communities pass through it (docs/operations.md,
    "A spine of another make").

    Example: rlbfabric frr-config --fabric /etc/rlb/fabric.toml --node s1 -o /etc/frr/frr.conf
    """
    fab = load(fabric)
    try:
        sw = fab.node(node)
    except FabricError as e:
        raise typer.BadParameter(str(e), param_hint="--node") from None
    if sw.role != "spine":
        raise typer.BadParameter(f"{node} is a {sw.role}: FRR is supported on spines (leaves run bird and rlbswitch)",
                                 param_hint="--node")
    try:
        text = render_frr_spine(fab, sw, log)
    except ValueError as e:
        raise FabricError(str(e)) from None
    if out is None:
        typer.echo(text, nl=False)
        return
    write_private(out, text)
    typer.echo(f"wrote {out}")


@app.command()
def net(
    fabric: Path = typer.Option(..., help=FABRIC_HELP),
    node: str = typer.Option(..., help="This machine's name in the fabric file."),
):
    """Set this machine's fabric links up: what rlb-net.service runs at boot (idempotent).

    Example: rlbfabric net --fabric /etc/rlb/fabric.toml --node l1"""
    net_setup(load(fabric), node)
    typer.echo(f"{node}: fabric links set up")


@app.command()
def prometheus(
    fabric: Path = typer.Option(..., help=FABRIC_HELP),
    mgmt: Optional[List[str]] = typer.Option(None, help="NODE=ADDRESS: a node's management address "
                                             "(repeat; added to --mgmt-file's)."),
    mgmt_file: Optional[Path] = typer.Option(None, help="An inventory: one 'node address' a line, # comments."),
    coordinator: Optional[List[str]] = typer.Option(None, help="A coordinator's management address, "
                                                    "ADDRESS or ADDRESS:PORT (default port 9473); repeat for each "
                                                    "coordinator on etcd: the leader and its standbys."),
    rules: Optional[Path] = typer.Option(None, help="Alerting rules to load, as Prometheus will find them "
                                         "(e.g. /etc/prometheus/rlb-alerts.yml, from prometheus/rlb-alerts.yml)."),
    interval: str = typer.Option("2s", help="Scrape and rule evaluation interval (a Prometheus duration)."),
    out: Optional[Path] = typer.Option(None, "-o", "--out", help="File to write (default: print it)."),
):
    """Render Prometheus's configuration: every agent of the fabric, labelled with its node and role.

    Every switch and host of the fabric needs a management address, and every address must name
    one of them, so that nothing is left unwatched by a typo.

    Examples:\n
      rlbfabric prometheus --fabric /etc/rlb/fabric.toml --mgmt-file /etc/rlb/mgmt.txt \\\n
          --coordinator 10.0.0.2 --rules /etc/prometheus/rlb-alerts.yml -o /etc/prometheus/prometheus.yml\n
      rlbfabric prometheus --fabric lab/fabric-2x2.toml --mgmt s1=10.0.0.1 --mgmt s2=10.0.0.2 ...\n
          --coordinator 10.0.0.2 --coordinator 10.0.0.3      (coordinators on etcd: every one)
    """
    if not re.fullmatch(r"[0-9]+(ms|s|m|h)", interval):
        raise typer.BadParameter(f"{interval!r}: a duration such as 2s, 500ms or 1m", param_hint="--interval")
    addrs = read_addresses(mgmt_file.read_text(), str(mgmt_file)) if mgmt_file else {}
    for item in mgmt or []:
        node, sep, addr = item.partition("=")
        if not sep or not node or not addr:
            raise typer.BadParameter(f"{item!r}: expected NODE=ADDRESS", param_hint="--mgmt")
        addrs[node] = addr
    text = fabric_scrape_config(load(fabric), addrs, coordinator, interval,
                                [str(rules)] if rules else []) + "\n"
    if out:
        out.write_text(text)
        typer.echo(f"wrote {out}")
    else:
        typer.echo(text, nl=False)


@app.command("etcd-users")
def etcd_users(
    fabric: Path = typer.Option(..., help=FABRIC_HELP),
    etcd: List[str] = typer.Option(..., help="An etcd member's client URL (repeat for each)."),
    out: Path = typer.Option(Path("/etc/rlb/etcd"), "-o", "--out", help="Directory for the password "
                             "files (0700; one <user>.password each, 0600; root's is etcd's administrator)."),
    etcd_ca: Optional[Path] = typer.Option(None, help="With https:// URLs: the CA of etcd's certificate "
                                           "(rlbfabric etcd-tls: ca.pem)."),
    etcd_cert: Optional[Path] = typer.Option(None, help="With https:// URLs: root's client certificate and "
                                             "key, if etcd asks for one (rlbfabric etcd-tls: root.pem)."),
):
    """Give every host, every switch and the coordinator its own etcd user, then turn etcd's
    authentication on.

    A host's user may write only its own reports and read its own placements, a switch's only
    its own reports; the coordinator alone writes placements: a report forged in another
    machine's name is refused by etcd itself. Run again when the fabric grows: existing users
    and their passwords are kept. Copy each machine's password file to it (docs/operations.md).

    Example: rlbfabric etcd-users --fabric /etc/rlb/fabric.toml --etcd https://10.0.0.2:2379 -o /root/rlb-etcd \\\n
          --etcd-ca /root/rlb-etcd/ca.pem --etcd-cert /root/rlb-etcd/root.pem
    """
    try:
        tls = etcdauth.tls_options(etcd, etcd_ca, etcd_cert)
    except ValueError as e:
        raise typer.BadParameter(str(e), param_hint="--etcd") from None
    try:
        issued = etcdauth.issue(load(fabric), etcd, out, tls=tls)
    except (EtcdError, ValueError) as e:       # etcd refused, or a password file is unreadable
        raise RuntimeError(f"etcd: {e}") from None
    typer.echo(f"{len(issued.users_added)} users added, {len(issued.users_kept)} kept; passwords in {out}; "
               f"authentication {'turned on' if issued.auth_enabled else 'was on already'}")


@app.command("etcd-tls")
def etcd_tls(
    fabric: Path = typer.Option(..., help=FABRIC_HELP),
    server: List[str] = typer.Option(..., help="An etcd member's address or DNS name, as the agents' "
                                     "--etcd URLs write it (repeat for each member)."),
    out: Path = typer.Option(Path("/etc/rlb/etcd"), "-o", "--out", help="Directory for the CA, etcd's "
                             "certificate and one <user>.pem per machine (0700; keys 0600)."),
    coordinator: Optional[List[str]] = typer.Option(None, help="An HTTP coordinator's address or DNS "
                                                    "name, as the agents' https:// --coordinator URL "
                                                    "writes it (repeat): coordinator-server.pem for "
                                                    "rlbcoord run --tls-cert."),
):
    """Issue the fabric's etcd certificates, for a site without a PKI of its own: a CA, a server
    certificate for the etcd members, a client certificate for every host, every switch, the
    coordinators and root.

    With them etcd speaks only TLS and lets in only machines holding a certificate of this CA;
    the passwords (etcd-users) stay the identity, now out of sight of the management network.
    Run again when the fabric grows or a member's address changes: what exists is kept. Give
    etcd server.pem, server.key and ca.pem (--cert-file, --key-file, --trusted-ca-file,
    --client-cert-auth); copy ca.pem and each machine's <user>.pem to it (docs/operations.md).

    The same CA and machine certificates serve an HTTP coordinator over HTTPS (--coordinator: its
    certificate too): it then takes each machine's reports only from that machine.

    Example: rlbfabric etcd-tls --fabric /etc/rlb/fabric.toml --server 10.0.0.2 --server 10.0.0.3 -o /root/rlb-etcd
    """
    try:
        written = etcdtls.issue(load(fabric), out, server)
    except ValueError as e:
        raise typer.BadParameter(str(e), param_hint="--server") from None
    if coordinator:
        try:
            written += etcdtls.issue_coordinator(out, coordinator)
        except ValueError as e:
            raise typer.BadParameter(str(e), param_hint="--coordinator") from None
    typer.echo(f"{len(written)} files issued in {out} (CA {etcdtls.ca_file(out)}); "
               f"etcd: {' '.join(map(str, etcdtls.server_files(out)))}")


@app.command("host-keys")
def host_keys(
    fabric: Path = typer.Option(..., help=FABRIC_HELP),
    master: Path = typer.Option(..., help="The master key: 32 or more hex digits, mode 600, kept on this "
                                "machine only (make one: umask 077; openssl rand -hex 32 > master.key)."),
    out: Path = typer.Option(Path("/etc/rlb/host-keys"), "-o", "--out", help="Directory for one "
                             "<machine>.key per host or server (0700; files 0600)."),
):
    """Give every pair of machines a key of its own, for the verbs agents' messages (leaf-spine)
    and the GPUs' plane-probe answers (scale-up).

    Each machine's file holds the keys it shares with every other one, so a host whose file
    leaks can be impersonated, but no other: its messages (a GPU's probe answers, signed in the
    kernel) are checked with the key of its pair alone. Install each <machine>.key as that machine's --fabric-key file (it may keep a
    fabric-wide key line while the rollout is in progress; remove it everywhere afterwards). Run
    again when the fabric grows: the same master gives the same keys.

    Example: rlbfabric host-keys --fabric /etc/rlb/fabric.toml --master /root/rlb-master.key -o /root/rlb-host-keys
    """
    written = hostkeys.write(load(fabric), master, out)
    typer.echo(f"{len(written)} key files in {out}: copy each to its machine as /etc/rlb/probe-key (mode 600)")


def main():
    common.run(app, "rlbfabric", (FabricError, RuntimeError))


if __name__ == "__main__":
    main()
