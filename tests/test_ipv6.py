"""rlbcommon/ipv6.py: the fast reader of IPv6 text the coordinator uses for every QP's peer."""
from __future__ import annotations

import ipaddress
import random

import pytest

from rlbcommon.ipv6 import ipv6_int, ipv6_network, ipv6_packed, network_text


@pytest.mark.parametrize("text", ["fc00:2:1:1::1", "::", "::1", "fe80::1:2", "::ffff:10.0.0.1",
                                  "FC00:0002:0001:0001:0000:0000:0000:0001"])
def test_it_reads_what_ipaddress_reads(text):
    assert ipv6_int(text) == int(ipaddress.IPv6Address(text))


@pytest.mark.parametrize("bad", ["10.0.0.1", "fc00::1::2", "fc00::g", "", "fc00::1%eth0", 5, None, b"::1"])
def test_anything_else_is_a_value_error_that_says_what(bad):
    with pytest.raises(ValueError) as e:
        ipv6_int(bad)
    assert str(e.value)


def test_networks_read_and_written_as_ipaddress_does_for_every_shape():
    """A route table's prefixes go through ipv6_network and network_text (the fast forms):
    100k random prefixes with runs of zeros, all-ones hextets and IPv4-embedded forms give the
    same network and the same text as ipaddress."""
    rnd = random.Random(7)
    for _ in range(100_000):
        hextets = [rnd.choice([0, 0, 0, 1, 0xFFFF, rnd.randrange(65536)]) for _ in range(8)]
        if rnd.random() < 0.1:
            hextets[:5] = [0] * 5                  # ::ffff:a.b.c.d and its neighbours
        net = ipaddress.IPv6Network((int.from_bytes(b"".join(h.to_bytes(2, "big") for h in hextets), "big"),
                                     rnd.randrange(129)), strict=False)
        assert network_text(net) == str(net)
        got = ipv6_network(str(net))
        assert got == net and hash(got) == hash(net) and hash(got) == hash(got) and repr(got) == repr(net)
        assert ipv6_packed(str(net.network_address)) == net.network_address.packed


@pytest.mark.parametrize("text", ["fc00::1/64", "fc00::/129", "x/64", "fc00::/0x10", "fc00::/\u0666\u0664",
                                  " fc00::/64", "fc00::/-1", "10.0.0.0/8", ""])
def test_a_bad_network_is_ipaddress_s_own_error(text):
    with pytest.raises(ValueError) as want:
        ipaddress.IPv6Network(text)
    with pytest.raises(ValueError) as got:
        ipv6_network(text)
    assert str(got.value) == str(want.value)


@pytest.mark.parametrize("text", ["fc00::", "fc00::/064", "::/0", "::ffff:1.2.3.4/128"])
def test_other_good_forms_are_ipaddress_s_too(text):
    assert ipv6_network(text) == ipaddress.IPv6Network(text)
