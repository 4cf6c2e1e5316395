"""Batch reads and writes through format("highwater") against a real cluster.

The session uses the source without registering it: that is the automatic
registration through pyspark_highwater (see tests/spark/conftest.py).
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from pyspark.sql import functions as F

from tests.integration.conftest import TestCluster
from tests.integration.helpers import gateway_stub
from tests.integration.helpers import produce as produce_one_batch
from tests.spark.helpers import consume_all, create_topic, produce, read_options

pytestmark = pytest.mark.integration


def _rows(df: Any) -> set[tuple[Any, ...]]:
    return {
        (r.partition, r.offset, r.key, r.value, tuple((h.key, h.value) for h in r.headers or []))
        for r in df.collect()
    }


def test_batch_read_equals_what_a_consumer_reads(spark: Any, cluster: TestCluster) -> None:
    bootstrap = cluster.gateway_address
    create_topic(bootstrap, "read-multi", 3)
    records = [
        (
            i % 3,
            f"k{i}".encode() if i % 4 else None,
            f"value-{i}".encode(),
            [("n", str(i).encode())] if i % 2 else [],
        )
        for i in range(600)
    ]
    produce(bootstrap, "read-multi", records)

    df = (
        spark.read.format("highwater")
        .options(**read_options(bootstrap, subscribe="read-multi", includeHeaders="true"))
        .load()
    )
    assert df.schema.simpleString() == (
        "struct<key:binary,value:binary,topic:string,partition:int,offset:bigint,"
        "timestamp:timestamp,timestampType:int,"
        "headers:array<struct<key:string,value:binary>>>"
    )
    got = df.collect()
    expected = consume_all(bootstrap, "read-multi")
    assert len(got) == len(expected) == 600
    assert {
        (
            r.partition,
            r.offset,
            r.key,
            r.value,
            tuple((h.key, h.value) for h in r.headers),
            r.timestampType,
            int(r.timestamp.timestamp() * 1000),
        )
        for r in got
    } == {(c.partition, c.offset, c.key, c.value, tuple(c.headers), 0, c.timestamp_ms) for c in expected}
    assert {r.topic for r in got} == {"read-multi"}

    # Per-partition offsets JSON (Spark's format), minPartitions splitting, and filter pushdown.
    window = (
        spark.read.format("highwater")
        .options(
            **read_options(
                bootstrap,
                subscribe="read-multi",
                startingOffsets='{"read-multi": {"0": 50, "1": -2, "2": -2}}',
                endingOffsets='{"read-multi": {"0": 150, "1": 10, "2": -1}}',
                minPartitions=8,
            )
        )
        .load()
    )
    assert window.rdd.getNumPartitions() >= 8
    counts = {r.partition: r["count"] for r in window.groupBy("partition").count().collect()}
    assert counts == {0: 100, 1: 10, 2: 200}

    pushed = (
        spark.read.format("highwater")
        .options(**read_options(bootstrap, subscribe="read-multi", pushFilters="true"))
        .load()
        .where((F.col("partition") == 1) & (F.col("offset") >= 20) & (F.col("offset") < 30))
    )
    assert sorted(r.offset for r in pushed.collect()) == list(range(20, 30))
    assert pushed.rdd.getNumPartitions() == 1  # partition filter pruned the other two partitions

    # startingOffsetsByTimestamp: nothing is newer than the future, so with strategy latest: empty.
    future_ms = int(time.time() * 1000) + 3_600_000
    later = (
        spark.read.format("highwater")
        .options(
            **read_options(
                bootstrap,
                subscribe="read-multi",
                startingTimestamp=future_ms,
                startingOffsetsByTimestampStrategy="latest",
            )
        )
        .load()
    )
    assert later.count() == 0
    from_zero = (
        spark.read.format("highwater")
        .options(
            **read_options(
                bootstrap,
                subscribe="read-multi",
                startingOffsetsByTimestamp='{"read-multi": {"0": 0, "1": 0, "2": 0}}',
            )
        )
        .load()
    )
    assert from_zero.count() == 600


def test_batch_write_then_read_back(spark: Any, cluster: TestCluster) -> None:
    bootstrap = cluster.gateway_address
    create_topic(bootstrap, "write-back", 3)
    source = spark.range(1000).select(
        F.concat(F.lit("key-"), (F.col("id") % 7).cast("string")).alias("key"),
        F.concat(F.lit("value-"), F.col("id").cast("string")).cast("binary").alias("value"),
        F.when(F.col("id") < 100, F.lit(2)).cast("int").alias("partition"),
        F.array(
            F.struct(F.lit("id").alias("key"), F.col("id").cast("string").cast("binary").alias("value"))
        ).alias("headers"),
    )
    source.write.format("highwater").option("bootstrap", bootstrap).option("topic", "write-back").option(
        "highwater.batch.size.bytes", "4096"
    ).mode("append").save()

    back = (
        spark.read.format("highwater")
        .options(**read_options(bootstrap, subscribe="write-back", includeHeaders="true"))
        .load()
    )
    rows = back.collect()
    assert len(rows) == 1000
    assert sorted(r.value for r in rows) == sorted(f"value-{i}".encode() for i in range(1000))
    by_value = {r.value: r for r in rows}
    for i in (0, 99, 100, 999):
        row = by_value[f"value-{i}".encode()]
        assert row.key == f"key-{i % 7}".encode()
        assert [(h.key, h.value) for h in row.headers] == [("id", str(i).encode())]
        if i < 100:
            assert row.partition == 2  # the partition column wins
    # Rows without a partition go where Kafka's producer would put their key (murmur2).
    from clients.common.partitioner import partition_for_key

    assert all(r.partition == partition_for_key(r.key, 3) for r in rows if int(r.value[6:]) >= 100)


def test_leader_and_gateway_fetches_read_the_same_rows(spark: Any, cluster: TestCluster) -> None:
    """Tasks fetch from partition leaders by default; highwater.fetch.from.leaders=false goes through
    the gateway. Small Fetches (many per task) and a start inside a batch exercise the range cuts."""
    bootstrap = cluster.gateway_address
    create_topic(bootstrap, "read-paths", 2)
    produce(
        bootstrap,
        "read-paths",
        [(i % 2, None if i % 3 else f"k{i}".encode(), b"v" * (i % 50), []) for i in range(900)],
    )
    options = read_options(
        bootstrap,
        subscribe="read-paths",
        startingOffsets='{"read-paths": {"0": 7, "1": 0}}',
        endingOffsets='{"read-paths": {"0": 440, "1": -1}}',
        **{"highwater.fetch.max.bytes": 4096},
    )
    # By default tasks read from the leaders' files (short-circuit local reads).
    direct = spark.read.format("highwater").options(**options).load()
    fetched = spark.read.format("highwater").options(**options, **{"highwater.local.reads": "false"}).load()
    through_gateway = (
        spark.read.format("highwater").options(**options, **{"highwater.fetch.from.leaders": "false"}).load()
    )
    columns = ["partition", "offset", "key", "value", "topic", "timestamp", "timestampType"]
    rows = sorted(tuple(r) for r in direct.select(*columns).collect())  # (partition, offset) are unique
    assert rows == sorted(tuple(r) for r in through_gateway.select(*columns).collect())
    assert rows == sorted(tuple(r) for r in fetched.select(*columns).collect())
    assert len(rows) == (440 - 7) + 450
    assert {r[0] for r in rows if r[1] < 7} == {1}


def test_local_reads_take_the_leaders_files_here_and_bytes_from_another_host(
    cluster: TestCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Short-circuit local reads (clients/common/transport/local_reads.py): on the leaders' host a
    task reads the records from their segment files; a leader on another host (as its boot id says)
    is asked for bytes from then on. The rows are the same either way."""
    import spark_connector.gateway as gateway_module
    from clients.common.transport import local_reads
    from spark_connector.gateway import GatewayClient
    from spark_connector.options import parse_read_options
    from spark_connector.planning import OffsetRange
    from spark_connector.reader import read_range

    bootstrap = cluster.gateway_address
    create_topic(bootstrap, "read-local", 1)
    # 30 batches of 100 records (a 4 KiB Fetch takes a few of them), each written as one encoded
    # batch: the Producer, with linger 0, may split a run of sends in two on a loaded machine
    # (CI once stored 31 batches, 61 bytes more than the size asserted below).
    gw = gateway_stub(bootstrap)
    for first in range(0, 3000, 100):
        result = produce_one_batch(gw, "read-local", 0, [b"x%d" % i for i in range(first, first + 100)])
        assert result.error_code == 0, result
    options = parse_read_options(
        read_options(bootstrap, subscribe="read-local", **{"highwater.fetch.max.bytes": 4096}),
        streaming=False,
    )
    expected = [b"x%d" % i for i in range(3000)]
    located: list[int] = []

    def counting_read(location: Any) -> bytes:
        data = local_reads.read_located(location)
        located.append(len(data))
        return data

    monkeypatch.setattr(gateway_module, "read_located", counting_read)
    with GatewayClient(bootstrap, options.client) as client:
        batches = list(read_range(client, OffsetRange("read-local", 0, 0, 3000), options))
        assert not client._remote_leaders
    assert [v for b in batches for v in b.column("value").to_pylist()] == expected
    # A located read covers up to LOCAL_READ_BYTES (all of it here), decoded in fetch.max.bytes groups.
    assert located == [37_800]  # the whole log (30 batches) in one read
    assert len(batches) > 5 and all(b.num_rows <= 400 for b in batches)  # 4 KiB groups: 3 batches each

    located.clear()
    monkeypatch.setattr(local_reads, "host_id", lambda: "another-host")
    with GatewayClient(bootstrap, options.client) as client:
        batches = list(read_range(client, OffsetRange("read-local", 0, 0, 3000), options))
        assert len(client._remote_leaders) == 1
    assert [v for b in batches for v in b.column("value").to_pylist()] == expected
    assert located == []  # refused once (another host), then never asked again


def test_a_stale_leader_hint_costs_one_answer_then_the_leader_is_looked_up(cluster: TestCluster) -> None:
    """Tasks fetch from the leader the driver planned with (HighwaterInputPartition.leader); a
    broker that no longer leads answers NOT_LEADER_OR_FOLLOWER and the task asks the gateway."""
    from spark_connector.gateway import GatewayClient
    from spark_connector.options import parse_read_options
    from spark_connector.planning import OffsetRange
    from spark_connector.reader import read_range

    bootstrap = cluster.gateway_address
    create_topic(bootstrap, "read-hint", 1)
    produce(bootstrap, "read-hint", [(0, None, b"h%d" % i, []) for i in range(500)])
    options = parse_read_options(read_options(bootstrap, subscribe="read-hint"), streaming=False)
    with GatewayClient(bootstrap, options.client) as client:
        client.partitions(["read-hint"])
        leader = client.known_leaders()[("read-hint", 0)]
        brokers = {f"{b.host}:{b.port}" for b in client.metadata(["read-hint"]).brokers}
    (not_leader,) = sorted(brokers - {leader})[:1]
    with GatewayClient(bootstrap, options.client) as client:
        client.hint_leader(("read-hint", 0), not_leader)
        batches = list(read_range(client, OffsetRange("read-hint", 0, 0, 500), options))
        assert client.known_leaders()[("read-hint", 0)] == leader
    assert [v for b in batches for v in b.column("value").to_pylist()] == [b"h%d" % i for i in range(500)]


def test_an_unreachable_leader_is_read_through_the_gateway(cluster: TestCluster) -> None:
    """A leader address that accepts no connection (brokers hidden behind the gateway) costs one
    connect timeout, then the task reads through the gateway."""
    from spark_connector.gateway import GatewayClient
    from spark_connector.options import ClientSettings, parse_read_options
    from spark_connector.planning import OffsetRange
    from spark_connector.reader import read_range

    bootstrap = cluster.gateway_address
    create_topic(bootstrap, "read-fallback", 1)
    produce(bootstrap, "read-fallback", [(0, None, b"x%d" % i, []) for i in range(300)])
    options = parse_read_options(read_options(bootstrap, subscribe="read-fallback"), streaming=False)
    with GatewayClient(bootstrap, ClientSettings(fetch_max_bytes=2048)) as client:
        client.hint_leader(
            ("read-fallback", 0), "127.0.0.1:1"
        )  # as if Metadata named an address we cannot reach
        batches = list(read_range(client, OffsetRange("read-fallback", 0, 0, 300), options))
        assert "127.0.0.1:1" in client._unreachable_leaders
    assert [v for b in batches for v in b.column("value").to_pylist()] == [b"x%d" % i for i in range(300)]
