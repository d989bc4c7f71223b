"""The seal on the verbs agents' UDP messages (rlbhost/verbs/peerauth.py)."""
from __future__ import annotations

import pytest

from rlbhost.verbs import protocol as P
from rlbhost.verbs.peerauth import WINDOW_MS, Unsealer, seal, split

K1, K2 = bytes(range(16)), bytes(range(16, 32))
MSG = P.PeerMsg("CHECK", 7, 900, "2001:db8::1", 5, "2001:db8::2", 6, frozenset({1, 2}), path=2).encode()


def test_a_sealed_message_opens_to_itself_under_any_of_the_keys():
    sealed = seal(MSG, K2, 1_000_000)
    assert split(sealed)[:2] == (MSG, 1_000_000)
    assert Unsealer().open(sealed, [K1, K2], 1_000_500) == MSG      # the second key: a roll in progress
    assert P.parse_peer(Unsealer().open(sealed, [K2], 1_000_000)).path == 2


@pytest.mark.parametrize("case, reason", [
    ("unsealed", "not sealed"), ("other key", "none of the fabric's keys"), ("changed", "none of the"),
    ("old", "window"), ("ahead", "window")])
def test_what_is_not_the_fabrics_or_not_now_is_refused(case, reason):
    now = 5_000_000
    data = {"unsealed": MSG, "other key": seal(MSG, K2, now),
            "changed": seal(MSG, K1, now).replace(b"CHECK 7", b"CHECK 8"),
            "old": seal(MSG, K1, now - WINDOW_MS - 1), "ahead": seal(MSG, K1, now + WINDOW_MS + 1)}[case]
    with pytest.raises(P.BadMessage, match=reason):
        Unsealer().open(data, [K1], now)


def test_a_copy_is_refused_within_the_window_and_the_memory_of_copies_is_bounded():
    u = Unsealer()
    a, b = seal(MSG, K1, 1000), seal(MSG + b"x", K1, 1000)
    assert u.open(a, [K1], 1000) == MSG
    with pytest.raises(P.BadMessage, match="replay"):
        u.open(a, [K1], 1500)
    assert u.open(b, [K1], 1500) == MSG + b"x"
    for t in range(10_000, 10_100):                 # later traffic: the old tags are forgotten
        u.open(seal(MSG, K1, t), [K1], t)
    assert len(u._seen) == 100


def test_a_host_without_keys_takes_both_while_the_first_key_rolls_out():
    assert Unsealer().open(seal(MSG, K1, 1), [], 10**12) == MSG
    assert Unsealer().open(MSG, [], 10**12) == MSG
