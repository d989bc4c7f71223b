"""What both agents' command lines share: logging, entering a namespace, turning operator
errors into one clear line and exit status 2 instead of a traceback."""
from __future__ import annotations

import logging
import sys

import typer

from . import netns
from .bpfprog import BpfSetupError

NETNS_HELP = "Work inside this network namespace (entered with setns, so pinned maps stay shared)."
INSTANCE_HELP = "Name of this agent's pinned state (default: the namespace name, else 'default')."


def setup(netns_name: str | None, verbose: bool, log: logging.Logger):
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    if netns.private_mount_ns() and not netns_name:
        log.warning("running in a private mount namespace (ip netns exec?): pinned maps may "
                    "not outlive this process; use --netns NAME instead")
    netns.enter(netns_name)


def run(app: typer.Typer, prog: str, operator_errors: tuple[type[Exception], ...]):
    try:
        app()
    except (*operator_errors, BpfSetupError, FileNotFoundError) as e:
        typer.echo(f"{prog}: error: {e}", err=True)
        sys.exit(2)
    except PermissionError as e:
        typer.echo(f"{prog}: error: {e} (run as root)", err=True)
        sys.exit(2)
