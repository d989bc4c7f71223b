"""The `bird-config` command both agents' CLIs carry: bird.conf for one node of the fabric file,
and the include files its agent keeps up to date (empty to start with)."""
from __future__ import annotations

from pathlib import Path
from typing import Callable, Optional

import typer

from rlbcommon.cli import emit_config
from rlbcommon.constants import RUN_DIR

from ..base import Fabric


def add_bird_config(app: typer.Typer, doc: str, node_help: str,
                    check: Callable[[Fabric, str, Path], str]):
    """Register `bird-config` on app. check(fabric, node, file) refuses a node this agent does
    not serve (raising its CLI's error) and returns the node's description for the message."""
    def bird_config(
        fabric_file: Path = typer.Option(..., "--fabric", help="Fabric description (TOML)."),
        node: str = typer.Option(..., help=node_help),
        run_dir: Path = typer.Option(Path(str(RUN_DIR)), help="Where includes, socket and log live."),
        out: Optional[Path] = typer.Option(None, "-o", "--out", help="Write here (default: stdout)."),
        bfd_ms: Optional[int] = typer.Option(None, min=10, max=10000, help="BFD interval instead of the "
            "fabric file's (slower for emulated VMs, whose timers jitter by hundreds of ms)."),
        hold_s: Optional[int] = typer.Option(None, min=3, max=65535, help="BGP hold time instead of the "
            "fabric file's bgp_hold_s (keepalives every third of it; longer for emulated VMs that stall)."),
    ):
        # loaded here: the fabric model and bird's renderer are most of any other command's start
        from .conf import prepare
        from ..fabric import load
        fab = load(fabric_file)
        what = check(fab, node, fabric_file)
        if bfd_ms:
            fab.bfd_ms = bfd_ms
        if hold_s:
            fab.bgp.hold_s = hold_s
        text, incs, note = prepare(fab, node, run_dir)
        wrote = f"wrote {out} ({what})" + (f"; includes {', '.join(str(i) for i in incs)}" if incs else "")
        emit_config(text, out, wrote, note)
    bird_config.__doc__ = doc
    app.command("bird-config")(bird_config)
