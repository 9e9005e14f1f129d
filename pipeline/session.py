"""The jobs' SparkSession: embedded `local[*]` unless told otherwise, quiet unless asked, UTC."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import tempfile
import threading
import warnings
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from types import FrameType
from typing import IO

from pyspark import SparkConf, SparkContext
from pyspark.java_gateway import launch_gateway
from pyspark.sql import SparkSession

# Spark's own logs down to errors, startup chatter included (the driver JVM reads this when it starts;
# the logger of PySpark's gateway is named too, or Spark announces its "default log level").
_QUIET_LOG4J = """\
rootLogger.level = error
rootLogger.appenderRef.stderr.ref = stderr
appender.stderr.type = Console
appender.stderr.name = stderr
appender.stderr.target = SYSTEM_ERR
appender.stderr.layout.type = PatternLayout
appender.stderr.layout.pattern = %d{HH:mm:ss} %p %c{1}: %m%n
logger.gateway.name = org.apache.spark.api.python.PythonGatewayServer
logger.gateway.level = error
"""


@contextmanager
def spark_session(master: str | None, verbose: bool, conf: Mapping[str, str] | None = None) -> Iterator[SparkSession]:
    """The active session if there is one (a test's, a notebook's), else a new one stopped on exit.

    Without `master` Spark picks its default: `local[*]`, or what spark-submit was given. `conf` goes to
    the builder, so `spark.driver.memory` takes effect when this starts the driver's JVM (embedded);
    under spark-submit, whose JVM already runs, give spark-submit the driver's settings. Unless
    `verbose`, Spark says nothing but its errors: no web UI, no progress bars, no logs, no notices.
    Defaults for small inputs, which `conf` overrides: a JVM that this starts compiles with C1 only
    (`_QUICK_JVM`), and in local mode a shuffle has a partition per core.
    """
    active = SparkSession.getActiveSession()
    if active is not None:
        yield _in_utc(active)
        return
    settings = {"spark.app.name": "plexmq-pipeline", **({"spark.master": master} if master else {}), **(conf or {})}
    if master is None or master.startswith("local"):
        _python_of_this_process()
    if "PYSPARK_GATEWAY_PORT" not in os.environ:  # this process starts the driver's JVM
        _java_options(settings, _QUICK_JVM)
    # Ctrl-C waits until the driver's JVM runs: before, a KeyboardInterrupt leaves it running for good (it
    # ends when our end of its stdin closes, which it watches only once started).
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        spark = _new_session(settings, verbose)
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    if is_local(spark) and "spark.sql.shuffle.partitions" not in settings:
        # a shuffle's map task writes a file per partition before Spark merges them: 200 by default,
        # far more than a machine's cores (each of those partitions then holds a few rows)
        spark.conf.set("spark.sql.shuffle.partitions", str(spark.sparkContext.defaultParallelism))
    try:
        yield _in_utc(spark)
    finally:
        spark.stop()


def _new_session(settings: dict[str, str], verbose: bool) -> SparkSession:
    """A new session, quiet unless `verbose`."""
    if verbose:
        return SparkSession.builder.config(conf=SparkConf().setAll(list(settings.items()))).getOrCreate()
    else:
        # PySpark's own notice, for pandas releases newer than it has been tested with: the jobs use no pandas.
        warnings.filterwarnings("ignore", "PySpark does not yet fully support pandas", FutureWarning)
        with tempfile.NamedTemporaryFile("w", suffix=".properties", delete=False) as log_config:
            log_config.write(_QUIET_LOG4J)
        try:
            settings |= {"spark.ui.enabled": "false", "spark.ui.showConsoleProgress": "false"}
            _java_options(settings, f"-Dlog4j2.configurationFile={log_config.name}")
            return _quiet_session(settings)
        finally:
            os.unlink(log_config.name)


# The driver's JVM compiles with its quick compiler only (C1): Spark's warm-up is a JIT's busiest time, and
# a report takes seconds to minutes, too short for the optimising compiler (C2) to pay back the CPU it
# takes; traffic of 10,000 and of 500,000 messages ran in half the time on 2 cores (bench/RESULTS.md).
# Options given in --conf come after it, so `-XX:TieredStopAtLevel=4` there brings C2 back.
_QUICK_JVM = "-XX:TieredStopAtLevel=1"


def _java_options(settings: dict[str, str], option: str) -> None:
    """Add a JVM option to the driver's, before those the user gave."""
    given = settings.get("spark.driver.extraJavaOptions")
    settings["spark.driver.extraJavaOptions"] = f"{option} {given}" if given else option


def _quiet_session(settings: Mapping[str, str]) -> SparkSession:
    """A session whose driver JVM's stderr passes through `_JvmErrors`, when this process starts that
    JVM (spark-submit started it otherwise, with its own stderr)."""
    spark_conf = SparkConf().setAll(list(settings.items()))
    if "PYSPARK_GATEWAY_PORT" in os.environ:
        spark = SparkSession.builder.config(conf=spark_conf).getOrCreate()
    else:
        gateway = launch_gateway(spark_conf, popen_kwargs={"stderr": subprocess.PIPE})
        errors = _JvmErrors(gateway.proc.stderr)
        errors.start()
        SparkContext(conf=spark_conf, gateway=gateway)
        spark = SparkSession.builder.getOrCreate()

        def interrupted(signum: int, frame: FrameType | None) -> None:
            """Ctrl-C, in place of PySpark's handler, which cancels the jobs through the gateway's
            connection while the interrupted call still waits on it (a traceback of each); stopping
            the session on the way out cancels them. The gateway logs the interrupted call's traceback
            through the root logger: no logging from here on, as the process is ending."""
            errors.muted = True
            logging.disable(logging.CRITICAL)
            raise KeyboardInterrupt

        signal.signal(signal.SIGINT, interrupted)
    spark.sparkContext.setLogLevel("ERROR")  # also when spark-submit started the JVM
    return spark


class _JvmErrors(threading.Thread):
    """Copies what the driver JVM (and the Python workers it starts) writes to stderr onto ours, but
    for the JDK's notice that Spark uses an incubator module, and nothing once the run is interrupted
    (Ctrl-C cancels the jobs: each task's cancellation is an error)."""

    def __init__(self, stream: IO[bytes]) -> None:
        super().__init__(name="jvm-stderr", daemon=True)
        self._stream = stream
        self.muted = False

    def run(self) -> None:
        for line in self._stream:
            if not self.muted and not line.startswith(b"WARNING: Using incubator modules"):
                sys.stderr.write(line.decode(errors="replace"))
                sys.stderr.flush()


def _python_of_this_process() -> None:
    """Local Spark starts its Python workers with `python3` from PATH, which is not the interpreter
    running plexmq when it is started by its path (a systemd unit, cron): use ours, unless the user
    chose one or spark-submit (which passes the gateway) is in charge."""
    if "PYSPARK_GATEWAY_PORT" in os.environ:
        return
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)


def is_local(spark: SparkSession) -> bool:
    """Whether Spark runs in local mode, where the driver is the only executor."""
    return (spark.sparkContext.master or "").startswith("local")


def _in_utc(spark: SparkSession) -> SparkSession:
    """Minutes, hours and dates in UTC, like the archive's partitions."""
    spark.conf.set("spark.sql.session.timeZone", "UTC")
    return spark
