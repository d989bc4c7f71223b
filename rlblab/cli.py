"""rlblab: single-machine namespace labs and the demo."""
from __future__ import annotations

import sys

import typer

app = typer.Typer(help=__doc__, no_args_is_help=True, add_completion=False,
                  pretty_exceptions_enable=False)


@app.command()
def demo(keep: bool = typer.Option(False, help="Leave the lab running afterwards."),
         links: int = typer.Option(4, min=2, max=8, help="Parallel links behind the switch.")):
    """Run the switch demo: the same QPs under ECMP, weighted, DLB and pinned modes, read from
    kernel interface counters, then a link failure during traffic."""
    from .demo import main as demo_main
    sys.exit(demo_main(keep=keep, links=links))


@app.command()
def down():
    """Remove whatever a lab or the demo left behind (namespaces, agents, pinned maps)."""
    from .switchlab import SwitchLab
    from . import topo
    names = {ns.rsplit("-", 1)[0] for ns in topo.list_ns() if ns.startswith("rlb")}
    for name in names:
        SwitchLab(name).down()
        typer.echo(f"removed lab {name}")


def main():
    app()
