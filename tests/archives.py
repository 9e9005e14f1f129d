"""Archive records and segments for the archive and pipeline tests, written by the broker's own
`ArchiveWriter` where whole archives are needed, so their contents are known exactly."""

from __future__ import annotations

import struct
import zlib
from datetime import UTC, datetime, timedelta
from pathlib import Path

from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from plexmq.archive_format import Record, Run
from plexmq.mqtt import v4
from plexmq.workers.archive import ArchiveWriter

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


START = datetime(2024, 5, 1, tzinfo=UTC)


def us(t: datetime) -> int:
    return (t - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(microseconds=1)


def at(minutes: float) -> int:
    return us(START + timedelta(minutes=minutes))


def archive(root: Path) -> list[tuple[int, Record]]:
    """Traffic from several clients (3.1.1, one 5.0 with properties) on three workers over two hours and
    a bit before, and a segment of format 2 from a fourth; the last chunk of worker 2's segment is torn.
    Returns the (worker, record) pairs that can be read back."""
    traffic: dict[int, list[Record]] = {0: [], 1: [], 2: []}
    for m in range(-20, 120):  # dev-a: every minute, from the day before
        traffic[0].append(Record(at(m), "sensors/a/temp", 0, False, b"%d" % m, "dev-a", "alice"))
    for m in range(0, 41, 2):  # dev-b: two topics until 00:40
        traffic[0].append(Record(at(m), "sensors/b/temp", 1, False, b"x" * 12, "dev-b", None))
        traffic[0].append(Record(at(m + 0.5), "sensors/b/hum", 1, False, b"y" * 7, "dev-b", None))
    for m in range(3, 86, 7):  # dev-c: retained binary alerts until 01:25
        traffic[1].append(Record(at(m), "alerts", 2, True, bytes(range(m % 256)) * 3, "dev-c", "carol"))
    traffic[1].append(Record(at(5), "sensors/d/temp", 0, False, b"1", "dev-d", None))  # before --since only
    for m in range(15, 86, 10):  # dev-f: MQTT 5.0, with properties but for every third message
        pairs = (("unit", "C"), ("site", "n"), ("unit", "K")) if m % 3 else ()
        traffic[1].append(Record(at(m), "sensors/f/temp", 1, False, b"f", "dev-f", "frank", 5,
                                 "text/plain" if m % 3 else None, pairs))
    writers = {w: ArchiveWriter(str(root), w, ["#"], 4096, 60.0) for w in traffic}
    for w, records in traffic.items():
        for r in records:
            writers[w].append("", r.run())
            writers[w].flush()
    kept = [Record(at(30 + i), "sensors/e/temp", 1, False, b"e" * i, "dev-e", None) for i in range(3)]
    torn = [Record(at(34), "sensors/e/temp", 1, False, b"lost", "dev-e", None)]
    for r in kept:
        writers[2].append("", r.run())
    writers[2].flush()  # its first chunk goes out at once; the next waits for close()
    for r in torn:
        writers[2].append("", r.run())
    for writer in writers.values():
        writer.close()
    (segment,) = root.glob("date=*/hour=*/w2-*.seg")
    segment.write_bytes(segment.read_bytes()[:-1])
    traffic[2] = kept
    traffic[3] = [Record(at(80), "sensors/old/temp", 0, False, b"old", "dev-old", None, level=0)]
    (root / "date=2024-05-01/hour=01/w3-old.seg").write_bytes(version_2_segment(3, traffic[3][0]))
    return [(w, r) for w, records in traffic.items() for r in records]


def tenants_archive(root: Path) -> list[tuple[str, Record]]:
    """Traffic of the default tenant ("") and of tenants acme and beta, written by two workers: the same
    topic and the same client id in two tenants. Returns the (tenant, record) pairs."""
    sent = [(tenant, Record(at(m), topic, 1, False, b"x" * size, client, None))
            for m in range(10)
            for tenant, topic, client, size in (("", "s/temp", "dev-1", 1), ("acme", "s/temp", "dev-1", 10),
                                                ("acme", "s/hum", "dev-2", 20), ("beta", "b/only", "dev-9", 5))]
    writers = [ArchiveWriter(str(root), w, ["#"], 4096, 60.0) for w in range(2)]
    for i, (tenant, r) in enumerate(sent):
        writers[i % 2].append(tenant, r.run())
    for writer in writers:
        writer.close()
    return sent
