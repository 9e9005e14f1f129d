"""The traffic archive's segment format, shared by the worker's writer and the pipeline's reader.

Why this format: the worker archives every PUBLISH on its hot path (several 100k msgs/s per worker, at
most 15 % of throughput), and any Python work per message costs more than that budget. So a segment
keeps the PUBLISH packets exactly as the client sent them: the worker already has each read's packets
as one bytes object, and archives a read as one *run* (its receive time, client id, username and the
packet bytes), with no work per message. The reader pays instead: it parses the packets into columns
(`Chunk`) that the Spark side maps straight onto Arrow buffers. Nothing is compressed on the hot
path (the pipeline's Parquet tables are the compressed copy). A CRC32 per chunk lets readers tell good
chunks from what a crash, a power loss or bad storage leaves (a torn, zero-filled or damaged chunk):
they skip a damaged chunk by its length and read on, skip a torn tail, and say where (`SegmentReader`).

Layout, all integers little-endian:

    segment = SEGMENT_HEADER (magic b"PXAR", version, worker id) chunk*
    chunk   = CHUNK_HEADER (body bytes, run count r, CRC32 of the body) body
    body    = recv_us int64[r], client int32[r] (client id bytes | level << 16),
              username_len int32[r] (-1: no username), packets_len int32[r],
              then client id bytes, username bytes, packet bytes (each column concatenated; text UTF-8)

`level` is the publisher's CONNECT protocol level (3: MQTT 3.1, 4: 3.1.1, 5: 5.0). It shares the
client id's length word (an MQTT string is at most 65535 bytes), which the worker makes once per
connection: recording it adds nothing per run or message to the hot path. A level 5 run holds 5.0
PUBLISH packets: their property block keeps the properties that travel with the message (user
properties, content type, payload format, response topic, correlation data); the topic alias is
resolved and the message expiry is not kept. Version 2 segments (no level, every packet in the 3.1.1
layout, 5.0 properties dropped) are still read; their records have level 0, "not recorded".
"""

from __future__ import annotations

import io
import re
import struct
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import BinaryIO, NamedTuple

from plexmq.mqtt import properties as props
from plexmq.mqtt import v4, v5
from plexmq.mqtt.framing import MalformedPacket, encode_remaining_length
from plexmq.mqtt.kinds import PUBLISH

MAGIC = b"PXAR"
VERSION = 3
READABLE = (2, VERSION)  # version 2: before the level
LEVELS = frozenset((3, 4, 5))
SEGMENT_SUFFIX = ".seg"
SEGMENT_HEADER = struct.Struct("<4sII")  # magic, version, worker id
CHUNK_HEADER = struct.Struct("<III")  # body bytes, run count, CRC32 of the body
FIXED_BYTES_PER_RUN = 8 + 4 * 3  # recv_us and the three length columns
HOUR_US = 3_600_000_000
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


UserProperties = tuple[tuple[str, str], ...]


class Record(NamedTuple):
    """One archived PUBLISH as a reader gets it back (the field order of a chunk row)."""

    recv_us: int  # receive time, UTC microseconds since the epoch
    topic: str
    qos: int
    retain: bool
    payload: bytes
    client_id: str
    username: str | None
    level: int = 4  # the publisher's protocol level; 0 in a version 2 segment (not recorded)
    content_type: str | None = None
    user_properties: UserProperties | None = None  # in order, repeats kept; None below level 5

    def run(self) -> Run:
        """The record as a worker archives it: a run of one PUBLISH packet."""
        carried: props.Properties = {}
        if self.user_properties:
            carried[props.USER_PROPERTY] = list(self.user_properties)
        if self.content_type is not None:
            carried[props.CONTENT_TYPE] = self.content_type
        packet = archived_publish(self.level, self.topic.encode(), self.payload, self.qos, self.retain,
                                  1 if self.qos else 0, props.encode_entries(carried))
        return (self.recv_us, sender(self.client_id, self.username, self.level), packet)


Sender = tuple[bytes, bytes, int, int]  # client id, username (UTF-8), username length (-1: none), client word
Run = tuple[int, Sender, bytes]  # receive time (us), sender, the PUBLISH packets of one read as received


def sender(client_id: str, username: str | None, level: int) -> Sender:
    """What every run of a connection shares; made once per connection."""
    user = b"" if username is None else username.encode()
    client = client_id.encode()
    return (client, user, -1 if username is None else len(user), len(client) | level << 16)


def archived_publish(level: int, topic: bytes, payload: bytes, qos: int, retain: bool, packet_id: int,
                     carried: bytes) -> bytes:
    """A PUBLISH that the worker decoded, as the archive keeps it: in the publisher's version, a 5.0
    one with `carried` (the property entries that travel with the message, as plexmq/wire.py has them)."""
    if level == 5:
        block = encode_remaining_length(len(carried)) + carried
        return v5.publish_header(topic, len(payload), qos, retain, False, packet_id, block) + payload
    return v4.publish_header(topic, len(payload), qos, retain, False, packet_id) + payload


def partition(recv_us: int) -> str:
    """The `date=YYYY-MM-DD/hour=HH` directory of a receive time (UTC), Spark's partition layout."""
    t = _EPOCH + timedelta(microseconds=recv_us)
    return f"date={t:%Y-%m-%d}/hour={t:%H}"


def tenant_dir(tenant: str) -> str:
    """The directory, under the archive, of a tenant's own tree (its segments and its `.part` files, so
    that it can be handed to that tenant alone): `tenant=NAME`, or "" for the default tenant, whose
    segments stay where a broker without tenants writes them. A tenant name never holds a `/`."""
    return f"tenant={tenant}" if tenant else ""


# A sealed segment's path: [tenant=NAME/]date=YYYY-MM-DD/hour=HH/FILE, below the archive's directory.
_LAYOUT = re.compile(r"(?:^|/)(?:tenant=([^/]+)/)?date=(\d{4}-\d\d-\d\d)/hour=(\d\d)/[^/]+$")


def placed(path: str) -> tuple[str, datetime] | None:
    """The tenant ("" for the default) and the start of the hour (UTC) of a segment at `path`, from its
    directories; None for a path outside the layout."""
    found = _LAYOUT.search(path)
    if found is None:
        return None
    return found[1] or "", datetime.fromisoformat(found[2]).replace(tzinfo=UTC) + timedelta(hours=int(found[3]))


def segment_header(worker_id: int) -> bytes:
    """The bytes a segment starts with."""
    return SEGMENT_HEADER.pack(MAGIC, VERSION, worker_id)


def encode_chunk(runs: Sequence[Run]) -> tuple[bytes, bytes]:
    """One chunk's header and body (written with one writev) holding `runs`: a few C-level packs and
    joins, no Python per run."""
    r = len(runs)
    recv_us, senders, packets = zip(*runs)
    clients, usernames, username_len, client_words = zip(*senders)
    body = b"".join(
        (
            struct.pack(f"<{r}q", *recv_us),
            struct.pack(f"<{r}i", *client_words),
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
    """The columns of one chunk's records: fixed-width ones as little-endian arrays, variable-length
    ones as int32 lengths (-1: null) and the values concatenated, which Arrow takes as they are."""

    count: int
    recv_us: memoryview  # int64
    qos: memoryview  # uint8
    retain: memoryview  # uint8
    level: memoryview  # uint8: 3, 4, 5; 0 not recorded (version 2)
    topic_len: memoryview
    client_len: memoryview
    username_len: memoryview
    payload_len: memoryview
    content_type_len: memoryview
    user_properties_len: memoryview  # pairs per record; -1 below level 5
    topic: memoryview
    client_id: memoryview
    username: memoryview
    payload: memoryview
    content_type: memoryview
    key_len: memoryview  # the user properties' names and values, one per pair, in record order
    value_len: memoryview
    key: memoryview
    value: memoryview


@dataclass(frozen=True)
class Segment:
    """What a reader got out of one segment file."""

    worker_id: int | None  # None when the header itself is unreadable
    chunks: list[Chunk]
    damage: str | None  # what was skipped, where; None for a whole segment
    skipped_bytes: int

    @property
    def records(self) -> int:
        return sum(c.count for c in self.chunks)


def decode_segment(data: bytes | memoryview) -> Segment:
    """Parse a segment held in memory (tools and tests; the pipeline streams files with SegmentReader).
    UnknownVersion for a segment of a version this reader does not know."""
    reader = SegmentReader(io.BytesIO(data), len(data))
    chunks = list(reader.chunks())
    return Segment(reader.worker_id, chunks, reader.damage, reader.skipped_bytes)


class UnknownVersion(Exception):
    """A segment of a format version this reader does not know (a newer plexmq wrote it): reading on
    would silently misread or skip it all, so the reader stops."""


@dataclass(frozen=True)
class Damage:
    """A part of a segment a reader skipped: what it found, where, and how many bytes."""

    what: str
    offset: int
    bytes: int

    def __str__(self) -> str:
        return f"{self.what} at byte {self.offset} ({self.bytes} bytes)"


class SegmentReader:
    """Reads a segment file chunk by chunk (a reader holds one chunk at a time, however large the
    segment), skipping and recording what is damaged.

    A chunk whose body fails its CRC or does not parse is skipped by its header's length, and reading
    goes on with the next chunk: the chunks after a bit flip or a bad sector are kept. A header that
    cannot be right (no runs, a body too short for them, or longer than the file) leaves no length to
    trust, so the rest of the file is skipped: a torn or zero-filled tail after a crash.
    """

    def __init__(self, file: BinaryIO, size: int) -> None:
        """`size`: the file's length in bytes, from its listing. UnknownVersion for a segment of a
        version this reader does not know."""
        self._file = file
        self._size = size
        self.worker_id: int | None = None  # None when the header itself is unreadable
        self.records = 0
        self.damages: list[Damage] = []
        self._version = 0
        header = file.read(SEGMENT_HEADER.size)
        if len(header) < SEGMENT_HEADER.size:
            self._skip("truncated segment header", 0, size)
            return
        magic, version, worker_id = SEGMENT_HEADER.unpack(header)
        if magic != MAGIC:
            self._skip("not a plexmq archive segment", 0, size)
        elif version not in READABLE:
            known = " and ".join(map(str, READABLE))
            raise UnknownVersion(f"segment format version {version}; this plexmq reads versions {known}")
        else:
            self.worker_id, self._version = worker_id, version

    @property
    def damage(self) -> str | None:
        """Every skipped part, where and how long; None when the whole segment was read."""
        return "; ".join(map(str, self.damages)) or None

    @property
    def skipped_bytes(self) -> int:
        return sum(d.bytes for d in self.damages)

    def chunks(self) -> Iterator[Chunk]:
        """The good chunks in file order; `damages` and `records` are final once it ends."""
        pos = SEGMENT_HEADER.size if self.worker_id is not None else self._size
        while pos < self._size:
            header = self._file.read(CHUNK_HEADER.size)
            if len(header) < CHUNK_HEADER.size:
                self._skip("truncated chunk header", pos, self._size - pos)
                return
            size, count, crc = CHUNK_HEADER.unpack(header)
            if not count or size < FIXED_BYTES_PER_RUN * count:
                self._skip("unreadable chunk header", pos, self._size - pos)
                return
            body = self._file.read(size) if pos + CHUNK_HEADER.size + size <= self._size else b""
            if len(body) < size:
                self._skip("truncated chunk", pos, self._size - pos)
                return
            chunk = _chunk(memoryview(body), count, self._version) if zlib.crc32(body) == crc else None
            if chunk is None:
                self._skip("damaged chunk", pos, CHUNK_HEADER.size + size)
            else:
                self.records += chunk.count
                yield chunk
            pos += CHUNK_HEADER.size + size

    def _skip(self, what: str, offset: int, length: int) -> None:
        self.damages.append(Damage(what, offset, length))


def _chunk(body: memoryview, r: int, version: int) -> Chunk | None:
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
    client_words, username_len, packets_len = lengths
    if version == 2:
        client_len, levels = client_words, (0,) * r
    else:
        client_len = tuple(w & 0xFFFF for w in client_words)
        levels = tuple(w >> 16 for w in client_words)
        if not LEVELS.issuperset(levels):
            return None
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
                                   username_len[run], usernames[run], levels[run]):
            return None
    return columns.chunk()


class _Columns:
    """The columns of a chunk being parsed from its PUBLISH packets."""

    def __init__(self) -> None:
        self.count = 0
        self.recv_us: list[int] = []
        self.qos = bytearray()
        self.retain = bytearray()
        self.level = bytearray()
        self.topic_len: list[int] = []
        self.client_len: list[int] = []
        self.username_len: list[int] = []
        self.payload_len: list[int] = []
        self.content_type_len: list[int] = []
        self.user_properties_len: list[int] = []
        self.topic: list[bytes] = []
        self.client_id: list[bytes] = []
        self.username: list[bytes] = []
        self.payload: list[bytes] = []
        self.content_type: list[bytes] = []
        self.key_len: list[int] = []
        self.value_len: list[int] = []
        self.key: list[bytes] = []
        self.value: list[bytes] = []

    def add_packets(self, data: bytes, recv_us: int, client_len: int, client_id: bytes,
                    username_len: int, username: bytes, level: int) -> bool:
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
            if level == 5:
                try:
                    found, payload_at = props.decode(data, payload_at, PUBLISH)
                except MalformedPacket:
                    return False
                if payload_at > stop:  # the property block runs past its packet
                    return False
                self._add_properties(found)
            else:
                self.content_type_len.append(-1)
                self.user_properties_len.append(-1)
            self.count += 1
            self.recv_us.append(recv_us)
            self.qos.append(qos)
            self.retain.append(first & 1)
            self.level.append(level)
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

    def _add_properties(self, found: props.Properties) -> None:
        """The content type and user properties of a 5.0 PUBLISH (its other properties are not columns)."""
        content_type = found.get(props.CONTENT_TYPE)
        if content_type is None:
            self.content_type_len.append(-1)
        else:
            self.content_type.append(content_type.encode())  # type: ignore[union-attr]  # a string property
            self.content_type_len.append(len(self.content_type[-1]))
        pairs: list[tuple[str, str]] = found.get(props.USER_PROPERTY, [])  # type: ignore[assignment]  # pairs, as decoded
        self.user_properties_len.append(len(pairs))
        for key, value in pairs:
            self.key.append(key.encode())
            self.key_len.append(len(self.key[-1]))
            self.value.append(value.encode())
            self.value_len.append(len(self.value[-1]))

    def chunk(self) -> Chunk:
        def ints(values: list[int], code: str = "i") -> memoryview:
            return memoryview(struct.pack(f"<{len(values)}{code}", *values))

        def joined(values: list[bytes]) -> memoryview:
            return memoryview(b"".join(values))

        return Chunk(self.count, ints(self.recv_us, "q"), memoryview(bytes(self.qos)),  # type: ignore[call-arg]  # *map: as many as listed
                     memoryview(bytes(self.retain)), memoryview(bytes(self.level)),
                     *map(ints, (self.topic_len, self.client_len, self.username_len, self.payload_len,
                                 self.content_type_len, self.user_properties_len)),
                     *map(joined, (self.topic, self.client_id, self.username, self.payload, self.content_type)),
                     ints(self.key_len), ints(self.value_len), joined(self.key), joined(self.value))


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
        pair_counts = struct.unpack(f"<{c.count}i", c.user_properties_len)
        pairs = iter(zip(_text_values(c.key_len, c.key), _text_values(c.value_len, c.value)))
        columns = zip(
            struct.unpack(f"<{c.count}q", c.recv_us),
            _text_values(c.topic_len, c.topic),
            c.qos,
            c.retain,
            _values(c.payload_len, c.payload),
            _text_values(c.client_len, c.client_id),
            _text_values(c.username_len, c.username),
            c.level,
            _text_values(c.content_type_len, c.content_type),
            pair_counts,
        )
        for recv_us, topic, qos, retain, payload, client_id, username, level, content_type, n in columns:
            user_properties = None if n < 0 else tuple(next(pairs) for _ in range(n))
            yield Record(recv_us, topic, qos, bool(retain), payload, client_id, username,
                         level, content_type, user_properties)  # type: ignore[arg-type]  # a pair is never null


def _text_values(lengths: memoryview, data: memoryview) -> list[str | None]:
    """The values of one text column (None where the length is -1)."""
    return [None if length < 0 else value.decode()
            for length, value in zip(struct.unpack(f"<{len(lengths) // 4}i", lengths), _values(lengths, data))]


def _values(lengths: memoryview, data: memoryview) -> list[bytes]:
    """The values of one variable-length column (b"" where the length is -1)."""
    values = []
    pos = 0
    for length in struct.unpack(f"<{len(lengths) // 4}i", lengths):
        values.append(bytes(data[pos : pos + max(length, 0)]))
        pos += max(length, 0)
    return values
