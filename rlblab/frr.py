"""FRR in a network namespace, as a spine of another make: zebra, bgpd and (with BFD) bfdd,
started with their files in a directory of their own and stopped for sure.

FRR's daemons drop to the `frr` user and their vty sockets to the `frrvty` group (Debian's
package makes both), so their files cannot live in the lab's directory (root's alone): each node
gets /run/rlblab-frr/<lab>/<node>, owned by frr, mode 700, under a root-owned directory that only
lets them through."""
from __future__ import annotations

import json
import os
import pwd
import shutil
import signal
import subprocess
import time
from pathlib import Path

FRR_LIB = Path("/usr/lib/frr")
BASE = Path(os.environ.get("RLB_FRR_DIR", "/run/rlblab-frr"))


def available() -> bool:
    """Debian's frr package is installed (the lab can run an FRR spine)."""
    try:
        pwd.getpwnam("frr")
    except KeyError:
        return False
    return all((FRR_LIB / d).exists() for d in ("zebra", "bgpd", "bfdd")) and shutil.which("vtysh") is not None


DAEMONS = ("zebra", "bgpd", "bfdd")


def stop_all(lab: str):
    """Every FRR daemon of a lab, also one an earlier process started (they run detached, and
    outlive their namespace's deletion), and their directories."""
    for d in sorted((BASE / lab).glob("*")) if (BASE / lab).is_dir() else []:
        Frr.at(d).stop()
    shutil.rmtree(BASE / lab, ignore_errors=True)


class Frr:
    def __init__(self, ns: str, lab: str, name: str, bfd: bool = True):
        """Its directory is made afresh by write()."""
        self.ns, self.name, self.bfd = ns, name, bfd
        self.dir = BASE / lab / name
        self.conf = self.dir / "frr.conf"
        self.daemons = ["zebra", "bgpd", *(["bfdd"] if bfd else [])]

    @classmethod
    def at(cls, directory: Path) -> "Frr":
        f = cls("", directory.parent.name, directory.name)
        f.daemons = list(DAEMONS)
        return f

    def write(self, config: str):
        if not available():
            raise RuntimeError("FRR is not installed (apt-get install frr): a spine with daemon = \"frr\" needs it")
        user = pwd.getpwnam("frr")
        lab = self.dir.parent.name
        for d in (BASE, BASE / lab):
            d.mkdir(mode=0o711, exist_ok=True)
            st = d.lstat()
            if st.st_uid != 0 or st.st_mode & 0o022 or not d.is_dir() or d.is_symlink():
                raise RuntimeError(f"{d}: not root's own, or writable by others: remove it and retry")
        self.stop()
        self.dir.mkdir(mode=0o700)
        self.conf.write_text(config)          # it holds the BGP password: frr's alone
        self.conf.chmod(0o600)
        for p in (self.dir, self.conf):
            os.chown(p, user.pw_uid, user.pw_gid)

    @property
    def log(self) -> Path:
        return self.dir / "frr.log"

    def _pid(self, daemon: str) -> int | None:
        """The daemon's pid from its pid file (frr writes it: checked to be that daemon before
        root signals it)."""
        try:
            pid = int((self.dir / f"{daemon}.pid").read_text())
            comm = Path(f"/proc/{pid}/comm").read_text().strip()
        except (FileNotFoundError, ValueError, ProcessLookupError):
            return None
        return pid if comm == daemon else None

    def start(self, timeout: float = 15.0):
        for daemon in self.daemons:
            args = [str(FRR_LIB / daemon), "-d", "-f", str(self.conf), "-i", str(self.dir / f"{daemon}.pid"),
                    "--vty_socket", str(self.dir), "-A", "127.0.0.1", "-P", "0", "-z", str(self.dir / "zserv.api")]
            if daemon == "bfdd":
                args += ["--bfdctl", str(self.dir / "bfdd.sock")]
            r = subprocess.run(["ip", "netns", "exec", self.ns, *args], capture_output=True, text=True)
            if r.returncode != 0:
                raise RuntimeError(f"{daemon} in {self.ns} did not start: {r.stderr.strip()[-800:]}")
            deadline = time.time() + timeout
            while not (self.dir / f"{daemon}.vty").exists():
                if time.time() > deadline:
                    raise RuntimeError(f"{daemon} in {self.ns} did not come up: {self._log_tail()}")
                time.sleep(0.05)

    def _log_tail(self) -> str:
        try:
            return self.log.read_text()[-1000:]
        except OSError:
            return "(no log)"

    def vtysh(self, *commands: str) -> str:
        args = ["vtysh", "--vty_socket", str(self.dir)]
        for c in commands:
            args += ["-c", c]
        r = subprocess.run(["ip", "netns", "exec", self.ns, *args], capture_output=True, text=True, timeout=10)
        if r.returncode != 0:
            raise RuntimeError(f"vtysh {' / '.join(commands)} in {self.ns}: {(r.stderr or r.stdout).strip()[-400:]}")
        return r.stdout

    def json(self, command: str):
        return json.loads(self.vtysh(command) or "{}")

    def established(self) -> dict[str, bool]:
        """{interface: its BGP session is up}."""
        peers = self.json("show bgp ipv6 unicast summary json").get("peers", {})
        return {name: p.get("state") == "Established" for name, p in peers.items()}

    def kill(self):
        """SIGKILL every daemon, as a crash would (the kernel's routes stay behind)."""
        self._signal(signal.SIGKILL)

    def stop(self):
        self._signal(signal.SIGTERM)
        deadline = time.time() + 5
        while any(self._alive(d) for d in self.daemons) and time.time() < deadline:
            time.sleep(0.05)
        self._signal(signal.SIGKILL)
        shutil.rmtree(self.dir, ignore_errors=True)

    def _alive(self, daemon: str) -> bool:
        pid = self._pid(daemon)
        if pid is None:
            return False
        try:
            os.kill(pid, 0)
            return True
        except ProcessLookupError:
            return False

    def _signal(self, sig: int):
        for daemon in self.daemons:
            pid = self._pid(daemon)
            if pid is not None:
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
