"""A TCP relay in front of a local server (etcd in the tests) that keeps every byte each way, and
can hold each whole HTTP request from the client for a while before passing it on: the
management network an agent's traffic crosses, or an etcd on an overloaded machine."""
from __future__ import annotations

import socket
import threading
import time


class Relay:
    def __init__(self, target_port: int, host: str = "127.0.0.1", hold_s: float = 0.0):
        self.target, self.hold_s = target_port, hold_s
        self.seen = bytearray()
        self.held = 0                         # requests held
        self.lock = threading.Lock()
        self.sock = socket.socket()
        self.sock.bind((host, 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        self.url = f"http://{host}:{self.port}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                a, _ = self.sock.accept()
            except OSError:
                return
            try:
                b = socket.create_connection(("127.0.0.1", self.target))
            except OSError:                   # the server stopped (a module's end)
                a.close()
                continue
            threading.Thread(target=self._pipe, args=(a, b, self.hold_s), daemon=True).start()
            threading.Thread(target=self._pipe, args=(b, a, 0.0), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket, hold_s: float):
        buf = b""
        try:
            while data := src.recv(65536):
                with self.lock:
                    self.seen += data
                if not hold_s:
                    dst.sendall(data)
                    continue
                buf += data
                while (request := _whole_request(buf)) is not None:
                    buf = buf[len(request):]
                    self.held += 1
                    time.sleep(hold_s)
                    dst.sendall(request)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self):
        self.sock.close()


def _whole_request(buf: bytes) -> bytes | None:
    """The first whole HTTP request in buf (headers and Content-Length's body), or None yet."""
    end = buf.find(b"\r\n\r\n")
    if end < 0:
        return None
    length = next((int(h.split(b":", 1)[1]) for h in buf[:end].lower().split(b"\r\n")
                   if h.startswith(b"content-length:")), 0)
    return buf[:end + 4 + length] if len(buf) >= end + 4 + length else None
