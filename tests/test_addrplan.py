"""The address plan and RDMA GID discovery (pure logic, a fake sysfs tree)."""
import ipaddress

import pytest

from rlbfabric import addrplan
from rlbhost.gids import GidTable


def nets(*texts):
    return [ipaddress.IPv6Network(t) for t in texts]


def test_detect_field():
    assert addrplan.detect_field(nets("fc00:1:1:1::/64", "fc00:1:1:2::/64", "fc00:1:1:4::/64")) == 3
    assert addrplan.detect_field(nets("fc00:1::/64", "fc00:2::/64")) == 1
    assert addrplan.detect_field(nets("fc00:1:1:1::/64")) is None
    with pytest.raises(ValueError, match="differ in hextets"):
        addrplan.detect_field(nets("fc00:1:1:1::/64", "fc00:1:2:2::/64"))


def test_with_field_keeps_the_interface_id():
    a = "fc00:1:2:1:966d:aeff:fef5:5c0"
    assert str(addrplan.with_field(a, 3, 4)) == "fc00:1:2:4:966d:aeff:fef5:5c0"
    assert addrplan.field_value("fc00:1:2:4::1", 3) == 4


def test_eui64_as_slaac_builds_it():
    # Juniper Fig. 2 shows 966d:aeff:fef5:05c0 for this MAC, without the U/L-bit flip that
    # RFC 4291 (and the kernel's SLAAC) applies: 0x96 ^ 0x02 = 0x94
    assert addrplan.eui64("96:6d:ae:f5:05:c0") == "946d:aeff:fef5:05c0"


def test_gid_indexes_from_sysfs(tmp_path):
    port = tmp_path / "rxe0" / "ports" / "1"
    (port / "gids").mkdir(parents=True)
    (port / "gid_attrs" / "types").mkdir(parents=True)
    rows = {0: ("fe80:0000:0000:0000:0001:02ff:fe03:0405", "IB/RoCE v1"),
            1: ("fe80:0000:0000:0000:0001:02ff:fe03:0405", "RoCE v2"),
            3: ("fc00:0001:0001:0002:0001:02ff:fe03:0405", "RoCE v2"),
            4: ("0000:0000:0000:0000:0000:0000:0000:0000", "RoCE v2")}
    for i, (gid, typ) in rows.items():
        (port / "gids" / str(i)).write_text(gid + "\n")
        (port / "gid_attrs" / "types" / str(i)).write_text(typ + "\n")
    table = GidTable(sysfs=tmp_path)
    got = table.by_address()
    assert got == {"fe80::1:2ff:fe03:405": [{"device": "rxe0", "port": 1, "gid_index": 1}],
                   "fc00:1:1:2:1:2ff:fe03:405": [{"device": "rxe0", "port": 1, "gid_index": 3}]}
    # the verbs service's lookup: the RoCE v2 entry of an address, not its v1 twin or an empty one
    assert table.index_of("rxe0", 1, "fe80::1:2ff:fe03:405") == 1
    assert table.index_of("rxe0", 1, "fc00:1:1:2:1:2ff:fe03:405") == 3
    assert table.index_of("rxe0", 1, "fc00:1:1:3:1:2ff:fe03:405") is None
    assert table.index_of("rxe0", 2, "fc00:1:1:2:1:2ff:fe03:405") is None
