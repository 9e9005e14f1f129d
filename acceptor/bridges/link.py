"""One MQTT client connection of a bridge, on plexmq's own codec: CONNECT and its CONNACK, then
packets read whole (`packets`) and written (`send`: gathered, one socket write per loop turn), with
PINGREQ while it is quiet and a close when the peer says nothing for 1.5 keepalives. The bridge
decides every acknowledgement itself: nothing is answered here but CONNACK's wait."""

from __future__ import annotations

import asyncio
import ssl
from dataclasses import dataclass

from plexmq.mqtt import properties as props
from plexmq.mqtt import v4, v5
from plexmq.mqtt.connect import encode_connect
from plexmq.mqtt.framing import MalformedPacket, frame
from plexmq.mqtt.kinds import CONNACK, PINGREQ_PACKET

READ_SIZE = 1 << 16
MAX_PACKET = 268_435_460  # what it takes from a broker (the broker's own limits bound what it sends)
CONNECT_TIMEOUT = 10.0  # seconds for the TCP and TLS handshakes and the CONNACK


class Refused(Exception):
    """The peer could not be reached or refused the CONNECT: one line that says why."""


@dataclass(frozen=True, slots=True)
class Login:
    """What the CONNECT says."""

    client_id: str
    level: int  # 4 (3.1.1) or 5; try_private adds 0x80 to a 3.1.1 CONNECT's level byte
    clean_start: bool
    keepalive: int
    username: str | None = None
    password: bytes | None = None
    session_expiry: int = 0  # 5.0
    receive_maximum: int = 100  # 5.0: unacknowledged QoS 1 PUBLISHes the peer may send us
    private: bool = False  # try_private: tell a mosquitto peer that this is a bridge


class Link:
    """An open, accepted connection."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, level: int, keepalive: int) -> None:
        self.reader, self.writer = reader, writer
        self.level = level
        self.keepalive = keepalive
        self.buffer = bytearray()
        self.out: list[bytes] = []  # what this loop turn sends, written at its end (`_flush`)
        self.session_present = False
        self.window = 65535  # QoS 1 PUBLISHes the peer takes unacknowledged (5.0: its Receive Maximum)
        self.max_qos = 2
        self._pinger: asyncio.TimerHandle | None = None
        self.loop = asyncio.get_running_loop()
        self.heard = self.loop.time()  # when the peer last sent anything
        self.silent = ""  # why `_ping_later` closed the connection: the reason the read then ends with

    @classmethod
    async def open(cls, host: str, port: int, login: Login, tls: ssl.SSLContext | None = None,
                   server_name: str | None = None) -> Link:
        """Connect and log in; Refused (why) when the peer cannot be reached or says no."""
        try:
            reader, writer = await asyncio.wait_for(asyncio.open_connection(
                host, port, ssl=tls, server_hostname=(server_name or host) if tls is not None else None), CONNECT_TIMEOUT)
        except (OSError, TimeoutError, ssl.SSLError) as exc:
            why = getattr(exc, "strerror", None) or str(exc) or "timed out"
            raise Refused(f"cannot connect to {host}:{port}: {why}") from None
        link = cls(reader, writer, login.level, login.keepalive)
        try:
            await asyncio.wait_for(link._log_in(login), CONNECT_TIMEOUT)
        except (OSError, TimeoutError, MalformedPacket, Refused) as exc:
            link.close()
            said = str(exc) if isinstance(exc, Refused) else f"no CONNACK ({str(exc) or 'timed out'})"
            raise Refused(f"{host}:{port}: {said}") from None
        link._ping_later()
        return link

    async def _log_in(self, login: Login) -> None:
        properties: props.PropertyMap = {}
        if login.level == 5:
            properties = {props.SESSION_EXPIRY_INTERVAL: login.session_expiry, props.RECEIVE_MAXIMUM: login.receive_maximum}
        packet = encode_connect(login.client_id, login.clean_start, login.keepalive, None, login.username,
                                login.password, login.level | (0x80 if login.private else 0), properties)
        self.send(packet)
        [(first, flags, body)] = await self.packets(1)  # what follows it stays for `packets`
        if first != CONNACK:
            raise Refused(f"sent packet type {first} instead of CONNACK")
        if self.level == 5:
            present, code, told = v5.decode_connack(flags, body)
            self.window = _number(told, props.RECEIVE_MAXIMUM, 65535)
            self.max_qos = _number(told, props.MAXIMUM_QOS, 2)
            self.keepalive = _number(told, props.SERVER_KEEP_ALIVE, self.keepalive)
            reason = told.get(props.REASON_STRING)
            if code >= 0x80:
                raise Refused(f"refused: {v5.describe(code)}{f' ({reason!s})' if reason else ''}")
        else:
            present, code = v4.decode_connack(flags, body)
            if code:
                raise Refused(f"refused: CONNACK return code {code}")
        self.session_present = present

    async def packets(self, most: int = 1 << 30) -> list[tuple[int, int, bytes]]:
        """The whole packets read so far, up to `most` (at least one: it waits for the next read), as
        (packet type, flags, body); EOFError when the connection ends. One await a read, not a packet:
        at QoS 1 a read brings a run of PUBLISHes or acknowledgements."""
        buffer = self.buffer
        while True:
            found: list[tuple[int, int, bytes]] = []
            pos = 0
            while len(found) < most and (at := frame(buffer, pos, MAX_PACKET)) is not None:
                first, start, pos = at
                found.append((first >> 4, first & 0x0F, bytes(buffer[start:pos])))
            if found:
                del buffer[:pos]
                return found
            data = await self.reader.read(READ_SIZE)
            if not data:
                raise EOFError(self.silent or "closed by the peer")
            buffer.extend(data)
            self.heard = self.loop.time()

    def send(self, data: bytes) -> None:
        """Written at the end of the loop turn with the turn's other packets: a write per packet cost
        the bridge a third of its CPU at QoS 1 (a PUBLISH one way and a PUBACK the other each)."""
        if not self.out:
            self.loop.call_soon(self._flush)
        self.out.append(data)

    def _flush(self) -> None:
        if self.out:
            self.writer.write(b"".join(self.out))
            self.out.clear()

    def _ping_later(self) -> None:
        """PINGREQ every half keepalive; a peer silent for 1.5 keepalives is gone (the read then ends)."""
        if not self.keepalive:
            return
        loop = self.loop
        if loop.time() - self.heard > self.keepalive * 1.5:  # a cut link (no FIN, no RST) ends so
            self.silent = f"no answer for {loop.time() - self.heard:.0f} s (keepalive {self.keepalive} s)"
            self.close()
            return
        self.send(PINGREQ_PACKET)
        self._pinger = loop.call_later(self.keepalive / 2, self._ping_later)

    def close(self) -> None:
        if self._pinger is not None:
            self._pinger.cancel()
        self._flush()  # a last DISCONNECT goes first
        self.writer.close()


def _number(told: props.Properties, ident: int, default: int) -> int:
    value = told.get(ident, default)
    return value if isinstance(value, int) else default
