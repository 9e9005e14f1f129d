"""The pipeline tests' Spark session (one per test session) and the times of their sample data."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
from pyspark.sql import SparkSession

from plexmq.pipeline.session import spark_session


def us(t: datetime) -> int:
    return (t - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(microseconds=1)


START = datetime(2024, 5, 1, tzinfo=UTC)


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    with spark_session("local[2]", verbose=False) as session:
        # tiny data: few tasks, and no generated code, whose compiling costs more than it saves here
        session.conf.set("spark.sql.shuffle.partitions", "2")
        session.conf.set("spark.sql.codegen.wholeStage", "false")
        yield session


def at(minutes: float) -> int:
    return us(START + timedelta(minutes=minutes))
