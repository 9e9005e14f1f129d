"""Framing and the field formats every MQTT version shares (fixed header, remaining length, UTF-8
strings, binary data, packet identifiers, variable byte integers).

`frame` finds a packet's bounds in a read buffer without copying; the readers take a body (bytes or
memoryview) and a position and return the value and the position after it, raising MalformedPacket.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator

MAX_REMAINING_LENGTH = 268_435_455  # the largest value four varint bytes hold

U16 = struct.Struct(">H")

MALFORMED = 0x81  # MQTT 5 reason codes for a refused packet: the bytes break the format ...
PROTOCOL_ERROR = 0x82  # ... or they parse, but break a rule of the protocol
TOPIC_ALIAS_INVALID = 0x94
PACKET_TOO_LARGE = 0x95


class MalformedPacket(ValueError):
    """The bytes break the MQTT wire format; the connection must be closed. str() is a short reason;
    `code` the MQTT 5 reason code to close a 5.0 client with (0x81 malformed, 0x82 protocol error)."""

    def __init__(self, reason: str, code: int = MALFORMED) -> None:
        super().__init__(reason)
        self.code = code


class UnsupportedProtocol(ValueError):
    """A CONNECT of a protocol level no codec here reads: answered with CONNACK 0x01, never parsed
    further."""

    def __init__(self, name: str, level: int) -> None:
        super().__init__(f"unsupported protocol {name!r} level {level}")
        self.level = level


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
        raise MalformedPacket(f"packet of {stop - pos} bytes exceeds the maximum of {max_size}", PACKET_TOO_LARGE)
    if stop > end:
        return None
    return buf[pos], i, stop


def packets_in(buf: bytes) -> int:
    """How many whole packets `buf` holds (a run of PUBLISHes the broker made or checked)."""
    count = pos = 0
    while (found := frame(buf, pos, len(buf))) is not None:
        count += 1
        pos = found[2]
    return count


def run_payloads(packets: bytes, topic_len: int, v5: bool) -> Iterator[bytes]:
    """The payload of each packet of a run of plain QoS 0 PUBLISHes to one topic (`v5`: a 5.0 client's,
    each with its empty property block): what a subscription with MQTT 5 options or identifiers gets
    each of them resolved from."""
    body_at = 2 + topic_len + v5
    pos = 0
    while pos < len(packets):
        _first, start, stop = frame(packets, pos, 1 << 28)  # type: ignore[misc]  # whole packets: never None
        yield packets[start + body_at:stop]
        pos = stop


def encode_remaining_length(n: int) -> bytes:
    """The variable byte integer encoding of `n` (1 to 4 bytes): remaining lengths and MQTT 5 lengths."""
    if n < 0x80:
        if n < 0:
            raise ValueError("negative variable byte integer")
        return bytes((n,))
    if n > MAX_REMAINING_LENGTH:
        raise ValueError(f"variable byte integer {n} exceeds {MAX_REMAINING_LENGTH}")
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def packet(first_byte: int, body: bytes) -> bytes:
    """A whole packet: the first byte, the remaining length, the body."""
    return bytes((first_byte,)) + encode_remaining_length(len(body)) + body


# ---------------------------------------------------------------------------------- field readers


def read_string(body: bytes | memoryview, pos: int, what: str) -> tuple[str, int]:
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


def read_binary(body: bytes | memoryview, pos: int, what: str) -> tuple[bytes, int]:
    """The length-prefixed binary field at body[pos] and the position after it."""
    start = pos + 2
    if start > len(body):
        raise MalformedPacket(f"truncated {what}")
    stop = start + ((body[pos] << 8) | body[pos + 1])
    if stop > len(body):
        raise MalformedPacket(f"truncated {what}")
    return bytes(body[start:stop]), stop


def read_packet_id(body: bytes | memoryview, pos: int) -> int:
    """The non-zero packet identifier at body[pos] (MQTT-2.3.1-1)."""
    if pos + 2 > len(body):
        raise MalformedPacket("missing packet identifier")
    packet_id = (body[pos] << 8) | body[pos + 1]
    if not packet_id:
        raise MalformedPacket("packet identifier 0")
    return packet_id


def read_varint(body: bytes | memoryview, pos: int, what: str) -> tuple[int, int]:
    """The variable byte integer at body[pos] and the position after it (at most 4 bytes, minimal or not)."""
    value = shift = 0
    size = len(body)
    while True:
        if pos >= size:
            raise MalformedPacket(f"truncated {what}")
        byte = body[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7
        if shift == 28:
            raise MalformedPacket(f"{what} longer than 4 bytes")


def encode_string(text: str) -> bytes:
    return encode_binary(text.encode("utf-8"))


def encode_binary(data: bytes) -> bytes:
    if len(data) > 0xFFFF:
        raise ValueError("field longer than 65535 bytes")
    return U16.pack(len(data)) + data
