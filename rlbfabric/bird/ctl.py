"""bird2's control socket: the numbered reply protocol, `show route all` and `show protocols`.

Replies are lines "CODE-text" (more follows), " text" (continuation of the same code) and a
final "CODE text"; codes 0xxx are success, 8xxx/9xxx errors. Every path of every prefix is
read, not only the best, with the attributes RLB compiles from."""
from __future__ import annotations

import math
import re
import socket
import struct
from dataclasses import dataclass, field

COLOUR_HI = 0x030B0000          # generic ext community: Color (type 0x03, sub-type 0x0b)
DEFAULT_PATHBW_SUBTYPE = 0x88   # FARE leaves the sub-type TBD: configurable everywhere


class BirdError(RuntimeError):
    pass


class BirdClient:
    def __init__(self, path: str, timeout: float = 5.0):
        self.path, self.timeout = path, timeout

    def command(self, cmd: str) -> list[tuple[int, str]]:
        """Send one command; returns [(code, text)] with continuations given their code."""
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                s.settimeout(self.timeout)
                s.connect(self.path)
                f = s.makefile("rwb")
                greeting = f.readline().decode()
                if not greeting.startswith("0001 "):
                    raise BirdError(f"unexpected greeting {greeting!r}")
                f.write(cmd.encode() + b"\n")
                f.flush()
                return parse_reply(iter(lambda: f.readline().decode(), ""))
        except OSError as e:
            raise BirdError(f"bird control socket {self.path}: {e}") from e

    def routes(self, net: str | None = None) -> list["BirdPath"]:
        """Every path bird has (not only the best), of one prefix or of all."""
        return parse_routes(self.command(f"show route {net} all" if net else "show route all"))

    def protocols(self) -> list[dict]:
        return parse_protocols(self.command("show protocols"))

    def import_updates(self) -> dict[str, dict[str, int]]:
        """Per BGP protocol, bird's import update counters since the session came up:
        received, rejected, filtered (by the import filter: prefixes the peer may not
        announce), ignored, accepted."""
        return parse_import_updates(self.command("show protocols all"))

    def configure(self) -> str:
        lines = self.command("configure")
        return " ".join(t for _, t in lines)


def parse_reply(lines) -> list[tuple[int, str]]:
    out, code = [], None
    for raw in lines:
        line = raw.rstrip("\n")
        m = re.match(r"^(\d{4})([ -])(.*)$", line)
        if m:
            code = int(m.group(1))
            text = m.group(3)
            if m.group(2) == " ":          # final line
                if code >= 8000:
                    raise BirdError(f"bird: {text.strip()} ({code})")
                if text.strip():
                    out.append((code, text))
                return out
            out.append((code, text))
        elif line.startswith(" ") and code is not None:
            out.append((code, line[1:]))
        else:
            raise BirdError(f"malformed reply line {line!r}")
    raise BirdError("reply ended without a final line")


@dataclass
class BirdPath:
    net: str
    proto: str
    best: bool = False
    via: str | None = None
    iface: str | None = None
    source: str = ""                     # BGP, device, static ...
    as_path: list[int] = field(default_factory=list)
    ext_communities: list[tuple[int, int]] = field(default_factory=list)
    aigp: int | None = None
    local_pref: int | None = None
    bad: list[str] = field(default_factory=list)   # attributes that could not be used: ignore the path

    @property
    def colours(self) -> list[int]:
        return [lo for hi, lo in self.ext_communities if hi == COLOUR_HI]

    def path_bandwidth(self, subtype: int = DEFAULT_PATHBW_SUBTYPE, transitive: bool = True) -> float | None:
        """FARE path bandwidth (bytes/s) from the AS-specific ext community, if present and sane
        (a peer can send NaN, an infinity or a negative float: those count as absent)."""
        want = 0x00 if transitive else 0x40
        for hi, lo in self.ext_communities:
            if hi >> 24 == want and (hi >> 16) & 0xFF == subtype:
                v = struct.unpack(">f", lo.to_bytes(4, "big"))[0]
                return v if math.isfinite(v) and v >= 0 else None
        return None

    def check(self, subtypes: tuple[int, ...] = (DEFAULT_PATHBW_SUBTYPE,)) -> list[str]:
        """What is wrong with this path's attributes (empty: usable)."""
        out = list(self.bad)
        for hi, lo in self.ext_communities:
            if (hi >> 16) & 0xFF in subtypes and hi >> 24 in (0x00, 0x40):
                v = struct.unpack(">f", lo.to_bytes(4, "big"))[0]
                if not math.isfinite(v) or v < 0:
                    out.append(f"path bandwidth {v}")
        return out


_ROUTE = re.compile(r"^(?P<net>\S+)?\s+(?P<kind>unicast|unreachable|blackhole|prohibit)\s+"
                    r"\[(?P<proto>\S+)[^\]]*\](?P<best>\s+\*)?")
# bird prints ext communities as (generic, 0xHI, 0xLO), or for a 2-octet AS-specific type it
# does not know (FARE path bandwidth) as (unknown 0xTTSS, ASN, VALUE), all in one line
_EC = re.compile(r"\((generic|rt|ro|unknown 0x[0-9a-f]+), (0x[0-9a-f]+|\d+(?:\.\d+)*), (0x[0-9a-f]+|\d+)\)")


def parse_routes(reply: list[tuple[int, str]]) -> list[BirdPath]:
    """`show route all` -> one BirdPath per path (continuation rows repeat the prefix)."""
    paths: list[BirdPath] = []
    net = None
    for code, text in reply:
        if code == 1007 and not text.startswith("\t"):   # attribute rows are tab-indented
            if text.startswith("Table "):
                continue
            m = _ROUTE.match(text)
            if not m:
                raise BirdError(f"unparsed route line {text!r}")
            net = m.group("net") or net
            if net is None:
                raise BirdError(f"route line without a prefix: {text!r}")
            paths.append(BirdPath(net=net, proto=m.group("proto"), best=bool(m.group("best"))))
            continue
        if not paths:
            continue
        p = paths[-1]
        t = text.strip()
        if t.startswith("via "):
            m = re.match(r"via (\S+) on (\S+)", t)
            if not m:
                raise BirdError(f"unparsed next hop {t!r}")
            p.via, p.iface = m.group(1), m.group(2)
        elif t.startswith("dev "):
            p.iface = t.split()[1]
        elif t.startswith("Type: "):
            p.source = t.split()[1]
        elif t.startswith("BGP.as_path:"):
            p.as_path = [int(x) for x in t.split(":", 1)[1].split() if x.isdigit()]
        elif t.startswith("BGP.aigp:"):
            value = t.split(":", 1)[1].strip()
            if value.isdigit():
                p.aigp = int(value)
            else:                          # e.g. an AIGP attribute without a metric TLV
                p.bad.append(f"AIGP {value!r}")
        elif t.startswith("BGP.local_pref:"):
            value = t.split(":", 1)[1].strip()
            if value.isdigit():
                p.local_pref = int(value)
            else:
                p.bad.append(f"local preference {value!r}")
        elif t.startswith("BGP.ext_community:"):
            for kind, hi, lo in _EC.findall(t):
                if kind == "generic":
                    p.ext_communities.append((int(hi, 16), int(lo, 16)))
                elif kind.startswith("unknown ") and hi.isdigit() and int(hi) < 65536:
                    tt = int(kind.split()[1], 16)          # (type << 8) | sub-type
                    p.ext_communities.append(((tt >> 8) << 24 | (tt & 0xFF) << 16 | int(hi), int(lo, 0)))
    return paths


def parse_protocols(reply: list[tuple[int, str]]) -> list[dict]:
    out = []
    for code, text in reply:
        if code != 1002:
            continue
        cols = text.split()
        if len(cols) < 4:
            raise BirdError(f"unparsed protocol line {text!r}")
        # "Since" is one column (04:08:50.825) or two (2026-11-22 01:53:27) by timeformat
        rest = cols[6:] if len(cols) > 5 and re.match(r"\d{4}-\d\d-\d\d$", cols[4]) else cols[5:]
        info = " ".join(rest)
        out.append({"name": cols[0], "proto": cols[1], "state": cols[3], "info": info})
    return out


UPDATE_COLUMNS = ("received", "rejected", "filtered", "ignored", "accepted")


def parse_import_updates(reply: list[tuple[int, str]]) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    name = proto = None
    for code, text in reply:
        if code == 1002:
            cols = text.split()
            name, proto = (cols[0], cols[1]) if len(cols) > 1 else (None, None)
        elif name and proto == "BGP" and text.strip().startswith("Import updates:"):
            vals = text.split(":", 1)[1].split()
            out[name] = {k: int(v) if v.isdigit() else 0 for k, v in zip(UPDATE_COLUMNS, vals)}
    return out
