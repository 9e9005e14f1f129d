"""The jobs' result tables: written to Parquet once, then read back from the files, so that the report
reads what was written instead of computing each table's plan again."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from pyspark.sql import DataFrame, SparkSession


def save(spark: SparkSession, tables: Mapping[str, DataFrame], out: str,
         progress: Callable[[str], None]) -> dict[str, DataFrame]:
    """Write each table to `out/NAME/` (replacing an earlier run's) and return them as read back."""
    for name, table in tables.items():
        progress(f"writing {name}/")
        table.write.mode("overwrite").parquet(f"{out}/{name}")
    return {name: spark.read.schema(t.schema).parquet(f"{out}/{name}") for name, t in tables.items()}
