"""A job ported from format("kafka") keeps its options:
each works with Kafka's meaning, is accepted where it changes nothing here, or is refused by name.

Every row of docs/SPARK.md's "Options of Spark's Kafka source" table is exercised here
against the real cluster: the supported ones by what they do (a read that uses only Kafka's
names, batches in the log compressed with zstd and cut at kafka.batch.size, a micro-batch
skipped below minOffsetsPerTrigger until maxTriggerDelay passes, a subscribePattern matching
no topic reading nothing until one appears), the ones with no effect by a job that passes them
and reads the same rows, kafka.security.protocol=SSL with PEM, PKCS12 and (keytool-made) JKS stores and the
kafka.group.id ACL check on a TLS cluster with the ACL authorizer, and the refused ones by the
error naming them and saying what to use instead.
"""

from __future__ import annotations

import itertools
import shutil
import struct
import subprocess
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.serialization import pkcs12
from pyspark.sql import functions as F

from clients.admin import Admin
from clients.common.records import Record, encode_batch
from clients.tools.cli import cli
from protos.highwater.v1 import common_pb2
from spark_connector.gateway import GatewayClient
from spark_connector.options import ClientSettings
from tests.integration.conftest import TEST_LEASE_TTL_S, TestCluster
from tests.spark.helpers import consume_all, create_topic, produce, wait_until_written

pytestmark = pytest.mark.integration

QUERY_TIMEOUT_S = 90
# Kafka's record batch header (v2): attributes at byte 21, the record count at byte 57.
BATCH_ATTRIBUTES_AT = 21
BATCH_RECORDS_AT = 57
ZSTD_CODEC = 4
# minOffsetsPerTrigger / maxTriggerDelay test: a trigger every TRIGGER_MS; a delayed batch must
# come no sooner than DELAY_MS after the one before (less what planning a trigger may shift it).
TRIGGER_MS = 200
DELAY_MS = 3_000
PLANNING_SLACK_MS = 500
KEYTOOL_TIMEOUT_S = 60


@pytest.fixture(scope="module")
def refusal_topics(cluster: TestCluster) -> None:
    """The topics the refusal tests name (refused options fail before anything is read or written)."""
    create_topic(cluster.gateway_address, "kopt-refused", 1)
    create_topic(cluster.gateway_address, "kopt-wrefused", 1)


def _fails(action: Any, *named: str) -> str:
    with pytest.raises(Exception) as info:
        action()
    message = str(info.value)
    for name in named:
        assert name in message, f"{name!r} not in: {message[:3000]}"
    return message


def log_batches(bootstrap: str, topic: str, partition: int) -> list[tuple[int, int]]:
    """(attributes, record count) of every record batch of one partition, read raw."""
    out: list[tuple[int, int]] = []
    offset = 0
    with GatewayClient(bootstrap, ClientSettings()) as client:
        end = client.list_offsets({(topic, partition): -1})[(topic, partition)][0]
        while offset < end:
            part = (
                client.call("Fetch", client.fetch_request((topic, partition), offset, 1 << 20))
                .topics[0]
                .partitions[0]
            )
            data = bytes(part.records)
            assert data, f"no records at {topic}-{partition} offset {offset}"
            at = 0
            while at + 61 <= len(data):
                base, length = struct.unpack_from(">qi", data, at)
                if at + 12 + length > len(data):
                    break
                attributes = struct.unpack_from(">h", data, at + BATCH_ATTRIBUTES_AT)[0]
                count = struct.unpack_from(">i", data, at + BATCH_RECORDS_AT)[0]
                out.append((attributes, count))
                offset = base + count
                at += 12 + length
    return out


# --- reading ----------------------------------------------------------------------------------


def test_a_read_with_only_kafka_option_names_reads_the_topic(spark: Any, cluster: TestCluster) -> None:
    bootstrap = cluster.gateway_address
    create_topic(bootstrap, "kopt-read", 2)
    produce(bootstrap, "kopt-read", [(i % 2, None, f"v{i}".encode(), [("h", b"x")]) for i in range(100)])
    df = (
        spark.read.format("highwater")
        .option("kafka.bootstrap.servers", bootstrap)  # instead of bootstrap
        .option("subscribe", "kopt-read")
        .option("kafka.request.timeout.ms", "20000")
        .option("kafka.max.partition.fetch.bytes", "1024")  # tiny Fetches: many per partition
        .option("kafka.fetch.max.bytes", "1024")
        .option("kafkaConsumer.pollTimeoutMs", "20000")
        .option("minPartitions", "4")
        .option("maxRecordsPerPartition", "20")  # 50 per partition: 3 tasks each
        .option("failOnDataLoss", "true")
        .option("includeHeaders", "true")
        .option("maxOffsetsPerTrigger", "10")  # accepted and ignored in batch, as in Spark
        .load()
    )
    rows = df.collect()
    assert sorted(r.value for r in rows) == sorted(f"v{i}".encode() for i in range(100))
    assert df.rdd.getNumPartitions() == 6
    assert {tuple((h.key, h.value) for h in r.headers) for r in rows} == {(("h", b"x"),)}


def test_subscription_and_ending_timestamp_options_read_what_spark_says(
    spark: Any, cluster: TestCluster
) -> None:
    bootstrap = cluster.gateway_address
    create_topic(bootstrap, "kopt-span", 2)
    produce(bootstrap, "kopt-span", [(i % 2, None, f"v{i}".encode(), []) for i in range(100)])
    future_ms = int(time.time() * 1000) + 3_600_000

    def count(**options: str) -> int:
        return int(
            spark.read.format("highwater")
            .option("kafka.bootstrap.servers", bootstrap)
            .options(**options)
            .load()
            .count()
        )

    assert count(subscribePattern="kopt-sp.n") == 100
    assert count(assign='{"kopt-span": [1]}') == 50
    assert count(subscribe="kopt-span", endingTimestamp=str(future_ms)) == 100  # none after it: to the end
    assert count(subscribe="kopt-span", endingTimestamp="0") == 0  # every record is at or after 0
    assert (
        count(
            subscribe="kopt-span", endingOffsetsByTimestamp=f'{{"kopt-span": {{"0": 0, "1": {future_ms}}}}}'
        )
        == 50
    )


@pytest.mark.parametrize(
    ("option", "value", "named"),
    [
        ("kafka.auto.offset.reset", "earliest", ["kafka.auto.offset.reset", "startingOffsets"]),
        ("kafka.enable.auto.commit", "true", ["kafka.enable.auto.commit", "checkpoint"]),
        ("kafka.key.deserializer", "x.Y", ["kafka.key.deserializer", "binary"]),
        ("kafka.value.deserializer", "x.Y", ["kafka.value.deserializer", "binary"]),
        ("kafka.interceptor.classes", "x.Y", ["kafka.interceptor.classes", "no Highwater meaning"]),
        (
            "kafka.security.protocol",
            "SSL",
            ["kafka.security.protocol", "no CA", "kafka.ssl.truststore.location"],
        ),
        (
            "kafka.security.protocol",
            "SASL_SSL",
            ["kafka.security.protocol", "highwater.auth.token", "not SASL"],
        ),
        (
            "kafka.ssl.truststore.location",
            "/x.p12",
            ["kafka.ssl.truststore.location", "security.protocol=SSL"],
        ),
        ("kafka.ssl.cipher.suites", "X", ["kafka.ssl.cipher.suites", "no Highwater meaning"]),
        ("kafka.sasl.mechanism", "PLAIN", ["kafka.sasl.mechanism", "highwater.auth.token"]),
        ("kafka.isolation.level", "snapshot", ["kafka.isolation.level", "read_uncommitted, read_committed"]),
        ("kafka.retries", "3", ["kafka.retries", "producer setting"]),
        ("kafka.default.api.timeout.ms", "1000", ["kafka.default.api.timeout.ms", "no Highwater meaning"]),
        ("kafka.acks", "all", ["kafka.acks", "producer setting", "this is a read"]),
        ("kafka.compression.type", "zstd", ["kafka.compression.type", "producer setting"]),
        ("kafka.batch.size", "1024", ["kafka.batch.size", "producer setting"]),
        ("kafka.linger.ms", "5", ["kafka.linger.ms", "producer setting"]),
        ("kafka.max.request.size", "1048576", ["kafka.max.request.size", "producer setting"]),
        ("kafka.delivery.timeout.ms", "1000", ["kafka.delivery.timeout.ms", "producer setting"]),
        ("kafka.enable.idempotence", "true", ["kafka.enable.idempotence", "producer setting"]),
        ("fetchOffset.numRetries", "3", ["fetchOffset.numRetries", "highwater.retry.timeout.ms"]),
        ("fetchOffset.retryIntervalMs", "10", ["fetchOffset.retryIntervalMs", "highwater.retry.timeout.ms"]),
        ("maxTriggerDelay", "5s", ["maxTriggerDelay", "minOffsetsPerTrigger"]),
    ],
)
def test_kafka_read_options_without_a_highwater_meaning_are_refused_by_name(
    spark: Any, cluster: TestCluster, refusal_topics: None, option: str, value: str, named: list[str]
) -> None:
    bootstrap = cluster.gateway_address
    _fails(
        lambda: (
            spark.read.format("highwater")
            .option("bootstrap", bootstrap)
            .option("subscribe", "kopt-refused")
            .option(option, value)
            .load()
            .count()
        ),
        *named,
    )


def test_offsets_json_leaving_out_a_partition_is_refused_as_spark_refuses_it(
    spark: Any, cluster: TestCluster, tmp_path: Any
) -> None:
    bootstrap = cluster.gateway_address
    create_topic(bootstrap, "kopt-partial", 2)
    produce(bootstrap, "kopt-partial", [(i % 2, None, b"x", []) for i in range(10)])

    def read(**options: str) -> Any:
        return (
            spark.read.format("highwater")
            .options(bootstrap=bootstrap, subscribe="kopt-partial", **options)
            .load()
        )

    _fails(
        lambda: read(startingOffsets='{"kopt-partial": {"0": 1}}').count(),
        "option 'startingOffsets'",
        "leaves out kopt-partial-1",
        "every partition",
    )
    _fails(
        lambda: read(endingOffsets='{"kopt-partial": {"1": 3}}').count(),
        "option 'endingOffsets'",
        "leaves out kopt-partial-0",
    )
    _fails(
        lambda: read(startingOffsets='{"kopt-partial": {"0": 0, "1": 0, "2": 0}}').count(),
        "option 'startingOffsets'",
        "names kopt-partial-2",
    )
    _fails(
        lambda: read(startingOffsetsByTimestamp='{"kopt-partial": {"0": 0}}').count(),
        "option 'startingOffsetsByTimestamp'",
        "leaves out kopt-partial-1",
    )
    # Every partition named: fine, -2 / -1 as Kafka's JSON has them.
    assert (
        read(
            startingOffsets='{"kopt-partial": {"0": 1, "1": -2}}',
            endingOffsets='{"kopt-partial": {"0": -1, "1": 3}}',
        ).count()
        == 4 + 3
    )
    # A stream is held to the same rule when it starts.
    query = (
        spark.readStream.format("highwater")
        .options(bootstrap=bootstrap, subscribe="kopt-partial", startingOffsets='{"kopt-partial": {"0": 1}}')
        .load()
        .writeStream.format("noop")
        .option("checkpointLocation", str(tmp_path / "cp"))
        .start()
    )
    _fails(
        lambda: query.awaitTermination(QUERY_TIMEOUT_S),
        "option 'startingOffsets'",
        "leaves out kopt-partial-1",
    )


def produce_at_once(bootstrap: str, topic: str, value: bytes, count: int) -> None:
    """`count` records to partition 0 in one record batch: they become readable all at once."""
    batch = encode_batch([Record(None, value, [], int(time.time() * 1000)) for _ in range(count)])
    request = common_pb2.ProduceRequest(
        acks=-1,
        timeout_ms=10_000,
        topics=[
            common_pb2.ProduceTopicData(
                topic=topic, partitions=[common_pb2.ProducePartitionData(partition=0, records=batch)]
            )
        ],
    )
    with GatewayClient(bootstrap, ClientSettings()) as client:
        answer = client.call("Produce", request).topics[0].partitions[0]
    assert answer.error_code == common_pb2.NONE, answer


def test_min_offsets_per_trigger_waits_for_enough_records_or_max_trigger_delay(
    spark: Any, cluster: TestCluster, tmp_path: Any
) -> None:
    """Spark's rule: a trigger is skipped while fewer than minOffsetsPerTrigger offsets are available,
    unless maxTriggerDelay has passed since the last batch (the first trigger after a start is not
    delayed); maxOffsetsPerTrigger still caps each batch. Records arrive in single batches, so what
    a trigger sees does not depend on when it looks."""
    bootstrap = cluster.gateway_address
    create_topic(bootstrap, "kopt-min", 1)
    produce_at_once(bootstrap, "kopt-min", b"a", 100)
    minimum, maximum = 300, 500
    query = (
        spark.readStream.format("highwater")
        .options(
            bootstrap=bootstrap,
            subscribe="kopt-min",
            startingOffsets="earliest",
            minOffsetsPerTrigger=str(minimum),
            maxOffsetsPerTrigger=str(maximum),
            maxTriggerDelay=f"{DELAY_MS}ms",
        )
        .load()
        .writeStream.format("noop")
        .option("checkpointLocation", str(tmp_path / "cp"))
        .trigger(processingTime=f"{TRIGGER_MS} milliseconds")
        .start()
    )

    def batches() -> list[tuple[float, int]]:
        """(trigger start in s, rows) of every micro-batch that read something."""
        return [
            (datetime.fromisoformat(p["timestamp"].replace("Z", "+00:00")).timestamp(), p["numInputRows"])
            for p in query.recentProgress
            if p["numInputRows"]
        ]

    def wait_rows(total: int) -> None:
        deadline = time.monotonic() + QUERY_TIMEOUT_S
        while sum(n for _, n in batches()) < total:
            assert query.exception() is None, query.exception()
            assert time.monotonic() < deadline, f"the query read {batches()} of {total} rows"
            time.sleep(TRIGGER_MS / 1000)

    try:
        wait_rows(100)  # the first trigger is not delayed: all 100, though fewer than the minimum
        produce_at_once(bootstrap, "kopt-min", b"b", 50)
        wait_rows(150)  # 50 < minimum: read only once maxTriggerDelay has passed
        produce_at_once(bootstrap, "kopt-min", b"c", 700)
        wait_rows(850)  # 700 >= minimum: capped at maxOffsetsPerTrigger; the 200 left wait again
    finally:
        query.stop()
    seen = batches()
    assert [n for _, n in seen] == [100, 50, maximum, 200]
    # The documented rule, batch by batch: fewer than the minimum only after maxTriggerDelay.
    for (before, _), (at, rows) in itertools.pairwise(seen):
        assert rows >= minimum or (at - before) * 1000 >= DELAY_MS - PLANNING_SLACK_MS, seen


# --- writing ----------------------------------------------------------------------------------


def test_kafka_producer_settings_apply_to_writes(spark: Any, cluster: TestCluster) -> None:
    bootstrap = cluster.gateway_address
    create_topic(bootstrap, "kopt-write", 1)
    rows = spark.range(400).select(
        F.format_string("value-%05d", F.col("id")).alias("value"),
        F.array(F.struct(F.lit("h").alias("key"), F.lit(b"x").cast("binary").alias("value"))).alias(
            "headers"
        ),
    )
    (
        rows.coalesce(1)
        .write.format("highwater")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("topic", "kopt-write")
        .option("kafka.acks", "all")
        .option("kafka.compression.type", "zstd")
        .option("kafka.batch.size", "1024")
        .option("kafka.linger.ms", "5")
        .option("kafka.max.request.size", "65536")
        .option("kafka.request.timeout.ms", "20000")
        .option("kafka.delivery.timeout.ms", "60000")
        .option("includeHeaders", "true")
        .mode("append")
        .save()
    )
    written = consume_all(bootstrap, "kopt-write")
    assert sorted(r.value or b"" for r in written) == [f"value-{i:05d}".encode() for i in range(400)]
    assert {tuple(r.headers) for r in written} == {(("h", b"x"),)}
    batches = log_batches(bootstrap, "kopt-write", 0)
    assert {attributes & 0x7 for attributes, _ in batches} == {ZSTD_CODEC}  # kafka.compression.type
    # kafka.batch.size: ~40 records of ~27 bytes fill 1 KiB; without it one batch would take all 400.
    assert len(batches) >= 5 and max(count for _, count in batches) < 60

    # acks=0: nothing is acknowledged, yet the records arrive.
    create_topic(bootstrap, "kopt-acks0", 1)
    (
        spark.range(50)
        .select(F.col("id").cast("string").alias("value"))
        .write.format("highwater")
        .option("bootstrap", bootstrap)
        .option("topic", "kopt-acks0")
        .option("kafka.acks", "0")
        .mode("append")
        .save()
    )
    wait_until_written(bootstrap, "kopt-acks0", {str(i).encode() for i in range(50)}, QUERY_TIMEOUT_S)

    # kafka.max.request.size also bounds one record, as Kafka's producer refuses a larger one.
    big = spark.range(1).select(F.repeat(F.lit("x"), 4000).alias("value"))
    _fails(
        lambda: (
            big.write.format("highwater")
            .option("bootstrap", bootstrap)
            .option("topic", "kopt-write")
            .option("kafka.max.request.size", "2048")
            .mode("append")
            .save()
        ),
        "kafka.max.request.size",
        "4016 bytes",
    )


@pytest.mark.parametrize(
    ("option", "value", "named"),
    [
        (
            "kafka.enable.idempotence",
            "false",
            ["kafka.enable.idempotence", "always idempotent", "duplicates"],
        ),
        ("kafka.transactional.id", "t", ["kafka.transactional.id", "deliveryGuarantee=exactly-once"]),
        ("kafka.key.serializer", "x.Y", ["kafka.key.serializer", "no Highwater meaning"]),
        ("kafka.value.serializer", "x.Y", ["kafka.value.serializer", "no Highwater meaning"]),
        ("kafka.partitioner.class", "x.Y", ["kafka.partitioner.class", "'partition' column"]),
        (
            "kafka.max.in.flight.requests.per.connection",
            "6",
            ["kafka.max.in.flight.requests.per.connection", "5"],
        ),
        ("kafka.security.protocol", "SASL_SSL", ["kafka.security.protocol", "highwater.auth.token"]),
        ("kafka.group.id", "g", ["kafka.group.id", "consumer setting"]),
        ("groupIdPrefix", "g", ["groupIdPrefix", "this is a write"]),
        ("kafka.max.poll.records", "500", ["kafka.max.poll.records", "consumer setting"]),
        ("kafka.fetch.max.bytes", "1024", ["kafka.fetch.max.bytes", "consumer setting"]),
        ("kafka.interceptor.classes", "x.Y", ["kafka.interceptor.classes", "no Highwater meaning"]),
        ("kafka.ssl.keystore.location", "/x.p12", ["kafka.ssl.keystore.location", "security.protocol=SSL"]),
        ("kafka.max.partition.fetch.bytes", "1024", ["kafka.max.partition.fetch.bytes", "consumer setting"]),
        ("kafka.acks", "2", ["kafka.acks", "all, 1 or 0"]),
        ("kafka.compression.type", "producer", ["kafka.compression.type", "zstd"]),
    ],
)
def test_kafka_write_options_without_a_highwater_meaning_are_refused_by_name(
    spark: Any, cluster: TestCluster, refusal_topics: None, option: str, value: str, named: list[str]
) -> None:
    bootstrap = cluster.gateway_address
    values = spark.range(3).select(F.col("id").cast("string").alias("value"))
    _fails(
        lambda: (
            values.write.format("highwater")
            .option("bootstrap", bootstrap)
            .option("topic", "kopt-wrefused")
            .option(option, value)
            .mode("append")
            .save()
        ),
        *named,
    )


# --- settings a ported job passes that change nothing here, kafka.group.id ----------------------


def test_kafka_settings_with_no_effect_and_group_ids_are_accepted(spark: Any, cluster: TestCluster) -> None:
    """PLAINTEXT, client.id, the group options and the consumer/producer tuning a ported job carries
    are accepted (docs/SPARK.md says why each changes nothing), and the data is the same."""
    bootstrap = cluster.gateway_address
    create_topic(bootstrap, "kopt-ported", 2)
    tuning = {
        "kafka.bootstrap.servers": bootstrap,
        "kafka.security.protocol": "PLAINTEXT",
        "kafka.client.id": "ported-etl",
        "kafka.retry.backoff.ms": "100",
    }
    (
        spark.range(60)
        .select(F.format_string("p-%02d", F.col("id")).alias("value"))
        .write.format("highwater")
        .options(**tuning)
        .option("topic", "kopt-ported")
        .option("kafka.retries", "0")
        .option("kafka.enable.idempotence", "true")
        .option("kafka.max.in.flight.requests.per.connection", "5")
        .option("kafka.buffer.memory", "33554432")
        .mode("append")
        .save()
    )
    expected = sorted(f"p-{i:02d}".encode() for i in range(60))
    assert sorted(r.value or b"" for r in consume_all(bootstrap, "kopt-ported")) == expected
    for group in ({"kafka.group.id": "ported-etl"}, {"groupIdPrefix": "ported"}):
        rows = (
            spark.read.format("highwater")
            .options(**tuning, **group)
            .option("subscribe", "kopt-ported")
            .option("kafka.max.poll.records", "7")
            .option("kafka.session.timeout.ms", "30000")
            .option("kafka.heartbeat.interval.ms", "3000")
            .option("kafka.fetch.min.bytes", "1")
            .option("kafka.fetch.max.wait.ms", "500")
            .option("kafka.isolation.level", "read_uncommitted")
            .load()
            .collect()
        )
        assert sorted(r.value for r in rows) == expected, group


def test_a_pattern_matching_no_topic_reads_nothing_until_one_appears(
    spark: Any, cluster: TestCluster, tmp_path: Any
) -> None:
    """As Spark's Kafka source: a batch query gets an empty DataFrame with the schema; a stream gets
    no rows until a topic matching the pattern appears, then reads it from its earliest offset."""
    bootstrap = cluster.gateway_address
    batch = (
        spark.read.format("highwater")
        .options(bootstrap=bootstrap, subscribePattern="kopt-nomatch-.*", includeHeaders="true")
        .load()
    )
    assert batch.collect() == []
    assert batch.columns == [
        "key",
        "value",
        "topic",
        "partition",
        "offset",
        "timestamp",
        "timestampType",
        "headers",
    ]
    query = (
        spark.readStream.format("highwater")
        .options(bootstrap=bootstrap, subscribePattern="kopt-later-.*", startingOffsets="earliest")
        .load()
        .writeStream.format("memory")
        .queryName("kopt_later")
        .option("checkpointLocation", str(tmp_path / "cp"))
        .trigger(processingTime=f"{TRIGGER_MS} milliseconds")
        .start()
    )
    try:
        deadline = time.monotonic() + QUERY_TIMEOUT_S
        while len(query.recentProgress) < 2:  # triggers ran with no topic to read
            assert query.exception() is None, query.exception()
            assert time.monotonic() < deadline, "the stream made no progress without a matching topic"
            time.sleep(TRIGGER_MS / 1000)
        assert spark.sql("select * from kopt_later").count() == 0
        create_topic(bootstrap, "kopt-later-1", 1)
        produce(bootstrap, "kopt-later-1", [(0, None, f"l{i}".encode(), []) for i in range(5)])
        while spark.sql("select * from kopt_later").count() < 5:
            assert query.exception() is None, query.exception()
            assert time.monotonic() < deadline, "the stream did not read the topic that appeared"
            time.sleep(TRIGGER_MS / 1000)
        values = sorted(r.value for r in spark.sql("select value from kopt_later").collect())
        assert values == [f"l{i}".encode() for i in range(5)]
    finally:
        query.stop()


# --- kafka.security.protocol=SSL and kafka.ssl.* on a TLS cluster with the ACL authorizer -------

STORE_PASSWORD = "changeit"


@pytest.fixture(scope="module")
def tls_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestCluster]:
    """TLS everywhere and `--authorizer acl`: User:alice (a client certificate) may read and write the
    kssl- topics and use the groups named ported-*; nothing else."""
    c = TestCluster(
        tmp_path_factory.mktemp("kafka-ssl"),
        brokers=1,
        lease_ttl_s=TEST_LEASE_TTL_S,
        tls=True,
        service_args=["--authorizer", "acl", "--super-users", "User:admin"],
    )
    c.start()
    try:
        c.issue_client_certificate("alice")
        with Admin(c.gateway_address, **c.client_settings("admin")) as admin:
            admin.create_topics("kssl-data", 1, 1)
        for args in (
            ["--operation", "Read", "--operation", "Write", "--topic", "kssl-", "--prefixed"],
            ["--operation", "Read", "--group", "ported-", "--prefixed"],
        ):
            result = CliRunner().invoke(
                cli,
                [
                    *("--bootstrap", c.gateway_address, "--tls-dir", str(c.tls_dir), "acl", "add"),
                    *("--principal", "User:alice", *args),
                ],
            )
            assert result.exit_code == 0, result.output
        yield c
    finally:
        c.stop()


def kafka_stores(c: TestCluster, directory: Path) -> dict[str, dict[str, str]]:
    """alice's certificate as Kafka's clients take it: PEM stores, password-protected PKCS12 ones, and
    JKS ones made from those by Java's keytool when it is installed."""
    tls = Path(str(c.tls_dir))
    ca = x509.load_pem_x509_certificate((tls / "ca.pem").read_bytes())
    cert = x509.load_pem_x509_certificate((tls / "alice.pem").read_bytes())
    key = serialization.load_pem_private_key((tls / "alice-key.pem").read_bytes(), None)
    encryption = serialization.BestAvailableEncryption(STORE_PASSWORD.encode())
    (directory / "alice.p12").write_bytes(
        pkcs12.serialize_key_and_certificates(b"alice", key, cert, [ca], encryption)  # type: ignore[arg-type]
    )
    (directory / "trust.p12").write_bytes(
        pkcs12.serialize_key_and_certificates(b"ca", None, None, [ca], encryption)
    )
    (directory / "alice-keystore.pem").write_bytes(
        (tls / "alice-key.pem").read_bytes() + (tls / "alice.pem").read_bytes()
    )
    ssl = {"kafka.bootstrap.servers": c.gateway_address, "kafka.security.protocol": "SSL"}
    return {
        "PEM": {
            **ssl,
            "kafka.ssl.truststore.type": "PEM",
            "kafka.ssl.truststore.location": str(tls / "ca.pem"),
            "kafka.ssl.keystore.type": "PEM",
            "kafka.ssl.keystore.location": str(directory / "alice-keystore.pem"),
        },
        "PKCS12": {
            **ssl,
            "kafka.ssl.truststore.type": "PKCS12",
            "kafka.ssl.truststore.location": str(directory / "trust.p12"),
            "kafka.ssl.truststore.password": STORE_PASSWORD,
            "kafka.ssl.keystore.type": "PKCS12",
            "kafka.ssl.keystore.location": str(directory / "alice.p12"),
            "kafka.ssl.keystore.password": STORE_PASSWORD,
            "kafka.ssl.key.password": STORE_PASSWORD,
            "kafka.ssl.endpoint.identification.algorithm": "https",
        },
        **_jks_stores(directory, tls / "ca.pem", ssl),
    }


def _keytool(*arguments: str) -> None:
    """Java's keytool, writing JKS files protected by STORE_PASSWORD."""
    if "-importcert" in arguments:
        arguments = (*arguments, "-storetype", "JKS", "-storepass", STORE_PASSWORD)
    subprocess.run(["keytool", *arguments], check=True, capture_output=True, timeout=KEYTOOL_TIMEOUT_S)


def _jks_stores(directory: Path, ca: Path, ssl: dict[str, str]) -> dict[str, dict[str, str]]:
    """{"JKS": options} with stores made by keytool (-storetype JKS), or {} without Java."""
    if shutil.which("keytool") is None:
        return {}
    trust, keys = directory / "trust.jks", directory / "alice.jks"
    trust.unlink(missing_ok=True)
    keys.unlink(missing_ok=True)
    # A PKCS12 file's bare certificates are not imported as trusted entries: import the CA itself.
    _keytool("-importcert", "-noprompt", "-alias", "ca", "-file", str(ca), "-keystore", str(trust))
    _keytool(
        *("-importkeystore", "-noprompt", "-srckeystore", str(directory / "alice.p12")),
        *("-srcstoretype", "PKCS12", "-srcstorepass", STORE_PASSWORD, "-destkeystore", str(keys)),
        *("-deststoretype", "JKS", "-deststorepass", STORE_PASSWORD),
    )
    return {
        "JKS": {
            **ssl,
            "kafka.ssl.truststore.location": str(directory / "trust.jks"),
            "kafka.ssl.truststore.password": STORE_PASSWORD,
            "kafka.ssl.keystore.location": str(directory / "alice.jks"),
            "kafka.ssl.keystore.password": STORE_PASSWORD,  # the type left out: JKS, Kafka's default
        }
    }


def test_ssl_stores_pem_pkcs12_and_jks_read_and_write_a_tls_cluster(
    spark: Any, tls_cluster: TestCluster, tmp_path: Path
) -> None:
    stores = kafka_stores(tls_cluster, tmp_path)
    (
        spark.range(30)
        .select(F.format_string("s-%02d", F.col("id")).alias("value"))
        .write.format("highwater")
        .options(**stores["PEM"])
        .option("topic", "kssl-data")
        .mode("append")
        .save()
    )
    expected = sorted(f"s-{i:02d}".encode() for i in range(30))
    for kind in [k for k in stores if k != "PEM"]:
        rows = spark.read.format("highwater").options(**stores[kind]).option("subscribe", "kssl-data").load()
        assert sorted(r.value for r in rows.collect()) == expected, kind


def test_a_group_the_principal_may_not_use_is_refused_by_name(
    spark: Any, tls_cluster: TestCluster, tmp_path: Path
) -> None:
    """kafka.group.id / groupIdPrefix are what group-based ACLs see: alice may use ported-* groups only."""
    options = {**kafka_stores(tls_cluster, tmp_path)["PKCS12"], "subscribe": "kssl-data"}
    assert (
        spark.read.format("highwater").options(**options, **{"kafka.group.id": "ported-etl"}).load().count()
        >= 0
    )
    assert spark.read.format("highwater").options(**options, groupIdPrefix="ported").load().count() >= 0
    _fails(
        lambda: (
            spark.read.format("highwater").options(**options, **{"kafka.group.id": "other"}).load().count()
        ),
        "option 'kafka.group.id'",
        "may not use group 'other'",
        "--group other",
    )
    _fails(
        lambda: spark.read.format("highwater").options(**options, groupIdPrefix="other").load().count(),
        "option 'groupIdPrefix'",
        "--prefixed",
    )
    query = (
        spark.readStream.format("highwater")
        .options(**options, **{"kafka.group.id": "other"})
        .load()
        .writeStream.format("noop")
        .option("checkpointLocation", str(tmp_path / "cp"))
        .start()
    )
    _fails(lambda: query.awaitTermination(QUERY_TIMEOUT_S), "option 'kafka.group.id'", "may not use group")
