"""`plexmq pipeline bench`: throughput, latency percentiles over time and per-process load of a benchmark.

Tables (Parquet, under OUT), each present when the benchmark wrote that kind of sample:
- throughput/: second, sent, received (every writer's counts of that second added up).
- latency/: second (in which the messages were sent), samples, p50, p90, p99, max (microseconds).
- load/: second, role, processes, cpu_percent, rss_bytes (a role's processes added up).

Percentiles are exact: Spark's `percentile`, linear interpolation between the closest ranks (NumPy's
default method).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from pyspark.sql import DataFrame, Row, SparkSession
from pyspark.sql import functions as F

from plexmq.pipeline import report
from plexmq.pipeline.samples_source import read_samples
from plexmq.pipeline.tables import save

PERCENTILES = [0.5, 0.9, 0.99]
OVERALL_PERCENTILES = [0.5, 0.9, 0.99, 0.999]


def run(spark: SparkSession, samples: str, out: str, progress: Callable[[str], None]) -> None:
    """Write the tables and report.html under `out` from the samples under `samples`."""
    progress(f"reading the samples {samples}")
    with read_samples(spark, samples, f"{out}/.samples") as (frames, accounts):
        progress(f"decoded {len(accounts)} files, {sum(a.records for a in accounts):,} samples")
        tables = {}
        if "rates" in frames:
            tables["throughput"] = _throughput(frames["rates"])
        if "latency" in frames:
            tables["latency"] = _latency(frames["latency"])
        if "processes" in frames:
            tables["load"] = _load(frames["processes"])
        saved = save(spark, tables, out, progress)
        progress("writing the report")
        rows = {name: table.orderBy("second").collect() for name, table in saved.items()}
        start = min((table[0].second for table in rows.values() if table), default=0)
        sections = []
        if "throughput" in rows:
            sections.append(("Throughput", _throughput_section(rows["throughput"], start)))
        if "latency" in rows:
            sections.append(("Latency", _latency_section(frames["latency"], rows["latency"], start)))
        if "load" in rows:
            sections.append(("Broker processes", _load_section(rows["load"], start)))
        sections.append(("Input", report.files_section(accounts, "sample files")))
    Path(out).mkdir(parents=True, exist_ok=True)
    report.write(Path(out) / "report.html", "plexmq benchmark report", sections)


def _throughput(rates: DataFrame) -> DataFrame:
    return rates.groupBy("second").agg(F.sum("sent").alias("sent"), F.sum("received").alias("received"))


def _latency(latency: DataFrame) -> DataFrame:
    return (
        latency.groupBy(F.expr("send_us div 1000000").alias("second"))
        .agg(
            F.count("*").alias("samples"),
            F.percentile("latency_us", PERCENTILES).alias("p"),
            F.max("latency_us").alias("max"),
        )
        .select(
            "second",
            "samples",
            *(F.col("p")[i].alias(f"p{round(q * 100)}") for i, q in enumerate(PERCENTILES)),
            "max",
        )
    )


def _load(processes: DataFrame) -> DataFrame:
    return processes.groupBy("second", "role").agg(
        F.countDistinct("pid").alias("processes"),
        F.sum("cpu_percent").alias("cpu_percent"),
        F.sum("rss_bytes").alias("rss_bytes"),
    )


def _throughput_section(rows: list[Row], start: int) -> str:
    fig = report.figure()
    ax = fig.subplots()
    seconds = [r.second - start for r in rows]
    ax.plot(seconds, [r.sent for r in rows], label="sent")
    ax.plot(seconds, [r.received for r in rows], label="received")
    ax.set_xlabel("seconds since start")
    ax.set_ylabel("messages / second")
    ax.legend()
    sent, received = sum(r.sent for r in rows), sum(r.received for r in rows)
    seconds_seen = max(len(rows), 1)
    summary = [len(rows), sent, received, sent / seconds_seen, received / seconds_seen]
    summary.append(max((r.received for r in rows), default=0))
    header = ["seconds", "sent", "received", "mean sent/s", "mean received/s", "peak received/s"]
    return report.image(fig) + report.table(header, [summary])


def _latency_section(samples: DataFrame, rows: list[Row], start: int) -> str:
    fig = report.figure(height=4)
    ax = fig.subplots()
    seconds = [r.second - start for r in rows]
    for column in ("p50", "p90", "p99", "max"):
        ax.plot(seconds, [r[column] for r in rows], label=column)
    ax.set_yscale("log")
    ax.set_xlabel("seconds since start (send time)")
    ax.set_ylabel("latency (µs)")
    ax.legend()
    overall = samples.agg(
        F.count("*"), F.percentile("latency_us", OVERALL_PERCENTILES), F.max("latency_us"), F.avg("latency_us")
    ).first()
    assert overall is not None
    count, percentiles, maximum, mean = overall
    header = ["samples", "p50 (µs)", "p90", "p99", "p99.9", "max", "mean"]
    return report.image(fig) + report.table(header, [[count, *(percentiles or []), maximum, mean]])


def _load_section(rows: list[Row], start: int) -> str:
    fig = report.figure(height=5)
    ax_cpu, ax_rss = fig.subplots(2, 1, sharex=True)
    summary = []
    for role in sorted({r.role for r in rows}):
        mine = [r for r in rows if r.role == role]
        seconds = [r.second - start for r in mine]
        ax_cpu.plot(seconds, [r.cpu_percent for r in mine], label=role)
        ax_rss.plot(seconds, [r.rss_bytes / 2**20 for r in mine], label=role)
        cpu = [r.cpu_percent for r in mine]
        summary.append([role, sum(cpu) / len(cpu), max(cpu), max(r.rss_bytes for r in mine) / 2**20])
    ax_cpu.set_ylabel("CPU % (100 = a core)")
    ax_rss.set_ylabel("RSS (MiB)")
    ax_rss.set_xlabel("seconds since start")
    ax_cpu.legend(fontsize="small", ncol=4)
    return report.image(fig) + report.table(["role", "mean CPU %", "peak CPU %", "peak RSS (MiB)"], summary)
