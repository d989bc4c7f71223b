"""The leaf-spine fabric file's shape, checked before anything reads it: which tables and keys
there are, each value's type and range. A key nobody reads (a typo: `pathz = 4`) is an error, not
a silent default; a string where a number goes is an error, not a crash. The message names the
file, the line and the field:

    fabric.toml:14: [[leaf]] 1 (l1): asn "x" must be a whole number 1-65535

The semantic rules (names unique, paths a multiple of the uplinks, ...) stay with the parser
(clos.py); this is what comes before them."""
from __future__ import annotations

import difflib
import re
from dataclasses import dataclass

from .base import FabricError


@dataclass(frozen=True)
class Field:
    kind: str                      # int, bool, str, names (list of str), pair (2 str), table, nics
    lo: int | None = None
    hi: int | None = None
    what: str = "a whole number"   # what an int is, in the message

    def problem(self, v) -> str | None:
        """Why v does not fit, or None."""
        k = self.kind
        if k == "int":
            if isinstance(v, bool) or not isinstance(v, int) or not self.lo <= v <= self.hi:
                return f"must be {self.what} {self.lo}-{self.hi}"
        elif k == "bool" and not isinstance(v, bool):
            return "must be true or false"
        elif k == "str" and not isinstance(v, str):
            return "must be a string"
        elif k == "names" and not (isinstance(v, list) and all(isinstance(x, str) for x in v)):
            return 'must be a list of names, e.g. ["h1", "h2"]'
        elif k == "pair" and not (isinstance(v, list) and len(v) == 2 and all(isinstance(x, str) for x in v)):
            return 'must be two node names, e.g. ["l1", "s1"]'
        elif k == "nics" and not (isinstance(v, dict) or (isinstance(v, list) and all(isinstance(x, dict) for x in v))):
            return 'must map each NIC to its leaf, e.g. { gpu0_eth = "l1" }'
        return None


ASN = Field("int", 1, 65535, "a 2-byte AS number")
BYTE = Field("int", 0, 255)
NODE = {"name": Field("str"), "asn": ASN}

# table -> (is an array of tables, {key: Field}); None: any keys (their values checked by clos.py)
CLOS: dict[str, tuple[bool, dict[str, Field] | None]] = {
    "fabric": (False, {
        "kind": Field("str"), "paths": Field("int", 1, 16), "prefix": Field("str"), "policy": Field("str"),
        "link_mbps": Field("int", 1, 100_000_000), "bfd": Field("bool"), "pathbw_subtype": BYTE,
        "linkbw_subtype": BYTE, "parallel": Field("int", 1, 4), "bfd_ms": Field("int", 10, 10000),
        "graceful_restart_s": Field("int", 1, 4095), "ttl_security": Field("bool"),
        "bgp_password_file": Field("str"), "bgp_hold_s": Field("int", 3, 65535)}),
    "superspine": (True, {**NODE, "plane": Field("int", 1, 64)}),
    "spine": (True, {**NODE, "pod": Field("int", 1, 4096), "daemon": Field("str")}),
    "leaf": (True, {**NODE, "pod": Field("int", 1, 4096), "hosts": Field("names")}),
    "link": (True, {"between": Field("pair"), "mbps": Field("int", 1, 100_000_000)}),
    "policy": (False, None),
    "stripe": (True, {"name": Field("str"), "leaves": Field("names"), "rails": Field("int", 1, 64),
                      "servers": Field("names"), "nic": Field("str")}),
    "server": (True, {"name": Field("str"), "nics": Field("nics")}),
}


def check(data: dict, where: str, text: str | None = None, schema=None) -> None:
    """FabricError for the first thing in `data` (the parsed file; `text` its source, for line
    numbers) that does not fit `schema` (CLOS)."""
    schema = CLOS if schema is None else schema
    for table, value in data.items():
        if table not in schema:
            raise FabricError(f"{_at(where, text, table)}: [{table}]: no such table{_hint(table, schema)}")
        array, fields = schema[table]
        if array and not (isinstance(value, list) and all(isinstance(t, dict) for t in value)):
            raise FabricError(f"{_at(where, text, table)}: {table} must be [[{table}]] tables")
        if not array and not isinstance(value, dict):
            raise FabricError(f"{_at(where, text, table)}: {table} must be a [{table}] table")
        if fields is None:
            continue
        for i, t in enumerate(value if array else [value], start=1):
            label = f"[[{table}]] {i}" + (f" ({t['name']})" if isinstance(t.get("name"), str) else "") \
                if array else f"[{table}]"
            for key, v in t.items():
                f = fields.get(key)
                if f is None:
                    raise FabricError(f"{_at(where, text, table, i if array else 0, key)}: {label}: "
                                      f"no field {key!r}{_hint(key, fields)}")
                why = f.problem(v)
                if why:
                    raise FabricError(f"{_at(where, text, table, i if array else 0, key)}: {label}: "
                                      f"{key} {_show(v)} {why}")


def _hint(word: str, known) -> str:
    close = difflib.get_close_matches(word, list(known), n=1)
    return f" (did you mean {close[0]!r}?)" if close else f" (known: {', '.join(sorted(known))})"


def _show(v) -> str:
    s = repr(v) if not isinstance(v, str) else f'"{v}"'
    return s if len(s) <= 40 else s[:37] + "..."


HEADER = re.compile(r"^\s*(\[\[?)\s*([A-Za-z0-9_\-]+)\s*\]\]?")


def _at(where: str, text: str | None, table: str, index: int = 0, key: str | None = None) -> str:
    """'file:line' of a table's header (the index-th of an array, from 1), or of its key."""
    if not text:
        return where
    seen: dict[str, int] = {}
    header_line, inside = None, False
    for n, line in enumerate(text.splitlines(), start=1):
        m = HEADER.match(line)
        if m:
            name = m[2]
            seen[name] = seen.get(name, 0) + 1
            inside = name == table and (index == 0 or seen[name] == index)
            if inside and header_line is None:
                header_line = n
            continue
        if inside and key is not None and re.match(rf"^\s*{re.escape(key)}\s*=", line):
            return f"{where}:{n}"
    return f"{where}:{header_line}" if header_line else where
