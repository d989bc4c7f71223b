"""The coordinator's loops are watched as every agent's are (rlbcommon/runtime.py, watchdog.py): a
loop made to hang (a failpoint, as a lock never released would) is found within the hang time,
logged with the stacks of every thread, and the process starts afresh in place (the same pid) and
serves again; its loops are exported as the agents' are, and its unit asks systemd to watch it."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from rlbcommon import coordapi
from rlbdeploy.units import coordinator_unit

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as s:
        s.bind(("::1", 0))
        return s.getsockname()[1]


def wait_for(what: str, check, timeout: float, log: Path):
    deadline = time.time() + timeout
    while not check():
        assert time.time() < deadline, f"{what}: {log.read_text()[-3000:]}"
        time.sleep(0.1)


def test_hold_a_hung_coordinator_loop_is_found_and_the_coordinator_starts_afresh_in_place(tmp_path):
    port = free_port()
    url = f"http://[::1]:{port}"
    log = tmp_path / "coord.log"
    env = {**os.environ, "RLB_FAILPOINTS": "expire=hang@2"}
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "rlbcoord.cli", "run", "--fabric", str(ROOT / "lab" / "fabric.toml"),
                                 "--listen", "::1", "--port", str(port), "--hang-s", "2"],
                                stdout=out, stderr=subprocess.STDOUT, env=env)
    try:
        def answers() -> bool:
            try:
                return "hosts" in coordapi.call(url, coordapi.STATUS, timeout=1)
            except coordapi.CoordinatorError:
                return False
        wait_for("the coordinator answers", answers, 30, log)
        metrics = urllib.request.urlopen(f"{url}/metrics", timeout=5).read().decode()
        assert 'rlb_coord_loop_hung{loop="expire",node=' in metrics, metrics[-2000:]
        wait_for("the hang found and the coordinator started afresh",
                 lambda: "started afresh after a hung loop" in log.read_text(), 40, log)
        text = log.read_text()
        assert "loop expire has not finished a round" in text
        # the stacks name where the hung loop waits (the failpoint's wait, as a lock's would be)
        dump = text[text.index("stacks at the hang:"):]
        assert "thread expire (hung):" in dump and "failpoints.py" in dump.split("\nthread ")[1]
        assert proc.poll() is None                              # in place: the same process
        env_now = Path(f"/proc/{proc.pid}/environ").read_bytes().split(b"\0")
        assert b"RLB_HANG_RESTARTS=1" in env_now and not any(e.startswith(b"RLB_FAILPOINTS=") for e in env_now)
        time.sleep(0.5)
        wait_for("the coordinator answers after its fresh start", answers, 30, log)
        metrics = urllib.request.urlopen(f"{url}/metrics", timeout=5).read().decode()
        assert "rlb_coord_hang_restarts_total" in metrics and 'rlb_coord_loop_hung{loop="expire"' in metrics
    finally:
        proc.terminate()
        proc.wait(10)


def test_the_coordinators_unit_asks_systemd_to_watch_it():
    unit = coordinator_unit(Path("/etc/rlb/fabric.toml"), "fd00:99::1")["rlb-coord"]
    assert "Type=notify" in unit and "WatchdogSec=60" in unit and "NotifyAccess=main" in unit
