"""`plexmq pipeline` as a person at a terminal runs it: a line for each missing prerequisite, nothing but
the job's own progress on stderr, and Ctrl-C that leaves no report behind that looks complete."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import pytest

from plexmq.archive_format import Record
from plexmq.workers.archive import ArchiveWriter
from tests.archives import archive, at
from tests.cli import MODULE, one_error_line
from tests.conftest import ROOT, wait_for


def pipeline(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """`plexmq pipeline ARGS` run to its end."""
    return subprocess.run([*MODULE, "pipeline", *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)


def others(stderr: str, job: str) -> list[str]:
    """The lines of stderr that are not the job's progress (`[JOB  12.3s] ...`)."""
    return [line for line in stderr.splitlines() if not line.startswith(f"[{job} ")]


def telemetry(root: Path) -> None:
    """JSON telemetry from 20 devices on 2 topics over 3 minutes: a plot of 40 series for `fields`."""
    writer = ArchiveWriter(str(root), 0, ["#"], 1 << 20, 3600.0)
    for minute in range(3):
        for device in range(20):
            for topic in ("temp", "hum"):
                payload = json.dumps({"value": device + minute}).encode()
                writer.append("", Record(at(minute), f"tele/{topic}", 0, False, payload, f"dev-{device}", None).run())
    writer.close()


def test_without_pyspark_one_line_says_what_to_install(tmp_path: Path) -> None:
    """A Python where `import pyspark` fails as it does when PySpark is not installed: a package of that
    name first on the path that raises what Python raises for a missing module."""
    shadow = tmp_path / "shadow" / "pyspark"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ModuleNotFoundError(\"No module named 'pyspark'\", name='pyspark')\n")
    env = os.environ | {"PYTHONPATH": str(shadow.parent)}
    line = one_error_line(pipeline("traffic", "--archive", str(tmp_path), "--out", str(tmp_path / "out"), env=env))
    assert line.startswith("plexmq pipeline: PySpark cannot be imported (No module named 'pyspark')"), line
    assert line.endswith(": pip install 'plexmq[pipeline]'"), line


def _old_java(home: Path) -> dict[str, str]:
    """JAVA_HOME at a Java 11: a `release` file as the JDK has, and a bin/java."""
    (home / "bin").mkdir(parents=True)
    (home / "bin" / "java").write_text("#!/bin/sh\nexit 1\n")
    (home / "bin" / "java").chmod(0o755)
    (home / "release").write_text('IMPLEMENTOR="Eclipse Adoptium"\nJAVA_VERSION="11.0.22"\n')
    return {"JAVA_HOME": str(home)}


@pytest.mark.parametrize("case", ["JAVA_HOME without java", "no java anywhere", "Java 11"])
def test_without_a_usable_java_one_line_says_how_to_get_one(tmp_path: Path, case: str) -> None:
    env = {k: v for k, v in os.environ.items() if k != "JAVA_HOME"}
    if case == "JAVA_HOME without java":
        env["JAVA_HOME"] = str(tmp_path / "no-jdk")
        expected = f"JAVA_HOME is {tmp_path / 'no-jdk'}, which has no bin/java: "
    elif case == "no java anywhere":
        (tmp_path / "empty-bin").mkdir()
        env["PATH"] = str(tmp_path / "empty-bin")
        expected = "no Java: JAVA_HOME is not set and there is no java on PATH: "
    else:
        env |= _old_java(tmp_path / "jdk-11")
        expected = f"{tmp_path / 'jdk-11' / 'bin' / 'java'} is Java 11; Spark needs 17 or newer: "
    line = one_error_line(pipeline("traffic", "--archive", str(tmp_path), "--out", str(tmp_path / "out"), env=env))
    assert line.startswith(f"plexmq pipeline: {expected}"), line
    assert "install Java 17 or newer" in line


def test_a_run_prints_its_progress_and_nothing_else(tmp_path: Path) -> None:
    """No warnings (pandas', the JDK's, Matplotlib's), no Spark progress bars or logs, no `//` in paths
    when --out ends in a slash, for `traffic` and for `fields` with a plot of 40 series."""
    archive(tmp_path / "archive")
    done = pipeline("traffic", "--archive", str(tmp_path / "archive"), "--out", f"{tmp_path / 'report'}/")
    assert done.returncode == 0, done.stderr
    assert others(done.stderr, "traffic") == []
    assert "//" not in done.stderr and f"done: {tmp_path / 'report' / 'report.html'}" in done.stderr
    assert [p.name for p in (tmp_path / "report").iterdir() if p.name.startswith(".")] == []

    telemetry(tmp_path / "telemetry")
    done = pipeline("fields", "--archive", str(tmp_path / "telemetry"), "--out", str(tmp_path / "fields"),
                    "--topics", "tele/#")
    assert done.returncode == 0, done.stderr
    assert others(done.stderr, "fields") == []
    assert (tmp_path / "fields" / "report.html").exists()


def test_ctrl_c_leaves_no_output_that_looks_complete_and_says_so_in_a_line(tmp_path: Path) -> None:
    """SIGINT once the job has written its first table (messages/, as Parquet): no report.html and no
    tables in --out afterwards, and one line besides the progress."""
    archive(tmp_path / "archive")
    out = tmp_path / "out"
    job = subprocess.Popen([*MODULE, "pipeline", "traffic", "--archive", str(tmp_path / "archive"), "--out", str(out)],
                           cwd=ROOT, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: out.exists() and any(out.rglob("messages/*.parquet")), 120, "messages/ written")
        job.send_signal(signal.SIGINT)
        _, stderr = job.communicate(timeout=120)
    finally:
        job.kill()
    assert job.returncode == 130, stderr
    assert others(stderr, "traffic") == [f"plexmq pipeline traffic: interrupted; {out} is as it was "
                                         "(its report, if any, is an earlier run's)"]
    assert list(out.iterdir()) == []
