"""What an operator installs on a switch or a GPU host is a wheel: it must carry the BPF sources
the agents compile where they run, and find them once installed (not beside a checkout)."""
from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_the_wheel_carries_the_bpf_sources_and_finds_them_installed(tmp_path):
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                    "-w", str(tmp_path / "dist"), str(ROOT)], check=True, capture_output=True)
    wheel = next((tmp_path / "dist").glob("rlb-*.whl"))
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        z.extractall(tmp_path / "site")
    # every package of the checkout (a subpackage left out of pyproject's list is missing installed)
    packages = {str(p.relative_to(ROOT)) for top in ("rlbcommon", "rlbfabric", "rlbcoord", "rlbdeploy", "rlbhost",
                                                      "rlbswitch", "rlbmonitor", "rlblab")
                for p in (ROOT / top).rglob("__init__.py")}
    assert packages and packages <= names, sorted(packages - names)
    sources = {str(p.relative_to(ROOT)) for p in (ROOT / "bpf").rglob("*") if p.suffix in (".c", ".h")}
    assert sources and {f"rlbcommon/{s}" for s in sources} <= names
    verbs = {p.name for p in (ROOT / "verbs").iterdir() if p.suffix in (".c", ".h")}
    assert verbs == {"rlb_verbs.c", "rlb_verbs.h"} and {f"rlbhost/verbs/src/{v}" for v in verbs} <= names
    entry = next(n for n in names if n.endswith("entry_points.txt"))
    scripts = (tmp_path / "site" / entry).read_text()
    for prog in ("rlbswitch", "rlbhost", "rlbcoord", "rlbfabric", "rlblab"):
        assert f"{prog} = " in scripts, prog
    out = subprocess.run([sys.executable, "-c", "from rlbcommon.paths import BPF_DIR; print(BPF_DIR)"],
                         cwd=tmp_path, env={"PYTHONPATH": str(tmp_path / "site")}, capture_output=True,
                         text=True, check=True).stdout.strip()
    assert out == str(tmp_path / "site" / "rlbcommon" / "bpf")
    assert (Path(out) / "rlb_host.c").exists() and (Path(out) / "lib" / "parse.h").exists()
    # and the verbs library builds from what the wheel carries (as `rlbhost verbs install` does)
    out = subprocess.run([sys.executable, "-m", "rlbhost.verbs.build", str(tmp_path / "lib")], cwd=tmp_path,
                         env={"PYTHONPATH": str(tmp_path / "site"), "PATH": "/usr/bin:/bin"},
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "lib" / "librlbverbs.so").exists() and (tmp_path / "lib" / "librlbverbs-ibverbs.so").exists()
