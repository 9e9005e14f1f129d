"""The MQTT 3.1.1 and 3.1 codec (protocol levels 4 and 3): decoders for what a broker or client
receives, encoders for what it sends.

This is the broker's hot path, so it works on whole bodies with struct and slicing: the decoders take
the body (bytes or memoryview) and the low nibble of the first byte, and validate everything the spec
makes a protocol violation. PUBLISH is decoded to a plain tuple and encoded straight from UTF-8 topic
bytes, so one encoded packet (or one header plus a shared payload) can go to many subscribers.
Framing and the packet kinds are part of its surface, so a 3.1.1 client needs this one module.
"""

from __future__ import annotations

import struct

from plexmq.mqtt.connect import Connect, Will, decode_connect, encode_connect  # noqa: F401 (one CONNECT codec for all levels)
from plexmq.mqtt.framing import (  # noqa: F401 (framing is part of this codec's surface)
    MAX_REMAINING_LENGTH,
    U16,
    MalformedPacket,
    UnsupportedProtocol,
    encode_binary,
    encode_remaining_length,
    encode_string,
    frame,
    packet,
    read_binary,
    read_packet_id,
    read_string,
)
from plexmq.mqtt.kinds import (  # noqa: F401
    AUTH,
    CONNACK,
    CONNECT,
    DISCONNECT,
    PINGREQ,
    PINGREQ_PACKET,
    PINGRESP,
    PINGRESP_PACKET,
    PUBACK,
    PUBCOMP,
    PUBLISH,
    PUBREC,
    PUBREL,
    SUBACK,
    SUBSCRIBE,
    UNSUBACK,
    UNSUBSCRIBE,
)
from plexmq.mqtt.topics import topic_name_error

DISCONNECT_PACKET = b"\xe0\x00"


_B_B_U16 = struct.Struct(">BBH")  # first byte, 1-byte remaining length, 16-bit field
_B_B_B_U16 = struct.Struct(">BBBH")  # first byte, 2-byte remaining length, 16-bit field
_SUBACK_CODES = frozenset((0x00, 0x01, 0x02, 0x80))


# ---------------------------------------------------------------------------------------- decoders


def decode_publish(flags: int, body: bytes | memoryview) -> tuple[str, int, bytes]:
    """(topic, packet_id or 0 for QoS 0, payload) of a PUBLISH; QoS, retain and DUP stay in `flags`."""
    qos = (flags >> 1) & 0x03
    if qos == 3:
        raise MalformedPacket("PUBLISH QoS 3")
    if not qos and flags & 0x08:
        raise MalformedPacket("DUP set on QoS 0 PUBLISH")
    if type(body) is not bytes:
        body = bytes(body)  # bytes slicing and .decode() are the fastest path, and the payload must be bytes anyway
    size = len(body)
    if size < 2:
        raise MalformedPacket("truncated topic name")
    pos = 2 + ((body[0] << 8) | body[1])
    if pos > size:
        raise MalformedPacket("truncated topic name")
    try:
        topic = body[2:pos].decode()
    except UnicodeDecodeError:
        raise MalformedPacket("invalid UTF-8 in topic name") from None
    reason = topic_name_error(topic)
    if reason:
        raise MalformedPacket(reason)
    if qos:
        if pos + 2 > size:
            raise MalformedPacket("missing packet identifier")
        packet_id = (body[pos] << 8) | body[pos + 1]
        if not packet_id:
            raise MalformedPacket("packet identifier 0")
        return topic, packet_id, body[pos + 2 :]
    return topic, 0, body[pos:]


def decode_subscribe(flags: int, body: bytes | memoryview) -> tuple[int, list[tuple[str, int]]]:
    """(packet_id, [(filter, requested_qos)]); filter syntax is the broker's call (SUBACK 0x80), not a framing error."""
    if flags != 0x02:
        raise MalformedPacket("SUBSCRIBE fixed-header flags not 0b0010")
    packet_id = read_packet_id(body, 0)
    size = len(body)
    pos = 2
    filters = []
    while pos < size:
        topic_filter, pos = read_string(body, pos, "topic filter")
        if pos >= size:
            raise MalformedPacket("missing requested QoS")
        options = body[pos]
        pos += 1
        if options & 0xFC:
            raise MalformedPacket("reserved bits set in requested QoS")
        if options == 3:
            raise MalformedPacket("requested QoS 3")
        filters.append((topic_filter, options))
    if not filters:
        raise MalformedPacket("SUBSCRIBE without topic filters")
    return packet_id, filters


def decode_unsubscribe(flags: int, body: bytes | memoryview) -> tuple[int, list[str]]:
    """(packet_id, [filter]) of an UNSUBSCRIBE."""
    if flags != 0x02:
        raise MalformedPacket("UNSUBSCRIBE fixed-header flags not 0b0010")
    packet_id = read_packet_id(body, 0)
    size = len(body)
    pos = 2
    filters = []
    while pos < size:
        topic_filter, pos = read_string(body, pos, "topic filter")
        filters.append(topic_filter)
    if not filters:
        raise MalformedPacket("UNSUBSCRIBE without topic filters")
    return packet_id, filters


def decode_packet_id(flags: int, body: bytes | memoryview, expected_flags: int) -> int:
    """The packet id of PUBACK/PUBREC/PUBCOMP/UNSUBACK (flags 0) or PUBREL (flags 2)."""
    if flags != expected_flags:
        raise MalformedPacket(f"fixed-header flags {flags:#06b}, expected {expected_flags:#06b}")
    if len(body) != 2:
        raise MalformedPacket(f"{len(body)}-byte body, expected a 2-byte packet identifier")
    packet_id = (body[0] << 8) | body[1]
    if not packet_id:
        raise MalformedPacket("packet identifier 0")
    return packet_id


def decode_empty(flags: int, body: bytes | memoryview) -> None:
    """Check a PINGREQ/PINGRESP/DISCONNECT: flags 0 and no body."""
    if flags:
        raise MalformedPacket("fixed-header flags not 0")
    if len(body):
        raise MalformedPacket("unexpected body")


def decode_connack(flags: int, body: bytes | memoryview) -> tuple[bool, int]:
    """(session_present, return_code) of a CONNACK."""
    if flags:
        raise MalformedPacket("CONNACK fixed-header flags not 0")
    if len(body) != 2:
        raise MalformedPacket(f"{len(body)}-byte CONNACK body, expected 2")
    ack_flags = body[0]
    if ack_flags & 0xFE:
        raise MalformedPacket("reserved CONNACK flags set")
    return bool(ack_flags), body[1]


def decode_suback(flags: int, body: bytes | memoryview) -> tuple[int, list[int]]:
    """(packet_id, [return code]) of a SUBACK; each code is 0, 1, 2 or 0x80."""
    if flags:
        raise MalformedPacket("SUBACK fixed-header flags not 0")
    packet_id = read_packet_id(body, 0)
    codes = list(body[2:])
    if not codes:
        raise MalformedPacket("SUBACK without return codes")
    if not _SUBACK_CODES.issuperset(codes):
        raise MalformedPacket("invalid SUBACK return code")
    return packet_id, codes


# ---------------------------------------------------------------------------------------- encoders


def encode_connack(session_present: bool, return_code: int) -> bytes:
    return bytes((0x20, 0x02, 1 if session_present else 0, return_code))


def publish_header(topic: bytes, payload_len: int, qos: int, retain: bool, dup: bool, packet_id: int) -> bytes:
    """Everything of a PUBLISH before the payload, so the payload can be written without being copied.

    `topic` is UTF-8 already; qos, dup and packet_id are trusted to be consistent (the broker sets them).
    """
    first = 0x30 | (qos << 1) | (0x01 if retain else 0) | (0x08 if dup else 0)
    topic_len = len(topic)
    length = topic_len + payload_len + (4 if qos else 2)
    if length < 0x80:
        head = _B_B_U16.pack(first, length, topic_len)
    elif length < 0x4000:
        head = _B_B_B_U16.pack(first, (length & 0x7F) | 0x80, length >> 7, topic_len)
    else:
        head = bytes((first,)) + encode_remaining_length(length) + U16.pack(topic_len)
    if qos:
        return head + topic + U16.pack(packet_id)
    return head + topic


def encode_publish(
    topic: bytes, payload: bytes, qos: int = 0, retain: bool = False, dup: bool = False, packet_id: int = 0
) -> bytes:
    """A whole PUBLISH from UTF-8 topic bytes; the broker encodes one and writes it to many subscribers."""
    return publish_header(topic, len(payload), qos, retain, dup, packet_id) + payload


def encode_puback(packet_id: int) -> bytes:
    return _B_B_U16.pack(0x40, 0x02, packet_id)


def encode_pubrec(packet_id: int) -> bytes:
    return _B_B_U16.pack(0x50, 0x02, packet_id)


def encode_pubrel(packet_id: int) -> bytes:
    return _B_B_U16.pack(0x62, 0x02, packet_id)


def encode_pubcomp(packet_id: int) -> bytes:
    return _B_B_U16.pack(0x70, 0x02, packet_id)


def encode_unsuback(packet_id: int) -> bytes:
    return _B_B_U16.pack(0xB0, 0x02, packet_id)


def encode_subscribe(packet_id: int, filters: list[tuple[str, int]]) -> bytes:
    parts = [U16.pack(packet_id)]
    for topic_filter, qos in filters:
        parts += (encode_string(topic_filter), bytes((qos,)))
    return packet(0x82, b"".join(parts))


def encode_suback(packet_id: int, codes: list[int]) -> bytes:
    return packet(0x90, U16.pack(packet_id) + bytes(codes))


def encode_unsubscribe(packet_id: int, filters: list[str]) -> bytes:
    return packet(0xA2, b"".join([U16.pack(packet_id), *map(encode_string, filters)]))
