"""The verbs socket's reading of one library (rlbhost/verbs/clients.py): whether a read left its
socket empty, and the word when its backlog reaches half of what the socket holds (its library's
sends may have failed past that). A real SEQPACKET pair, no agent."""
from __future__ import annotations

import selectors
import socket

from rlbhost.verbs import clients as C
from rlbhost.verbs import protocol as P


def test_the_room_is_what_a_librarys_socket_takes_before_its_sends_fail():
    # measured, not assumed: a socket set up as the library's is filled with messages of two
    # lengths (a short INIT, a long RTR question) until a send fails, and the room says how many
    room = C.measure_room()
    assert room.sndbuf >= 2 * min(P.C["RLBV_SNDBUF"], 212992)      # at least the kernel's default cap, doubled
    for length in (20, P.MSG_MAX):
        lib, agent = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        with lib, agent:
            lib.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, P.C["RLBV_SNDBUF"])
            lib.setblocking(False)
            sent = 0
            try:
                while True:
                    lib.send(b"x" * length)
                    sent += 1
            except BlockingIOError:
                pass
        # a send goes while what is charged is under the buffer: one more than fit
        assert sent == -(-room.sndbuf // room.charge(length)), (length, sent, room.charge(length))
    assert room.charge(P.MSG_MAX) > room.charge(20)                 # longer messages cost more buffer


def test_a_backlog_half_of_what_the_socket_holds_is_told_at_the_mark_and_at_its_end_and_reads_say_what_is_left(tmp_path):
    full: list[int] = []
    got: list[object] = []
    sel = selectors.DefaultSelector()
    clients = C.Clients(tmp_path / "s", None, sel, {}, lambda c, m: got.append(m),
                        lambda c: None, lambda c: full.append(c.backlog))
    one = clients.room.charge(16)
    clients.full_at = 5 * one                                               # five INITs' worth
    agent, library = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    agent.setblocking(False)
    c = C.Client(agent, 1, 0, None)
    clients.by_sock[agent] = c
    sel.register(agent, selectors.EVENT_READ, c)
    for i in range(8):
        library.send(f"INIT stub0 1 {i}".encode())
    assert clients.read(c, 3) is False and c.backlog == 3 * one and not full   # 5 waiting
    assert clients.read(c, 3) is False and full == [5 * one]                # the fifth read: told
    # 2 read, then empty: told again (the QPs of the INITs read after the mark are as much at risk)
    assert clients.read(c, 3) is True and c.backlog == 0 and full == [5 * one, 8 * one]
    assert [m.qpn for m in got] == list(range(8))
    for i in range(6):                                                      # a second backlog: told again
        library.send(f"INIT stub0 1 {i}".encode())
    assert clients.read(c, 10) is True and full == [5 * one, 8 * one, 5 * one, 6 * one]
    for i in range(4):                                                      # under the mark: never told
        library.send(f"INIT stub0 1 {i}".encode())
    assert clients.read(c, 10) is True and len(full) == 4
    assert clients.read(c, 1) is True                                       # gone: nothing more to read
