"""Incremental fetch sessions (KIP-227) on the brokers' Kafka listeners, with real clients.

kafka-python opens a session on each broker it fetches from (librdkafka, confluent-kafka's core,
sends every Fetch whole with epoch -1, so it cannot open one): the brokers' session gauges go up,
its incremental Fetches (epochs past 1) carry only what changed, and it reads every record of
twelve partitions exactly once and in order, written before and while it reads. confluent-kafka
reads the same records through the sessionless path. A raw Fetch v12 then checks what clients
rarely send: a stale epoch gets INVALID_FETCH_SESSION_EPOCH, an unknown session
FETCH_SESSION_ID_NOT_FOUND.
"""

from __future__ import annotations

import collections
import datetime
import time
from typing import Any

import confluent_kafka
import pytest
from kafka import KafkaConsumer  # type: ignore[import-untyped]
from kafka.structs import TopicPartition as KafkaPythonPartition  # type: ignore[import-untyped]

from services.kafka import protocol
from tests.integration.conftest import TestCluster
from tests.integration.helpers import gateway_stub, partition_metadata, wait_for
from tests.integration.test_kafka_protocol import CALL_TIMEOUT_S, create, kafka_address, raw_call, read_answer
from tests.integration.test_metrics import scrape

pytestmark = pytest.mark.integration

PARTITIONS = 12
RECORDS_BEFORE = 40  # per partition, written before the consumers start
RECORDS_WHILE = 20  # per partition, written to every other partition while kafka-python reads
READ_TIMEOUT_S = 60.0  # every wait is bounded; generous for a shared machine
FETCH_SESSION_ID_NOT_FOUND = 70  # Kafka's error codes
INVALID_FETCH_SESSION_EPOCH = 71

SESSIONS = "highwater_kafka_incremental_fetch_sessions"
PARTITIONS_CACHED = "highwater_kafka_incremental_fetch_partitions_cached"


def session_metric(cluster: TestCluster, name: str) -> float:
    """The metric summed over the three brokers (a broker unreachable counts 0)."""
    return sum(scrape(cluster, f"broker-{b}").get(name, 0.0) for b in (1, 2, 3))


def produce(cluster: TestCluster, topic: str, partitions: range, first: int, count: int) -> None:
    producer = confluent_kafka.Producer(
        {"bootstrap.servers": cluster.kafka_bootstrap(), "acks": "all", "enable.idempotence": True}
    )
    failures: list[confluent_kafka.KafkaError] = []

    def delivered(err: confluent_kafka.KafkaError | None, _: object) -> None:
        if err is not None:
            failures.append(err)

    for p in partitions:
        for i in range(first, first + count):
            producer.produce(topic, value=f"{p}:{i}".encode(), partition=p, on_delivery=delivered)
    assert producer.flush(CALL_TIMEOUT_S) == 0, "every record delivered in time"
    assert not failures, failures


def expected(partition: int) -> list[str]:
    written = RECORDS_BEFORE + (RECORDS_WHILE if partition % 2 == 0 else 0)
    return [f"{partition}:{i}" for i in range(written)]


def test_kafka_python_reads_every_record_once_in_order_through_incremental_sessions(
    cluster: TestCluster,
) -> None:
    topic = "fetch-sessions"
    create(cluster, topic, partitions=PARTITIONS)
    produce(cluster, topic, range(PARTITIONS), 0, RECORDS_BEFORE)
    sessions_before = session_metric(cluster, SESSIONS)

    consumer = KafkaConsumer(
        bootstrap_servers=cluster.kafka_bootstrap(),
        enable_auto_commit=False,
        enable_incremental_fetch_sessions=True,
        fetch_max_wait_ms=100,
        request_timeout_ms=15_000,
    )
    got: dict[int, list[str]] = collections.defaultdict(list)
    try:
        consumer.assign([KafkaPythonPartition(topic, p) for p in range(PARTITIONS)])
        consumer.seek_to_beginning()

        def read_until(total: int) -> None:
            deadline = time.monotonic() + READ_TIMEOUT_S
            while sum(map(len, got.values())) < total:
                assert time.monotonic() < deadline, f"read {sum(map(len, got.values()))} of {total} records"
                for tp, records in consumer.poll(timeout_ms=200).items():
                    got[tp.partition].extend(r.value.decode() for r in records)

        read_until(PARTITIONS * RECORDS_BEFORE)
        # New records in half the partitions only: the next incremental answers carry those.
        produce(cluster, topic, range(0, PARTITIONS, 2), RECORDS_BEFORE, RECORDS_WHILE)
        read_until(PARTITIONS * RECORDS_BEFORE + PARTITIONS // 2 * RECORDS_WHILE)
        for _ in range(5):  # a few more Fetches: nothing more may arrive
            for tp, records in consumer.poll(timeout_ms=200).items():
                got[tp.partition].extend(r.value.decode() for r in records)

        assert {p: got[p] for p in range(PARTITIONS)} == {p: expected(p) for p in range(PARTITIONS)}
        # While the consumer is open, its sessions are in the brokers' caches, holding every
        # partition it reads (each from its leader).
        assert session_metric(cluster, SESSIONS) > sessions_before
        assert session_metric(cluster, PARTITIONS_CACHED) >= PARTITIONS
        handlers = consumer._fetcher._session_handlers
        assert handlers and max(h.next_metadata.epoch for h in handlers.values()) > 1, (
            "incremental Fetches were served (epochs past the session's first)"
        )
    finally:
        consumer.close()

    # The same records through librdkafka, which fetches without sessions (epoch -1).
    rdkafka = confluent_kafka.Consumer(
        {
            "bootstrap.servers": cluster.kafka_bootstrap(),
            "group.id": "fetch-sessions-rdkafka",
            "enable.auto.commit": False,
            "fetch.wait.max.ms": 100,
        }
    )
    seen: dict[int, list[str]] = collections.defaultdict(list)
    try:
        rdkafka.assign(
            [
                confluent_kafka.TopicPartition(topic, p, confluent_kafka.OFFSET_BEGINNING)
                for p in range(PARTITIONS)
            ]
        )
        total = sum(len(expected(p)) for p in range(PARTITIONS))
        deadline = time.monotonic() + READ_TIMEOUT_S
        while sum(map(len, seen.values())) < total:
            assert time.monotonic() < deadline, f"librdkafka read {sum(map(len, seen.values()))} of {total}"
            for message in rdkafka.consume(num_messages=500, timeout=0.2):
                assert message.error() is None, message.error()
                partition, value = message.partition(), message.value()
                assert partition is not None and value is not None
                seen[partition].append(value.decode())
        assert {p: seen[p] for p in range(PARTITIONS)} == {p: expected(p) for p in range(PARTITIONS)}
    finally:
        rdkafka.close()


def fetch_v12(
    cluster: TestCluster,
    broker_id: int,
    topic: str,
    session_id: int,
    epoch: int,
    partitions: tuple[int, ...],
    fetch_offset: int = 0,
) -> Any:
    """One raw Fetch v12 of `partitions` (from fetch_offset) with these session fields."""
    request_cls = protocol.request_class(protocol.FETCH, 12)
    mod = __import__(request_cls.__module__, fromlist=["x"])
    body = request_cls(
        max_wait=datetime.timedelta(milliseconds=0),
        min_bytes=0,
        max_bytes=1 << 20,
        session_id=session_id,
        session_epoch=epoch,
        topics=(
            mod.FetchTopic(
                topic=topic,
                partitions=tuple(
                    mod.FetchPartition(partition=p, fetch_offset=fetch_offset, partition_max_bytes=1 << 16)
                    for p in partitions
                ),
            ),
        )
        if partitions
        else (),
        forgotten_topics_data=(),
    )
    answer = raw_call(kafka_address(cluster, broker_id), protocol.FETCH, 12, body)
    assert answer, "the broker closed the connection"
    return read_answer(protocol.FETCH, 12, answer)


def test_an_incremental_fetch_with_a_stale_epoch_is_refused(cluster: TestCluster) -> None:
    topic = "fetch-sessions-raw"
    create(cluster, topic, partitions=1)
    leader = partition_metadata(gateway_stub(cluster.gateway_address), topic, 0).leader
    produce(cluster, topic, range(1), 0, 3)

    full = fetch_v12(cluster, leader, topic, 0, 0, (0,))
    assert full.error_code == 0 and full.session_id != 0, "a full Fetch with epoch 0 opens a session"
    (part,) = full.responses[0].partitions
    assert (part.error_code, part.high_watermark) == (0, 3)

    # Epoch 1 moves the session's fetch offset past the three records read.
    first = fetch_v12(cluster, leader, topic, full.session_id, 1, (0,), fetch_offset=3)
    assert (first.error_code, first.session_id) == (0, full.session_id)
    assert first.responses == (), "nothing changed since the full answer"

    stale = fetch_v12(cluster, leader, topic, full.session_id, 1, ())
    assert (stale.error_code, stale.responses) == (INVALID_FETCH_SESSION_EPOCH, ())

    # The session survives a stale Fetch: the right epoch still reads, and a new record shows.
    produce(cluster, topic, range(1), 3, 1)
    wait_for(
        lambda: fetch_v12(cluster, leader, topic, 0, -1, (0,)).responses[0].partitions[0].high_watermark == 4,
        timeout_s=CALL_TIMEOUT_S,
        what="the new record under the high watermark",
    )
    second = fetch_v12(cluster, leader, topic, full.session_id, 2, ())
    assert second.error_code == 0
    (moved,) = second.responses[0].partitions
    base_offset = int.from_bytes(bytes(moved.records)[:8], "big")
    assert (moved.high_watermark, base_offset) == (4, 3), "read from the session's fetch offset, 3"

    unknown = fetch_v12(cluster, leader, topic, full.session_id ^ 0x5A5A5A5, 1, ())
    assert (unknown.error_code, unknown.responses) == (FETCH_SESSION_ID_NOT_FOUND, ())
