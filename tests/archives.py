"""Archive records and segments for the archive and pipeline tests."""

from __future__ import annotations

import struct
import zlib

from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from plexmq.archive_format import Record, Run
from plexmq.mqtt import v4


T0 = 1_714_521_600_000_000  # 2024-05-01 00:00:00 UTC in microseconds


def run(recv_us: int, payload: bytes) -> Run:
    """One QoS 0 message to topic t from client c."""
    return Record(recv_us, "t", 0, False, payload, "c", None).run()


def version_2_segment(worker_id: int, r: Record) -> bytes:
    """A segment of one record as brokers before format 3 wrote it: no level column, 3.1.1 packets."""
    packet = v4.encode_publish(r.topic.encode(), r.payload, r.qos, r.retain, packet_id=1 if r.qos else 0)
    client, user = r.client_id.encode(), (r.username or "").encode()
    user_len = -1 if r.username is None else len(user)
    body = struct.pack("<qiii", r.recv_us, len(client), user_len, len(packet)) + client + user + packet
    return struct.pack("<4sII", b"PXAR", 2, worker_id) + struct.pack("<III", len(body), 1, zlib.crc32(body)) + body


def publish_properties(content_type: str | None, pairs: list[tuple[str, str]]) -> Properties:
    """paho's PUBLISH properties: a content type (None: none) and user properties in this order."""
    properties = Properties(PacketTypes.PUBLISH)
    if content_type is not None:
        properties.ContentType = content_type
    if pairs:
        properties.UserProperty = pairs
    return properties
