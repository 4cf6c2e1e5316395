"""The Kafka listener with security on (docs/KAFKA.md, Security): mutual TLS and ACLs.

One cluster for the module, secured as tests/integration/test_security.py secures its own: TLS
everywhere, --authorizer acl, User:admin the super user; client certificates from the cluster CA
made by the project's own tooling (issue_client_certificate); ACLs added with `highwater acl`.
confluent-kafka (librdkafka) connects to the brokers' Kafka ports with ssl.ca.location,
ssl.certificate.location and ssl.key.location:

- User:alice (Write and Read on k-ok, Read on group kg) produces idempotently and consumes;
- User:mallory (Describe on k-ok only) gets TOPIC_AUTHORIZATION_FAILED for its produce and its
  fetch, and nothing it sent is written;
- a client without a certificate never gets an answer (the handshake is refused);
- Metadata leaves out the topics a principal may not describe;
- alice commits a transaction (the coordinator's markers go to the leaders over the brokers'
  mutual TLS), mallory is refused a transactional id.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import confluent_kafka
import pytest

from tests.integration.conftest import TestCluster
from tests.integration.helpers import wait_for
from tests.integration.test_security import acl, acl_cluster, create_topics_as_admin

pytestmark = pytest.mark.integration

STEP_TIMEOUT_S = 30.0  # each client wait below; CI machines are shared
TOPICS = ("k-ok", "k-secret")


def kafka_config(c: TestCluster, name: str | None, **extra: Any) -> dict[str, Any]:
    """librdkafka settings for the cluster's Kafka ports, with NAME's certificate (None: CA only)."""
    settings = c.client_settings(name) if name else {"ssl_cafile": str(c.tls_dir / "ca.pem")}  # type: ignore[operator]
    config: dict[str, Any] = {
        "bootstrap.servers": c.kafka_bootstrap(),
        "security.protocol": "SSL",
        "ssl.ca.location": settings["ssl_cafile"],
        "socket.timeout.ms": 10_000,
        "reconnect.backoff.max.ms": 1_000,
    }
    if name:
        config["ssl.certificate.location"] = settings["ssl_certfile"]
        config["ssl.key.location"] = settings["ssl_keyfile"]
    return {**config, **extra}


def metadata(
    c: TestCluster, name: str | None, topic: str | None = None, timeout_s: float = STEP_TIMEOUT_S
) -> Any:
    """A Metadata request as NAME (a producer's; librdkafka's AdminClient asks in another form)."""
    producer = confluent_kafka.Producer(kafka_config(c, name))
    return producer.list_topics(topic, timeout=timeout_s)


def topics_listed(c: TestCluster, name: str) -> set[str]:
    return set(metadata(c, name).topics)


def end_offsets(c: TestCluster, topic: str) -> list[int]:
    """Each partition's high watermark, read as the super user."""
    consumer = confluent_kafka.Consumer(kafka_config(c, "admin", **{"group.id": "k-admin-offsets"}))
    try:
        return [
            consumer.get_watermark_offsets(confluent_kafka.TopicPartition(topic, p), timeout=STEP_TIMEOUT_S)[
                1
            ]
            for p in range(2)
        ]
    finally:
        consumer.close()


@pytest.fixture(scope="module")
def secure_kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestCluster]:
    c = acl_cluster(tmp_path_factory.mktemp("kafka-secure"))
    c.start()
    try:
        assert c.kafka_bootstrap(), "every broker opens its Kafka listener with TLS and ACLs"
        for name in ("alice", "mallory"):
            c.issue_client_certificate(name)
        create_topics_as_admin(c, *TOPICS)
        acl(
            c,
            "add",
            "--principal",
            "User:alice",
            "--operation",
            "Write",
            "--operation",
            "Read",
            "--topic",
            "k-ok",
        )
        acl(c, "add", "--principal", "User:alice", "--operation", "Read", "--group", "kg")
        acl(c, "add", "--principal", "User:mallory", "--operation", "Describe", "--topic", "k-ok")
        wait_for(
            lambda: topics_listed(c, "alice") == {"k-ok"} and topics_listed(c, "mallory") == {"k-ok"},
            timeout_s=STEP_TIMEOUT_S,
            what="the ACLs to reach the brokers' Kafka listeners",
        )
        yield c
    finally:
        c.stop()


def test_a_principal_with_write_and_read_produces_idempotently_and_consumes(secure_kafka):
    c = secure_kafka
    before = sum(end_offsets(c, "k-ok"))
    producer = confluent_kafka.Producer(
        kafka_config(c, "alice", **{"enable.idempotence": True, "acks": "all"})
    )
    errors: list[Any] = []
    for i in range(20):
        producer.produce(
            "k-ok", key=b"k%d" % i, value=b"v%d" % i, on_delivery=lambda err, msg: errors.append(err)
        )
    assert producer.flush(STEP_TIMEOUT_S) == 0, "every record delivered within the bound"
    assert errors == [None] * 20
    assert sum(end_offsets(c, "k-ok")) == before + 20

    consumer = confluent_kafka.Consumer(
        kafka_config(
            c, "alice", **{"group.id": "kg", "auto.offset.reset": "earliest", "enable.auto.commit": False}
        )
    )
    try:
        consumer.subscribe(["k-ok"])
        values: set[bytes] = set()
        wait_for(
            lambda: _poll_into(consumer, values) >= 20,
            timeout_s=STEP_TIMEOUT_S,
            what="alice consumes her records",
        )
        assert {b"v%d" % i for i in range(20)} <= values
        consumer.commit(asynchronous=False)  # OffsetCommit: Read on the group and the topic
    finally:
        consumer.close()


def _poll_into(consumer: confluent_kafka.Consumer, values: set[bytes]) -> int:
    msg = consumer.poll(1.0)
    if msg is not None:
        assert msg.error() is None, msg.error()
        values.add(msg.value())
    return len(values)


def test_a_principal_without_write_or_read_gets_topic_authorization_failed_and_nothing_is_written(
    secure_kafka,
):
    c = secure_kafka
    before = end_offsets(c, "k-ok")
    producer = confluent_kafka.Producer(
        kafka_config(
            c, "mallory", **{"enable.idempotence": False, "acks": "all", "message.timeout.ms": 20_000}
        )
    )
    errors: list[Any] = []
    for i in range(5):
        producer.produce(
            "k-ok", value=b"m%d" % i, partition=i % 2, on_delivery=lambda err, msg: errors.append(err)
        )
    assert producer.flush(STEP_TIMEOUT_S) == 0
    assert [e.code() if e else None for e in errors] == [
        confluent_kafka.KafkaError.TOPIC_AUTHORIZATION_FAILED
    ] * 5
    assert end_offsets(c, "k-ok") == before, "nothing of the refused produce was written"

    consumer = confluent_kafka.Consumer(kafka_config(c, "mallory", **{"group.id": "k-mallory"}))
    try:
        consumer.assign([confluent_kafka.TopicPartition("k-ok", 0, 0)])
        seen: list[Any] = []

        def refused() -> bool:
            msg = consumer.poll(1.0)
            if msg is not None and msg.error() is not None:
                seen.append(msg.error().code())
            return confluent_kafka.KafkaError.TOPIC_AUTHORIZATION_FAILED in seen

        wait_for(refused, timeout_s=STEP_TIMEOUT_S, what="mallory's fetch refused")
    finally:
        consumer.close()


def test_a_client_without_a_certificate_cannot_connect(secure_kafka):
    c = secure_kafka
    with pytest.raises(confluent_kafka.KafkaException):
        metadata(c, None, timeout_s=5.0)
    plaintext = confluent_kafka.Producer(
        {"bootstrap.servers": c.kafka_bootstrap(), "socket.timeout.ms": 5_000}
    )
    with pytest.raises(confluent_kafka.KafkaException):
        plaintext.list_topics(timeout=5.0)


def test_metadata_hides_topics_the_principal_may_not_describe(secure_kafka):
    c = secure_kafka
    assert topics_listed(c, "alice") == {"k-ok"}
    assert set(TOPICS) <= topics_listed(c, "admin"), "the super user sees every topic"
    named = metadata(c, "alice", "k-secret").topics["k-secret"]
    assert (
        named.error is not None
        and named.error.code() == confluent_kafka.KafkaError.TOPIC_AUTHORIZATION_FAILED
    )


def test_transactions_need_write_rights_and_run_over_tls_between_brokers(secure_kafka):
    """alice (Write on k-ok) commits a transaction: the coordinator's markers reach the leaders
    over the brokers' own mutual TLS; mallory (Describe only) is refused her transactional id."""
    c = secure_kafka
    before = sum(end_offsets(c, "k-ok"))
    producer = confluent_kafka.Producer(kafka_config(c, "alice", **{"transactional.id": "alice-tx"}))
    producer.init_transactions(STEP_TIMEOUT_S)
    producer.begin_transaction()
    for i in range(4):
        producer.produce("k-ok", value=b"t%d" % i, partition=i % 2)
    producer.commit_transaction(STEP_TIMEOUT_S)
    # Four records and one COMMIT marker per partition.
    assert sum(end_offsets(c, "k-ok")) == before + 4 + 2

    refused = confluent_kafka.Producer(kafka_config(c, "mallory", **{"transactional.id": "mallory-tx"}))
    with pytest.raises(confluent_kafka.KafkaException) as info:
        refused.init_transactions(STEP_TIMEOUT_S)
    assert info.value.args[0].code() == confluent_kafka.KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
