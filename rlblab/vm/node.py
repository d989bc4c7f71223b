"""Inside a Vagrant lab VM: give the node its fabric role from the lab plan (rlblab.vm.plan).

    python -m rlblab.vm.node setup --fabric F --node N   # once, by the provisioner: names the
                                                        # fabric NICs, writes and starts units
    python -m rlblab.vm.node net --fabric F --node N     # every boot (rlb-net.service): links up,
                                                        # sysctls, a leaf's gateway addresses

Units: switches run bird2 (rlb-bird) and `rlbswitch run` (rlb-switch, leaves telling the
coordinator their uplinks); hosts run `rlbhost attach` (rlb-host, reporting to the coordinator)
and get a Soft-RoCE device rxe0 on their fabric port (rlb-rxe); the monitor runs etcd (Debian's
etcd.service, configured in /etc/default/etcd), issues every machine its etcd user
(rlb-etcd-users: `rlbfabric etcd-users`), runs the fabric coordinator on it (rlb-coord, `rlbcoord
run --etcd`), Prometheus (rlb-prometheus) scraping every agent and the coordinator, and Grafana
with the dashboards if installed. Hosts and leaves write to that etcd as their own users. A scale-up fabric's GPUs run bird2 and `rlbhost
attach rlb0` (the deployment's units) and its monitor only Prometheus (there is no coordinator);
GPUs get no Soft-RoCE device: rxe takes packets only on the netdev it is bound to, and a GPU's
QPs arrive on any of its sub-ports addressed to its loopback (the lab's UDP QPs stand in)."""
from __future__ import annotations

import functools
import hashlib
import json
import logging
import shutil
import subprocess
from pathlib import Path

import typer

from rlbcommon import cli as common
from rlbcommon.netns import run
from rlbcommon.paths import write_private
from rlbdeploy import units as deploy
from rlbcoord import etcdauth, etcdtls, keys
from rlbfabric.fabric import FabricError, load
from rlbdeploy.scrape import fabric_scrape_config
from rlbmonitor.alerts import write as write_rules

from .plan import ETC, LOAD_SCRIPT, MONITOR, VmNode, node, plan

log = logging.getLogger("rlb.vmnode")
VENV = Path("/opt/rlb/venv/bin")
UNITS = Path("/etc/systemd/system")
RUN = Path("/run/rlb")
VERBS_LIB = Path("/usr/local/lib/rlb")
ETCD_PORT = 2379
ETCD_USERS = ETC / "etcd-users"          # on the monitor: every user's password, root's included
# the lab's etcd certificates (rlbfabric etcd-tls), issued on the machine that runs vagrant
# (the Vagrantfile) and synced with the source, the CA's key left behind: each VM takes its own
# as an operator would copy it to each machine
LAB_PKI = Path("/opt/rlb/src/vagrant/.lab-pki")
ETCD_SERVER_TLS = Path("/etc/etcd/rlb-tls")    # etcd's certificate and key, readable by its user
ETCD_DEFAULTS = Path("/etc/default/etcd")
ETCD_DROPIN = UNITS / "etcd.service.d" / "rlb.conf"
LINK_DIR = Path("/etc/systemd/network")   # .link files: NIC names that survive a reboot


sh = functools.partial(run, None)   # commands here, in the VM's own namespace


def nics() -> dict[str, str]:
    """MAC -> interface name of every NIC."""
    return {l["address"]: l["ifname"] for l in json.loads(sh("ip", "-j", "link", "show"))
            if l.get("link_type") == "ether"}


def name_nics(vm: VmNode):
    """Rename each fabric NIC after its link (by MAC; in link order where the provider ignores
    MACs, e.g. VirtualBox), and keep the names across reboots with systemd .link files."""
    have = nics()
    macs = {n: m for m, n in have.items()}
    spare = sorted((n for n in have.values() if n.startswith("eth") and n[3:].isdigit() and int(n[3:]) >= 2),
                   key=lambda n: int(n[3:]))
    for i, link in enumerate(vm.links):
        cur = have.get(link.mac) or (spare[i] if i < len(spare) else None)
        if cur is None:
            raise RuntimeError(f"no NIC for link {link.name} (MAC {link.mac}); NICs: {have}")
        mac = macs[cur]
        (LINK_DIR / f"10-{link.ifname}.link").write_text(
            f"[Match]\nMACAddress={mac}\n\n[Link]\nName={link.ifname}\n")
        if cur != link.ifname:
            sh("ip", "link", "set", cur, "down")
            sh("ip", "link", "set", cur, "name", link.ifname)
            log.info("%s -> %s (%s, towards %s)", cur, link.ifname, mac, link.peer)


def net(fabric_file: Path, name: str):
    """Boot-time link setup (idempotent): the deployment's own (rlbdeploy.units)."""
    deploy.net(load(fabric_file), name)


def etcd_url(vms: list[VmNode]) -> str:
    return f"https://{node(vms, MONITOR).mgmt_ip}:{ETCD_PORT}"


def etcd_servers(vms: list[VmNode]) -> list[str]:
    """The addresses etcd's certificate names: the monitor's management address, and loopback
    (the etcd users' unit on the monitor)."""
    return [node(vms, MONITOR).mgmt_ip, "127.0.0.1"]


def coordination(fab, vms: list[VmNode]) -> deploy.Coordination:
    """The lab's coordinator runs on etcd on the monitor (what `rlblab up` does in namespaces)."""
    return deploy.Coordination(etcd=etcd_url(vms)) if fab.coordinated else deploy.Coordination()


def etcd_config(vms: list[VmNode]) -> dict[Path, str]:
    """Debian's etcd.service on the monitor, configured as one member (its environment file) and
    restarted however often it fails, like the agents' units."""
    mon = node(vms, MONITOR)
    env = {"ETCD_NAME": MONITOR, "ETCD_DATA_DIR": "/var/lib/etcd/rlb",
           "ETCD_LISTEN_CLIENT_URLS": f"https://{mon.mgmt_ip}:{ETCD_PORT},https://127.0.0.1:{ETCD_PORT}",
           "ETCD_ADVERTISE_CLIENT_URLS": etcd_url(vms),
           # TLS only, and only machines with a certificate of the lab's CA (docs/operations.md)
           "ETCD_CERT_FILE": str(ETCD_SERVER_TLS / "server.pem"), "ETCD_KEY_FILE": str(ETCD_SERVER_TLS / "server.key"),
           "ETCD_TRUSTED_CA_FILE": str(ETCD_SERVER_TLS / "ca.pem"), "ETCD_CLIENT_CERT_AUTH": "true",
           "ETCD_LISTEN_PEER_URLS": "http://127.0.0.1:2380",
           "ETCD_INITIAL_ADVERTISE_PEER_URLS": "http://127.0.0.1:2380",
           "ETCD_INITIAL_CLUSTER": f"{MONITOR}=http://127.0.0.1:2380",
           "ETCD_INITIAL_CLUSTER_STATE": "new",
           # emulated VMs stall for hundreds of ms: a lone member's elections must not flap
           "ETCD_HEARTBEAT_INTERVAL": "200", "ETCD_ELECTION_TIMEOUT": "2000"}
    return {ETCD_DEFAULTS: "".join(f"{k}={v}\n" for k, v in env.items()),
            ETCD_DROPIN: f"[Unit]\n{deploy.NO_START_LIMIT}\n[Service]\n{deploy.RESTART}\n"}


def units(fab, vms: list[VmNode], vm: VmNode, fabric_file: Path, **knobs) -> dict[str, str]:
    """{unit name: unit file} for one VM: what an operator installs (rlbdeploy.units), plus the
    lab's own: its load recorded on every VM (load_unit); Soft-RoCE on the hosts; on the monitor
    the etcd users issued, and Prometheus beside the coordinator. `knobs`: deploy.Site's (xdp,
    bfd_ms, hang_s, ...: what the provisioner was given)."""
    return {**_role_units(fab, vms, vm, fabric_file, **knobs), **load_unit()}


def _role_units(fab, vms: list[VmNode], vm: VmNode, fabric_file: Path, **knobs) -> dict[str, str]:
    """units() but the load record: what this VM's role runs."""
    site = deploy.Site(bin=VENV, run_dir=RUN, **knobs)
    coord = coordination(fab, vms)
    if vm.role == "monitor":
        out = {}
        if fab.coordinated:
            out["rlb-etcd-users"] = f"""[Unit]
Description=The RLB lab's etcd users (one per machine) and authentication on
Requires=etcd.service
After=etcd.service
[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart={VENV}/rlbfabric etcd-users --fabric {fabric_file} --etcd https://127.0.0.1:{ETCD_PORT} -o {ETCD_USERS} --etcd-ca {deploy.ETCD_CA_FILE} --etcd-cert {etcdtls.client_file(ETCD_USERS, etcdauth.ROOT_USER)}
Restart=on-failure
RestartSec=2
[Install]
WantedBy=multi-user.target
"""
            out.update(deploy.coordinator_unit(
                fabric_file, vm.mgmt_ip, site, deploy.Coordination(
                    etcd=coord.etcd, password_file=ETCD_USERS / f"{keys.COORDINATOR_USER}.password"),
                name=vm.name, after=("rlb-etcd-users.service",)))
        return {**out, "rlb-prometheus": f"""[Unit]
Description=Prometheus scraping the RLB lab's agents
[Service]
ExecStart=/usr/bin/prometheus --config.file={ETC}/prometheus.yml --storage.tsdb.path=/var/lib/rlb-prometheus --web.listen-address=:9090
Restart=always
[Install]
WantedBy=multi-user.target
"""}
    out = deploy.units(fab, fabric_file, vm.name, vm.mgmt_ip, coord, site)
    if vm.role == "host" and fab.paths_by_address:
        # a Soft-RoCE device per fabric NIC (a server's rxe0, rxe1, ...: their QP numbers collide,
        # as eight ConnectX devices' do)
        ports = [fab.host_port(h) for h in fab.endpoints(vm.name)]
        adds = "\n".join(f"ExecStart=/bin/sh -c 'rdma link show rxe{i}/1 >/dev/null 2>&1 || "
                         f"rdma link add rxe{i} type rxe netdev {p}'" for i, p in enumerate(ports))
        out["rlb-rxe"] = f"""[Unit]
Description=Soft-RoCE devices {", ".join(f"rxe{i} on {p}" for i, p in enumerate(ports))}
Requires=rlb-net.service
After=rlb-net.service
[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=/sbin/modprobe rdma_rxe
{adds}
[Install]
WantedBy=multi-user.target
"""
    return out


LOAD_EVERY_S = 30
# one line of a VM's load: run queue, memory, CPU and memory pressure (PSI), the busiest processes
LOAD_LINE = r"""#!/bin/sh
# the RLB lab's record of this VM's load (rlblab.vm.node.load_unit); "once": one line and stop
while :; do
  l="$(date +%T) load $(cut -d' ' -f1-3 /proc/loadavg)"
  l="$l | mem $(free -m | awk '/^Mem/ {print $3 " used, " $7 " available MiB"}')"
  l="$l | psi cpu $(sed -n 's/^some avg10=\([0-9.]*\).*/\1/p' /proc/pressure/cpu 2>/dev/null)"
  l="$l mem $(sed -n 's/^full avg10=\([0-9.]*\).*/\1/p' /proc/pressure/memory 2>/dev/null)"
  l="$l | most CPU (time, KiB) $(ps -eo time=,rss=,comm= --sort=-time | head -4 | tr -s ' ' | tr '\n' ';')"
  echo "$l"
  [ -w /dev/ttyS0 ] && echo "rlb-load $l" >/dev/ttyS0
  [ "$1" = once ] && break
  sleep "${2:-30}"
done
"""


def load_unit() -> dict[str, str]:
    """The lab's own record of each VM's load every LOAD_EVERY_S (LOAD_LINE), to the journal
    and to the serial port, which the host keeps in a file (the Vagrantfile): under emulation a
    VM can stall past answering ssh, and then the serial log is the only account of why."""
    return {"rlb-lab-load": f"""[Unit]
Description=The lab VM's load every {LOAD_EVERY_S} s, to the journal and the serial port
[Service]
ExecStart=/bin/sh {LOAD_SCRIPT} always {LOAD_EVERY_S}
Restart=always
Nice=-10
[Install]
WantedBy=multi-user.target
"""}


def setup(fabric_file: Path, name: str, scrape_s: int = 0, **knobs):
    """`knobs`: deploy.Site's, for the node's units (units()); scrape_s: the monitor's Prometheus
    scrapes and evaluates its rules this often (0: rlbdeploy's 2 s)."""
    fab = load(fabric_file)
    vms = plan(fab)
    vm = node(vms, name)
    fabric_file = fabric_file.resolve()
    ETC.mkdir(parents=True, exist_ok=True)
    LINK_DIR.mkdir(parents=True, exist_ok=True)
    name_nics(vm)
    if vm.role == "host":
        write_lab_key(fabric_file)
    if fab.coordinated:
        write_etcd_passwords(fab, vm, fabric_file)
        install_etcd_certs(vm)
    if vm.role == "monitor" and fab.coordinated:
        for path, text in etcd_config(vms).items():
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
    elif shutil.which("etcd"):            # the box has it everywhere; only the monitor runs it
        sh("systemctl", "disable", "--now", "etcd.service")
    if vm.role == "host" and fab.paths_by_address:
        # the verbs library, as an operator installs it (`rlbhost verbs install`)
        sh(str(VENV / "rlbhost"), "verbs", "install", "--dir", str(VERBS_LIB))
    Path(LOAD_SCRIPT).write_text(LOAD_LINE)
    todo = units(fab, vms, vm, fabric_file, **knobs)
    for u, body in todo.items():
        (UNITS / f"{u}.service").write_text(body)
    if vm.role == "monitor":
        rules = write_rules(ETC)
        (ETC / "prometheus.yml").write_text(scrape_targets(fab, vms, vm, coordinator=fab.coordinated,
                                                           rule_files=[str(rules)], scrape_s=scrape_s))
    sh("systemctl", "daemon-reload")
    if vm.role == "monitor" and fab.coordinated:
        sh("systemctl", "enable", "etcd.service")
        sh("systemctl", "restart", "etcd.service")
        log.info("etcd on %s", etcd_url(vms))
    for u in todo:
        sh("systemctl", "enable", f"{u}.service")
        sh("systemctl", "restart", f"{u}.service")
        log.info("%s started", u)
    if vm.role == "monitor":
        grafana(vm)


def lab_secret(fabric_file: Path, what: str) -> str:
    """A secret of the lab derived from the fabric file every VM has, so the VMs agree without
    one to hand out. An operator makes random ones (docs/operations.md)."""
    return hashlib.sha256(f"rlb lab {what}\0".encode() + fabric_file.read_bytes()).hexdigest()[:32]


def write_lab_key(fabric_file: Path, path: Path = ETC / "probe-key"):
    """The fabric's keys (probe answers, the verbs agents' messages): one key, the lab's (an
    operator's: `openssl rand -hex 16`)."""
    write_private(path, lab_secret(fabric_file, "key") + "\n")


def write_etcd_passwords(fab, vm: VmNode, fabric_file: Path, own: Path = deploy.ETCD_PASSWORD_FILE,
                         users: Path = ETCD_USERS):
    """Each machine's etcd password where its agent reads it (deploy.ETCD_PASSWORD_FILE); on
    the monitor every user's, where `rlbfabric etcd-users` takes them instead of making new ones
    (what an operator copies from the issuing machine to each, the lab derives on each)."""
    mine = {"leaf": keys.switch_user, "host": keys.host_user}.get(vm.role)
    if mine is not None:
        write_private(own, lab_secret(fabric_file, f"etcd {mine(vm.name)}") + "\n")
    if vm.role == "monitor":
        users.mkdir(mode=0o700, parents=True, exist_ok=True)
        for user in [etcdauth.ROOT_USER, *(i.user for i in keys.identities(fab))]:
            write_private(etcdauth.password_file(users, user), lab_secret(fabric_file, f"etcd {user}") + "\n")


def install_etcd_certs(vm: VmNode, pki: Path = LAB_PKI, etc: Path = ETC, server_dir: Path = ETCD_SERVER_TLS,
                      users: Path = ETCD_USERS):
    """The lab's etcd certificates where the units look for them (deploy.ETCD_CA_FILE, ETCD_CERT_FILE):
    the CA on every machine that speaks to etcd, its own certificate (the coordinators' on the
    monitor); on the monitor also etcd's (for its user) and root's (the etcd users' unit)."""
    mine = {"leaf": keys.switch_user, "host": keys.host_user}.get(vm.role)
    user = mine(vm.name) if mine else keys.COORDINATOR_USER if vm.role == "monitor" else None
    if user is None:
        return                                   # spines never speak to etcd
    if not etcdtls.ca_file(pki).exists():
        raise RuntimeError(f"{pki}: no etcd certificates (the Vagrantfile issues them with rlbfabric etcd-tls)")
    etc.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(etcdtls.ca_file(pki), etc / deploy.ETCD_CA_FILE.name)
    write_private(etc / deploy.ETCD_CERT_FILE.name, etcdtls.client_file(pki, user).read_text())
    if vm.role == "monitor":
        users.mkdir(mode=0o700, parents=True, exist_ok=True)
        write_private(etcdtls.client_file(users, etcdauth.ROOT_USER),
                      etcdtls.client_file(pki, etcdauth.ROOT_USER).read_text())
        server_dir.mkdir(mode=0o750, parents=True, exist_ok=True)
        cert, key = etcdtls.server_files(pki)
        shutil.copyfile(cert, server_dir / "server.pem")
        shutil.copyfile(etcdtls.ca_file(pki), server_dir / "ca.pem")
        write_private(server_dir / "server.key", key.read_text())
        if shutil.which("etcd"):                 # Debian's etcd.service runs as the etcd user
            sh("chown", "-R", "etcd:", str(server_dir))


def scrape_targets(fab, vms: list[VmNode], vm: VmNode, coordinator: bool = True, rule_files=(),
                   scrape_s: int = 0) -> str:
    """Prometheus on the monitor scrapes every agent and the coordinator beside it, and
    evaluates the alerting rules (rlbmonitor/alerts.py): what `rlbfabric prometheus` renders,
    every scrape_s seconds (0: its default)."""
    every = {"interval": f"{scrape_s}s"} if scrape_s else {}
    return fabric_scrape_config(fab, {v.name: v.mgmt_ip for v in vms if v.role != "monitor"},
                                vm.mgmt_ip if coordinator else None, rule_files=rule_files, **every)


GRAFANA_DASHBOARDS = Path("/var/lib/grafana/dashboards/rlb")


def grafana_provisioning(dashboards: Path = GRAFANA_DASHBOARDS) -> dict[str, str]:
    """Grafana's provisioning files (relative to /etc/grafana/provisioning): the local Prometheus
    as the default data source (the dashboards pick it through their datasource variable) and a
    file provider for the dashboards' directory."""
    return {
        "datasources/rlb.yaml": "apiVersion: 1\ndatasources:\n  - name: Prometheus\n    type: prometheus\n"
                                "    uid: rlb-prometheus\n    url: http://localhost:9090\n    access: proxy\n"
                                "    isDefault: true\n",
        "dashboards/rlb.yaml": "apiVersion: 1\nproviders:\n  - name: rlb\n    type: file\n    options:\n"
                               f"      path: {dashboards}\n",
    }


def grafana(vm: VmNode):
    """Provision Grafana with the Prometheus data source and the dashboards, if Grafana is
    installed (it is not a Debian package: the README says how to add Grafana's apt repository)."""
    if not shutil.which("grafana-server") and not Path("/usr/sbin/grafana-server").exists():
        log.warning("Grafana is not installed on %s: Prometheus only (http://%s:9090); "
                    "see vagrant/README.md to add it", vm.name, vm.mgmt_ip)
        return
    for rel, text in grafana_provisioning().items():
        path = Path("/etc/grafana/provisioning") / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    GRAFANA_DASHBOARDS.mkdir(parents=True, exist_ok=True)
    for f in (Path(__file__).resolve().parents[2] / "grafana").glob("*.json"):
        shutil.copy(f, GRAFANA_DASHBOARDS / f.name)
    sh("systemctl", "enable", "grafana-server.service")
    sh("systemctl", "restart", "grafana-server.service")
    log.info("Grafana on http://%s:3000 with the RLB dashboards", vm.mgmt_ip)


app = typer.Typer(help=__doc__.split("\n\n")[0], no_args_is_help=True, add_completion=False,
                  pretty_exceptions_enable=False)
FABRIC_HELP = "The fabric description (TOML), as synced into the VM."
NODE_HELP = "This VM's name in the lab plan."


def _reported(command):
    """A command line of the setup that fails is the operator's to see: which, and what it
    printed (common.run would report a CalledProcessError as a bug, without its output)."""
    @functools.wraps(command)
    def checked(*args, **kwargs):
        try:
            return command(*args, **kwargs)
        except subprocess.CalledProcessError as e:
            raise RuntimeError(f"{' '.join(e.cmd)}: {(e.stderr or e.stdout or '').strip()}") from None
    return checked


@app.command("setup")
@_reported
def setup_cmd(
    fabric: Path = typer.Option(..., help=FABRIC_HELP),
    node_name: str = typer.Option(..., "--node", help=NODE_HELP),
    xdp: deploy.XdpMode = typer.Option(deploy.XdpMode.native, help="XDP mode on switch ports: native, or "
                                       "generic for NICs without it."),
    bfd_ms: int = typer.Option(0, min=0, help="BFD interval instead of the fabric file's (0: the file's)."),
    probe_ms: float = typer.Option(0, min=0, help="A scale-up GPU's probe interval (0: rlbhost's default)."),
    probe_dead_ms: float = typer.Option(0, min=0, help="A scale-up GPU's probe dead time (0: rlbhost's "
                                        "default)."),
    hang_s: float = typer.Option(0, min=0, help="How long an agent's loop may take a round before it counts "
                                 "as hung (0: the agents' default, 60 s; emulated VMs need more)."),
    expiry_ms: float = typer.Option(0, min=0, help="Hosts' idle-QP expiry, and so their sweep's cadence "
                                    "(0: rlbhost's 200 ms; emulated VMs send slower than that)."),
    etcd_lease_s: int = typer.Option(0, min=0, max=60, help="Hosts' etcd lease (0: rlbhost's 3 s; an "
                                     "emulated monitor answers keepalives seconds late)."),
    verbs_max_timeout_ms: int = typer.Option(0, min=0, max=60000, help="The longest hosts' agents work on a "
                                             "verbs question (0: rlbhost's 2 s; emulated VMs answer seconds "
                                             "late)."),
    heartbeat_ms: int = typer.Option(0, min=0, max=10000, help="Switches' heartbeats to their neighbours' "
                                     "data planes (0: rlbswitch's 100 ms; a neighbour missing 5 is taken "
                                     "out of forwarding, and an emulated VM stalls longer than that)."),
    bgp_hold_s: int = typer.Option(0, min=0, max=65535, help="BGP hold time instead of the fabric file's "
                                   "(0: the file's, 3 s by default; an emulated VM stalls longer)."),
    scrape_s: int = typer.Option(0, min=0, max=15, help="The monitor's Prometheus scrapes every agent this "
                                 "often (0: every 2 s; an emulated agent's page takes seconds to build). "
                                 "At most 15: the dashboards' rates look 30 s back."),
):
    """Once, by the provisioner: name the fabric NICs, write and start the node's units.

    Example: /opt/rlb/venv/bin/python -m rlblab.vm.node setup --fabric /opt/rlb/src/lab/fabric-2x2.toml --node l1"""
    setup(fabric, node_name, xdp=xdp.value, bfd_ms=bfd_ms, probe_ms=probe_ms, probe_dead_ms=probe_dead_ms,
          hang_s=hang_s, expiry_ms=expiry_ms, etcd_lease_s=etcd_lease_s, verbs_max_timeout_ms=verbs_max_timeout_ms,
          heartbeat_ms=heartbeat_ms, bgp_hold_s=bgp_hold_s, scrape_s=scrape_s)


@app.command("net")
@_reported
def net_cmd(fabric: Path = typer.Option(..., help=FABRIC_HELP),
            node_name: str = typer.Option(..., "--node", help=NODE_HELP)):
    """Every boot: links up, sysctls, a leaf's gateway addresses (the deployment's rlb-net).

    Example: /opt/rlb/venv/bin/python -m rlblab.vm.node net --fabric /opt/rlb/src/lab/fabric-2x2.toml --node l1"""
    net(fabric, node_name)


def main():
    logging.basicConfig(level=logging.INFO, format="vmnode: %(message)s")
    common.run(app, "vmnode", (FabricError, RuntimeError, OSError))


if __name__ == "__main__":
    main()
