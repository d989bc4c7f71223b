"""What both agents' command lines share: logging, entering a namespace, and how a command ends.

Exit status: 0 done; 2 an operator error (bad input, missing permission or file, a state the
command cannot act on), one line on stderr; 1 an unexpected error (a bug), one line on stderr
naming the file where its traceback was appended (<run dir>/<program>-errors.log)."""
from __future__ import annotations

import json
import logging
import socket
import sys
import time
import traceback
from pathlib import Path
from typing import Optional

import typer

from . import netns
from .bpfprog import BpfSetupError
from .health import HANG_ENV, HANG_S
from .paths import RUN_DIR, write_private

NETNS_HELP = "Work inside this network namespace (entered with setns, so pinned maps stay shared)."
INSTANCE_HELP = "Name of this agent's pinned state (default: the namespace name, else 'default')."


class AgentContext:
    """Where a command works: the namespace it entered and whose pinned state it uses."""

    def __init__(self, dataplane_class):
        self.dataplane_class = dataplane_class
        self.netns: Optional[str] = None
        self.instance: Optional[str] = None

    @property
    def node_label(self) -> str:
        """The `node` label of the metrics: the instance or namespace in a lab, else the
        machine's host name (every VM's instance is 'default')."""
        return self.instance or self.netns or socket.gethostname()

    def dataplane(self):
        return self.dataplane_class(self.instance or self.netns)


def _print_version(value: bool):
    if value:
        # importlib.metadata (and the email package under it) only here: every other
        # command's start is timed by operators reloading tables
        from importlib.metadata import PackageNotFoundError, version
        try:
            typer.echo(f"rlb {version('rlb')}")
        except PackageNotFoundError:
            typer.echo("rlb (not installed: a source tree)")
        raise typer.Exit()


# every program's --version: which release runs here (after an upgrade or a roll-back)
VERSION_OPTION = typer.Option(False, "--version", is_eager=True, callback=_print_version,
                              help="Print the installed version and exit.")


HANG_OPTION = typer.Option(HANG_S, "--hang-s", min=1.0, envvar=HANG_ENV, help="A loop of the agent that has "
    "not finished a round this long is hung: logged with every thread's stack, and the agent starts afresh "
    "in place (the data plane forwards on from its pinned maps). The units' WatchdogSec= catches a process "
    "frozen whole. From the environment (a unit's Environment= line) unless given.")

# every agent's TLS towards the fabric's etcd (rlbfabric etcd-tls issues both files)
ETCD_CA_OPTION = typer.Option(None, "--etcd-ca", help="With https:// --etcd URLs: the CA that signed "
                              "etcd's certificate (PEM; default: the system's CAs).")
COORDINATOR_CA_OPTION = typer.Option(None, "--coordinator-ca", help="With an https:// --coordinator: the CA "
                                     "that signed its certificate (rlbfabric etcd-tls's ca.pem; default: "
                                     "the system's CAs).")
COORDINATOR_CERT_OPTION = typer.Option(None, "--coordinator-cert", help="With an https:// --coordinator: this "
                                       "machine's certificate and key in one PEM file (mode 600; rlbfabric "
                                       "etcd-tls's <user>.pem): a coordinator that checks them takes this "
                                       "machine's reports only.")
ETCD_CERT_OPTION = typer.Option(None, "--etcd-cert", help="With https:// --etcd URLs: this machine's "
                                "client certificate and its key in one PEM file (mode 600), for an etcd "
                                "that asks for one (--client-cert-auth).")


def program_app(doc: str) -> typer.Typer:
    """A program's Typer app with what every program has: help when run bare, no traceback
    pages (run() reports errors), --version. The agents' add their own options (agent_app)."""
    app = typer.Typer(help=doc, no_args_is_help=True, pretty_exceptions_enable=False)

    @app.callback()
    def main_options(version: bool = VERSION_OPTION):
        pass
    return app


def agent_app(doc: str, dataplane_class, log: logging.Logger) -> tuple[typer.Typer, AgentContext]:
    """A Typer app with the options every agent command takes (--netns, --instance, -v)."""
    app = typer.Typer(help=doc, no_args_is_help=True, pretty_exceptions_enable=False)
    ctx = AgentContext(dataplane_class)

    @app.callback()
    def main_options(
        netns_name: Optional[str] = typer.Option(None, "--netns", "-n", metavar="NAME", help=NETNS_HELP),
        instance: Optional[str] = typer.Option(None, help=INSTANCE_HELP),
        verbose: bool = typer.Option(False, "--verbose", "-v", help="Debug logging."),
        version: bool = VERSION_OPTION,
    ):
        ctx.netns, ctx.instance = netns_name, instance
        setup(netns_name, verbose, log)

    return app, ctx


def attach_or_run(command: typer.Context, interfaces) -> None:
    """`attach` and `run` are one command in both agents: the agent in the foreground. `attach`
    names what it attaches (the operator's words); `run` may leave it out and adopt what is
    pinned (the service unit's words, after a restart or an upgrade)."""
    if command.info_name == "attach" and not interfaces:
        raise typer.BadParameter("name the interfaces to attach (or use 'run' to adopt what is pinned)",
                                 param_hint="INTERFACES")


def detach(dp, interfaces, all_: bool, kept: str):
    """detach's one meaning in both agents: the programs off the interfaces named, the pinned
    state kept (`kept` says what, for this agent) so that attaching again adopts it; with --all
    off every interface, and every pinned map removed."""
    if all_:
        gone = dp.destroy()
        typer.echo(f"detached{' from ' + ', '.join(gone) if gone else ''}; pinned state removed")
        return
    if not interfaces:
        raise dp.error("name the interfaces to detach, or use --all")
    for ifname in interfaces:
        dp.detach(ifname)
    typer.echo(f"detached from {', '.join(interfaces)}; {kept}")


def show(data, as_json: bool):
    """A settings object: JSON for machines, 'key value' lines for people."""
    if as_json:
        typer.echo(json.dumps(data, indent=2))
        return
    for k, v in data.items():
        typer.echo(f"{k:<24} {v}")


def emit_config(text: str, out: Path | None, wrote: str, note: str | None = None):
    """A rendered configuration: into `out`, readable by its owner only (it may hold a BGP
    password), saying `wrote`; else to stdout. `note` (what the operator should know) to stderr."""
    if note:
        typer.echo(note, err=True)
    if out:
        write_private(out, text)
        typer.echo(wrote)
    else:
        typer.echo(text, nl=False)


def setup(netns_name: str | None, verbose: bool, log: logging.Logger):
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    if netns.private_mount_ns() and not netns_name:
        log.warning("running in a private mount namespace (ip netns exec?): pinned maps may "
                    "not outlive this process; use --netns NAME instead")
    netns.enter(netns_name)


def run(app: typer.Typer, prog: str, operator_errors: tuple[type[Exception], ...], log_dir: Path | None = None):
    try:
        app()
    except (*operator_errors, BpfSetupError, FileNotFoundError) as e:
        typer.echo(f"{prog}: error: {e}", err=True)
        sys.exit(2)
    except PermissionError as e:
        typer.echo(f"{prog}: error: {e} (run as root)", err=True)
        sys.exit(2)
    except Exception as e:            # a bug: say so briefly, keep the whole story in a file
        where = crash_log(prog, log_dir)
        typer.echo(f"{prog}: internal error: {type(e).__name__}: {e} (traceback in {where}; "
                   "please report it)", err=True)
        sys.exit(1)


def crash_log(prog: str, log_dir: Path | None = None) -> Path:
    """Append the exception being handled, with a time stamp and the command line, to
    <log_dir>/<prog>-errors.log (the run dir by default; /tmp if that cannot be written)."""
    text = (f"--- {time.strftime('%Y-%m-%d %H:%M:%S')} {' '.join(sys.argv)}\n" + traceback.format_exc())
    for d in (log_dir or RUN_DIR, Path("/tmp")):
        path = Path(d) / f"{prog}-errors.log"
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(path, "a") as f:
                f.write(text)
            return path
        except OSError:
            continue
    return Path("(nowhere: no writable directory)")
