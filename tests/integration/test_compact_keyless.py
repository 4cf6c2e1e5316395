"""A compacted topic refuses keyless records at produce time, over both listeners (issue 39).

Kafka's LogValidator refuses a record without a key on a compacted topic with INVALID_RECORD
("Compacted topic cannot accept message without key in topic partition ..."); a Kafka client
(confluent-kafka) gets exactly that error, our gRPC Producer a clear InvalidRecord, and keyed
records are taken as before. A topic with cleanup.policy=delete still takes keyless records.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from confluent_kafka import KafkaError
from confluent_kafka import Producer as ConfluentProducer

from clients import Admin, Producer
from clients.common.errors import InvalidRecord
from tests.integration.conftest import TestCluster
from tests.integration.test_kafka_protocol import CALL_TIMEOUT_S, FAST

pytestmark = pytest.mark.integration


def create(cluster: TestCluster, name: str, policy: str) -> None:
    with Admin(cluster.gateway_address, **FAST) as admin:
        admin.create_topics(name, 1, 1, {"cleanup.policy": policy})


def confluent_produce(cluster: TestCluster, topic: str, key: bytes | None) -> tuple[Any, Any]:
    """(error, message) of one record produced with confluent-kafka over the Kafka listener."""
    producer = ConfluentProducer(
        {
            "bootstrap.servers": cluster.kafka_bootstrap(),
            "message.timeout.ms": int(CALL_TIMEOUT_S * 1000),
            "enable.idempotence": False,
            "linger.ms": 0,
        }
    )
    outcome: list[tuple[Any, Any]] = []
    producer.produce(topic, value=b"v", key=key, on_delivery=lambda err, msg: outcome.append((err, msg)))
    left = producer.flush(CALL_TIMEOUT_S)
    assert left == 0 and outcome, "confluent-kafka did not deliver within the deadline"
    return outcome[0]


def test_keyless_records_are_refused_on_a_compacted_topic_over_both_listeners(
    make_cluster: Callable[..., TestCluster],
) -> None:
    cluster = make_cluster(brokers=1)
    create(cluster, "compacted", "compact")
    create(cluster, "deleted", "delete")

    # The Kafka listener: INVALID_RECORD with Kafka's message; a keyed record goes through.
    error, _ = confluent_produce(cluster, "compacted", None)
    # (librdkafka reports the code's own text, not the broker's error_message.)
    assert error is not None and error.code() == KafkaError.INVALID_RECORD, error
    error, message = confluent_produce(cluster, "compacted", b"k")
    assert error is None and message.offset() == 0, error

    # Our gRPC Producer: InvalidRecord, with what to do about it; keyed records go through.
    with Producer(cluster.gateway_address, **FAST) as producer:
        refused = producer.send("compacted", b"v", partition=0)
        with pytest.raises(InvalidRecord) as raised:
            refused.result(timeout=CALL_TIMEOUT_S)
        assert "without key in topic partition compacted-0" in raised.value.message
        assert "send the records with keys" in raised.value.message
        taken = producer.send("compacted", b"v", key=b"k", partition=0).result(timeout=CALL_TIMEOUT_S)
        assert taken.offset == 1, "nothing of the refused record was written"
        kept = producer.send("deleted", b"v", partition=0).result(timeout=CALL_TIMEOUT_S)
        assert kept.offset == 0
    error, _ = confluent_produce(cluster, "deleted", None)
    assert error is None, error
