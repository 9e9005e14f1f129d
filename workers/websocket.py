"""MQTT over WebSocket: the Connection speaks MQTT to this adapter as to a socket.

wsproto does the HTTP upgrade, parses the client's frames (unmasking, fragments, ping, close: RFC 6455)
and writes the control frames; the handshake's HTTP state is dropped once it is done. Each Connection
write (one per loop turn) leaves as one binary frame: its header is packed here and goes out with the
payload in one writev, where wsproto's sender would copy the payload twice.
"""

from __future__ import annotations

import asyncio
import struct
from typing import TYPE_CHECKING, Any

from wsproto.connection import SERVER, ConnectionState
from wsproto.connection import Connection as Frames
from wsproto.events import AcceptConnection, BytesMessage, CloseConnection, Ping, RejectConnection, Request, TextMessage
from wsproto.frame_protocol import CloseReason
from wsproto.handshake import H11Handshake
from wsproto.utilities import RemoteProtocolError

if TYPE_CHECKING:
    from plexmq.workers.connection import Connection

SUBPROTOCOLS = ("mqtt", "mqttv3.1")  # MQTT 3.1.1 names "mqtt"; mosquitto also answers the 3.1 name
BINARY = 0x82  # FIN + binary opcode; a server's frames are not masked
_short = struct.Struct("!BBH").pack
_long = struct.Struct("!BBQ").pack
OPEN = ConnectionState.OPEN
REMOTE_CLOSING = ConnectionState.REMOTE_CLOSING


def frame_header(size: int) -> bytes:
    if size < 126:
        return bytes((BINARY, size))
    if size < 65536:
        return _short(BINARY, 126, size)
    return _long(BINARY, 127, size)


class WebSocket(asyncio.Protocol, asyncio.Transport):
    """The protocol of the socket's transport and the transport of the Connection, in one object."""

    __slots__ = ("conn", "transport", "handshake", "frames")
    transport: asyncio.Transport  # set by connection_made, before anything else is called

    def __init__(self, conn: Connection) -> None:  # no Transport.__init__: get_extra_info is delegated
        self.conn = conn
        self.handshake: H11Handshake | None = H11Handshake(SERVER)
        self.frames: Frames | None = None  # once the handshake is done

    # -- the socket's side ---------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # a stream transport
        self.conn.connection_made(self)  # now: the CONNECT deadline must be able to close the socket

    def data_received(self, data: bytes) -> None:
        frames = self.frames
        if frames is None:
            self._upgrade(data)
            return
        frames.receive_data(data)
        conn = self.conn
        for event in frames.events():
            if isinstance(event, BytesMessage):
                conn.data_received(bytes(event.data))
                continue
            state = frames.state
            if state is not OPEN and state is not REMOTE_CLOSING:
                return  # the Connection has closed the WebSocket while it read an earlier message
            if isinstance(event, CloseConnection):
                # the client's close frame (REMOTE_CLOSING), or a frame of it was invalid (still OPEN)
                self.transport.write(frames.send(event.response()))
                return conn.close(f"websocket closed by the client (code {event.code})" if state is REMOTE_CLOSING
                                  else f"websocket protocol error: {event.reason}")
            if isinstance(event, Ping):
                self.transport.write(frames.send(event.response()))
            elif isinstance(event, TextMessage):
                self.transport.write(frames.send(CloseConnection(CloseReason.UNSUPPORTED_DATA)))
                return conn.close("websocket text frame: MQTT travels in binary frames")

    def _upgrade(self, data: bytes) -> None:
        """Answer the HTTP upgrade: 101 with an MQTT subprotocol, or a refusal."""
        handshake = self.handshake
        assert handshake is not None
        try:
            handshake.receive_data(data)
            for request in handshake.events():  # a server's handshake yields only the Request
                assert isinstance(request, Request)
                chosen = next((s for s in request.subprotocols if s in SUBPROTOCOLS), None)
                if chosen is None:
                    self.transport.write(handshake.send(RejectConnection(status_code=400)))
                    return self.conn.close(f"websocket subprotocols {request.subprotocols} do not include mqtt")
                self.transport.write(handshake.send(AcceptConnection(subprotocol=chosen)))
                self.frames = handshake.connection
                self.handshake = None
                return  # the client waits for this answer before it sends frames (RFC 6455 4.1)
        except RemoteProtocolError as exc:
            self.transport.write(handshake.send(exc.event_hint or RejectConnection(status_code=400)))
            self.conn.close(f"bad websocket handshake: {exc}")

    def connection_lost(self, exc: Exception | None) -> None:
        self.conn.connection_lost(exc)

    def pause_writing(self) -> None:
        """Pongs and close frames count with MQTT output: the Connection stops reading the client while
        any of it backs up (through pause_reading here), so a ping flood cannot grow the buffer."""
        self.conn.pause_writing()

    def resume_writing(self) -> None:
        self.conn.resume_writing()

    # -- the Connection's side -----------------------------------------------------------------------

    def write(self, data: bytes | bytearray | memoryview) -> None:
        frames = self.frames
        if frames is not None and frames.state is OPEN:
            self.transport.writelines((frame_header(len(data)), data))

    def close(self) -> None:
        """A close frame when the WebSocket is open, then the socket (the client may not answer)."""
        frames = self.frames
        if frames is not None and frames.state is OPEN:
            self.transport.write(frames.send(CloseConnection(CloseReason.NORMAL_CLOSURE)))
        self.transport.close()

    def is_closing(self) -> bool:
        return self.transport.is_closing()

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self.transport.get_extra_info(name, default)

    def pause_reading(self) -> None:
        self.transport.pause_reading()

    def resume_reading(self) -> None:
        self.transport.resume_reading()
