"""read_committed on a real cluster (issue 41): a transaction marker written by WriteTxnMarkers at
the leader, read through the gateway by our Consumer and by a raw gRPC Fetch, and through the
Kafka listener by confluent-kafka (librdkafka's consumers read committed by default).

Producers cannot write transactional batches yet (the coordinator is not served), so the
transaction here is an empty one that was aborted: a lone ABORT marker. It is enough to show the
path: the gateway forwards isolation_level, the leader answers the LSO and the aborted
transaction, the Consumer skips the marker and ends at the LSO.
"""

from __future__ import annotations

import time

import confluent_kafka
import grpc
import pytest

from clients import Admin, Consumer, Producer, TopicPartition
from protos.highwater.v1 import broker_pb2, broker_pb2_grpc, common_pb2
from tests.integration.helpers import consumer_fetch, gateway_stub, partition_metadata

pytestmark = pytest.mark.integration

TOPIC = "read-committed"
FAST = {"request_timeout_ms": 10_000, "connect_timeout_ms": 5_000, "retry_backoff_ms": 50}
CALL_TIMEOUT_S = 10.0
ABORTED_PRODUCER = 4242


def write_abort_marker(cluster, leader: int) -> broker_pb2.WriteTxnMarkersResponse:
    port = cluster.processes[f"broker-{leader}"].info["port"]
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        return broker_pb2_grpc.BrokerServiceStub(channel).WriteTxnMarkers(  # type: ignore[no-untyped-call]
            broker_pb2.WriteTxnMarkersRequest(
                markers=[
                    broker_pb2.TxnMarker(
                        producer_id=ABORTED_PRODUCER,
                        producer_epoch=0,
                        committed=False,
                        coordinator_epoch=1,
                        topics=[broker_pb2.TxnMarkerTopic(topic=TOPIC, partitions=[0])],
                    )
                ],
                timeout_ms=5_000,
            ),
            timeout=CALL_TIMEOUT_S,
        )


def test_a_read_committed_consumer_skips_a_marker_and_ends_at_the_last_stable_offset(cluster):
    with Admin(cluster.gateway_address, **FAST) as admin:
        admin.create_topics(TOPIC, 1, 3, {"min.insync.replicas": "2"})
    with Producer(cluster.gateway_address, **FAST) as producer:
        for i in range(3):
            producer.send(TOPIC, f"before-{i}".encode(), partition=0).result(timeout=CALL_TIMEOUT_S)
        leader = partition_metadata(gateway_stub(cluster.gateway_address.split(",")[0]), TOPIC, 0).leader
        answer = write_abort_marker(cluster, leader)
        (marker,) = answer.markers
        assert [p.error_code for t in marker.topics for p in t.partitions] == [common_pb2.NONE], answer
        for i in range(2):
            producer.send(TOPIC, f"after-{i}".encode(), partition=0).result(timeout=CALL_TIMEOUT_S)

    gw = gateway_stub(cluster.gateway_address.split(",")[0])
    request = consumer_fetch(TOPIC, 0, 0, max_bytes=1 << 20, partition_max_bytes=1 << 20)
    request.isolation_level = 1
    part = gw.Fetch(request, timeout=CALL_TIMEOUT_S).topics[0].partitions[0]
    assert part.error_code == common_pb2.NONE
    assert part.last_stable_offset == part.high_watermark == 6  # 5 records and the marker
    assert [(a.producer_id, a.first_offset) for a in part.aborted_transactions] == [(ABORTED_PRODUCER, 3)]

    tp = TopicPartition(TOPIC, 0)
    with Consumer(bootstrap=cluster.gateway_address, isolation_level="read_committed", **FAST) as consumer:
        consumer.assign([tp])
        consumer.seek_to_beginning(tp)
        got = []
        deadline = time.monotonic() + 20
        while len(got) < 5:
            assert time.monotonic() < deadline, f"read {len(got)} of 5 records"
            got.extend(consumer.poll(timeout_ms=500))
        assert [(r.offset, r.value) for r in got] == [
            (0, b"before-0"),
            (1, b"before-1"),
            (2, b"before-2"),
            (4, b"after-0"),
            (5, b"after-1"),
        ]
        assert consumer.end_offsets([tp]) == {tp: 6}
        assert consumer.position(tp) == 6

    # librdkafka on the Kafka listener: isolation.level read_committed (its default), watermarks too.
    bootstrap = f"127.0.0.1:{cluster.processes[f'broker-{leader}'].info['kafka_port']}"
    consumer = confluent_kafka.Consumer(
        {"bootstrap.servers": bootstrap, "group.id": "read-committed", "isolation.level": "read_committed"}
    )
    try:
        consumer.assign([confluent_kafka.TopicPartition(TOPIC, 0, 0)])
        kafka_got = []
        deadline = time.monotonic() + 20
        while len(kafka_got) < 5:
            assert time.monotonic() < deadline, f"confluent-kafka read {len(kafka_got)} of 5 records"
            m = consumer.poll(0.5)
            if m is not None and not m.error():
                kafka_got.append((m.offset(), m.value()))
        assert kafka_got == [(r.offset, r.value) for r in got]
        low, high = consumer.get_watermark_offsets(
            confluent_kafka.TopicPartition(TOPIC, 0), timeout=CALL_TIMEOUT_S
        )
        assert (low, high) == (0, 6)
    finally:
        consumer.close()
