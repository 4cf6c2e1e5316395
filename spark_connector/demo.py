"""A tiny PySpark job against a running cluster: write a topic with format("highwater"), read it back.

`run_spark_demo(bootstrap)` is what the README's demo command calls. It starts a
local[2] SparkSession (Java 17 and the `spark` extra needed), creates `spark-demo`
if it is missing, writes nine keyed rows with headers through the connector, reads
the topic back as a DataFrame and prints a few rows, then stops the session.
"""

from __future__ import annotations

import os
import sys

from clients.admin import Admin
from clients.common.errors import TopicAlreadyExists

DEMO_TOPIC = "spark-demo"
DEMO_PARTITIONS = 3
DEMO_ROWS = 9
# Spark's own logging is chatty; the demo prints what it does itself.
_SPARK_LOG_LEVEL = "ERROR"


def run_spark_demo(bootstrap: str) -> None:
    """Write DEMO_ROWS rows to `spark-demo` through Spark and read the topic back, printing a few rows."""
    with Admin(bootstrap) as admin:
        brokers = len(admin.describe_cluster().brokers)
        try:
            admin.create_topics(DEMO_TOPIC, DEMO_PARTITIONS, min(3, max(brokers, 1)))
            print(f"created topic {DEMO_TOPIC}")
        except TopicAlreadyExists:
            print(f"topic {DEMO_TOPIC} exists; appending to it")

    # Python workers must run this interpreter (the one with highwater installed).
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    # Spark binds to the host's first non-loopback address unless told: keep it on 127.0.0.1.
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    from spark_connector import register

    spark = (
        SparkSession.builder.master("local[2]")
        .appName("highwater-spark-demo")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel(_SPARK_LOG_LEVEL)
    try:
        # Explicit registration works whatever way the package was installed (an editable
        # install is invisible to Spark's automatic pyspark_* lookup).
        register(spark)
        rows = spark.range(DEMO_ROWS).select(
            F.concat(F.lit("user-"), (F.col("id") % 3).cast("string")).alias("key"),
            F.concat(F.lit("hello from spark "), F.col("id").cast("string")).alias("value"),
            F.array(F.struct(F.lit("source").alias("key"), F.lit(b"spark-demo").alias("value"))).alias(
                "headers"
            ),
        )
        (
            rows.write.format("highwater")
            .option("bootstrap", bootstrap)
            .option("topic", DEMO_TOPIC)
            .mode("append")
            .save()
        )
        print(f"wrote {DEMO_ROWS} rows to {DEMO_TOPIC} with df.write.format('highwater')")
        read = (
            spark.read.format("highwater")
            .option("bootstrap", bootstrap)
            .option("subscribe", DEMO_TOPIC)
            .option("includeHeaders", "true")
            .load()
        )
        print(f"read back {read.count()} records from {DEMO_TOPIC} with spark.read.format('highwater'):")
        (
            read.select(
                "partition",
                "offset",
                F.col("key").cast("string").alias("key"),
                F.col("value").cast("string").alias("value"),
                "timestamp",
            )
            .orderBy(F.col("timestamp").desc(), "partition", "offset")
            .show(5, truncate=False)
        )
    finally:
        spark.stop()
