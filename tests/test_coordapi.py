"""The coordinator client turns every way a call can fail into CoordinatorError, which the
agents' loops expect: an answer cut short (seen under load: IncompleteRead after a timeout) once
escaped as http.client.IncompleteRead and ended a GPU's agent."""
from __future__ import annotations

import re
import socket
import threading

import pytest

from rlbcommon import coordapi


def read_request(conn: socket.socket) -> bytes:
    """The whole request, headers and body: the client may send them in separate segments, and
    closing with the body unread makes the kernel answer with a reset instead of our reply."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            return data
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = re.search(rb"(?im)^content-length:\s*(\d+)", head)
    want = int(length.group(1)) if length else 0
    while len(body) < want:
        chunk = conn.recv(65536)
        if not chunk:
            break
        body += chunk
    return head + b"\r\n\r\n" + body


def serve_once(reply: bytes) -> str:
    """A server on loopback that answers one request with `reply` and closes."""
    srv = socket.socket(socket.AF_INET6)
    srv.bind(("::1", 0))
    srv.listen(1)

    def answer():
        conn, _ = srv.accept()
        read_request(conn)
        conn.sendall(reply)
        conn.close()
        srv.close()
    threading.Thread(target=answer, daemon=True).start()
    return coordapi.url_for("::1", srv.getsockname()[1])


@pytest.mark.parametrize("reply, says", [
    (b"HTTP/1.1 200 OK\r\nContent-Length: 132\r\n\r\n{\"rails\"", "IncompleteRead"),
    (b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nnope!", "Expecting value"),
    (b"garbage\r\n\r\n", "garbage"),
    (b"HTTP/1.1 409 Conflict\r\nContent-Length: 22\r\n\r\n{\"error\": \"not a GPU\"}", "409 not a GPU"),
], ids=["cut-short", "not-json", "not-http", "refused"])
def test_every_failure_is_a_coordinator_error(reply, says):
    url = serve_once(reply)
    with pytest.raises(coordapi.CoordinatorError, match=says):
        coordapi.call(url, coordapi.GPU_LOAD.format("d1g1"), {"rail": {}}, timeout=2)


def test_an_answer_is_decoded():
    url = serve_once(b"HTTP/1.1 200 OK\r\nContent-Length: 14\r\n\r\n{\"rails\": {}}\n")
    assert coordapi.call(url, coordapi.STATUS) == {"rails": {}}
