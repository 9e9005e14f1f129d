"""`plexmq pipeline compact` and `traffic --lake`: the archive compacted once, incrementally and exactly
once, into Parquet partitioned by hour; reports over the lake read only their hours."""

from __future__ import annotations

import fcntl
import os
import shutil
import signal
import struct
import subprocess
import sys
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from plexmq.archive_format import VERSION, Record, encode_chunk, segment_header
from plexmq.pipeline.__main__ import main
from plexmq.pipeline.archive_source import sealed_segments
from plexmq.pipeline.lake import CRASH_AFTER, ROLLUPS, STAGING, batches
from plexmq.workers.archive import ArchiveWriter
from tests.archives import START, archive, at, tenants_archive, us
from tests.conftest import ROOT, Broker
from tests.mqtt import Client

TABLES = ["messages", *ROLLUPS]


def compact(archive_dir: Path, lake: Path) -> int:
    return main(["compact", "--archive", str(archive_dir), "--lake", str(lake)])


def rows(spark: SparkSession, lake: Path) -> dict[str, list[tuple[object, ...]]]:
    """Every table of a lake as sorted rows (user properties as text: lists of structs do not sort)."""
    tables = {}
    for name in TABLES:
        table = spark.read.parquet(str(lake / name))
        tables[name] = sorted((tuple(str(v) if isinstance(v, list) else v for v in row) for row in table.collect()),
                              key=repr)
    return tables


def files(lake: Path) -> dict[str, tuple[int, int]]:
    """Every file of a lake with its size and modification time."""
    return {str(p.relative_to(lake)): (p.stat().st_size, p.stat().st_mtime_ns) for p in lake.rglob("*") if p.is_file()}


@pytest.fixture(scope="module")
def uninterrupted(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """`archive` written once and compacted by a run that nobody interrupts: (archive, lake)."""
    root = tmp_path_factory.mktemp("uninterrupted")
    archive(root / "archive")
    assert compact(root / "archive", root / "lake") == 0
    return root / "archive", root / "lake"


def publish(port: int, sent: list[tuple[str, str, int]], clients: dict[str, list[str]], count: int) -> None:
    """`count` QoS 0 messages per client on each of its topics, then one QoS 1 message (its PUBACK comes
    after the broker has every earlier message); `sent` gets (client, topic, size) for each."""
    for client_id, topics in clients.items():
        client = Client(port, client_id)
        for i in range(count):
            for topic in topics:
                client.publish(topic, b"v" * (i % 7))
                sent.append((client_id, topic, i % 7))
        client.publish(topics[0], b"last", qos=1)
        sent.append((client_id, topics[0], 4))
        client.disconnect()


def test_compact_reads_only_new_segments_and_equals_a_full_recompute(
        spark: SparkSession, tmp_path: Path, start_broker: Callable[..., Broker],
        capsys: pytest.CaptureFixture[str]) -> None:
    """A real broker archives, compact, the broker runs again (new segments, in hours already compacted)
    and compact again: the second run reads only the new segments, and the lake is what one compact of
    the whole archive gives. A third run with nothing new changes nothing."""
    archive_dir, lake = tmp_path / "archive", tmp_path / "lake"
    config = tmp_path / "plexmq.toml"
    config.write_text(f'[archive]\nenabled = true\ndir = "{archive_dir}"\n')
    sent: list[tuple[str, str, int]] = []
    broker = start_broker("--workers", "2", "--config", str(config))
    publish(broker.port, sent, {"dev-a": ["sensors/a/temp", "sensors/a/hum"], "dev-b": ["alerts"]}, 50)
    broker.stop()
    first = {path for path, _ in sealed_segments(str(archive_dir))}
    assert compact(archive_dir, lake) == 0

    broker = start_broker("--workers", "2", "--config", str(config))
    publish(broker.port, sent, {"dev-a": ["sensors/a/temp"], "dev-c": ["sensors/c/temp"]}, 30)
    broker.stop()
    capsys.readouterr()
    assert compact(archive_dir, lake) == 0
    everything = {path for path, _ in sealed_segments(str(archive_dir))}
    assert f"{len(everything - first)} new segments in {archive_dir} ({len(first)} compacted before)" in (
        capsys.readouterr().err)
    log = batches(lake)
    assert [{s.path for s in batch.segments} for batch in log] == [first, everything - first]
    assert all(batch.rolled_up for batch in log) and not any((lake / STAGING).iterdir())

    assert compact(archive_dir, tmp_path / "whole") == 0
    incremental = rows(spark, lake)
    assert incremental == rows(spark, tmp_path / "whole")
    topics = spark.read.parquet(str(lake / "topics")).groupBy("topic").sum("messages", "bytes").collect()
    assert {r.topic: (r["sum(messages)"], r["sum(bytes)"]) for r in topics} == {
        t: (sum(1 for s in sent if s[1] == t), sum(s[2] for s in sent if s[1] == t)) for t in {s[1] for s in sent}}
    assert len(incremental["messages"]) == len(sent)

    before = files(lake)
    assert compact(archive_dir, lake) == 0
    assert "0 new segments" in capsys.readouterr().err
    assert files(lake) == before


def test_traffic_over_one_hour_of_the_lake_reads_only_that_hour(
        spark: SparkSession, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Compacted over three hours (one damaged segment, one of format 2), then a segment sealed late in
    the first hour of the day compacted: `traffic --lake` over that hour gives what `traffic --archive`
    does, with the other hours' files made unreadable."""
    archive_dir, lake = tmp_path / "archive", tmp_path / "lake"
    archive(archive_dir)
    assert compact(archive_dir, lake) == 0
    assert "damaged segment " in capsys.readouterr().err
    late = ArchiveWriter(str(archive_dir), 5, ["#"], 4096, 60.0)
    late.append("", Record(at(50), "sensors/late/temp", 1, False, b"late", "dev-late", None).run())
    late.close()
    assert compact(archive_dir, lake) == 0
    first, second = batches(lake)
    assert set(first.hours) == {("2024-04-30", 23), ("2024-05-01", 0), ("2024-05-01", 1)}
    assert [s.path for s in second.segments] == [p for p, _ in sealed_segments(str(archive_dir)) if "/w5-" in p]
    assert second.hours == [("2024-05-01", 0)]
    others = [p for p in (lake / "messages").rglob("*.parquet") if "date=2024-05-01/hour=0/" not in str(p)]
    assert others
    for other in others:
        other.write_bytes(b"not parquet")

    window = ["--since", START.isoformat(), "--until", (START + timedelta(hours=1)).isoformat(), "--silence", "10m"]
    assert main(["traffic", "--lake", str(lake), "--out", str(tmp_path / "from-lake"), *window]) == 0
    assert main(["traffic", "--archive", str(archive_dir), "--out", str(tmp_path / "from-archive"), *window]) == 0
    for table in ("messages", "minutes", "topics", "clients", "silent"):
        from_lake, from_archive = (spark.read.parquet(str(tmp_path / out / table)).collect()
                                   for out in ("from-lake", "from-archive"))
        assert sorted(map(repr, from_lake)) == sorted(map(repr, from_archive)), table
    assert "truncated chunk" in (tmp_path / "from-lake/report.html").read_text()


@pytest.mark.parametrize("step", ["staged", "committed", "moved"])
def test_a_compact_killed_half_way_then_run_again_gives_the_same_lake(
        spark: SparkSession, tmp_path: Path, uninterrupted: tuple[Path, Path], step: str) -> None:
    """The process is killed (SIGKILL, as a crash or an OOM killer would) after the Parquet files are
    written but before the commit, after the commit, or after the files are moved into messages/ but
    before the roll-ups; a run after it gives the rows of a run that was never interrupted, once."""
    archive_dir, lake = tmp_path / "archive", tmp_path / "lake"
    shutil.copytree(uninterrupted[0], archive_dir)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYSPARK_")} | {CRASH_AFTER: step}
    killed = subprocess.run([sys.executable, "-m", "plexmq.pipeline", "compact", "--archive", str(archive_dir),
                             "--lake", str(lake), "--master", "local[2]", "--conf", "spark.sql.shuffle.partitions=2"],
                            check=False, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    assert [batch.rolled_up for batch in batches(lake)] == ([] if step == "staged" else [False])
    assert len(list((lake / STAGING).iterdir())) == 1
    assert (lake / "messages").exists() == (step == "moved")
    assert not any((lake / name).exists() for name in ROLLUPS)

    assert compact(archive_dir, lake) == 0
    assert rows(spark, lake) == rows(spark, uninterrupted[1])
    (batch,) = batches(lake)
    assert batch.rolled_up and len(batch.segments) == len(sealed_segments(str(archive_dir)))
    assert not any((lake / STAGING).iterdir())


def test_a_segment_of_an_unknown_version_stops_compact_with_one_line(
        spark: SparkSession, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A newer broker's segment: nothing is committed, so the segments beside it are read once it can be."""
    record = Record(us(START), "t", 0, False, b"x", "dev", None)
    hour = tmp_path / "archive/date=2024-05-01/hour=00"
    hour.mkdir(parents=True)
    (hour / "w0-1.seg").write_bytes(segment_header(0) + b"".join(encode_chunk([record.run()])))
    (hour / "w1-1.seg").write_bytes(struct.pack("<4sII", b"PXAR", VERSION + 1, 1) + b"new chunks")
    assert compact(tmp_path / "archive", tmp_path / "lake") == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if not line.startswith("[")]  # not progress
    expected = f"{hour / 'w1-1.seg'}: segment format version {VERSION + 1}; this plexmq reads versions 2 and 3"
    assert errors == [f"plexmq pipeline compact: {expected}"]
    assert batches(tmp_path / "lake") == []


def test_a_second_compact_on_the_same_lake_stops_with_one_line(
        spark: SparkSession, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A cron run that starts while the previous one still runs leaves the lake to it."""
    lake = tmp_path / "lake"
    lake.mkdir()
    with open(lake / "_lock", "a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        assert compact(tmp_path / "archive", lake) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if not line.startswith("[")]
    assert errors == [f"plexmq pipeline compact: another compact holds {lake / '_lock'}"]


def test_the_lake_keeps_each_tenant_apart_and_traffic_reads_one_tenant_of_it(
        spark: SparkSession, tmp_path: Path) -> None:
    """Compacted from a two-tenant archive, the lake's messages and roll-ups carry the tenant, and
    `traffic --lake --tenant acme` gives what `traffic --archive --tenant acme` does."""
    archive_dir, lake = tmp_path / "archive", tmp_path / "lake"
    sent = tenants_archive(archive_dir)
    assert compact(archive_dir, lake) == 0
    stored = spark.read.parquet(str(lake / "messages")).collect()
    assert sorted((m.tenant, m.topic, m.client_id) for m in stored) == sorted((t, r.topic, r.client_id) for t, r in sent)
    topics = {(r.tenant, r.topic): r.messages for r in spark.read.parquet(str(lake / "topics")).collect()}
    assert topics == {("", "s/temp"): 10, ("acme", "s/temp"): 10, ("acme", "s/hum"): 10, ("beta", "b/only"): 10}

    for source in (["--lake", str(lake)], ["--archive", str(archive_dir)]):
        assert main(["traffic", *source, "--out", str(tmp_path / source[0]), "--tenant", "acme"]) == 0
    for table in ("messages", "minutes", "topics", "clients", "silent"):
        from_lake, from_archive = (spark.read.parquet(str(tmp_path / out / table)).collect()
                                   for out in ("--lake", "--archive"))
        assert sorted(map(repr, from_lake)) == sorted(map(repr, from_archive)), table
    assert {m.tenant for m in spark.read.parquet(str(tmp_path / "--lake" / "messages")).collect()} == {"acme"}
    inputs = [(tmp_path / out / "report.html").read_text().split("<h2>Input</h2>")[1] for out in ("--lake", "--archive")]
    assert inputs[0] == inputs[1] and "<td>2</td>" in inputs[0] and "<td>20</td><td>0</td><td>0</td>" in inputs[0]
