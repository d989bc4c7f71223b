"""Constants from the C headers (bpf/, verbs/): #defines and enum members, parsed, never copied."""
from __future__ import annotations

import re
from functools import lru_cache

from pathlib import Path

from .paths import BPF_DIR

_DEFINE = re.compile(r"^#define\s+(RLB[HV]?_\w+)\s+(\d+|0x[0-9a-fA-F]+)\b", re.M)
_ENUM = re.compile(r"enum\s+(\w+)\s*\{(.*?)\};", re.S)


@lru_cache(maxsize=None)
def constants(header: str, where: Path = BPF_DIR) -> dict[str, int]:
    """All integer #defines and enum members of a header (in bpf/ unless where says)."""
    text = re.sub(r"/\*.*?\*/", "", (where / header).read_text(), flags=re.S)
    out = {name: int(value, 0) for name, value in _DEFINE.findall(text)}
    for _, body in _ENUM.findall(text):
        nxt = 0
        for item in body.split(","):
            item = item.strip()
            if not item:
                continue
            name, _, value = item.partition("=")
            nxt = int(value.strip(), 0) if value else nxt
            out[name.strip()] = nxt
            nxt += 1
    return out


@lru_cache(maxsize=None)
def enum_names(header: str, prefix: str, where: Path = BPF_DIR) -> dict[int, str]:
    """{value: short name} of the members that start with prefix (e.g. 'RLB_R_')."""
    return {v: k[len(prefix):].lower() for k, v in constants(header, where).items() if k.startswith(prefix)}
