"""Transactions through the Kafka listener with clients nobody here wrote (issue 41):
confluent-kafka (librdkafka) and kafkajs begin, write to several topics, send consumer offsets,
commit and abort; a read_committed consumer sees the committed records only, whole; a second
producer with the same transactional id fences the first; the CLI-facing views (Describe and
ListTransactions) show the coordinator's state.
"""

from __future__ import annotations

import time
from typing import Any

import confluent_kafka
import pytest

from services.kafka import protocol
from tests.integration.kafkajs_client import run_kafkajs
from tests.integration.test_kafka_protocol import create, kafka_address, raw_call, read_answer

pytestmark = pytest.mark.integration

CALL_TIMEOUT_S = 30.0
CONSUME_WAIT_S = 60.0
# librdkafka's own bounds, kept short so a broken answer fails the test instead of hanging it.
PRODUCER_FAST = {"message.timeout.ms": 30_000, "socket.timeout.ms": 10_000, "transaction.timeout.ms": 60_000}


def producer(cluster: Any, transactional_id: str) -> confluent_kafka.Producer:
    return confluent_kafka.Producer(
        {
            "bootstrap.servers": cluster.kafka_bootstrap(),
            "transactional.id": transactional_id,
            **PRODUCER_FAST,
        }
    )


def read_all(
    cluster: Any, topics: list[str], isolation: str, expected: int, group: str
) -> list[tuple[str, bytes]]:
    """Every record of `topics` a consumer at `isolation` reads, once it has read `expected` of
    them and nothing more arrives for a second (bounded by CONSUME_WAIT_S)."""
    consumer = confluent_kafka.Consumer(
        {
            "bootstrap.servers": cluster.kafka_bootstrap(),
            "group.id": group,
            "isolation.level": isolation,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    got: list[tuple[str, bytes]] = []
    try:
        consumer.subscribe(topics)
        deadline = time.monotonic() + CONSUME_WAIT_S
        quiet_until = None
        while time.monotonic() < deadline:
            m = consumer.poll(0.5)
            if m is not None and not m.error():
                got.append((m.topic(), m.value()))
                quiet_until = None
            elif len(got) >= expected:
                quiet_until = quiet_until or time.monotonic() + 1.0
                if time.monotonic() >= quiet_until:
                    break
        assert len(got) >= expected, f"read {len(got)} of {expected} records"
        return got
    finally:
        consumer.close()


def test_confluent_kafka_commits_across_topics_and_aborts_and_read_committed_sees_only_commits(cluster):
    create(cluster, "txn-a", partitions=3)
    create(cluster, "txn-b", partitions=2)
    p = producer(cluster, "txn-app-1")
    p.init_transactions(CALL_TIMEOUT_S)
    p.begin_transaction()
    for i in range(20):
        p.produce("txn-a", f"c-a-{i}".encode(), key=str(i).encode())
        p.produce("txn-b", f"c-b-{i}".encode(), key=str(i).encode())
    p.commit_transaction(CALL_TIMEOUT_S)
    p.begin_transaction()
    for i in range(10):
        p.produce("txn-a", f"x-a-{i}".encode(), key=str(i).encode())
        p.produce("txn-b", f"x-b-{i}".encode(), key=str(i).encode())
    p.flush(CALL_TIMEOUT_S)
    p.abort_transaction(CALL_TIMEOUT_S)
    p.begin_transaction()
    for i in range(5):
        p.produce("txn-b", f"c2-b-{i}".encode())
    p.commit_transaction(CALL_TIMEOUT_S)

    committed = read_all(cluster, ["txn-a", "txn-b"], "read_committed", 45, "txn-reader-rc")
    values = sorted(v.decode() for _, v in committed)
    assert values == sorted(
        [f"c-a-{i}" for i in range(20)] + [f"c-b-{i}" for i in range(20)] + [f"c2-b-{i}" for i in range(5)]
    ), "exactly the committed records, once each"
    everything = read_all(cluster, ["txn-a", "txn-b"], "read_uncommitted", 65, "txn-reader-ru")
    assert sum(v.startswith(b"x-") for _, v in everything) == 20, "read_uncommitted sees the aborted ones"

    # ListTransactions asks every broker; DescribeTransactions the id's coordinator.
    listed = set()
    for broker_id in (1, 2, 3):
        body = protocol.build(
            protocol.request_class(protocol.LIST_TRANSACTIONS, 1),
            state_filters=(),
            producer_id_filters=(),
            duration_filter=-1,
        )
        answer = read_answer(
            protocol.LIST_TRANSACTIONS,
            1,
            raw_call(kafka_address(cluster, broker_id), protocol.LIST_TRANSACTIONS, 1, body),
        )
        listed |= {(t.transactional_id, t.transaction_state) for t in answer.transaction_states}
    assert ("txn-app-1", "CompleteCommit") in listed, listed
    described = []
    for broker_id in (1, 2, 3):
        body = protocol.build(
            protocol.request_class(protocol.DESCRIBE_TRANSACTIONS, 0), transactional_ids=("txn-app-1",)
        )
        answer = read_answer(
            protocol.DESCRIBE_TRANSACTIONS,
            0,
            raw_call(kafka_address(cluster, broker_id), protocol.DESCRIBE_TRANSACTIONS, 0, body),
        )
        described.extend(s for s in answer.transaction_states if s.error_code == 0)
    assert [s.transaction_state for s in described] == ["CompleteCommit"], "one coordinator describes it"


def test_confluent_kafka_consume_transform_produce_commits_offsets_with_the_output(cluster):
    create(cluster, "eos-in", partitions=2)
    create(cluster, "eos-out", partitions=2)
    plain = confluent_kafka.Producer({"bootstrap.servers": cluster.kafka_bootstrap()})
    for i in range(30):
        plain.produce("eos-in", f"in-{i}".encode(), key=str(i).encode())
    plain.flush(CALL_TIMEOUT_S)

    consumer = confluent_kafka.Consumer(
        {
            "bootstrap.servers": cluster.kafka_bootstrap(),
            "group.id": "eos-app",
            "isolation.level": "read_committed",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    p = producer(cluster, "eos-app-0")
    try:
        consumer.subscribe(["eos-in"])
        p.init_transactions(CALL_TIMEOUT_S)
        done = 0
        deadline = time.monotonic() + CONSUME_WAIT_S
        while done < 30:
            assert time.monotonic() < deadline, f"transformed {done} of 30"
            batch = [m for m in consumer.consume(10, 0.5) if not m.error()]
            if not batch:
                continue
            p.begin_transaction()
            for m in batch:
                p.produce("eos-out", m.value().replace(b"in-", b"out-"), key=m.key())
            p.send_offsets_to_transaction(
                consumer.position(consumer.assignment()), consumer.consumer_group_metadata(), CALL_TIMEOUT_S
            )
            p.commit_transaction(CALL_TIMEOUT_S)
            done += len(batch)
    finally:
        consumer.close()

    out = read_all(cluster, ["eos-out"], "read_committed", 30, "eos-check")
    assert sorted(v for _, v in out) == sorted(f"out-{i}".encode() for i in range(30))
    check = confluent_kafka.Consumer({"bootstrap.servers": cluster.kafka_bootstrap(), "group.id": "eos-app"})
    try:
        offsets = check.committed(
            [confluent_kafka.TopicPartition("eos-in", 0), confluent_kafka.TopicPartition("eos-in", 1)],
            timeout=CALL_TIMEOUT_S,
        )
    finally:
        check.close()
    assert sum(tp.offset for tp in offsets) == 30, "the group's offsets came with the transactions"


def test_a_second_producer_with_the_same_transactional_id_fences_the_first(cluster):
    create(cluster, "txn-fence", partitions=1)
    first = producer(cluster, "fenced-app")
    first.init_transactions(CALL_TIMEOUT_S)
    first.begin_transaction()
    first.produce("txn-fence", b"zombie")
    first.flush(CALL_TIMEOUT_S)
    second = producer(cluster, "fenced-app")
    second.init_transactions(CALL_TIMEOUT_S)  # aborts the first's transaction, bumps the epoch
    with pytest.raises(confluent_kafka.KafkaException) as info:
        first.produce("txn-fence", b"zombie-2")
        first.commit_transaction(CALL_TIMEOUT_S)
    assert info.value.args[0].fatal() or info.value.args[0].txn_requires_abort(), info.value
    second.begin_transaction()
    second.produce("txn-fence", b"survivor")
    second.commit_transaction(CALL_TIMEOUT_S)
    got = read_all(cluster, ["txn-fence"], "read_committed", 1, "fence-check")
    assert [v for _, v in got] == [b"survivor"]


_KAFKAJS_TXN = """
const producer = kafka.producer({
  transactionalId: 'kafkajs-txn', maxInFlightRequests: 1, idempotent: true,
});
await producer.connect();
const committed = await producer.transaction();
await committed.send({ topic: 'js-a', messages: [{ key: 'k1', value: 'a-commit' }] });
await committed.send({ topic: 'js-b', messages: [{ key: 'k2', value: 'b-commit' }] });
await committed.sendOffsets({
  consumerGroupId: 'js-group',
  topics: [{ topic: 'js-a', partitions: [{ partition: 0, offset: '1' }] }],
});
await committed.commit();
const aborted = await producer.transaction();
await aborted.send({ topic: 'js-a', messages: [{ key: 'k3', value: 'a-abort' }] });
await aborted.send({ topic: 'js-b', messages: [{ key: 'k4', value: 'b-abort' }] });
await aborted.abort();
await producer.disconnect();

const admin = kafka.admin();
await admin.connect();
const offsets = await admin.fetchOffsets({ groupId: 'js-group', topics: ['js-a'] });
await admin.disconnect();

const consumer = kafka.consumer({ groupId: 'js-reader', readUncommitted: false });
await consumer.connect();
await consumer.subscribe({ topics: ['js-a', 'js-b'], fromBeginning: true });
const seen = [];
await new Promise((resolve, reject) => {
  const timer = setTimeout(() => resolve(), %(wait_ms)d);
  consumer.run({ eachMessage: async ({ topic, message }) => {
    seen.push(`${topic}:${message.value.toString()}`);
    if (seen.length >= 2) { setTimeout(() => { clearTimeout(timer); resolve(); }, 1000); }
  } }).catch(reject);
});
await consumer.disconnect();
const committedOffsets = offsets[0].partitions.map(({ partition, offset }) => ({ partition, offset }));
return { seen: seen.sort(), offsets: committedOffsets };
"""


def test_kafkajs_transaction_commits_to_two_topics_with_offsets_and_aborts(cluster):
    create(cluster, "js-a", partitions=1)
    create(cluster, "js-b", partitions=1)
    out = run_kafkajs(
        str(cluster.kafka_bootstrap()).split(","), _KAFKAJS_TXN % {"wait_ms": int(CONSUME_WAIT_S * 1000)}
    )
    assert out["seen"] == ["js-a:a-commit", "js-b:b-commit"], out
    assert out["offsets"] == [{"partition": 0, "offset": "1"}], out
