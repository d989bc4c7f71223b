"""Units rendered from operator input hold: a newline cannot inject a unit line, spaces, quotes,
% and $ reach the agent as written (systemd's quoting, rlbdeploy/units.py unit_arg)."""
from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from rlbdeploy import units as deploy
from rlbfabric.fabric import FabricError, load

ROOT = Path(__file__).resolve().parent.parent
FAB = load(ROOT / "lab" / "fabric.toml")


def exec_start(unit: str) -> list[str]:
    line = next(ln for ln in unit.splitlines() if ln.startswith("ExecStart="))
    # systemd's reading of it: C-style quotes, then %% -> % and $$ -> $
    return [w.replace("%%", "%").replace("$$", "$") for w in shlex.split(line[len("ExecStart="):])]


def test_hold_a_newline_in_the_coordinator_url_cannot_add_a_unit_line():
    with pytest.raises(FabricError, match="control character"):
        deploy.units(FAB, Path("/etc/rlb/fabric.toml"), "h1", "fd00:99::11",
                     "http://[fd00:99::1]:9473\nExecStartPre=/bin/touch /tmp/owned")


def test_hold_odd_characters_reach_the_agent_as_written():
    fabric_file = Path('/etc/rlb/my "odd" fabric 100%.toml')
    units = deploy.units(FAB, fabric_file, "h1", "fd00:99::11", "http://[fd00:99::1]:9473/$x")
    argv = exec_start(units["rlb-host"])
    assert argv[argv.index("--fabric") + 1] == str(fabric_file)
    assert argv[argv.index("--coordinator") + 1] == "http://[fd00:99::1]:9473/$x"
    assert all("\n" not in ln for ln in units["rlb-host"].splitlines())
    plain = deploy.units(FAB, Path("/etc/rlb/fabric.toml"), "h1", "fd00:99::11", "http://[fd00:99::1]:9473")
    assert "--fabric /etc/rlb/fabric.toml --node h1" in plain["rlb-host"]      # plain values stay unquoted
