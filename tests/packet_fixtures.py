"""The MQTT 3.1.1 codec's byte fixtures written out by hand (tests/test_packets.py reads them both
ways; the fuzzer, tests/fuzz.py, mutates them): well-formed packets with their decoded value, and
malformed ones."""

from __future__ import annotations

from typing import Any, NamedTuple

from plexmq.mqtt import v4 as p
from plexmq.mqtt.v4 import Connect, Will


def h(text: str) -> bytes:
    return bytes.fromhex(text)


class Pub(NamedTuple):
    """A PUBLISH as the tests compare it: decode_publish's tuple plus what the fixed-header flags carry."""

    topic: str
    payload: bytes
    qos: int = 0
    retain: bool = False
    dup: bool = False
    packet_id: int = 0


# (name, packet type, exact bytes, decoded value): every fixture is decoded and encoded.
FIXTURES: list[tuple[str, int, bytes, Any]] = [
    (
        "connect 3.1.1 minimal",
        p.CONNECT,
        h("10 0e 0004") + b"MQTT" + h("04 02 003c 0002") + b"c1",
        Connect("MQTT", 4, True, 60, "c1", None, None, None),
    ),
    (
        "connect with will qos 1 retain",
        p.CONNECT,
        h("10 18 0004") + b"MQTT" + h("04 2e 001e 0002") + b"c2" + h("0003") + b"w/t" + h("0003") + b"bye",
        Connect("MQTT", 4, True, 30, "c2", Will("w/t", b"bye", 1, True), None, None),
    ),
    (
        "connect with username and binary password",
        p.CONNECT,
        h("10 16 0004") + b"MQTT" + h("04 c2 000a 0002") + b"c3" + h("0001") + b"u" + h("0003 70 00 77"),
        Connect("MQTT", 4, True, 10, "c3", None, "u", b"p\x00w"),
    ),
    (
        "connect 3.1 MQIsdp level 3",
        p.CONNECT,
        h("10 14 0006") + b"MQIsdp" + h("03 02 003c 0006") + b"legacy",
        Connect("MQIsdp", 3, True, 60, "legacy", None, None, None),
    ),
    (
        "connect clean session 0, keepalive 0",
        p.CONNECT,
        h("10 0d 0004") + b"MQTT" + h("04 00 0000 0001") + b"p",
        Connect("MQTT", 4, False, 0, "p", None, None, None),
    ),
    (
        "connect everything: will qos 2 empty message, user, password, empty client id",
        p.CONNECT,
        h("10 20 0004") + b"MQTT" + h("04 f4 ffff 0000 0005") + b"d/i/e" + h("0000 0004") + b"user" + h("0003") + b"pw!",
        Connect("MQTT", 4, False, 65535, "", Will("d/i/e", b"", 2, True), "user", b"pw!"),
    ),
    ("connack accepted", p.CONNACK, h("20 02 00 00"), (False, 0)),
    ("connack session present", p.CONNACK, h("20 02 01 00"), (True, 0)),
    ("connack not authorized", p.CONNACK, h("20 02 00 05"), (False, 5)),
    ("publish qos 0", p.PUBLISH, h("30 07 0003") + b"a/b" + b"hi", Pub("a/b", b"hi")),
    ("publish qos 0 retain", p.PUBLISH, h("31 07 0003") + b"a/b" + b"hi", Pub("a/b", b"hi", retain=True)),
    ("publish qos 0 empty payload", p.PUBLISH, h("30 05 0003") + b"a/b", Pub("a/b", b"")),
    ("publish qos 1", p.PUBLISH, h("32 09 0003") + b"a/b" + h("0001") + b"hi", Pub("a/b", b"hi", 1, packet_id=1)),
    (
        "publish qos 1 dup retain",
        p.PUBLISH,
        h("3b 09 0003") + b"a/b" + h("1234") + b"hi",
        Pub("a/b", b"hi", 1, True, True, 0x1234),
    ),
    ("publish qos 2", p.PUBLISH, h("34 08 0003") + b"a/b" + h("ffff") + b"!", Pub("a/b", b"!", 2, packet_id=0xFFFF)),
    (
        "publish qos 2 dup",
        p.PUBLISH,
        h("3c 07 0003") + b"a/b" + h("0002"),
        Pub("a/b", b"", 2, dup=True, packet_id=2),
    ),
    (
        "publish non-ascii topic, binary payload",
        p.PUBLISH,
        h("30 0c 0008") + "café/ü".encode() + h("00 ff"),
        Pub("café/ü", b"\x00\xff"),
    ),
    (
        "publish 2-byte remaining length (payload 200)",
        p.PUBLISH,
        h("30 cb 01 0001") + b"t" + b"\xab" * 200,
        Pub("t", b"\xab" * 200),
    ),
    (
        "publish 3-byte remaining length (payload 20000)",
        p.PUBLISH,
        h("32 a5 9c 01 0001") + b"t" + h("0005") + b"z" * 20000,
        Pub("t", b"z" * 20000, 1, packet_id=5),
    ),
    ("puback", p.PUBACK, h("40 02 00 01"), 1),
    ("pubrec", p.PUBREC, h("50 02 ab cd"), 0xABCD),
    ("pubrel", p.PUBREL, h("62 02 00 07"), 7),
    ("pubcomp", p.PUBCOMP, h("70 02 ff ff"), 0xFFFF),
    (
        "subscribe several filters",
        p.SUBSCRIBE,
        h("82 17 000a 0003") + b"a/+" + h("00 0003") + b"b/#" + h("01 0006") + b"$SYS/x" + h("02"),
        (10, [("a/+", 0), ("b/#", 1), ("$SYS/x", 2)]),
    ),
    (
        "subscribe with an invalid filter is not malformed",
        p.SUBSCRIBE,
        h("82 09 0001 0004") + b"a/b#" + h("01"),
        (1, [("a/b#", 1)]),
    ),
    ("suback with failure", p.SUBACK, h("90 06 000a 00 01 02 80"), (10, [0, 1, 2, 0x80])),
    (
        "unsubscribe",
        p.UNSUBSCRIBE,
        h("a2 0c 000b 0003") + b"a/+" + h("0003") + b"b/#",
        (11, ["a/+", "b/#"]),
    ),
    ("unsuback", p.UNSUBACK, h("b0 02 00 0b"), 11),
    ("pingreq", p.PINGREQ, h("c0 00"), None),
    ("pingresp", p.PINGRESP, h("d0 00"), None),
    ("disconnect", p.DISCONNECT, h("e0 00"), None),
]


# (name, bytes, max_size): each must raise MalformedPacket from frame() or the decoder.
MQTT = h("0004") + b"MQTT" + h("04")
MALFORMED: list[tuple[str, bytes, int]] = [
    ("remaining length of 5 bytes", h("30 ff ff ff ff 01"), 1 << 30),
    ("remaining length 4th byte continues", h("30 80 80 80 80"), 1 << 30),
    ("oversize vs max_size", h("30 cb 01 0001") + b"t" + b"\xab" * 200, 205),
    ("oversize before the body arrives", h("30 ff 7f"), 1000),
    ("connect truncated protocol name", h("10 02 0004"), 1 << 20),
    ("connect truncated variable header", h("10 08") + MQTT + h("02"), 1 << 20),
    ("connect truncated client id", h("10 0e") + MQTT + h("02 003c 0005") + b"c1", 1 << 20),
    ("connect missing client id", h("10 0a") + MQTT + h("02 003c"), 1 << 20),
    ("connect invalid UTF-8 client id", h("10 0e") + MQTT + h("02 003c 0002 c3 28"), 1 << 20),
    ("connect U+0000 in client id", h("10 0e") + MQTT + h("02 003c 0002 61 00"), 1 << 20),
    ("connect unknown protocol name", h("10 0e 0004") + b"MQTX" + h("04 02 003c 0002") + b"c1", 1 << 20),
    ("connect fixed-header flags", h("11 0e") + MQTT + h("02 003c 0002") + b"c1", 1 << 20),
    ("connect reserved flag", h("10 0e") + MQTT + h("03 003c 0002") + b"c1", 1 << 20),
    ("connect will qos without will flag", h("10 0e") + MQTT + h("0a 003c 0002") + b"c1", 1 << 20),
    ("connect will retain without will flag", h("10 0e") + MQTT + h("22 003c 0002") + b"c1", 1 << 20),
    ("connect will qos 3", h("10 18") + MQTT + h("1e 003c 0002") + b"c1" + h("0003") + b"w/t" + h("0003") + b"bye", 1 << 20),
    ("connect will topic wildcard",
     h("10 18") + MQTT + h("0e 003c 0002") + b"c1" + h("0003") + b"w/#" + h("0003") + b"bye", 1 << 20),
    ("connect will message truncated",
     h("10 16") + MQTT + h("0e 003c 0002") + b"c1" + h("0003") + b"w/t" + h("0003") + b"b", 1 << 20),
    ("connect password without username", h("10 12") + MQTT + h("42 003c 0002") + b"c1" + h("0002") + b"pw", 1 << 20),
    ("connect username flag without username", h("10 0e") + MQTT + h("82 003c 0002") + b"c1", 1 << 20),
    ("connect trailing bytes", h("10 0f") + MQTT + h("02 003c 0002") + b"c1" + b"x", 1 << 20),
    ("connack flags", h("21 02 00 00"), 1 << 20),
    ("connack reserved ack flags", h("20 02 02 00"), 1 << 20),
    ("connack too long", h("20 03 00 00 00"), 1 << 20),
    ("publish empty body", h("30 00"), 1 << 20),
    ("publish truncated topic length", h("30 01 00"), 1 << 20),
    ("publish truncated topic", h("30 03 0005 61"), 1 << 20),
    ("publish invalid UTF-8 topic", h("30 04 0002 c3 28"), 1 << 20),
    ("publish UTF-16 surrogate in topic", h("30 05 0003 ed a0 80"), 1 << 20),
    ("publish overlong UTF-8 in topic", h("30 04 0002 c0 af"), 1 << 20),
    ("publish U+0000 in topic", h("30 05 0003 61 00 62"), 1 << 20),
    ("publish empty topic", h("30 04 0000") + b"hi", 1 << 20),
    ("publish + in topic", h("30 05 0003") + b"a/+", 1 << 20),
    ("publish # in topic", h("30 05 0003") + b"a/#", 1 << 20),
    ("publish qos 3", h("36 07 0003") + b"a/b" + h("0001"), 1 << 20),
    ("publish dup on qos 0", h("38 05 0003") + b"a/b", 1 << 20),
    ("publish packet id 0", h("32 07 0003") + b"a/b" + h("0000"), 1 << 20),
    ("publish missing packet id", h("32 05 0003") + b"a/b", 1 << 20),
    ("publish half a packet id", h("34 06 0003") + b"a/b" + h("01"), 1 << 20),
    ("puback flags", h("42 02 00 01"), 1 << 20),
    ("puback packet id 0", h("40 02 00 00"), 1 << 20),
    ("puback short", h("40 01 01"), 1 << 20),
    ("puback long", h("40 03 00 01 00"), 1 << 20),
    ("pubrec flags", h("52 02 00 01"), 1 << 20),
    ("pubrel flags 0", h("60 02 00 01"), 1 << 20),
    ("pubrel flags 3", h("63 02 00 01"), 1 << 20),
    ("pubcomp packet id 0", h("70 02 00 00"), 1 << 20),
    ("subscribe flags 0", h("80 08 0001 0003") + b"a/b" + h("00"), 1 << 20),
    ("subscribe flags 3", h("83 08 0001 0003") + b"a/b" + h("00"), 1 << 20),
    ("subscribe no filters", h("82 02 0001"), 1 << 20),
    ("subscribe no packet id", h("82 00"), 1 << 20),
    ("subscribe packet id 0", h("82 08 0000 0003") + b"a/b" + h("00"), 1 << 20),
    ("subscribe option reserved bits", h("82 08 0001 0003") + b"a/b" + h("04"), 1 << 20),
    ("subscribe option high bit", h("82 08 0001 0003") + b"a/b" + h("81"), 1 << 20),
    ("subscribe qos 3", h("82 08 0001 0003") + b"a/b" + h("03"), 1 << 20),
    ("subscribe missing qos", h("82 07 0001 0003") + b"a/b", 1 << 20),
    ("subscribe truncated filter", h("82 07 0001 0005") + b"a/b", 1 << 20),
    ("subscribe invalid UTF-8 filter", h("82 07 0001 0002 ff fe 00"), 1 << 20),
    ("subscribe U+0000 in filter", h("82 07 0001 0002 61 00 00"), 1 << 20),
    ("suback no codes", h("90 02 0001"), 1 << 20),
    ("suback invalid code", h("90 03 0001 03"), 1 << 20),
    ("suback flags", h("92 03 0001 00"), 1 << 20),
    ("unsubscribe flags 0", h("a0 07 0001 0003") + b"a/b", 1 << 20),
    ("unsubscribe no filters", h("a2 02 0001"), 1 << 20),
    ("unsubscribe packet id 0", h("a2 07 0000 0003") + b"a/b", 1 << 20),
    ("unsubscribe truncated filter", h("a2 06 0001 0003") + b"a/", 1 << 20),
    ("unsuback flags", h("b2 02 00 01"), 1 << 20),
    ("pingreq flags", h("c1 00"), 1 << 20),
    ("pingreq with body", h("c0 01 00"), 1 << 20),
    ("pingresp flags", h("d8 00"), 1 << 20),
    ("disconnect flags", h("e2 00"), 1 << 20),
    ("disconnect with body", h("e0 02 00 00"), 1 << 20),
]
