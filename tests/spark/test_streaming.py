"""Streaming reads and writes: checkpoints, restarts, read limits, and a writer killed mid-batch."""

from __future__ import annotations

import os
import signal
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import functions as F

from clients.admin import Admin
from tests.integration.conftest import TestCluster
from tests.spark.helpers import consume_all, create_topic, produce, read_options, wait_until_written

pytestmark = pytest.mark.integration

QUERY_TIMEOUT_S = 90
# How long the killing UDF waits for the writer to have put rows in the topic.
KILL_WAIT_S = 60


def _stream(spark: Any, bootstrap: str, topic: str, **options: Any) -> Any:
    return (
        spark.readStream.format("highwater")
        .options(**read_options(bootstrap, subscribe=topic, startingOffsets="earliest", **options))
        .load()
    )


def test_restarted_query_reads_every_record_exactly_once(
    spark: Any, cluster: TestCluster, tmp_path: Path
) -> None:
    bootstrap = cluster.gateway_address
    create_topic(bootstrap, "stream-in", 2)
    produce(bootstrap, "stream-in", [(i % 2, None, f"a{i}".encode(), []) for i in range(400)])
    out, checkpoint = str(tmp_path / "out"), str(tmp_path / "checkpoint")

    def start(trigger: dict[str, Any]) -> Any:
        rows = _stream(spark, bootstrap, "stream-in", maxOffsetsPerTrigger=100).select(
            "partition", "offset", "value"
        )
        return (
            rows.writeStream.format("parquet")
            .option("path", out)
            .option("checkpointLocation", checkpoint)
            .trigger(**trigger)
            .start()
        )

    # Run 1: processing-time trigger, stopped once it has done some batches (maybe mid-batch).
    query = start({"processingTime": "200 milliseconds"})
    try:
        import time

        deadline = time.monotonic() + QUERY_TIMEOUT_S
        while sum(p["numInputRows"] for p in query.recentProgress) < 200:
            assert time.monotonic() < deadline, "the first run made no progress"
            assert query.exception() is None, query.exception()
            time.sleep(0.2)
    finally:
        query.stop()
    progress = query.lastProgress
    assert progress["sources"][0]["latestOffset"] is not None  # reportLatestOffset reaches the progress

    # More records, and a new partition with records of its own.
    produce(bootstrap, "stream-in", [(i % 2, None, f"b{i}".encode(), []) for i in range(100)])
    with Admin(bootstrap) as admin:
        admin.create_partitions("stream-in", 3)
    produce(bootstrap, "stream-in", [(2, None, f"c{i}".encode(), []) for i in range(50)])

    # Run 2 from the same checkpoint: everything left, then it stops by itself.
    query = start({"availableNow": True})
    query.awaitTermination(QUERY_TIMEOUT_S)
    assert query.exception() is None

    rows = spark.read.parquet(out).collect()
    keys = Counter((r.partition, r.offset) for r in rows)
    assert [k for k, n in keys.items() if n > 1] == []  # exactly once ...
    expected = {(r.partition, r.offset) for r in consume_all(bootstrap, "stream-in")}
    assert set(keys) == expected and len(expected) == 550  # ... and nothing missed, new partition included


def test_max_offsets_per_trigger_sizes_the_batches(spark: Any, cluster: TestCluster, tmp_path: Path) -> None:
    bootstrap = cluster.gateway_address
    create_topic(bootstrap, "stream-limit", 3)
    produce(
        bootstrap,
        "stream-limit",
        [(p, None, b"x", []) for p, n in ((0, 100), (1, 60), (2, 40)) for _ in range(n)],
    )
    sizes: list[int] = []
    query = (
        _stream(spark, bootstrap, "stream-limit", maxOffsetsPerTrigger=50)
        .writeStream.foreachBatch(lambda df, _batch_id: sizes.append(df.count()))
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(QUERY_TIMEOUT_S)
    assert query.exception() is None
    assert [s for s in sizes if s] == [50, 50, 50, 50]


def test_stream_write_killed_mid_batch_writes_no_duplicates(
    spark: Any, cluster: TestCluster, tmp_path: Path
) -> None:
    """A worker killed in the middle of micro-batch 1, after the other task of that batch wrote all of
    its rows: the restarted query replays batch 1 and writes no row twice.

    Nothing checked depends on timing. Batch 1 (offsets 500-999 of both partitions) runs as two
    tasks; the one for partition 1 waits (bounded) in its UDF until the one for partition 0 has
    all of its rows in the topic, and then kills its own Python worker. So before the restart the
    topic holds exactly batch 0 and partition 0's half of batch 1 (a partition's task sends its
    record batches only when its Produce request is full or its rows end, so none of partition
    1's half), and the replay has to recognise every batch of partition 0's half.
    """
    bootstrap = cluster.gateway_address
    create_topic(bootstrap, "wstream-in", 2)
    create_topic(bootstrap, "wstream-out", 3)
    produce(bootstrap, "wstream-in", [(i % 2, None, f"r-{i % 2}-{i // 2}".encode(), []) for i in range(3000)])
    marker = tmp_path / "killed-once"
    checkpoint = str(tmp_path / "checkpoint")
    batch_0 = {f"r-{p}-{i}".encode() for p in (0, 1) for i in range(500)}
    batch_1_partition_0 = {f"r-0-{i}".encode() for i in range(500, 1000)}

    @F.udf("binary")
    def kill_once(value: bytes) -> bytes:
        if value == b"r-1-800" and not marker.exists():
            wait_until_written(bootstrap, "wstream-out", batch_1_partition_0, KILL_WAIT_S)
            marker.touch()
            os.kill(os.getpid(), signal.SIGKILL)
        return value

    def start() -> Any:
        rows = _stream(spark, bootstrap, "wstream-in", maxOffsetsPerTrigger=1000).select(
            kill_once(F.col("value")).alias("value")
        )
        return (
            rows.writeStream.format("highwater")
            .option("bootstrap", bootstrap)
            .option("topic", "wstream-out")
            .option("highwater.batch.size.bytes", "1024")  # many small batches to recognise
            .option("checkpointLocation", checkpoint)
            .trigger(availableNow=True)
            .start()
        )

    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "50")
    try:
        query = start()
        with pytest.raises(Exception):  # noqa: B017 - the killed worker fails the query
            query.awaitTermination(QUERY_TIMEOUT_S)
        assert marker.exists()
        before = Counter(r.value for r in consume_all(bootstrap, "wstream-out"))
        assert [v for v, n in before.items() if n > 1] == []
        assert set(before) == batch_0 | batch_1_partition_0

        query = start()
        query.awaitTermination(QUERY_TIMEOUT_S)
        assert query.exception() is None
    finally:
        spark.conf.unset("spark.sql.execution.arrow.maxRecordsPerBatch")

    values = Counter(r.value for r in consume_all(bootstrap, "wstream-out"))
    assert [v for v, n in values.items() if n > 1] == []
    assert set(values) == {f"r-{i % 2}-{i // 2}".encode() for i in range(3000)}


def test_deleted_topic_fails_the_query_or_is_skipped_per_fail_on_data_loss(
    spark: Any, cluster: TestCluster, tmp_path: Path
) -> None:
    bootstrap = cluster.gateway_address
    create_topic(bootstrap, "loss", 1)
    produce(bootstrap, "loss", [(0, None, b"x", []) for _ in range(10)])

    def run(fail_on_data_loss: bool) -> Any:
        checkpoint = str(tmp_path / f"fail-{fail_on_data_loss}")
        query = (
            _stream(spark, bootstrap, "loss", failOnDataLoss=str(fail_on_data_loss).lower())
            .writeStream.foreachBatch(lambda df, _batch_id: df.count())
            .option("checkpointLocation", checkpoint)
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination(QUERY_TIMEOUT_S)
        return query

    # Both queries read the topic and checkpoint its offsets; then it is deleted under them.
    assert run(True).exception() is None and run(False).exception() is None
    with Admin(bootstrap) as admin:
        admin.delete_topics(["loss"])
    with pytest.raises(Exception, match="failOnDataLoss"):
        run(True)
    assert run(False).exception() is None  # skipped, with a warning in the log
