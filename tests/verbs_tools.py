"""What the verbs tests and the verbs benchmark build and run: the library (as `rlbhost verbs
install` builds it), a stand-in libibverbs with no device (tests/verbs/stub_ibverbs.c), and a
verbs program linked against it or loading it with dlopen + dlvsym (tests/verbs/verbs_app.c);
a fake /sys/class/infiniband that both the stub and the agent read GIDs from, and beside it the
kernel's QP table (whose QP is whose) that the stub keeps and the agent checks claims against."""
from __future__ import annotations

import ipaddress
import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

from rlbhost.verbs.build import build

HERE = Path(__file__).resolve().parent / "verbs"


@dataclass
class Built:
    lib: Path                     # librlbverbs.so
    stub_dir: Path                # libibverbs.so.1 (the stub)
    linked: Path                  # verbs_app linked against the stub
    dlopen: Path                  # verbs_app with dlopen + dlvsym

    def app(self, how: str) -> Path:
        return self.linked if how == "linked" else self.dlopen


def build_all(out: Path, defines: tuple[str, ...] = ()) -> Built:
    lib, _ = build(out / "lib", strict=True, defines=defines)
    stub = out / "stub"
    stub.mkdir(parents=True, exist_ok=True)
    (out / "stub.map").write_text("IBVERBS_1.1 { global: *; };\n")
    cc = ["gcc", "-O2", "-Wall", "-Werror"]
    subprocess.run([*cc, "-fPIC", "-shared", "-o", str(stub / "libibverbs.so.1"), "-Wl,-soname,libibverbs.so.1",
                    f"-Wl,--version-script={out / 'stub.map'}", str(HERE / "stub_ibverbs.c")], check=True)
    (stub / "libibverbs.so").unlink(missing_ok=True)
    (stub / "libibverbs.so").symlink_to("libibverbs.so.1")
    subprocess.run([*cc, "-o", str(out / "app_linked"), str(HERE / "verbs_app.c"), f"-L{stub}", "-libverbs",
                    f"-Wl,-rpath,{stub}", "-lpthread"], check=True)
    subprocess.run([*cc, "-DUSE_DLOPEN", "-o", str(out / "app_dlopen"), str(HERE / "verbs_app.c"), "-ldl", "-lpthread"],
                   check=True)
    return Built(lib, stub, out / "app_linked", out / "app_dlopen")


def qp_table(sysfs: Path) -> Path:
    """Beside a fake sysfs tree, the kernel's QP table of its devices as the stub keeps it
    (<device>/<QP number in hex>: the creating thread's id; rlbhost/verbs/kernelqps.py ResDir)."""
    return sysfs.with_name(sysfs.name + "-qps")


def kernel_has(sysfs: Path, qpn: int, task: int, dev: str = "stub0"):
    """A QP the kernel has, made by thread `task` (as a process's ibv_create_qp would leave it)."""
    (qp_table(sysfs) / dev / f"{qpn:x}").write_text(f"{task}\n")


def kernel_drops(sysfs: Path, qpn: int, dev: str = "stub0"):
    """The QP destroyed (as ibv_destroy_qp or the process's end would)."""
    (qp_table(sysfs) / dev / f"{qpn:x}").unlink(missing_ok=True)


def agent_env(sysfs: Path) -> dict[str, str]:
    """An agent's environment to read GIDs from the fake tree and QP owners from the stub's table."""
    return {"RLB_SYSFS_INFINIBAND": str(sysfs), "RLB_RDMA_RES_DIR": str(qp_table(sysfs))}


def fake_sysfs(root: Path, addrs: dict[int, str], dev: str = "stub0", netdev: str = "eth0") -> dict[int, int]:
    """A GID table as rxe makes one: a link-local GID, then each address twice (RoCE v1 at an
    odd index, v2 at the even one after it), and the device's (empty) QP table. Returns {path:
    RoCE v2 GID index}."""
    (qp_table(root) / dev).mkdir(parents=True, exist_ok=True)
    base = root / dev / "ports" / "1"
    for d in ("gids", "gid_attrs/types", "gid_attrs/ndevs"):
        (base / d).mkdir(parents=True, exist_ok=True)
    rows = {0: ("fe80::1", "RoCE v2")}
    v2 = {}
    for k, a in sorted(addrs.items()):
        rows[2 * k - 1] = (a, "IB/RoCE v1")
        rows[2 * k] = (a, "RoCE v2")
        v2[k] = 2 * k
    for i, (a, t) in rows.items():
        (base / "gids" / str(i)).write_text(ipaddress.IPv6Address(a).exploded + "\n")
        (base / "gid_attrs/types" / str(i)).write_text(t + "\n")
        (base / "gid_attrs/ndevs" / str(i)).write_text(netdev + "\n")
    return v2


def app_env(built: Built, sysfs: Path, log: Path, qpn: int, socket: Path | None, preload: bool = True,
            **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RLB_VERBS", "STUB_", "LD_PRELOAD"))}
    env.update({"STUB_SYSFS": str(sysfs), "STUB_RES": str(qp_table(sysfs)), "STUB_LOG": str(log), "STUB_QPN": hex(qpn),
                "LD_LIBRARY_PATH": str(built.stub_dir)})
    if preload:
        env["LD_PRELOAD"] = str(built.lib)
    if socket is not None:
        env["RLB_VERBS_SOCKET"] = str(socket)
    env.update(extra)
    return env


MODIFY = re.compile(r"MODIFY qpn=(\d+) state=(\d+) mask=(\d+) sgid_index=(\d+) dgid=(\S+) dest_qpn=(\d+) rc=(\d+)")
AH = re.compile(r"AH ah=(\d+) sgid_index=(\d+) dgid=(\S+)")
APP = re.compile(r"QP (\d+) ns=(\d+) rc=(-?\d+) app_sgid_index=(\d+) app_dgid=(\S+)")


def rtrs(log: Path) -> dict[int, tuple[int, str]]:
    """{QP number: (source GID index, destination GID)} of the RTRs the device accepted."""
    out = {}
    for m in MODIFY.finditer(log.read_text() if log.exists() else ""):
        if int(m[2]) == 2 and int(m[7]) == 0:      # IBV_QPS_RTR, accepted
            out[int(m[1])] = (int(m[4]), m[5])
    return out


def app_lines(out: str) -> list[dict]:
    return [{"qpn": int(m[1]), "ns": int(m[2]), "rc": int(m[3]), "sgid_index": int(m[4]), "dgid": m[5]}
            for m in APP.finditer(out)]


def table_lookup(path: Path, local_qpn: int, remote_qpn: int, peer: str, dev: str = "stub0", port: int = 1):
    """The agent's decision table record of a pair (this end: QP local_qpn of dev/port), read as
    the library reads it: (path, gid index, keep) or None."""
    import mmap
    from rlbhost.verbs import table as T
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ) as m:
        key = (T.device(dev, port), local_qpn, remote_qpn, T.iid_of(peer))
        first = T.slot(*key)
        for j in range(T.PROBE):
            rec = T.RECORD.unpack_from(m, T.HEAD.size + ((first + j) % T.SLOTS) * T.RECORD.size)
            if rec[1] == T.EMPTY:
                return None
            if rec[1] == T.LIVE and rec[2:6] == key:
                return rec[6], rec[7], rec[8]
    return None
