"""An HTTP server that cannot be made to run unboundedly many requests at once: at most
`max_connections` connections are served (each a thread); one more is answered 503 and closed at
once, never given a thread. Every exposed server of the project is one (the agents' metrics
pages, the coordinator's API)."""
from __future__ import annotations

import logging
import socket
import sys
import threading
from http.server import ThreadingHTTPServer

log = logging.getLogger(__name__)
BUSY = b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"


class BoundedServer(ThreadingHTTPServer):
    daemon_threads = True
    max_connections = 64

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        self.slots = threading.BoundedSemaphore(self.max_connections)

    tls = False                      # over TLS an answer needs the handshake: a refusal just closes

    def refused(self):
        """A connection past the bound: subclasses that export refusals count it here."""

    def process_request(self, request, client_address):
        if not self.slots.acquire(blocking=False):
            self.refused()
            try:
                if not self.tls:
                    request.sendall(BUSY)
            except OSError:
                pass
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except Exception:
            self.slots.release()
            raise

    def process_request_thread(self, request, client_address):
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.slots.release()

    def handle_error(self, request, client_address):
        """A client gone mid-request (a scraper that timed out and closed: a broken pipe, a reset)
        is one debug line, not a traceback on stderr; anything else is logged with its traceback."""
        err = sys.exc_info()[1]
        if isinstance(err, OSError):
            log.debug("connection from %s: %s", client_address[0], err)
        else:
            log.exception("serving %s failed", client_address[0])


def bind_family(addr: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in addr else socket.AF_INET
