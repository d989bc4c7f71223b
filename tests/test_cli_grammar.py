"""One command-line grammar for every program: the same verbs mean the same thing in both agents,
every show command has --json, every command's --help carries an example, completion works; and
what attach, run and detach do to a real namespace's programs and pinned state."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import typer.main

from rlbcommon.paths import PIN_ROOT

from .conftest import scratch_netns

PROGRAMS = {"rlbswitch": "rlbswitch.cli", "rlbhost": "rlbhost.cli", "rlbcoord": "rlbcoord.cli",
            "rlblab": "rlblab.cli", "rlbfabric": "rlbdeploy.cli"}
# what shows state (not what changes it): each must offer --json
SHOW = {"rlbswitch": ["status", "config", "route show"],
        "rlbhost": ["status", "qps", "paths", "config", "why", "weights show", "verbs status"],
        "rlbcoord": ["status"], "rlblab": ["status", "coordinator", "scenario"]}
BIN = Path(sys.executable).parent


def commands(module: str) -> dict[str, object]:
    """'name' or 'group name' -> click command, for every command of a program."""
    group = typer.main.get_command(__import__(module, fromlist=["app"]).app)
    out = {}
    for name, cmd in group.commands.items():
        if hasattr(cmd, "commands"):
            out.update({f"{name} {sub}": c for sub, c in cmd.commands.items()})
        else:
            out[name] = cmd
    return out


@pytest.mark.parametrize("prog", PROGRAMS)
def test_every_command_explains_itself_with_an_example(prog):
    cmds = commands(PROGRAMS[prog])
    assert len(cmds) >= 2
    missing = [n for n, c in cmds.items() if "Example" not in (c.help or "")]
    assert not missing, f"{prog}: no example in --help of {missing}"


def test_both_agents_share_the_verbs_and_show_json():
    switch, host = commands("rlbswitch.cli"), commands("rlbhost.cli")
    for verb in ("attach", "run", "detach", "status", "config", "bird-config"):
        assert verb in switch and verb in host, verb
    assert "stats" not in switch and "routes" not in switch      # one name per thing
    for prog, names in SHOW.items():
        cmds = commands(PROGRAMS[prog])
        for name in names:
            assert "--json" in {o for p in cmds[name].params for o in p.opts}, f"{prog} {name}"
    for cmds in (switch, host):   # detach: named interfaces keep state, --all removes it
        assert "--all" in {o for p in cmds["detach"].params for o in p.opts}
        assert "--once" in {o for p in cmds["attach"].params for o in p.opts}
        assert [p.name for p in cmds["attach"].params] == [p.name for p in cmds["run"].params]


def test_shell_completion_completes_commands_and_options():
    env = {**os.environ, "_RLBHOST_COMPLETE": "complete_bash", "COMP_WORDS": "rlbhost at", "COMP_CWORD": "1"}
    out = subprocess.run([BIN / "rlbhost"], env=env, capture_output=True, text=True).stdout
    assert "attach" in out.split() and "status" not in out.split()
    env = {**os.environ, "_RLBSWITCH_COMPLETE": "complete_bash", "COMP_WORDS": "rlbswitch route s",
           "COMP_CWORD": "2"}
    assert subprocess.run([BIN / "rlbswitch"], env=env, capture_output=True, text=True).stdout.split() == ["show"]
    # the shell named, not guessed from the parent processes (under make or CI that is sh, which
    # typer refuses: "Shell  not supported")
    env = {**os.environ, "_TYPER_COMPLETE_TEST_DISABLE_SHELL_DETECTION": "1"}
    script = subprocess.run([BIN / "rlbswitch", "--show-completion", "bash"], env=env, capture_output=True, text=True)
    assert script.returncode == 0 and "_RLBSWITCH_COMPLETE" in script.stdout


def cli(prog: str, ns: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([BIN / prog, "--netns", ns, *args], capture_output=True, text=True, timeout=120)


def test_attach_needs_interfaces_run_may_adopt():
    res = subprocess.run([BIN / "rlbhost", "attach"], capture_output=True, text=True)
    assert res.returncode == 2 and "name the interfaces to attach" in res.stderr
    res = subprocess.run([BIN / "rlbswitch", "attach", "--once"], capture_output=True, text=True)
    assert res.returncode == 2 and "name the interfaces to attach" in res.stderr


@pytest.mark.netns
def test_host_attach_detach_run_on_a_namespace():
    with scratch_netns("rlbg") as ns:
        subprocess.run(["ip", "link", "add", "ha", "type", "veth", "peer", "name", "hb"], check=True)
        for cmd in (["ip", "link", "set", "ha", "up"], ["ip", "link", "set", "hb", "up"],
                    ["ip", "addr", "add", "fc00:1:1:1::5/64", "dev", "ha", "nodad"],
                    ["ip", "addr", "add", "fc00:1:1:2::5/64", "dev", "ha", "nodad"]):
            subprocess.run(cmd, check=True)
        pins = PIN_ROOT / ns
        try:
            res = cli("rlbhost", ns, "attach", "--once", "ha")
            assert res.returncode == 0, res.stderr
            assert "attached to ha: 2 paths" in res.stdout
            assert tc_programs("ha") == {"egress", "ingress"}
            res = cli("rlbhost", ns, "run", "--once")             # adopts the attached interface
            assert res.returncode == 0 and "attached to ha: 2 paths" in res.stdout, res.stderr
            res = cli("rlbhost", ns, "detach", "ha")
            assert res.returncode == 0 and "pinned state kept" in res.stdout
            assert tc_programs("ha") == set() and (pins / "host").is_dir()
            status = json.loads(cli("rlbhost", ns, "status", "--json").stdout)
            assert [p["address"] for p in status["paths"] if p["valid"]] == ["fc00:1:1:1::5", "fc00:1:1:2::5"]
            res = cli("rlbhost", ns, "run", "--once")              # nothing to adopt now
            assert res.returncode == 2 and "no interface has the programs: name the interface" in res.stderr
            assert cli("rlbhost", ns, "attach", "--once", "ha").returncode == 0
            assert cli("rlbhost", ns, "config", "--json", "--expiry-ms", "300").returncode == 0
            cfg = cli("rlbhost", ns, "config").stdout
            assert any(l.split() == ["expiry_ms", "300.0"] for l in cfg.splitlines()), cfg
            res = cli("rlbhost", ns, "detach", "--all")
            assert res.returncode == 0 and "detached from ha; pinned state removed" in res.stdout
            assert tc_programs("ha") == set() and not pins.exists()
        finally:
            cli("rlbhost", ns, "detach", "--all")


@pytest.mark.netns
def test_switch_attach_once_detach_keeps_routes_status_shows_them():
    with scratch_netns("rlbg") as ns:
        from rlblab import topo
        topo.veth_ports(2)
        pins = PIN_ROOT / ns
        try:
            res = cli("rlbswitch", ns, "attach", "--once", "p0", "p1")
            assert res.returncode == 0 and "no agent runs" in res.stdout, res.stderr
            assert cli("rlbswitch", ns, "route", "add", "fc00:2::/32", "-m", "dlb",
                       "--via", "p0@02:00:00:00:00:01", "--via", "p1@02:00:00:00:00:02").returncode == 0
            res = cli("rlbswitch", ns, "detach", "p1")
            assert res.returncode == 0 and "routes stay pinned" in res.stdout
            s = json.loads(cli("rlbswitch", ns, "status", "--json").stdout)
            assert [p["interface"] for p in s["ports"]] == ["p0"] and s["tables"]["routes"] == 1
            routes = json.loads(cli("rlbswitch", ns, "route", "show", "--json").stdout)
            assert [(r["prefix"], r["mode"], r["why"]) for r in routes] == [("fc00:2::/32", "dlb", "set by an operator")]
            assert "why: set by an operator" in cli("rlbswitch", ns, "route", "show").stdout
            res = cli("rlbswitch", ns, "attach", "--once", "--fabric", "x.toml", "p1")
            assert res.returncode == 2 and "--once only attaches" in res.stderr
            s = json.loads(cli("rlbswitch", ns, "status", "--json").stdout)     # refused before attaching
            assert [p["interface"] for p in s["ports"]] == ["p0"]
            assert cli("rlbswitch", ns, "detach", "--all").returncode == 0 and not pins.exists()
        finally:
            cli("rlbswitch", ns, "detach", "--all")


def tc_programs(ifname: str) -> set[str]:
    """The TC hooks of an interface that carry rlbhost's programs, as `tc` reports them."""
    return {hook for hook in ("ingress", "egress")
            if "rlb_host_" in subprocess.run(["tc", "filter", "show", "dev", ifname, hook], capture_output=True,
                                             text=True).stdout}
