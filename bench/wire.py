"""The bench's packets at one protocol level (4: MQTT 3.1.1, 5: MQTT 5.0), built and read by the
broker's own codec (plexmq.mqtt).

Why a module of its own: the clients (bench.client, bench.connector, bench.bulk) then differ by
version in one place only, the property block a 5.0 PUBLISH carries after its topic and packet id.
Everything else that differs (CONNECT, CONNACK, SUBSCRIBE, SUBACK, acknowledgements with reason codes,
a DISCONNECT from the broker) is decided here, off the hot path.
"""

from __future__ import annotations

from plexmq.mqtt import v4, v5
from plexmq.mqtt.framing import MalformedPacket, read_varint
from plexmq.mqtt.properties import SESSION_EXPIRY_INTERVAL, SUBSCRIPTION_IDENTIFIER

LEVELS = (4, 5)
NAMES = {4: "3.1.1", 5: "5.0"}
KEEP_SESSION = 0xFFFFFFFF  # 5.0 session expiry of a persistent subscriber: never, as clean session 0 in 3.1.1
FAILED = 0x80  # reason codes from here up refuse (a SUBACK's 0x80 in 3.1.1)


def connect(level: int, client_id: str, clean: bool, keepalive: int, username: str | None = None) -> bytes:
    """A CONNECT; a 5.0 session outlives the connection only with an expiry, so a kept one gets one."""
    properties = None if clean or level != 5 else {SESSION_EXPIRY_INTERVAL: KEEP_SESSION}
    return v4.encode_connect(client_id, clean, keepalive, username=username, protocol_level=level, properties=properties)


def connack(level: int, flags: int, body: bytes) -> tuple[bool, int]:
    """(session present, the CONNACK's return code (3.1.1) or reason code (5.0)): 0 is accepted."""
    if level == 5:
        present, code, _ = v5.decode_connack(flags, body)
        return present, code
    return v4.decode_connack(flags, body)


def publish(level: int, topic: bytes, payload: bytes, qos: int, packet_id: int) -> bytes:
    """A PUBLISH (5.0: with an empty property block)."""
    if level == 5:
        return v5.encode_publish(topic, payload, qos, packet_id=packet_id)
    return v4.encode_publish(topic, payload, qos, packet_id=packet_id)


def properties_end(data: bytes, pos: int) -> int:
    """Where the 5.0 property block at data[pos] ends (the payload starts)."""
    length, pos = read_varint(data, pos, "property length")
    return pos + length


def subscribe(level: int, packet_id: int, topic_filter: str, qos: int, identifier: int = 0) -> bytes:
    """`identifier`: 5.0's subscription identifier (0: none)."""
    if level == 5:
        return v5.encode_subscribe(packet_id, [(topic_filter, qos)],
                                   {SUBSCRIPTION_IDENTIFIER: identifier} if identifier else None)
    return v4.encode_subscribe(packet_id, [(topic_filter, qos)])


def suback(level: int, flags: int, body: bytes) -> tuple[int, list[int]]:
    """(packet id, [granted QoS or reason code >= FAILED])."""
    if level == 5:
        packet_id, codes, _ = v5.decode_suback(v5.SUBACK, flags, body)
        return packet_id, codes
    return v4.decode_suback(flags, body)


def ack(level: int, kind: int, flags: int, body: bytes) -> tuple[int, int]:
    """(packet id, reason code) of a PUBACK, PUBREC or PUBCOMP longer than the 2-byte success form,
    which only 5.0 sends (3.1.1 refuses it as malformed)."""
    if level == 5:
        packet_id, code, _ = v5.decode_ack(kind, flags, body)
        return packet_id, code
    return v4.decode_packet_id(flags, body, 0), 0


def disconnect_reason(level: int, flags: int, body: bytes) -> int:
    """The reason code of a DISCONNECT from the broker (5.0 only: in 3.1.1 only a client sends it)."""
    if level != 5:
        raise MalformedPacket("DISCONNECT from the broker")
    return v5.decode_reason_only(v5.DISCONNECT, flags, body)[0]


def describe(code: int) -> str:
    """A reason code as the broker's log names it: 'not authorized (0x87)'."""
    return v5.describe(code)
