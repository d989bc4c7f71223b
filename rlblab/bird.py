"""bird2 in a network namespace: started in the foreground under our control, stopped for sure."""
from __future__ import annotations

import subprocess
import time
from pathlib import Path

from rlbcommon.paths import write_private
from rlbdeploy.units import BIRD_CAPS, confined


class Bird:
    def __init__(self, ns: str, config: str, workdir: Path, name: str | None = None):
        """name: file stem for config, socket and log (default: the namespace)."""
        self.ns = ns
        workdir.mkdir(parents=True, exist_ok=True)
        stem = name or ns
        self.conf = workdir / f"{stem}.conf"
        self.sock = workdir / f"{stem}.ctl"
        self.log = workdir / f"{stem}.out"
        write_private(self.conf, config)     # it holds the BGP password
        self.proc: subprocess.Popen | None = None

    def start(self, timeout: float = 10.0):
        check = subprocess.run(["bird", "-p", "-c", str(self.conf)], capture_output=True, text=True)
        if check.returncode:
            raise RuntimeError(f"bird config {self.conf} invalid: {check.stderr.strip()}")
        self.sock.unlink(missing_ok=True)    # a killed bird leaves its socket behind
        with open(self.log, "a") as log:
            # bounded as its unit bounds it (rlbdeploy/units.py)
            self.proc = subprocess.Popen(["ip", "netns", "exec", self.ns, *confined(
                ["bird", "-f", "-c", str(self.conf), "-s", str(self.sock)], BIRD_CAPS)],
                stdout=log, stderr=subprocess.STDOUT)
        deadline = time.time() + timeout
        while not self.sock.exists():
            if self.proc.poll() is not None or time.time() > deadline:
                raise RuntimeError(f"bird in {self.ns} did not start: {self.log.read_text()[-1000:]}")
            time.sleep(0.05)

    def kill(self):
        """SIGKILL, as a crash would: kernel routes and the socket file stay behind."""
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.proc = None

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None
        self.sock.unlink(missing_ok=True)


def radv_config(interfaces: list[str], router_id: str = "10.255.0.1") -> str:
    """Router advertisements on host ports. bird 2.0.12 advertises the prefixes of the
    addresses on each interface, so the gateway address per prefix must be configured there."""
    ifs = "\n".join(f'  interface "{i}" {{ min ra interval 3; max ra interval 4; }};' for i in interfaces)
    return f"""router id {router_id};
protocol device {{ scan time 1; }}
protocol radv {{
{ifs}
}}
"""

