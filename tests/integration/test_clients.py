"""The client library and the CLI against a real cluster (etcd, controller, 3 brokers, gateway).

Each test uses its own topic names on the module's shared cluster; the test that
restarts the gateway runs last.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import time

import pytest
from click.testing import CliRunner

from clients import (
    Admin,
    AsyncConsumer,
    AsyncProducer,
    Consumer,
    ConsumerRecord,
    Producer,
    TopicPartition,
)
from clients.common import errors
from clients.common.partitioner import partition_for_key
from clients.tools.cli import cli

pytestmark = pytest.mark.integration

FAST = {"request_timeout_ms": 10_000, "connect_timeout_ms": 5_000, "retry_backoff_ms": 50}


def consume_until(consumer: Consumer, count: int, timeout_s: float = 20.0) -> list[ConsumerRecord]:
    got: list[ConsumerRecord] = []
    deadline = time.monotonic() + timeout_s
    while len(got) < count:
        assert time.monotonic() < deadline, f"only {len(got)} of {count} records arrived in {timeout_s} s"
        got.extend(consumer.poll(timeout_ms=500))
    return got


def create(cluster, name: str, partitions: int = 3, replication_factor: int = 3, **configs: str) -> None:
    with Admin(cluster.gateway_address, **FAST) as admin:
        admin.create_topics(
            name, partitions, replication_factor, {k.replace("_", "."): v for k, v in configs.items()}
        )


def test_keyed_records_with_headers_come_back_identical_and_in_order_per_partition(cluster):
    create(cluster, "clients-roundtrip", min_insync_replicas="2")
    keys = [f"key-{i % 7}".encode() for i in range(300)]
    with Producer(cluster.gateway_address, **FAST) as producer:
        futures = [
            producer.send(
                "clients-roundtrip",
                f"value-{i}".encode(),
                key=keys[i],
                headers=[("seq", str(i).encode()), ("source", b"test")],
            )
            for i in range(300)
        ]
        producer.flush(timeout_ms=20_000)
        sent = [f.result(timeout=1) for f in futures]
        assert producer._core.sender.idempotence.producer_id >= 0, "InitProducerId through the gateway"
    for i, metadata in enumerate(sent):
        assert metadata.partition == partition_for_key(keys[i], 3), "Kafka's key -> partition mapping"
    with Consumer(bootstrap=cluster.gateway_address, auto_offset_reset="earliest", **FAST) as consumer:
        consumer.assign([TopicPartition("clients-roundtrip", p) for p in range(3)])
        received = consume_until(consumer, 300)
    assert len(received) == 300
    by_seq = {int(dict(r.headers)["seq"]): r for r in received}
    for i, metadata in enumerate(sent):
        record = by_seq[i]
        assert (record.key, record.value) == (keys[i], f"value-{i}".encode())
        assert record.headers == [("seq", str(i).encode()), ("source", b"test")]
        assert (record.partition, record.offset) == (metadata.partition, metadata.offset)
        assert record.timestamp_ms == metadata.timestamp_ms
    for partition in range(3):
        in_partition = [r for r in received if r.partition == partition]
        seqs = [int(dict(r.headers)["seq"]) for r in in_partition]
        assert seqs == sorted(seqs), "records of a partition come back in send order"
        assert [r.offset for r in in_partition] == list(range(len(in_partition)))


def test_bulk_send_and_compression(cluster):
    create(cluster, "clients-bulk", partitions=2)
    values = [i.to_bytes(4, "big") * 25 for i in range(20_000)]
    with Producer(cluster.gateway_address, compression="zstd", **FAST) as producer:
        sent = producer.send_batch("clients-bulk", values).result(timeout=30)
    assert len(sent) == 20_000
    assert {m.partition for m in sent} == {0, 1}, "keyless runs spread over partitions"
    with Consumer(bootstrap=cluster.gateway_address, auto_offset_reset="earliest", **FAST) as consumer:
        consumer.assign([TopicPartition("clients-bulk", p) for p in range(2)])
        received = consume_until(consumer, 20_000, timeout_s=60)
    assert sorted(r.value for r in received) == sorted(values)
    where = {(m.partition, m.offset): values[i] for i, m in enumerate(sent)}
    assert all(where[(r.partition, r.offset)] == r.value for r in received)


def test_acks_one_and_zero(cluster):
    create(cluster, "clients-acks", partitions=1)
    with Producer(cluster.gateway_address, acks=1, enable_idempotence=False, **FAST) as producer:
        assert producer.send("clients-acks", b"one").result(timeout=10).offset == 0
    with Producer(cluster.gateway_address, acks=0, enable_idempotence=False, **FAST) as producer:
        assert producer.send("clients-acks", b"zero").result(timeout=10).offset == -1, "acks=0: nobody says"
    with Consumer(bootstrap=cluster.gateway_address, auto_offset_reset="earliest", **FAST) as consumer:
        consumer.assign([TopicPartition("clients-acks", 0)])
        assert [r.value for r in consume_until(consumer, 2)] == [b"one", b"zero"]


def test_commit_and_committed_offsets_resume_a_group(cluster):
    create(cluster, "clients-commit", partitions=2)
    with Producer(cluster.gateway_address, **FAST) as producer:
        for i in range(40):
            producer.send("clients-commit", f"r{i}".encode(), partition=i % 2)
        producer.flush(timeout_ms=20_000)
    tp0, tp1 = TopicPartition("clients-commit", 0), TopicPartition("clients-commit", 1)
    with Consumer(
        "clients-commit",
        bootstrap=cluster.gateway_address,
        group_id="g-commit",
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        **FAST,
    ) as consumer:
        first = consume_until(consumer, 40)
        assert consumer.committed(tp0) is None
        committed = consumer.commit({tp0: 5, tp1: 20})
        assert committed == {tp0: 5, tp1: 20}
        assert consumer.committed(tp0) == 5, "the NEXT offset to read, as Kafka stores it"
        assert consumer.position(tp1) == 20
        assert consumer.lag(tp0) == 0
    assert len(first) == 40
    with Consumer(
        "clients-commit",
        bootstrap=cluster.gateway_address,
        group_id="g-commit",
        auto_offset_reset="earliest",
        **FAST,
    ) as consumer:
        resumed = consume_until(consumer, 15)
        assert sorted((r.partition, r.offset) for r in resumed) == [(0, o) for o in range(5, 20)]
        assert consumer.position(tp0) == 20
    # close() with auto-commit on stored the positions.
    with Admin(cluster.gateway_address, **FAST) as admin:
        rows = {(r.topic, r.partition): r for r in admin.describe_group("g-commit")}
    assert rows[("clients-commit", 0)].committed_offset == 20
    assert rows[("clients-commit", 0)].lag == 0
    assert rows[("clients-commit", 1)].end_offset == 20


def test_seek_seek_to_beginning_end_and_timestamps(cluster):
    create(cluster, "clients-seek", partitions=1)
    tp = TopicPartition("clients-seek", 0)
    with Producer(cluster.gateway_address, **FAST) as producer:
        base = 1_700_000_000_000
        for i in range(10):
            producer.send("clients-seek", f"s{i}".encode(), partition=0, timestamp_ms=base + i * 1000)
        producer.flush(timeout_ms=20_000)
    with Consumer(bootstrap=cluster.gateway_address, auto_offset_reset="latest", **FAST) as consumer:
        consumer.assign([tp])
        assert consumer.position(tp) == 10, "latest: only records produced from now on"
        assert consumer.beginning_offsets([tp]) == {tp: 0}
        assert consumer.end_offsets([tp]) == {tp: 10}
        consumer.seek(tp, 7)
        assert [r.offset for r in consume_until(consumer, 3)] == [7, 8, 9]
        consumer.seek_to_beginning(tp)
        assert consume_until(consumer, 10)[0].value == b"s0"
        consumer.seek_to_end(tp)
        assert consumer.poll(timeout_ms=300) == []
        found = consumer.offsets_for_times({tp: base + 4500})
        assert found[tp] is not None and found[tp].offset == 5
        assert consumer.offsets_for_times({tp: base + 10**9})[tp] is None
        consumer.seek_to_timestamp(base + 2000)
        assert consume_until(consumer, 1)[0].offset == 2
        with pytest.raises(errors.InvalidRequest):
            consumer.seek(tp, -1)
        with pytest.raises(errors.InvalidRequest):
            consumer.seek(TopicPartition("clients-seek", 5), 0)


def test_describe_topics_cluster_and_admin_errors(cluster):
    with Admin(cluster.gateway_address, **FAST) as admin:
        created = admin.create_topics("clients-describe", 4, 3, {"min.insync.replicas": "2"})
        assert [(c.name, c.num_partitions, c.replication_factor) for c in created] == [
            ("clients-describe", 4, 3)
        ]
        assert "clients-describe" in admin.list_topics()
        [description] = admin.describe_topics("clients-describe")
        assert [p.partition for p in description.partitions] == [0, 1, 2, 3]
        for p in description.partitions:
            assert p.leader in p.replicas and p.leader in p.isr
            assert len(p.replicas) == 3 and sorted(p.isr) == sorted(p.replicas)
            assert p.leader_epoch >= 0
        cluster_description = admin.describe_cluster()
        assert sorted(b.node_id for b in cluster_description.brokers) == sorted(cluster.broker_ids)
        assert cluster_description.controller_id >= 0 and cluster_description.gateways
        with pytest.raises(errors.TopicAlreadyExists):
            admin.create_topics("clients-describe", 4, 3)
        with pytest.raises(errors.InvalidReplicationFactor, match="3"):
            admin.create_topics("clients-rf5", 1, 5)
        with pytest.raises(errors.UnknownTopicOrPartition):
            admin.describe_topics("clients-no-such-topic")
        with pytest.raises(errors.InvalidRequest):
            admin.create_topics("", 1, 1)
        admin.create_partitions("clients-describe", 6)
        assert len(admin.describe_topics("clients-describe")[0].partitions) == 6
        with pytest.raises(errors.InvalidPartitions):
            admin.create_partitions("clients-describe", 2)
        assert admin.list_partition_reassignments() == {} or isinstance(
            admin.list_partition_reassignments(), dict
        )
        outcome = admin.elect_leaders("preferred", [TopicPartition("clients-describe", 0)])
        assert set(outcome.values()) <= {"elected", "not needed"}


def test_async_producer_and_consumer(cluster):
    create(cluster, "clients-async", partitions=2)

    async def main() -> list[ConsumerRecord]:
        async with AsyncProducer(cluster.gateway_address, **FAST) as producer:
            futures = [await producer.send("clients-async", f"a{i}".encode(), key=b"one") for i in range(20)]
            await asyncio.gather(*futures)
        async with AsyncConsumer(
            bootstrap=cluster.gateway_address, auto_offset_reset="earliest", **FAST
        ) as consumer:
            consumer.assign([TopicPartition("clients-async", p) for p in range(2)])
            got: list[ConsumerRecord] = []
            deadline = time.monotonic() + 20
            while len(got) < 20 and time.monotonic() < deadline:
                got.extend(await consumer.poll(timeout_ms=500))
            return got

    got = asyncio.run(main())
    assert [r.value for r in got] == [f"a{i}".encode() for i in range(20)]


def test_cli_round_trip(cluster):
    runner = CliRunner()
    base = ["--bootstrap", cluster.gateway_address]
    result = runner.invoke(cli, [*base, "topic", "create", "clients-cli", "-p", "2", "-r", "3"])
    assert result.exit_code == 0, result.output
    result = runner.invoke(cli, [*base, "-o", "json", "topic", "describe", "clients-cli"])
    assert result.exit_code == 0, result.output
    [described] = json.loads(result.output)
    assert len(described["partitions"]) == 2 and all(p["leader"] >= 0 for p in described["partitions"])
    result = runner.invoke(
        cli, [*base, "produce", "clients-cli", "--key-separator", ":"], input="k1:hello\nk2:world\nk1:again\n"
    )
    assert result.exit_code == 0, result.output
    result = runner.invoke(
        cli,
        [
            *base,
            "-o",
            "json",
            "consume",
            "clients-cli",
            "--from-beginning",
            "--max-records",
            "3",
            "--group",
            "cli-group",
        ],
    )
    assert result.exit_code == 0, result.output
    lines = [json.loads(line) for line in result.output.splitlines() if line.startswith("{")]
    assert sorted((r["key"], r["value"]) for r in lines) == [
        ("k1", "again"),
        ("k1", "hello"),
        ("k2", "world"),
    ]
    result = runner.invoke(cli, [*base, "-o", "json", "groups", "describe", "cli-group"])
    assert result.exit_code == 0, result.output
    described = json.loads(result.output)
    assert described["members"] == []  # the CLI's consumer left the group when it closed
    assert sum(r["committed_offset"] for r in described["offsets"]) == 3
    result = runner.invoke(cli, [*base, "topic", "create", "clients-cli"])
    assert result.exit_code == 1
    assert "error: TOPIC_ALREADY_EXISTS" in result.output and "Traceback" not in result.output
    result = runner.invoke(cli, [*base, "consume", "clients-no-such-topic", "--timeout-ms", "100"])
    assert result.exit_code == 1 and "UNKNOWN_TOPIC_OR_PARTITION" in result.output
    result = runner.invoke(cli, [*base, "cluster", "describe"])
    assert result.exit_code == 0 and "broker" in result.output


def test_producer_rides_through_a_gateway_restart(cluster):
    """Runs last in this module: it stops the shared gateway for a moment.

    A producer sending through the gateway waits and retries while it is down; one sending
    straight to the leaders (the default) does not need it once it has Metadata."""
    create(cluster, "clients-gateway-restart", partitions=1)
    settings = dict(FAST, connect_timeout_ms=2_000, delivery_timeout_ms=60_000)
    with (
        Producer(cluster.gateway_address, direct_to_leaders=False, **settings) as producer,
        Producer(cluster.gateway_address, **settings) as direct,
    ):
        assert producer.send("clients-gateway-restart", b"before").result(timeout=10).offset == 0
        assert direct.send("clients-gateway-restart", b"direct-before").result(timeout=10).offset == 1
        cluster.kill_gateway()
        future = producer.send("clients-gateway-restart", b"during")
        assert direct.send("clients-gateway-restart", b"direct-during").result(timeout=10).offset == 2
        # Nothing answers for a second: the record must wait and retry, not fail.
        with pytest.raises(concurrent.futures.TimeoutError):
            future.result(timeout=1.0)
        cluster.start_gateway()
        assert future.result(timeout=45).offset == 3, "retried within delivery_timeout_ms, written once"
    with Consumer(bootstrap=cluster.gateway_address, auto_offset_reset="earliest", **FAST) as consumer:
        consumer.assign([TopicPartition("clients-gateway-restart", 0)])
        assert [r.value for r in consume_until(consumer, 4)] == [
            b"before",
            b"direct-before",
            b"direct-during",
            b"during",
        ]
