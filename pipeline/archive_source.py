"""The traffic archive decoded: one row per archived PUBLISH (payload bytes left out) written as Parquet
(`write_archive`), or, for the topics a job asks for, a Spark DataFrame of the payloads themselves
(`read_payloads`).

`tenant` is the publisher's tenant ("" for the default tenant), from the segment's directory
(`tenant=NAME/`, see `archive_format.tenant_dir`): a job reads one tenant's tree alone, or every tree.

`protocol_level` is the publisher's (3: MQTT 3.1, 4: 3.1.1, 5: 5.0; null for segments of format
version 2, which did not record it). `content_type` and `user_properties` (the pairs in the order sent,
repeated names kept: an array, not a map) are the 5.0 message's; `user_properties` is null for 3.1/3.1.1
messages, empty for a 5.0 message without any.

Chunks map onto Arrow columns with NumPy (the format keeps each column contiguous), so decoding costs
no Python per record. The payload itself stays in the segments: the traffic analysis needs only its
size, and leaving it out keeps the records small.
"""

from __future__ import annotations

from collections.abc import Generator, Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta
from functools import partial
from typing import BinaryIO

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame, SparkSession

from plexmq.archive_format import SEGMENT_SUFFIX, Chunk, SegmentReader, UnknownVersion, placed, tenant_dir
from plexmq.mqtt.topics import matches
from plexmq.pipeline.inputs import BadInput, Decoded, FileAccount, decode, decode_to_parquet, filesystem, input_files

SCHEMA = pa.schema(
    [
        ("recv_time", pa.timestamp("us", tz="UTC")),
        ("topic", pa.string()),
        ("qos", pa.int8()),
        ("retain", pa.bool_()),
        ("payload_size", pa.int32()),
        ("client_id", pa.string()),
        ("username", pa.string()),
        ("worker_id", pa.int32()),
        ("protocol_level", pa.int8()),
        ("content_type", pa.string()),
        ("user_properties", pa.list_(pa.struct([("key", pa.string()), ("value", pa.string())]))),
        ("tenant", pa.string()),
    ]
)

PAYLOADS = pa.schema(
    [
        ("recv_time", pa.timestamp("us", tz="UTC")),
        ("topic", pa.string()),
        ("client_id", pa.string()),
        ("payload", pa.binary()),
    ]
)


def write_archive(
    spark: SparkSession, archive: str, since: datetime | None, until: datetime | None, tenant: str | None, out: str
) -> list[FileAccount]:
    """Write the records of `tenant` (None: of every tenant) received in [since, until) as Parquet under
    `out` (`SCHEMA`, a file per segment) and return the account of the segments read. Only that
    tenant's tree and the `date=/hour=` partitions that overlap the window are read."""
    decoder = partial(_decode, since, until)
    return decode_to_parquet(spark, archive, _segments(archive, since, until, tenant), decoder, SCHEMA, out)


@contextmanager
def read_payloads(
    spark: SparkSession, archive: str, filters: list[str], scratch: str
) -> Iterator[tuple[DataFrame, list[FileAccount]]]:
    """The messages on topics matching any of `filters` with their payloads (`PAYLOADS`, kept in
    `scratch` while the context lasts) and an account of the segments read. The topics are matched as
    the chunks are decoded, so other topics' payloads (binary, large) never become rows."""
    decoder = partial(_decode_payloads, filters)
    with decode(spark, archive, _segments(archive, None, None, None), decoder, PAYLOADS, scratch) as found:
        yield found


@contextmanager
def read_segments(
    spark: SparkSession, archive: str, files: list[tuple[str, int]], scratch: str
) -> Iterator[tuple[DataFrame, list[FileAccount]]]:
    """The records of the given segments (as `sealed_segments` lists them; kept in `scratch` while the
    context lasts) and their account; BadInput first when one has a version this plexmq cannot read."""
    _check_versions(archive, files)
    with decode(spark, archive, files, partial(_decode, None, None), SCHEMA, scratch) as found:
        yield found


def sealed_segments(
    archive: str, since: datetime | None = None, until: datetime | None = None, tenant: str | None = None
) -> list[tuple[str, int]]:
    """The sealed segments (path relative to `archive`, bytes) of `tenant` (None: of every tenant) whose
    partitions overlap [since, until), sorted; never the broker's `_writing/` directories."""
    return [(path, size) for path, size in input_files(archive, SEGMENT_SUFFIX) if selected(path, since, until, tenant)]


def _segments(archive: str, since: datetime | None, until: datetime | None, tenant: str | None) -> list[tuple[str, int]]:
    """The segments of `tenant` whose partitions overlap [since, until); BadInput when there are none
    or one has a version this plexmq cannot read."""
    files = sealed_segments(archive, since, until, tenant)
    if not files:
        where = "date=YYYY-MM-DD/hour=HH"
        where = f"{tenant_dir('NAME')}/{where}, or {where}" if tenant is None else f"{tenant_dir(tenant)}/{where}".lstrip("/")
        raise BadInput(f"no segments{of_tenant(tenant)} under {archive}{window(since, until)} (in {where} directories)")
    _check_versions(archive, files)
    return files


def _check_versions(archive: str, files: list[tuple[str, int]]) -> None:
    """BadInput, before any Spark work, for a segment of a format version this plexmq cannot read (a
    newer broker's): a report without it would look complete. Reads each segment's header."""
    fs, base = filesystem(archive)
    for path, size in files:
        with fs.open_input_stream(f"{base}/{path}") as file:
            try:
                SegmentReader(file, size)
            except UnknownVersion as e:
                raise BadInput(f"{archive.rstrip('/')}/{path}: {e}") from e


def selected(path: str, since: datetime | None, until: datetime | None, tenant: str | None) -> bool:
    """Whether a segment is in the tree of `tenant` (None: of any tenant) and its `date=/hour=`
    partition overlaps [since, until); False outside the layout."""
    found = placed(path)
    if found is None or tenant is not None and found[0] != tenant:
        return False
    hour_start = found[1]
    return (since is None or hour_start + timedelta(hours=1) > since) and (until is None or hour_start < until)


def window(since: datetime | None, until: datetime | None) -> str:
    """` from SINCE until UNTIL` for messages, or nothing for the whole archive."""
    start = f" from {since:%Y-%m-%d %H:%M:%S}" if since else ""
    return start + (f" until {until:%Y-%m-%d %H:%M:%S}" if until else "")


def of_tenant(tenant: str | None) -> str:
    """` of tenant NAME` (` of the default tenant`) for messages, or nothing for every tenant."""
    if tenant is None:
        return ""
    return f" of tenant {tenant}" if tenant else " of the default tenant"


def _decode(
    since: datetime | None, until: datetime | None, path: str, file: BinaryIO, size: int
) -> Generator[pa.RecordBatch, None, Decoded]:
    """The segment's records received in [since, until); the account counts them all."""
    reader = SegmentReader(file, size)
    found = placed(path)
    assert found is not None  # the jobs read the segments that sealed_segments lists
    tenant = found[0]
    for chunk in reader.chunks():
        batch = _batch(chunk, reader.worker_id or 0, tenant)
        yield batch if since is None and until is None else batch.filter(_within(batch.column(0), since, until))
    return Decoded(reader.records, reader.damage, reader.skipped_bytes)


def _within(times: pa.Array, since: datetime | None, until: datetime | None) -> pa.Array:
    """Which of `times` lie in [since, until)."""
    kind = SCHEMA.field("recv_time").type
    after = pc.greater_equal(times, pa.scalar(since, kind)) if since is not None else None
    before = pc.less(times, pa.scalar(until, kind)) if until is not None else None
    if after is None or before is None:
        return after if before is None else before
    return pc.and_(after, before)


def _decode_payloads(filters: list[str], path: str, file: BinaryIO, size: int) -> Generator[pa.RecordBatch, None, Decoded]:
    reader = SegmentReader(file, size)
    for c in reader.chunks():
        topics = _text(c.topic_len, c.topic)
        wanted = pa.array([any(matches(f, t) for f in filters) for t in topics.to_pylist()], pa.bool_())
        columns = [
            pa.array(_numbers(c.recv_us, "<i8"), pa.timestamp("us", tz="UTC")),
            topics,
            _text(c.client_len, c.client_id),
            pa.Array.from_buffers(pa.binary(), c.count, [*_offsets(c.payload_len), pa.py_buffer(c.payload)]),
        ]
        yield pa.RecordBatch.from_arrays(columns, schema=PAYLOADS).filter(wanted)  # copies the kept rows only
    return Decoded(reader.records, reader.damage, reader.skipped_bytes)


def _batch(c: Chunk, worker_id: int, tenant: str) -> pa.RecordBatch:
    columns = [
        pa.array(_numbers(c.recv_us, "<i8"), pa.timestamp("us", tz="UTC")),
        _text(c.topic_len, c.topic),
        pa.array(np.frombuffer(c.qos, np.int8)),
        pa.array(np.frombuffer(c.retain, np.uint8).astype(bool)),
        pa.array(_numbers(c.payload_len, "<i4")),
        _text(c.client_len, c.client_id),
        _text(c.username_len, c.username),
        pa.array(np.full(c.count, worker_id, np.int32)),
        _level(c.level),
        _text(c.content_type_len, c.content_type),
        _user_properties(c),
        pa.repeat(pa.scalar(tenant, pa.string()), c.count),
    ]
    return pa.RecordBatch.from_arrays(columns, schema=SCHEMA)


def _level(buffer: memoryview) -> pa.Array:
    levels = np.frombuffer(buffer, np.int8)
    return pa.array(levels, mask=levels == 0)  # 0: not recorded


def _user_properties(c: Chunk) -> pa.Array:
    """The list of (key, value) structs per record, from the pair counts (-1: null) and the pairs."""
    pairs = pa.StructArray.from_arrays([_text(c.key_len, c.key), _text(c.value_len, c.value)], ["key", "value"])
    validity, offsets = _offsets(c.user_properties_len)
    field = SCHEMA.field("user_properties").type
    return pa.Array.from_buffers(field, c.count, [validity, offsets], children=[pairs])


def _text(lengths_buffer: memoryview, data: memoryview) -> pa.Array:
    """An Arrow string array straight from a text column's lengths (-1: null) and UTF-8 bytes."""
    validity, offsets = _offsets(lengths_buffer)
    return pa.Array.from_buffers(pa.string(), len(lengths_buffer) // 4, [validity, offsets, pa.py_buffer(data)])


def _offsets(lengths_buffer: memoryview) -> tuple[pa.Buffer | None, pa.Buffer]:
    """The validity bitmap (None: no nulls) and int32 offsets of a variable-length Arrow column from
    its lengths (-1: null)."""
    lengths = _numbers(lengths_buffer, "<i4")
    offsets = np.zeros(len(lengths) + 1, np.int32)
    np.cumsum(np.maximum(lengths, 0), out=offsets[1:])
    valid = lengths >= 0
    validity = None if valid.all() else pa.py_buffer(np.packbits(valid, bitorder="little"))
    return validity, pa.py_buffer(offsets)


def _numbers(buffer: memoryview, little_endian: str) -> np.ndarray:
    """A column of the (little-endian) format as numbers in the host's byte order, which Arrow needs."""
    values = np.frombuffer(buffer, little_endian)
    return values.astype(values.dtype.newbyteorder("="), copy=False)
