"""The MQTT 5.0 codec (protocol level 5): each packet of 3.1.1 plus its reason code and properties,
and AUTH. CONNECT, framing and the packet kinds are shared with 3.1.1 and part of this surface.

Properties decode to a dict keyed by property id (see `properties`); a packet without properties
decodes to an empty dict without building anything, which keeps the PUBLISH path short.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Callable

from plexmq.mqtt import properties as props_codec
from plexmq.mqtt.connect import Connect, RefusedConnect, Will, decode_connect, encode_connect  # noqa: F401
from plexmq.mqtt.framing import (  # noqa: F401 (framing is part of this codec's surface)
    MAX_REMAINING_LENGTH,
    PROTOCOL_ERROR,
    U16,
    MalformedPacket,
    UnsupportedProtocol,
    encode_remaining_length,
    encode_string,
    frame,
    packet,
    read_packet_id,
    read_string,
    read_varint,
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
from plexmq.mqtt.properties import Properties, PropertyMap
from plexmq.mqtt.reasons import ALLOWED, TOPIC_NAME_INVALID
from plexmq.mqtt.reasons import name as reason_name
from plexmq.mqtt.topics import SHARED_PREFIX, topic_name_error
from plexmq.mqtt.v4 import publish_header as v4_publish_header

_B_B_U16 = struct.Struct(">BBH")
_U32 = struct.Struct(">I")
_B_B_U16_B = struct.Struct(">BBHB")
_ALIAS = bytes((props_codec.TOPIC_ALIAS,))

# SUBSCRIBE options (section 3.8.3.1)
NO_LOCAL = 0x04
RETAIN_AS_PUBLISHED = 0x08
RETAIN_HANDLING = 0x30  # >> 4: 0 send retained, 1 only for a new subscription, 2 never

_FIRST_BYTES = {PUBACK: 0x40, PUBREC: 0x50, PUBREL: 0x62, PUBCOMP: 0x70}

# what a packet leaves out first when it would exceed the receiver's Maximum Packet Size: the reason
# string and user properties ([MQTT-3.2.2-19], [MQTT-3.2.2-20]; the same statements stand for each
# ack, SUBACK, UNSUBACK, DISCONNECT and AUTH)
DIAGNOSTIC = frozenset((props_codec.REASON_STRING, props_codec.USER_PROPERTY))


def _properties(body: bytes | memoryview, pos: int, kind: int, max_user: int) -> tuple[Properties, int]:
    """Properties at body[pos], or none at all when the packet ends there."""
    if pos >= len(body):
        return {}, pos
    if body[pos] == 0:
        return {}, pos + 1
    return props_codec.decode(body, pos, kind, max_user)


def _reason(code: int, kind: int) -> int:
    if code not in ALLOWED[kind]:
        raise MalformedPacket(f"reason code {code:#04x} not allowed in this packet", PROTOCOL_ERROR)
    return code


# ---------------------------------------------------------------------------------------- decoders


def decode_publish(flags: int, body: bytes | memoryview, from_server: bool = False,
                   max_user: int = props_codec.ANY) -> tuple[str, int, bytes, Properties]:
    """(topic, packet_id or 0, payload, properties). The topic may be empty when a topic alias is set
    (the connection resolves it); only a server may send subscription identifiers [MQTT-3.3.4-6].
    Here and below, `max_user` bounds the user properties (properties.decode)."""
    qos = (flags >> 1) & 0x03
    if qos == 3:
        raise MalformedPacket("PUBLISH QoS 3")
    if not qos and flags & 0x08:
        raise MalformedPacket("DUP set on QoS 0 PUBLISH", PROTOCOL_ERROR)
    if type(body) is not bytes:
        body = bytes(body)
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
    packet_id = 0
    if qos:
        if pos + 2 > size:
            raise MalformedPacket("missing packet identifier")
        packet_id = (body[pos] << 8) | body[pos + 1]
        if not packet_id:
            raise MalformedPacket("packet identifier 0")
        pos += 2
    if pos >= size:
        raise MalformedPacket("missing property length")
    if body[pos] == 0:
        props: Properties = {}
        pos += 1
    else:
        props, pos = props_codec.decode(body, pos, PUBLISH, max_user)
        if props_codec.SUBSCRIPTION_IDENTIFIER in props and not from_server:
            raise MalformedPacket("subscription identifier from a client", PROTOCOL_ERROR)
        response = props.get(props_codec.RESPONSE_TOPIC)
        if isinstance(response, str) and ("+" in response or "#" in response):
            raise MalformedPacket("wildcard in response topic", PROTOCOL_ERROR)  # [MQTT-3.3.2-14]
    if "\x00" in topic:
        raise MalformedPacket("U+0000 in topic name")  # [MQTT-1.5.4-2]
    if not topic:
        if props_codec.TOPIC_ALIAS not in props:
            raise MalformedPacket("empty topic name without a topic alias", PROTOCOL_ERROR)
    else:
        reason = topic_name_error(topic)
        if reason:
            raise MalformedPacket(reason, TOPIC_NAME_INVALID)
    return topic, packet_id, body[pos:], props


def decode_ack(kind: int, flags: int, body: bytes | memoryview,
               max_user: int = props_codec.ANY) -> tuple[int, int, Properties]:
    """(packet_id, reason code, properties) of PUBACK, PUBREC, PUBREL (flags 2) or PUBCOMP."""
    expected = 2 if kind == PUBREL else 0
    if flags != expected:
        raise MalformedPacket(f"fixed-header flags {flags:#06b}, expected {expected:#06b}")
    packet_id = read_packet_id(body, 0)
    if len(body) == 2:
        return packet_id, 0, {}
    code = _reason(body[2], kind)
    props, pos = _properties(body, 3, kind, max_user)
    if pos != len(body):
        raise MalformedPacket("bytes after the properties")
    return packet_id, code, props


def decode_subscribe(flags: int, body: bytes | memoryview,
                     max_user: int = props_codec.ANY) -> tuple[int, list[tuple[str, int]], Properties]:
    """(packet_id, [(filter, options)], properties); options keep QoS (bits 0-1), no local, retain
    as published and retain handling (bits 4-5) as sent."""
    if flags != 0x02:
        raise MalformedPacket("SUBSCRIBE fixed-header flags not 0b0010")
    packet_id = read_packet_id(body, 0)
    props, pos = props_codec.decode(body, 2, SUBSCRIBE, max_user)
    size = len(body)
    filters = []
    while pos < size:
        topic_filter, pos = read_string(body, pos, "topic filter")
        if pos >= size:
            raise MalformedPacket("missing subscription options")
        options = body[pos]
        pos += 1
        if options & 0xC0:
            raise MalformedPacket("reserved bits set in subscription options")
        if options & 3 == 3:
            raise MalformedPacket("requested QoS 3", PROTOCOL_ERROR)
        if options & RETAIN_HANDLING == RETAIN_HANDLING:
            raise MalformedPacket("retain handling 3", PROTOCOL_ERROR)
        if options & NO_LOCAL and topic_filter.startswith(SHARED_PREFIX):
            raise MalformedPacket("no local on a shared subscription", PROTOCOL_ERROR)  # [MQTT-3.8.3-4]
        filters.append((topic_filter, options))
    if not filters:
        raise MalformedPacket("SUBSCRIBE without topic filters", PROTOCOL_ERROR)
    return packet_id, filters, props


def decode_unsubscribe(flags: int, body: bytes | memoryview,
                       max_user: int = props_codec.ANY) -> tuple[int, list[str], Properties]:
    if flags != 0x02:
        raise MalformedPacket("UNSUBSCRIBE fixed-header flags not 0b0010")
    packet_id = read_packet_id(body, 0)
    props, pos = props_codec.decode(body, 2, UNSUBSCRIBE, max_user)
    size = len(body)
    filters = []
    while pos < size:
        topic_filter, pos = read_string(body, pos, "topic filter")
        filters.append(topic_filter)
    if not filters:
        raise MalformedPacket("UNSUBSCRIBE without topic filters", PROTOCOL_ERROR)
    return packet_id, filters, props


def decode_reason_only(kind: int, flags: int, body: bytes | memoryview,
                       max_user: int = props_codec.ANY) -> tuple[int, Properties]:
    """(reason code, properties) of a DISCONNECT or AUTH: an empty body is reason 0 (success)."""
    if flags:
        raise MalformedPacket("fixed-header flags not 0")
    if not len(body):
        return 0, {}
    code = _reason(body[0], kind)
    props, pos = _properties(body, 1, kind, max_user)
    if pos != len(body):
        raise MalformedPacket("bytes after the properties")
    if kind == AUTH and props_codec.AUTHENTICATION_METHOD not in props:
        raise MalformedPacket("AUTH without an authentication method", PROTOCOL_ERROR)
    return code, props


def decode_connack(flags: int, body: bytes | memoryview) -> tuple[bool, int, Properties]:
    """(session_present, reason code, properties) of a CONNACK."""
    if flags:
        raise MalformedPacket("CONNACK fixed-header flags not 0")
    if len(body) < 3:
        raise MalformedPacket("truncated CONNACK")
    if body[0] & 0xFE:
        raise MalformedPacket("reserved CONNACK flags set")
    code = _reason(body[1], CONNACK)
    props, pos = props_codec.decode(body, 2, CONNACK)
    if pos != len(body):
        raise MalformedPacket("bytes after the properties")
    return bool(body[0]), code, props


def decode_suback(kind: int, flags: int, body: bytes | memoryview) -> tuple[int, list[int], Properties]:
    """(packet_id, [reason code], properties) of a SUBACK or UNSUBACK."""
    if flags:
        raise MalformedPacket("fixed-header flags not 0")
    packet_id = read_packet_id(body, 0)
    props, pos = props_codec.decode(body, 2, kind)
    codes = [_reason(code, kind) for code in body[pos:]]
    if not codes:
        raise MalformedPacket("no reason codes", PROTOCOL_ERROR)
    return packet_id, codes, props


# ---------------------------------------------------------------------------------------- encoders


def publish_header(topic: bytes, payload_len: int, qos: int, retain: bool, dup: bool, packet_id: int,
                   props: bytes = b"\x00") -> bytes:
    """Everything of a PUBLISH before the payload; `props` is an encoded property block. The 3.1.1
    header of a payload that long is the same up to the properties: it is built by v4's fast one."""
    return v4_publish_header(topic, len(props) + payload_len, qos, retain, dup, packet_id) + props


def encode_publish(topic: bytes, payload: bytes, qos: int = 0, retain: bool = False, dup: bool = False,
                   packet_id: int = 0, properties: PropertyMap | None = None) -> bytes:
    return publish_header(topic, len(payload), qos, retain, dup, packet_id, props_codec.encode(properties)) + payload


def publishes_from_v4(packets: bytes) -> bytes:
    """Plain QoS 0 PUBLISH packets of 3.1.1 (as the raw path forwards them) as 5.0 ones: each gets an
    empty property block after its topic. One conversion serves every 5.0 subscriber of a run."""
    out: list[bytes] = []
    pos, end = 0, len(packets)
    while pos < end:
        _first, start, stop = frame(packets, pos, MAX_REMAINING_LENGTH + 5)  # type: ignore[misc]  # whole packets: never None
        topic_end = start + 2 + ((packets[start] << 8) | packets[start + 1])
        out += (b"\x30", encode_remaining_length(stop - start + 1), packets[start:topic_end], b"\x00",
                packets[topic_end:stop])
        pos = stop
    return b"".join(out)


def publishes_to_v4(packets: bytes) -> bytes:
    """5.0 QoS 0 PUBLISH packets without properties (a 5.0 client's raw run) as 3.1.1 ones: each loses
    its empty property block. One conversion serves every 3.1.1 subscriber of a run."""
    out: list[bytes] = []
    pos, end = 0, len(packets)
    while pos < end:
        _first, start, stop = frame(packets, pos, MAX_REMAINING_LENGTH + 5)  # type: ignore[misc]  # whole packets: never None
        topic_end = start + 2 + ((packets[start] << 8) | packets[start + 1])
        out += (b"\x30", encode_remaining_length(stop - start - 1), packets[start:topic_end], packets[topic_end + 1:stop])
        pos = stop
    return b"".join(out)


def first_topic(packets: bytes) -> bytes:
    """The topic name of the first PUBLISH in `packets` (3.1.1 or 5.0: a raw run's packets share it)."""
    _first, start, _stop = frame(packets, 0, MAX_REMAINING_LENGTH + 5)  # type: ignore[misc]  # whole packets: never None
    return packets[start + 2:start + 2 + ((packets[start] << 8) | packets[start + 1])]


def with_topic_alias(packets: bytes, alias: int, named: bool) -> bytes:
    """5.0 QoS 0 PUBLISH packets to one topic (one delivery, or a raw run) sent with topic alias
    `alias` in front of their properties: the first keeps its topic name when `named` (it sets the
    alias), every other has an empty one (it uses the alias)."""
    entry = _ALIAS + U16.pack(alias)
    out: list[bytes] = []
    pos, end = 0, len(packets)
    while pos < end:
        first, start, stop = frame(packets, pos, MAX_REMAINING_LENGTH + 5)  # type: ignore[misc]  # whole packets: never None
        topic_end = start + 2 + ((packets[start] << 8) | packets[start + 1])
        length, props_start = read_varint(packets, topic_end, "property length")
        topic = packets[start:topic_end] if named and not pos else b"\x00\x00"
        block = encode_remaining_length(length + 3)
        out += (bytes((first,)), encode_remaining_length(len(topic) + len(block) + 3 + stop - props_start), topic,
                block, entry, packets[props_start:stop])
        pos = stop
    return b"".join(out)


def payloads(packets: bytes) -> list[bytes]:
    """The payload of each 5.0 QoS 0 PUBLISH packet (their properties left out: a raw run has none)."""
    found = []
    pos, end = 0, len(packets)
    while pos < end:
        _first, start, stop = frame(packets, pos, MAX_REMAINING_LENGTH + 5)  # type: ignore[misc]  # whole packets: never None
        length, props_start = read_varint(packets, start + 2 + ((packets[start] << 8) | packets[start + 1]),
                                          "property length")
        found.append(packets[props_start + length:stop])
        pos = stop
    return found


def alias_properties(alias: int) -> bytes:
    """The property block of a PUBLISH that carries topic alias `alias` and nothing else."""
    return b"\x03" + _ALIAS + U16.pack(alias)


def message_properties(props: bytes, expiry: int, now: float, alias: int = 0) -> bytes | None:
    """The property block of a PUBLISH to a subscriber: the topic alias (0: none), the message's
    property entries as they came (without their length), and what is left of its expiry interval at
    `now` (`expiry` is the time.time() second it expires at, 0: never); None when it has expired."""
    if expiry:
        left = expiry - now
        if left <= 0:
            return None
        props += b"\x02" + _U32.pack(math.ceil(left))
    if alias:
        props = _ALIAS + U16.pack(alias) + props
    return encode_remaining_length(len(props)) + props


def encode_ack(kind: int, packet_id: int, code: int = 0, properties: PropertyMap | None = None) -> bytes:
    """PUBACK, PUBREC, PUBREL or PUBCOMP: the short form when the reason is success and nothing else."""
    first = _FIRST_BYTES[kind]
    if not properties:
        if not code:
            return _B_B_U16.pack(first, 2, packet_id)
        return _B_B_U16_B.pack(first, 3, packet_id, code)
    return packet(first, U16.pack(packet_id) + bytes((code,)) + props_codec.encode(properties))


def encode_connack(session_present: bool, code: int, properties: PropertyMap | None = None) -> bytes:
    return packet(0x20, bytes((1 if session_present else 0, code)) + props_codec.encode(properties))


def encode_subscribe(packet_id: int, filters: list[tuple[str, int]], properties: PropertyMap | None = None) -> bytes:
    parts = [U16.pack(packet_id), props_codec.encode(properties)]
    for topic_filter, options in filters:
        parts += (encode_string(topic_filter), bytes((options,)))
    return packet(0x82, b"".join(parts))


def encode_suback(packet_id: int, codes: list[int], properties: PropertyMap | None = None) -> bytes:
    return packet(0x90, U16.pack(packet_id) + props_codec.encode(properties) + bytes(codes))


def encode_unsubscribe(packet_id: int, filters: list[str], properties: PropertyMap | None = None) -> bytes:
    return packet(0xA2, b"".join([U16.pack(packet_id), props_codec.encode(properties), *map(encode_string, filters)]))


def encode_unsuback(packet_id: int, codes: list[int], properties: PropertyMap | None = None) -> bytes:
    return packet(0xB0, U16.pack(packet_id) + props_codec.encode(properties) + bytes(codes))


def encode_disconnect(code: int = 0, properties: PropertyMap | None = None) -> bytes:
    if not properties:
        return b"\xe0\x00" if not code else bytes((0xE0, 1, code))
    return packet(0xE0, bytes((code,)) + props_codec.encode(properties))


def encode_auth(code: int = 0, properties: PropertyMap | None = None) -> bytes:
    if not properties and not code:
        return b"\xf0\x00"
    return packet(0xF0, bytes((code,)) + props_codec.encode(properties))


def within(limit: int, encode: Callable[[Properties | None], bytes], properties: Properties | None = None,
           optional: frozenset[int] = frozenset()) -> bytes | None:
    """The packet `encode(properties)` makes, at most `limit` bytes long (0: any length): without its
    reason string and user properties if need be, then also without the `optional` properties; None
    when even that is too long, and the packet must not be sent [MQTT-3.1.2-24]."""
    packet = encode(properties)
    if not limit or len(packet) <= limit:
        return packet
    for left_out in (DIAGNOSTIC, DIAGNOSTIC | optional):
        if properties:
            properties = {ident: value for ident, value in properties.items() if ident not in left_out}
        packet = encode(properties)
        if len(packet) <= limit:
            return packet
    return None


def refusal(exc: MalformedPacket) -> str:
    """What a refused packet is logged and told as: its reason code's name, then what broke."""
    return f"{reason_name(exc.code)}: {exc}"


def describe(code: int) -> str:
    """A reason code as logs and reason strings name it."""
    return f"{reason_name(code)} ({code:#04x})"
