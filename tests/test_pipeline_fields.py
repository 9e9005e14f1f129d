"""`plexmq pipeline fields` in local mode over an archive whose roll-ups are known exactly."""

from __future__ import annotations

import json
import math
from collections import defaultdict
from pathlib import Path

import pytest
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from plexmq.archive_format import Record
from plexmq.pipeline.__main__ import main
from plexmq.workers.archive import ArchiveWriter
from tests.archives import at

SCHEMA = "temp double, battery struct<level: int>, watts long"


def telemetry() -> tuple[list[Record], list[Record]]:
    """JSON telemetry from two devices on two topics over three minutes, with not-JSON and
    schema-breaking messages among it (the first list, worker 0), and a binary topic and a JSON one that
    the job is not asked for (the second, worker 1)."""
    asked = []
    for i in range(9):  # every 20 s
        for n, device in enumerate(("dev-a", "dev-b")):
            env = {"temp": 20 + n * 5 + i * 0.5 + (i % 3), "battery": {"level": 90 - i - n}}
            asked.append(Record(at(i / 3), "tele/env", 0, False, json.dumps(env).encode(), device, None))
            power = {"watts": 100 * (n + 1) + i * i}
            asked.append(Record(at(i / 3 + 0.1), "tele/power", 1, False, json.dumps(power).encode(), device, None))
    asked += [
        Record(at(0.5), "tele/env", 0, False, b"hello", "dev-a", None),
        Record(at(1.5), "tele/env", 0, False, b"[1, 2]", "dev-b", None),
        Record(at(2.5), "tele/power", 0, False, bytes([0, 255, 123]), "dev-a", None),
        Record(at(1.2), "tele/env", 0, False, b'{"temp": "hot"}', "dev-b", None),
        Record(at(2.2), "tele/power", 0, False, b'{"watts": {"now": 5}}', "dev-a", None),
    ]
    other = [Record(at(i), "cam/jpeg", 0, False, bytes(range(256)), "dev-a", None) for i in range(3)]
    other.append(Record(at(1), "tele/env/raw", 0, False, b'{"temp": 1000}', "dev-a", None))
    return asked, other


def write(root: Path, workers: list[list[Record]]) -> None:
    for worker, records in enumerate(workers):
        writer = ArchiveWriter(str(root), worker, ["#"], 4096, 60.0)
        for r in records:
            writer.append("", r.run())
            writer.flush()
        writer.close()


def rank(values: list[float], share: float) -> float:
    """percentile_approx's answer at these sizes: the smallest value with `share` of them at or below."""
    return sorted(values)[math.ceil(share * len(values)) - 1]


def test_fields_rolls_up_json_telemetry_and_flags_the_rest(spark: SparkSession, tmp_path: Path) -> None:
    asked, other = telemetry()
    write(tmp_path / "archive", [asked, other])
    out = tmp_path / "out"
    argv = ["fields", "--archive", str(tmp_path / "archive"), "--out", str(out), "--topics", "tele/+", "nothing/#"]
    assert main(argv + ["--schema", SCHEMA]) == 0

    expected: defaultdict[tuple[str, str, int, str], list[float]] = defaultdict(list)
    for r in asked:
        try:
            values = json.loads(r.payload)
        except ValueError:
            continue
        if not isinstance(values, dict) or not all(isinstance(v, (int, float, dict)) for v in values.values()):
            continue
        flat = {"temp": values.get("temp"), "battery.level": values.get("battery", {}).get("level"),
                "watts": values.get("watts")}
        if isinstance(flat["watts"], dict):
            continue
        minute = r.recv_us - r.recv_us % 60_000_000
        for field, value in flat.items():
            if value is not None:
                expected[(r.topic, r.client_id, minute, field)].append(value)
    rows = spark.read.parquet(str(out / "fields")).withColumn("minute", F.unix_micros("minute")).collect()
    got = {(r.topic, r.client_id, r.minute, r.field): (r["count"], r.min, r.max, r.mean, r.p50, r.p99)
           for r in rows}
    assert got == {key: (len(v), min(v), max(v), pytest.approx(sum(v) / len(v), rel=1e-12), rank(v, 0.5),
                         rank(v, 0.99)) for key, v in expected.items()}
    assert len(got) == 2 * 3 * 3  # (2 env fields + watts) x 2 devices x 3 minutes: nothing from cam/ or raw

    topics = {r.topic: (r.messages, r.parsed, r.not_json, r.breaking)
              for r in spark.read.parquet(str(out / "topics")).collect()}
    assert topics == {"tele/env": (21, 18, 2, 1), "tele/power": (20, 18, 1, 1)}
    flagged = spark.read.parquet(str(out / "flagged")).withColumn("recv_time", F.unix_micros("recv_time")).collect()
    assert sorted((f.topic, f.problem, f.client_id, f.recv_time, f.payload_prefix) for f in flagged) == [
        ("tele/env", "breaks the schema", "dev-b", at(1.2), '{"temp": "hot"}'),
        ("tele/env", "not JSON", "dev-a", at(0.5), "hello"),
        ("tele/env", "not JSON", "dev-b", at(1.5), "[1, 2]"),
        ("tele/power", "breaks the schema", "dev-a", at(2.2), '{"watts": {"now": 5}}'),
        ("tele/power", "not JSON", "dev-a", at(2.5), bytes([0, 255, 123]).decode("utf-8", "replace")),
    ]

    page = (out / "report.html").read_text()
    assert page.count('<img src="data:image/png;base64,') == 3
    for field in ("temp", "battery.level", "watts"):
        assert f"<h2>Field {field}</h2>" in page

    # Without --schema, the sample's "hot" makes temp a string, which is not rolled up.
    assert main(argv[:4] + [str(tmp_path / "inferred")] + argv[5:]) == 0
    inferred = spark.read.parquet(str(tmp_path / "inferred" / "fields")).select("field").distinct().collect()
    assert {r.field for r in inferred} == {"battery.level"}
