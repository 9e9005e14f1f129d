"""The PySpark jobs in local mode, over inputs whose answers are known exactly. One SparkSession for all."""

from __future__ import annotations

import os
import random
import shutil
import struct
import subprocess
import sys
import sysconfig
from collections import Counter, defaultdict
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import pytest
from paho.mqtt.client import MQTTv5
from pyspark.sql import SparkSession

from plexmq.archive_format import VERSION, Record, encode_chunk, segment_header
from plexmq.bench.samples import LATENCY, PROCESSES, RATES, SampleWriter
from plexmq.pipeline.__main__ import main
from plexmq.pipeline.inputs import IN_DRIVER_BYTES
from plexmq.workers.archive import ArchiveWriter
from tests.archives import START, archive, at, publish_properties, tenants_archive, us
from tests.conftest import ROOT, Broker
from tests.mqtt import Client


def test_traffic_counts_bytes_and_silent_devices_exactly(spark: SparkSession, tmp_path: Path) -> None:
    since, until = START + timedelta(minutes=10), START + timedelta(minutes=90)
    everything = archive(tmp_path / "archive")
    window = [r for _, r in everything if us(since) <= r.recv_us < us(until)]
    out = tmp_path / "out"
    argv = ["traffic", "--archive", str(tmp_path / "archive"), "--out", str(out), "--silence", "10m"]
    assert main(argv + ["--since", since.isoformat(), "--until", "2024-05-01T01:30"]) == 0

    topics = {r.topic: r for r in spark.read.parquet(str(out / "topics")).collect()}
    expected_topics = Counter(r.topic for r in window)
    assert {t: row.messages for t, row in topics.items()} == expected_topics
    for topic in expected_topics:
        sizes = [len(r.payload) for r in window if r.topic == topic]
        row = topics[topic]
        assert row.bytes == sum(sizes) and row.size_max == max(sizes)
        assert row.size_p50 == pytest.approx(np.percentile(sizes, 50), rel=1e-12)
    alerts = [r for r in window if r.topic == "alerts"]
    assert topics["alerts"].qos2 == topics["alerts"].retained == len(alerts) > 0 == topics["alerts"].qos0

    clients = {r.client_id: r for r in spark.read.parquet(str(out / "clients")).collect()}
    expected_bytes: defaultdict[str, int] = defaultdict(int)
    for r in window:
        expected_bytes[r.client_id] += len(r.payload)
    assert {c: row.bytes for c, row in clients.items()} == expected_bytes
    assert {c: row.messages for c, row in clients.items()} == Counter(r.client_id for r in window)
    assert clients["dev-b"].topics == 2

    silent = {r.client_id: r.silent_s for r in spark.read.parquet(str(out / "silent")).collect()}
    assert silent == {"dev-b": 49.5 * 60, "dev-e": 58 * 60}  # dev-c: exactly 10 min, not longer

    minutes = spark.read.parquet(str(out / "minutes"))
    total = minutes.groupBy().sum("messages").first()
    assert total is not None and total[0] == len(window)
    (row,) = minutes.where("topic = 'sensors/b/hum' AND minute = '2024-05-01 00:20:00'").collect()
    assert (row.client_id, row.messages, row.bytes) == ("dev-b", 1, 7)

    messages = spark.read.parquet(str(out / "messages")).collect()
    assert sorted((m.client_id, m.topic, m.payload_size, m.protocol_level) for m in messages) == sorted(
        (r.client_id, r.topic, len(r.payload), r.level or None) for r in window)
    dev_f = sorted((m.recv_time, m) for m in messages if m.client_id == "dev-f")
    assert [(m.content_type, m.user_properties) for _, m in dev_f] == [
        (r.content_type, list(r.user_properties or ())) for r in window if r.client_id == "dev-f"]
    assert {(m.content_type, m.user_properties) for m in messages if m.client_id != "dev-f"} == {(None, None)}

    page = (out / "report.html").read_text()
    assert page.count('<img src="data:image/png;base64,') == 5
    assert "truncated chunk" in page
    assert "<td>text/plain</td><td>5</td>" in page and "<td>unit</td><td>5</td>" in page
    assert "<td>not recorded (format 2 segments)</td><td>1</td>" in page


def test_traffic_runs_in_a_driver_smaller_than_the_archive(spark: SparkSession, tmp_path: Path) -> None:
    """An archive of 1.2 GB through a 512 MB driver (Spark's least; embedded, the driver is the only
    executor): each task streams its segment chunk by chunk into messages/ (Parquet, by row groups).
    Reading whole segments into the JVM (binaryFile) ran out of heap here. Few large payloads make
    the archive big and quick to write; the job needs only their sizes."""
    payload = b"p" * (1 << 20)
    for worker in range(2):  # one 600 MB segment each
        writer = ArchiveWriter(str(tmp_path / "archive"), worker, ["#"], 1 << 40, 3600.0)
        for i in range(600):
            writer.append("", Record(at(i / 60), f"big/{i % 3}", 0, False, payload, f"dev-{worker}", None).run())
            writer.flush()
        writer.close()
    out = tmp_path / "out"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYSPARK_")}
    done = subprocess.run([sys.executable, "-m", "plexmq.pipeline", "traffic", "--archive", str(tmp_path / "archive"),
                           "--out", str(out), "--master", "local[2]", "--driver-memory", "512m",
                           "--conf", "spark.sql.shuffle.partitions=2"],
                          check=False, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    topics = {r.topic: (r.messages, r.bytes) for r in spark.read.parquet(str(out / "topics")).collect()}
    assert topics == {f"big/{t}": (400, 400 << 20) for t in range(3)}


def test_a_damaged_chunk_is_reported_where_it_is_and_the_rest_is_counted(
        spark: SparkSession, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A bit flipped in the middle of a segment costs that chunk's records only; the log and the report
    name the segment and the byte where the damage starts."""
    runs = [[Record(at(i), "t", 0, False, b"x" * (i + 1), "dev", None)] * 10 for i in range(3)]
    chunks = [b"".join(encode_chunk([r.run() for r in records])) for records in runs]
    data = bytearray(segment_header(0) + b"".join(chunks))
    damaged_at = len(segment_header(0) + chunks[0])
    data[damaged_at + len(chunks[1]) - 1] ^= 1  # the second chunk's last payload byte
    segment = tmp_path / "archive/date=2024-05-01/hour=00/w0-1.seg"
    segment.parent.mkdir(parents=True)
    segment.write_bytes(bytes(data))
    out = tmp_path / "out"
    assert main(["traffic", "--archive", str(tmp_path / "archive"), "--out", str(out)]) == 0

    (row,) = spark.read.parquet(str(out / "topics")).collect()
    assert (row.messages, row.bytes) == (20, 10 * 1 + 10 * 3)
    damage = f"damaged chunk at byte {damaged_at} ({len(chunks[1])} bytes)"
    assert f"damaged segment {segment}: skipped {damage}" in capsys.readouterr().err
    page = (out / "report.html").read_text()
    assert f"<td>{segment}</td><td>{damage}</td><td>20</td><td>{len(chunks[1])}</td>" in page


def test_a_segment_of_an_unknown_version_stops_the_job_with_one_line(
        spark: SparkSession, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A newer broker's segment: no report that looks complete without it, one line naming it."""
    record = Record(at(0), "t", 0, False, b"x", "dev", None)
    hour = tmp_path / "archive/date=2024-05-01/hour=00"
    hour.mkdir(parents=True)
    (hour / "w0-1.seg").write_bytes(segment_header(0) + b"".join(encode_chunk([record.run()])))
    (hour / "w1-1.seg").write_bytes(struct.pack("<4sII", b"PXAR", VERSION + 1, 1) + b"new chunks")
    assert main(["traffic", "--archive", str(tmp_path / "archive"), "--out", str(tmp_path / "out")]) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if not line.startswith("[")]  # not progress
    expected = f"{hour / 'w1-1.seg'}: segment format version {VERSION + 1}; this plexmq reads versions 2 and 3"
    assert errors == [f"plexmq pipeline traffic: {expected}"]


def samples(root: Path) -> tuple[list[tuple[int, ...]], dict[int, tuple[int, int]]]:
    """Latency samples over 5 seconds from two subscribers (plus a file with a torn last record),
    rates from two writers, and broker process samples. Returns the latency rows and the rates."""
    rng = random.Random(5)
    t0 = us(START) // 1_000_000
    rows: list[tuple[int, ...]] = []
    for sub in range(3):
        with SampleWriter(root, LATENCY, f"run-p{sub}") as w:
            for seq in range(1500 if sub < 2 else 10):
                send = (t0 + rng.randrange(5)) * 1_000_000 + rng.randrange(1_000_000)
                latency = int(rng.lognormvariate(6, 1))
                rows.append((send, send + latency, latency, seq % 4, seq, sub))
                w.add(*rows[-1])
    with open(w.path, "ab") as f:
        f.write(b"torn!!!")
    rates: dict[int, tuple[int, int]] = {}
    for name in ("controller", "agent"):
        with SampleWriter(root, RATES, name) as w:
            for s in range(5):
                sent, received = rng.randrange(10_000), rng.randrange(10_000)
                w.add(t0 + s, sent, received)
                old = rates.get(t0 + s, (0, 0))
                rates[t0 + s] = (old[0] + sent, old[1] + received)
    with SampleWriter(root, PROCESSES, "monitor") as w:
        for s in range(5):
            w.add(t0 + s, 100, b"router", 90.0, 50 << 20)
            w.add(t0 + s, 101, b"worker-0", 60.0 + s, 40 << 20)
        w.add(t0 + 4, 102, b"worker-0", 5.0, 30 << 20)  # a restarted worker-0 alongside
    return rows, rates


def test_bench_throughput_load_and_percentiles_match_numpy(spark: SparkSession, tmp_path: Path) -> None:
    rows, rates = samples(tmp_path / "samples")
    out = tmp_path / "out"
    assert main(["bench", "--samples", str(tmp_path / "samples"), "--out", str(out)]) == 0

    by_second: defaultdict[int, list[int]] = defaultdict(list)
    for send, _, latency, *_ in rows:
        by_second[send // 1_000_000].append(latency)
    latency_table = {r.second: r for r in spark.read.parquet(str(out / "latency")).collect()}
    assert latency_table.keys() == by_second.keys()
    for second, values in by_second.items():
        row = latency_table[second]
        # both exact, linear interpolation between closest ranks: equal but for float rounding
        expected = np.percentile(values, [50, 90, 99], method="linear")
        assert [row.p50, row.p90, row.p99] == pytest.approx(expected, rel=1e-12)
        assert (row.samples, row.max) == (len(values), max(values))

    throughput = {r.second: (r.sent, r.received) for r in spark.read.parquet(str(out / "throughput")).collect()}
    assert throughput == rates

    load = {(r.second - us(START) // 1_000_000, r.role): r for r in spark.read.parquet(str(out / "load")).collect()}
    assert (load[4, "worker-0"].processes, load[4, "worker-0"].cpu_percent) == (2, 69.0)
    assert (load[0, "router"].rss_bytes, len(load)) == (50 << 20, 10)

    page = (out / "report.html").read_text()
    assert page.count('<img src="data:image/png;base64,') == 3
    assert "truncated last record" in page


@pytest.mark.parametrize(
    "argv, message",
    [
        (["traffic", "--archive", "{tmp}/missing"], "cannot read {tmp}/missing"),
        (["traffic", "--archive", "{tmp}"], "no segments under {tmp}"),
        (["bench", "--samples", "{tmp}"], "no .smp sample files under {tmp}"),
    ],
)
def test_bad_input_is_one_line_and_exit_code_2(
    spark: SparkSession, tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    (tmp_path / "_writing").mkdir()  # a broker that has sealed nothing yet
    args = [a.format(tmp=tmp_path) for a in argv] + ["--out", str(tmp_path / "out")]
    assert main(args) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if not line.startswith("[")]  # not progress
    assert len(errors) == 1 and errors[0].startswith(f"plexmq pipeline {argv[0]}: " + message.format(tmp=tmp_path))


def test_traffic_of_a_real_broker_with_the_archive_on(
        spark: SparkSession, tmp_path: Path, start_broker: Callable[..., Broker]) -> None:
    """paho clients (3.1.1 and 5.0) publish through two workers; after a clean stop the job counts exactly
    what was sent, and messages/ has the 5.0 messages' user properties and content type."""
    config = tmp_path / "plexmq.toml"
    config.write_text(f'[archive]\nenabled = true\ndir = "{tmp_path / "archive"}"\ntopics = ["sensors/#", "alerts"]\n')
    b = start_broker("--workers", "2", "--config", str(config))
    quiet = Client(b.port, "dev-quiet", username="quinn")
    for size in (3, 5, 8):
        quiet.publish("sensors/quiet/temp", b"q" * size, qos=1)
    quiet_done = datetime.now(UTC)  # every later record was received after this
    sent: list[tuple[str, str, int, int, bool]] = []  # (client, topic, size, qos, retain)
    a, c = Client(b.port, "dev-a", username="alice"), Client(b.port, "dev-c")
    for i in range(200):  # QoS 0 runs take the worker's raw path, some with packets the filters leave out
        a.publish("sensors/a/temp", b"%d" % i)
        sent.append(("dev-a", "sensors/a/temp", len(b"%d" % i), 0, False))
        if i % 10 == 0:
            a.publish("other/skipped", b"s")
    a.publish("sensors/a/hum", b"h" * 40, qos=1)  # its PUBACK follows every QoS 0 message before it
    sent.append(("dev-a", "sensors/a/hum", 40, 1, False))
    for i in range(20):
        c.publish("alerts", bytes(range(i)) * 3, qos=2, retain=True)
        sent.append(("dev-c", "alerts", 3 * i, 2, True))
    c.publish("other/not-archived", b"x", qos=1)
    c5 = Client(b.port, "dev-5", protocol=MQTTv5)
    pairs = [("unit", "°C"), ("batch", "7"), ("unit", "K")]
    c5.publish("sensors/5/temp", b"\xa1\x01\x02", qos=0, properties=publish_properties("application/cbor", pairs))
    c5.publish("sensors/5/temp", b"bare", qos=1)  # its PUBACK follows the QoS 0 message
    sent += [("dev-5", "sensors/5/temp", 3, 0, False), ("dev-5", "sensors/5/temp", 4, 1, False)]
    end = datetime.now(UTC)
    for client in (quiet, a, c, c5):
        client.disconnect()
    b.stop()
    sent += [("dev-quiet", "sensors/quiet/temp", size, 1, False) for size in (3, 5, 8)]

    out = tmp_path / "out"
    silence = f"{(end - quiet_done).total_seconds():.6f}s"
    assert main(["traffic", "--archive", str(tmp_path / "archive"), "--out", str(out),
                 "--until", end.isoformat(), "--silence", silence]) == 0
    topics = {r.topic: r for r in spark.read.parquet(str(out / "topics")).collect()}
    assert {t: (r.messages, r.bytes) for t, r in topics.items()} == {
        t: (sum(1 for s in sent if s[1] == t), sum(s[2] for s in sent if s[1] == t)) for t in {s[1] for s in sent}}
    assert (topics["alerts"].qos2, topics["alerts"].retained, topics["sensors/a/temp"].qos0) == (20, 20, 200)
    clients = {r.client_id: (r.messages, r.bytes) for r in spark.read.parquet(str(out / "clients")).collect()}
    assert clients == {cid: (sum(1 for s in sent if s[0] == cid), sum(s[2] for s in sent if s[0] == cid))
                       for cid in {s[0] for s in sent}}
    assert [r.client_id for r in spark.read.parquet(str(out / "silent")).collect()] == ["dev-quiet"]
    messages = spark.read.parquet(str(out / "messages"))
    assert sorted((r.payload_size, r.protocol_level, r.content_type, r.user_properties)
                  for r in messages.where("client_id = 'dev-5'").collect()) == [
        (3, 5, "application/cbor", pairs), (4, 5, None, [])]
    others = messages.where("client_id != 'dev-5'").select("protocol_level", "content_type", "user_properties")
    assert {tuple(r) for r in others.distinct().collect()} == {(4, None, None)}


def test_plexmq_run_by_its_path_uses_its_own_python_for_spark(spark: SparkSession, tmp_path: Path) -> None:
    """`venv/bin/plexmq pipeline ...` as a systemd unit or cron starts it: PATH without the
    environment's bin/, whose `python3` (here a decoy that fails) Spark must not use. The archive is
    larger than what local mode decodes in the driver, so Spark's Python workers decode it."""
    script = Path(sysconfig.get_path("scripts")) / "plexmq"
    assert script.exists(), f"{script}: plexmq is not installed (pip install .)"
    decoy = tmp_path / "decoy-bin"
    decoy.mkdir()
    (decoy / "python3").write_text("#!/bin/sh\necho 'decoy python3 from PATH' >&2\nexit 1\n")
    (decoy / "python3").chmod(0o755)
    java = shutil.which("java")
    assert java is not None
    path = os.pathsep.join((str(decoy), os.path.dirname(os.path.realpath(java)), "/usr/bin", "/bin"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYSPARK_")}
    env.update(PATH=path, PYTHONPATH=str(ROOT))  # this checkout's code, through the installed script
    writer = ArchiveWriter(str(tmp_path / "archive"), 0, ["#"], 1 << 40, 3600.0)
    for i in range((IN_DRIVER_BYTES >> 20) + 2):
        writer.append("", Record(at(i / 60), f"big/{i % 3}", 0, False, b"p" * (1 << 20), "dev", None).run())
        writer.flush()
    writer.close()
    out = tmp_path / "out"
    done = subprocess.run([str(script), "pipeline", "traffic", "--archive", str(tmp_path / "archive"),
                           "--out", str(out)], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert (out / "report.html").exists()
    assert {r.topic for r in spark.read.parquet(str(out / "topics")).collect()} == {f"big/{t}" for t in range(3)}


def test_traffic_reports_one_tenant_or_every_tenant_with_a_tenant_column(
        spark: SparkSession, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--tenant NAME reads that tenant's tree alone; '' is the default tenant; without --tenant every
    tenant's messages carry their tenant, and a topic or client id in two tenants is two rows."""
    sent = tenants_archive(tmp_path / "archive")

    def traffic(name: str, *tenant: str) -> Path:
        out = tmp_path / name
        assert main(["traffic", "--archive", str(tmp_path / "archive"), "--out", str(out), *tenant]) == 0
        return out

    def messages(out: Path) -> list[tuple[str, str, str, int]]:
        rows = spark.read.parquet(str(out / "messages")).collect()
        return sorted((m.tenant, m.topic, m.client_id, m.payload_size) for m in rows)

    def expected(*tenants: str) -> list[tuple[str, str, str, int]]:
        return sorted((t, r.topic, r.client_id, len(r.payload)) for t, r in sent if t in tenants)

    acme = traffic("acme", "--tenant", "acme")
    assert messages(acme) == expected("acme")
    assert {(r.tenant, r.topic, r.messages) for r in spark.read.parquet(str(acme / "topics")).collect()} == {
        ("acme", "s/temp", 10), ("acme", "s/hum", 10)}
    assert "plexmq traffic report of tenant acme</h1>" in (acme / "report.html").read_text()

    default = traffic("default", "--tenant", "")
    assert messages(default) == expected("")

    every = traffic("every")
    assert messages(every) == expected("", "acme", "beta")
    topics = {(r.tenant, r.topic): r.bytes for r in spark.read.parquet(str(every / "topics")).collect()}
    assert topics == {("", "s/temp"): 10, ("acme", "s/temp"): 100, ("acme", "s/hum"): 200, ("beta", "b/only"): 50}
    clients = {(r.tenant, r.client_id): r.messages for r in spark.read.parquet(str(every / "clients")).collect()}
    assert clients == {("", "dev-1"): 10, ("acme", "dev-1"): 10, ("acme", "dev-2"): 10, ("beta", "dev-9"): 10}
    minutes = spark.read.parquet(str(every / "minutes")).where("client_id = 'dev-1'").collect()
    assert Counter(r.tenant for r in minutes) == {"": 10, "acme": 10}
    page = (every / "report.html").read_text()
    assert "<h2>Tenants</h2>" in page and "<td>(default)</td><td>10</td><td>10</td><td>1</td><td>1</td>" in page
    assert "<td>acme</td><td>20</td><td>300</td><td>2</td><td>2</td>" in page

    capsys.readouterr()
    assert main(["traffic", "--archive", str(tmp_path / "archive"), "--out", str(tmp_path / "x"), "--tenant", "gamma"]) == 2
    assert "no segments of tenant gamma under " in capsys.readouterr().err
