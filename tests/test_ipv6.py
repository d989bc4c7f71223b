"""rlbcommon/ipv6.py: the fast reader of IPv6 text the coordinator uses for every QP's peer."""
from __future__ import annotations

import ipaddress

import pytest

from rlbcommon.ipv6 import ipv6_int


@pytest.mark.parametrize("text", ["fc00:2:1:1::1", "::", "::1", "fe80::1:2", "::ffff:10.0.0.1",
                                  "FC00:0002:0001:0001:0000:0000:0000:0001"])
def test_it_reads_what_ipaddress_reads(text):
    assert ipv6_int(text) == int(ipaddress.IPv6Address(text))


@pytest.mark.parametrize("bad", ["10.0.0.1", "fc00::1::2", "fc00::g", "", "fc00::1%eth0", 5, None, b"::1"])
def test_anything_else_is_a_value_error_that_says_what(bad):
    with pytest.raises(ValueError) as e:
        ipv6_int(bad)
    assert str(e.value)
