"""What the switch program and user space agree on, read from the C header (bpf/rlb_switch.h):
its constants, forwarding modes, route owners, counters and policer buckets, and the byte forms
of its keys and MACs. One place for them: the data plane, the routing model and the metrics
import these, none redefines them."""
from __future__ import annotations

import ipaddress
import sys

from rlbcommon.cheader import constants, enum_names

SOURCE, HEADER = "rlb_switch.c", "rlb_switch.h"
C = constants(HEADER)
# forwarding modes as the program knows them (enum rlb_mode; "none" is an empty entry)
MODE_NAMES = {v: name for v, name in enum_names(HEADER, "RLB_MODE_").items() if name != "none"}
MODE_IDS = {k: v for v, k in MODE_NAMES.items()}
OWNER_NAMES = enum_names(HEADER, "RLB_OWNER_")                      # id -> name
OWNERS = {v: k for k, v in OWNER_NAMES.items()}                      # name -> id
REASONS = enum_names(HEADER, "RLB_R_")
NH_VALID, NH_RESOLVED, NH_STATIC = C["RLB_NH_VALID"], C["RLB_NH_RESOLVED"], C["RLB_NH_STATIC"]
POLICE = enum_names(HEADER, "RLB_P_")          # {bucket id: name}, without "max"
POLICE.pop(C["RLB_P_MAX"], None)

# struct rlb_lpm_key's first field, per prefix length, as the kernel reads it (host order)
_PREFIXLEN = [n.to_bytes(4, sys.byteorder) for n in range(129)]


def lpm_key_bytes(prefix: ipaddress.IPv6Network) -> bytes:
    """struct rlb_lpm_key of prefix as bytes: its length, then the address."""
    return _PREFIXLEN[prefix.prefixlen] + prefix.network_address.packed


def lpm_key(routes_map, prefix: ipaddress.IPv6Network):
    """The trie's key for prefix, built from its bytes in one copy (a leaf's table is tens of
    thousands of them)."""
    return routes_map.key_type.from_buffer_copy(lpm_key_bytes(prefix))


def mac_bytes(mac: str) -> bytes:
    return bytes(int(x, 16) for x in mac.split(":"))


def mac_str(b) -> str:
    return ":".join(f"{x:02x}" for x in bytes(b))
