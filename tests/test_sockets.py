"""The worker's own plain-socket transport (workers/sockets.py) against real TCP peers on loopback.

The broker tests cover it end to end; these pin what the asyncio Transport contract asks of it where
clients rarely go: a peer that stops reading (pause/resume_writing, nothing lost or reordered), close
with output still buffered, a peer's reset, reading paused, and a protocol that raises.
"""

from __future__ import annotations

import asyncio
import select
import socket
import struct

import pytest
import uvloop

from plexmq.workers.sockets import HIGH_WATER, Poller, SocketTransport


class Recorder(asyncio.Protocol):
    """Records every callback; `lost` is set when connection_lost comes."""

    def __init__(self) -> None:
        self.transport: SocketTransport | None = None
        self.data = bytearray()
        self.events: list[str] = []
        self.lost_with: list[Exception | None] = []
        self.lost = asyncio.Event()
        self.received = asyncio.Event()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # the poller's stream transport
        self.events.append("made")

    def data_received(self, data: bytes) -> None:
        self.data += data
        self.received.set()

    def pause_writing(self) -> None:
        self.events.append("pause")

    def resume_writing(self) -> None:
        self.events.append("resume")

    def connection_lost(self, exc: Exception | None) -> None:
        self.events.append("lost")
        self.lost_with.append(exc)
        self.lost.set()


def run(test) -> None:
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(asyncio.wait_for(test(), 30))


async def pair(protocol: Recorder, **poller_options: float) -> tuple[Poller, socket.socket, SocketTransport]:
    """A Poller serving one end of a loopback TCP connection with `protocol`; the other end, blocking;
    the served end's transport."""
    loop = asyncio.get_running_loop()
    listener = socket.create_server(("127.0.0.1", 0))
    peer = socket.socket()
    peer.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # fixed and small: writes soon back up
    peer.connect(listener.getsockname())
    served, _ = listener.accept()
    listener.close()
    served.setblocking(False)
    poller = Poller(loop, **poller_options)
    transport = poller.serve(served, protocol)
    assert protocol.transport is transport
    return poller, peer, transport


async def receive_all(peer: socket.socket, size: int) -> bytes:
    """Read `size` bytes from the blocking peer in a thread, so the loop goes on serving."""
    def read() -> bytes:
        got = bytearray()
        while len(got) < size:
            chunk = peer.recv(1 << 20)
            if not chunk:
                break
            got += chunk
        return bytes(got)
    return await asyncio.to_thread(read)


def test_a_peer_that_stops_reading_pauses_writing_and_gets_everything_in_order() -> None:
    async def test() -> None:
        protocol = Recorder()
        poller, peer, transport = await pair(protocol)
        chunks = [struct.pack("!I", i) * 4096 for i in range(200)]  # 3.2 MB, far beyond the socket buffers
        for chunk in chunks[:100]:
            transport.write(chunk)
        transport.writelines(chunks[100:])
        assert protocol.events == ["made", "pause"]
        assert transport.get_write_buffer_size() > HIGH_WATER
        assert await receive_all(peer, sum(map(len, chunks))) == b"".join(chunks)
        assert protocol.events == ["made", "pause", "resume"]
        assert transport.get_write_buffer_size() == 0
        transport.close()
        await protocol.lost.wait()
        assert protocol.lost_with == [None] and not poller.sockets
        assert peer.recv(1) == b""
    run(test)


def test_close_sends_what_is_buffered_then_ends_the_connection() -> None:
    async def test() -> None:
        protocol = Recorder()
        _poller, peer, transport = await pair(protocol)
        payload = bytes(range(256)) * 8192  # 2 MB: most of it waits in the transport
        transport.write(payload)
        transport.close()
        assert transport.is_closing()
        transport.write(b"after close")  # dropped, as asyncio's transports do
        assert await receive_all(peer, len(payload) + 1) == payload  # then EOF
        await protocol.lost.wait()
        assert protocol.lost_with == [None]
    run(test)


def test_a_close_with_input_unread_ends_the_stream_without_a_reset() -> None:
    """Input the protocol never read is drained after the close (a socket closed with it would be
    reset, and the peer could lose what it was sent last): the peer reads all, then the end of the
    stream; the connection ends when the peer closes."""
    async def test() -> None:
        protocol = Recorder()
        poller, peer, transport = await pair(protocol)
        transport.pause_reading()
        peer.sendall(b"unread" * 1000)
        assert transport.sock is not None
        assert select.select([transport.sock], [], [], 5)[0]  # the input is there, unread
        transport.write(b"goodbye")
        transport.close()
        assert await receive_all(peer, 8) == b"goodbye"  # then the end of the stream: a reset raises
        peer.close()
        await protocol.lost.wait()
        assert protocol.lost_with == [None] and not poller.sockets
    run(test)


def test_data_in_order_and_eof_ends_the_connection() -> None:
    async def test() -> None:
        protocol = Recorder()
        _poller, peer, transport = await pair(protocol)
        sent = b"".join(struct.pack("!I", i) for i in range(100_000))
        await asyncio.to_thread(peer.sendall, sent)
        peer.shutdown(socket.SHUT_WR)
        await protocol.lost.wait()
        assert bytes(protocol.data) == sent and protocol.lost_with == [None]
    run(test)


def test_paused_reading_holds_data_back_until_resumed() -> None:
    async def test() -> None:
        protocol = Recorder()
        _poller, peer, transport = await pair(protocol)
        transport.pause_reading()
        assert not transport.is_reading()
        peer.sendall(b"held")
        transport.write(b"ping")  # writing goes on while reading is paused
        assert await receive_all(peer, 4) == b"ping"  # the loop has turned meanwhile
        assert protocol.data == b""
        transport.resume_reading()
        await protocol.received.wait()
        assert protocol.data == b"held"
    run(test)


def test_a_peer_reset_is_connection_lost_with_its_error() -> None:
    async def test() -> None:
        protocol = Recorder()
        _poller, peer, transport = await pair(protocol)
        transport.pause_reading()  # not reading: the hang-up alone must end it
        peer.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        peer.close()  # RST
        await protocol.lost.wait()
        assert isinstance(protocol.lost_with[0], ConnectionResetError)
        assert transport.get_extra_info("peername") is None
    run(test)


def test_a_protocol_that_raises_loses_its_connection_and_says_why() -> None:
    class Raising(Recorder):
        def data_received(self, data: bytes) -> None:
            raise ValueError("a bug")

    async def test() -> None:
        reported: list[dict] = []
        asyncio.get_running_loop().set_exception_handler(lambda _loop, context: reported.append(context))
        protocol = Raising()
        _poller, peer, transport = await pair(protocol)
        peer.sendall(b"x")
        await protocol.lost.wait()
        assert isinstance(protocol.lost_with[0], ValueError)
        assert reported and reported[0]["message"] == "protocol.data_received() failed"
        assert await receive_all(peer, 1) == b""
    run(test)


@pytest.mark.parametrize("name", ["peername", "sockname"])
def test_extra_info_names_the_ends(name: str) -> None:
    async def test() -> None:
        protocol = Recorder()
        _poller, peer, transport = await pair(protocol)
        other = peer.getsockname() if name == "peername" else peer.getpeername()
        assert transport.get_extra_info(name) == other
        assert transport.get_extra_info("peercert", "none") == "none"
    run(test)


def test_a_reset_with_output_buffered_is_connection_lost_only() -> None:
    """A slow subscriber that resets: epoll says writable, readable and hung up at once; the failed send
    ends the connection and nothing else runs on it (the loop's exception handler hears nothing)."""
    async def test() -> None:
        reported: list[dict] = []
        asyncio.get_running_loop().set_exception_handler(lambda _loop, context: reported.append(context))
        protocol = Recorder()
        poller, peer, transport = await pair(protocol)
        transport.write(bytes(16 << 20))  # most of it stays buffered, reading stays on
        assert transport.get_write_buffer_size() > 0 and transport.is_reading()
        peer.sendall(b"x")  # something to read as well
        peer.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        peer.close()
        await protocol.lost.wait()
        await asyncio.sleep(0)  # a failing turn of the Poller would have reported by now
        assert isinstance(protocol.lost_with[0], ConnectionResetError) and not reported
        assert not poller.sockets and not transport.is_reading()
    run(test)


def test_a_closed_connection_whose_peer_never_reads_is_aborted_after_the_close_timeout() -> None:
    async def test() -> None:
        protocol = Recorder()
        poller, peer, transport = await pair(protocol, close_timeout=0.3)
        transport.write(bytes(16 << 20))
        transport.close()
        assert poller.sockets  # still sending what it can
        await protocol.lost.wait()
        assert protocol.lost_with == [None] and not poller.sockets
        peer.close()
    run(test)


@pytest.mark.parametrize("callback", ["eof_received", "pause_writing"])
def test_a_protocol_callback_that_raises_is_reported_and_loses_its_connection(callback: str) -> None:
    def fail(*_args: object) -> None:
        raise ValueError("a bug")

    async def test() -> None:
        reported: list[dict] = []
        asyncio.get_running_loop().set_exception_handler(lambda _loop, context: reported.append(context))
        protocol = Recorder()
        setattr(protocol, callback, fail)
        _poller, peer, transport = await pair(protocol)
        if callback == "eof_received":
            peer.shutdown(socket.SHUT_WR)
        else:
            transport.write(bytes(16 << 20))
        await protocol.lost.wait()
        assert isinstance(protocol.lost_with[0], ValueError)
        assert [context["message"] for context in reported] == [f"protocol.{callback}() failed"]
    run(test)
