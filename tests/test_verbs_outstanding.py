"""The agents' messages waiting on a peer (rlbhost/verbs/outstanding.py) and how several travel in
one datagram (protocol.pack_peer): pure, no namespaces."""
from rlbhost.verbs import protocol as P
from rlbhost.verbs.outstanding import (NOTIFY_FAST_NS, NOTIFY_SLOW_NS, RESEND_NS, STEADY_COPIES, Outstanding, Pending,
                                       PeerClock)

MS = 1_000_000


def ask(mid: int, peer: str = "2001:db8::2") -> P.PeerMsg:
    return P.PeerMsg("ASK", mid, 900, "2001:db8::1", 5, peer, 6, frozenset({1, 2}))


def test_a_quiet_peer_is_asked_again_every_2_ms_and_a_slow_one_at_its_round_trip():
    c = PeerClock()
    assert c.interval() == RESEND_NS                      # nothing known yet
    for _ in range(20):
        c.sample(300_000)                                 # 0.3 ms answers: the floor
    assert c.interval() == RESEND_NS
    for _ in range(40):
        c.sample(10 * MS)                                 # a peer 10 ms behind
    assert 10 * MS <= c.interval() < 14 * MS
    for _ in range(200):
        c.sample(10 * 1000 * MS)
    assert c.interval() == NOTIFY_SLOW_NS                 # never longer than the slow interval


def test_an_answer_to_any_copy_ends_the_wait_and_times_that_copy():
    o, answered = Outstanding(), []
    p = o.add(Pending(ask(1), "2001:db8::2", 20 * MS, answered.append), now=0)
    assert len(o) == 1 and o.next_due() == RESEND_NS
    assert o.due(RESEND_NS - 1) == []
    [again] = o.due(RESEND_NS)
    copy = o.resend(again, RESEND_NS)
    assert copy.id != 1 and o.get(1) is p and o.get(copy.id) is p and p.first_id == 1
    assert o.next_due() == 2 * RESEND_NS
    # the first copy's answer arrives late (3 ms): its round trip is 3 ms, not 1 ms from the second
    assert o.answered(1, 3 * MS) is p
    assert o.clock("2001:db8::2").srtt == 3 * MS
    assert len(o) == 0 and o.get(copy.id) is None and o.next_due() is None and o.due(10**12) == []


def test_a_message_past_its_deadline_comes_back_once_no_longer_waiting():
    o = Outstanding()
    o.add(Pending(ask(1), "p", 5 * MS, None), now=0)
    o.add(Pending(ask(2), "p", 50 * MS, None), now=0)
    got = []
    t = 0
    while t <= 6 * MS:
        for p in o.due(t):
            got.append((t, p.first_id, p.done))
            if not p.done:
                o.resend(p, t)
        t += MS // 2
    expired = [g for g in got if g[2]]
    assert expired == [(5 * MS, 1, True)]
    assert len(o) == 1 and o.get(1) is None


def test_copies_of_a_notification_slow_down_once_no_library_can_be_waiting():
    o = Outstanding()
    p = o.add(Pending(P.PeerMsg("USED", 1, a_base="a", b_base="b", path=1), "p", 3000 * MS, None), now=0)
    t, gaps, last = 0, [], 0
    while t < 1000 * MS:
        t = o.next_due()
        [q] = o.due(t)
        o.resend(q, t)
        gaps.append(t - last)
        last = t
    assert set(gaps[:NOTIFY_FAST_NS // RESEND_NS]) == {RESEND_NS}
    later = gaps[NOTIFY_FAST_NS // RESEND_NS + 1:]
    assert later[:3] == [4 * MS, 8 * MS, 16 * MS] and max(later) == NOTIFY_SLOW_NS
    assert len(p.copies) == len(gaps) + 1


def copies_sent(o: Outstanding, p: Pending) -> list[int]:
    """When each copy of p goes out (steady: the first too, by resend) until its deadline."""
    out = []
    while (t := o.next_due()) is not None:
        for q in o.due(t):
            if not q.done:
                o.resend(q, t)
                out.append(t)
    return out


def test_a_steady_question_goes_after_one_interval_and_never_slows_down():
    """HAS (a library waiting on it): to a quiet peer every 2 ms from 2 ms on, the whole of its
    80 ms, where a notification slows down after 40 ms."""
    o = Outstanding()
    has = P.PeerMsg("HAS", 1, 80_000, "2001:db8::1", 5, "2001:db8::2", 6, path=3)
    p = o.add(Pending(has, "2001:db8::2", 80 * MS, None, steady=True), now=0)
    sent = copies_sent(o, p)
    assert sent[0] == RESEND_NS and set(b - a for a, b in zip(sent, sent[1:])) == {RESEND_NS}
    assert len(sent) == 80 * MS // RESEND_NS - 1 and len(o) == 0


def test_a_steady_question_to_a_slow_peer_still_goes_several_times_in_its_time():
    """A peer whose round trip reads 60 ms (a burst) would be sent one copy in an 80 ms wait at its
    interval: a steady question goes at least STEADY_COPIES times."""
    o = Outstanding()
    for _ in range(40):
        o.clock("p").sample(60 * MS)
    assert o.clock("p").interval() >= 60 * MS
    p = o.add(Pending(P.PeerMsg("HAS", 1, path=1), "p", 80 * MS, None, steady=True), now=0)
    sent = copies_sent(o, p)
    assert len(sent) >= STEADY_COPIES and sent[0] == 10 * MS


def test_messages_for_one_peer_pack_into_datagrams_in_order_within_the_limit():
    msgs = [ask(i).encode() for i in range(40)]
    bodies = P.pack_peer(msgs, 1000)
    assert len(bodies) > 1 and all(len(b) <= 1000 for b in bodies)
    assert [m for b in bodies for m in P.unpack_peer(b)] == msgs
    assert P.pack_peer([], 1000) == []
    assert P.pack_peer([msgs[0]], 1000) == [msgs[0]]


def test_every_peer_message_reads_back_as_it_was_written():
    """The agents' messages, HAS (a waiting library's question) among them, survive the text."""
    a, b = "2001:db8::1", "2001:db8::2"
    for m in (P.PeerMsg("ASK", 7, 900, a, 5, b, 6, frozenset({1, 2})),
              P.PeerMsg("CHECK", 7, 900, a, 5, b, 6, frozenset({1}), path=1),
              P.PeerMsg("HAS", 7, 60_000, a, 5, b, 6, path=3),
              P.PeerMsg("CONFIRM", 7, a_base=a, a_qpn=5, b_base=b, b_qpn=6, path=3),
              P.PeerMsg("USED", 7, a_base=a, a_qpn=5, b_base=b, b_qpn=6, keep=P.KEEP["timeout"]),
              P.PeerMsg("REPLY", 7, verdict="YES", path=3),
              P.PeerMsg("REPLY", 7, verdict="KEEP", keep=P.KEEP["busy"])):
        assert P.parse_peer(m.encode()) == m
    assert P.PeerMsg("HAS", 7, 60_000, a, 5, b, 6, path=3).encode() == f"HAS 7 60000 {a} 5 {b} 6 3".encode()
