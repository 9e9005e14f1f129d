"""Reading the jobs' binary input files into Spark: listing them, decoding them, accounting for damage.

Why one helper: the archive segments and the benchmark samples are both files of our own binary
format that Python decodes into Arrow columns (`mapInArrow`, no per-record Python), and both need a
per-file account (records read, damage, bytes skipped) for the report. The account travels in the same
Arrow stream as one extra row per file, so decoding runs once and its result is cached for the many
aggregations that follow.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import pyarrow as pa
from pyspark.errors import AnalysisException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import from_arrow_schema


class BadInput(Exception):
    """Input a job cannot use: reported as one line on stderr, exit code 2."""


@dataclass(frozen=True)
class Decoded:
    """What a decoder got out of one file."""

    batches: list[pa.RecordBatch]  # in the decoder's record schema
    records: int
    damage: str | None  # why part of the file was skipped; None when all of it was read
    skipped_bytes: int


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


def binary_files(spark: SparkSession, root: str, suffix: str, recursive: bool = False) -> DataFrame:
    """The `*suffix` files under `root` as Spark's binaryFile rows, with the Hive-style partition
    columns of the directories (`name=value/`) unless `recursive`; BadInput when `root` is unreadable."""
    reader = spark.read.format("binaryFile").option("pathGlobFilter", f"*{suffix}")
    if recursive:
        reader = reader.option("recursiveFileLookup", "true")
    try:
        return reader.load(root)
    except AnalysisException as e:
        raise BadInput(f"cannot read {root}: {str(e).splitlines()[0]}") from e


@contextmanager
def decode(
    files: DataFrame, decoder: Callable[[memoryview], Decoded], schema: pa.Schema
) -> Iterator[tuple[DataFrame, list[FileAccount]]]:
    """Decode every file with `decoder` (on the executors) into a DataFrame of `schema`, cached until
    the context ends, and account for every file."""
    combined = pa.schema(list(schema) + list(_ACCOUNT))

    def batches(inputs: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in inputs:
            paths = batch.column("path").to_pylist()
            for path, content in zip(paths, batch.column("content")):
                data = memoryview(content.as_buffer())
                decoded = decoder(data)
                for records in decoded.batches:
                    nulls = [pa.nulls(records.num_rows, f.type) for f in _ACCOUNT]
                    yield pa.RecordBatch.from_arrays(records.columns + nulls, schema=combined)
                account = [path, len(data), decoded.records, decoded.damage, decoded.skipped_bytes]
                yield pa.RecordBatch.from_pylist([dict(zip(_ACCOUNT.names, account))], schema=combined)

    both = files.select("path", "content").mapInArrow(batches, from_arrow_schema(combined)).cache()
    try:
        accounts = both.where(F.col("file").isNotNull()).select(*_ACCOUNT.names).collect()
        records = both.where(F.col("file").isNull()).drop(*_ACCOUNT.names)
        yield records, sorted((FileAccount(*row) for row in accounts), key=lambda a: a.path)
    finally:
        both.unpersist()
