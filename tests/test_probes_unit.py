"""The probes' verdict (rlbhost.probes.Prober), driven round by round with a clock of the test's
own: no sockets (frames are not sent), answers handed in as the receive loop would."""
from rlbhost.probes import DEAD_MS, INTERVAL_MS, SETTLE_S, Prober

INTERVAL, DEAD = INTERVAL_MS / 1000, DEAD_MS / 1000      # the agent's defaults
PORTS = {plane: [(f"eth-p{plane}-1", "02:00:00:00:00:0%d" % plane, "02:00:00:00:01:01")] for plane in (1, 2, 3, 4)}


def prober():
    changes = []
    p = Prober(1, "fc00:0:ff::1", {2: "fc00:0:ff::2"}, 4792, lambda: PORTS,
               lambda peer, plane, up: changes.append((peer, plane, up)), INTERVAL, DEAD)
    p._send = lambda *a: True
    return p, changes


def answer(p, plane, seq, now):
    p._answered(p.state[(2, plane)], seq, now, 0.001)


def rounds(p, t, n, answering=tuple(PORTS)):
    """n probe rounds from time t, the given planes answering each 1 ms after it; the time after."""
    for _ in range(n):
        p._round(t)
        for plane in answering:
            answer(p, plane, p._seq, t + 0.001)
        t += INTERVAL
    return t


def test_a_peer_back_from_a_stall_is_not_judged_silent_on_the_planes_it_answers_last():
    """The lab's false downs: the peer stalls past dead_after, then answers its backlog plane
    after plane; the round judging between the first plane's answer and the others' took the
    others down (3 planes of 4 at once, back 40 ms later)."""
    p, changes = prober()
    t = rounds(p, 0.0, 10)                      # healthy: every plane answers every round
    t = rounds(p, t, 8, answering=())           # the peer stalls 160 ms: nothing answered
    stalled = p._seq
    answer(p, 1, stalled - 7, t)                # its backlog: plane 1 first ...
    p._round(t)                                 # ... a round judges here
    for plane in (2, 3, 4):
        answer(p, plane, stalled - 7, t + 0.0001)
    t += INTERVAL
    p._round(t)
    assert changes == []


def test_a_plane_silent_alone_is_judged_down_within_dead_after_and_an_interval():
    """A silent failure in a plane's middle: plane 2 stops answering, the others go on."""
    p, changes = prober()
    t = rounds(p, 0.0, 10)
    failed_at = t - INTERVAL + 0.002            # just after plane 2's last answer
    down_at = None
    while down_at is None and t < 1.0:
        p._round(t)
        if (2, 2, False) in changes:
            down_at = t
        for plane in (1, 3, 4):
            answer(p, plane, p._seq, t + 0.001)
        t += INTERVAL
    assert down_at is not None and down_at - failed_at <= DEAD + INTERVAL
    assert changes == [(2, 2, False)]
    p._round(t)                                 # it answers again: up at the next round
    answer(p, 2, p._seq, t + 0.001)
    p._round(t + INTERVAL)
    assert changes == [(2, 2, False), (2, 2, True)]


def test_a_peer_silent_on_every_plane_is_not_a_plane_failure():
    p, changes = prober()
    t = rounds(p, 0.0, 10)
    rounds(p, t, 50, answering=())
    assert changes == []


def test_a_plane_judged_silent_comes_back_only_on_an_answer_of_its_own():
    """In the loaded lab the other planes' answers went stale for a round or two while plane 2
    was still dropping: 'no one else answers' put it back in use (9 flips in 2 s, and the QPs
    moved onto the dead plane each time). Only plane 2's own answer brings it back."""
    p, changes = prober()
    t = rounds(p, 0.0, 10)
    t = rounds(p, t, 8, answering=(1, 3, 4))    # plane 2 silent: judged down
    assert changes == [(2, 2, False)]
    t = rounds(p, t, 5, answering=())           # the peer's other answers late by 100 ms
    assert changes == [(2, 2, False)]
    answer(p, 2, p._seq, t)
    p._round(t + 0.001)
    assert changes == [(2, 2, False), (2, 2, True)]


def test_a_starting_peer_answering_plane_by_plane_is_not_judged_but_a_plane_that_never_answers_is():
    """A peer's echo appears port by port as its agent attaches (tens of ms apart on a loaded
    host): planes not yet answering are not silent failures; one still silent after the others
    have answered for the grace is."""
    p, changes = prober()
    t = rounds(p, 0.0, 10, answering=())        # the peer not attached yet: nothing answers
    t = rounds(p, t, 4, answering=(1,))         # plane 1's echo first, for 80 ms
    t = rounds(p, t, 10, answering=(1, 2, 3))   # then 2 and 3; plane 4 never
    assert changes == []
    while t < 0.5 + p.startup_grace and not changes:
        t = rounds(p, t, 1, answering=(1, 2, 3))
    assert changes == [(2, 4, False)]


def test_a_verdict_whose_change_failed_is_made_again_next_round():
    """The GPU agent's probe thread used to die when applying a verdict raised (a map write
    failing): the plane stayed as it was for good. Now the verdict stands only once applied."""
    p, changes = prober()
    calls = []

    def flaky(peer, plane, up):
        calls.append((peer, plane, up))
        if len(calls) == 1:
            raise OSError("map update failed")
        changes.append((peer, plane, up))

    p.on_change = flaky
    t = rounds(p, 0.0, 10)
    failed = False
    while (2, 2, False) not in changes and t < 2.0:
        try:
            p._round(t)
        except OSError:
            failed = True
        for plane in (1, 3, 4):
            answer(p, plane, p._seq, t + 0.001)
        t += INTERVAL
    assert failed and calls[0] == (2, 2, False) and changes == [(2, 2, False)]


def test_a_probe_socket_bound_to_a_removed_port_is_bound_again():
    """A port removed and re-created keeps its name but not its ifindex: a socket bound before
    sends into nothing. A send that fails drops the socket; the next binds to the port as it is."""
    class DeadSocket:
        closed = False

        def send(self, frame):
            raise OSError(6, "No such device or address")

        def close(self):
            self.closed = True

    p = Prober(1, "fc00:0:ff::1", {2: "fc00:0:ff::2"}, 4792, lambda: PORTS, lambda *a: None, INTERVAL, DEAD)
    dead = p._raw["eth-p1-1"] = DeadSocket()
    p._heads[("eth-p1-1", "02:00:00:00:00:01", "fc00:0:ff::2")] = b"\0" * 62
    assert not p._send("eth-p1-1", "02:00:00:00:00:01", "02:00:00:00:01:01", "fc00:0:ff::2", 1, 1, 0)
    assert dead.closed and "eth-p1-1" not in p._raw
    # no such port here at all: binding fails quietly and nothing is kept
    assert not p._send("eth-nope", "02:00:00:00:00:01", "02:00:00:00:01:01", "fc00:0:ff::2", 1, 1, 0)
    assert "eth-nope" not in p._raw


def test_probe_key_files_are_read_checked_and_reread_when_they_change(tmp_path):
    import os
    import pytest
    from rlbhost.probekeys import KeyFile, ProbeKeyError
    path = tmp_path / "probe-key"
    kf = KeyFile(path)
    assert kf.keys == []                                   # no file: unsigned, the agent warns
    path.write_text("00" * 16 + "\n")
    os.chmod(path, 0o600)
    assert kf.refresh() and kf.keys == [bytes(16)] and not kf.refresh()
    path.write_text("11" * 16 + "\n" + "00" * 16 + "\n")   # a roll: the new key signs, both count
    assert kf.refresh() and kf.keys == [b"\x11" * 16, bytes(16)]
    os.chmod(path, 0o644)
    with pytest.raises(ProbeKeyError, match="chmod 600"):
        KeyFile(path)
    os.chmod(path, 0o600)
    path.write_text("not-hex\n")
    with pytest.raises(ProbeKeyError, match="32 hexadecimal digits"):
        KeyFile(path)


def test_hold_a_key_file_that_goes_away_at_run_time_keeps_its_keys_and_says_so(tmp_path):
    """Removing or emptying the file under a running agent is a fault (counted, alerted), not a
    silent switch to unsigned messages; putting it back clears it."""
    import os
    from rlbhost.probekeys import KeyFile
    path = tmp_path / "probe-key"
    path.write_text("00" * 16 + "\n")
    os.chmod(path, 0o600)
    kf = KeyFile(path)
    path.unlink()
    assert not kf.refresh() and kf.keys == [bytes(16)] and kf.missing
    path.write_text("")
    os.chmod(path, 0o600)
    assert not kf.refresh() and kf.keys == [bytes(16)] and kf.missing
    path.write_text("22" * 16 + "\n")
    assert kf.refresh() and kf.keys == [b"\x22" * 16] and not kf.missing and not kf.bad
    # half edited: refused, the keys read before kept, and still bad when reread unchanged
    import pytest
    from rlbhost.probekeys import ProbeKeyError
    path.write_text("22" * 8 + "\n")
    with pytest.raises(ProbeKeyError):
        kf.refresh()
    assert kf.keys == [b"\x22" * 16] and kf.bad
    assert not kf.refresh() and kf.bad
    path.write_text("33" * 16 + "\n")
    assert kf.refresh() and kf.keys == [b"\x33" * 16] and not kf.bad


SUBPORTS = {plane: [(f"eth-p{plane}-{k}", "02:00:00:00:0%d:0%d" % (k, plane), "02:00:00:00:01:01") for k in (1, 2)]
            for plane in (1, 2, 3, 4)}


def subport_prober(live: dict, sent: list):
    changes = []
    p = Prober(1, "fc00:0:ff::1", {2: "fc00:0:ff::2"}, 4792, lambda: live,
               lambda peer, plane, up: changes.append((peer, plane, up)), INTERVAL, DEAD)
    p._send = lambda ifname, *a: sent.append(ifname) or ifname not in p.dead_ports
    p.dead_ports = set()
    return p, changes


def test_a_sub_port_lost_under_a_plane_is_no_silent_failure_while_its_switch_catches_up():
    """The CI failure: g1 loses one of plane 2's two sub-ports; its switch goes on sending the
    answers into the dead sub-link for 100 ms (its agent loaded), so plane 2 answers nothing;
    the plane must stay in use (it still has a sub-port), then be judged silently dead only if
    it stays quiet past the settling time."""
    live, sent = {k: list(v) for k, v in SUBPORTS.items()}, []
    p, changes = subport_prober(live, sent)
    t = rounds(p, 0.0, 10)
    live[2] = live[2][1:]                          # eth-p2-1 lost: the port leaves at once
    lost = t
    t = rounds(p, t, 5, answering=(1, 3, 4))       # 100 ms with nothing back over plane 2
    while t < lost + SETTLE_S:
        t = rounds(p, t, 1)
    assert changes == []
    # later, plane 2's last sub-port fails silently: judged down as any silent plane is
    start = t
    while (2, 2, False) not in changes and t < start + 1.0:
        t = rounds(p, t, 1, answering=(1, 3, 4))
    assert (2, 2, False) in changes and t - start <= DEAD + 3 * INTERVAL


def test_a_probe_that_cannot_leave_tries_the_planes_other_port_and_never_counts_against_it():
    """eth-p2-1 went down before the agent noticed: sending on it fails, so the probe leaves by
    eth-p2-2 (and is answered); with no port of plane 3 able to send, its probes are not counted
    as unanswered at all."""
    live, sent = {k: list(v) for k, v in SUBPORTS.items()}, []
    p, changes = subport_prober(live, sent)
    t = rounds(p, 0.0, 5)
    p.dead_ports = {"eth-p2-1", "eth-p3-1", "eth-p3-2"}
    before = p.state[(2, 3)].sent
    sent.clear()
    t = rounds(p, t, 10, answering=(1, 2, 4))
    assert changes == []
    assert sent.count("eth-p2-2") == 10            # every round's plane-2 probe, by the live port
    assert p.state[(2, 3)].sent == before and p.state[(2, 3)].unanswered == 0
