"""What the host's TC programs and user space agree on (bpf/rlb_host.h, read through
rlbcommon.cheader: one source of truth), and the records user space makes of its maps."""
from __future__ import annotations

import functools
import ipaddress
from dataclasses import dataclass

from rlbcommon.cheader import constants, enum_names

SOURCE, HEADER = "rlb_host.c", "rlb_host.h"
C = constants(HEADER)
REASONS = enum_names(HEADER, "RLBH_R_")
MAX_PATHS = C["RLBH_MAX_PATHS"]
SPRAY = C["RLBH_W_SPRAY"]
PORTS_MODE = C["RLBH_F_PORTS"]
ECHO = "rlb_host_echo"        # ports mode: on each port's ingress, answers the plane probes
WEIGHT_SCALE = 1000           # weights are stored as integers: 0.5 -> 500


class HostError(RuntimeError):
    """An operation the host data plane cannot do; the message is for the operator."""


@functools.lru_cache(maxsize=65536)
def packed_addr(addr: str) -> bytes:
    """An address's 16 bytes (the same peers come again and again: a verbs QP writes three)."""
    return ipaddress.IPv6Address(addr).packed


@functools.lru_cache(maxsize=65536)
def addr_text(packed: bytes) -> str:
    return str(ipaddress.IPv6Address(packed))


@dataclass
class Path_:
    index: int
    value: int
    address: str
    valid: bool
    ifindex: int = 0              # ports mode


@dataclass(frozen=True)
class PortPath:
    """Ports mode: one path is one egress port (a plane's sub-port) and the switch's MAC on it."""
    value: int                    # (plane - 1) x sub-ports + sub-port: stored at index value - 1
    ifname: str
    dmac: str | None              # None until the switch's MAC is known: the path is unusable
    up: bool                      # carrier


@dataclass(frozen=True)
class VerbsQp:
    """A QP (or UD address handle) whose addresses the verbs library chose: the packets carry
    peer_addr, the peer's address on the path at index `path`."""
    peer_base: str
    peer_addr: str
    local_qpn: int
    remote_qpn: int
    path: int
    wid: int
    pid: int
    flags: int = 0
    created_ns: int = 0

    @property
    def decided_here(self) -> bool:
        return bool(self.flags & C["RLBH_VF_DECIDED"])

    @property
    def is_ah(self) -> bool:
        return bool(self.flags & C["RLBH_VF_AH"])
