"""The scale-up probes' verdict (rlbhost.probes.Prober._judge), on made-up answer times: when a
(peer, plane) is declared down, and when the prober looks again."""
from rlbhost.probes import PlaneHealth, Prober

PORTS = {1: [("eth-p1-1", "02:00:00:00:01:01", "02:00:00:00:00:01")],
         2: [("eth-p2-1", "02:00:00:00:02:01", "02:00:00:00:00:02")]}


def prober(changes: list) -> Prober:
    return Prober(1, "fd00::1", {2: "fd00::2"}, 4792, lambda: PORTS,
                  lambda peer, plane, up: changes.append((peer, plane, up)), interval=0.02, dead_after=0.1)


def health(last_answer: float, unanswered: int) -> PlaneHealth:
    return PlaneHealth(sent=10, answered=10 - unanswered, last_answer=last_answer, unanswered=unanswered)


def test_a_silent_plane_is_down_dead_after_its_last_answer_not_at_the_next_round():
    changes = []
    p = prober(changes)
    p.state = {(2, 1): health(0.0, 5), (2, 2): health(0.095, 0)}
    p._judge(0.09, PORTS)
    assert changes == []
    # the next look is when plane 1's last answer turns 100 ms old, before the round at 0.11
    assert 0.1 < p._next_verdict < 0.1002
    p._judge(p._next_verdict, PORTS)
    assert changes == [(2, 1, False)]
    assert not p.state[(2, 1)].up and p.state[(2, 2)].up


def test_a_peer_silent_on_every_plane_is_busy_not_failed():
    changes = []
    p = prober(changes)
    p.state = {(2, 1): health(0.0, 6), (2, 2): health(0.0, 6)}
    p._judge(0.2, PORTS)
    assert changes == [] and all(st.up for st in p.state.values())


def test_a_stalled_prober_does_not_blame_the_plane():
    """No answer for 150 ms, but only two probes went out meanwhile (this loop stalled): too
    few to say the plane dropped them."""
    changes = []
    p = prober(changes)
    p.state = {(2, 1): health(0.0, 2), (2, 2): health(0.14, 0)}
    p._judge(0.15, PORTS)
    assert changes == []
    p.state[(2, 1)].unanswered = 4
    p._judge(0.16, PORTS)
    assert changes == [(2, 1, False)]


def test_answers_again_bring_the_plane_back_and_a_plane_without_ports_is_down():
    changes = []
    p = prober(changes)
    p.state = {(2, 1): health(0.0, 5), (2, 2): health(0.095, 0)}
    p._judge(0.11, PORTS)
    p.state[(2, 1)].last_answer, p.state[(2, 1)].unanswered = 0.12, 0
    p._judge(0.125, PORTS)
    p._judge(0.13, {2: PORTS[2]})
    assert changes == [(2, 1, False), (2, 1, True), (2, 1, False)]
