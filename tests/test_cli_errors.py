"""How the agents' commands end (rlbcommon/cli.run): an operator error is one line and exit 2; a
bug is one line naming the file that got its traceback, and exit 1."""
from __future__ import annotations

import subprocess
import sys

import pytest
import typer

from rlbcommon import cli as common


class OperatorError(RuntimeError):
    pass


def app_raising(exc: Exception) -> typer.Typer:
    app = typer.Typer(pretty_exceptions_enable=False)

    @app.command()
    def go():
        raise exc
    return app


@pytest.fixture(autouse=True)
def argv(monkeypatch):
    monkeypatch.setattr(sys, "argv", ["rlbx"])


def test_an_operator_error_is_one_line_and_exit_2(capsys, tmp_path):
    with pytest.raises(SystemExit) as e:
        common.run(app_raising(OperatorError("no route fc00::/64")), "rlbx", (OperatorError,), tmp_path)
    assert e.value.code == 2
    assert capsys.readouterr().err == "rlbx: error: no route fc00::/64\n"
    assert not (tmp_path / "rlbx-errors.log").exists()


def test_a_bug_says_so_and_keeps_its_traceback(capsys, tmp_path):
    with pytest.raises(SystemExit) as e:
        common.run(app_raising(KeyError("path")), "rlbx", (OperatorError,), tmp_path)
    assert e.value.code == 1
    err = capsys.readouterr().err
    log = tmp_path / "rlbx-errors.log"
    assert err == f"rlbx: internal error: KeyError: 'path' (traceback in {log}; please report it)\n"
    text = log.read_text()
    assert text.startswith("--- ") and "Traceback (most recent call last)" in text and "raise exc" in text


def test_rlbhost_reports_a_bad_prefix_as_an_operator_error():
    res = subprocess.run([sys.executable, "-m", "rlbhost", "--instance", "rlbclitest", "weights", "del",
                          "not-a-prefix"], capture_output=True, text=True)
    assert res.returncode == 2 and res.stderr.startswith("rlbhost: error: "), res.stderr
