"""Spark's timestamp options start and end at the record, not at its batch (issue 38).

Each partition holds one batch of 100 records, the record at offset o stamped base + 10 * o;
every timestamp asked falls inside that batch, so an answer per batch (its first offset)
would read whole batches where Spark's Kafka source reads from the record on.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import functions as F

from clients.common.records import encode_batch
from tests.integration.conftest import TestCluster
from tests.integration.helpers import gateway_stub
from tests.integration.test_list_offsets_by_timestamp import write_batch
from tests.spark.helpers import create_topic, read_options

pytestmark = pytest.mark.integration

TOPIC = "spark-by-time"
RECORDS = 100  # per partition, in one batch
STEP_MS = 10
QUERY_TIMEOUT_S = 90


@pytest.fixture(scope="module")
def base_ms(cluster: TestCluster) -> int:
    """Create TOPIC (2 partitions) and write one batch to each; the timestamp of offset 0."""
    base = int(time.time() * 1000) - 600_000  # well inside the topic's timestamp window
    bootstrap = cluster.gateway_address
    create_topic(bootstrap, TOPIC, 2)
    gw = gateway_stub(bootstrap)
    batch = encode_batch([(None, b"r%d" % o, [], base + STEP_MS * o) for o in range(RECORDS)])
    for partition in (0, 1):
        write_batch(gw, TOPIC, partition, batch)
    return base


def _offsets(df: Any) -> dict[int, list[int]]:
    by_partition: dict[int, list[int]] = {}
    for row in df.select("partition", "offset").collect():
        by_partition.setdefault(row.partition, []).append(row.offset)
    return {p: sorted(offsets) for p, offsets in by_partition.items()}


def test_starting_offsets_by_timestamp_start_at_the_record(
    spark: Any, cluster: TestCluster, base_ms: int
) -> None:
    by_time = f'{{"{TOPIC}": {{"0": {base_ms + STEP_MS * 50}, "1": {base_ms + STEP_MS * 75 - 1}}}}}'
    df = (
        spark.read.format("highwater")
        .options(**read_options(cluster.gateway_address, subscribe=TOPIC, startingOffsetsByTimestamp=by_time))
        .load()
    )
    assert _offsets(df) == {0: list(range(50, RECORDS)), 1: list(range(75, RECORDS))}


def test_starting_and_ending_timestamp_read_the_records_between(
    spark: Any, cluster: TestCluster, base_ms: int
) -> None:
    df = (
        spark.read.format("highwater")
        .options(
            **read_options(
                cluster.gateway_address,
                subscribe=TOPIC,
                startingTimestamp=base_ms + STEP_MS * 40,
                endingTimestamp=base_ms + STEP_MS * 50,
            )
        )
        .load()
    )
    assert _offsets(df) == {0: list(range(40, 50)), 1: list(range(40, 50))}


def test_stream_started_by_timestamp_reads_from_the_record(
    spark: Any, cluster: TestCluster, base_ms: int, tmp_path: Path
) -> None:
    seen: list[tuple[int, int]] = []
    query = (
        spark.readStream.format("highwater")
        .options(
            **read_options(cluster.gateway_address, subscribe=TOPIC, startingTimestamp=base_ms + STEP_MS * 95)
        )
        .load()
        .select(F.col("partition"), F.col("offset"))
        .writeStream.foreachBatch(
            lambda df, _batch_id: seen.extend((r.partition, r.offset) for r in df.collect())
        )
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    try:
        assert query.awaitTermination(QUERY_TIMEOUT_S), f"the query did not end within {QUERY_TIMEOUT_S} s"
    finally:
        query.stop()
    assert query.exception() is None
    assert sorted(seen) == [(p, o) for p in (0, 1) for o in range(95, RECORDS)]
