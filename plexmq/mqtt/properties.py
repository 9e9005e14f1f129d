"""MQTT 5.0 properties (section 2.2.2): the table of every property (id, name, type, the packets that
may carry it) and the reader and writer of a property block.

Decoded properties are a dict keyed by property id; the value is an int, str or bytes, except user
properties (a list of (name, value) pairs, in order) and subscription identifiers (a list of ints).
A property that is not allowed on its packet is a malformed packet (0x81); one that appears twice
(but user properties, and subscription identifiers on a PUBLISH) or an out-of-range value is a
protocol error (0x82; a topic alias of 0 is 0x94). A receiver bounds the user properties it reads in
one block (`max_user`): each costs a decoded pair, so 200,000 empty ones in a 1 MB packet would cost
a hundred times the plain packet; one more is refused as a limit, Quota exceeded (0x97), before it is read.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping
from typing import Any, NamedTuple

from plexmq.mqtt import kinds
from plexmq.mqtt.framing import (
    PROTOCOL_ERROR,
    TOPIC_ALIAS_INVALID,
    MalformedPacket,
    encode_binary,
    encode_remaining_length,
    encode_string,
    read_string,
    read_varint,
)
from plexmq.mqtt.reasons import QUOTA_EXCEEDED

WILL = 0  # the will's properties, in the CONNECT payload, are a "packet" of their own here

BYTE, TWO, FOUR, VARINT, STRING, BINARY, PAIR = range(7)

PAYLOAD_FORMAT_INDICATOR = 0x01
MESSAGE_EXPIRY_INTERVAL = 0x02
CONTENT_TYPE = 0x03
RESPONSE_TOPIC = 0x08
CORRELATION_DATA = 0x09
SUBSCRIPTION_IDENTIFIER = 0x0B
SESSION_EXPIRY_INTERVAL = 0x11
ASSIGNED_CLIENT_IDENTIFIER = 0x12
SERVER_KEEP_ALIVE = 0x13
AUTHENTICATION_METHOD = 0x15
AUTHENTICATION_DATA = 0x16
REQUEST_PROBLEM_INFORMATION = 0x17
WILL_DELAY_INTERVAL = 0x18
REQUEST_RESPONSE_INFORMATION = 0x19
RESPONSE_INFORMATION = 0x1A
SERVER_REFERENCE = 0x1C
REASON_STRING = 0x1F
RECEIVE_MAXIMUM = 0x21
TOPIC_ALIAS_MAXIMUM = 0x22
TOPIC_ALIAS = 0x23
MAXIMUM_QOS = 0x24
RETAIN_AVAILABLE = 0x25
USER_PROPERTY = 0x26
MAXIMUM_PACKET_SIZE = 0x27
WILDCARD_SUBSCRIPTION_AVAILABLE = 0x28
SUBSCRIPTION_IDENTIFIER_AVAILABLE = 0x29
SHARED_SUBSCRIPTION_AVAILABLE = 0x2A

ANY = 1 << 28  # no bound on user properties: more than a packet can hold

Value = int | str | bytes | tuple[str, str] | list
Properties = dict[int, Value]
# what the encoders take: any mapping, so that a caller's dict[int, int] will do
PropertyMap = Mapping[int, Value]


class Property(NamedTuple):
    name: str
    type: int
    packets: frozenset[int]


_ACKS = (kinds.PUBACK, kinds.PUBREC, kinds.PUBREL, kinds.PUBCOMP)
_ALL = frozenset((kinds.CONNECT, kinds.CONNACK, kinds.PUBLISH, WILL, *_ACKS, kinds.SUBSCRIBE, kinds.SUBACK,
                  kinds.UNSUBSCRIBE, kinds.UNSUBACK, kinds.DISCONNECT, kinds.AUTH))


def _p(name: str, kind: int, *packets: int) -> Property:
    return Property(name, kind, frozenset(packets))


# section 2.2.2.2, table 2-4
TABLE: dict[int, Property] = {
    PAYLOAD_FORMAT_INDICATOR: _p("payload format indicator", BYTE, kinds.PUBLISH, WILL),
    MESSAGE_EXPIRY_INTERVAL: _p("message expiry interval", FOUR, kinds.PUBLISH, WILL),
    CONTENT_TYPE: _p("content type", STRING, kinds.PUBLISH, WILL),
    RESPONSE_TOPIC: _p("response topic", STRING, kinds.PUBLISH, WILL),
    CORRELATION_DATA: _p("correlation data", BINARY, kinds.PUBLISH, WILL),
    SUBSCRIPTION_IDENTIFIER: _p("subscription identifier", VARINT, kinds.PUBLISH, kinds.SUBSCRIBE),
    SESSION_EXPIRY_INTERVAL: _p("session expiry interval", FOUR, kinds.CONNECT, kinds.CONNACK, kinds.DISCONNECT),
    ASSIGNED_CLIENT_IDENTIFIER: _p("assigned client identifier", STRING, kinds.CONNACK),
    SERVER_KEEP_ALIVE: _p("server keep alive", TWO, kinds.CONNACK),
    AUTHENTICATION_METHOD: _p("authentication method", STRING, kinds.CONNECT, kinds.CONNACK, kinds.AUTH),
    AUTHENTICATION_DATA: _p("authentication data", BINARY, kinds.CONNECT, kinds.CONNACK, kinds.AUTH),
    REQUEST_PROBLEM_INFORMATION: _p("request problem information", BYTE, kinds.CONNECT),
    WILL_DELAY_INTERVAL: _p("will delay interval", FOUR, WILL),
    REQUEST_RESPONSE_INFORMATION: _p("request response information", BYTE, kinds.CONNECT),
    RESPONSE_INFORMATION: _p("response information", STRING, kinds.CONNACK),
    SERVER_REFERENCE: _p("server reference", STRING, kinds.CONNACK, kinds.DISCONNECT),
    REASON_STRING: _p("reason string", STRING, kinds.CONNACK, *_ACKS, kinds.SUBACK, kinds.UNSUBACK,
                      kinds.DISCONNECT, kinds.AUTH),
    RECEIVE_MAXIMUM: _p("receive maximum", TWO, kinds.CONNECT, kinds.CONNACK),
    TOPIC_ALIAS_MAXIMUM: _p("topic alias maximum", TWO, kinds.CONNECT, kinds.CONNACK),
    TOPIC_ALIAS: _p("topic alias", TWO, kinds.PUBLISH),
    MAXIMUM_QOS: _p("maximum QoS", BYTE, kinds.CONNACK),
    RETAIN_AVAILABLE: _p("retain available", BYTE, kinds.CONNACK),
    USER_PROPERTY: Property("user property", PAIR, _ALL),
    MAXIMUM_PACKET_SIZE: _p("maximum packet size", FOUR, kinds.CONNECT, kinds.CONNACK),
    WILDCARD_SUBSCRIPTION_AVAILABLE: _p("wildcard subscription available", BYTE, kinds.CONNACK),
    SUBSCRIPTION_IDENTIFIER_AVAILABLE: _p("subscription identifier available", BYTE, kinds.CONNACK),
    SHARED_SUBSCRIPTION_AVAILABLE: _p("shared subscription available", BYTE, kinds.CONNACK),
}

# what of a PUBLISH a broker passes on to subscribers unchanged (section 3.3.2.3); the message expiry
# interval is passed on as what is left of it, the topic alias and subscription identifiers are per hop
FORWARDED = frozenset((PAYLOAD_FORMAT_INDICATOR, CONTENT_TYPE, RESPONSE_TOPIC, CORRELATION_DATA, USER_PROPERTY))

# values a property may not take (section 3): a byte that must be 0 or 1, a maximum that must not be 0
_FLAGS = frozenset((PAYLOAD_FORMAT_INDICATOR, REQUEST_PROBLEM_INFORMATION, REQUEST_RESPONSE_INFORMATION,
                    MAXIMUM_QOS, RETAIN_AVAILABLE, WILDCARD_SUBSCRIPTION_AVAILABLE,
                    SUBSCRIPTION_IDENTIFIER_AVAILABLE, SHARED_SUBSCRIPTION_AVAILABLE))
_NOT_ZERO = frozenset((RECEIVE_MAXIMUM, MAXIMUM_PACKET_SIZE, SUBSCRIPTION_IDENTIFIER, TOPIC_ALIAS))

_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")


def _protocol_error(reason: str) -> MalformedPacket:
    return MalformedPacket(reason, PROTOCOL_ERROR)


def decode(body: bytes | memoryview, pos: int, kind: int, max_user: int = ANY) -> tuple[Properties, int]:
    """The property block at body[pos] of a packet of `kind` (or WILL): (properties, position after it);
    more than `max_user` user properties: MalformedPacket with QUOTA_EXCEEDED."""
    length, pos = read_varint(body, pos, "property length")
    end = pos + length
    if end > len(body):
        raise MalformedPacket("property length beyond the packet")
    props: Properties = {}
    users = 0
    while pos < end:
        ident = body[pos]
        pos += 1
        prop = TABLE.get(ident)
        if prop is None:
            raise MalformedPacket(f"unknown property {ident:#04x}")
        if kind not in prop.packets:  # a malformed packet, not a protocol error (section 2.2.2.2)
            what = "will properties" if kind == WILL else kinds.NAMES[kind]
            raise MalformedPacket(f"{prop.name} not allowed in {what}")
        ptype = prop.type
        if ptype == BYTE:
            if pos >= end:
                raise MalformedPacket(f"truncated {prop.name}")
            value: Value = body[pos]
            pos += 1
        elif ptype == TWO:
            if pos + 2 > end:
                raise MalformedPacket(f"truncated {prop.name}")
            value = (body[pos] << 8) | body[pos + 1]
            pos += 2
        elif ptype == FOUR:
            if pos + 4 > end:
                raise MalformedPacket(f"truncated {prop.name}")
            value = _U32.unpack_from(body, pos)[0]
            pos += 4
        elif ptype == VARINT:
            value, pos = read_varint(body, pos, prop.name)
            if pos > end:
                raise MalformedPacket(f"truncated {prop.name}")
        elif ptype == PAIR:
            users += 1
            if users > max_user:
                raise MalformedPacket(f"more than {max_user} user properties", QUOTA_EXCEEDED)
            key, pos = _string(body, pos, end, "user property name")
            text, pos = _string(body, pos, end, "user property value")
            value = (key, text)
        elif ptype == BINARY:
            if pos + 2 > end:
                raise MalformedPacket(f"truncated {prop.name}")
            stop = pos + 2 + ((body[pos] << 8) | body[pos + 1])
            if stop > end:
                raise MalformedPacket(f"truncated {prop.name}")
            value = bytes(body[pos + 2:stop])
            pos = stop
        else:
            value, pos = _string(body, pos, end, prop.name)
        if ident in _FLAGS and value not in (0, 1):
            raise _protocol_error(f"{prop.name} {value!r}, not 0 or 1")
        if ident in _NOT_ZERO and not value:
            raise MalformedPacket(f"{prop.name} 0", TOPIC_ALIAS_INVALID if ident == TOPIC_ALIAS else PROTOCOL_ERROR)
        if ident == USER_PROPERTY or (ident == SUBSCRIPTION_IDENTIFIER and kind == kinds.PUBLISH):
            props.setdefault(ident, []).append(value)  # type: ignore[union-attr]  # a list-valued property
        elif ident in props:
            raise _protocol_error(f"{prop.name} more than once")
        else:
            props[ident] = value
    return props, end


def _string(body: bytes | memoryview, pos: int, end: int, what: str) -> tuple[str, int]:
    """The UTF-8 string at body[pos], which must end by `end` (the property block's end)."""
    if pos + 2 > end:
        raise MalformedPacket(f"truncated {what}")
    stop = pos + 2 + ((body[pos] << 8) | body[pos + 1])
    if stop > end:
        raise MalformedPacket(f"truncated {what}")
    return read_string(body, pos, what)


def encode(props: PropertyMap | None) -> bytes:
    """A property block: its length, then each property (lists as one property per item)."""
    if not props:
        return b"\x00"
    block = encode_entries(props)
    return encode_remaining_length(len(block)) + block


def encode_entries(props: PropertyMap) -> bytes:
    """The properties as they follow a block's length (lists as one property per item)."""
    out = []
    item: Any  # of the type TABLE says
    for ident, value in props.items():
        ptype = TABLE[ident].type
        for item in (value if isinstance(value, list) else (value,)):
            out.append(bytes((ident,)))
            if ptype == BYTE:
                out.append(bytes((item,)))
            elif ptype == TWO:
                out.append(_U16.pack(item))
            elif ptype == FOUR:
                out.append(_U32.pack(item))
            elif ptype == VARINT:
                out.append(encode_remaining_length(item))
            elif ptype == STRING:
                out.append(encode_string(item))
            elif ptype == BINARY:
                out.append(encode_binary(item))
            else:
                out.append(encode_string(item[0]) + encode_string(item[1]))
    return b"".join(out)


def forwarded(props: Properties) -> bytes:
    """The entries of `props` that a broker passes on to subscribers unchanged (FORWARDED), as they
    follow a block's length."""
    carried = {ident: value for ident, value in props.items() if ident in FORWARDED}
    return encode_entries(carried) if carried else b""


def names(props: Properties) -> dict[str, Value]:
    """The properties keyed by their spec names, for logs and tests."""
    return {TABLE[ident].name: value for ident, value in props.items()}
