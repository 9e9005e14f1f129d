"""`plexmq pipeline compact`: the archive's sealed segments decoded once into a lake of Parquet tables
partitioned by hour, so that a report over the last hour or day (`plexmq pipeline traffic --lake`)
reads that hour or day, not everything archived since the beginning. Run it as often as reports need
(cron, a systemd timer): each run reads only the segments sealed since the last one.

Tables (Parquet, under LAKE, each partitioned `date=YYYY-MM-DD/hour=H` by receive time, UTC):
- messages/: traffic's messages/ columns, one row per message, every tenant's (`tenant`; "" for the
  default tenant, also in rows compacted before the archive had tenants).
- minutes/, topics/, clients/: traffic's roll-ups per hour and tenant (clients/ without `silent_s`,
  which belongs to a report's window). Distinct counts and percentiles are the hour's own: not additive
  over hours.

Bookkeeping, beside them:
- _commits/BATCH.json: the commit log, one entry per run that found new segments: the archive, each
  segment read with its account (records, damage), the hours it added messages to, and whether their
  roll-ups are done. The segments it lists are the checkpoint: they are never read again.
- _staging/BATCH/: a batch's messages while Spark writes them (and BATCH.decoded/, its segments decoded,
  before); _lock: held by the running compact.

Why exactly once: a batch's messages count only once its commit entry exists, and the entry appears by
an atomic rename. A run first finishes what a killed one left: staging without an entry is deleted (its
segments are read again, as they are not in the log); an entry whose staging remains has its files
moved into messages/ (one rename per file, so a repeat moves what is left); an entry not marked rolled
up has the roll-ups of its hours recomputed from messages/ (dynamic partition overwrite: those hours
are replaced, the others kept), which also takes in a segment that arrived late in an hour already
compacted. A report that runs during those renames may see part of a batch; the next report sees all.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import signal
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from datetime import UTC, date, datetime, timedelta
from functools import reduce
from pathlib import Path

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import from_arrow_schema
from pyspark.sql.types import DateType, IntegerType

from plexmq.pipeline import traffic
from plexmq.pipeline.archive_source import SCHEMA, read_segments, sealed_segments, selected
from plexmq.pipeline.inputs import BadInput, FileAccount

HOUR = ("date", "hour")
MESSAGES = from_arrow_schema(SCHEMA).add("date", DateType()).add("hour", IntegerType())
ROLLUPS = {"minutes": traffic.minutes, "topics": traffic.topics, "clients": traffic.clients}
COMMITS, STAGING, LOCK = "_commits", "_staging", "_lock"
# For the tests: the step after which the process kills itself, as a crash would (staged, committed, moved).
CRASH_AFTER = "PLEXMQ_LAKE_CRASH_AFTER"


@dataclass(frozen=True)
class Segment:
    """A compacted segment as the commit log keeps it: its path relative to the archive, and its account."""

    path: str
    bytes: int
    records: int
    damage: str | None
    skipped_bytes: int


@dataclass(frozen=True)
class Batch:
    """One commit log entry."""

    id: str
    archive: str
    segments: list[Segment]
    hours: list[tuple[str, int]]  # (date, hour) partitions of messages/ it added to
    rolled_up: bool

    @classmethod
    def load(cls, path: Path) -> Batch:
        """The entry in a `_commits/*.json` file (JSON has lists for the hours' tuples)."""
        entry = json.loads(path.read_text())
        return cls(entry["id"], entry["archive"], [Segment(**s) for s in entry["segments"]],
                   [(d, h) for d, h in entry["hours"]], entry["rolled_up"])

    def accounts(self) -> list[FileAccount]:
        """Its segments as a report's Input section lists them, damage included."""
        return [FileAccount(f"{self.archive.rstrip('/')}/{s.path}", s.bytes, s.records, s.damage, s.skipped_bytes)
                for s in self.segments]


def compact(spark: SparkSession, archive: str, lake: str, progress: Callable[[str], None]) -> None:
    """Add the segments sealed in `archive` since the last run to `lake`, after finishing what an
    interrupted run left."""
    root = Path(lake)
    root.mkdir(parents=True, exist_ok=True)
    with _locked(root):
        _recover(spark, root, progress)
        done = {s.path for batch in batches(root) for s in batch.segments}
        sealed = sealed_segments(archive)
        new = [(path, size) for path, size in sealed if path not in done]
        progress(f"{len(new)} new segments in {archive} ({len(sealed) - len(new)} compacted before)")
        if not new:
            return
        batch_id = datetime.now(UTC).strftime("%Y%m%dT%H%M%S%fZ")
        staging = root / STAGING / batch_id
        with read_segments(spark, archive, new, str(root / STAGING / f"{batch_id}.decoded")) as (records, accounts):
            for account in accounts:
                if account.damage is not None:
                    progress(f"damaged segment {account.path}: skipped {account.damage}")
            progress(f"writing {sum(a.records for a in accounts):,} records to {staging}/")
            (records.withColumn("date", F.to_date("recv_time")).withColumn("hour", F.hour("recv_time"))
             .write.partitionBy(*HOUR).parquet(str(staging)))
        _crash_point("staged")
        prefix = archive.rstrip("/") + "/"
        segments = [Segment(a.path.removeprefix(prefix), a.bytes, a.records, a.damage, a.skipped_bytes)
                    for a in accounts]
        batch = Batch(batch_id, archive, segments, _staged_hours(staging), rolled_up=False)
        _write_entry(root, batch)
        _crash_point("committed")
        _finish(spark, root, batch, progress)


@contextmanager
def read_lake(
    spark: SparkSession, lake: str, since: datetime | None, until: datetime | None, tenant: str | None
) -> Iterator[tuple[DataFrame, list[FileAccount]]]:
    """A lake's messages of `tenant` (None: of every tenant) received in [since, until), in traffic's
    messages/ columns, read from the hour partitions that overlap the window only, and the accounts of
    that tenant's segments compacted into them."""
    if not (Path(lake) / "messages").is_dir():
        raise BadInput(f"no compacted messages in {lake} (plexmq pipeline compact --archive ... --lake {lake})")
    messages = _messages(spark, Path(lake)).where(_hours_between(since, until))
    if tenant is not None:
        messages = messages.where(F.col("tenant") == tenant)
    if since is not None:
        messages = messages.where(F.col("recv_time") >= since)
    if until is not None:
        messages = messages.where(F.col("recv_time") < until)
    accounts = [a for batch in batches(Path(lake)) for s, a in zip(batch.segments, batch.accounts())
                if selected(s.path, since, until, tenant)]
    yield messages.drop(*HOUR), sorted(accounts, key=lambda a: a.path)


def write_lake(
    spark: SparkSession, lake: str, since: datetime | None, until: datetime | None, tenant: str | None, out: str
) -> list[FileAccount]:
    """traffic's source from a lake: the window's messages of `tenant` (None: of every tenant) copied to
    `out` (messages/ of its report, as from an archive) from the hour partitions that overlap it; the
    accounts of their segments."""
    with read_lake(spark, lake, since, until, tenant) as (messages, accounts):
        messages.write.mode("overwrite").parquet(out)
    return accounts


def batches(root: Path) -> list[Batch]:
    """The commit log, oldest first."""
    return [Batch.load(path) for path in sorted((root / COMMITS).glob("*.json"))]


@contextmanager
def _locked(root: Path) -> Iterator[None]:
    """One compact at a time per lake (a cron run that overlaps the previous one stops with one line)."""
    with open(root / LOCK, "a") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise BadInput(f"another compact holds {root / LOCK}") from None
        yield


def _recover(spark: SparkSession, root: Path, progress: Callable[[str], None]) -> None:
    """Finish the committed batches an interrupted run left, and drop the uncommitted ones' staging and
    what an interrupted roll-up left of Spark's own (hidden: readers skip it)."""
    committed = batches(root)
    for batch in committed:
        if not batch.rolled_up:
            progress(f"finishing batch {batch.id}, interrupted after its commit")
            _finish(spark, root, batch, progress)
    ids = {batch.id for batch in committed}
    for staging in sorted((root / STAGING).glob("*")):
        if staging.name not in ids:
            progress(f"dropping batch {staging.name}, interrupted before its commit")
            shutil.rmtree(staging)
    for name in ROLLUPS:
        for leftover in [*(root / name).glob(".spark-staging-*"), *(root / name).glob("_temporary")]:
            shutil.rmtree(leftover)


def _finish(spark: SparkSession, root: Path, batch: Batch, progress: Callable[[str], None]) -> None:
    """Move a committed batch's staged files into messages/, roll its hours up, and say so in the log."""
    staging = root / STAGING / batch.id
    if staging.exists():
        for date_hour in batch.hours:
            source = staging / _partition(*date_hour)
            target = root / "messages" / _partition(*date_hour)
            target.mkdir(parents=True, exist_ok=True)
            for file in source.glob("*.parquet"):
                os.rename(file, target / f"{batch.id}-{file.name}")
        _crash_point("moved")
        shutil.rmtree(staging)
    if batch.hours:
        progress(f"rolling up {len(batch.hours)} hours: {', '.join(f'{d} {h:02d}h' for d, h in batch.hours)}")
        messages = _messages(spark, root).where(_hours_in(batch.hours))
        for name, rollup in ROLLUPS.items():
            (rollup(messages, *HOUR, "tenant").write.mode("overwrite").option("partitionOverwriteMode", "dynamic")
             .partitionBy(*HOUR).parquet(str(root / name)))
    _write_entry(root, Batch(batch.id, batch.archive, batch.segments, batch.hours, rolled_up=True))
    progress(f"committed batch {batch.id}: {len(batch.segments)} segments, "
             f"{sum(s.records for s in batch.segments):,} records")


def _messages(spark: SparkSession, root: Path) -> DataFrame:
    """The lake's messages/, whose rows compacted before the archive had tenants are the default tenant's."""
    messages = spark.read.schema(MESSAGES).parquet(str(root / "messages"))
    return messages.withColumn("tenant", F.coalesce("tenant", F.lit("")))


def _write_entry(root: Path, batch: Batch) -> None:
    """Write (or replace) a batch's commit log entry atomically and durably."""
    (root / COMMITS).mkdir(exist_ok=True)
    final = root / COMMITS / f"{batch.id}.json"
    partial = final.with_suffix(".tmp")
    with open(partial, "w") as f:
        json.dump(asdict(batch), f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    os.replace(partial, final)
    directory = os.open(root / COMMITS, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


def _staged_hours(staging: Path) -> list[tuple[str, int]]:
    """The (date, hour) partitions Spark wrote under a batch's staging directory."""
    found = (p.relative_to(staging).parts for p in staging.glob("date=*/hour=*"))
    return sorted((d.removeprefix("date="), int(h.removeprefix("hour="))) for d, h in found)


def _partition(day: str, hour: int) -> str:
    return f"date={day}/hour={hour}"


def _hours_in(hours: list[tuple[str, int]]) -> Column:
    """Partition filter: the given hours (grouped per date, so the expression stays shallow)."""
    per_date: dict[str, list[int]] = {}
    for day, hour in hours:
        per_date.setdefault(day, []).append(hour)
    return reduce(lambda a, b: a | b, ((F.col("date") == F.lit(date.fromisoformat(d))) & F.col("hour").isin(hs)
                                       for d, hs in per_date.items()))


def _hours_between(since: datetime | None, until: datetime | None) -> Column:
    """Partition filter: the hours that overlap [since, until), as hours since the epoch (pruning
    needs a predicate on the partition columns alone)."""
    index = F.unix_date("date") * 24 + F.col("hour")
    condition = F.lit(True)
    if since is not None:
        condition &= index >= (since - _EPOCH) // timedelta(hours=1)
    if until is not None:
        condition &= index < -((_EPOCH - until) // timedelta(hours=1))  # the hour of `until`, rounded up
    return condition


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def _crash_point(step: str) -> None:
    if os.environ.get(CRASH_AFTER) == step:
        os.kill(os.getpid(), signal.SIGKILL)
