"""The MQTT codec against byte fixtures written out by hand: one table read both ways, then malformed input."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from plexmq.mqtt import v4 as p
from plexmq.mqtt.v4 import Connect, MalformedPacket, Will
from tests.packet_fixtures import FIXTURES, MALFORMED, Pub, h


def decode(ptype: int, flags: int, body: Any) -> Any:
    """Dispatch one framed packet to its decoder, as a connection would."""
    if ptype == p.CONNECT:
        return p.decode_connect(flags, body)
    if ptype == p.CONNACK:
        return p.decode_connack(flags, body)
    if ptype == p.PUBLISH:
        topic, packet_id, payload = p.decode_publish(flags, body)
        return Pub(topic, payload, (flags >> 1) & 3, bool(flags & 1), bool(flags & 8), packet_id)
    if ptype in (p.PUBACK, p.PUBREC, p.PUBCOMP, p.UNSUBACK):
        return p.decode_packet_id(flags, body, 0)
    if ptype == p.PUBREL:
        return p.decode_packet_id(flags, body, 2)
    if ptype == p.SUBSCRIBE:
        return p.decode_subscribe(flags, body)
    if ptype == p.SUBACK:
        return p.decode_suback(flags, body)
    if ptype == p.UNSUBSCRIBE:
        return p.decode_unsubscribe(flags, body)
    if ptype in (p.PINGREQ, p.PINGRESP, p.DISCONNECT):
        return p.decode_empty(flags, body)
    raise AssertionError(f"no decoder for packet type {ptype}")


def encode(ptype: int, value: Any) -> bytes:
    if ptype == p.CONNECT:
        v: Connect = value
        return p.encode_connect(
            v.client_id, v.clean_session, v.keepalive, v.will, v.username, v.password, v.protocol_level
        )
    if ptype == p.CONNACK:
        return p.encode_connack(*value)
    if ptype == p.PUBLISH:
        return p.encode_publish(value.topic.encode(), value.payload, value.qos, value.retain, value.dup, value.packet_id)
    simple = {
        p.PUBACK: p.encode_puback,
        p.PUBREC: p.encode_pubrec,
        p.PUBREL: p.encode_pubrel,
        p.PUBCOMP: p.encode_pubcomp,
        p.UNSUBACK: p.encode_unsuback,
    }
    if ptype in simple:
        return simple[ptype](value)
    if ptype == p.SUBSCRIBE:
        return p.encode_subscribe(*value)
    if ptype == p.SUBACK:
        return p.encode_suback(*value)
    if ptype == p.UNSUBSCRIBE:
        return p.encode_unsubscribe(*value)
    return {p.PINGREQ: p.PINGREQ_PACKET, p.PINGRESP: p.PINGRESP_PACKET, p.DISCONNECT: p.DISCONNECT_PACKET}[ptype]


@pytest.mark.parametrize("name,ptype,raw,value", FIXTURES, ids=[f[0] for f in FIXTURES])
def test_fixture_decodes(name: str, ptype: int, raw: bytes, value: Any) -> None:
    for buf in (raw, bytearray(raw)):
        framed = p.frame(buf, 0, 1 << 20)
        assert framed is not None
        first, start, end = framed
        assert first >> 4 == ptype
        assert end == len(raw)
        for body in (bytes(buf[start:end]), memoryview(buf)[start:end]):
            assert decode(ptype, first & 0x0F, body) == value


@pytest.mark.parametrize("name,ptype,raw,value", FIXTURES, ids=[f[0] for f in FIXTURES])
def test_fixture_encodes(name: str, ptype: int, raw: bytes, value: Any) -> None:
    assert encode(ptype, value) == raw


@pytest.mark.parametrize(
    "name,raw", [(f[0], f[2]) for f in FIXTURES if f[1] == p.PUBLISH], ids=[f[0] for f in FIXTURES if f[1] == p.PUBLISH]
)
def test_publish_header_is_the_packet_before_its_payload(name: str, raw: bytes) -> None:
    framed = p.frame(raw, 0, 1 << 20)
    assert framed is not None
    first, start, end = framed
    topic, packet_id, payload = p.decode_publish(first & 0x0F, raw[start:end])
    qos = (first >> 1) & 3
    header = p.publish_header(topic.encode(), len(payload), qos, bool(first & 1), bool(first & 8), packet_id)
    assert header + payload == raw
    assert len(header) == len(raw) - len(payload)


def test_decoded_types() -> None:
    topic, packet_id, payload = p.decode_publish(2, memoryview(h("0003") + b"a/b" + h("0001") + b"hi"))
    assert type(topic) is str and type(payload) is bytes and packet_id == 1
    raw = next(f[2] for f in FIXTURES if f[0].startswith("connect everything"))
    connect = p.decode_connect(0, memoryview(raw)[2:])
    assert connect.will is not None
    assert type(connect.password) is bytes and type(connect.will.payload) is bytes


@pytest.mark.parametrize("name,level", [(b"MQTT", 6), (b"MQTT", 3), (b"MQIsdp", 4), (b"MQIsdp", 5)])
def test_connect_of_another_level_is_refused_before_its_payload_is_read(name: bytes, level: int) -> None:
    body = h("0004" if name == b"MQTT" else "0006") + name + bytes((level,)) + h("02 003c 05 11 00000e10")
    with pytest.raises(p.UnsupportedProtocol) as refused:
        p.decode_connect(0, body)
    assert refused.value.level == level


@pytest.mark.parametrize("name,raw,max_size", MALFORMED, ids=[m[0] for m in MALFORMED])
def test_malformed(name: str, raw: bytes, max_size: int) -> None:
    with pytest.raises(MalformedPacket) as excinfo:
        framed = p.frame(raw, 0, max_size)
        assert framed is not None, "fixture is not a complete packet"
        first, start, end = framed
        assert end == len(raw), "fixture has bytes after the packet"
        decode(first >> 4, first & 0x0F, raw[start:end])
    assert str(excinfo.value)


def test_malformed_reasons_are_specific() -> None:
    with pytest.raises(MalformedPacket, match="remaining length exceeds 4 bytes"):
        p.frame(h("30 ff ff ff ff 01"), 0, 1 << 30)
    with pytest.raises(MalformedPacket, match="wildcard"):
        p.decode_publish(0, h("0003") + b"a/+")
    with pytest.raises(MalformedPacket, match="U\\+0000"):
        p.decode_publish(0, h("0003 61 00 62"))


# --------------------------------------------------------------------------------------- frame()


@pytest.mark.parametrize("name,ptype,raw,value", FIXTURES, ids=[f[0] for f in FIXTURES])
def test_frame_every_split_point(name: str, ptype: int, raw: bytes, value: Any) -> None:
    complete = p.frame(raw, 0, 1 << 20)
    step = 1 if len(raw) < 300 else 997  # the 20000-byte payload: every split in the header, then a stride
    for cut in sorted(set(range(min(8, len(raw)))) | set(range(0, len(raw), step))):
        assert p.frame(raw[:cut], 0, 1 << 20) is None, cut
        buf = bytearray(raw[:cut])
        assert p.frame(buf, 0, 1 << 20) is None, cut
        buf += raw[cut:]
        assert p.frame(buf, 0, 1 << 20) == complete


def test_frame_back_to_back() -> None:
    raws = [f[2] for f in FIXTURES]
    buf = bytearray(b"junk") + b"".join(raws)
    pos = 4
    for raw, value in [(f[2], f[3]) for f in FIXTURES]:
        framed = p.frame(buf, pos, 1 << 20)
        assert framed is not None
        first, start, end = framed
        assert buf[pos:end] == raw
        assert decode(first >> 4, first & 0x0F, memoryview(buf)[start:end]) == value
        pos = end
    assert pos == len(buf)
    assert p.frame(buf, pos, 1 << 20) is None


def test_frame_partial_packet_after_complete_ones() -> None:
    buf = p.PINGREQ_PACKET + p.encode_puback(3) + p.encode_publish(b"a/b", b"x" * 10)[:-1]
    assert p.frame(buf, 0, 64) == (0xC0, 2, 2)
    assert p.frame(buf, 2, 64) == (0x40, 4, 6)
    assert p.frame(buf, 6, 64) is None


def test_frame_raises_at_fourth_continuation_byte_without_waiting() -> None:
    for cut in range(1, 5):
        assert p.frame(h("30 80 80 80 80")[:cut], 0, 1 << 30) is None
    with pytest.raises(MalformedPacket):
        p.frame(h("30 80 80 80 80"), 0, 1 << 30)


def test_frame_max_size_counts_the_fixed_header() -> None:
    raw = p.encode_publish(b"t", b"x" * 200)  # 3-byte fixed header + 203-byte body
    assert len(raw) == 206
    assert p.frame(raw, 0, 206) == (0x30, 3, 206)
    with pytest.raises(MalformedPacket):
        p.frame(raw, 0, 205)
    with pytest.raises(MalformedPacket):
        p.frame(raw[:3], 0, 205)


def test_frame_largest_remaining_length_is_incomplete_not_malformed() -> None:
    assert p.frame(h("30 ff ff ff 7f"), 0, 1 << 30) is None


# --------------------------------------------------------------------------------- encoder limits


@pytest.mark.parametrize(
    "n,raw",
    [
        (0, "00"),
        (127, "7f"),
        (128, "80 01"),
        (16383, "ff 7f"),
        (16384, "80 80 01"),
        (2097151, "ff ff 7f"),
        (2097152, "80 80 80 01"),
        (268435455, "ff ff ff 7f"),
    ],
)
def test_remaining_length_boundaries(n: int, raw: str) -> None:
    encoded = p.encode_remaining_length(n)
    assert encoded == h(raw)
    header = b"\x30" + encoded
    expected = (0x30, len(header), len(header)) if n == 0 else None  # only an empty body is complete
    assert p.frame(header, 0, 1 << 30) == expected


@pytest.mark.parametrize("n", [-1, 268435456])
def test_remaining_length_out_of_range(n: int) -> None:
    with pytest.raises(ValueError):
        p.encode_remaining_length(n)


def test_constants() -> None:
    assert (p.CONNECT, p.PUBLISH, p.PUBREL, p.SUBSCRIBE, p.DISCONNECT) == (1, 3, 6, 8, 14)
    assert p.PINGREQ_PACKET == b"\xc0\x00" and p.PINGRESP_PACKET == b"\xd0\x00" and p.DISCONNECT_PACKET == b"\xe0\x00"
    assert issubclass(MalformedPacket, ValueError)


# ------------------------------------------------------------------------------------- properties

topic_names = st.text(
    st.characters(blacklist_categories=["Cs"], blacklist_characters="+#\x00"), min_size=1, max_size=40
)


@given(
    topic=topic_names,
    payload=st.binary(max_size=20000),
    qos=st.integers(0, 2),
    retain=st.booleans(),
    dup=st.booleans(),
    packet_id=st.integers(1, 0xFFFF),
)
def test_publish_round_trip(topic: str, payload: bytes, qos: int, retain: bool, dup: bool, packet_id: int) -> None:
    value = Pub(topic, payload, qos, retain, dup and qos > 0, packet_id if qos else 0)
    raw = encode(p.PUBLISH, value)
    framed = p.frame(raw, 0, 1 << 20)
    assert framed is not None
    first, start, end = framed
    assert end == len(raw)
    assert decode(first >> 4, first & 0x0F, raw[start:end]) == value


@given(
    client_id=st.text(st.characters(blacklist_categories=["Cs"], blacklist_characters="\x00"), max_size=30),
    clean=st.booleans(),
    keepalive=st.integers(0, 0xFFFF),
    will=st.none() | st.builds(Will, topic_names, st.binary(max_size=50), st.integers(0, 2), st.booleans()),
    username=st.none() | st.text(st.characters(blacklist_categories=["Cs"], blacklist_characters="\x00")),
    password=st.none() | st.binary(max_size=50),
    level=st.sampled_from([3, 4]),
)
def test_connect_round_trip(client_id, clean, keepalive, will, username, password, level) -> None:
    if username is None:
        password = None
    value = Connect("MQIsdp" if level == 3 else "MQTT", level, clean, keepalive, client_id, will, username, password)
    raw = encode(p.CONNECT, value)
    framed = p.frame(raw, 0, 1 << 20)
    assert framed is not None
    first, start, end = framed
    assert end == len(raw)
    assert decode(first >> 4, first & 0x0F, memoryview(raw)[start:end]) == value


@given(st.binary(max_size=64))
def test_garbage_never_raises_anything_but_malformed(data: bytes) -> None:
    for first in range(0x10, 0xF0, 0x01):
        try:
            decode(first >> 4, first & 0x0F, data)
        except MalformedPacket:
            pass
