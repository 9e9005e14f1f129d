"""The jobs' SparkSession: embedded `local[*]` unless told otherwise, quiet unless asked, UTC."""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

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
    under spark-submit, whose JVM already runs, give spark-submit the driver's settings. The Spark UI
    and logs are off unless `verbose`; the console progress bar stays on.
    """
    active = SparkSession.getActiveSession()
    if active is not None:
        yield _in_utc(active)
        return
    if master is None or master.startswith("local"):
        _python_of_this_process()
    builder = SparkSession.builder.appName("plexmq-pipeline").config("spark.ui.showConsoleProgress", "true")
    if master:
        builder = builder.master(master)
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    if verbose:
        spark = builder.getOrCreate()
    else:
        with tempfile.NamedTemporaryFile("w", suffix=".properties", delete=False) as log_config:
            log_config.write(_QUIET_LOG4J)
        try:
            spark = (
                builder.config("spark.ui.enabled", "false")
                .config("spark.driver.extraJavaOptions", f"-Dlog4j2.configurationFile={log_config.name}")
                .getOrCreate()
            )
            spark.sparkContext.setLogLevel("ERROR")  # also when spark-submit started the JVM
        finally:
            os.unlink(log_config.name)
    try:
        yield _in_utc(spark)
    finally:
        spark.stop()


def _python_of_this_process() -> None:
    """Local Spark starts its Python workers with `python3` from PATH, which is not the interpreter
    running plexmq when it is started by its path (a systemd unit, cron): use ours, unless the user
    chose one or spark-submit (which passes the gateway) is in charge."""
    if "PYSPARK_GATEWAY_PORT" in os.environ:
        return
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)


def _in_utc(spark: SparkSession) -> SparkSession:
    """Minutes, hours and dates in UTC, like the archive's partitions."""
    spark.conf.set("spark.sql.session.timeZone", "UTC")
    return spark
