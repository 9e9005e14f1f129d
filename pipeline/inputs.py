"""Reading the jobs' binary input files into Spark: listing them, decoding them, accounting for damage.

Why one helper: the archive segments and the benchmark samples are both files of our own binary
format that Python decodes into Arrow columns (no per-record Python), and both need a per-file account
(records read, damage, bytes skipped) for the report.

Why paths, not contents: Spark's `binaryFile` source hands a whole file to Python as one row, so a
task holds a whole segment (64 MiB, or more) several times over in the JVM and in Python. Instead each
task gets its files' paths and the decoder reads each file itself, piece by piece, yielding Arrow
batches of one piece each: a task's memory is bounded by a piece (a segment's chunk), whatever the
file's size. The records go straight to Parquet (`decode_to_parquet`), which Spark then reads: as a
job's table, or as a scratch copy for a job that reads them several times (`decode`).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Generator, Iterator
from contextlib import contextmanager
from dataclasses import astuple, dataclass
from pathlib import PurePosixPath
from typing import BinaryIO

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.pandas.types import from_arrow_schema

from plexmq.pipeline.session import is_local


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
    spark: SparkSession, root: str, files: list[tuple[str, int]], decoder: Decoder, schema: pa.Schema, scratch: str
) -> Iterator[tuple[DataFrame, list[FileAccount]]]:
    """Decode the `files` under `root` with `decoder` into a DataFrame of `schema`, kept as Parquet in
    `scratch` (a directory the executors see, like the job's output; removed when the context ends),
    and account for every file."""
    try:
        accounts = decode_to_parquet(spark, root, files, decoder, schema, scratch)
        yield spark.read.schema(from_arrow_schema(schema)).parquet(scratch), accounts
    finally:
        fs, base = filesystem(scratch)
        fs.delete_dir(base)


def decode_to_parquet(
    spark: SparkSession, root: str, files: list[tuple[str, int]], decoder: Decoder, schema: pa.Schema, out: str
) -> list[FileAccount]:
    """Decode the `files` under `root` with `decoder`, a task per few files (`_tasks`), straight into
    Parquet under `out` (a file per task, replacing what `out` held), and account for every file.

    Why not through Spark's writer: a record that crosses from Arrow into Spark's rows and back out
    through its Parquet writer costs more than its decoding, pyarrow's writer ~0.2 us, and a job that
    only stores the decoded records has no use for the rows. A task's records are written as row
    groups of `ROW_GROUP` records (its memory stays bounded) to a hidden name, renamed once complete:
    a retried task replaces its own file, and readers (which skip names starting with `.`) never see a
    partial one.

    Where the tasks run: on the executors (`mapInArrow`), but in local mode, where the driver is the
    only executor, files of up to IN_DRIVER_BYTES in all are decoded in the driver itself, one task
    after the other. Spark would start Python workers for them, whose first task (their imports,
    Spark's Arrow set-up) costs seconds, while 10,000 records decode in ~0.1 s; more bytes than that
    pay for the workers' start by decoding on every core at once (the driver's threads would share
    one: the decoding is Python's, under its GIL)."""
    out_fs, out_base = filesystem(out)
    out_fs.create_dir(out_base)
    out_fs.delete_dir_contents(out_base)

    def task(files_of_task: list[tuple[str, int]]) -> list[FileAccount]:
        fs, base = filesystem(root)
        sink_fs, sink_base = filesystem(out)
        name = files_of_task[0][0].replace("/", "_") + ".parquet"
        partial = f"{sink_base}/.{name}.partial"
        accounts = []
        with sink_fs.open_output_stream(partial) as sink, pq.ParquetWriter(sink, schema) as writer:
            rows = _RowGroups(writer)
            for path, size in files_of_task:
                with fs.open_input_stream(f"{base}/{path}") as file:
                    decoded = rows.write(decoder(path, file, size))
                accounts.append(FileAccount(f"{root.rstrip('/')}/{path}", size, decoded.records, decoded.damage,
                                            decoded.skipped_bytes))
            rows.flush()
        sink_fs.move(partial, f"{sink_base}/{name}")
        return accounts

    groups = _tasks(files, spark.sparkContext.defaultParallelism)
    if is_local(spark) and sum(size for _, size in files) <= IN_DRIVER_BYTES:
        accounts = [account for group in groups for account in task(group)]
    else:
        def on_executor(inputs: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
            for batch in inputs:
                for files_of_task in batch.column("files").to_pylist():
                    done = task([(f["path"], f["size"]) for f in files_of_task])
                    yield pa.RecordBatch.from_pylist([dict(zip(_ACCOUNT.names, astuple(a))) for a in done], _ACCOUNT)

        listing = spark.sparkContext.parallelize([(group,) for group in groups], len(groups))
        rows = (spark.createDataFrame(listing, "files array<struct<path: string, size: long>>")
                .mapInArrow(on_executor, from_arrow_schema(_ACCOUNT)).collect())
        accounts = [FileAccount(*row) for row in rows]
    return sorted(accounts, key=lambda a: a.path)


# Input bytes that local mode decodes in the driver (decode_to_parquet): ~1 s of decoding, less than
# Spark's Python workers take to start.
IN_DRIVER_BYTES = 64 << 20

# Input bytes a task decodes at most, unless one file is larger: a task's output is a file that later
# stages read in one task (about as many records as one segment of the broker's default roll_bytes).
TASK_BYTES = 64 << 20


def _tasks(files: list[tuple[str, int]], parallelism: int) -> list[list[tuple[str, int]]]:
    """The `files` (path, bytes) in groups of consecutive files, one per task: up to TASK_BYTES, and to
    at most an even share of the bytes among `parallelism` tasks, so that every core has a task.

    Why not a task per file: a broker seals a segment every `roll_seconds` (5 min) even when it holds
    a few KB, so a small archive is many small files, and a task each (then a Parquet file each, and a
    task per file in every later stage) costs more in tasks than the decoding itself."""
    share = -(-sum(size for _, size in files) // max(1, parallelism))
    limit = max(1, min(TASK_BYTES, share))
    groups: list[list[tuple[str, int]]] = []
    held = 0
    for path, size in files:
        if not groups or held + size > limit:
            groups.append([])
            held = 0
        groups[-1].append((path, size))
        held += size
    return groups


# Records per Parquet row group written by decode_to_parquet: large enough for good compression and
# cheap reads, small enough that a task holds little (~100 bytes a record in Arrow).
ROW_GROUP = 262_144


class _RowGroups:
    """Writes decoders' batches as row groups of ROW_GROUP records (several files' records may share one)."""

    def __init__(self, writer: pq.ParquetWriter) -> None:
        self._writer = writer
        self._pending: list[pa.RecordBatch] = []
        self._rows = 0

    def write(self, decoding: Generator[pa.RecordBatch, None, Decoded]) -> Decoded:
        """Write a file's batches; its account."""
        while True:
            try:
                batch = next(decoding)
            except StopIteration as done:
                return done.value
            self._pending.append(batch)
            self._rows += batch.num_rows
            if self._rows >= ROW_GROUP:
                self.flush()

    def flush(self) -> None:
        """Write what is pending as a row group."""
        if self._pending:
            self._writer.write_table(pa.Table.from_batches(self._pending, self._writer.schema))
        self._pending, self._rows = [], 0
