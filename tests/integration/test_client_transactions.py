"""Our own clients' transactions over gRPC (issue 41; docs/CLIENTS.md, Transactions): the
Producer's init/begin/send/send_offsets/commit/abort through the gateway's coordinator, the
brokers' gRPC Produce checking transactional batches (KIP-890), read_committed Consumers, and a
confluent-kafka read_committed consumer on the Kafka listener reading what our producer committed
(one coordinator state in etcd behind both doors).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import confluent_kafka
import pytest

from clients import Admin, AsyncProducer, Consumer, Producer, TopicPartition
from clients.errors import InvalidArgument, ProducerFenced, TransactionAbortRequired
from clients.transactions import GroupMetadata
from protos.highwater.v1 import common_pb2, gateway_pb2
from tests.integration.helpers import gateway_stub

pytestmark = pytest.mark.integration

FAST = {"request_timeout_ms": 10_000, "connect_timeout_ms": 5_000, "retry_backoff_ms": 50}
CALL_TIMEOUT_S = 30.0
READ_WAIT_S = 30.0


def values_read(cluster: Any, topic: str, partitions: int, isolation: str, expected: int) -> list[bytes]:
    """Every value a consumer at `isolation` reads from the start of `topic`, once it has
    `expected` and a further second brings nothing (bounded by READ_WAIT_S)."""
    got: list[bytes] = []
    with Consumer(bootstrap=cluster.gateway_address, isolation_level=isolation, **FAST) as consumer:
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        consumer.assign(tps)
        for tp in tps:
            consumer.seek_to_beginning(tp)
        deadline = time.monotonic() + READ_WAIT_S
        quiet_until: float | None = None
        while time.monotonic() < deadline:
            batch = consumer.poll(timeout_ms=200)
            got.extend(r.value for r in batch)
            if batch:
                quiet_until = None
            elif len(got) >= expected:
                quiet_until = quiet_until or time.monotonic() + 1.0
                if time.monotonic() >= quiet_until:
                    break
    return got


def committed_soon(consumer: Consumer, tp: TopicPartition, expected: int | None) -> int | None:
    """The group's committed offset for tp once it is `expected` (bounded by READ_WAIT_S): a
    commit answers once its decision is durable, and its offsets are published with its markers
    right after, as Kafka's (whose readers see UNSTABLE_OFFSET_COMMIT meanwhile)."""
    deadline = time.monotonic() + READ_WAIT_S
    while (found := consumer.committed(tp)) != expected and time.monotonic() < deadline:
        time.sleep(0.05)
    return found


@pytest.fixture(scope="module")
def topics(cluster: Any) -> tuple[str, str]:
    with Admin(cluster.gateway_address, **FAST) as admin:
        admin.create_topics("txn-a", 2, 3, {"min.insync.replicas": "2"})
        admin.create_topics("txn-b", 1, 3, {"min.insync.replicas": "2"})
    return "txn-a", "txn-b"


def test_a_committed_transaction_is_read_whole_and_an_aborted_one_never(cluster, topics):
    a, b = topics
    with Producer(cluster.gateway_address, transactional_id="grpc-commit-abort", **FAST) as producer:
        producer.init_transactions()
        producer.begin_transaction()
        for i in range(10):
            producer.send(a, f"committed-{i}".encode(), partition=i % 2)
        producer.send(b, b"committed-b")
        producer.commit_transaction()

        producer.begin_transaction()
        for i in range(5):
            producer.send(a, f"aborted-{i}".encode(), partition=i % 2)
        producer.send(b, b"aborted-b")
        producer.flush()  # written to the logs: only the ABORT markers keep them from readers
        producer.abort_transaction()

        producer.begin_transaction()
        producer.send(b, b"after-abort")
        producer.commit_transaction()

    committed = values_read(cluster, a, 2, "read_committed", 10) + values_read(
        cluster, b, 1, "read_committed", 2
    )
    assert sorted(committed) == sorted(
        [f"committed-{i}".encode() for i in range(10)] + [b"committed-b", b"after-abort"]
    )
    everything = values_read(cluster, b, 1, "read_uncommitted", 3)
    assert everything == [b"committed-b", b"aborted-b", b"after-abort"], "the aborted record is in the log"

    # The Kafka listener's read_committed consumers see the same: one coordinator state.
    consumer = confluent_kafka.Consumer(
        {
            "bootstrap.servers": cluster.kafka_bootstrap(),
            "group.id": "grpc-txn-kafka-reader",
            "isolation.level": "read_committed",
            "auto.offset.reset": "earliest",
        }
    )
    try:
        consumer.subscribe([b])
        seen: list[bytes] = []
        deadline = time.monotonic() + READ_WAIT_S
        while len(seen) < 2 and time.monotonic() < deadline:
            m = consumer.poll(0.5)
            if m is not None and not m.error():
                seen.append(m.value())
        assert seen == [b"committed-b", b"after-abort"]
    finally:
        consumer.close()


def test_offsets_sent_with_a_transaction_are_committed_only_with_it(cluster, topics):
    a, _ = topics
    group = "grpc-txn-offsets"
    tp = TopicPartition(a, 0)
    with Producer(cluster.gateway_address, transactional_id="grpc-offsets", **FAST) as producer:
        producer.init_transactions()
        producer.begin_transaction()
        producer.send(a, b"with-offsets-aborted", partition=1)
        producer.send_offsets_to_transaction({tp: 3}, GroupMetadata(group))
        producer.abort_transaction()
        with Consumer(bootstrap=cluster.gateway_address, group_id=group, **FAST) as consumer:
            assert consumer.committed(tp) is None, "an aborted transaction's offsets are never committed"

        producer.begin_transaction()
        producer.send(a, b"with-offsets-committed", partition=1)
        producer.send_offsets_to_transaction({tp: 5}, GroupMetadata(group))
        producer.commit_transaction()
    with Consumer(bootstrap=cluster.gateway_address, group_id=group, **FAST) as consumer:
        assert committed_soon(consumer, tp, 5) == 5


def test_a_consumer_group_member_commits_through_a_transaction_and_a_stale_one_is_refused(cluster, topics):
    """KIP-447 through our clients: the group metadata of a live member is accepted; the same
    member id at an older epoch is refused, and the transaction must then be aborted."""
    a, _ = topics
    group = "grpc-txn-member"
    with Consumer(
        a, bootstrap=cluster.gateway_address, group_id=group, enable_auto_commit=False, **FAST
    ) as consumer:
        deadline = time.monotonic() + READ_WAIT_S
        while not consumer.assignment():
            assert time.monotonic() < deadline, "the consumer never got partitions"
            consumer.poll(timeout_ms=200)
        metadata = consumer.group_metadata()
        assert metadata.group_id == group and metadata.member_id and metadata.member_epoch > 0
        with Producer(cluster.gateway_address, transactional_id="grpc-member", **FAST) as producer:
            producer.init_transactions()
            producer.begin_transaction()
            producer.send(a, b"member-output", partition=0)
            producer.send_offsets_to_transaction({TopicPartition(a, 0): 1}, metadata)
            producer.commit_transaction()
            assert committed_soon(consumer, TopicPartition(a, 0), 1) == 1

            producer.begin_transaction()
            stale = GroupMetadata(group, metadata.member_id, metadata.member_epoch - 1)
            with pytest.raises(Exception) as refused:
                producer.send_offsets_to_transaction({TopicPartition(a, 0): 2}, stale)
            assert "STALE_MEMBER_EPOCH" in str(refused.value)
            with pytest.raises(TransactionAbortRequired):
                producer.commit_transaction()
            producer.abort_transaction()
            assert consumer.committed(TopicPartition(a, 0)) == 1


def test_a_second_producer_with_the_id_fences_the_first(cluster, topics):
    _, b = topics
    with Producer(cluster.gateway_address, transactional_id="grpc-fencing", **FAST) as first:
        first.init_transactions()
        first.begin_transaction()
        first.send(b, b"zombie").result(timeout=CALL_TIMEOUT_S)
        with Producer(cluster.gateway_address, transactional_id="grpc-fencing", **FAST) as second:
            second.init_transactions()  # aborts the first's open transaction, bumps the epoch
            with pytest.raises(ProducerFenced):
                first.commit_transaction()
            with pytest.raises(ProducerFenced):
                first.begin_transaction()
            second.begin_transaction()
            second.send(b, b"successor")
            second.commit_transaction()
    values = values_read(cluster, b, 1, "read_committed", 1)
    assert b"successor" in values and b"zombie" not in values


def test_misuse_is_refused_with_a_named_error(cluster, topics):
    a, _ = topics
    with (
        Producer(cluster.gateway_address, **FAST) as plain,
        pytest.raises(InvalidArgument, match="not transactional"),
    ):
        plain.begin_transaction()
    with Producer(cluster.gateway_address, transactional_id="grpc-misuse", **FAST) as producer:
        with pytest.raises(Exception, match="init_transactions"):
            producer.send(a, b"before-init")
        producer.init_transactions()
        with pytest.raises(Exception, match="begin_transaction"):
            producer.send(a, b"outside")
        with pytest.raises(Exception, match="not allowed"):
            producer.commit_transaction()
    with pytest.raises(InvalidArgument, match="transactional_id needs enable_idempotence"):
        Producer(cluster.gateway_address, transactional_id="x", enable_idempotence=False)


def test_a_transactional_batch_for_a_partition_not_in_the_transaction_is_refused(cluster, topics):
    """KIP-890 at the leader over gRPC: a raw transactional batch without AddPartitionsToTxn is
    refused, and nothing is appended."""
    from clients.common import records

    a, _ = topics
    gw = gateway_stub(cluster.gateway_address.split(",")[0])
    init = gw.InitProducerId(
        common_pb2.InitProducerIdRequest(
            transactional_id="grpc-raw", transaction_timeout_ms=60_000, producer_id=-1, producer_epoch=-1
        ),
        timeout=CALL_TIMEOUT_S,
    )
    assert init.error_code == common_pb2.NONE, init
    batch = records.encode_batch(
        [(None, b"stray", [], int(time.time() * 1000))],
        producer_id=init.producer_id,
        producer_epoch=init.producer_epoch,
        base_sequence=0,
        transactional=True,
    )
    answer = gw.Produce(
        common_pb2.ProduceRequest(
            acks=-1,
            timeout_ms=10_000,
            transactional_id="grpc-raw",
            topics=[
                common_pb2.ProduceTopicData(
                    topic=a, partitions=[common_pb2.ProducePartitionData(partition=0, records=batch)]
                )
            ],
        ),
        timeout=CALL_TIMEOUT_S,
    )
    part = answer.topics[0].partitions[0]
    assert part.error_code == common_pb2.INVALID_TXN_STATE, part
    assert "AddPartitionsToTxn" in part.error_message
    added = gw.AddPartitionsToTxn(
        gateway_pb2.AddPartitionsToTxnRequest(
            transactional_id="grpc-raw",
            producer_id=init.producer_id,
            producer_epoch=init.producer_epoch,
            partitions=[common_pb2.TopicPartition(topic="no-such-topic", partition=0)],
        ),
        timeout=CALL_TIMEOUT_S,
    )
    assert added.error_code == common_pb2.UNKNOWN_TOPIC_OR_PARTITION, added


def test_the_async_producer_runs_transactions(cluster, topics):
    _, b = topics

    async def run() -> None:
        async with AsyncProducer(cluster.gateway_address, transactional_id="grpc-async", **FAST) as producer:
            await producer.init_transactions()
            await producer.begin_transaction()
            await producer.send(b, b"async-aborted")
            await producer.abort_transaction()
            await producer.begin_transaction()
            await producer.send(b, b"async-committed")
            await producer.commit_transaction()

    asyncio.run(asyncio.wait_for(run(), CALL_TIMEOUT_S * 2))
    values = values_read(cluster, b, 1, "read_committed", 1)
    assert b"async-committed" in values and b"async-aborted" not in values


def test_a_record_level_call_with_a_transactional_id_is_all_or_nothing(cluster):
    """ProduceRecords with a transactional_id (callers with only a gRPC stub): every record of
    the call committed together; a record the leader refuses aborts the whole call."""
    gw = gateway_stub(cluster.gateway_address.split(",")[0])
    with Admin(cluster.gateway_address, **FAST) as admin:
        admin.create_topics("txn-records", 3, 3, {"min.insync.replicas": "2", "max.message.bytes": "4000"})
    records = [gateway_pb2.ProducerRecord(value=f"whole-{i}".encode(), partition=i % 3) for i in range(9)]
    answer = gw.ProduceRecords(
        gateway_pb2.ProduceRecordsRequest(topic="txn-records", records=records, transactional_id="records-1"),
        timeout=CALL_TIMEOUT_S,
    )
    assert [r.error_code for r in answer.results] == [common_pb2.NONE] * 9, answer
    assert sorted(values_read(cluster, "txn-records", 3, "read_committed", 9)) == sorted(
        r.value for r in records
    )

    # Partitions 0 and 1 take their records; partition 2's is over max.message.bytes.
    doomed = [
        gateway_pb2.ProducerRecord(value=b"doomed-0", partition=0),
        gateway_pb2.ProducerRecord(value=b"doomed-1", partition=1),
        gateway_pb2.ProducerRecord(value=b"x" * 10_000, partition=2),
    ]
    answer = gw.ProduceRecords(
        gateway_pb2.ProduceRecordsRequest(topic="txn-records", records=doomed, transactional_id="records-1"),
        timeout=CALL_TIMEOUT_S,
    )
    codes = [r.error_code for r in answer.results]
    assert codes[2] == common_pb2.MESSAGE_TOO_LARGE, answer
    assert codes[:2] == [common_pb2.INVALID_TXN_STATE] * 2, answer
    assert "record 2 was refused" in answer.results[0].error_message
    committed = values_read(cluster, "txn-records", 3, "read_committed", 9)
    assert b"doomed-0" not in committed and b"doomed-1" not in committed and len(committed) == 9


def test_consume_records_at_read_committed_leaves_out_aborted_and_open_transactions(cluster):
    """ConsumeRecords' isolation_level 1: committed transactions' records only, up to the last
    stable offset (an open transaction's records are neither sent nor waited past)."""
    gw = gateway_stub(cluster.gateway_address.split(",")[0])
    with Admin(cluster.gateway_address, **FAST) as admin:
        admin.create_topics("txn-consume", 1, 3, {"min.insync.replicas": "2"})
    with Producer(cluster.gateway_address, transactional_id="consume-rc", **FAST) as producer:
        producer.init_transactions()
        for values, commit in (([b"c1", b"c2"], True), ([b"a1"], False), ([b"c3"], True), ([b"open"], None)):
            producer.begin_transaction()
            for v in values:
                producer.send("txn-consume", v, partition=0)
            producer.flush()
            if commit is True:
                producer.commit_transaction()
            elif commit is False:
                producer.abort_transaction()

        def consumed(isolation_level: int) -> list[bytes]:
            stream = gw.ConsumeRecords(
                gateway_pb2.ConsumeRecordsRequest(
                    topic="txn-consume",
                    default_start_offset=-2,
                    stop_at_end=True,
                    isolation_level=isolation_level,
                ),
                timeout=CALL_TIMEOUT_S,
            )
            return [r.value for message in stream for r in message.records]

        assert consumed(1) == [b"c1", b"c2", b"c3"]
        assert consumed(0) == [b"c1", b"c2", b"a1", b"c3", b"open"]
        producer.abort_transaction()
    assert consumed(1) == [b"c1", b"c2", b"c3"], "the aborted open transaction stays out"
