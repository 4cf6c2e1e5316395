"""A Spark driver of its own for test_exactly_once.py, so the test can SIGKILL it.

Run as `python -m tests.spark.eos_driver BOOTSTRAP INPUT OUTPUT CHECKPOINT BLOCK_VALUE BLOCKED_FILE`.
It streams INPUT to OUTPUT through the exactly-once sink (deliveryGuarantee=exactly-once) with
trigger availableNow, 100 records per micro-batch, and exits 0 when the input is written. The
task that meets BLOCK_VALUE (empty: none) creates BLOCKED_FILE and then waits, bounded, for the
test to kill this driver: a driver killed in the middle of a micro-batch whose transactions are
open, some of its records already in the log.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

# How long the blocked task waits for the kill before it gives up (the test fails then).
BLOCK_WAIT_S = 120.0
QUERY_TIMEOUT_S = 300


def main(
    bootstrap: str, source: str, sink: str, checkpoint: str, block_value: str, blocked_file: str
) -> None:
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    spark = (
        SparkSession.builder.master("local[2]")
        .appName("highwater-eos-driver")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.driver.memory", "1g")
        .config("spark.sql.execution.arrow.maxRecordsPerBatch", "10")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    blocked = Path(blocked_file)

    @F.udf("binary")
    def block_once(value: bytes) -> bytes:
        if block_value and value == block_value.encode():
            blocked.touch()
            deadline = time.monotonic() + BLOCK_WAIT_S
            while time.monotonic() < deadline:
                time.sleep(0.1)
        return value

    rows = (
        spark.readStream.format("highwater")
        .option("bootstrap", bootstrap)
        .option("subscribe", source)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", "100")
        .load()
        .select(F.col("key"), block_once(F.col("value")).alias("value"))
    )
    query = (
        rows.writeStream.format("highwater")
        .option("bootstrap", bootstrap)
        .option("topic", sink)
        .option("deliveryGuarantee", "exactly-once")
        # Small batches sent at once: a task's records reach the log before its commit.
        .option("highwater.batch.size.bytes", "256")
        .option("highwater.linger.ms", "0")
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(QUERY_TIMEOUT_S)
    failure = query.exception()
    spark.stop()
    if failure is not None:
        print(f"query failed: {failure}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main(*sys.argv[1:7])
