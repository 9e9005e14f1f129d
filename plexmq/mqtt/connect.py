"""CONNECT, for every protocol level (3: MQTT 3.1, 4: 3.1.1, 5: 5.0): one decoded shape, so the broker
handles a connection the same way whichever version it speaks (3.1/3.1.1 leave the 5.0 fields empty).
The level is judged before anything after it is read: a level no codec here speaks is refused with
UnsupportedProtocol (CONNACK 0x01), not misread."""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

from plexmq.mqtt import properties as props_codec
from plexmq.mqtt.framing import (
    PROTOCOL_ERROR,
    MalformedPacket,
    UnsupportedProtocol,
    encode_binary,
    encode_string,
    packet,
    read_binary,
    read_string,
)
from plexmq.mqtt.kinds import CONNECT
from plexmq.mqtt.properties import WILL, Properties, PropertyMap
from plexmq.mqtt.reasons import TOPIC_NAME_INVALID
from plexmq.mqtt.topics import topic_name_error

_FIXED = struct.Struct(">BBH")  # protocol level, connect flags, keepalive
LEVELS = {"MQTT": (4, 5), "MQIsdp": (3,)}  # protocol name -> the levels read with it


class RefusedConnect(MalformedPacket):
    """A 5.0 CONNECT that breaks a rule after its protocol level: the client can be told why in a
    CONNACK before the close (section 4.13.1). `properties`: the CONNECT's, None when they could not
    be read (the client's Maximum Packet Size is then unknown)."""

    def __init__(self, refused: MalformedPacket, properties: Properties | None) -> None:
        super().__init__(str(refused), refused.code)
        self.properties = properties


@dataclass(slots=True)
class Will:
    topic: str
    payload: bytes
    qos: int
    retain: bool
    properties: Properties = field(default_factory=dict)  # 5.0 will properties


@dataclass(slots=True)
class Connect:
    protocol_name: str  # "MQTT" or "MQIsdp"
    protocol_level: int  # 3 (3.1), 4 (3.1.1) or 5 (5.0)
    clean_session: bool  # 5.0: clean start
    keepalive: int
    client_id: str
    will: Will | None
    username: str | None
    password: bytes | None
    properties: Properties = field(default_factory=dict)  # 5.0 CONNECT properties


def decode_connect(flags: int, body: bytes | memoryview, max_user: int = props_codec.ANY) -> Connect:
    """A CONNECT body of level 3, 4 or 5; one of level 5 that breaks a rule after its level raises
    RefusedConnect. `max_user` bounds the user properties of each block (5.0)."""
    if flags:
        raise MalformedPacket("CONNECT fixed-header flags not 0")
    protocol_name, pos = read_string(body, 0, "protocol name")
    levels = LEVELS.get(protocol_name)
    if levels is None:
        raise MalformedPacket(f"unknown protocol name {protocol_name!r}")
    if pos + 4 > len(body):
        raise MalformedPacket("truncated CONNECT variable header")
    level, cflags, keepalive = _FIXED.unpack_from(body, pos)
    if level not in levels:
        raise UnsupportedProtocol(protocol_name, level)
    pos += 4
    if level != 5:
        return _decode_rest(body, pos, protocol_name, level, cflags, keepalive, {}, max_user)
    try:
        properties, pos = props_codec.decode(body, pos, CONNECT, max_user)
    except MalformedPacket as exc:
        raise RefusedConnect(exc, None) from None
    try:
        return _decode_rest(body, pos, protocol_name, level, cflags, keepalive, properties, max_user)
    except MalformedPacket as exc:
        raise RefusedConnect(exc, properties) from None


def _decode_rest(body: bytes | memoryview, pos: int, protocol_name: str, level: int, cflags: int, keepalive: int,
                 properties: Properties, max_user: int) -> Connect:
    """The connect flags and the payload at body[pos] (a 5.0 CONNECT's `properties` read before it)."""
    v5 = level == 5
    if cflags & 0x01:
        raise MalformedPacket("reserved connect flag set")
    will_flag = cflags & 0x04
    will_qos = (cflags >> 3) & 0x03
    will_retain = bool(cflags & 0x20)
    if not will_flag and (will_qos or will_retain):
        raise MalformedPacket("will QoS or will retain without will flag")
    if will_qos == 3:
        raise MalformedPacket("will QoS 3")
    if cflags & 0x40 and not cflags & 0x80 and not v5:  # 5.0 allows a password alone
        raise MalformedPacket("password flag without username flag")
    if props_codec.AUTHENTICATION_DATA in properties and props_codec.AUTHENTICATION_METHOD not in properties:
        raise MalformedPacket("authentication data without authentication method", PROTOCOL_ERROR)
    client_id, pos = read_string(body, pos, "client identifier")
    will = None
    if will_flag:
        will_props: Properties = {}
        if v5:
            will_props, pos = props_codec.decode(body, pos, WILL, max_user)
        will_topic, pos = read_string(body, pos, "will topic")
        reason = topic_name_error(will_topic)
        if reason:
            raise MalformedPacket(f"will topic: {reason}", TOPIC_NAME_INVALID)
        will_payload, pos = read_binary(body, pos, "will message")
        will = Will(will_topic, will_payload, will_qos, will_retain, will_props)
    username = password = None
    if cflags & 0x80:
        username, pos = read_string(body, pos, "user name")
    if cflags & 0x40:
        password, pos = read_binary(body, pos, "password")
    if pos != len(body):
        raise MalformedPacket("bytes after CONNECT payload")
    return Connect(protocol_name, level, bool(cflags & 0x02), keepalive, client_id, will, username, password,
                   properties)


def encode_connect(
    client_id: str,
    clean_session: bool = True,
    keepalive: int = 60,
    will: Will | None = None,
    username: str | None = None,
    password: bytes | None = None,
    protocol_level: int = 4,
    properties: PropertyMap | None = None,
) -> bytes:
    """A CONNECT; level 3 is MQTT 3.1 ("MQIsdp"), 5 is 5.0 (with `properties` and the will's)."""
    v5 = protocol_level == 5
    cflags = 0x02 if clean_session else 0
    payload = [encode_string(client_id)]
    if will is not None:
        cflags |= 0x04 | (will.qos << 3) | (0x20 if will.retain else 0)
        if v5:
            payload.append(props_codec.encode(will.properties))
        payload += (encode_string(will.topic), encode_binary(will.payload))
    if username is not None:
        cflags |= 0x80
        payload.append(encode_string(username))
    if password is not None:
        cflags |= 0x40
        payload.append(encode_binary(password))
    name = encode_string("MQIsdp" if protocol_level == 3 else "MQTT")
    head = name + _FIXED.pack(protocol_level, cflags, keepalive)
    if v5:
        head += props_codec.encode(properties)
    return packet(0x10, b"".join((head, *payload)))
