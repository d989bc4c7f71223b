"""The verbs socket's reading of one library (rlbhost/verbs/clients.py): whether a read left its
socket empty, and the word when its backlog reaches half of what the socket holds (its library's
sends may have failed past that). A real SEQPACKET pair, no agent."""
from __future__ import annotations

import selectors
import socket

from rlbhost.verbs import clients as C
from rlbhost.verbs import protocol as P


def test_a_socket_holds_what_the_librarys_buffer_and_the_kernel_cap_allow():
    # RLBV_SNDBUF (1 MB), doubled by the kernel, unless net.core.wmem_max caps it first
    assert C.socket_holds(4 << 20) == 2 * P.C["RLBV_SNDBUF"] // C.MESSAGE_TRUESIZE == 2730
    assert C.socket_holds(212992) == 554            # the kernel's default cap


def test_a_backlog_half_of_what_the_socket_holds_is_told_once_and_reads_say_what_is_left(tmp_path):
    full: list[int] = []
    got: list[object] = []
    sel = selectors.DefaultSelector()
    clients = C.Clients(tmp_path / "s", None, sel, {}, lambda c, m: got.append(m),
                        lambda c: None, lambda c: full.append(c.backlog))
    clients.full_at = 5
    agent, library = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    agent.setblocking(False)
    c = C.Client(agent, 1, 0, None)
    clients.by_sock[agent] = c
    sel.register(agent, selectors.EVENT_READ, c)
    for i in range(8):
        library.send(f"INIT stub0 1 {i}".encode())
    assert clients.read(c, 3) is False and c.backlog == 3 and not full       # 5 still waiting
    assert clients.read(c, 3) is False and full == [5]                      # the fifth read: told
    assert clients.read(c, 3) is True and c.backlog == 0                    # 2 read, then empty
    assert [m.qpn for m in got] == list(range(8)) and full == [5]
    for i in range(6):                                                      # a second backlog: told again
        library.send(f"INIT stub0 1 {i}".encode())
    assert clients.read(c, 10) is True and full == [5, 5]
    library.close()
    assert clients.read(c, 1) is True                                       # gone: nothing more to read
