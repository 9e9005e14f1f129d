"""`plexmq pipeline traffic`: which topics and devices are busy, which went silent, how big the messages are.

The report covers one tenant (`--tenant NAME`; `--tenant ''` for the default tenant) or every tenant
(no `--tenant`). Tenants never share a topic or a client id: the roll-ups are per tenant, and a
topic or client id in two tenants is two rows.

Tables (Parquet, under OUT):
- messages/: one row per message, the archive's columns without the payload: recv_time, topic, qos,
  retain, payload_size, client_id, username, worker_id, protocol_level (3: MQTT 3.1, 4: 3.1.1, 5: 5.0;
  null for segments of format 2), content_type (5.0; null when none), user_properties
  (array<struct<key, value>> in the order sent, repeated keys kept; null for 3.1/3.1.1, [] for a 5.0
  message without any) and tenant ("" for the default tenant). The other tables are roll-ups of it.
- minutes/: tenant, minute, topic, client_id, messages, bytes (payload bytes): the finest grain, for
  roll-ups.
- topics/: per tenant and topic: messages, bytes, distinct clients, QoS 0/1/2 and retained counts,
  first and last seen, payload size p50/p90/p99/max.
- clients/: per tenant and client id: messages, bytes, distinct topics, first and last seen, seconds
  silent at the end of the window.
- silent/: the clients silent for longer than `--silence` at the end of the window (`--until`, or the
  last record received), as in clients/.

Percentiles are exact: Spark's `percentile`, linear interpolation between the closest ranks (NumPy's
default method). Times are UTC.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import from_arrow_schema

from plexmq.pipeline import report
from plexmq.pipeline.archive_source import SCHEMA, of_tenant, window, write_archive
from plexmq.pipeline.inputs import BadInput, FileAccount
from plexmq.pipeline.tables import save

PERCENTILES = [0.5, 0.9, 0.99]

# Writes a source's messages of a tenant (None: of every tenant) received in [since, until) as Parquet
# (`SCHEMA`) under the given path, and returns the account of the segments they come from.
Writer = Callable[[SparkSession, str, datetime | None, datetime | None, str | None, str], list[FileAccount]]


def run(
    spark: SparkSession,
    archive: str,
    out: str,
    since: datetime | None,
    until: datetime | None,
    silence_s: float,
    top: int,
    progress: Callable[[str], None],
    tenant: str | None = None,
    write: Writer = write_archive,
) -> None:
    """Write the tables and report.html under `out` for the records of `tenant` (None: of every tenant)
    received in [since, until) in `archive`, whose messages `write` puts in messages/ (the archive's
    segments: `write_archive`, or a lake's Parquet: `lake.write_lake`).

    Why messages/ first: writing it is the one pass over the segments (decoding, the costly part; the
    executors write it with pyarrow), and every roll-up and report query then reads only the Parquet
    columns it needs from it, instead of each reading a persisted copy of every decoded record."""
    progress(f"reading {archive}{of_tenant(tenant)}, writing messages/")
    accounts = write(spark, archive, since, until, tenant, f"{out}/messages")
    # A task per messages/ file (a decoding task's records, up to inputs.TASK_BYTES of segments), not
    # several files packed into one as Spark does by default: a task with more records sorts and spills
    # more than a small driver holds (50M messages in 2 tasks ran 512 MB out of heap).
    spark.conf.set("spark.sql.files.openCostInBytes", spark.conf.get("spark.sql.files.maxPartitionBytes") or "128MB")
    messages = spark.read.schema(from_arrow_schema(SCHEMA)).parquet(f"{out}/messages")
    saved = {"messages": messages}
    progress(f"decoded {len(accounts)} segments, {sum(a.records for a in accounts):,} records")
    for account in accounts:
        if account.damage is not None:
            progress(f"damaged segment {account.path}: skipped {account.damage}")
    saved |= save(spark, {"topics": topics(messages, "tenant")}, out, progress)
    totals = _totals(saved["topics"], messages)
    if totals["messages"] == 0:
        damaged = sum(a.damage is not None for a in accounts)
        raise BadInput(f"no records{of_tenant(tenant)} in {archive}{window(since, until)} ({damaged} damaged segments)")
    start = since or report.utc(totals["first_us"])
    end = until or report.utc(totals["last_us"])
    saved |= save(spark, {"minutes": minutes(messages, "tenant"),
                          "clients": clients(messages, "tenant").withColumn("silent_s", _silent_s(end))},
                  out, progress)
    saved |= save(spark, {"silent": saved["clients"].where(F.col("silent_s") > silence_s)}, out, progress)
    progress("writing the report")
    named = [] if tenant is not None else ["tenant"]  # the key columns of the ranked tables
    sections = [
        ("Summary", _summary(totals, start, end, tenant)),
        *([] if tenant is not None else [("Tenants", _tenants(saved["topics"], saved["clients"]))]),
        ("Traffic per minute", _per_minute(saved["minutes"])),
        (f"Top {top} topics", _top(saved["topics"], [*named, "topic"], top)),
        (f"Top {top} clients", _top(saved["clients"], [*named, "client_id"], top)),
        ("QoS and retain", _qos(totals)),
        ("Payload sizes", _sizes(messages, totals)),
        ("MQTT versions and 5.0 properties", _properties(messages, top)),
        (f"Devices silent for more than {silence_s:g} s at the end", _silent(saved["silent"], named, top)),
        ("Input", report.files_section(accounts, "segments")),
    ]
    Path(out).mkdir(parents=True, exist_ok=True)
    report.write(Path(out) / "report.html", f"plexmq traffic report{of_tenant(tenant)}", sections)


def _count_if(condition: Column) -> Column:
    return F.sum(F.when(condition, 1).otherwise(0))


def _totals(topics: DataFrame, messages: DataFrame) -> dict[str, Any]:
    """The window's figures: sums over topics/ (a row per topic), but for the distinct clients and the
    percentiles of all payload sizes, which need the messages (two columns of them)."""
    row = topics.agg(
        F.coalesce(F.sum("messages"), F.lit(0)).alias("messages"),
        F.sum("bytes").alias("bytes"),
        F.count("*").alias("topics"),
        F.unix_micros(F.min("first_seen")).alias("first_us"),
        F.unix_micros(F.max("last_seen")).alias("last_us"),
        *(F.sum(f"qos{q}").alias(f"qos{q}") for q in range(3)),
        F.sum("retained").alias("retained"),
        F.max("size_max").alias("size_max"),
    ).first()
    everything = messages.agg(
        F.countDistinct("tenant", "client_id").alias("clients"),
        F.percentile("payload_size", PERCENTILES).alias("size_percentiles"),
    ).first()
    assert row is not None and everything is not None
    return row.asDict() | everything.asDict()


def minutes(records: DataFrame, *by: str) -> DataFrame:
    """Messages and bytes per minute, topic and client (within the `by` columns' groups)."""
    return records.groupBy(*by, F.date_trunc("minute", "recv_time").alias("minute"), "topic", "client_id").agg(
        F.count("*").alias("messages"), F.sum("payload_size").alias("bytes")
    )


def topics(records: DataFrame, *by: str) -> DataFrame:
    """topics/'s columns per topic (within the `by` columns' groups)."""
    sizes = F.percentile("payload_size", PERCENTILES)
    return (
        records.groupBy(*by, "topic")
        .agg(
            F.count("*").alias("messages"),
            F.sum("payload_size").alias("bytes"),
            F.countDistinct("tenant", "client_id").alias("clients"),
            *(_count_if(F.col("qos") == q).alias(f"qos{q}") for q in range(3)),
            _count_if(F.col("retain")).alias("retained"),
            F.min("recv_time").alias("first_seen"),
            F.max("recv_time").alias("last_seen"),
            sizes.alias("sizes"),
            F.max("payload_size").alias("size_max"),
        )
        .select("*", *(F.col("sizes")[i].alias(f"size_p{round(p * 100)}") for i, p in enumerate(PERCENTILES)))
        .drop("sizes")
    )


def clients(records: DataFrame, *by: str) -> DataFrame:
    """clients/'s columns per client id (within the `by` columns' groups), but for `silent_s`."""
    return (
        records.groupBy(*by, "client_id")
        .agg(
            F.count("*").alias("messages"),
            F.sum("payload_size").alias("bytes"),
            F.countDistinct("topic").alias("topics"),
            F.min("recv_time").alias("first_seen"),
            F.max("recv_time").alias("last_seen"),
        )
    )


def _silent_s(end: datetime) -> Column:
    return (F.unix_micros(F.lit(end)) - F.unix_micros("last_seen")) / 1e6


def _summary(totals: dict[str, Any], start: datetime, end: datetime, tenant: str | None) -> str:
    rows = [
        ["tenant", "every tenant" if tenant is None else report.tenant(tenant)],
        ["window (UTC)", f"{start:%Y-%m-%d %H:%M:%S} to {end:%Y-%m-%d %H:%M:%S}"],
        ["messages", totals["messages"]],
        ["payload bytes", totals["bytes"]],
        ["topics", totals["topics"]],
        ["clients", totals["clients"]],
    ]
    return report.table(["", ""], rows)


def _tenants(topics: DataFrame, clients: DataFrame) -> str:
    """Each tenant's share: messages, payload bytes, topics and clients."""
    per_topic = topics.groupBy("tenant").agg(F.sum("messages").alias("messages"), F.sum("bytes").alias("bytes"),
                                             F.count("*").alias("topics"))
    per_client = clients.groupBy("tenant").agg(F.count("*").alias("clients"))
    rows = per_topic.join(per_client, "tenant").orderBy(F.desc("messages"), "tenant").collect()
    return report.table(["tenant", "messages", "payload bytes", "topics", "clients"],
                        [[report.tenant(r.tenant), r.messages, r.bytes, r.topics, r.clients] for r in rows])


def _per_minute(minutes: DataFrame) -> str:
    rows = (
        minutes.groupBy(F.unix_seconds("minute").alias("minute"))
        .agg(F.sum("messages").alias("messages"), F.sum("bytes").alias("bytes"))
        .orderBy("minute")
        .collect()
    )
    fig = report.figure(height=5)
    ax_messages, ax_bytes = fig.subplots(2, 1, sharex=True)
    times = [report.utc(r.minute * 1_000_000) for r in rows]
    ax_messages.plot(times, [r.messages for r in rows], marker=".")
    ax_messages.set_ylabel("messages / minute")
    ax_bytes.plot(times, [r.bytes for r in rows], marker=".", color="tab:orange")
    ax_bytes.set_ylabel("payload bytes / minute")
    ax_bytes.set_xlabel("minute (UTC)")
    return report.image(fig)


def _top(table: DataFrame, keys: list[str], top: int) -> str:
    """The `top` rows by messages, named by their `keys` (the tenant's shown by name, as in `report.tenant`)."""
    rows = (
        table.orderBy(F.desc("messages"), *keys)
        .limit(top)
        .select(*keys, "messages", "bytes", *(report.text_time(c) for c in ("first_seen", "last_seen")))
        .collect()
    )
    shown = [[*_named(r, keys), *r[len(keys):]] for r in rows]
    fig = report.figure(height=max(2.0, 0.3 * len(rows) + 1))
    ax = fig.subplots()
    ax.barh([" ".join(r[:len(keys)]) for r in reversed(shown)], [r.messages for r in reversed(rows)])
    ax.set_xlabel("messages")
    return report.image(fig) + report.table([*keys, "messages", "bytes", "first seen", "last seen"], shown)


def _named(row: Any, keys: list[str]) -> list[str]:
    """A row's key values for reading: the tenant by `report.tenant`."""
    return [report.tenant(row[k]) if k == "tenant" else row[k] for k in keys]


def _qos(totals: dict[str, Any]) -> str:
    labels = ["QoS 0", "QoS 1", "QoS 2", "retained"]
    counts = [totals["qos0"], totals["qos1"], totals["qos2"], totals["retained"]]
    fig = report.figure(width=6, height=2.5)
    ax = fig.subplots()
    ax.bar(labels, counts)
    ax.set_ylabel("messages")
    return report.image(fig) + report.table(labels, [counts])


def _sizes(records: DataFrame, totals: dict[str, Any]) -> str:
    # bucket k > 0 holds sizes in [2^(k-1), 2^k): the bit length, exact (no floating-point log)
    bucket = F.when(F.col("payload_size") == 0, 0).otherwise(F.length(F.bin("payload_size")))
    rows = records.groupBy(bucket.alias("bucket")).count().orderBy("bucket").collect()
    fig = report.figure(height=3)
    ax = fig.subplots()
    ax.bar(["0" if r.bucket == 0 else f"<{2 ** r.bucket}" for r in rows], [r["count"] for r in rows])
    ax.set_xlabel("payload bytes")
    ax.set_ylabel("messages")
    sizes = [*totals["size_percentiles"], totals["size_max"]]
    return report.image(fig) + report.table(["p50", "p90", "p99", "max"], [sizes])


LEVELS = {3: "MQTT 3.1", 4: "MQTT 3.1.1", 5: "MQTT 5.0", None: "not recorded (format 2 segments)"}


def _properties(records: DataFrame, top: int) -> str:
    """Messages per publisher version, and the content types and user property keys 5.0 messages carry."""
    levels = records.groupBy("protocol_level").count().orderBy("protocol_level").collect()
    shown = report.table(["publisher", "messages"], [[LEVELS[r.protocol_level], r["count"]] for r in levels])
    content_types = (records.groupBy("content_type").count().where(F.col("content_type").isNotNull())
                     .orderBy(F.desc("count"), "content_type").limit(top).collect())
    if content_types:
        shown += report.table(["content type", "messages"], content_types)
    keys = (records.select(F.explode(F.array_distinct("user_properties.key")).alias("key")).groupBy("key").count()
            .orderBy(F.desc("count"), "key").limit(top).collect())
    if keys:
        shown += report.table(["user property", "messages"], keys)
    return shown


def _silent(silent: DataFrame, named: list[str], top: int) -> str:
    """The silent devices, longest silent first; `named`: ["tenant"] when the report covers several."""
    rows = silent.select(*named, "client_id", report.text_time("last_seen"), "silent_s", "messages").collect()
    if not rows:
        return report.note("none")
    rows.sort(key=lambda r: (-r.silent_s, *_named(r, named), r.client_id))
    shown = report.table([*named, "client id", "last seen", "silent (s)", "messages"],
                         [[*_named(r, named), *r[len(named):]] for r in rows[: 10 * top]])
    return shown if len(rows) <= 10 * top else shown + report.note(f"{len(rows)} devices in all: see silent/")
