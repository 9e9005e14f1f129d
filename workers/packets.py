"""The MQTT 3.1.1 and 3.1 wire codec: framing, decoders for what a broker or client receives, encoders.

This is the broker's hot path, so it works on whole bodies with struct and slicing: `frame` finds a
packet's bounds in a read buffer without copying, the decoders take the body (bytes or memoryview) and
the low nibble of the first byte, and validate everything the spec makes a protocol violation.
PUBLISH is decoded to a plain tuple and encoded straight from UTF-8 topic bytes, so one encoded packet
(or one header plus a shared payload) can go to many subscribers.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from router.topics import topic_name_error

CONNECT, CONNACK, PUBLISH, PUBACK, PUBREC, PUBREL, PUBCOMP, SUBSCRIBE, SUBACK, UNSUBSCRIBE, UNSUBACK, PINGREQ, PINGRESP, DISCONNECT = range(1, 15)

PINGREQ_PACKET = b"\xc0\x00"
PINGRESP_PACKET = b"\xd0\x00"
DISCONNECT_PACKET = b"\xe0\x00"

MAX_REMAINING_LENGTH = 268_435_455  # the largest value four varint bytes hold

_U16 = struct.Struct(">H")
_B_B_U16 = struct.Struct(">BBH")  # first byte, 1-byte remaining length, 16-bit field
_B_B_B_U16 = struct.Struct(">BBBH")  # first byte, 2-byte remaining length, 16-bit field
_CONNECT_FIXED = struct.Struct(">BBH")  # protocol level, connect flags, keepalive

_LEVELS = {"MQTT": 4, "MQIsdp": 3}  # protocol name -> the one level this codec reads with it
_SUBACK_CODES = frozenset((0x00, 0x01, 0x02, 0x80))


class MalformedPacket(ValueError):
    """The bytes break the MQTT wire format; the connection must be closed. str() is a short reason."""


class UnsupportedProtocol(ValueError):
    """A CONNECT of a protocol level this codec does not read: answered with CONNACK 0x01, never
    parsed further (a v5 CONNECT's properties would read as a broken 3.1.1 payload)."""

    def __init__(self, name: str, level: int) -> None:
        super().__init__(f"unsupported protocol {name!r} level {level}")
        self.level = level


@dataclass(slots=True)
class Will:
    topic: str
    payload: bytes
    qos: int
    retain: bool


@dataclass(slots=True)
class Connect:
    protocol_name: str  # "MQTT" or "MQIsdp"
    protocol_level: int  # 4 for 3.1.1, 3 for 3.1
    clean_session: bool
    keepalive: int
    client_id: str
    will: Will | None
    username: str | None
    password: bytes | None


# ----------------------------------------------------------------------------------------- framing


def frame(buf: bytes | bytearray, pos: int, max_size: int) -> tuple[int, int, int] | None:
    """The packet starting at buf[pos]: (first_byte, body_start, body_end), or None when buf does not yet hold all of it.

    Raises MalformedPacket when the remaining length uses more than 4 bytes, or when the whole packet
    would exceed max_size (as soon as the length is known, so a huge packet is never buffered).
    """
    end = len(buf)
    i = pos + 1
    if i >= end:
        return None
    byte = buf[i]
    if byte < 0x80:  # the usual case: a body under 128 bytes
        length = byte
        i += 1
    else:
        length = byte & 0x7F
        shift = 7
        while True:
            i += 1
            if i >= end:
                return None
            byte = buf[i]
            length |= (byte & 0x7F) << shift
            if byte < 0x80:
                break
            shift += 7
            if shift == 28:
                raise MalformedPacket("remaining length exceeds 4 bytes")
        i += 1
    stop = i + length
    if stop - pos > max_size:
        raise MalformedPacket(f"packet of {stop - pos} bytes exceeds the maximum of {max_size}")
    if stop > end:
        return None
    return buf[pos], i, stop


# ---------------------------------------------------------------------------------- field readers


def _string(body: bytes | memoryview, pos: int, what: str) -> tuple[str, int]:
    """The UTF-8 string at body[pos] and the position after it; strict UTF-8 without U+0000 (MQTT-1.5.3)."""
    start = pos + 2
    if start > len(body):
        raise MalformedPacket(f"truncated {what}")
    stop = start + ((body[pos] << 8) | body[pos + 1])
    if stop > len(body):
        raise MalformedPacket(f"truncated {what}")
    try:
        text = str(body[start:stop], "utf-8")
    except UnicodeDecodeError:
        raise MalformedPacket(f"invalid UTF-8 in {what}") from None
    if "\x00" in text:
        raise MalformedPacket(f"U+0000 in {what}")
    return text, stop


def _binary(body: bytes | memoryview, pos: int, what: str) -> tuple[bytes, int]:
    """The length-prefixed binary field at body[pos] and the position after it."""
    start = pos + 2
    if start > len(body):
        raise MalformedPacket(f"truncated {what}")
    stop = start + ((body[pos] << 8) | body[pos + 1])
    if stop > len(body):
        raise MalformedPacket(f"truncated {what}")
    return bytes(body[start:stop]), stop


def _packet_id_at(body: bytes | memoryview, pos: int) -> int:
    """The non-zero packet identifier at body[pos] (MQTT-2.3.1-1)."""
    if pos + 2 > len(body):
        raise MalformedPacket("missing packet identifier")
    packet_id = (body[pos] << 8) | body[pos + 1]
    if not packet_id:
        raise MalformedPacket("packet identifier 0")
    return packet_id


# ---------------------------------------------------------------------------------------- decoders


def decode_connect(flags: int, body: bytes | memoryview) -> Connect:
    """A CONNECT body (3.1.1 or 3.1); UnsupportedProtocol for any other level, judged before the rest."""
    if flags:
        raise MalformedPacket("CONNECT fixed-header flags not 0")
    protocol_name, pos = _string(body, 0, "protocol name")
    if protocol_name not in _LEVELS:
        raise MalformedPacket(f"unknown protocol name {protocol_name!r}")
    if pos + 4 > len(body):
        raise MalformedPacket("truncated CONNECT variable header")
    level, cflags, keepalive = _CONNECT_FIXED.unpack_from(body, pos)
    if _LEVELS[protocol_name] != level:
        raise UnsupportedProtocol(protocol_name, level)
    pos += 4
    if cflags & 0x01:
        raise MalformedPacket("reserved connect flag set")
    will_flag = cflags & 0x04
    will_qos = (cflags >> 3) & 0x03
    will_retain = bool(cflags & 0x20)
    if not will_flag and (will_qos or will_retain):
        raise MalformedPacket("will QoS or will retain without will flag")
    if will_qos == 3:
        raise MalformedPacket("will QoS 3")
    if cflags & 0x40 and not cflags & 0x80:
        raise MalformedPacket("password flag without username flag")

    client_id, pos = _string(body, pos, "client identifier")
    will = None
    if will_flag:
        will_topic, pos = _string(body, pos, "will topic")
        reason = topic_name_error(will_topic)
        if reason:
            raise MalformedPacket(f"will topic: {reason}")
        will_payload, pos = _binary(body, pos, "will message")
        will = Will(will_topic, will_payload, will_qos, will_retain)
    username = password = None
    if cflags & 0x80:
        username, pos = _string(body, pos, "user name")
    if cflags & 0x40:
        password, pos = _binary(body, pos, "password")
    if pos != len(body):
        raise MalformedPacket("bytes after CONNECT payload")
    return Connect(protocol_name, level, bool(cflags & 0x02), keepalive, client_id, will, username, password)


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
    packet_id = _packet_id_at(body, 0)
    size = len(body)
    pos = 2
    filters = []
    while pos < size:
        topic_filter, pos = _string(body, pos, "topic filter")
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
    packet_id = _packet_id_at(body, 0)
    size = len(body)
    pos = 2
    filters = []
    while pos < size:
        topic_filter, pos = _string(body, pos, "topic filter")
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
    packet_id = _packet_id_at(body, 0)
    codes = list(body[2:])
    if not codes:
        raise MalformedPacket("SUBACK without return codes")
    if not _SUBACK_CODES.issuperset(codes):
        raise MalformedPacket("invalid SUBACK return code")
    return packet_id, codes


# ---------------------------------------------------------------------------------------- encoders


def encode_remaining_length(n: int) -> bytes:
    """The variable-length encoding of a remaining length (1 to 4 bytes)."""
    if n < 0x80:
        if n < 0:
            raise ValueError("negative remaining length")
        return bytes((n,))
    if n > MAX_REMAINING_LENGTH:
        raise ValueError(f"remaining length {n} exceeds {MAX_REMAINING_LENGTH}")
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _packet(first_byte: int, body: bytes) -> bytes:
    return bytes((first_byte,)) + encode_remaining_length(len(body)) + body


def _encode_string(text: str) -> bytes:
    return _encode_binary(text.encode("utf-8"))


def _encode_binary(data: bytes) -> bytes:
    if len(data) > 0xFFFF:
        raise ValueError("field longer than 65535 bytes")
    return _U16.pack(len(data)) + data


def encode_connect(
    client_id: str,
    clean_session: bool = True,
    keepalive: int = 60,
    will: Will | None = None,
    username: str | None = None,
    password: bytes | None = None,
    protocol_level: int = 4,
) -> bytes:
    """A CONNECT; protocol level 3 is MQTT 3.1 and carries the protocol name "MQIsdp"."""
    cflags = 0x02 if clean_session else 0
    payload = [_encode_string(client_id)]
    if will is not None:
        cflags |= 0x04 | (will.qos << 3) | (0x20 if will.retain else 0)
        payload += (_encode_string(will.topic), _encode_binary(will.payload))
    if username is not None:
        cflags |= 0x80
        payload.append(_encode_string(username))
    if password is not None:
        cflags |= 0x40
        payload.append(_encode_binary(password))
    name = _encode_string("MQIsdp" if protocol_level == 3 else "MQTT")
    body = b"".join((name, _CONNECT_FIXED.pack(protocol_level, cflags, keepalive), *payload))
    return _packet(0x10, body)


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
        head = bytes((first,)) + encode_remaining_length(length) + _U16.pack(topic_len)
    if qos:
        return head + topic + _U16.pack(packet_id)
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
    parts = [_U16.pack(packet_id)]
    for topic_filter, qos in filters:
        parts += (_encode_string(topic_filter), bytes((qos,)))
    return _packet(0x82, b"".join(parts))


def encode_suback(packet_id: int, codes: list[int]) -> bytes:
    return _packet(0x90, _U16.pack(packet_id) + bytes(codes))


def encode_unsubscribe(packet_id: int, filters: list[str]) -> bytes:
    return _packet(0xA2, b"".join([_U16.pack(packet_id), *map(_encode_string, filters)]))
