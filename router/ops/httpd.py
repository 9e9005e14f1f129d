"""The metrics endpoint's HTTP server, bounded so that no client can take the router's threads or
descriptors (a thread per connection, held for as long as the client stayed idle, once let 200 idle
connections start 200 threads and run the router out of descriptors in ZeroMQ).

One selector thread accepts each connection and reads its request whole (head and body, at most
MAX_REQUEST bytes) within TIMEOUT; only then does one of THREADS handler threads answer it, with
wsgiref, and close (HTTP/1.0: one request per connection, no keep-alive). So an idle or slow client
costs a descriptor for at most TIMEOUT and never a thread. At most CONNECTIONS are open: beyond, the
one that has waited longest for its request is closed to make room (a crowd of idle connections
cannot keep /health from answering), or the new one is, when every open one is being answered.
With an SSL context (the console's HTTPS) the selector thread runs each TLS handshake too, without
blocking, within the same TIMEOUT.
"""

from __future__ import annotations

import contextlib
import io
import re
import selectors
import socket
import ssl
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer

TIMEOUT = 10.0  # seconds a connection has to send its request, and each write of the answer
CONNECTIONS = 64  # open at once, waiting or being answered
THREADS = 4  # answering at once
MAX_REQUEST = 64 * 1024  # bytes, head and body

_LENGTH = re.compile(rb"\r\ncontent-length:[ \t]*(\d+)", re.IGNORECASE)


class _Waiting:
    """A connection whose request has not all arrived."""

    __slots__ = ("address", "data", "deadline", "shaken")

    def __init__(self, address: tuple, deadline: float, shaken: bool) -> None:
        self.address = address
        self.data = bytearray()
        self.deadline = deadline
        self.shaken = shaken  # its TLS handshake is done (or it has none)

    def whole(self) -> bool:
        end = self.data.find(b"\r\n\r\n")
        if end < 0:
            return False
        length = _LENGTH.search(self.data, 0, end + 2)
        return len(self.data) >= end + 4 + (int(length.group(1)) if length else 0)


class _Handler(WSGIRequestHandler):
    """wsgiref's handler over a request already read; quiet (no line per scrape)."""

    timeout = TIMEOUT  # for writing the answer

    def __init__(self, sock: socket.socket, address: tuple, server: Endpoint, data: bytes, extra: dict) -> None:
        self.data = data
        self.extra = extra
        super().__init__(sock, address, server)

    def setup(self) -> None:
        super().setup()
        self.rfile.close()  # else its reference keeps the socket open after close()
        self.rfile = io.BytesIO(self.data)

    def get_environ(self) -> dict:
        """With the requester's port (for the admin log) and the address it reached (`admin.Gate`)."""
        environ = super().get_environ()
        environ["REMOTE_PORT"] = str(self.client_address[1])
        environ["SERVER_ADDR"] = self.connection.getsockname()[0]
        environ.update(self.extra)
        return environ

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - the base class's name
        """No line per scrape."""


class Endpoint(WSGIServer):
    """Serves a WSGI app on `address` (bound and listening once made) from `run`, a thread of its own."""

    request_queue_size = CONNECTIONS

    def __init__(self, address: tuple[str, int], app: Callable, context: ssl.SSLContext | None = None) -> None:
        super().__init__(address, _Handler)  # type: ignore[arg-type]  # the base never makes one: _read does
        self.set_app(app)
        self._context = context  # HTTPS: each connection's handshake first
        self._pool = ThreadPoolExecutor(THREADS, thread_name_prefix="plexmq-http")
        self._selector = selectors.DefaultSelector()
        self._answering = 0  # connections handed to the pool, not yet closed
        self._lock = threading.Lock()

    def run(self) -> None:
        """Accept, read requests, hand whole ones to the pool, close the ones out of time; forever."""
        self.socket.setblocking(False)
        self._selector.register(self.socket, selectors.EVENT_READ)
        while True:
            waiting = self._waiting()
            now = time.monotonic()
            first = min((w.deadline for w in waiting.values()), default=now + TIMEOUT)
            for key, _events in self._selector.select(max(first - now, 0.0)):
                if key.fileobj is self.socket:
                    self._accept()
                else:
                    self._read(key.fileobj, key.data)  # type: ignore[arg-type]  # only sockets are registered
            now = time.monotonic()
            for sock, wait in self._waiting().items():
                if wait.deadline <= now:
                    self._drop(sock)

    def _waiting(self) -> dict[socket.socket, _Waiting]:
        return {key.fileobj: key.data for key in self._selector.get_map().values()  # type: ignore[misc]  # sockets only
                if key.fileobj is not self.socket}

    def _accept(self) -> None:
        try:
            sock, address = self.socket.accept()
        except OSError:  # gone before we took it, or out of descriptors: the next turn tries again
            return
        waiting = self._waiting()
        with self._lock:
            full = len(waiting) + self._answering >= CONNECTIONS
        if full and not waiting:
            sock.close()  # every open one is being answered
            return
        if full:
            self._drop(min(waiting, key=lambda s: waiting[s].deadline))
        sock.setblocking(False)
        if self._context is not None:
            sock = self._context.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
        self._selector.register(sock, selectors.EVENT_READ,
                                _Waiting(address, time.monotonic() + TIMEOUT, self._context is None))

    def _read(self, sock: socket.socket, wait: _Waiting) -> None:
        if not wait.shaken and not self._handshake(sock, wait):  # type: ignore[arg-type]  # TLS: an SSLSocket
            return
        try:
            data = sock.recv(65536)
            while isinstance(sock, ssl.SSLSocket) and sock.pending() and len(data) <= MAX_REQUEST:
                data += sock.recv(65536)  # decrypted already: the selector would not say so
        except (BlockingIOError, ssl.SSLWantReadError, ssl.SSLWantWriteError):
            return
        except OSError:
            data = b""
        wait.data += data
        if not data or len(wait.data) > MAX_REQUEST:
            self._drop(sock)
        elif wait.whole():
            self._selector.unregister(sock)
            sock.setblocking(True)
            with self._lock:
                self._answering += 1
            self._hand(sock, wait.address, bytes(wait.data))

    def _handshake(self, sock: ssl.SSLSocket, wait: _Waiting) -> bool:
        """One step of a TLS handshake: whether it is done (a failed one drops the connection)."""
        try:
            sock.do_handshake()
        except ssl.SSLWantReadError:
            self._selector.modify(sock, selectors.EVENT_READ, wait)
            return False
        except ssl.SSLWantWriteError:
            self._selector.modify(sock, selectors.EVENT_READ | selectors.EVENT_WRITE, wait)
            return False
        except OSError:  # not TLS, a certificate the client refused, gone
            self._drop(sock)
            return False
        wait.shaken = True
        self._selector.modify(sock, selectors.EVENT_READ, wait)
        return True

    def _hand(self, sock: socket.socket, address: tuple, data: bytes) -> None:
        """Give a whole request to a thread that answers it (a subclass may keep threads of its own for
        some requests: router/console/events.py)."""
        self._pool.submit(self._answer, sock, address, data)

    def _answer(self, sock: socket.socket, address: tuple, data: bytes, extra: dict | None = None) -> None:
        """In a pool thread: answer the request (`extra` added to its environ), close the connection."""
        try:
            with contextlib.suppress(OSError):  # the client left, or stopped reading for TIMEOUT
                _Handler(sock, address, self, data, extra or {})
        finally:
            self.shutdown_request(sock)
            with self._lock:
                self._answering -= 1

    def _drop(self, sock: socket.socket) -> None:
        self._selector.unregister(sock)
        sock.close()
