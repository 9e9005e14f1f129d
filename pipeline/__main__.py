"""`plexmq pipeline ...` and `python -m plexmq.pipeline ...`: the PySpark jobs over the traffic archive and the
benchmark samples (see deploy/spark.md for a cluster)."""

from __future__ import annotations

import argparse
import sys
import time
from datetime import UTC, datetime

from plexmq.mqtt.topics import valid_filter
from plexmq.tenants import unfit_name
from plexmq.units import parse_duration


def duration(text: str) -> float:
    """Seconds from `90`, `90s`, `10m`, `2h` or `1d`."""
    try:
        return parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def setting(text: str) -> tuple[str, str]:
    """A Spark setting from `key=value`."""
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"not KEY=VALUE: {text!r} (e.g. spark.local.dir=/big/disk)")
    return key.strip(), value


def topic_filter(text: str) -> str:
    """A valid MQTT topic filter."""
    if not valid_filter(text):
        raise argparse.ArgumentTypeError(f"not a topic filter: {text!r} (e.g. sensors/+/telemetry)")
    return text


def tenant_name(text: str) -> str:
    """A tenant's name (plexmq/tenants.py), or "" for the default tenant."""
    reason = unfit_name(text) if text else None
    if reason:
        raise argparse.ArgumentTypeError(reason)
    return text


def moment(text: str) -> datetime:
    """An ISO 8601 date or time, UTC unless it names its offset."""
    try:
        value = datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an ISO 8601 time: {text!r} (e.g. 2024-05-01T12:00)") from None
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)


class Progress:
    """Prints a job's steps on stderr with the time since it started."""

    def __init__(self, job: str) -> None:
        self._job = job
        self._start = time.monotonic()

    def __call__(self, step: str) -> None:
        print(f"[{self._job} {time.monotonic() - self._start:6.1f}s] {step}", file=sys.stderr, flush=True)


def parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--master", help="Spark master URL (default: local[*], or what spark-submit was given)")
    common.add_argument("--driver-memory", help="the driver's heap, e.g. 2g (spark.driver.memory; Spark's default: 1g)")
    common.add_argument("--conf", type=setting, action="append", default=[], metavar="KEY=VALUE",
                        help="a Spark setting, e.g. spark.local.dir=/big/disk (repeatable)")
    common.add_argument("--verbose", action="store_true", help="Spark's own output: its logs, progress bars, notices and web UI")
    output = argparse.ArgumentParser(add_help=False, parents=[common])
    output.add_argument("--out", required=True, help="directory for the Parquet tables and report.html")
    main_parser = argparse.ArgumentParser(prog="plexmq pipeline", description=__doc__)
    jobs = main_parser.add_subparsers(dest="job", required=True)
    traffic = jobs.add_parser("traffic", parents=[output], help="analyse the traffic archive")
    source = traffic.add_mutually_exclusive_group(required=True)
    source.add_argument("--archive", help="the archive directory ([archive] dir)")
    source.add_argument("--lake", help="a lake that `compact` keeps: reads only the hours in the window")
    traffic.add_argument("--since", type=moment, help="first receive time to include (UTC by default)")
    traffic.add_argument("--until", type=moment, help="receive time to stop before; the end of the window")
    traffic.add_argument("--tenant", type=tenant_name, metavar="NAME",
                         help="report this tenant's traffic only ('' for the default tenant); "
                              "default: every tenant's, with a tenant column")
    traffic.add_argument("--silence", type=duration, default=600.0, help="silent devices: idle longer than this (10m)")
    traffic.add_argument("--top", type=int, default=10, help="how many topics and clients the report ranks (10)")
    fields = jobs.add_parser("fields", parents=[output], help="roll up the numeric fields of JSON payloads")
    fields.add_argument("--archive", required=True, help="the archive directory ([archive] dir)")
    fields.add_argument("--topics", required=True, nargs="+", type=topic_filter, metavar="FILTER",
                        help="the topic filters whose payloads are JSON telemetry (+ and # wildcards)")
    fields.add_argument("--schema", metavar="DDL", help="the payloads' schema as Spark DDL, e.g. 'temp double, "
                        "battery struct<level: int>' (default: inferred from a sample)")
    bench = jobs.add_parser("bench", parents=[output], help="report on a benchmark's raw samples")
    bench.add_argument("--samples", required=True, help="the benchmark's --out directory")
    compact = jobs.add_parser("compact", parents=[common], help="add the newly sealed segments to a Parquet lake")
    compact.add_argument("--archive", required=True, help="the archive directory ([archive] dir)")
    compact.add_argument("--lake", required=True, help="the lake's directory, created if missing")
    return main_parser


def main(argv: list[str] | None = None) -> int:
    """Run one job; 0 when done, 2 when a prerequisite is missing or its input is unusable (a line each
    on stderr), 130 when interrupted (Ctrl-C)."""
    args = parser().parse_args(argv)
    out = (args.out.rstrip("/") or "/") if args.job != "compact" else None
    progress = Progress(args.job)
    try:
        code = _checked(args, out, progress)
    except KeyboardInterrupt:
        left = ("the next compact finishes or drops what it began" if out is None
                else f"{out} is as it was (its report, if any, is an earlier run's)")
        print(f"plexmq pipeline {args.job}: interrupted; {left}", file=sys.stderr)
        return 130
    if code == 0:
        progress(f"done: {args.lake}" if out is None else f"done: {out}/report.html")
    return code


def _checked(args: argparse.Namespace, out: str | None, progress: Progress) -> int:
    """The job once its prerequisites are there; 2 and a line each when they are not, or when its input
    is unusable."""
    # The prerequisites, then Spark, are imported only once the arguments are good: `--help` stays instant.
    from plexmq.pipeline.prerequisites import missing

    lacking = missing()
    for line in lacking:
        print(f"plexmq pipeline: {line}", file=sys.stderr)
    if lacking:
        return 2
    from plexmq.pipeline.inputs import BadInput

    try:
        _run(args, out, progress)
    except BadInput as e:
        print(f"plexmq pipeline {args.job}: {e}", file=sys.stderr)
        return 2
    return 0


def _run(args: argparse.Namespace, out: str | None, progress: Progress) -> None:
    """The job, in a Spark session; its tables and report.html into `out` (None for compact) once complete."""
    from plexmq.pipeline import benchmark, fields, lake, traffic
    from plexmq.pipeline.archive_source import write_archive
    from plexmq.pipeline.output import staged
    from plexmq.pipeline.session import spark_session

    progress(f"starting Spark ({args.master or 'its default master'})")
    conf = dict(args.conf)
    if args.driver_memory:
        conf["spark.driver.memory"] = args.driver_memory
    with spark_session(args.master, args.verbose, conf) as spark:
        if out is None:
            lake.compact(spark, args.archive, args.lake, progress)
            return
        with staged(out) as work:
            if args.job == "traffic":
                source, write = (args.lake, lake.write_lake) if args.lake else (args.archive, write_archive)
                traffic.run(spark, source, work, args.since, args.until, args.silence, args.top, progress,
                            args.tenant, write)
            elif args.job == "fields":
                fields.run(spark, args.archive, work, args.topics, args.schema, progress)
            else:
                benchmark.run(spark, args.samples, work, progress)


if __name__ == "__main__":
    sys.exit(main())
