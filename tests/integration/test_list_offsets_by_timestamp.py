"""ListOffsets by timestamp answers a record, not a batch, on every path (issue 38).

Kafka's answer (LogSegment.findOffsetByTimestamp) is the offset and timestamp of the first
record whose timestamp reaches the target, found inside its batch. The partition here holds
batches of 100 records with growing timestamps, and the targets fall inside them; each path
is asked: the gateway's ListOffsets over gRPC (raw, and through Admin.list_offsets and the
Consumer) and the brokers' Kafka listener (confluent-kafka's consumer and admin client).
A last small batch holds the largest timestamp in its middle, for KIP-734's max-timestamp
lookup (-3).
"""

from __future__ import annotations

import time
from typing import Any

import confluent_kafka
import pytest
from confluent_kafka.admin import AdminClient, OffsetSpec

from clients import Admin, Consumer, TopicPartition
from clients.common.records import encode_batch
from protos.highwater.v1 import common_pb2, gateway_pb2_grpc
from tests.integration.helpers import create_topic, gateway_stub, produce_batch

pytestmark = pytest.mark.integration

TOPIC = "by-time"
FAST = {"request_timeout_ms": 10_000, "connect_timeout_ms": 5_000, "retry_backoff_ms": 50}
CALL_TIMEOUT_S = 30.0  # generous: CI machines are shared; every wait stays bounded
RETRY_S = 0.1  # between produces to a topic whose leader is not ready yet
BATCHES = 3
RECORDS_PER_BATCH = 100
STEP_MS = 10  # the record at offset o (below 300) is stamped base + 10 * o
# Offsets 300..304: timestamps base + 3000, base + 5000 (the largest), base + 3010, ...
TAIL_STEPS = [300, 500, 301, 302, 303]
MAX_OFFSET = 301


# Answers that mean nothing was written (a new topic's leaders are still being elected): retried.
NOTHING_WRITTEN = {
    common_pb2.UNKNOWN_TOPIC_OR_PARTITION,
    common_pb2.NOT_LEADER_OR_FOLLOWER,
    common_pb2.LEADER_NOT_AVAILABLE,
    common_pb2.NOT_ENOUGH_REPLICAS,
}


def write_batch(gw: gateway_pb2_grpc.GatewayServiceStub, topic: str, partition: int, batch: bytes) -> None:
    """Produce one batch (acks=all) to a new topic, again while its leader is not ready; once only
    otherwise, so that a retry never writes it twice and shifts the offsets the tests expect."""
    deadline = time.monotonic() + CALL_TIMEOUT_S
    while True:
        answer = produce_batch(gw, topic, partition, batch, timeout=CALL_TIMEOUT_S)
        if answer.error_code == common_pb2.NONE:
            return
        if answer.error_code not in NOTHING_WRITTEN or time.monotonic() > deadline:
            raise AssertionError(
                f"produce to {topic}-{partition}: {answer.error_code} {answer.error_message}"
            )
        time.sleep(RETRY_S)


@pytest.fixture(scope="module")
def base_ms(cluster: Any) -> int:
    """Create TOPIC (one partition) and write its batches; the timestamp of offset 0."""
    base = int(time.time() * 1000) - 600_000  # well inside the topic's timestamp window
    gw = gateway_stub(cluster.gateway_address)
    created = create_topic(gw, TOPIC, partitions=1)
    assert created.error_code == common_pb2.NONE, created.error_message
    batches = [
        [base + STEP_MS * o for o in range(b * RECORDS_PER_BATCH, (b + 1) * RECORDS_PER_BATCH)]
        for b in range(BATCHES)
    ]
    batches.append([base + STEP_MS * step for step in TAIL_STEPS])
    for stamps in batches:
        write_batch(gw, TOPIC, 0, encode_batch([(None, b"v%d" % t, [], t) for t in stamps]))
    return base


def at(base: int, offset: int) -> int:
    return base + STEP_MS * offset


def test_gateway_list_offsets_answers_the_record_and_its_timestamp(cluster: Any, base_ms: int) -> None:
    gw = gateway_stub(cluster.gateway_address)

    def ask(timestamp: int) -> tuple[int, int]:
        answer = gw.ListOffsets(
            common_pb2.ListOffsetsRequest(
                replica_id=-1,
                topics=[
                    common_pb2.ListOffsetsTopic(
                        topic=TOPIC,
                        partitions=[
                            common_pb2.ListOffsetsPartition(
                                partition=0, timestamp=timestamp, current_leader_epoch=-1
                            )
                        ],
                    )
                ],
            ),
            timeout=CALL_TIMEOUT_S,
        )
        (part,) = answer.topics[0].partitions
        assert part.error_code == common_pb2.NONE, part.error_message
        return part.offset, part.timestamp

    assert ask(at(base_ms, 50)) == (50, at(base_ms, 50))
    assert ask(at(base_ms, 150) - 5) == (150, at(base_ms, 150))  # between two records
    assert ask(at(base_ms, 299)) == (299, at(base_ms, 299))
    # Past batch 3's records: the tail's first record at or after it is its largest.
    assert ask(at(base_ms, 300) + 5) == (MAX_OFFSET, at(base_ms, 500))
    assert ask(at(base_ms, 500) + 1) == (-1, -1)
    assert ask(-3) == (MAX_OFFSET, at(base_ms, 500))  # KIP-734
    assert ask(-2) == (0, -1)
    assert ask(-1) == (305, -1)


def test_admin_and_consumer_answer_the_record_inside_a_batch(cluster: Any, base_ms: int) -> None:
    tp = TopicPartition(TOPIC, 0)
    with Admin(cluster.gateway_address, **FAST) as admin:
        assert admin.list_offsets({tp: at(base_ms, 50)}) == {tp: 50}
        assert admin.list_offsets({tp: at(base_ms, 275)}) == {tp: 275}
    with Consumer(bootstrap=cluster.gateway_address, **FAST) as consumer:
        found = consumer.offsets_for_times({tp: at(base_ms, 125)})[tp]
        assert found is not None
        assert (found.offset, found.timestamp_ms) == (125, at(base_ms, 125))


def test_kafka_listener_answers_the_record_inside_a_batch(cluster: Any, base_ms: int) -> None:
    consumer = confluent_kafka.Consumer(
        {"bootstrap.servers": cluster.kafka_bootstrap(), "group.id": "by-time", "enable.auto.commit": False}
    )
    try:
        found = consumer.offsets_for_times(
            [
                confluent_kafka.TopicPartition(TOPIC, 0, at(base_ms, 50)),
            ],
            timeout=CALL_TIMEOUT_S,
        )
        assert [(t.error, t.offset) for t in found] == [(None, 50)]
        found = consumer.offsets_for_times(
            [confluent_kafka.TopicPartition(TOPIC, 0, at(base_ms, 225) - 1)], timeout=CALL_TIMEOUT_S
        )
        assert [(t.error, t.offset) for t in found] == [(None, 225)]
    finally:
        consumer.close()
    admin = AdminClient({"bootstrap.servers": cluster.kafka_bootstrap()})
    tp = confluent_kafka.TopicPartition(TOPIC, 0)
    for spec, offset, timestamp in [
        (OffsetSpec.for_timestamp(at(base_ms, 75)), 75, at(base_ms, 75)),
        (OffsetSpec.max_timestamp(), MAX_OFFSET, at(base_ms, 500)),  # ListOffsets v7, KIP-734
        (OffsetSpec.earliest(), 0, -1),
        (OffsetSpec.latest(), 305, -1),
    ]:
        answer = admin.list_offsets({tp: spec}, request_timeout=CALL_TIMEOUT_S)[tp].result(
            timeout=CALL_TIMEOUT_S
        )
        assert (answer.offset, answer.timestamp) == (offset, timestamp), spec
