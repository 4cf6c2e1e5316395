"""The Spark connector reads with kafka.isolation.level=read_committed on a real cluster (issue 41).

As in test_read_committed.py, the transaction is an empty one that was aborted (a lone ABORT
marker written by WriteTxnMarkers at the leader): producers cannot write transactional batches
yet. A local SparkSession reads the topic read_committed, from the leader (its files, the
default) and through the gateway: every record, no row for the marker, the offsets with the
marker's gap; planning's latest is the last stable offset the leader answers.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from clients import Admin, Producer
from protos.highwater.v1 import common_pb2
from tests.integration.conftest import TestCluster
from tests.integration.helpers import gateway_stub, partition_metadata
from tests.integration.test_read_committed import TOPIC, write_abort_marker
from tests.spark.conftest import spark  # noqa: F401  # the local SparkSession fixture
from tests.spark.helpers import read_options

pytestmark = pytest.mark.integration

FAST = {"request_timeout_ms": 10_000, "connect_timeout_ms": 5_000, "retry_backoff_ms": 50}
CALL_TIMEOUT_S = 10.0
QUERY_TIMEOUT_S = 60
EXPECTED = [(0, b"before-0"), (1, b"before-1"), (2, b"before-2"), (4, b"after-0"), (5, b"after-1")]


def test_spark_reads_committed_records_around_an_abort_marker(
    make_cluster: Callable[..., TestCluster],
    spark: Any,  # noqa: F811
    tmp_path: Path,
) -> None:
    cluster = make_cluster(brokers=1)
    with Admin(cluster.gateway_address, **FAST) as admin:
        admin.create_topics(TOPIC, 1, 1)
    with Producer(cluster.gateway_address, **FAST) as producer:
        for i in range(3):
            producer.send(TOPIC, f"before-{i}".encode(), partition=0).result(timeout=CALL_TIMEOUT_S)
        leader = partition_metadata(gateway_stub(cluster.gateway_address), TOPIC, 0).leader
        answer = write_abort_marker(cluster, leader)
        assert [p.error_code for m in answer.markers for t in m.topics for p in t.partitions] == [
            common_pb2.NONE
        ], answer
        for i in range(2):
            producer.send(TOPIC, f"after-{i}".encode(), partition=0).result(timeout=CALL_TIMEOUT_S)

    for extra in (
        {},  # from the leader, its records read from its files
        {"highwater.fetch.from.leaders": "false"},  # through the gateway
        {"startingOffsets": json.dumps({TOPIC: {"0": 3}}), "minPartitions": 2},  # a task starts at the marker
    ):
        options = read_options(
            cluster.gateway_address,
            subscribe=TOPIC,
            **{"kafka.isolation.level": "read_committed", **extra},
        )
        rows = spark.read.format("highwater").options(**options).load().collect()
        got = sorted((r.offset, bytes(r.value)) for r in rows)
        first = 3 if "startingOffsets" in extra else 0
        assert got == [(o, v) for o, v in EXPECTED if o >= first], extra

    # A streaming query read_committed: its first micro-batch ends at the LSO (6: past the marker).
    stream = (
        spark.readStream.format("highwater")
        .options(
            **read_options(
                cluster.gateway_address,
                subscribe=TOPIC,
                startingOffsets="earliest",
                **{"kafka.isolation.level": "read_committed"},
            )
        )
        .load()
    )
    query = (
        stream.writeStream.format("memory")
        .queryName("read_committed_rows")
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    try:
        query.awaitTermination(QUERY_TIMEOUT_S)
        assert query.exception() is None, query.exception()
        assert not query.isActive, f"the availableNow query did not finish within {QUERY_TIMEOUT_S} s"
        progress = query.lastProgress
    finally:
        query.stop()
    rows = spark.sql("SELECT offset, value FROM read_committed_rows").collect()
    assert sorted((r.offset, bytes(r.value)) for r in rows) == EXPECTED
    assert progress is not None and json.loads(progress["sources"][0]["endOffset"]) == {TOPIC: {"0": 6}}
