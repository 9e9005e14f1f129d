"""The traffic archive's segment format, shared by the worker's writer and the pipeline's reader.

Why this format: the worker archives every PUBLISH on its hot path (several 100k msgs/s per worker, at
most 15 % of throughput), and any Python work per message costs more than that budget. So a segment
keeps the PUBLISH packets exactly as the client sent them: the worker already has each read's packets
as one bytes object, and archives a read as one *run* (its receive time, client id, username and the
packet bytes), with no work per message. The reader pays instead: it parses the packets into columns
(`Chunk`) that the Spark side maps straight onto Arrow buffers. Nothing is compressed on the hot
path (the pipeline's Parquet tables are the compressed copy). A CRC32 per chunk lets readers tell good
chunks from what a crash, a power loss or bad storage leaves (a torn, zero-filled or damaged chunk):
they keep the chunks before it and skip and count the rest.

Layout, all integers little-endian:

    segment = SEGMENT_HEADER (magic b"PXAR", version, worker id) chunk*
    chunk   = CHUNK_HEADER (body bytes, run count r, CRC32 of the body) body
    body    = recv_us int64[r], client_len int32[r],
              username_len int32[r] (-1: no username), packets_len int32[r],
              then client id bytes, username bytes, packet bytes (each column concatenated; text UTF-8)
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import NamedTuple

from workers.mqtt.v4 import encode_publish

MAGIC = b"PXAR"
VERSION = 2
SEGMENT_SUFFIX = ".seg"
SEGMENT_HEADER = struct.Struct("<4sII")  # magic, version, worker id
CHUNK_HEADER = struct.Struct("<III")  # body bytes, run count, CRC32 of the body
FIXED_BYTES_PER_RUN = 8 + 4 * 3  # recv_us and the three length columns
HOUR_US = 3_600_000_000
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


class Record(NamedTuple):
    """One archived PUBLISH as a reader gets it back (the field order of a chunk row)."""

    recv_us: int  # receive time, UTC microseconds since the epoch
    topic: str
    qos: int
    retain: bool
    payload: bytes
    client_id: str
    username: str | None

    def run(self) -> Run:
        """The record as a worker archives it: a run of one PUBLISH packet."""
        packet = encode_publish(self.topic.encode(), self.payload, self.qos, self.retain, packet_id=1 if self.qos else 0)
        return (self.recv_us, sender(self.client_id, self.username), packet)


Sender = tuple[bytes, bytes, int]  # client id and username (UTF-8), username length (-1: no username)
Run = tuple[int, Sender, bytes]  # receive time (us), sender, the PUBLISH packets of one read as received


def sender(client_id: str, username: str | None) -> Sender:
    """What every run of a connection shares; made once per connection."""
    user = b"" if username is None else username.encode()
    return (client_id.encode(), user, -1 if username is None else len(user))


def partition(recv_us: int) -> str:
    """The `date=YYYY-MM-DD/hour=HH` directory of a receive time (UTC), Spark's partition layout."""
    t = _EPOCH + timedelta(microseconds=recv_us)
    return f"date={t:%Y-%m-%d}/hour={t:%H}"


def segment_header(worker_id: int) -> bytes:
    """The bytes a segment starts with."""
    return SEGMENT_HEADER.pack(MAGIC, VERSION, worker_id)


def encode_chunk(runs: Sequence[Run]) -> tuple[bytes, bytes]:
    """One chunk's header and body (written with one writev) holding `runs`: a few C-level packs and
    joins, no Python per run."""
    r = len(runs)
    recv_us, senders, packets = zip(*runs)
    clients, usernames, username_len = zip(*senders)
    body = b"".join(
        (
            struct.pack(f"<{r}q", *recv_us),
            struct.pack(f"<{r}i", *map(len, clients)),
            struct.pack(f"<{r}i", *username_len),
            struct.pack(f"<{r}i", *map(len, packets)),
            b"".join(clients),
            b"".join(usernames),
            b"".join(packets),
        )
    )
    return CHUNK_HEADER.pack(len(body), r, zlib.crc32(body)), body


@dataclass(frozen=True)
class Chunk:
    """The column buffers of one chunk: views into the segment, laid out as the module docstring says."""

    count: int
    recv_us: memoryview
    qos: memoryview
    retain: memoryview
    topic_len: memoryview
    client_len: memoryview
    username_len: memoryview
    payload_len: memoryview
    topic: memoryview
    client_id: memoryview
    username: memoryview
    payload: memoryview


@dataclass(frozen=True)
class Segment:
    """What a reader got out of one segment file."""

    worker_id: int | None  # None when the header itself is unreadable
    chunks: list[Chunk]
    damage: str | None  # why the tail from `skipped_bytes` on was not read; None for a whole segment
    skipped_bytes: int

    @property
    def records(self) -> int:
        return sum(c.count for c in self.chunks)


def decode_segment(data: bytes | memoryview) -> Segment:
    """Parse a segment, keeping every good chunk before the first torn or damaged one."""
    view = memoryview(data).cast("B")
    if len(view) < SEGMENT_HEADER.size:
        return Segment(None, [], "truncated segment header", len(view))
    magic, version, worker_id = SEGMENT_HEADER.unpack_from(view)
    if magic != MAGIC or version != VERSION:
        return Segment(None, [], f"not a plexmq archive segment (v{VERSION})", len(view))
    chunks: list[Chunk] = []
    damage = None
    pos = SEGMENT_HEADER.size
    while pos < len(view):
        if len(view) - pos < CHUNK_HEADER.size:
            damage = "truncated chunk header"
            break
        size, count, crc = CHUNK_HEADER.unpack_from(view, pos)
        start = pos + CHUNK_HEADER.size
        if start + size > len(view):
            damage = "truncated chunk"
            break
        body = view[start : start + size]
        chunk = _chunk(body, count) if count and zlib.crc32(body) == crc else None
        if chunk is None:
            damage = "damaged chunk"
            break
        chunks.append(chunk)
        pos = start + size
    return Segment(worker_id, chunks, damage, len(view) - pos)


def _chunk(body: memoryview, r: int) -> Chunk | None:
    """Parse a checksummed body of `r` runs into columns; None when its lengths or packets do not add up."""
    pos = 0
    if len(body) < pos + FIXED_BYTES_PER_RUN * r:
        return None
    recv_us = struct.unpack_from(f"<{r}q", body, pos)
    pos += 8 * r
    lengths = []
    for least in (0, -1, 1):  # client id, username, packets
        lengths.append(struct.unpack_from(f"<{r}i", body, pos))
        pos += 4 * r
        if r and min(lengths[-1]) < least:
            return None
    client_len, username_len, packets_len = lengths
    clients = _split(body, pos, client_len)
    pos += sum(client_len)
    usernames = _split(body, pos, username_len)
    pos += sum(username_len) + username_len.count(-1)
    packets = _split(body, pos, packets_len)
    pos += sum(packets_len)
    if pos != len(body):
        return None
    columns = _Columns()
    for run in range(r):
        if not columns.add_packets(packets[run], recv_us[run], client_len[run], clients[run],
                                   username_len[run], usernames[run]):
            return None
    return columns.chunk()


class _Columns:
    """The columns of a chunk being parsed from its PUBLISH packets."""

    def __init__(self) -> None:
        self.count = 0
        self.recv_us: list[int] = []
        self.qos = bytearray()
        self.retain = bytearray()
        self.topic_len: list[int] = []
        self.client_len: list[int] = []
        self.username_len: list[int] = []
        self.payload_len: list[int] = []
        self.topic: list[bytes] = []
        self.client_id: list[bytes] = []
        self.username: list[bytes] = []
        self.payload: list[bytes] = []

    def add_packets(self, data: bytes, recv_us: int, client_len: int, client_id: bytes,
                    username_len: int, username: bytes) -> bool:
        """Add the PUBLISH packets of one run; False when they are not well-formed PUBLISH packets."""
        pos, end = 0, len(data)
        while pos < end:
            first = data[pos]
            qos = (first >> 1) & 3
            if first >> 4 != 3 or qos == 3:
                return False
            length, shift, i = 0, 0, pos + 1
            while True:
                if i >= end or shift > 21:
                    return False
                b = data[i]
                length |= (b & 127) << shift
                shift += 7
                i += 1
                if not b & 128:
                    break
            stop = i + length
            topic_len = (data[i] << 8 | data[i + 1]) if i + 2 <= stop else -1
            payload_at = i + 2 + topic_len + (2 if qos else 0)
            if stop > end or topic_len < 1 or payload_at > stop:
                return False
            self.count += 1
            self.recv_us.append(recv_us)
            self.qos.append(qos)
            self.retain.append(first & 1)
            self.topic_len.append(topic_len)
            self.topic.append(data[i + 2:i + 2 + topic_len])
            self.client_len.append(client_len)
            self.client_id.append(client_id)
            self.username_len.append(username_len)
            self.username.append(username)
            self.payload_len.append(stop - payload_at)
            self.payload.append(data[payload_at:stop])
            pos = stop
        return True

    def chunk(self) -> Chunk:
        n = self.count

        def ints(values: list[int], code: str = "i") -> memoryview:
            return memoryview(struct.pack(f"<{n}{code}", *values))

        return Chunk(n, ints(self.recv_us, "q"), memoryview(bytes(self.qos)), memoryview(bytes(self.retain)),
                     ints(self.topic_len), ints(self.client_len), ints(self.username_len), ints(self.payload_len),
                     *(memoryview(b"".join(column)) for column in (self.topic, self.client_id, self.username, self.payload)))


def _split(body: memoryview, pos: int, lengths: tuple[int, ...]) -> list[bytes]:
    """The values of one variable-length column starting at `pos` (b"" where the length is -1)."""
    values = []
    for length in lengths:
        length = max(length, 0)
        values.append(bytes(body[pos:pos + length]))
        pos += length
    return values


def records(segment: Segment) -> Iterator[Record]:
    """The segment's records one by one: a plain-Python reader for tools and tests."""
    for c in segment.chunks:
        columns = zip(
            struct.unpack(f"<{c.count}q", c.recv_us),
            _values(c.topic_len, c.topic),
            c.qos,
            c.retain,
            _values(c.payload_len, c.payload),
            _values(c.client_len, c.client_id),
            _values(c.username_len, c.username),
            struct.unpack(f"<{c.count}i", c.username_len),
        )
        for recv_us, topic, qos, retain, payload, client_id, username, username_len in columns:
            yield Record(
                recv_us,
                topic.decode(),
                qos,
                bool(retain),
                payload,
                client_id.decode(),
                None if username_len < 0 else username.decode(),
            )


def _values(lengths: memoryview, data: memoryview) -> list[bytes]:
    """The values of one variable-length column (b"" where the length is -1)."""
    values = []
    pos = 0
    for length in struct.unpack(f"<{len(lengths) // 4}i", lengths):
        values.append(bytes(data[pos : pos + max(length, 0)]))
        pos += max(length, 0)
    return values
