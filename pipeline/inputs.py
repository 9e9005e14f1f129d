"""Reading the jobs' binary input files into Spark: listing them, decoding them, accounting for damage.

Why one helper: the archive segments and the benchmark samples are both files of our own binary
format that Python decodes into Arrow columns (`mapInArrow`, no per-record Python), and both need a
per-file account (records read, damage, bytes skipped) for the report. The account travels in the same
Arrow stream as one extra row per file, so decoding runs once.

Why paths, not contents: Spark's `binaryFile` source hands a whole file to Python as one row, so a
task holds a whole segment (64 MiB, or more) several times over in the JVM and in Python. Instead each
task gets one file's path and the decoder reads that file itself, piece by piece, yielding Arrow
batches of one piece each: a task's memory is bounded by a piece (a segment's chunk), whatever the
file's size. Jobs that read the records several times keep them on disk only, not in memory
(`decode`); a job that stores them has the executors write them straight to Parquet (`decode_to_parquet`).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Generator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import BinaryIO

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
from pyspark import StorageLevel
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import from_arrow_schema


class BadInput(Exception):
    """Input a job cannot use: reported as one line on stderr, exit code 2."""


@dataclass(frozen=True)
class Decoded:
    """What a decoder got out of one file, besides the record batches it yielded."""

    records: int
    damage: str | None  # why part of the file was skipped; None when all of it was read
    skipped_bytes: int


# Decodes one open file given its path under the input's root (whose directories may name what all its
# records share, as Spark's partition directories do: an archive segment's tenant) and its size: yields
# its records as batches (in the decoder's record schema), a bounded piece of the file at a time, and
# returns the file's account.
Decoder = Callable[[str, BinaryIO, int], Generator[pa.RecordBatch, None, Decoded]]


@dataclass(frozen=True)
class FileAccount:
    """One input file as the report lists it."""

    path: str
    bytes: int
    records: int
    damage: str | None
    skipped_bytes: int


_ACCOUNT = pa.schema(
    [
        ("file", pa.string()),
        ("file_bytes", pa.int64()),
        ("file_records", pa.int64()),
        ("damage", pa.string()),
        ("skipped_bytes", pa.int64()),
    ]
)


def input_files(root: str, suffix: str) -> list[tuple[str, int]]:
    """The `*suffix` files under `root` as (path relative to `root`, bytes), sorted; like Spark's
    sources, names starting with `_` or `.` are left out (a broker's `_writing/`). BadInput when `root`
    is unreadable."""
    try:
        fs, base = filesystem(root)
        found = fs.get_file_info(pafs.FileSelector(base, recursive=True))
    except (OSError, pa.ArrowException) as e:
        raise BadInput(f"cannot read {root}: {str(e).splitlines()[0]}") from e
    files = []
    for info in found:
        relative = PurePosixPath(info.path).relative_to(base)
        if info.is_file and info.base_name.endswith(suffix) and not any(p[0] in "_." for p in relative.parts):
            files.append((str(relative), info.size))
    return sorted(files)


def filesystem(root: str) -> tuple[pafs.FileSystem, str]:
    """The filesystem of `root` and its path there: a local or mounted directory, or a URI that pyarrow
    opens (hdfs://, s3://, gs://)."""
    if "://" in root:
        return pafs.FileSystem.from_uri(root)
    return pafs.LocalFileSystem(), os.path.abspath(root).rstrip("/") or "/"


@contextmanager
def decode(
    spark: SparkSession, root: str, files: list[tuple[str, int]], decoder: Decoder, schema: pa.Schema
) -> Iterator[tuple[DataFrame, list[FileAccount]]]:
    """Decode the `files` under `root` with `decoder` (on the executors, one task per file) into a
    DataFrame of `schema`, persisted on disk until the context ends, and account for every file."""
    combined = pa.schema(list(schema) + list(_ACCOUNT))

    def batches(inputs: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        fs, base = filesystem(root)
        for batch in inputs:
            for path, size in zip(batch.column("path").to_pylist(), batch.column("size").to_pylist()):
                with fs.open_input_stream(f"{base}/{path}") as file:
                    decoded = yield from _with_account_columns(decoder(path, file, size), combined)
                account = [f"{root.rstrip('/')}/{path}", size, decoded.records, decoded.damage, decoded.skipped_bytes]
                yield pa.RecordBatch.from_pylist([dict(zip(_ACCOUNT.names, account))], schema=combined)

    listing = spark.createDataFrame(spark.sparkContext.parallelize(files, max(1, len(files))), "path string, size long")
    both = listing.mapInArrow(batches, from_arrow_schema(combined)).persist(StorageLevel.DISK_ONLY)
    try:
        accounts = both.where(F.col("file").isNotNull()).select(*_ACCOUNT.names).collect()
        records = both.where(F.col("file").isNull()).drop(*_ACCOUNT.names)
        yield records, sorted((FileAccount(*row) for row in accounts), key=lambda a: a.path)
    finally:
        both.unpersist()


def decode_to_parquet(
    spark: SparkSession, root: str, files: list[tuple[str, int]], decoder: Decoder, schema: pa.Schema, out: str
) -> list[FileAccount]:
    """Decode the `files` under `root` with `decoder` (on the executors, one task per file) straight into
    Parquet under `out` (one file per input file, replacing what `out` held), and account for every file.

    Why not through Spark's writer: a record that crosses from Arrow into Spark's rows and back out
    through its Parquet writer costs more than its decoding, pyarrow's writer ~0.2 us, and a job that
    only stores the decoded records has no use for the rows. A
    file's records are written as row groups of `ROW_GROUP` records (a task's memory stays bounded) to
    a hidden name, renamed once complete: a retried task replaces its own file, and readers (which
    skip names starting with `.`) never see a partial one."""
    out_fs, out_base = filesystem(out)
    out_fs.create_dir(out_base)
    out_fs.delete_dir_contents(out_base)

    def write(inputs: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        fs, base = filesystem(root)
        sink_fs, sink_base = filesystem(out)
        for batch in inputs:
            for path, size in zip(batch.column("path").to_pylist(), batch.column("size").to_pylist()):
                name = path.replace("/", "_") + ".parquet"
                partial = f"{sink_base}/.{name}.partial"
                with (fs.open_input_stream(f"{base}/{path}") as file, sink_fs.open_output_stream(partial) as sink,
                      pq.ParquetWriter(sink, schema) as writer):
                    decoded = _write_row_groups(decoder(path, file, size), writer)
                sink_fs.move(partial, f"{sink_base}/{name}")
                account = [f"{root.rstrip('/')}/{path}", size, decoded.records, decoded.damage, decoded.skipped_bytes]
                yield pa.RecordBatch.from_pylist([dict(zip(_ACCOUNT.names, account))], schema=_ACCOUNT)

    listing = spark.createDataFrame(spark.sparkContext.parallelize(files, max(1, len(files))), "path string, size long")
    rows = listing.mapInArrow(write, from_arrow_schema(_ACCOUNT)).collect()
    return sorted((FileAccount(*row) for row in rows), key=lambda a: a.path)


# Records per Parquet row group written by decode_to_parquet: large enough for good compression and
# cheap reads, small enough that a task holds little (~100 bytes a record in Arrow).
ROW_GROUP = 262_144


def _write_row_groups(decoding: Generator[pa.RecordBatch, None, Decoded], writer: pq.ParquetWriter) -> Decoded:
    """Write the decoder's batches as row groups of ROW_GROUP records; its account."""
    pending: list[pa.RecordBatch] = []
    rows = 0
    while True:
        try:
            batch = next(decoding)
        except StopIteration as done:
            if pending:
                writer.write_table(pa.Table.from_batches(pending, writer.schema))
            return done.value
        pending.append(batch)
        rows += batch.num_rows
        if rows >= ROW_GROUP:
            writer.write_table(pa.Table.from_batches(pending, writer.schema))
            pending, rows = [], 0


def _with_account_columns(
    decoding: Generator[pa.RecordBatch, None, Decoded], combined: pa.Schema
) -> Generator[pa.RecordBatch, None, Decoded]:
    """The decoder's batches with the account columns added (null), and its account."""
    while True:
        try:
            records = next(decoding)
        except StopIteration as done:
            return done.value
        nulls = [pa.nulls(records.num_rows, f.type) for f in _ACCOUNT]
        yield pa.RecordBatch.from_arrays(records.columns + nulls, schema=combined)
