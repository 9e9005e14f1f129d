"""The benchmark's raw samples (format: `bench.samples`) as one Spark DataFrame per kind."""

from __future__ import annotations

from collections.abc import Generator, Iterator
from contextlib import ExitStack, contextmanager
from typing import BinaryIO

import numpy as np
import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession

from plexmq.bench.samples import HEADER, KINDS, SUFFIX, Kind, records_in
from plexmq.pipeline.inputs import BadInput, Decoded, FileAccount, decode, input_files

# Spark has no unsigned integers: every integer field becomes a long.
_ARROW_TYPES = {"q": pa.int64(), "Q": pa.int64(), "I": pa.int64(), "d": pa.float64()}


# Records per Arrow batch: a task holds one batch of a sample file at a time, whatever the file's size.
PIECE_RECORDS = 65536


@contextmanager
def read_samples(
    spark: SparkSession, samples: str, scratch: str
) -> Iterator[tuple[dict[str, DataFrame], list[FileAccount]]]:
    """The samples of every kind found, by kind name (kept in `scratch/KIND` while the context lasts),
    and an account of the files read."""
    listing = input_files(samples, SUFFIX)
    if not listing:
        raise BadInput(f"no {SUFFIX} sample files under {samples}")
    frames: dict[str, DataFrame] = {}
    accounts: list[FileAccount] = []
    with ExitStack() as stack:
        for kind in KINDS:
            files = [(path, size) for path, size in listing if path.split("/")[-2:-1] == [kind.name]]  # <kind>/<name>.smp
            if files:
                kept = f"{scratch}/{kind.name}"
                frame, kind_accounts = stack.enter_context(decode(spark, samples, files, _Decoder(kind), _schema(kind), kept))
                frames[kind.name] = frame
                accounts += kind_accounts
        yield frames, accounts


def _schema(kind: Kind) -> pa.Schema:
    return pa.schema([(name, _ARROW_TYPES.get(code, pa.string())) for name, code in kind.fields])


class _Decoder:
    """Decodes one kind's files: whole records map onto a NumPy structured array, then Arrow."""

    def __init__(self, kind: Kind) -> None:
        self.kind = kind
        self.schema = _schema(kind)
        self.dtype = np.dtype(
            [(n, "S" + c[:-1] if c.endswith("s") else "<" + c) for n, c in kind.fields]
        )

    def __call__(self, path: str, file: BinaryIO, size: int) -> Generator[pa.RecordBatch, None, Decoded]:
        """A samples file's records (its path names nothing they share)."""
        count, damage, skipped = records_in(file.read(HEADER.size), size, self.kind)
        for start in range(0, count, PIECE_RECORDS):
            rows = np.frombuffer(file.read(min(PIECE_RECORDS, count - start) * self.kind.record.size), self.dtype)
            yield self._batch(rows)
        return Decoded(count, damage, skipped)

    def _batch(self, rows: np.ndarray) -> pa.RecordBatch:
        columns = []
        for field in self.schema:
            values = rows[field.name]
            if field.type == pa.string():  # NUL-padded UTF-8: NumPy's bytes drop the padding
                columns.append(pa.array([v.decode() for v in values.tolist()], pa.string()))
            else:
                columns.append(pa.array(values.astype(field.type.to_pandas_dtype())))
        return pa.RecordBatch.from_arrays(columns, schema=self.schema)
