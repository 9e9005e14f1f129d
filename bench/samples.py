"""Raw benchmark samples: what bench/ writes under `--out DIR` and `plexmq pipeline bench` reads.

Why fixed-size binary records: a load generator records one latency sample per delivered message, at
hundreds of thousands per second, in the very processes whose speed it measures; packing one struct
into a buffer costs a fraction of formatting a CSV or JSON line, and the pipeline maps whole files onto
NumPy/Arrow columns without parsing.

Layout: `DIR/<kind>/<name>.smp`, one file per writer (any number of processes may write their own
files). A file is HEADER (magic b"PXSM", version, record size) followed by records, little-endian,
fields as listed in the kind. A truncated last record (the writer died) is skipped by readers.

Kinds:
- latency: one per received message: send and receive time (UTC microseconds), latency (µs),
  publisher index, sequence number, subscriber (process) index.
- rates: one per second per writer: the second (UTC, seconds since the epoch), messages sent and
  received in it; readers add up the writers' rows of the same second.
- processes: one per second per broker process: second, pid, role ("router", "worker-0", ...; UTF-8,
  at most 32 bytes, NUL-padded), CPU percent (100 = one core), resident set size in bytes.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Self

MAGIC = b"PXSM"
VERSION = 1
SUFFIX = ".smp"
HEADER = struct.Struct("<4sHH")  # magic, version, record size


@dataclass(frozen=True)
class Kind:
    """One kind of sample: its directory name and its fields as (name, struct code)."""

    name: str
    fields: tuple[tuple[str, str], ...]
    record: struct.Struct = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        codes = "".join(code for _, code in self.fields)
        object.__setattr__(self, "record", struct.Struct("<" + codes))

    def __reduce__(self) -> tuple[type[Kind], tuple[str, tuple[tuple[str, str], ...]]]:
        """Pickled without its Struct (which cannot be), e.g. to ship a reader to Spark executors."""
        return Kind, (self.name, self.fields)


LATENCY = Kind(
    "latency",
    (
        ("send_us", "q"),
        ("recv_us", "q"),
        ("latency_us", "q"),
        ("publisher", "I"),
        ("seq", "Q"),
        ("subscriber", "I"),
    ),
)
RATES = Kind("rates", (("second", "q"), ("sent", "Q"), ("received", "Q")))
PROCESSES = Kind(
    "processes",
    (("second", "q"), ("pid", "I"), ("role", "32s"), ("cpu_percent", "d"), ("rss_bytes", "Q")),
)
KINDS = (LATENCY, RATES, PROCESSES)


class SampleWriter:
    """Appends samples of one kind to `DIR/<kind>/<name>.smp`, writing in large buffered blocks.

    `add` takes the kind's fields in order (text fields as bytes). Use it as a context manager, or call
    `close`, so that the last block is written.
    """

    def __init__(self, out_dir: str | Path, kind: Kind, name: str, buffer_bytes: int = 1 << 20) -> None:
        path = Path(out_dir) / kind.name / (name + SUFFIX)
        path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(path, "wb", buffering=buffer_bytes)  # noqa: SIM115 (closed by close())
        self._file.write(HEADER.pack(MAGIC, VERSION, kind.record.size))
        self._pack = kind.record.pack
        self.path = path

    def add(self, *values: float | bytes) -> None:
        self._file.write(self._pack(*values))

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def records_region(data: bytes | memoryview, kind: Kind) -> tuple[memoryview, str | None, int]:
    """The whole records of a sample file, why anything was left out (None if nothing), and how many bytes."""
    view = memoryview(data).cast("B")
    count, damage, skipped = records_in(view[: HEADER.size], len(view), kind)
    return view[HEADER.size : HEADER.size + count * kind.record.size], damage, skipped


def records_in(header: bytes | memoryview, file_bytes: int, kind: Kind) -> tuple[int, str | None, int]:
    """How many whole records follow a sample file's `header` in its `file_bytes`, why anything was left
    out (None if nothing), and how many bytes: what a reader that streams the file needs to know first."""
    if len(header) < HEADER.size:
        return 0, "truncated header", file_bytes
    magic, version, size = HEADER.unpack_from(header)
    if magic != MAGIC or version != VERSION or size != kind.record.size:
        return 0, f"not a plexmq {kind.name} sample file (v{VERSION})", file_bytes
    count = (file_bytes - HEADER.size) // size
    tail = file_bytes - HEADER.size - count * size
    return count, "truncated last record" if tail else None, tail
