"""Bad input fails the query at planning (or the first task) with a message naming the option or column."""

from __future__ import annotations

from typing import Any

import pytest
from pyspark.sql import functions as F

from tests.integration.conftest import TestCluster
from tests.spark.helpers import create_topic, read_options

pytestmark = pytest.mark.integration


def _fails(action: Any, *named: str) -> str:
    with pytest.raises(Exception) as info:
        action()
    message = str(info.value)
    for name in named:
        assert name in message, f"{name!r} not in: {message[:2000]}"
    return message


def test_bad_read_input(spark: Any, cluster: TestCluster) -> None:
    bootstrap = cluster.gateway_address
    create_topic(bootstrap, "bad-input", 2)

    def read(**options: Any) -> Any:
        return spark.read.format("highwater").options(**read_options(bootstrap, **options)).load()

    _fails(
        lambda: read(subscribe="no-such-topic").count(),
        "option 'subscribe'",
        "no-such-topic",
        "does not exist",
    )
    _fails(
        lambda: read(subscribe="bad-input", startingOffsets='{"bad-input": {"0": }').count(),
        "option 'startingOffsets'",
        "not valid JSON",
    )
    _fails(
        lambda: read(subscribe="bad-input", endingOffsets='{"bad-input": {"0": 5000, "1": -1}}').count(),
        "option 'endingOffsets'",
        "past its high watermark",
    )
    _fails(lambda: read(assign='{"bad-input": [7]}').count(), "option 'assign'", "bad-input-7")
    _fails(
        lambda: (
            spark.read.format("highwater")
            .options(
                **read_options("127.0.0.1:1", subscribe="bad-input", **{"highwater.connect.timeout.ms": 1500})
            )
            .load()
            .count()
        ),
        "option 'bootstrap'",
        "127.0.0.1:1",
    )
    _fails(
        lambda: (
            spark.readStream.format("highwater")
            .options(**read_options(bootstrap, subscribe="bad-input", endingOffsets="latest"))
            .load()
            .writeStream.format("noop")
            .start()
            .awaitTermination(60)
        ),
        "endingOffsets",
    )


def test_bad_write_input(spark: Any, cluster: TestCluster) -> None:
    bootstrap = cluster.gateway_address
    create_topic(bootstrap, "bad-write", 2)

    def write(df: Any, **options: Any) -> None:
        df.write.format("highwater").options(**{"bootstrap": bootstrap, **options}).mode("append").save()

    values = spark.range(3).select(F.col("id").cast("string").alias("value"))
    _fails(
        lambda: write(spark.range(3).select(F.col("id").cast("string").alias("payload")), topic="bad-write"),
        "'value' column",
    )
    _fails(
        lambda: write(spark.range(3).select(F.col("id").alias("value")), topic="bad-write"),
        "column 'value'",
        "bigint",
    )
    _fails(lambda: write(values.withColumn("partition", F.lit("x")), topic="bad-write"), "column 'partition'")
    _fails(lambda: write(values), "'topic'")
    _fails(lambda: write(values, topic="no-such-topic"), "option 'topic'", "does not exist")
    _fails(lambda: write(values.withColumn("topic", F.lit("also-missing"))), "column 'topic'", "also-missing")
    _fails(
        lambda: write(values.withColumn("partition", F.lit(9)), topic="bad-write"), "column 'partition'", "9"
    )
