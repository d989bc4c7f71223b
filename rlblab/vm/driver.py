"""Drive the Vagrant lab (vagrant/) from Python: up, run commands on VMs, pull a link's cable,
destroy. Used by the opt-in VM test; people use `vagrant` directly (vagrant/README.md).

Where PID 1 is not systemd, libvirt runs in its own network namespace (vagrant/libvirt.sh) and
vagrant, ssh and virsh must run there too: pass netns."""
from __future__ import annotations

import contextlib
import json
import math
import os
import shlex
import subprocess
import time
from pathlib import Path

from rlbfabric.fabric import load

from .plan import LOAD_SCRIPT, MONITOR, VmNode, node, plan

VAGRANT_DIR = Path(__file__).resolve().parents[2] / "vagrant"
LOCAL_BOX = "rlb/bookworm-lab"
# Emulated VMs (one vCPU each) per host core that the labs have run at: 7 on 2 cores passed
# (about 0.28 of a core each); 13 on 2 booted but starved (0.15 each: ssh took minutes, BFD
# flapped, agents took 10 min to attach)
EMULATED_VMS_PER_CORE = 3.5


def serial_tail(vm: VmNode, lines: int = 200) -> str:
    """The end of what the VM wrote to its serial port (kept on this machine): its load lines
    and the kernel's messages, there even when ssh no longer answers."""
    try:
        text = Path(vm.serial_log).read_text(errors="replace")
    except OSError as e:
        return f"\n== no serial log: {e}\n"
    return f"\n== {vm.serial_log} (last {lines} lines)\n" + "\n".join(text.splitlines()[-lines:]) + "\n"


class VagrantLab:
    def __init__(self, fabric: str = "lab/fabric-2x2.toml", netns: str | None = None, env: dict | None = None,
                 log: Path | None = None):
        self.fabric = fabric
        self.vms: list[VmNode] = plan(load(VAGRANT_DIR.parent / fabric))
        self.prefix = ["ip", "netns", "exec", netns] if netns else []
        self.env = {**os.environ, "RLB_FABRIC": fabric, **(env or {})}
        self.log = log or VAGRANT_DIR / ".vagrant-lab.log"
        self._ssh_config: Path | None = None

    # ---- vagrant ---------------------------------------------------------------------
    def vagrant(self, *args: str, timeout: float = 3600) -> str:
        with open(self.log, "a") as f:
            f.write(f"\n$ vagrant {' '.join(args)}\n")
            f.flush()
            res = subprocess.run([*self.prefix, "vagrant", *args], cwd=VAGRANT_DIR, env=self.env, stdout=f,
                                 stderr=subprocess.STDOUT, timeout=timeout)
        if res.returncode:
            raise RuntimeError(f"vagrant {' '.join(args)} failed (exit {res.returncode}); see {self.log}")
        return ""

    def up(self, start_timeout: float = 900, timeout: float = 5400, tries: int = 2):
        """`vagrant up`, watched: if no VM of the lab is running after start_timeout (the first up
        of a box also uploads its 1.6 GB base volume, a few minutes), vagrant has stalled and
        waiting longer would not help: stop it and say where to look. A `vagrant up` that fails
        with some VMs running and others not is run again for those (up to `tries` in all):
        vagrant-libvirt gives a VM 10 minutes to take a DHCP lease, and one emulated VM booting
        among seven on two cores missed that once, when the others were up and provisioned."""
        self.refuse_foreign_domains()
        t0 = time.time()
        for attempt in range(1, tries + 1):
            rc = self._up_once(start_timeout, timeout - (time.time() - t0))
            if not rc:
                break
            running = self.domains(running=True)
            missing = [v.name for v in self.vms if f"vagrant_{v.name}" not in running]
            if not running or not missing or attempt == tries:
                raise RuntimeError(f"vagrant up failed (exit {rc})"
                                   + (f" with {', '.join(missing)} not running" if running and missing else "")
                                   + f"; see {self.log}")
            note = (f"vagrant up failed (exit {rc}) with {', '.join(missing)} not running and "
                    f"{len(running)} VMs up: vagrant up again for those (try {attempt + 1} of {tries})")
            print(note, flush=True)
            with open(self.log, "a") as f:
                f.write(f"\n# {note}\n")
        self.adopt()

    def _up_once(self, start_timeout: float, timeout: float) -> int:
        """One `vagrant up` to its end: its exit code, or TimeoutError (stalled, or too long)."""
        with open(self.log, "a") as f:
            f.write("\n$ vagrant up\n")
            f.flush()
            proc = subprocess.Popen([*self.prefix, "vagrant", "up"], cwd=VAGRANT_DIR, env=self.env, stdout=f,
                                    stderr=subprocess.STDOUT)
        t0, started = time.time(), False
        try:
            while proc.poll() is None:
                waited = time.time() - t0
                started = started or bool(self.domains(running=True))
                if (not started and waited > start_timeout) or waited > timeout:
                    if started:
                        raise TimeoutError(f"vagrant up: not done after {timeout:.0f} s; see {self.log}")
                    raise TimeoutError(
                        f"vagrant up: none of the {len(self.vms)} VMs started within {start_timeout:.0f} s "
                        f"(defined: {', '.join(self.domains()) or 'none'}). Where udev does not run, libvirt "
                        "re-probes QEMU on every call while its user cannot open /dev/kvm (vagrant/libvirt.sh "
                        f"start gives it udev's group and mode). See {self.log} and `virsh list --all`.")
                time.sleep(5)
        except BaseException:       # a timeout, Ctrl-C: no `vagrant up` left holding the machines' locks
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            raise
        return proc.returncode

    def running(self) -> bool:
        """Every VM of the lab is running (a lab kept up by an earlier run)."""
        return len(self.domains(running=True)) == len(self.vms)

    def adopt(self):
        """The running VMs' ssh settings, for the commands run on them."""
        cfg = VAGRANT_DIR / ".vagrant" / "ssh-config"
        out = subprocess.run([*self.prefix, "vagrant", "ssh-config"], cwd=VAGRANT_DIR, env=self.env,
                             capture_output=True, text=True, check=True).stdout
        cfg.write_text(out)
        self._ssh_config = cfg

    def refuse_foreign_domains(self):
        """vagrant names a domain <directory>_<VM>, so every checkout's lab wants vagrant_g1 ...:
        domains this checkout's vagrant does not know (another checkout's lab, or one whose
        .vagrant/ was lost) make `vagrant up` fail on each VM after minutes. Say so at once; they
        are not ours to remove."""
        ours = VAGRANT_DIR / ".vagrant" / "machines"
        foreign = [d for d in self.domains() if not (ours / d[len("vagrant_"):] / "libvirt" / "id").exists()]
        if foreign:
            virsh = " ".join([*self.prefix, "virsh", "-c", "qemu:///system"])
            raise RuntimeError(
                f"libvirt already has {', '.join(foreign)}, not made by this checkout's vagrant ({VAGRANT_DIR}): "
                "another checkout's lab, or one whose .vagrant/ is gone. Run `vagrant destroy -f` in that "
                f"checkout's vagrant/, or remove each with `{virsh} destroy NAME; {virsh} undefine NAME "
                "--remove-all-storage`")

    def destroy(self):
        subprocess.run([*self.prefix, "vagrant", "destroy", "-f"], cwd=VAGRANT_DIR, env=self.env,
                       capture_output=True, timeout=600)

    # ---- on the VMs ------------------------------------------------------------------
    def sh(self, name: str, cmd: str, check: bool = True, timeout: float = 300) -> subprocess.CompletedProcess:
        """Run a shell command as root on a VM."""
        res = subprocess.run([*self.prefix, "ssh", "-F", str(self._ssh_config), "-o", "LogLevel=ERROR", name,
                              "sudo sh -c " + shlex.quote(cmd)], capture_output=True, text=True, timeout=timeout)
        if check and res.returncode:
            raise RuntimeError(f"{name}: {cmd}: exit {res.returncode}: {res.stderr.strip()[-2000:]}")
        return res

    def spawn(self, name: str, cmd: str, out: Path) -> subprocess.Popen:
        return subprocess.Popen([*self.prefix, "ssh", "-F", str(self._ssh_config), "-o", "LogLevel=ERROR", name,
                                 "sudo sh -c " + shlex.quote(cmd)], stdout=open(out, "w"), stderr=subprocess.STDOUT)

    def json(self, name: str, cmd: str):
        return json.loads(self.sh(name, cmd).stdout)

    def tx_bytes(self, name: str, ifname: str) -> int:
        return self.json(name, f"ip -j -s link show {ifname}")[0]["stats64"]["tx"]["bytes"]

    def vm(self, name: str) -> VmNode:
        return node(self.vms, name)

    def save_journals(self, into: Path, lines: int = 600) -> Path:
        """Each VM's rlb units as they ended (status and the journal's last `lines`) and the
        agents' status files (/run/rlb/*.json: the verbs service's counters and keep reasons,
        which the journal does not hold), into `into`/VM.log: what a failed session leaves to
        read once its VMs are destroyed (a switch agent that never attached left nothing to read
        but the test's timeout)."""
        into.mkdir(parents=True, exist_ok=True)
        for v in self.vms:
            try:
                # its load as rlb-lab-load writes it every 30 s (one source), then every busy process
                res = self.sh(v.name, f"sh {LOAD_SCRIPT} once; "
                                      "ps -eo pid,ni,time,rss,args --sort=-time | head -15 | cut -c1-160; "
                                      "systemctl --no-pager --all status 'rlb*'; "
                                      f"journalctl --no-pager -o short-monotonic -n {lines} -u 'rlb*'; "
                                      "for f in /run/rlb/*.json; do [ -f \"$f\" ] && echo \"== $f\" && cat \"$f\"; done",
                              check=False, timeout=120)
                text = res.stdout + res.stderr
            except (OSError, subprocess.SubprocessError) as e:   # a VM that does not answer: say so
                text = f"could not read {v.name}: {e}\n"
            (into / f"{v.name}.log").write_text(text + serial_tail(v))
        return into

    def wait(self, what: str, pred, timeout: float = 600, every: float = 3):
        deadline = time.time() + timeout
        last = None
        while time.time() < deadline:
            try:
                if pred():
                    return
            except (RuntimeError, ValueError, KeyError, IndexError, subprocess.TimeoutExpired) as e:
                last = e        # not yet (a VM too busy to answer an ssh in time included): the deadline decides
            time.sleep(every)
        raise TimeoutError(f"{what} not after {timeout:.0f} s (last error: {last})")

    # ---- a link's cable ---------------------------------------------------------------
    def domains(self, running: bool = False) -> list[str]:
        """This lab's libvirt domains (vagrant names them <directory>_<VM>), all or running."""
        res = subprocess.run(["virsh", "-c", "qemu:///system", "list", "--name", *([] if running else ["--all"])],
                             capture_output=True, text=True, env=self.env)
        names = {f"_{v.name}" for v in self.vms}
        return [d for d in res.stdout.split() if d.startswith("vagrant_") and d[len("vagrant"):] in names]

    def domain(self, name: str) -> str:
        doms = self.domains(running=True)
        match = [d for d in doms if d.endswith(f"_{name}")]
        if len(match) != 1:
            raise RuntimeError(f"no single libvirt domain for {name}: {doms}")
        return match[0]

    def set_link(self, a: str, b: str, up: bool):
        """The (first) a-b link's cable pulled or put back: see set_port."""
        self.set_port(a, next(l.ifname for l in self.vm(a).links if l.peer == b), up)

    def set_port(self, name: str, ifname: str, up: bool):
        """Both ends of the link on a VM's port lose (or regain) carrier, as when its cable is
        pulled: a UDP tunnel has no carrier of its own, so each VM's NIC is set down from the
        host. The addresses stay (carrier, unlike `ip link set down`, does not remove them)."""
        end = next((l for l in self.vm(name).links if l.ifname == ifname), None)
        if end is None:
            raise RuntimeError(f"{name} has no fabric port {ifname}")
        for vm, mac in ((name, end.mac), (end.peer, next(l.mac for l in self.vm(end.peer).links
                                                         if l.ifname == end.peer_ifname and l.peer == name))):
            subprocess.run(["virsh", "-c", "qemu:///system", "domif-setlink", self.domain(vm), mac,
                            "up" if up else "down"], check=True, capture_output=True, env=self.env)

    # ---- the monitor ------------------------------------------------------------------
    def prometheus(self, exprs: list[str]) -> list[list]:
        """Evaluate PromQL on the monitor's Prometheus (it listens on the monitor; this machine
        has no route to it): one result list per expression."""
        script = ("import json, urllib.parse, urllib.request\n"
                  f"out = []\nfor q in json.loads({json.dumps(json.dumps(exprs))}):\n"
                  "    u = 'http://localhost:9090/api/v1/query?' + urllib.parse.urlencode({'query': q})\n"
                  "    out.append(json.loads(urllib.request.urlopen(u, timeout=10).read())['data']['result'])\n"
                  "print(json.dumps(out))\n")
        return self.json(MONITOR, "python3 -c " + shlex.quote(script))


def check_room(vms: int, driver: str, cores: int):
    """Refuse at once a lab this machine cannot emulate, rather than fail an hour in
    (RLB_VAGRANT_CROWDED=1 tries anyway)."""
    if driver != "qemu" or os.environ.get("RLB_VAGRANT_CROWDED") == "1":
        return
    if vms > EMULATED_VMS_PER_CORE * cores:
        raise RuntimeError(
            f"{vms} emulated VMs on {cores} core(s): the most these labs have worked at is "
            f"{EMULATED_VMS_PER_CORE:g} per core (13 on 2 cores booted in 45 min, then starved: ssh took "
            "minutes, BFD flapped). Use a smaller fabric (lab/scaleup-small.toml: 7 VMs), a machine "
            f"with {math.ceil(vms / EMULATED_VMS_PER_CORE)} cores, RLB_LIBVIRT_DRIVER=kvm where KVM "
            "works, or RLB_VAGRANT_CROWDED=1 to try anyway")


def no_systemd() -> bool:
    return Path("/proc/1/comm").read_text().strip() != "systemd"


@contextlib.contextmanager
def lab_session(fabric: str, log: Path, env: dict | None = None):
    """The lab of a fabric file up from the local box (built if missing), yielded, and
    destroyed (kept with RLB_VAGRANT_KEEP=1): what the opt-in VM tests share. env adds to the Vagrantfile's settings
    (RLB_BFD_MS ...). Where PID 1 is not systemd, libvirt runs in its own namespace for the
    session (vagrant/libvirt.sh)."""
    import shutil
    if not shutil.which("vagrant"):
        raise RuntimeError("vagrant is not installed: make vagrant-deps")
    netns = "rlbvm" if no_systemd() else None
    # /dev/kvm here is PVM, on which stock kernels hang: software emulation unless told otherwise
    env = {"RLB_BOX": LOCAL_BOX, "RLB_LIBVIRT_DRIVER": os.environ.get("RLB_LIBVIRT_DRIVER", "qemu"),
           "RLB_MGMT_MODE": "none", **(env or {})}
    lab = VagrantLab(fabric, netns=netns, env=env, log=log)     # the plan only: nothing started
    check_room(len(lab.vms), env["RLB_LIBVIRT_DRIVER"], os.cpu_count() or 1)
    if netns:
        subprocess.run([VAGRANT_DIR / "libvirt.sh", "start"], check=True)
    boxes = subprocess.run(["vagrant", "box", "list"], capture_output=True, text=True).stdout
    if LOCAL_BOX not in boxes:
        subprocess.run([VAGRANT_DIR / "build-box.sh"], check=True)
    # a lab kept up by an earlier run (RLB_VAGRANT_KEEP=1) is taken as it is with RLB_VAGRANT_REUSE=1:
    # the tests again without the hour of bringing 7 emulated VMs up and converged
    reuse = os.environ.get("RLB_VAGRANT_REUSE") == "1" and lab.running()
    if not reuse:
        lab.destroy()
    try:
        t0 = time.time()
        if reuse:
            lab.adopt()
            print(f"RLB_VAGRANT_REUSE=1: the {len(lab.vms)} VMs running already are the lab")
        else:
            lab.up()
            print(f"vagrant up ({len(lab.vms)} VMs): {time.time() - t0:.0f} s")
        try:
            yield lab
        except BaseException:
            if lab._ssh_config is not None:
                print(f"the VMs' rlb units as they ended: {lab.save_journals(log.parent / 'journals')}")
            raise
    finally:    # no return in here: it would swallow the exception that brought us here
        if os.environ.get("RLB_VAGRANT_KEEP") == "1":    # to look at a failure: the VMs stay up
            inside = f"ip netns exec {netns} " if netns else ""
            print(f"RLB_VAGRANT_KEEP=1: the VMs are left running; look with 'cd vagrant; {inside}vagrant "
                  f"ssh VM', remove with '{inside}vagrant destroy -f'"
                  + (" and 'vagrant/libvirt.sh stop'" if netns else ""))
        else:
            lab.destroy()
            if netns:
                subprocess.run([VAGRANT_DIR / "libvirt.sh", "stop"])
