"""Building blocks of namespace labs: namespaces, veth links with XDP-friendly offloads,
kernel interface counters (the ground truth every lab result is read from)."""
from __future__ import annotations

import json
import logging
import shlex
import subprocess
import time

from pyroute2 import IPRoute

from rlbcommon import netns
from rlbcommon.netns import run

log = logging.getLogger(__name__)


def sh(*cmd: str, check: bool = True) -> str:
    res = subprocess.run(cmd, capture_output=True, text=True)
    if check and res.returncode:
        raise RuntimeError(f"{' '.join(cmd)}: {res.stderr.strip()}")
    return res.stdout


def add_ns(name: str):
    if name in list_ns():
        del_ns(name)
    sh("ip", "netns", "add", name)
    run(name, "ip", "link", "set", "lo", "up")


def list_ns() -> list[str]:
    return [line.split()[0] for line in sh("ip", "netns", "list").splitlines() if line.strip()]


def del_ns(name: str):
    # Processes first (agents, bird), then the namespace; veths die with it.
    pids = sh("ip", "netns", "pids", name, check=False).split()
    for pid in pids:
        subprocess.run(["kill", "-9", pid], capture_output=True)
    sh("ip", "netns", "del", name, check=False)


def link(ns_a: str, if_a: str, ns_b: str, if_b: str, mac_a: str | None = None,
         mac_b: str | None = None):
    """A veth between two namespaces, up, with the offloads XDP redirect needs:
    GRO on (a veth peer without XDP only takes redirected frames with GRO on) and tx
    checksum offload off (else redirected frames carry partial checksums and die).
    GRO must be switched on while the device is up: only then does the kernel mark the
    peer as a redirect target (else redirects fail with EOPNOTSUPP)."""
    tmp_a, tmp_b = f"t{abs(hash((ns_a, if_a))) % 10**9}", f"t{abs(hash((ns_b, if_b))) % 10**9}"
    sh("ip", "link", "add", tmp_a, "type", "veth", "peer", "name", tmp_b)
    for tmp, ns, name, mac in ((tmp_a, ns_a, if_a, mac_a), (tmp_b, ns_b, if_b, mac_b)):
        sh("ip", "link", "set", tmp, "netns", ns)
        run(ns, "ip", "link", "set", tmp, "name", name)
        if mac:
            run(ns, "ip", "link", "set", name, "address", mac)
        run(ns, "ip", "link", "set", name, "up")
    for ns, name in ((ns_a, if_a), (ns_b, if_b)):
        run(ns, "ethtool", "-K", name, "gro", "on", "tx", "off")


def veth_ports(n: int, prefix: str = "p", peer: str = "q"):
    """n veth pairs p0/q0 .. in the current namespace, both ends up (so the p side has
    carrier): ports for BPF test runs, where no packet actually leaves."""
    for k in range(n):
        sh("ip", "link", "add", f"{prefix}{k}", "type", "veth", "peer", "name", f"{peer}{k}")
        for dev in (f"{prefix}{k}", f"{peer}{k}"):
            sh("ip", "link", "set", dev, "up")


def link_counters(ns: str) -> dict[str, dict[str, int]]:
    """Every interface's kernel counters in the namespace (ip -s link), read at one moment; not
    ours, so a switch's control traffic is in them."""
    out = {}
    with netns.inside(ns), IPRoute() as ipr:
        for link in ipr.get_links():
            st = link.get_attr("IFLA_STATS64")
            if st is not None:
                out[link.get_attr("IFLA_IFNAME")] = {k: st[k] for k in ("rx_packets", "rx_bytes",
                                                                         "tx_packets", "tx_bytes")}
    return out


def links_up(ns: str) -> dict[str, bool]:
    """Every interface in the namespace: whether it is up and has its carrier (operstate UP)."""
    with netns.inside(ns), IPRoute() as ipr:
        return {link.get_attr("IFLA_IFNAME"): link.get_attr("IFLA_OPERSTATE") == "UP" for link in ipr.get_links()}


def counters(ns: str, ifname: str) -> dict:
    """One interface's kernel counters (link_counters)."""
    return link_counters(ns)[ifname]


def link_local(ns: str, ifname: str, timeout: float = 5.0) -> str:
    """The interface's link-local address once DAD has finished."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        out = json.loads(run(ns, "ip", "-6", "-j", "addr", "show", "dev", ifname, "scope", "link"))
        for a in out[0].get("addr_info", []) if out else []:
            if not a.get("tentative"):
                return a["local"]
        time.sleep(0.05)
    raise TimeoutError(f"{ns}:{ifname} has no usable link-local address")


def mac(ns: str, ifname: str) -> str:
    return json.loads(run(ns, "ip", "-j", "link", "show", ifname))[0]["address"]


def run_commands(ns: str, commands: list[list[str]]):
    """Commands in a namespace, in order, in one shell (stopping at the first that fails)."""
    run(ns, "sh", "-ec", "\n".join(shlex.join(c) for c in commands))


def lossy_udp(ns: str, port: int, percent: float) -> int:
    """Drop this share of the UDP datagrams to `port` that the namespace forwards (0: stop
    dropping); returns the datagrams dropped under the rule it replaces. Netfilter's random
    match, as the kernels here have no netem: each datagram is lost on its own, as on a link
    with random loss."""
    dropped = sum(int(line.split()[0]) for line in run(ns, "ip6tables", "-L", "FORWARD", "-v", "-x", "-n").splitlines()
                  if f"udp dpt:{port}" in line and "statistic" in line)
    for line in run(ns, "ip6tables", "-S", "FORWARD").splitlines():
        if f"--dport {port}" in line and "statistic" in line:
            run(ns, "ip6tables", "-D", *shlex.split(line)[1:])
    if percent > 0:
        run(ns, "ip6tables", "-A", "FORWARD", "-p", "udp", "--dport", str(port), "-m", "statistic", "--mode", "random",
            "--probability", f"{percent / 100:.6f}", "-j", "DROP")
    return dropped


def sysctl(ns: str, key: str, value: str):
    run(ns, "sysctl", "-qw", f"{key}={value}")
