"""Plain TCP connections served from one epoll set per worker instead of a uvloop transport each.

Why: a uvloop transport costs ~1.4 KB of RSS per idle connection and a coroutine and a task per
adopted socket; here a connection costs its socket object, one slotted `SocketTransport` and a dict
slot (~0.4 KB with a one-slot protocol: `python -m plexmq.bench.floor`), and adopting it is a plain call.
The epoll set's own fd is one reader of the uvloop loop, so timers, ZeroMQ and TLS transports run
beside it as before.

Level-triggered: a socket with more to read than one `recv` takes, or ready beyond one batch, comes
round again on the next loop turn, so one busy client cannot hold the loop. The transport speaks the
asyncio `Transport` interface the Connection and the WebSocket adapter use (write, writelines, close,
pause/resume_reading, get_extra_info) and calls back its protocol as asyncio does, connection_lost
always on a later turn.
"""

from __future__ import annotations

import asyncio
import errno
import os
import select
import socket
from collections.abc import Iterable
from typing import Any

READ_SIZE = 65536  # one recv per ready socket and turn; glibc keeps this size off mmap
BATCH = 1024  # ready sockets served per loop turn
CLOSE_TIMEOUT = 10.0  # seconds a closed connection may take to send what it had buffered
LINGER = 1.0  # seconds a closed connection's input is drained, once its output is sent, for the peer to close
MAX_PARTS = 512  # buffers per sendmsg, under the kernel's IOV_MAX (1024)
HIGH_WATER = 64 * 1024  # asyncio's default write buffer limits: pause_writing above, resume at or below
LOW_WATER = 16 * 1024
IN, OUT, ERRORS = select.EPOLLIN, select.EPOLLOUT, select.EPOLLHUP | select.EPOLLERR
_AGAIN = (BlockingIOError, InterruptedError)


class Poller:
    """A worker's plain sockets: fd -> transport, and the epoll set the loop watches for them."""

    __slots__ = ("loop", "epoll", "sockets", "close_timeout", "linger", "stopping")

    def __init__(self, loop: asyncio.AbstractEventLoop, close_timeout: float = CLOSE_TIMEOUT,
                 linger: float = LINGER) -> None:
        self.loop = loop
        self.close_timeout = close_timeout
        self.linger = linger
        self.stopping = False  # the worker stops: a socket closes at once, with no shutdown and no linger
        self.epoll = select.epoll()
        self.sockets: dict[int, SocketTransport] = {}
        loop.add_reader(self.epoll.fileno(), self._ready)

    def serve(self, sock: socket.socket, protocol: asyncio.Protocol) -> SocketTransport:
        """Watch the non-blocking `sock` for `protocol`; connection_made is called before this returns,
        and so is data_received when the client's first packet is there already (as a CONNECT sent
        right after the TCP handshake usually is by the time a worker adopts its socket)."""
        transport = SocketTransport(self, sock, protocol)
        self.sockets[transport.fd] = transport
        self.epoll.register(transport.fd, IN)
        protocol.connection_made(transport)
        if transport.reading:
            transport.read_ready()
        return transport

    def _ready(self) -> None:
        sockets = self.sockets
        for fd, events in self.epoll.poll(0, BATCH):
            transport = sockets.get(fd)
            if transport is None:
                continue  # closed by an earlier socket of this batch
            if events & OUT:
                transport.write_ready()
                if transport.sock is None:
                    continue  # the send failed: a reset, say
            if events & IN and transport.reading:
                transport.read_ready()
            elif transport.draining:
                transport.drain()
            elif events & ERRORS and transport.sock is not None:
                transport.broken()


class SocketTransport(asyncio.Transport):
    """One plain TCP connection of a Poller; buffers what the socket does not take at once."""

    __slots__ = ("poller", "sock", "fd", "protocol", "pending", "size", "reading", "closing", "draining",
                 "writing_paused")

    # no Transport.__init__: no extra dict
    def __init__(self, poller: Poller, sock: socket.socket, protocol: asyncio.Protocol) -> None:
        self.poller = poller
        self.sock: socket.socket | None = sock  # None once closed
        self.fd = sock.fileno()
        self.protocol = protocol
        self.pending: list[bytes | memoryview] = []  # unsent output, in order
        self.size = 0  # bytes in pending
        self.reading = True
        self.closing = False
        self.draining = False  # closed, output sent and shut down: input is read and dropped until the peer closes
        self.writing_paused = False

    # -- the loop's side -------------------------------------------------------------------------------

    def read_ready(self) -> None:
        try:
            data = self.sock.recv(READ_SIZE)  # type: ignore[union-attr]  # None only once closed
        except _AGAIN:
            return
        except OSError as exc:
            return self._finish(exc)
        if not data:
            return self._eof()
        try:
            self.protocol.data_received(data)
        except Exception as exc:  # a bug: say so with its traceback, and lose this connection only
            self._fail(exc, "protocol.data_received() failed")

    def write_ready(self) -> None:
        if not self._send_pending():
            return
        if not self.pending:
            if self.closing:
                return self._shut()
            self._watch()
        if self.writing_paused and self.size <= LOW_WATER:
            self.writing_paused = False
            self._call("resume_writing")

    def drain(self) -> None:
        """Input after the close, dropped; the peer's end of the stream (or an error) finishes it."""
        try:
            data = self.sock.recv(READ_SIZE)  # type: ignore[union-attr]  # None only once closed
        except _AGAIN:
            return
        except OSError:
            data = b""
        if not data:
            self._finish(None)

    def broken(self) -> None:
        """Hang-up or error with nothing to read (or reading paused): the peer is gone."""
        code = self.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) or errno.ECONNRESET  # type: ignore[union-attr]  # None only once closed
        self._finish(OSError(code, os.strerror(code)))

    # -- the protocol's side ---------------------------------------------------------------------------

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if self.closing or not data:
            return
        if self.pending:
            self.pending.append(bytes(data) if isinstance(data, bytearray) else data)
            self.size += len(data)
        else:
            try:
                sent = self.sock.send(data)  # type: ignore[union-attr]  # None only once closed
            except _AGAIN:
                sent = 0
            except OSError as exc:
                return self._finish(exc)
            if sent == len(data):
                return
            self.pending.append(memoryview(bytes(data) if isinstance(data, bytearray) else data)[sent:])
            self.size = len(data) - sent
            self._watch()
        self._check_high_water()

    def writelines(self, parts: Iterable[bytes | bytearray | memoryview]) -> None:
        """One sendmsg (writev) for all parts, copying none unless the socket does not take them all."""
        if self.closing:
            return
        idle = not self.pending
        for part in parts:
            if part:
                self.pending.append(bytes(part) if isinstance(part, bytearray) else part)
                self.size += len(part)
        if idle and self.pending and self._send_pending() and self.pending:
            self._watch()
        self._check_high_water()

    def close(self) -> None:
        """Stop reading; once what is buffered has been sent, shut down writing and drain the input
        until the peer closes too, or for the Poller's linger: a socket closed with input unread is
        reset by the kernel, and the peer may lose what came last (a DISCONNECT with its reason).
        It closes after the Poller's close_timeout all the same (a client that never reads must not
        hold its descriptor)."""
        if self.closing:
            return
        self.closing = True
        self.reading = False
        if self.poller.stopping:  # the process exits next: what is buffered is tried once, no one waits
            if self.pending:
                self._send_pending()
            return self._finish(None)
        if self.pending:
            self._watch()
            self.poller.loop.call_later(self.poller.close_timeout, self.abort)
        else:
            self._shut()

    def abort(self) -> None:
        self.closing = True
        self._finish(None)

    def is_closing(self) -> bool:
        return self.closing

    def pause_reading(self) -> None:
        if self.reading:
            self.reading = False
            self._watch()

    def resume_reading(self) -> None:
        if not self.reading and not self.closing:
            self.reading = True
            self._watch()

    def is_reading(self) -> bool:
        return self.reading

    def get_write_buffer_size(self) -> int:
        return self.size

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        sock = self.sock
        if sock is None:
            return default
        try:
            if name == "peername":
                return sock.getpeername()
            if name == "sockname":
                return sock.getsockname()
        except OSError:
            return default
        return sock if name == "socket" else default

    # -- inside ----------------------------------------------------------------------------------------

    def _send_pending(self) -> bool:
        """Send what is buffered, as much as the socket takes (one sendmsg: no copy of the buffer), and
        keep the rest; False when the socket failed (the connection is finished)."""
        pending = self.pending
        try:
            sent = self.sock.sendmsg(pending[:MAX_PARTS])  # type: ignore[union-attr]  # None only once closed
        except _AGAIN:
            return True
        except OSError as exc:
            self._finish(exc)
            return False
        self.size -= sent
        done = 0
        for part in pending:
            if sent < len(part):
                break
            sent -= len(part)
            done += 1
        del pending[:done]
        if sent:
            pending[0] = memoryview(pending[0])[sent:]
        return True

    def _watch(self) -> None:
        """Tell epoll what this socket waits for now."""
        if self.sock is not None:
            self.poller.epoll.modify(self.fd, (IN if self.reading or self.draining else 0) | (OUT if self.pending else 0))

    def _shut(self) -> None:
        """A closed connection's output is all sent: shut down writing (the peer reads its end after
        it), then drain (`close`)."""
        try:
            self.sock.shutdown(socket.SHUT_WR)  # type: ignore[union-attr]  # None only once closed
        except OSError:
            return self._finish(None)
        self.draining = True
        self._watch()
        self.poller.loop.call_later(self.poller.linger, self.abort)

    def _check_high_water(self) -> None:
        if not self.writing_paused and self.size > HIGH_WATER:
            self.writing_paused = True
            self._call("pause_writing")

    def _eof(self) -> None:
        self.reading = False
        self._watch()
        try:
            keep_open = self.protocol.eof_received()
        except Exception as exc:
            return self._fail(exc, "protocol.eof_received() failed")
        if not keep_open:
            self.close()  # else the protocol keeps writing

    def _call(self, callback: str) -> None:
        """The protocol's pause_writing or resume_writing: one that raises loses its connection."""
        try:
            getattr(self.protocol, callback)()
        except Exception as exc:
            self._fail(exc, f"protocol.{callback}() failed")

    def _fail(self, exc: Exception, message: str) -> None:
        self.poller.loop.call_exception_handler({"message": message, "exception": exc, "transport": self,
                                                 "protocol": self.protocol})
        self._finish(exc)

    def _finish(self, exc: Exception | None) -> None:
        """Close the socket now; the protocol hears of it on the next turn."""
        sock = self.sock
        if sock is None:
            return
        self.sock = None
        self.closing = True
        self.reading = False
        self.pending.clear()
        self.size = 0
        poller = self.poller
        del poller.sockets[self.fd]
        poller.epoll.unregister(self.fd)
        sock.close()
        poller.loop.call_soon(self.protocol.connection_lost, exc)
