"""Opening connections fast: the TCP connect and CONNECT/CONNACK on plain non-blocking sockets.

Why not `loop.create_connection` for everything: it costs ~50-90 µs of Python and uvloop per
connection (a coroutine, futures, a transport), which made the generator, not the broker, the
bottleneck of a connect storm, and an idle client does not need a transport at all. Here a handshake
is a few socket calls and two loop callbacks; idle (`conn`) clients stay plain sockets with one reader
callback (PINGRESP, or the broker closing them), and only publishers and subscribers are then wrapped
in a uvloop transport (`create_connection(sock=...)`). Concurrency (`--max-pending`), the rate and
the timeout are one counter, one schedule and one sweep per process, never a task per connection.
"""

from __future__ import annotations

import asyncio
import errno
import socket
from time import monotonic
from typing import TYPE_CHECKING

from plexmq.bench import limits, wire
from plexmq.mqtt.framing import MalformedPacket, frame

if TYPE_CHECKING:
    from plexmq.bench.agent import Agent
    from plexmq.bench.client import Client

CONNECTING, HANDSHAKE, WRAPPING, READY, DONE = range(5)
PINGRESP = 0xD0
CONNACK = 0x20
DISCONNECT = 0xE0


def start_connect(address: tuple[str, int], source: str | None) -> tuple[socket.socket, int]:
    """A non-blocking TCP socket, bound to `source` if given, and what its connect_ex(address) said
    (0, EINPROGRESS or an errno); an OSError before that closes the socket and is raised."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setblocking(False)
        if source:  # bind first; the kernel picks the port per 4-tuple at connect
            sock.setsockopt(socket.SOL_IP, limits.IP_BIND_ADDRESS_NO_PORT, 1)
            sock.bind((source, 0))
        return sock, sock.connect_ex(address)
    except OSError:
        sock.close()
        raise


class Raw:
    """One connection until it is ready; an idle client's whole life."""

    __slots__ = ("buf", "client", "connector", "fd", "gid", "index", "sock", "state", "t0")

    def __init__(self, connector: Connector, client: Client | None, index: int, gid: int) -> None:
        self.connector = connector
        self.client = client  # the pub/sub protocol to hand the socket to, None for an idle client
        self.index = index
        self.gid = gid
        self.sock: socket.socket | None = None
        self.fd = -1
        self.state = CONNECTING
        self.t0 = 0.0
        self.buf = b""

    def begin(self) -> None:
        connector = self.connector
        self.t0 = monotonic()
        sources = connector.sources
        try:
            sock, err = start_connect(connector.address_of(self), sources[self.gid % len(sources)] if sources else None)
            self.sock = sock
        except OSError as exc:
            connector.agent.connect_error(exc)
            self.fail(errno.errorcode.get(exc.errno or 0, type(exc).__name__))
            return
        self.fd = sock.fileno()
        if err == 0:
            self._writable()
        elif err == errno.EINPROGRESS:
            connector.loop.add_writer(self.fd, self._writable)
        else:
            connector.agent.connect_error(OSError(err, ""))
            self.fail(errno.errorcode.get(err, str(err)))

    def _writable(self) -> None:
        loop, sock = self.connector.loop, self.sock
        assert sock is not None  # until _wrap hands it over
        loop.remove_writer(self.fd)
        err = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
        if err:
            self.connector.agent.connect_error(OSError(err, ""))
            self.fail(errno.errorcode.get(err, str(err)))
            return
        self.state = HANDSHAKE
        try:
            sock.send(self.connector.connect_packet(self))
        except OSError as exc:
            self.fail(errno.errorcode.get(exc.errno or 0, "send_failed"))
            return
        loop.add_reader(self.fd, self._readable)

    def _readable(self) -> None:
        assert self.sock is not None  # until _wrap hands it over
        try:
            data = self.sock.recv(4096)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self._closed(errno.errorcode.get(exc.errno or 0, "recv_failed"))
            return
        if not data:
            self._closed("closed_by_broker")
            return
        if self.buf:
            data, self.buf = self.buf + data, b""
        pos = 0
        level = self.connector.level
        try:
            while pos < len(data):
                found = frame(data, pos, 1 << 16)
                if found is None:
                    self.buf = data[pos:]
                    return
                first, start, pos = found
                if first == PINGRESP and self.state == READY:
                    self.connector.agent.pongs += 1
                elif first & 0xF0 == CONNACK and self.state == HANDSHAKE:
                    self._connack(wire.connack(level, first & 0x0F, data[start:pos])[1])
                    if self.state != READY:
                        return
                elif first & 0xF0 == DISCONNECT:
                    code = wire.disconnect_reason(level, first & 0x0F, data[start:pos])
                    self.connector.agent.note(f"the broker disconnected a client: {wire.describe(code)}")
                    self._closed(f"disconnect_{code:#04x}")
                    return
                else:
                    raise MalformedPacket(f"unexpected packet (first byte {first:#04x})")
        except MalformedPacket as exc:
            self.connector.agent.note(f"protocol error: {exc}")
            self.connector.agent.protocol_errors += 1
            self._closed("protocol_error")

    def _connack(self, code: int) -> None:
        if code:
            self.fail(f"connack_refused_{code}")
        elif self.client is None:
            self.state = READY
            self.connector.agent.on_ready(None)
            self.connector.finished(self)
        else:  # a publisher or subscriber: hand the socket to its protocol
            self.state = WRAPPING
            self.connector.loop.remove_reader(self.fd)
            self.connector.loop.create_task(self._wrap())

    async def _wrap(self) -> None:
        client = self.client
        assert client is not None  # only a publisher's or subscriber's socket is wrapped
        try:
            await self.connector.loop.create_connection(lambda: client, sock=self.sock)
        except (OSError, AttributeError, TypeError) as exc:  # closed meanwhile (timeout): sock gone
            self.fail(errno.errorcode.get(getattr(exc, "errno", 0) or 0, "wrap_failed"))
            return
        self.sock, self.fd = None, -1  # the transport owns the socket now
        if self.state == DONE and client.transport is not None:
            client.transport.abort()
        # the client calls agent.on_ready / agent.fail once it is ready (after SUBACK for a subscriber)

    def _closed(self, kind: str) -> None:
        if self.state == READY:
            self.connector.agent.dropped_idle(self, kind)
            self.close()
            self.state = DONE
        else:
            self.fail(kind)

    def fail(self, kind: str) -> None:
        """Count the failure by cause, release the socket, let the next connection start."""
        if self.state in (READY, DONE):
            return
        self.connector.agent.count_failure(kind)
        if self.client is not None and self.client.transport is not None:
            self.client.transport.abort()
        self.close()
        self.state = DONE
        self.connector.finished(self)

    def ping(self, packet: bytes) -> bool:
        if self.sock is None:
            return False
        try:
            self.sock.send(packet)
            return True
        except OSError:
            return False

    def close(self) -> None:
        sock, self.sock = self.sock, None
        if sock is None:
            return
        if self.fd >= 0:
            self.connector.loop.remove_reader(self.fd)
            self.connector.loop.remove_writer(self.fd)
        sock.close()
        self.fd = -1


class Connector:
    """Opens a list of connections with at most `max_pending` handshakes in flight, at `rate`/s."""

    def __init__(self, agent: Agent, raws: list[Raw], rate: float, max_pending: int, timeout: float,
                 sources: list[str]) -> None:
        self.agent = agent
        self.loop = agent.loop
        self.raws = raws
        self.address = (agent.opts.host, agent.opts.port)
        self.ports = agent.opts.ports
        self.rate = rate
        self.max_pending = max(1, max_pending)
        self.timeout = timeout
        self.sources = sources
        self.next = 0
        self.inflight: set[Raw] = set()
        self.filling = False
        self.refill_at: asyncio.TimerHandle | None = None
        self.done: asyncio.Future[None] = self.loop.create_future()
        self.t0 = 0.0
        self._keepalive = agent.opts.keepalive
        self.level = agent.opts.protocol

    def address_of(self, raw: Raw) -> tuple[str, int]:
        """Where `raw` connects: the broker, or with several ports (nodes) the one its index picks."""
        ports = self.ports
        if not ports:
            return self.address
        shift = raw.client is not None and raw.client.role == "s"
        return self.address[0], ports[(raw.index + shift) % len(ports)]

    def connect_packet(self, raw: Raw) -> bytes:
        opts = self.agent.opts
        role = raw.client.role if raw.client is not None else "c"
        return wire.connect(self.level, opts.client_id(self.agent.run_id, role, raw.index), opts.clean_session(role),
                            self._keepalive, opts.username or None)

    async def run(self) -> None:
        self.t0 = self.loop.time()
        self._fill()
        self._sweep()
        await self.done

    def _fill(self) -> None:
        if self.filling:
            return
        self.filling = True
        try:
            raws = self.raws
            while len(self.inflight) < self.max_pending and self.next < len(raws):
                if self.agent.stop_opening:
                    self.agent.not_attempted += len(raws) - self.next
                    self.next = len(raws)
                    break
                if self.rate:
                    due = self.t0 + self.next / self.rate
                    if due > self.loop.time():
                        if self.refill_at is None:
                            self.refill_at = self.loop.call_at(due, self._refill)
                        return
                raw = raws[self.next]
                self.next += 1
                self.inflight.add(raw)
                raw.begin()
            if not self.inflight and self.next >= len(raws) and not self.done.done():
                self.done.set_result(None)
        finally:
            self.filling = False

    def _refill(self) -> None:
        self.refill_at = None
        self._fill()

    def finished(self, raw: Raw) -> None:
        if raw in self.inflight:
            self.inflight.discard(raw)
            self._fill()

    def _sweep(self) -> None:
        """One timer for every handshake's timeout."""
        if self.done.done():
            return
        limit = monotonic() - self.timeout
        for raw in [r for r in self.inflight if r.t0 < limit]:
            raw.fail("connect_timeout" if raw.state == CONNECTING else "handshake_timeout")
        self.loop.call_later(0.25, self._sweep)
