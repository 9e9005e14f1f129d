"""The benchmark's raw samples (format: `bench.samples`) as one Spark DataFrame per kind."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack, contextmanager

import numpy as np
import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession

from bench.samples import KINDS, SUFFIX, Kind, records_region
from pipeline.inputs import BadInput, Decoded, FileAccount, binary_files, decode

# Spark has no unsigned integers: every integer field becomes a long.
_ARROW_TYPES = {"q": pa.int64(), "Q": pa.int64(), "I": pa.int64(), "d": pa.float64()}


@contextmanager
def read_samples(spark: SparkSession, samples: str) -> Iterator[tuple[dict[str, DataFrame], list[FileAccount]]]:
    """The samples of every kind found, by kind name (cached while the context lasts), and an
    account of the files read."""
    listing = binary_files(spark, samples, SUFFIX, recursive=True).select("path").collect()
    if not listing:
        raise BadInput(f"no {SUFFIX} sample files under {samples}")
    found = {row.path.rsplit("/", 2)[-2] for row in listing}  # DIR/<kind>/<name>.smp
    frames: dict[str, DataFrame] = {}
    accounts: list[FileAccount] = []
    with ExitStack() as stack:
        for kind in KINDS:
            if kind.name in found:
                files = binary_files(spark, f"{samples.rstrip('/')}/{kind.name}", SUFFIX)
                frame, kind_accounts = stack.enter_context(decode(files, _Decoder(kind), _schema(kind)))
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

    def __call__(self, data: memoryview) -> Decoded:
        region, damage, skipped = records_region(data, self.kind)
        rows = np.frombuffer(region, self.dtype)
        columns = []
        for field in self.schema:
            values = rows[field.name]
            if field.type == pa.string():  # NUL-padded UTF-8: NumPy's bytes drop the padding
                columns.append(pa.array([v.decode() for v in values.tolist()], pa.string()))
            else:
                columns.append(pa.array(values.astype(field.type.to_pandas_dtype())))
        batch = pa.RecordBatch.from_arrays(columns, schema=self.schema)
        return Decoded([batch] if len(rows) else [], len(rows), damage, skipped)
