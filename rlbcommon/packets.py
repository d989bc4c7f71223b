"""Building and reading the frames RLB deals with: Ethernet / IPv6 / UDP / RoCEv2 BTH.

Used by the BPF test-run tests, the traffic generator (frames sent as a NIC would, from a raw
packet socket) and the benchmarks."""
from __future__ import annotations

import ipaddress
import struct
from dataclasses import dataclass

from rlbcommon.constants import ROCE_PORT

ETH_P_IPV6 = 0x86DD
ETH_P_IP = 0x0800
BTH_OPCODE_RC_SEND_ONLY = 0x04
PROTO_TCP, PROTO_UDP, PROTO_ICMPV6 = 6, 17, 58


def mac_bytes(mac: str | bytes) -> bytes:
    if isinstance(mac, bytes):
        return mac
    return bytes(int(x, 16) for x in mac.split(":"))


def ip6(addr) -> bytes:
    return ipaddress.IPv6Address(addr).packed


def checksum(data: bytes) -> int:
    if len(data) % 2:
        data += b"\0"
    s = sum(struct.unpack(f"!{len(data) // 2}H", data))
    while s >> 16:
        s = (s & 0xFFFF) + (s >> 16)
    return s


def l4_checksum(src: bytes, dst: bytes, proto: int, segment: bytes) -> int:
    """RFC 8200 pseudo-header checksum; UDP sends 0 as 0xffff."""
    pseudo = src + dst + struct.pack("!IxxxB", len(segment), proto)
    c = ~checksum(pseudo + segment) & 0xFFFF
    return c or 0xFFFF


def bth(dest_qp: int, psn: int = 0, opcode: int = BTH_OPCODE_RC_SEND_ONLY, pkey: int = 0xFFFF) -> bytes:
    """InfiniBand Base Transport Header (12 bytes) as RoCEv2 carries it after UDP."""
    return struct.pack("!BBHI I", opcode, 0, pkey, dest_qp & 0xFFFFFF, psn & 0xFFFFFF)


def ipv6_header(src, dst, payload_len: int, nexthdr: int, hop_limit: int = 64,
                flow_label: int = 0, tclass: int = 0) -> bytes:
    first = (6 << 28) | (tclass << 20) | (flow_label & 0xFFFFF)
    return struct.pack("!IHBB", first, payload_len, nexthdr, hop_limit) + ip6(src) + ip6(dst)


def udp6(src, dst, sport: int, dport: int, payload: bytes, zero_checksum: bool = False) -> bytes:
    """UDP header + payload with a valid checksum (or 0 when zero_checksum)."""
    hdr = struct.pack("!HHHH", sport, dport, 8 + len(payload), 0)
    if zero_checksum:
        return hdr + payload
    c = l4_checksum(ip6(src), ip6(dst), PROTO_UDP, hdr + payload)
    return hdr[:6] + struct.pack("!H", c) + payload


def ether(dmac, smac, ethertype: int, payload: bytes) -> bytes:
    return mac_bytes(dmac) + mac_bytes(smac) + struct.pack("!H", ethertype) + payload


def roce_frame(src, dst, sport: int, qp: int, dmac="02:00:00:00:00:01",
               smac="02:00:00:00:00:02", psn: int = 0, payload_len: int = 64,
               hop_limit: int = 64, flow_label: int = 0, dport: int = ROCE_PORT,
               zero_checksum: bool = False) -> bytes:
    """A RoCEv2-like frame: Ethernet / IPv6 / UDP 4791 / BTH / payload (ICRC not computed)."""
    payload = bth(qp, psn) + bytes(payload_len)
    seg = udp6(src, dst, sport, dport, payload, zero_checksum)
    return ether(dmac, smac, ETH_P_IPV6,
                 ipv6_header(src, dst, len(seg), PROTO_UDP, hop_limit, flow_label) + seg)


def tcp6(src, dst, sport: int, dport: int, payload: bytes = b"") -> bytes:
    hdr = struct.pack("!HHIIBBHHH", sport, dport, 0, 0, 5 << 4, 0x02, 65535, 0, 0)
    c = l4_checksum(ip6(src), ip6(dst), PROTO_TCP, hdr + payload)
    return hdr[:16] + struct.pack("!H", c) + hdr[18:] + payload


def icmp6(src, dst, icmp_type: int, code: int = 0, body: bytes = bytes(4)) -> bytes:
    msg = struct.pack("!BBH", icmp_type, code, 0) + body
    c = l4_checksum(ip6(src), ip6(dst), PROTO_ICMPV6, msg)
    return msg[:2] + struct.pack("!H", c) + msg[4:]


def ipv6_frame(src, dst, nexthdr: int, l4: bytes, dmac="02:00:00:00:00:01",
               smac="02:00:00:00:00:02", hop_limit: int = 64) -> bytes:
    return ether(dmac, smac, ETH_P_IPV6, ipv6_header(src, dst, len(l4), nexthdr, hop_limit) + l4)


@dataclass
class Parsed:
    dmac: str
    smac: str
    ethertype: int
    src: str | None = None
    dst: str | None = None
    hop_limit: int | None = None
    nexthdr: int | None = None
    sport: int | None = None
    dport: int | None = None
    udp_checksum: int | None = None
    qp: int | None = None


def parse(frame: bytes) -> Parsed:
    fmt = lambda b: ":".join(f"{x:02x}" for x in b)
    p = Parsed(fmt(frame[0:6]), fmt(frame[6:12]), struct.unpack("!H", frame[12:14])[0])
    if p.ethertype != ETH_P_IPV6 or len(frame) < 54:
        return p
    p.nexthdr, p.hop_limit = frame[20], frame[21]
    p.src = str(ipaddress.IPv6Address(frame[22:38]))
    p.dst = str(ipaddress.IPv6Address(frame[38:54]))
    if p.nexthdr == PROTO_UDP and len(frame) >= 62:
        p.sport, p.dport, _, p.udp_checksum = struct.unpack("!HHHH", frame[54:62])
        if p.dport == ROCE_PORT and len(frame) >= 74:
            p.qp = int.from_bytes(frame[67:70], "big")
    return p


def udp_checksum_ok(frame: bytes) -> bool:
    """Verify the UDP checksum of an Ethernet/IPv6/UDP frame (0 means 'none' and passes)."""
    src, dst = frame[22:38], frame[38:54]
    seg = frame[54:54 + struct.unpack("!H", frame[18:20])[0]]
    if struct.unpack("!H", seg[6:8])[0] == 0:
        return True
    return checksum(src + dst + struct.pack("!IxxxB", len(seg), PROTO_UDP) + seg) == 0xFFFF
