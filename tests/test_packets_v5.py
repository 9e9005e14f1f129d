"""The MQTT 5.0 codec against byte fixtures written out by hand from the MQTT 5.0 spec: one table read
both ways, a table the decoder accepts but the encoder writes shorter, then malformed input with the
reason and the reason code each refusal must carry.

Properties are dicts keyed by property id, written here in wire order: decoding compares them as
dicts, encoding writes them in insertion order, so every fixture checks both.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import pytest
from hypothesis import given
from hypothesis import strategies as st

from plexmq.mqtt import kinds, v4
from plexmq.mqtt import properties as P
from plexmq.mqtt import v5 as p
from plexmq.mqtt.connect import Connect, Will
from plexmq.mqtt.framing import MalformedPacket, UnsupportedProtocol

MALFORMED_CODE = 0x81
PROTOCOL_ERROR = 0x82
TOPIC_NAME_INVALID = 0x90
TOPIC_ALIAS_INVALID = 0x94

ACKS = (p.PUBACK, p.PUBREC, p.PUBREL, p.PUBCOMP)


class Pub(NamedTuple):
    """A PUBLISH as the tests compare it: decode_publish's tuple plus what the fixed-header flags carry."""

    topic: str
    payload: bytes
    qos: int = 0
    retain: bool = False
    dup: bool = False
    packet_id: int = 0
    properties: dict = {}


def decode(kind: int, flags: int, body: Any) -> Any:
    """Dispatch one framed packet to its 5.0 decoder, as a connection would."""
    if kind == p.CONNECT:
        return p.decode_connect(flags, body)
    if kind == p.CONNACK:
        return p.decode_connack(flags, body)
    if kind == p.PUBLISH:
        topic, packet_id, payload, props = p.decode_publish(flags, body)
        return Pub(topic, payload, (flags >> 1) & 3, bool(flags & 1), bool(flags & 8), packet_id, props)
    if kind in ACKS:
        return p.decode_ack(kind, flags, body)
    if kind == p.SUBSCRIBE:
        return p.decode_subscribe(flags, body)
    if kind in (p.SUBACK, p.UNSUBACK):
        return p.decode_suback(kind, flags, body)
    if kind == p.UNSUBSCRIBE:
        return p.decode_unsubscribe(flags, body)
    if kind in (p.DISCONNECT, p.AUTH):
        return p.decode_reason_only(kind, flags, body)
    if kind in (p.PINGREQ, p.PINGRESP):
        return v4.decode_empty(flags, body)  # no 5.0 fields: the 3.1.1 check is the 5.0 check
    raise AssertionError(f"no decoder for packet type {kind}")


def encode(kind: int, value: Any) -> bytes:
    if kind == p.CONNECT:
        v: Connect = value
        return p.encode_connect(v.client_id, v.clean_session, v.keepalive, v.will, v.username, v.password,
                                v.protocol_level, v.properties)
    if kind == p.CONNACK:
        return p.encode_connack(*value)
    if kind == p.PUBLISH:
        return p.encode_publish(value.topic.encode(), value.payload, value.qos, value.retain, value.dup,
                                value.packet_id, value.properties)
    if kind in ACKS:
        return p.encode_ack(kind, *value)
    encoders: dict[int, Callable[..., bytes]] = {
        p.SUBSCRIBE: p.encode_subscribe,
        p.SUBACK: p.encode_suback,
        p.UNSUBSCRIBE: p.encode_unsubscribe,
        p.UNSUBACK: p.encode_unsuback,
        p.DISCONNECT: p.encode_disconnect,
        p.AUTH: p.encode_auth,
    }
    if kind in encoders:
        return encoders[kind](*value)
    return {p.PINGREQ: p.PINGREQ_PACKET, p.PINGRESP: p.PINGRESP_PACKET}[kind]


def h(text: str) -> bytes:
    return bytes.fromhex(text)


def frame_and_decode(raw: bytes | bytearray, body_type: type = bytes) -> Any:
    framed = p.frame(raw, 0, 1 << 20)
    assert framed is not None, "fixture is not a complete packet"
    first, start, end = framed
    assert end == len(raw), "fixture has bytes after the packet"
    body = memoryview(raw)[start:end] if body_type is memoryview else bytes(raw[start:end])
    return decode(first >> 4, first & 0x0F, body)


# property ids, short names for the tables below
PFI, MEI, CT, RT, CD, SID = (P.PAYLOAD_FORMAT_INDICATOR, P.MESSAGE_EXPIRY_INTERVAL, P.CONTENT_TYPE,
                             P.RESPONSE_TOPIC, P.CORRELATION_DATA, P.SUBSCRIPTION_IDENTIFIER)
SEI, ACI, SKA, AM, AD = (P.SESSION_EXPIRY_INTERVAL, P.ASSIGNED_CLIENT_IDENTIFIER, P.SERVER_KEEP_ALIVE,
                         P.AUTHENTICATION_METHOD, P.AUTHENTICATION_DATA)
RPI, WDI, RRI, RI, SR, RS = (P.REQUEST_PROBLEM_INFORMATION, P.WILL_DELAY_INTERVAL, P.REQUEST_RESPONSE_INFORMATION,
                             P.RESPONSE_INFORMATION, P.SERVER_REFERENCE, P.REASON_STRING)
RM, TAM, TA, MQ, RA, UP = (P.RECEIVE_MAXIMUM, P.TOPIC_ALIAS_MAXIMUM, P.TOPIC_ALIAS, P.MAXIMUM_QOS,
                           P.RETAIN_AVAILABLE, P.USER_PROPERTY)
MPS, WSA, SIA, SSA = (P.MAXIMUM_PACKET_SIZE, P.WILDCARD_SUBSCRIPTION_AVAILABLE,
                      P.SUBSCRIPTION_IDENTIFIER_AVAILABLE, P.SHARED_SUBSCRIPTION_AVAILABLE)

MQTT5 = h("0004") + b"MQTT" + h("05")  # protocol name and level: the first 7 bytes of every 5.0 CONNECT body

# (name, packet type, exact bytes, decoded value): every fixture is decoded and encoded.
FIXTURES: list[tuple[str, int, bytes, Any]] = [
    # ------------------------------------------------------------------------------------ CONNECT
    (
        "connect minimal",
        p.CONNECT,
        h("10 0f") + MQTT5 + h("02 003c 00 0002") + b"c1",
        Connect("MQTT", 5, True, 60, "c1", None, None, None, {}),
    ),
    (
        "connect with properties, clean start 0",
        p.CONNECT,
        h("10 2a") + MQTT5 + h("00 001e 1b 11 00000e10 21 0014 27 00010000 22 000a 19 01 17 00 26 0001") + b"k"
        + h("0001") + b"v" + h("0002") + b"c2",
        Connect("MQTT", 5, False, 30, "c2", None, None, None,
                {SEI: 3600, RM: 20, MPS: 65536, TAM: 10, RRI: 1, RPI: 0, UP: [("k", "v")]}),
    ),
    (
        "connect with authentication method and data, empty client id",
        p.CONNECT,
        h("10 1b") + MQTT5 + h("02 0000 0e 15 0005") + b"SCRAM" + h("16 0003 010203 0000"),
        Connect("MQTT", 5, True, 0, "", None, None, None, {AM: "SCRAM", AD: b"\x01\x02\x03"}),
    ),
    (
        "connect will qos 1 retain with every will property, user name, password",
        p.CONNECT,
        h("10 55") + MQTT5 + h("ee 003c 00 0002") + b"c3"
        + h("34 18 0000003c 01 01 02 00000078 03 000a") + b"text/plain" + h("08 0005") + b"r/e/s"
        + h("09 0002 abcd 26 0001") + b"a" + h("0001") + b"1" + h("26 0001") + b"a" + h("0001") + b"2"
        + h("0003") + b"w/t" + h("0003") + b"bye" + h("0001") + b"u" + h("0002") + b"pw",
        Connect("MQTT", 5, True, 60, "c3",
                Will("w/t", b"bye", 1, True, {WDI: 60, PFI: 1, MEI: 120, CT: "text/plain", RT: "r/e/s",
                                              CD: b"\xab\xcd", UP: [("a", "1"), ("a", "2")]}),
                "u", b"pw", {}),
    ),
    (
        "connect password without user name (allowed in 5.0)",
        p.CONNECT,
        h("10 14") + MQTT5 + h("42 003c 00 0002") + b"c4" + h("0003") + b"tok",
        Connect("MQTT", 5, True, 60, "c4", None, None, b"tok", {}),
    ),
    (
        "connect will qos 2 without will properties, empty will message, user name",
        p.CONNECT,
        h("10 1b") + MQTT5 + h("96 0000 00 0002") + b"c5" + h("00 0001") + b"w" + h("0000 0004") + b"user",
        Connect("MQTT", 5, True, 0, "c5", Will("w", b"", 2, False, {}), "user", None, {}),
    ),
    # ------------------------------------------------------------------------------------ CONNACK
    ("connack success", p.CONNACK, h("20 03 00 00 00"), (False, 0x00, {})),
    ("connack session present", p.CONNACK, h("20 03 01 00 00"), (True, 0x00, {})),
    ("connack not authorized", p.CONNACK, h("20 03 00 87 00"), (False, 0x87, {})),
    (
        "connack with the server's properties",
        p.CONNACK,
        h("20 35 00 00 32 12 0004") + b"auto"
        + h("13 001e 21 0400 22 0010 27 00100000 11 0000012c 24 01 25 00 28 01 29 00 2a 00 1a 0004") + b"resp"
        + h("26 0001") + b"x" + h("0001") + b"y",
        (False, 0x00, {ACI: "auto", SKA: 30, RM: 1024, TAM: 16, MPS: 1048576, SEI: 300, MQ: 1, RA: 0, WSA: 1,
                       SIA: 0, SSA: 0, RI: "resp", UP: [("x", "y")]}),
    ),
    (
        "connack use another server with server reference and reason string",
        p.CONNACK,
        h("20 18 00 9c 15 1c 000a") + b"other:1883" + h("1f 0005") + b"moved",
        (False, 0x9C, {SR: "other:1883", RS: "moved"}),
    ),
    (
        "connack with authentication method and data",
        p.CONNACK,
        h("20 10 00 00 0d 15 0005") + b"SCRAM" + h("16 0002") + b"ok",
        (False, 0x00, {AM: "SCRAM", AD: b"ok"}),
    ),
    # ------------------------------------------------------------------------------------ PUBLISH
    ("publish qos 0", p.PUBLISH, h("30 08 0003") + b"a/b" + h("00") + b"hi", Pub("a/b", b"hi")),
    (
        "publish qos 0 retain, empty payload",
        p.PUBLISH,
        h("31 06 0003") + b"a/b" + h("00"),
        Pub("a/b", b"", retain=True),
    ),
    ("publish qos 1", p.PUBLISH, h("32 0a 0003") + b"a/b" + h("0001 00") + b"hi", Pub("a/b", b"hi", 1, packet_id=1)),
    (
        "publish qos 2 dup retain",
        p.PUBLISH,
        h("3d 09 0003") + b"a/b" + h("ffff 00") + b"!",
        Pub("a/b", b"!", 2, True, True, 0xFFFF),
    ),
    (
        "publish qos 1 with message properties, two user properties of one name",
        p.PUBLISH,
        h("32 47 0005") + b"req/x" + h("0007 3b 01 01 02 0000003c 03 0010") + b"application/json"
        + h("08 0007") + b"reply/1" + h("09 0004 00010203 26 0002") + b"id" + h("0001") + b"1"
        + h("26 0002") + b"id" + h("0001") + b"2" + b"{}",
        Pub("req/x", b"{}", 1, packet_id=7,
            properties={PFI: 1, MEI: 60, CT: "application/json", RT: "reply/1", CD: b"\x00\x01\x02\x03",
                        UP: [("id", "1"), ("id", "2")]}),
    ),
    (
        "publish qos 0 setting a topic alias",
        p.PUBLISH,
        h("30 0b 0003") + b"a/b" + h("03 23 0001") + b"hi",
        Pub("a/b", b"hi", properties={TA: 1}),
    ),
    (
        "publish qos 2 with a topic alias and an empty topic",
        p.PUBLISH,
        h("34 0a 0000 0002 03 23 0001") + b"hi",
        Pub("", b"hi", 2, packet_id=2, properties={TA: 1}),
    ),
    (
        "publish 2-byte remaining length (payload 200) with a property",
        p.PUBLISH,
        h("30 d1 01 0001") + b"t" + h("05 02 00000e10") + b"\xab" * 200,
        Pub("t", b"\xab" * 200, properties={MEI: 3600}),
    ),
    (
        "publish 2-byte property length (a 130-byte user property value)",
        p.PUBLISH,
        h("30 8d 01 0001") + b"t" + h("88 01 26 0001") + b"k" + h("0082") + b"v" * 130,
        Pub("t", b"", properties={UP: [("k", "v" * 130)]}),
    ),
    # ---------------------------------------------------------------------- PUBACK PUBREC PUBREL PUBCOMP
    ("puback short form", p.PUBACK, h("40 02 0001"), (1, 0x00, {})),
    ("puback no matching subscribers, reason code only", p.PUBACK, h("40 03 0002 10"), (2, 0x10, {})),
    (
        "puback not authorized with reason string and user property",
        p.PUBACK,
        h("40 14 0003 87 10 1f 0006") + b"denied" + h("26 0001") + b"a" + h("0001") + b"b",
        (3, 0x87, {RS: "denied", UP: [("a", "b")]}),
    ),
    (
        "puback success with a user property keeps the reason code",
        p.PUBACK,
        h("40 0b 0004 00 07 26 0001") + b"a" + h("0001") + b"b",
        (4, 0x00, {UP: [("a", "b")]}),
    ),
    ("pubrec short form", p.PUBREC, h("50 02 abcd"), (0xABCD, 0x00, {})),
    ("pubrec packet identifier in use, reason code only", p.PUBREC, h("50 03 0005 91"), (5, 0x91, {})),
    (
        "pubrec quota exceeded with reason string",
        p.PUBREC,
        h("50 0c 0006 97 08 1f 0005") + b"quota",
        (6, 0x97, {RS: "quota"}),
    ),
    ("pubrel short form", p.PUBREL, h("62 02 0007"), (7, 0x00, {})),
    ("pubrel packet identifier not found, reason code only", p.PUBREL, h("62 03 0008 92"), (8, 0x92, {})),
    (
        "pubrel packet identifier not found with reason string",
        p.PUBREL,
        h("62 0b 0009 92 07 1f 0004") + b"gone",
        (9, 0x92, {RS: "gone"}),
    ),
    ("pubcomp short form", p.PUBCOMP, h("70 02 ffff"), (0xFFFF, 0x00, {})),
    ("pubcomp packet identifier not found, reason code only", p.PUBCOMP, h("70 03 0009 92"), (9, 0x92, {})),
    (
        "pubcomp with reason string and user property",
        p.PUBCOMP,
        h("70 0f 000a 92 0b 1f 0001") + b"x" + h("26 0001") + b"k" + h("0001") + b"v",
        (10, 0x92, {RS: "x", UP: [("k", "v")]}),
    ),
    # ---------------------------------------------------------------------------------- SUBSCRIBE
    (
        "subscribe with options and a subscription identifier",
        p.SUBSCRIBE,
        h("82 26 000a 09 0b 05 26 0001") + b"s" + h("0001") + b"t"
        + h("0003") + b"a/+" + h("01")  # QoS 1
        + h("0003") + b"b/#" + h("06")  # QoS 2, no local
        + h("0001") + b"c" + h("08")  # QoS 0, retain as published
        + h("0003") + b"d/e" + h("1d")  # QoS 1, no local, retain as published, retain handling 1
        + h("0001") + b"f" + h("22"),  # QoS 2, retain handling 2
        (10, [("a/+", 0x01), ("b/#", 0x06), ("c", 0x08), ("d/e", 0x1D), ("f", 0x22)], {SID: 5, UP: [("s", "t")]}),
    ),
    ("subscribe minimal", p.SUBSCRIBE, h("82 07 0001 00 0001") + b"x" + h("00"), (1, [("x", 0)], {})),
    (
        "subscribe with the largest subscription identifier (4-byte varint)",
        p.SUBSCRIBE,
        h("82 0c 0002 05 0b ffffff7f 0001") + b"t" + h("02"),
        (2, [("t", 2)], {SID: 268_435_455}),
    ),
    # ------------------------------------------------------------------------------------- SUBACK
    ("suback granted and refused", p.SUBACK, h("90 09 000a 00 00 01 02 80 9e a2"), (10, [0, 1, 2, 0x80, 0x9E, 0xA2], {})),
    ("suback with reason string", p.SUBACK, h("90 0a 000b 06 1f 0003") + b"nah" + h("87"), (11, [0x87], {RS: "nah"})),
    # -------------------------------------------------------------------------- UNSUBSCRIBE UNSUBACK
    (
        "unsubscribe",
        p.UNSUBSCRIBE,
        h("a2 0d 000b 00 0003") + b"a/+" + h("0003") + b"b/#",
        (11, ["a/+", "b/#"], {}),
    ),
    (
        "unsubscribe with user property",
        p.UNSUBSCRIBE,
        h("a2 0d 000c 07 26 0001") + b"u" + h("0001") + b"p" + h("0001") + b"c",
        (12, ["c"], {UP: [("u", "p")]}),
    ),
    ("unsuback success and no subscription existed", p.UNSUBACK, h("b0 05 000b 00 00 11"), (11, [0x00, 0x11], {})),
    (
        "unsuback refused with reason string",
        p.UNSUBACK,
        h("b0 0c 000c 07 1f 0004") + b"deny" + h("87 8f"),
        (12, [0x87, 0x8F], {RS: "deny"}),
    ),
    # --------------------------------------------------------------------------------- DISCONNECT
    ("disconnect normal, empty", p.DISCONNECT, h("e0 00"), (0x00, {})),
    ("disconnect with will message, reason code only", p.DISCONNECT, h("e0 01 04"), (0x04, {})),
    ("disconnect normal with session expiry", p.DISCONNECT, h("e0 07 00 05 11 0000003c"), (0x00, {SEI: 60})),
    (
        "disconnect with will message, session expiry and reason string",
        p.DISCONNECT,
        h("e0 0d 04 0b 11 00000e10 1f 0003") + b"bye",
        (0x04, {SEI: 3600, RS: "bye"}),
    ),
    (
        "disconnect server shutting down with reason string and user property",
        p.DISCONNECT,
        h("e0 14 8b 12 1f 0008") + b"shutdown" + h("26 0001") + b"a" + h("0001") + b"b",
        (0x8B, {RS: "shutdown", UP: [("a", "b")]}),
    ),
    (
        "disconnect use another server with server reference",
        p.DISCONNECT,
        h("e0 09 9c 07 1c 0004") + b"host",
        (0x9C, {SR: "host"}),
    ),
    # --------------------------------------------------------------------------------------- AUTH
    ("auth success, empty", p.AUTH, h("f0 00"), (0x00, {})),
    (
        "auth continue authentication with method and data",
        p.AUTH,
        h("f0 11 18 0f 15 0005") + b"SCRAM" + h("16 0004 01020304"),
        (0x18, {AM: "SCRAM", AD: b"\x01\x02\x03\x04"}),
    ),
    (
        "auth re-authenticate with method, reason string and user property",
        p.AUTH,
        h("f0 16 19 14 15 0005") + b"SCRAM" + h("1f 0002") + b"re" + h("26 0001") + b"k" + h("0001") + b"v",
        (0x19, {AM: "SCRAM", RS: "re", UP: [("k", "v")]}),
    ),
    ("auth success with method", p.AUTH, h("f0 0a 00 08 15 0005") + b"SCRAM", (0x00, {AM: "SCRAM"})),
    # ----------------------------------------------------------------------------------- PINGs
    ("pingreq", p.PINGREQ, h("c0 00"), None),
    ("pingresp", p.PINGRESP, h("d0 00"), None),
]


def _params(rows: list) -> list:
    return [pytest.param(*row, id=row[0]) for row in rows]


@pytest.mark.parametrize("name,kind,raw,value", _params(FIXTURES))
def test_fixture_decodes(name: str, kind: int, raw: bytes, value: Any) -> None:
    for buf in (raw, bytearray(raw)):
        framed = p.frame(buf, 0, 1 << 20)
        assert framed is not None
        first, start, end = framed
        assert first >> 4 == kind
        assert end == len(raw)
        for body in (bytes(buf[start:end]), memoryview(buf)[start:end]):
            assert decode(kind, first & 0x0F, body) == value


@pytest.mark.parametrize("name,kind,raw,value", _params(FIXTURES))
def test_fixture_encodes(name: str, kind: int, raw: bytes, value: Any) -> None:
    assert encode(kind, value) == raw


@pytest.mark.parametrize(
    "name,raw", [(f[0], f[2]) for f in FIXTURES if f[1] == p.PUBLISH], ids=[f[0] for f in FIXTURES if f[1] == p.PUBLISH]
)
def test_publish_header_is_the_packet_before_its_payload(name: str, raw: bytes) -> None:
    framed = p.frame(raw, 0, 1 << 20)
    assert framed is not None
    first, start, end = framed
    topic, packet_id, payload, props = p.decode_publish(first & 0x0F, raw[start:end])
    qos = (first >> 1) & 3
    header = p.publish_header(topic.encode(), len(payload), qos, bool(first & 1), bool(first & 8), packet_id,
                              P.encode(props))
    assert header + payload == raw


def _property_sets(value: Any) -> list[dict]:
    """Every property dict in a decoded fixture value (a CONNECT's own and its will's)."""
    if isinstance(value, Connect):
        return [value.properties] + ([value.will.properties] if value.will else [])
    if isinstance(value, Pub):
        return [value.properties]
    if isinstance(value, tuple):
        return [value[-1]]
    return []


def test_fixtures_cover_every_packet_kind_and_every_property() -> None:
    assert {f[1] for f in FIXTURES} == set(range(p.CONNECT, p.AUTH + 1))
    seen = {ident for f in FIXTURES for props in _property_sets(f[3]) for ident in props}
    missing = {P.TABLE[i].name for i in set(P.TABLE) - seen}
    assert not missing, f"properties without a fixture: {sorted(missing)}"
    assert seen <= set(P.TABLE)


def test_fixtures_back_to_back_in_one_buffer() -> None:
    buf = bytearray(b"junk") + b"".join(f[2] for f in FIXTURES)
    pos = 4
    for raw, value in [(f[2], f[3]) for f in FIXTURES]:
        framed = p.frame(buf, pos, 1 << 20)
        assert framed is not None
        first, start, end = framed
        assert buf[pos:end] == raw
        assert decode(first >> 4, first & 0x0F, memoryview(buf)[start:end]) == value
        pos = end
    assert p.frame(buf, pos, 1 << 20) is None


# (name, packet type, exact bytes, decoded value): forms the decoder accepts that the encoder never writes;
# encoding the value gives the shorter form (checked to decode to the same value).
DECODE_ONLY: list[tuple[str, int, bytes, Any]] = [
    ("puback success without property length", p.PUBACK, h("40 03 0001 00"), (1, 0x00, {})),
    ("puback success with an empty property block", p.PUBACK, h("40 04 0001 00 00"), (1, 0x00, {})),
    ("puback reason code with an empty property block", p.PUBACK, h("40 04 0002 10 00"), (2, 0x10, {})),
    ("pubrec success with an empty property block", p.PUBREC, h("50 04 0003 00 00"), (3, 0x00, {})),
    ("pubrel success with an empty property block", p.PUBREL, h("62 04 0004 00 00"), (4, 0x00, {})),
    ("pubcomp reason code with an empty property block", p.PUBCOMP, h("70 04 0005 92 00"), (5, 0x92, {})),
    ("disconnect normal, reason code only", p.DISCONNECT, h("e0 01 00"), (0x00, {})),
    ("disconnect normal with an empty property block", p.DISCONNECT, h("e0 02 00 00"), (0x00, {})),
    ("disconnect with will message and an empty property block", p.DISCONNECT, h("e0 02 04 00"), (0x04, {})),
    (
        "subscribe with a non-minimal subscription identifier (81 00 is 1)",
        p.SUBSCRIBE,
        h("82 0a 0001 03 0b 8100 0001") + b"t" + h("00"),
        (1, [("t", 0)], {SID: 1}),
    ),
    (
        "publish with a non-minimal empty property length (80 00)",
        p.PUBLISH,
        h("30 09 0003") + b"a/b" + h("8000") + b"hi",
        Pub("a/b", b"hi"),
    ),
]


@pytest.mark.parametrize("name,kind,raw,value", DECODE_ONLY, ids=[d[0] for d in DECODE_ONLY])
def test_decode_only(name: str, kind: int, raw: bytes, value: Any) -> None:
    for body_type in (bytes, memoryview):
        assert frame_and_decode(raw, body_type) == value
    shorter = encode(kind, value)
    assert len(shorter) < len(raw)
    assert frame_and_decode(shorter) == value


# --------------------------------------------------------------------------------- server PUBLISH

# A PUBLISH from the server carries the subscription identifiers of the matching subscriptions
# (section 3.3.4); decode_publish reads client PUBLISHes, which may not [MQTT-3.3.4-6].
SERVER_PUBLISH = h("30 0d 0003") + b"a/b" + h("05 0b 01 0b 8001") + b"hi"


def test_server_publish_with_subscription_identifiers_encodes() -> None:
    assert p.encode_publish(b"a/b", b"hi", properties={SID: [1, 128]}) == SERVER_PUBLISH
    props, end = P.decode(SERVER_PUBLISH, 7, p.PUBLISH)
    assert props == {SID: [1, 128]} and SERVER_PUBLISH[end:] == b"hi"
    with pytest.raises(MalformedPacket, match="subscription identifier from a client") as refused:
        frame_and_decode(SERVER_PUBLISH)
    assert refused.value.code == PROTOCOL_ERROR


def test_user_properties_beyond_the_bound_are_refused_unread() -> None:
    """`max_user` bounds the user properties of a block: one more is 0x97 before it is read (its
    bytes here are not even a whole property)."""
    block = h("26 0000 0000") * 3
    body = h("0001") + b"t" + bytes((len(block),)) + block
    assert p.decode_publish(0, body, max_user=3)[3] == {P.USER_PROPERTY: [("", "")] * 3}
    body = h("0001") + b"t" + bytes((len(block) + 3,)) + block + h("26 00 00")
    with pytest.raises(MalformedPacket, match="more than 3 user properties") as refused:
        p.decode_publish(0, body, max_user=3)
    assert refused.value.code == 0x97


# ----------------------------------------------------------------------------------- reason codes

# each packet's reason code table in the MQTT 5.0 spec (tables 3-1, 3-4 to 3-11)
SPEC_REASON_CODES: dict[int, set[int]] = {
    p.CONNACK: {0x00, 0x80, 0x81, 0x82, 0x83, 0x84, 0x85, 0x86, 0x87, 0x88, 0x89, 0x8A, 0x8C, 0x90, 0x95, 0x97,
                0x99, 0x9A, 0x9B, 0x9C, 0x9D, 0x9F},
    p.PUBACK: {0x00, 0x10, 0x80, 0x83, 0x87, 0x90, 0x91, 0x97, 0x99},
    p.PUBREC: {0x00, 0x10, 0x80, 0x83, 0x87, 0x90, 0x91, 0x97, 0x99},
    p.PUBREL: {0x00, 0x92},
    p.PUBCOMP: {0x00, 0x92},
    p.SUBACK: {0x00, 0x01, 0x02, 0x80, 0x83, 0x87, 0x8F, 0x91, 0x97, 0x9E, 0xA1, 0xA2},
    p.UNSUBACK: {0x00, 0x11, 0x80, 0x83, 0x87, 0x8F, 0x91},
    p.DISCONNECT: {0x00, 0x04, 0x80, 0x81, 0x82, 0x83, 0x87, 0x89, 0x8B, 0x8D, 0x8E, 0x8F, 0x90, 0x93, 0x94, 0x95,
                   0x96, 0x97, 0x98, 0x99, 0x9A, 0x9B, 0x9C, 0x9D, 0x9E, 0x9F, 0xA0, 0xA1, 0xA2},
    p.AUTH: {0x00, 0x18, 0x19},
}


def _with_reason(kind: int, code: int) -> bytes:
    """The smallest packet of `kind` that carries reason code `code`."""
    return {
        p.CONNACK: h("20 03 00") + bytes((code,)) + h("00"),
        p.PUBACK: h("40 03 0001") + bytes((code,)),
        p.PUBREC: h("50 03 0001") + bytes((code,)),
        p.PUBREL: h("62 03 0001") + bytes((code,)),
        p.PUBCOMP: h("70 03 0001") + bytes((code,)),
        p.SUBACK: h("90 04 0001 00") + bytes((code,)),
        p.UNSUBACK: h("b0 04 0001 00") + bytes((code,)),
        p.DISCONNECT: h("e0 01") + bytes((code,)),
        p.AUTH: h("f0 0a") + bytes((code,)) + h("08 15 0005") + b"SCRAM",
    }[kind]


@pytest.mark.parametrize("kind", sorted(SPEC_REASON_CODES), ids=lambda k: kinds.NAMES[k])
def test_reason_codes_are_exactly_the_spec_table(kind: int) -> None:
    for code in range(256):
        raw = _with_reason(kind, code)
        if code in SPEC_REASON_CODES[kind]:
            frame_and_decode(raw)
        else:
            with pytest.raises(MalformedPacket, match=f"reason code {code:#04x} not allowed") as refused:
                frame_and_decode(raw)
            assert refused.value.code == PROTOCOL_ERROR


# ------------------------------------------------------------------------------ property table

# section 2.2.2.2, table 2-4: each property's type and the packets (0: will properties) that may carry it
_A = (p.PUBACK, p.PUBREC, p.PUBREL, p.PUBCOMP)
SPEC_PROPERTIES: dict[int, tuple[int, set[int]]] = {
    0x01: (P.BYTE, {p.PUBLISH, P.WILL}),
    0x02: (P.FOUR, {p.PUBLISH, P.WILL}),
    0x03: (P.STRING, {p.PUBLISH, P.WILL}),
    0x08: (P.STRING, {p.PUBLISH, P.WILL}),
    0x09: (P.BINARY, {p.PUBLISH, P.WILL}),
    0x0B: (P.VARINT, {p.PUBLISH, p.SUBSCRIBE}),
    0x11: (P.FOUR, {p.CONNECT, p.CONNACK, p.DISCONNECT}),
    0x12: (P.STRING, {p.CONNACK}),
    0x13: (P.TWO, {p.CONNACK}),
    0x15: (P.STRING, {p.CONNECT, p.CONNACK, p.AUTH}),
    0x16: (P.BINARY, {p.CONNECT, p.CONNACK, p.AUTH}),
    0x17: (P.BYTE, {p.CONNECT}),
    0x18: (P.FOUR, {P.WILL}),
    0x19: (P.BYTE, {p.CONNECT}),
    0x1A: (P.STRING, {p.CONNACK}),
    0x1C: (P.STRING, {p.CONNACK, p.DISCONNECT}),
    0x1F: (P.STRING, {p.CONNACK, *_A, p.SUBACK, p.UNSUBACK, p.DISCONNECT, p.AUTH}),
    0x21: (P.TWO, {p.CONNECT, p.CONNACK}),
    0x22: (P.TWO, {p.CONNECT, p.CONNACK}),
    0x23: (P.TWO, {p.PUBLISH}),
    0x24: (P.BYTE, {p.CONNACK}),
    0x25: (P.BYTE, {p.CONNACK}),
    0x26: (P.PAIR, {p.CONNECT, p.CONNACK, p.PUBLISH, P.WILL, *_A, p.SUBSCRIBE, p.SUBACK, p.UNSUBSCRIBE,
                    p.UNSUBACK, p.DISCONNECT, p.AUTH}),
    0x27: (P.FOUR, {p.CONNECT, p.CONNACK}),
    0x28: (P.BYTE, {p.CONNACK}),
    0x29: (P.BYTE, {p.CONNACK}),
    0x2A: (P.BYTE, {p.CONNACK}),
}


def test_property_table_is_the_spec_table() -> None:
    assert {i: (prop.type, set(prop.packets)) for i, prop in P.TABLE.items()} == SPEC_PROPERTIES


# ------------------------------------------------------------------------------------ malformed

# (name, bytes, substring of str(exc), exc.code): each must raise MalformedPacket from frame() or the decoder.
MALFORMED: list[tuple[str, bytes, str, int]] = [
    # framing
    ("remaining length of 5 bytes", h("30 ff ff ff ff 01"), "remaining length exceeds 4 bytes", MALFORMED_CODE),
    # CONNECT
    ("connect fixed-header flags", h("11 0f") + MQTT5 + h("02 003c 00 0002") + b"c1",
     "CONNECT fixed-header flags not 0", MALFORMED_CODE),
    ("connect unknown protocol name", h("10 0f 0004") + b"MQTX" + h("05 02 003c 00 0002") + b"c1",
     "unknown protocol name 'MQTX'", MALFORMED_CODE),
    ("connect truncated variable header", h("10 08") + MQTT5 + h("02"), "truncated CONNECT variable header",
     MALFORMED_CODE),
    ("connect reserved flag", h("10 0f") + MQTT5 + h("03 003c 00 0002") + b"c1",
     "reserved connect flag set", MALFORMED_CODE),
    ("connect will qos without will flag", h("10 0f") + MQTT5 + h("0a 003c 00 0002") + b"c1",
     "will QoS or will retain without will flag", MALFORMED_CODE),
    ("connect truncated will message",
     h("10 17") + MQTT5 + h("06 003c 00 0002") + b"c1" + h("00 0001") + b"w" + h("0005") + b"by",
     "truncated will message", MALFORMED_CODE),
    ("connect invalid UTF-8 in will response topic",
     h("10 1a") + MQTT5 + h("06 003c 00 0002") + b"c1" + h("05 08 0002 c3 28 0001") + b"w" + h("0000"),
     "invalid UTF-8 in response topic", MALFORMED_CODE),
    ("connect will retain without will flag", h("10 0f") + MQTT5 + h("22 003c 00 0002") + b"c1",
     "will QoS or will retain without will flag", MALFORMED_CODE),
    ("connect will qos 3", h("10 1a") + MQTT5 + h("1e 003c 00 0002") + b"c1" + h("00 0003") + b"w/t" + h("0003") + b"bye",
     "will QoS 3", MALFORMED_CODE),
    ("connect without property length", h("10 0a") + MQTT5 + h("02 003c"), "truncated property length", MALFORMED_CODE),
    ("connect property length beyond the packet", h("10 0e") + MQTT5 + h("02 003c 05 11 0000"),
     "property length beyond the packet", MALFORMED_CODE),
    ("connect topic alias in properties", h("10 12") + MQTT5 + h("02 003c 03 23 0001 0002") + b"c1",
     "topic alias not allowed in CONNECT", MALFORMED_CODE),
    ("connect will delay interval in connect properties", h("10 14") + MQTT5 + h("02 003c 05 18 0000000a 0002") + b"c1",
     "will delay interval not allowed in CONNECT", MALFORMED_CODE),
    ("connect session expiry interval in will properties",
     h("10 1a") + MQTT5 + h("06 003c 00 0002") + b"c1" + h("05 11 0000000a 0001") + b"w" + h("0000"),
     "session expiry interval not allowed in will properties", MALFORMED_CODE),
    ("connect authentication data without method", h("10 13") + MQTT5 + h("02 003c 04 16 0001 ff 0002") + b"c1",
     "authentication data without authentication method", PROTOCOL_ERROR),
    ("connect two authentication methods",
     h("10 17") + MQTT5 + h("02 003c 08 15 0001") + b"a" + h("15 0001") + b"b" + h("0002") + b"c1",
     "authentication method more than once", PROTOCOL_ERROR),
    ("connect receive maximum 0", h("10 12") + MQTT5 + h("02 003c 03 21 0000 0002") + b"c1",
     "receive maximum 0", PROTOCOL_ERROR),
    ("connect maximum packet size 0", h("10 14") + MQTT5 + h("02 003c 05 27 00000000 0002") + b"c1",
     "maximum packet size 0", PROTOCOL_ERROR),
    ("connect request problem information 2", h("10 11") + MQTT5 + h("02 003c 02 17 02 0002") + b"c1",
     "request problem information 2, not 0 or 1", PROTOCOL_ERROR),
    ("connect request response information 2", h("10 11") + MQTT5 + h("02 003c 02 19 02 0002") + b"c1",
     "request response information 2, not 0 or 1", PROTOCOL_ERROR),
    ("connect will payload format indicator 2",
     h("10 17") + MQTT5 + h("06 003c 00 0002") + b"c1" + h("02 01 02 0001") + b"w" + h("0000"),
     "payload format indicator 2, not 0 or 1", PROTOCOL_ERROR),
    ("connect will topic with wildcard",
     h("10 17") + MQTT5 + h("06 003c 00 0002") + b"c1" + h("00 0003") + b"w/#" + h("0000"),
     "will topic: wildcard in topic name", TOPIC_NAME_INVALID),
    ("connect U+0000 in client id", h("10 0f") + MQTT5 + h("02 003c 00 0002 61 00"),
     "U+0000 in client identifier", MALFORMED_CODE),
    ("connect user name flag without user name", h("10 0f") + MQTT5 + h("82 003c 00 0002") + b"c1",
     "truncated user name", MALFORMED_CODE),
    ("connect trailing bytes", h("10 10") + MQTT5 + h("02 003c 00 0002") + b"c1" + b"x",
     "bytes after CONNECT payload", MALFORMED_CODE),
    # CONNACK
    ("connack fixed-header flags", h("21 03 00 00 00"), "CONNACK fixed-header flags not 0", MALFORMED_CODE),
    ("connack 3.1.1 form without property length", h("20 02 00 00"), "truncated CONNACK", MALFORMED_CODE),
    ("connack reserved acknowledge flags", h("20 03 02 00 00"), "reserved CONNACK flags set", MALFORMED_CODE),
    ("connack 3.1.1 return code 5", h("20 03 00 05 00"), "reason code 0x05 not allowed", PROTOCOL_ERROR),
    ("connack server shutting down (DISCONNECT only)", h("20 03 00 8b 00"), "reason code 0x8b not allowed",
     PROTOCOL_ERROR),
    ("connack bytes after the properties", h("20 04 00 00 00 ff"), "bytes after the properties", MALFORMED_CODE),
    ("connack maximum qos 2", h("20 05 00 00 02 24 02"), "maximum QoS 2, not 0 or 1", PROTOCOL_ERROR),
    ("connack retain available 2", h("20 05 00 00 02 25 02"), "retain available 2, not 0 or 1", PROTOCOL_ERROR),
    ("connack wildcard subscription available 2", h("20 05 00 00 02 28 02"),
     "wildcard subscription available 2, not 0 or 1", PROTOCOL_ERROR),
    ("connack subscription identifier available 2", h("20 05 00 00 02 29 02"),
     "subscription identifier available 2, not 0 or 1", PROTOCOL_ERROR),
    ("connack shared subscription available 2", h("20 05 00 00 02 2a 02"),
     "shared subscription available 2, not 0 or 1", PROTOCOL_ERROR),
    ("connack maximum packet size 0", h("20 08 00 00 05 27 00000000"), "maximum packet size 0", PROTOCOL_ERROR),
    ("connack two assigned client identifiers", h("20 0b 00 00 08 12 0001") + b"a" + h("12 0001") + b"b",
     "assigned client identifier more than once", PROTOCOL_ERROR),
    ("connack truncated server keep alive", h("20 05 00 00 02 13 00"), "truncated server keep alive", MALFORMED_CODE),
    ("connack truncated property length", h("20 03 00 00 80"), "truncated property length", MALFORMED_CODE),
    ("connack topic alias", h("20 06 00 00 03 23 0001"), "topic alias not allowed in CONNACK", MALFORMED_CODE),
    # PUBLISH
    ("publish qos 3", h("36 08 0003") + b"a/b" + h("0001 00"), "PUBLISH QoS 3", MALFORMED_CODE),
    ("publish dup on qos 0", h("38 06 0003") + b"a/b" + h("00"), "DUP set on QoS 0 PUBLISH", PROTOCOL_ERROR),
    ("publish empty body", h("30 00"), "truncated topic name", MALFORMED_CODE),
    ("publish truncated topic", h("30 03 0005 61"), "truncated topic name", MALFORMED_CODE),
    ("publish invalid UTF-8 topic", h("30 05 0002 c3 28 00"), "invalid UTF-8 in topic name", MALFORMED_CODE),
    ("publish missing packet identifier", h("32 05 0003") + b"a/b", "missing packet identifier", MALFORMED_CODE),
    ("publish packet identifier 0", h("32 08 0003") + b"a/b" + h("0000 00"), "packet identifier 0", MALFORMED_CODE),
    ("publish qos 0 without property length (3.1.1 layout)", h("30 05 0003") + b"a/b", "missing property length",
     MALFORMED_CODE),
    ("publish qos 1 without property length (3.1.1 layout)", h("32 07 0003") + b"a/b" + h("0001"),
     "missing property length", MALFORMED_CODE),
    ("publish empty topic without topic alias", h("30 03 0000 00"), "empty topic name without a topic alias",
     PROTOCOL_ERROR),
    ("publish empty topic with properties but no topic alias", h("30 05 0000 02 01 01"),
     "empty topic name without a topic alias", PROTOCOL_ERROR),
    ("publish + in topic", h("30 06 0003") + b"a/+" + h("00"), "wildcard in topic name", TOPIC_NAME_INVALID),
    ("publish # in topic", h("30 06 0003") + b"a/#" + h("00"), "wildcard in topic name", TOPIC_NAME_INVALID),
    ("publish wildcard topic with a topic alias", h("30 09 0003") + b"#/b" + h("03 23 0001"), "wildcard in topic name",
     TOPIC_NAME_INVALID),
    ("publish U+0000 in topic", h("30 06 0003 61 00 62 00"), "U+0000", MALFORMED_CODE),
    ("publish subscription identifier from a client", h("30 08 0003") + b"a/b" + h("02 0b 01"),
     "subscription identifier from a client", PROTOCOL_ERROR),
    ("publish subscription identifier 0", h("30 08 0003") + b"a/b" + h("02 0b 00"), "subscription identifier 0",
     PROTOCOL_ERROR),
    ("publish topic alias 0", h("30 09 0003") + b"a/b" + h("03 23 0000"), "topic alias 0", TOPIC_ALIAS_INVALID),
    ("publish two message expiry intervals", h("30 10 0003") + b"a/b" + h("0a 02 00000001 02 00000002"),
     "message expiry interval more than once", PROTOCOL_ERROR),
    ("publish two topic aliases", h("30 0c 0003") + b"a/b" + h("06 23 0001 23 0002"), "topic alias more than once",
     PROTOCOL_ERROR),
    ("publish two response topics", h("30 0e 0003") + b"a/b" + h("08 08 0001") + b"r" + h("08 0001") + b"s",
     "response topic more than once", PROTOCOL_ERROR),
    ("publish + in response topic", h("30 0c 0003") + b"a/b" + h("06 08 0003") + b"r/+", "wildcard in response topic",
     PROTOCOL_ERROR),
    ("publish # in response topic", h("30 0c 0003") + b"a/b" + h("06 08 0003") + b"r/#", "wildcard in response topic",
     PROTOCOL_ERROR),
    ("publish payload format indicator 2", h("30 08 0003") + b"a/b" + h("02 01 02"),
     "payload format indicator 2, not 0 or 1", PROTOCOL_ERROR),
    ("publish session expiry interval", h("30 0b 0003") + b"a/b" + h("05 11 00000001"),
     "session expiry interval not allowed in PUBLISH", MALFORMED_CODE),
    ("publish reason string", h("30 0b 0003") + b"a/b" + h("05 1f 0002") + b"no",
     "reason string not allowed in PUBLISH", MALFORMED_CODE),
    ("publish unknown property 0x7f", h("30 08 0003") + b"a/b" + h("02 7f 00"), "unknown property 0x7f",
     MALFORMED_CODE),
    ("publish unknown property 0x00", h("30 07 0003") + b"a/b" + h("01 00"), "unknown property 0x00", MALFORMED_CODE),
    ("publish 2-byte property identifier", h("30 09 0003") + b"a/b" + h("03 81 00 01"), "unknown property 0x81",
     MALFORMED_CODE),
    ("publish truncated payload format indicator, payload follows", h("30 09 0003") + b"a/b" + h("01 01") + b"hi",
     "truncated payload format indicator", MALFORMED_CODE),
    ("publish truncated message expiry interval, payload follows", h("30 0c 0003") + b"a/b" + h("03 02 0000") + b"xyz",
     "truncated message expiry interval", MALFORMED_CODE),
    ("publish truncated topic alias, payload follows", h("30 0a 0003") + b"a/b" + h("02 23 00") + b"hi",
     "truncated topic alias", MALFORMED_CODE),
    ("publish truncated content type, payload follows", h("30 0f 0003") + b"a/b" + h("04 03 0005 61") + b"bcdef",
     "truncated content type", MALFORMED_CODE),
    ("publish truncated correlation data, payload follows", h("30 0a 0003") + b"a/b" + h("03 09 0001") + b"x",
     "truncated correlation data", MALFORMED_CODE),
    ("publish truncated user property value, payload follows",
     h("30 0d 0003") + b"a/b" + h("05 26 0001") + b"k" + h("00") + b"vv",
     "truncated user property value", MALFORMED_CODE),
    ("publish truncated subscription identifier, payload follows", h("30 09 0003") + b"a/b" + h("02 0b 80 01"),
     "truncated subscription identifier", MALFORMED_CODE),
    ("publish property length beyond the packet", h("30 07 0003") + b"a/b" + h("05 01"),
     "property length beyond the packet", MALFORMED_CODE),
    ("publish property length longer than 4 bytes", h("30 0a 0003") + b"a/b" + h("ff ff ff ff 01"),
     "property length longer than 4 bytes", MALFORMED_CODE),
    ("publish invalid UTF-8 in content type", h("30 0b 0003") + b"a/b" + h("05 03 0002 c3 28"),
     "invalid UTF-8 in content type", MALFORMED_CODE),
    ("publish U+0000 in user property name", h("30 0d 0003") + b"a/b" + h("07 26 0001 00 0001") + b"v",
     "U+0000 in user property name", MALFORMED_CODE),
    # PUBACK PUBREC PUBREL PUBCOMP
    ("puback fixed-header flags", h("42 02 0001"), "fixed-header flags", MALFORMED_CODE),
    ("pubrec fixed-header flags", h("52 02 0001"), "fixed-header flags", MALFORMED_CODE),
    ("pubrel fixed-header flags 0", h("60 02 0001"), "fixed-header flags", MALFORMED_CODE),
    ("pubcomp fixed-header flags", h("71 02 0001"), "fixed-header flags", MALFORMED_CODE),
    ("puback missing packet identifier", h("40 01 00"), "missing packet identifier", MALFORMED_CODE),
    ("puback packet identifier 0", h("40 02 0000"), "packet identifier 0", MALFORMED_CODE),
    ("puback packet identifier not found (PUBREL/PUBCOMP only)", h("40 03 0001 92"), "reason code 0x92 not allowed",
     PROTOCOL_ERROR),
    ("pubrec disconnect with will (DISCONNECT only)", h("50 03 0001 04"), "reason code 0x04 not allowed",
     PROTOCOL_ERROR),
    ("pubrel no matching subscribers", h("62 03 0001 10"), "reason code 0x10 not allowed", PROTOCOL_ERROR),
    ("pubcomp unspecified error", h("70 03 0001 80"), "reason code 0x80 not allowed", PROTOCOL_ERROR),
    ("puback bytes after the properties", h("40 05 0001 00 00 ff"), "bytes after the properties", MALFORMED_CODE),
    ("puback property length beyond the packet", h("40 05 0001 10 03 1f"), "property length beyond the packet",
     MALFORMED_CODE),
    ("puback two reason strings", h("40 0c 0001 80 08 1f 0001") + b"a" + h("1f 0001") + b"b",
     "reason string more than once", PROTOCOL_ERROR),
    ("pubrel subscription identifier", h("62 06 0001 92 02 0b 01"), "subscription identifier not allowed in PUBREL",
     MALFORMED_CODE),
    # SUBSCRIBE
    ("subscribe fixed-header flags 0", h("80 07 0001 00 0001") + b"x" + h("00"),
     "SUBSCRIBE fixed-header flags not 0b0010", MALFORMED_CODE),
    ("subscribe no packet identifier", h("82 00"), "missing packet identifier", MALFORMED_CODE),
    ("subscribe packet identifier 0", h("82 07 0000 00 0001") + b"x" + h("00"), "packet identifier 0", MALFORMED_CODE),
    ("subscribe without property length (3.1.1 layout)", h("82 06 0001 0001") + b"x" + h("01"),
     "truncated topic filter", MALFORMED_CODE),
    ("subscribe without topic filters", h("82 03 0001 00"), "SUBSCRIBE without topic filters", PROTOCOL_ERROR),
    ("subscribe with properties but without topic filters", h("82 05 0001 02 0b 01"),
     "SUBSCRIBE without topic filters", PROTOCOL_ERROR),
    ("subscribe missing subscription options", h("82 06 0001 00 0001") + b"x", "missing subscription options",
     MALFORMED_CODE),
    ("subscribe truncated topic filter", h("82 06 0001 00 0005") + b"x", "truncated topic filter", MALFORMED_CODE),
    ("subscribe U+0000 in topic filter", h("82 07 0001 00 0001 00 00"), "U+0000 in topic filter", MALFORMED_CODE),
    ("subscribe reserved option bit 6", h("82 07 0001 00 0001") + b"x" + h("40"),
     "reserved bits set in subscription options", MALFORMED_CODE),
    ("subscribe reserved option bit 7", h("82 07 0001 00 0001") + b"x" + h("81"),
     "reserved bits set in subscription options", MALFORMED_CODE),
    ("subscribe retain handling 3", h("82 07 0001 00 0001") + b"x" + h("31"), "retain handling 3", PROTOCOL_ERROR),
    ("subscribe qos 3", h("82 07 0001 00 0001") + b"x" + h("03"), "QoS 3", PROTOCOL_ERROR),
    ("subscribe no local on a shared subscription", h("82 10 0001 00 000a") + b"$share/g/t" + h("05"), "shared",
     PROTOCOL_ERROR),
    ("subscribe two subscription identifiers", h("82 0b 0001 04 0b 01 0b 02 0001") + b"x" + h("00"),
     "subscription identifier more than once", PROTOCOL_ERROR),
    ("subscribe subscription identifier 0", h("82 09 0001 02 0b 00 0001") + b"x" + h("00"),
     "subscription identifier 0", PROTOCOL_ERROR),
    ("subscribe subscription identifier longer than 4 bytes", h("82 0d 0001 06 0b ffffffff7f 0001") + b"x" + h("00"),
     "subscription identifier longer than 4 bytes", MALFORMED_CODE),
    ("subscribe property length longer than 4 bytes", h("82 07 0001 ffffffff01"),
     "property length longer than 4 bytes", MALFORMED_CODE),
    ("subscribe reason string", h("82 0b 0001 04 1f 0001") + b"r" + h("0001") + b"x" + h("00"),
     "reason string not allowed in SUBSCRIBE", MALFORMED_CODE),
    # UNSUBSCRIBE
    ("unsubscribe fixed-header flags 0", h("a0 06 0001 00 0001") + b"x", "UNSUBSCRIBE fixed-header flags not 0b0010",
     MALFORMED_CODE),
    ("unsubscribe without topic filters", h("a2 03 0001 00"), "UNSUBSCRIBE without topic filters", PROTOCOL_ERROR),
    ("unsubscribe without property length", h("a2 02 0001"), "truncated property length", MALFORMED_CODE),
    ("unsubscribe packet identifier 0", h("a2 06 0000 00 0001") + b"x", "packet identifier 0", MALFORMED_CODE),
    ("unsubscribe truncated topic filter", h("a2 06 0001 00 0003") + b"x", "truncated topic filter", MALFORMED_CODE),
    ("unsubscribe subscription identifier", h("a2 08 0001 02 0b 01 0001") + b"x",
     "subscription identifier not allowed in UNSUBSCRIBE", MALFORMED_CODE),
    # SUBACK UNSUBACK
    ("suback fixed-header flags", h("92 04 0001 00 00"), "fixed-header flags not 0", MALFORMED_CODE),
    ("suback without reason codes", h("90 03 0001 00"), "no reason codes", PROTOCOL_ERROR),
    ("suback no subscription existed (UNSUBACK only)", h("90 04 0001 00 11"), "reason code 0x11 not allowed",
     PROTOCOL_ERROR),
    ("suback 3.1.1 failure without property length", h("90 03 0001 80"), "truncated property length", MALFORMED_CODE),
    ("suback topic alias", h("90 07 0001 03 23 0001 00"), "topic alias not allowed in SUBACK", MALFORMED_CODE),
    ("unsuback granted qos 1 (SUBACK only)", h("b0 04 0001 00 01"), "reason code 0x01 not allowed", PROTOCOL_ERROR),
    ("unsuback 3.1.1 layout", h("b0 02 0001"), "truncated property length", MALFORMED_CODE),
    ("unsuback without reason codes", h("b0 03 0001 00"), "no reason codes", PROTOCOL_ERROR),
    ("unsuback packet identifier 0", h("b0 04 0000 00 00"), "packet identifier 0", MALFORMED_CODE),
    # DISCONNECT
    ("disconnect fixed-header flags", h("e2 00"), "fixed-header flags not 0", MALFORMED_CODE),
    ("disconnect continue authentication (AUTH only)", h("e0 01 18"), "reason code 0x18 not allowed", PROTOCOL_ERROR),
    ("disconnect packet identifier in use", h("e0 01 91"), "reason code 0x91 not allowed", PROTOCOL_ERROR),
    ("disconnect bytes after the properties", h("e0 03 00 00 ff"), "bytes after the properties", MALFORMED_CODE),
    ("disconnect property length beyond the packet", h("e0 03 80 05 1f"), "property length beyond the packet",
     MALFORMED_CODE),
    ("disconnect two session expiry intervals", h("e0 0c 00 0a 11 00000001 11 00000002"),
     "session expiry interval more than once", PROTOCOL_ERROR),
    ("disconnect unknown property 0xff", h("e0 04 00 02 ff 00"), "unknown property 0xff", MALFORMED_CODE),
    ("disconnect assigned client identifier", h("e0 06 00 04 12 0001") + b"a",
     "assigned client identifier not allowed in DISCONNECT", MALFORMED_CODE),
    # AUTH
    ("auth fixed-header flags", h("f1 00"), "fixed-header flags not 0", MALFORMED_CODE),
    ("auth disconnect with will (DISCONNECT only)", h("f0 02 04 00"), "reason code 0x04 not allowed", PROTOCOL_ERROR),
    ("auth not authorized", h("f0 02 87 00"), "reason code 0x87 not allowed", PROTOCOL_ERROR),
    ("auth bytes after the properties", h("f0 03 18 00 00"), "bytes after the properties", MALFORMED_CODE),
    ("auth two authentication methods", h("f0 0a 18 08 15 0001") + b"a" + h("15 0001") + b"b",
     "authentication method more than once", PROTOCOL_ERROR),
    ("auth session expiry interval", h("f0 07 18 05 11 00000001"), "session expiry interval not allowed in AUTH",
     MALFORMED_CODE),
    ("auth continue authentication without authentication method", h("f0 02 18 00"), "authentication method",
     PROTOCOL_ERROR),
]



@pytest.mark.parametrize("name,raw,reason,code", _params(MALFORMED))
def test_malformed(name: str, raw: bytes, reason: str, code: int) -> None:
    for body_type in (bytes, memoryview):
        with pytest.raises(MalformedPacket) as excinfo:
            frame_and_decode(raw, body_type)
        assert reason in str(excinfo.value)
        assert excinfo.value.code == code, f"code {excinfo.value.code:#04x}, expected {code:#04x}"


def test_malformed_names_are_unique() -> None:
    names = [m[0] for m in MALFORMED] + [f[0] for f in FIXTURES] + [d[0] for d in DECODE_ONLY]
    assert len(names) == len(set(names))


def test_connect_of_level_4_or_3_reads_no_properties() -> None:
    # the same body as "connect minimal" less its property length, at level 4: no 5.0 fields
    body = h("0004") + b"MQTT" + h("04 02 003c 0002") + b"c1"
    assert p.decode_connect(0, body) == Connect("MQTT", 4, True, 60, "c1", None, None, None, {})
    with pytest.raises(UnsupportedProtocol):
        p.decode_connect(0, h("0004") + b"MQTT" + h("06 02 003c 00 0002") + b"c1")


# --------------------------------------------------------------------------------- hypothesis

text = st.text(st.characters(blacklist_categories=["Cs"], blacklist_characters="\x00"), max_size=20)
topic_names = st.text(st.characters(blacklist_categories=["Cs"], blacklist_characters="+#\x00"), min_size=1,
                      max_size=40)
NOT_ZERO = {RM, MPS, TA, SID}  # "a Protocol Error ... to have the value 0" (sections 3.1.2.11, 3.2.2.3, 3.3.2.3)
KINDS_WITH_PROPERTIES = sorted({k for prop in P.TABLE.values() for k in prop.packets})


def property_value(ident: int, kind: int) -> st.SearchStrategy:
    ptype = P.TABLE[ident].type
    low = 1 if ident in NOT_ZERO else 0
    if ident == UP:
        return st.lists(st.tuples(text, text), min_size=1, max_size=3)
    if ident == SID:
        one = st.integers(1, 268_435_455)
        return st.lists(one, min_size=1, max_size=3) if kind == p.PUBLISH else one
    return {
        P.BYTE: st.integers(0, 1),
        P.TWO: st.integers(low, 0xFFFF),
        P.FOUR: st.integers(low, 0xFFFF_FFFF),
        P.STRING: text,
        P.BINARY: st.binary(max_size=20),
    }[ptype]


@st.composite
def property_sets(draw: Any, kind: int, exclude: frozenset[int] = frozenset()) -> dict:
    """Valid properties of a packet of `kind`, in a random wire order."""
    allowed = sorted(i for i, prop in P.TABLE.items() if kind in prop.packets and i not in exclude)
    idents = draw(st.lists(st.sampled_from(allowed), unique=True, max_size=len(allowed)))
    return {i: draw(property_value(i, kind)) for i in idents}


@given(st.data())
def test_properties_round_trip(data: st.DataObject) -> None:
    kind = data.draw(st.sampled_from(KINDS_WITH_PROPERTIES))
    props = data.draw(property_sets(kind))
    raw = P.encode(props)
    for buf in (raw, memoryview(raw), b"xy" + raw + b"tail"):
        start = 2 if len(buf) != len(raw) else 0
        decoded, end = P.decode(buf, start, kind)
        assert decoded == props
        assert end == start + len(raw)
    assert P.encode(decoded) == raw  # wire order, and the order of user properties, kept


@given(st.binary(max_size=40), st.sampled_from(KINDS_WITH_PROPERTIES))
def test_garbage_properties_raise_only_malformed(data: bytes, kind: int) -> None:
    try:
        props, end = P.decode(data, 0, kind)
    except MalformedPacket as exc:
        assert exc.code in (MALFORMED_CODE, PROTOCOL_ERROR)
    else:
        assert end <= len(data)
        assert set(props) <= {i for i, prop in P.TABLE.items() if kind in prop.packets}


@given(
    topic=topic_names | st.just(""),
    payload=st.binary(max_size=2000),
    qos=st.integers(0, 2),
    retain=st.booleans(),
    dup=st.booleans(),
    packet_id=st.integers(1, 0xFFFF),
    props=property_sets(p.PUBLISH, exclude=frozenset({SID})),
)
def test_publish_round_trip(topic: str, payload: bytes, qos: int, retain: bool, dup: bool, packet_id: int,
                            props: dict) -> None:
    if not topic:
        props.setdefault(TA, 1)
    if RT in props:  # a topic name: no wildcards [MQTT-3.3.2-14]
        props[RT] = props[RT].replace("+", "x").replace("#", "x")
    value = Pub(topic, payload, qos, retain, dup and qos > 0, packet_id if qos else 0, props)
    raw = encode(p.PUBLISH, value)
    for body_type in (bytes, memoryview):
        assert frame_and_decode(raw, body_type) == value
    header = p.publish_header(topic.encode(), len(payload), qos, retain, value.dup, value.packet_id, P.encode(props))
    assert header + payload == raw


@given(
    client_id=text,
    clean=st.booleans(),
    keepalive=st.integers(0, 0xFFFF),
    will=st.none() | st.builds(Will, topic_names, st.binary(max_size=50), st.integers(0, 2), st.booleans(),
                               property_sets(P.WILL)),
    username=st.none() | text,
    password=st.none() | st.binary(max_size=50),
    props=property_sets(p.CONNECT),
)
def test_connect_round_trip(client_id, clean, keepalive, will, username, password, props) -> None:
    if AD in props and AM not in props:
        del props[AD]
    value = Connect("MQTT", 5, clean, keepalive, client_id, will, username, password, props)
    raw = encode(p.CONNECT, value)
    assert frame_and_decode(raw, memoryview) == value


@given(st.binary(max_size=64))
def test_garbage_never_raises_anything_but_malformed(data: bytes) -> None:
    for first in range(0x10, 0x100):
        try:
            decode(first >> 4, first & 0x0F, data)
        except MalformedPacket as exc:
            assert exc.code in (MALFORMED_CODE, PROTOCOL_ERROR, TOPIC_NAME_INVALID)
        except UnsupportedProtocol:
            assert first >> 4 == p.CONNECT


def test_raw_runs_convert_between_the_versions_byte_exact() -> None:
    """The raw path's two rewrites: 3.1.1 QoS 0 packets gain an empty property block for 5.0
    subscribers, 5.0 ones without properties lose it on their way to the router."""
    v4_run = bytes.fromhex("3005 0001") + b"t" + b"ab" + bytes.fromhex("3004 0001") + b"t" + b"c"
    v5_run = bytes.fromhex("3006 0001") + b"t" + b"\x00ab" + bytes.fromhex("3005 0001") + b"t" + b"\x00c"
    assert p.publishes_from_v4(v4_run) == v5_run
    assert p.publishes_to_v4(v5_run) == v4_run
    long = bytes.fromhex("308001 0001") + b"t" + b"\x00" + b"y" * 124  # 128 bytes after the fixed header
    assert p.publishes_to_v4(long) == bytes.fromhex("307f 0001") + b"t" + b"y" * 124  # its length: one byte shorter
