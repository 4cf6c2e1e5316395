"""The PySpark connector: Highwater topics as a Spark data source named "highwater".

    spark.read.format("highwater").option("bootstrap", "127.0.0.1:9092").option("subscribe", "orders").load()

The source registers itself in PySpark 4 through the top-level module
`pyspark_highwater` (Spark imports every `pyspark_*` module on the Python path that
has a DefaultSource); `register(spark)` does it explicitly. docs/SPARK.md has the
options, the schema and the delivery guarantees.
"""

from __future__ import annotations

from typing import Any

from spark_connector.source import SHORT_NAME, HighwaterDataSource

__all__ = ["SHORT_NAME", "HighwaterDataSource", "register"]


def register(spark: Any) -> None:
    """Register the data source with a SparkSession (needed only where auto-registration cannot see it)."""
    spark.dataSource.register(HighwaterDataSource)
