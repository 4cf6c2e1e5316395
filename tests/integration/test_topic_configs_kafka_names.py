"""Changelog topics created over the Kafka protocol as stream-processing frameworks create them
(issue 39): quixstreams, faust and Kafka Streams send cleanup.policy=compact and a handful of
other configs Kafka defines; confluent-kafka's and kafka-python's admin clients create such
topics here and describe them back with their values, sources and (for configs accepted but
not acted on) why they have no effect. A value out of Kafka's bounds stays INVALID_CONFIG."""

from __future__ import annotations

from typing import Any

import pytest
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, ConfigSource
from confluent_kafka.admin import NewTopic as ConfluentNewTopic
from kafka import KafkaAdminClient
from kafka import errors as kafka_errors
from kafka.admin import ConfigResource as PythonConfigResource
from kafka.admin import ConfigResourceType
from kafka.admin import NewTopic as PythonNewTopic

from clients import Admin
from services.kafka import protocol
from tests.integration.helpers import wait_for
from tests.integration.test_kafka_protocol import (
    CALL_TIMEOUT_S,
    FAST,
    kafka_address,
    raw_call,
    read_answer,
)

pytestmark = pytest.mark.integration

# What the frameworks send for a changelog (quixstreams' and faust's defaults plus the
# settings Kafka Streams' internal topics carry).
CHANGELOG = {
    "cleanup.policy": "compact",
    "min.compaction.lag.ms": "0",
    "segment.ms": "600000",
    "message.timestamp.type": "CreateTime",
    "retention.ms": "-1",
    "min.cleanable.dirty.ratio": "0.01",
    "max.message.bytes": "1048588",
}
SOURCE_TOPIC_CONFIG = 1
SOURCE_DEFAULT_CONFIG = 5


def described(cluster: Any, topic: str) -> dict[str, tuple[str, int, int, str | None]]:
    """{config: (value, config_source, config_type, documentation)} from broker 1's DescribeConfigs v4."""
    cls = protocol.request_class(protocol.DESCRIBE_CONFIGS, 4)
    resource_cls = __import__(cls.__module__, fromlist=["x"]).DescribeConfigsResource
    body = cls(
        resources=(resource_cls(resource_type=2, resource_name=topic, configuration_keys=None),),
        include_synonyms=False,
        include_documentation=True,
    )
    answer = read_answer(
        protocol.DESCRIBE_CONFIGS,
        4,
        raw_call(kafka_address(cluster, 1), protocol.DESCRIBE_CONFIGS, 4, body),
    )
    (result,) = answer.results
    assert result.error_code == 0, result.error_message
    return {
        c.name: (c.value, int(c.config_source), int(c.config_type), c.documentation) for c in result.configs
    }


def wait_described(cluster: Any, topic: str) -> dict[str, tuple[str, int, int, str | None]]:
    """Broker 1's description, once it has learnt the topic from UpdateMetadata."""
    found: dict[str, dict[str, tuple[str, int, int, str | None]]] = {}

    def learnt() -> bool:
        try:
            found["configs"] = described(cluster, topic)
        except AssertionError:
            return False
        return True

    wait_for(learnt, timeout_s=CALL_TIMEOUT_S, what=f"broker 1 to describe {topic}")
    return found["configs"]


def test_confluent_admin_creates_a_compacted_changelog_and_describes_it_back(cluster):
    admin = AdminClient({"bootstrap.servers": cluster.kafka_bootstrap()})
    created = admin.create_topics(
        [ConfluentNewTopic("changelog-c", 2, 3, config=CHANGELOG)], operation_timeout=10
    )
    created["changelog-c"].result(timeout=CALL_TIMEOUT_S)

    def confluent_describe() -> dict[str, Any] | None:
        future = admin.describe_configs([ConfigResource(ConfigResource.Type.TOPIC, "changelog-c")])
        try:
            return dict(next(iter(future.values())).result(timeout=CALL_TIMEOUT_S))
        except Exception:  # UNKNOWN_TOPIC_OR_PARTITION until the broker has the topic
            return None

    entries: dict[str, Any] = {}
    wait_for(
        lambda: bool(entries.update(confluent_describe() or {}) or entries),
        timeout_s=CALL_TIMEOUT_S,
        what="confluent-kafka to describe changelog-c",
    )
    for name, value in CHANGELOG.items():
        entry = entries[name]
        assert (entry.value, entry.source, entry.is_default) == (
            value,
            ConfigSource.DYNAMIC_TOPIC_CONFIG.value,
            False,
        ), name
    # Unset: Kafka's default, as Kafka describes it.
    assert (entries["delete.retention.ms"].value, entries["delete.retention.ms"].is_default) == (
        "86400000",
        True,
    )
    assert entries["compression.type"].value == "producer"

    raw = wait_described(cluster, "changelog-c")
    assert raw["cleanup.policy"] == ("compact", SOURCE_TOPIC_CONFIG, 7, None), "LIST, honoured"
    assert raw["min.cleanable.dirty.ratio"] == ("0.01", SOURCE_TOPIC_CONFIG, 6, None), "DOUBLE, honoured"
    documentation = raw["preallocate"][3]
    assert documentation is not None and documentation.startswith("no effect here: ")
    assert raw["retention.ms"][:3] == ("-1", SOURCE_TOPIC_CONFIG, 5), "LONG"

    refused = admin.create_topics(
        [ConfluentNewTopic("changelog-c-bad", 1, 3, config={"min.cleanable.dirty.ratio": "1.5"})],
        operation_timeout=10,
    )
    with pytest.raises(Exception, match=r"min.cleanable.dirty.ratio must be a number from 0 to 1, got '1.5'"):
        refused["changelog-c-bad"].result(timeout=CALL_TIMEOUT_S)


def test_confluent_admin_creates_alters_and_describes_the_compaction_configs(cluster):
    admin = AdminClient({"bootstrap.servers": cluster.kafka_bootstrap()})
    compaction = {
        "cleanup.policy": "compact",
        "min.compaction.lag.ms": "60000",
        "max.compaction.lag.ms": "3600000",
        "delete.retention.ms": "1000",
    }
    created = admin.create_topics(
        [ConfluentNewTopic("changelog-lags", 1, 3, config=compaction)], operation_timeout=10
    )
    created["changelog-lags"].result(timeout=CALL_TIMEOUT_S)
    raw = wait_described(cluster, "changelog-lags")
    for name, value in compaction.items():
        assert raw[name][:2] == (value, SOURCE_TOPIC_CONFIG) and raw[name][3] is None, name
    assert raw["min.cleanable.dirty.ratio"][:2] == ("0.5", SOURCE_DEFAULT_CONFIG)

    def set_configs(entries: dict[str, str]) -> None:
        resource = ConfigResource(
            ConfigResource.Type.TOPIC,
            "changelog-lags",
            incremental_configs=[
                ConfigEntry(name, value, incremental_operation=AlterConfigOpType.SET)
                for name, value in entries.items()
            ],
        )
        (future,) = admin.incremental_alter_configs([resource]).values()
        future.result(timeout=CALL_TIMEOUT_S)

    # Below the topic's min.compaction.lag.ms: refused as Kafka refuses it, naming both configs.
    with pytest.raises(
        Exception,
        match=r"min\.compaction\.lag\.ms=60000 \(the topic's current value\) is larger than "
        r"max\.compaction\.lag\.ms=1000",
    ):
        set_configs({"max.compaction.lag.ms": "1000"})
    set_configs({"min.cleanable.dirty.ratio": "0.2", "delete.retention.ms": "0"})

    def altered() -> bool:
        now = described(cluster, "changelog-lags")
        return now["delete.retention.ms"][:2] == ("0", SOURCE_TOPIC_CONFIG) and now[
            "min.cleanable.dirty.ratio"
        ][:2] == ("0.2", SOURCE_TOPIC_CONFIG)

    wait_for(altered, timeout_s=CALL_TIMEOUT_S, what="broker 1 to describe the altered configs")
    assert described(cluster, "changelog-lags")["max.compaction.lag.ms"][:2] == (
        "3600000",
        SOURCE_TOPIC_CONFIG,
    )


def test_kafka_python_creates_changelogs_with_every_policy_and_is_refused_a_bad_value(cluster):
    admin = KafkaAdminClient(bootstrap_servers=cluster.kafka_bootstrap(), request_timeout_ms=10_000)
    try:
        admin.create_topics(
            [
                PythonNewTopic("changelog-py", 1, 3, topic_configs=CHANGELOG),
                PythonNewTopic(
                    "changelog-py-both",
                    1,
                    3,
                    topic_configs={"cleanup.policy": "delete,compact", "segment.jitter.ms": "100"},
                ),
            ],
            timeout_ms=10_000,
        )
        raw = wait_described(cluster, "changelog-py")
        for name, value in CHANGELOG.items():
            assert raw[name][:2] == (value, SOURCE_TOPIC_CONFIG), name
        both = wait_described(cluster, "changelog-py-both")
        assert both["cleanup.policy"][:2] == ("compact,delete", SOURCE_TOPIC_CONFIG)
        assert both["segment.jitter.ms"][:2] == ("100", SOURCE_TOPIC_CONFIG)
        assert both["retention.ms"][:2] == ("604800000", SOURCE_DEFAULT_CONFIG)

        answer = admin.describe_configs(
            [PythonConfigResource(ConfigResourceType.TOPIC, "changelog-py")], config_filter="all"
        )
        assert "cleanup.policy" in str(answer) and "compact" in str(answer)

        with pytest.raises(kafka_errors.InvalidConfigurationError, match=r"cleanup\.policy"):
            admin.create_topics(
                [PythonNewTopic("changelog-py-bad", 1, 3, topic_configs={"cleanup.policy": "shred"})],
                timeout_ms=10_000,
            )
        with pytest.raises(kafka_errors.InvalidConfigurationError, match="tiered storage"):
            admin.create_topics(
                [
                    PythonNewTopic(
                        "changelog-py-tiered", 1, 3, topic_configs={"remote.storage.enable": "true"}
                    )
                ],
                timeout_ms=10_000,
            )
    finally:
        admin.close()

    with Admin(cluster.gateway_address, **FAST) as ours:
        (topic,) = ours.describe_topics("changelog-py")
    assert (
        topic.config["cleanup.policy"] == "compact"
        and topic.config_sources["cleanup.policy"] == "TOPIC_CONFIG"
    )
    assert topic.config["min.cleanable.dirty.ratio"] == 0.01
    assert topic.config["preallocate"] is False and topic.config_sources["preallocate"] == "DEFAULT_CONFIG"
