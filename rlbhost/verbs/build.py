"""Builds the verbs path selector where it will run: librlbverbs.so (the LD_PRELOAD library) and
librlbverbs-ibverbs.so (what a program that dlopens libibverbs is given instead, so that dlsym
and dlvsym find the wrapped verbs first and every other verb in libibverbs).

Built from the C source the wheel carries, as the BPF programs are: against this machine's
rdma-core headers and with dlopen exported in exactly the versions this machine's glibc gives it
(a program built against an old glibc asks for dlopen@GLIBC_2.2.5, a new one for
dlopen@GLIBC_2.34 on x86_64; both must reach the wrapper).

    python -m rlbhost.verbs.build [--strict] DIR   (`make setup` runs it strict; `rlbhost verbs
                                                    install` not: warnings are no errors there)"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from rlbcommon.paths import VERBS_SRC

LIB, SHIM = "librlbverbs.so", "librlbverbs-ibverbs.so"
WRAPPED = ("ibv_modify_qp", "ibv_destroy_qp", "ibv_create_ah", "ibv_destroy_ah")
CFLAGS = ["-O2", "-g", "-fPIC", "-fvisibility=hidden", "-Wall", "-Wextra", "-Wno-unused-parameter"]
STRICT = ["-Werror"]     # in CI and `make setup`; not where operators build (another compiler's
                         # new warning must not stop an install)


class BuildError(RuntimeError):
    """What is missing to build the library, in words for the operator."""


def _run(cmd: list[str], what: str) -> str:
    try:
        r = subprocess.run(cmd, capture_output=True, text=True)
    except FileNotFoundError:
        raise BuildError(f"{what}: {cmd[0]} is not installed (apt install gcc binutils)") from None
    if r.returncode:
        raise BuildError(f"{what} failed:\n{r.stderr.strip()}")
    return r.stdout


def dlopen_versions(cc: str = "gcc") -> tuple[str, str | None]:
    """(default, compat) versions of dlopen in this machine's C library: libc itself since glibc
    2.34 (both), libdl before (one)."""
    for lib in ("libc.so.6", "libdl.so.2"):
        path = _run([cc, f"-print-file-name={lib}"], "finding the C library").strip()
        if not os.path.isabs(path):
            continue
        syms = _run(["readelf", "-W", "--dyn-syms", path], f"reading {path}")
        found = re.findall(r"\sdlopen@(@?)(\S+)", syms)
        default = next((v for at, v in found if at), None)
        compat = next((v for at, v in found if not at and v != default), None)
        if default:
            return default, compat
    raise BuildError("no dlopen in this machine's libc.so.6 or libdl.so.2")


def _version_script(default: str, compat: str | None) -> str:
    nodes = [f"{compat} {{ }};"] if compat else []
    nodes.append(f"{default} {{ }};")
    nodes.append("IBVERBS_1.1 { global: " + " ".join(f"{w};" for w in WRAPPED) + " };")
    nodes.append("RLB_VERBS_1 { global: rlb_verbs_keep_name; rlb_verbs_device; rlb_verbs_slot; rlb_verbs_record_layout; local: *; };")
    return "\n".join(nodes) + "\n"


def build(out: Path, cc: str = "gcc", src: Path = VERBS_SRC, strict: bool = False,
          defines: tuple[str, ...] = ()) -> tuple[Path, Path]:
    """Compile both libraries into out (atomically: a running job keeps the file it mapped);
    strict: warnings are errors."""
    if not Path("/usr/include/infiniband/verbs.h").exists() and not _has_header(cc):
        raise BuildError("no <infiniband/verbs.h>: install rdma-core's headers (apt install libibverbs-dev)")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    default, compat = dlopen_versions(cc)
    with tempfile.TemporaryDirectory(prefix="rlbverbs-") as tmp:
        t = Path(tmp)
        (t / "rlb_verbs.map").write_text(_version_script(default, compat))
        (t / "empty.c").write_text("/* librlbverbs-ibverbs.so: its needed libraries are the point */\n")
        defs = [f'-DRLB_DLOPEN_DEFAULT="{default}"'] + ([f'-DRLB_DLOPEN_COMPAT="{compat}"'] if compat else [])
        _run([cc, *CFLAGS, *(STRICT if strict else []), *defs, *(f"-D{d}" for d in defines), f"-I{src}", "-shared", f"-Wl,--version-script={t / 'rlb_verbs.map'}",
              f"-Wl,-soname,{LIB}", "-o", str(t / LIB), str(src / "rlb_verbs.c"), "-ldl", "-lpthread"],
             f"compiling {LIB}")
        _run([cc, "-shared", "-fPIC", "-o", str(t / SHIM), str(t / "empty.c"), f"-Wl,-soname,{SHIM}",
              "-Wl,--no-as-needed", f"-L{t}", "-lrlbverbs", "-libverbs", "-Wl,-rpath,$ORIGIN"],
             f"linking {SHIM} (needs libibverbs.so: apt install libibverbs-dev)")
        for name in (LIB, SHIM):
            tmp_out = out / f".{name}.{os.getpid()}"
            shutil.copy2(t / name, tmp_out)
            tmp_out.replace(out / name)
    return out / LIB, out / SHIM


def _has_header(cc: str) -> bool:
    r = subprocess.run([cc, "-E", "-x", "c", "-"], input="#include <infiniband/verbs.h>\n",
                       capture_output=True, text=True)
    return r.returncode == 0


def main(argv: list[str]) -> int:
    strict = "--strict" in argv
    argv = [a for a in argv if a != "--strict"]
    if len(argv) != 1:
        print("usage: python -m rlbhost.verbs.build [--strict] DIR", file=sys.stderr)
        return 2
    try:
        lib, shim = build(Path(argv[0]), strict=strict)
    except BuildError as e:
        print(f"rlbverbs build: {e}", file=sys.stderr)
        return 2
    print(f"built {lib} and {shim}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
