"""`plexmq pipeline fields`: the numeric fields of the JSON telemetry on chosen topics, per device and minute.

The payloads of the messages on `--topics` are parsed as JSON objects with one schema: `--schema` (Spark
DDL, e.g. `temp double, battery struct<level: int>`) or, without it, the schema Spark infers from a
sample of up to `SAMPLE` JSON objects among them (where a field's type differs within the sample, Spark
infers a string, which is not rolled up: give `--schema` for such traffic). Every numeric field, nested
ones included (`battery.level`), is rolled up.

Tables (Parquet, under OUT):
- fields/: topic, client_id, minute, field, count, min, max, mean, p50, p99: one row per numeric field
  present in the minute's messages of that client on that topic. The percentiles are Spark's
  `percentile_approx` (exact at these sizes: the smallest value with at least that share at or below it).
- topics/: per topic: messages, parsed (JSON objects of the schema), not_json (not a JSON object: other
  JSON values, malformed text, binary), breaking (JSON objects whose fields do not fit the schema).
- flagged/: up to `KEPT` of each topic's not-JSON and schema-breaking messages, the earliest: topic,
  problem, recv_time, client_id, payload_prefix (the first `PREFIX` bytes as text).

Times are UTC.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import cast

from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql.types import DataType, NumericType, StringType, StructField, StructType

from plexmq.pipeline import report
from plexmq.pipeline.archive_source import read_payloads
from plexmq.pipeline.inputs import BadInput
from plexmq.pipeline.tables import save

SAMPLE = 1000
KEPT = 5
PREFIX = 80
_CORRUPT = "_corrupt_record"  # where from_json puts a message that does not fit the schema


def run(
    spark: SparkSession,
    archive: str,
    out: str,
    filters: list[str],
    ddl: str | None,
    progress: Callable[[str], None],
) -> None:
    """Write the tables and report.html under `out` for the messages on topics matching `filters`."""
    progress(f"reading the payloads on {' '.join(filters)} in {archive}")
    with read_payloads(spark, archive, filters, f"{out}/.payloads") as (messages, accounts):
        text = messages.withColumn("text", F.col("payload").cast("string")).drop("payload")
        schema = _schema(spark, text, ddl)
        numeric = list(_numeric(schema))
        progress(f"schema {schema.simpleString()}; numeric fields: {', '.join(numeric) or 'none'}")
        checked = _check(text, schema)
        tables = {"fields": _fields(checked, numeric), "topics": _topics(checked), "flagged": _flagged(checked)}
        saved = save(spark, tables, out, progress)
    progress("writing the report")
    sections = [
        ("Messages per topic", report.table(["topic", "messages", "parsed", "not JSON", "breaking the schema"],
                                            saved["topics"].orderBy("topic").collect())),
        ("Schema", report.note(schema.simpleString())),
        *((f"Field {field}", _plot(saved["fields"], field)) for field in numeric),
        ("Not JSON or breaking the schema (the first few per topic)", _samples(saved["flagged"])),
        ("Input", report.files_section(accounts, "segments")),
    ]
    Path(out).mkdir(parents=True, exist_ok=True)
    report.write(Path(out) / "report.html", f"plexmq fields report: {' '.join(filters)}", sections)


def _schema(spark: SparkSession, text: DataFrame, ddl: str | None) -> StructType:
    """The user's schema, or one inferred from a sample of the JSON objects (BadInput when none)."""
    if ddl is not None:
        try:
            return cast(StructType, StructType.fromDDL(ddl))  # a list of fields parses as a struct
        except Exception as e:  # Spark's parse errors have no common public type
            raise BadInput(f"--schema {ddl!r}: {str(e).splitlines()[0]}") from e
    sample = text.where(F.ltrim("text").startswith("{")).select("text").limit(SAMPLE)
    inferred = spark.read.option("mode", "DROPMALFORMED").json(sample).schema  # a row each, no Python worker
    if not inferred.fields:
        raise BadInput("no JSON objects on these topics to infer a schema from (give --schema)")
    return inferred


def _numeric(schema: StructType, prefix: str = "") -> Iterator[str]:
    """The dotted paths of the numeric fields, nested structs included (arrays are not rolled up)."""
    for field in schema.fields:
        kind: DataType = field.dataType
        if isinstance(kind, NumericType):
            yield prefix + field.name
        elif isinstance(kind, StructType):
            yield from _numeric(kind, f"{prefix}{field.name}.")


def _check(text: DataFrame, schema: StructType) -> DataFrame:
    """The messages with `json` (the parsed struct) and `problem` (null, 'not JSON' or 'breaks the
    schema'). A JSON object parses as a map whatever its fields; one the schema cannot hold is left
    by from_json in the corrupt-record column."""
    with_corrupt = StructType([*schema.fields, StructField(_CORRUPT, StringType())])
    parsed = F.from_json("text", with_corrupt, {"columnNameOfCorruptRecord": _CORRUPT})
    problem = (F.when(F.from_json("text", "map<string,string>").isNull(), "not JSON")
               .when(F.col(f"json.{_CORRUPT}").isNotNull(), "breaks the schema"))
    return text.withColumn("json", parsed).withColumn("problem", problem)


def _fields(checked: DataFrame, numeric: list[str]) -> DataFrame:
    """The roll-up, one row per (topic, client, minute, field) with values."""
    points = [F.struct(F.lit(f).alias("field"), _value(f).alias("value")) for f in numeric]
    values = F.array(*points) if points else F.array().cast("array<struct<field:string,value:double>>")
    point = F.explode(values).alias("point")
    quantiles = F.percentile_approx("value", [0.5, 0.99])
    return (
        checked.where(F.col("problem").isNull())
        .select("topic", "client_id", F.window("recv_time", "1 minute")["start"].alias("minute"), point)
        .select("topic", "client_id", "minute", "point.*")
        .where(F.col("value").isNotNull())
        .groupBy("topic", "client_id", "minute", "field")
        .agg(F.count("value").alias("count"), F.min("value").alias("min"), F.max("value").alias("max"),
             F.avg("value").alias("mean"), quantiles.alias("q"))
        .select("*", F.col("q")[0].alias("p50"), F.col("q")[1].alias("p99"))
        .drop("q")
    )


def _value(field: str) -> Column:
    return F.col("json." + ".".join(f"`{part}`" for part in field.split("."))).cast("double")


def _topics(checked: DataFrame) -> DataFrame:
    def count(problem: Column) -> Column:
        return F.sum(F.when(problem, 1).otherwise(0))

    return checked.groupBy("topic").agg(
        F.count("*").alias("messages"),
        count(F.col("problem").isNull()).alias("parsed"),
        count(F.col("problem") == "not JSON").alias("not_json"),
        count(F.col("problem") == "breaks the schema").alias("breaking"),
    )


def _flagged(checked: DataFrame) -> DataFrame:
    first = Window.partitionBy("topic", "problem").orderBy("recv_time", "client_id")
    return (
        checked.where(F.col("problem").isNotNull())
        .withColumn("n", F.row_number().over(first))
        .where(F.col("n") <= KEPT)
        .select("topic", "problem", "recv_time", "client_id", F.substring("text", 1, PREFIX).alias("payload_prefix"))
    )


def _plot(fields: DataFrame, field: str) -> str:
    """The field's mean per minute, a line per topic and client, with its min-max band."""
    rows = (fields.where(F.col("field") == field)
            .select("topic", "client_id", F.unix_micros("minute").alias("minute"), "min", "max", "mean", "count")
            .orderBy("topic", "client_id", "minute").collect())
    keys = sorted({(r.topic, r.client_id) for r in rows})
    # the legend goes below the plot, in 4 columns: the figure grows by its rows, the plot keeps its height
    fig = report.figure(height=3.2 + 0.2 * -(-len(keys) // 4))
    ax = fig.subplots()
    for key in keys:
        series = [r for r in rows if (r.topic, r.client_id) == key]
        times = [report.utc(r.minute) for r in series]
        line, = ax.plot(times, [r.mean for r in series], marker=".", label=f"{key[0]} {key[1]}")  # type: ignore[arg-type]  # datetimes: date units
        ax.fill_between(times, [r.min for r in series], [r.max for r in series],  # type: ignore[arg-type]  # as above
                        alpha=0.2, color=line.get_color())
    ax.set_ylabel(f"{field} (mean, min-max)")
    ax.set_xlabel("minute (UTC)")
    if rows:
        fig.legend(loc="outside lower center", ncols=4, fontsize="small")
    total = sum(r["count"] for r in rows)
    return report.image(fig) + report.note(f"{field}: {total:,} values")


def _samples(flagged: DataFrame) -> str:
    rows = flagged.select("topic", "problem", report.text_time("recv_time"), "client_id", "payload_prefix")
    shown = rows.orderBy("topic", "problem", "recv_time").collect()
    if not shown:
        return report.note("none")
    return report.table(["topic", "problem", "received", "client id", "payload (first bytes)"], shown)
