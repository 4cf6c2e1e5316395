"""The PySpark connector: Highwater topics as a Spark data source named "highwater".

    spark.read.format("highwater").option("bootstrap", "127.0.0.1:9092").option("subscribe", "orders").load()

The source registers itself in PySpark 4 through the top-level module
`pyspark_highwater` (Spark imports every `pyspark_*` module on the Python path that
has a DefaultSource); `register(spark)` does it explicitly. Spark's Python workers must
run an interpreter with highwater installed: `configure(SparkSession.builder)` sets that
up, and `check_spark_session(spark)` says what to set when it is not so (instead of
Spark's bare DATA_SOURCE_NOT_FOUND). docs/SPARK.md has the options, the schema and the
delivery guarantees.
"""

from __future__ import annotations

from typing import Any

from spark_connector.session import SparkSetupError, check_spark_session, configure, spark_settings
from spark_connector.source import SHORT_NAME, HighwaterDataSource

__all__ = [
    "SHORT_NAME",
    "HighwaterDataSource",
    "SparkSetupError",
    "check_spark_session",
    "configure",
    "register",
    "spark_settings",
]


def register(spark: Any) -> None:
    """Register the data source with a SparkSession (needed only where auto-registration cannot see it)."""
    spark.dataSource.register(HighwaterDataSource)
