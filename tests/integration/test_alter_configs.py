"""Topic configs changed through every door (issue 38): kafkajs' AlterConfigs, kafka-python's
IncrementalAlterConfigs and AlterConfigs, the gRPC Admin and the CLI; described with their
effective values and sources; taken by every broker (each one's DescribeConfigs answers from
its own metadata, and a lowered max.message.bytes refuses a larger produce)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from click.testing import CliRunner
from kafka import KafkaAdminClient, KafkaProducer
from kafka import errors as kafka_errors
from kafka.admin import AlterConfigOp, ConfigResource, ConfigResourceType

from clients import Admin, NewTopic
from clients.common.errors import InvalidConfig
from clients.tools.cli import cli
from services.kafka import protocol
from tests.integration.helpers import wait_for
from tests.integration.kafkajs_client import run_kafkajs
from tests.integration.test_kafka_protocol import (
    CALL_TIMEOUT_S,
    FAST,
    create,
    kafka_address,
    raw_call,
    read_answer,
)

pytestmark = pytest.mark.integration

KAFKA_PYTHON = {"request_timeout_ms": 10_000}


def described_by_broker(cluster: Any, broker_id: int, topic: str) -> dict[str, tuple[str, int]]:
    """{config: (value, config_source)} from one broker's own Kafka DescribeConfigs."""
    cls = protocol.request_class(protocol.DESCRIBE_CONFIGS, 4)
    resource_cls = __import__(cls.__module__, fromlist=["x"]).DescribeConfigsResource
    body = cls(
        resources=(resource_cls(resource_type=2, resource_name=topic, configuration_keys=None),),
        include_synonyms=False,
        include_documentation=False,
    )
    answer = read_answer(
        protocol.DESCRIBE_CONFIGS,
        4,
        raw_call(kafka_address(cluster, broker_id), protocol.DESCRIBE_CONFIGS, 4, body),
    )
    (result,) = answer.results
    assert result.error_code == 0, result.error_message
    return {c.name: (c.value, int(c.config_source)) for c in result.configs}


def wait_every_broker_says(cluster: Any, topic: str, name: str, value: str, source: int) -> None:
    wait_for(
        lambda: all(described_by_broker(cluster, b, topic).get(name) == (value, source) for b in (1, 2, 3)),
        timeout_s=CALL_TIMEOUT_S,
        what=f"every broker to describe {topic}'s {name} as {value} (source {source})",
    )


_KAFKAJS_ALTER = """
const topic = %(topic)r;
const admin = kafka.admin();
await admin.connect();
const { TOPIC, BROKER } = kafkajs.ConfigResourceTypes;
const describe = async () => {
  const { resources } = await admin.describeConfigs({
    resources: [{ type: TOPIC, name: topic }], includeSynonyms: false,
  });
  const out = {};
  for (const e of resources[0].configEntries) {
    out[e.configName] = [e.configValue, e.isDefault, e.configSource];
  }
  return out;
};
const before = await describe();
await admin.alterConfigs({
  validateOnly: false,
  resources: [{ type: TOPIC, name: topic, configEntries: [{ name: 'retention.ms', value: '3600000' }] }],
});
const after = await describe();
let broker = null;
try {
  await admin.alterConfigs({
    resources: [{ type: BROKER, name: '1', configEntries: [{ name: 'log.retention.ms', value: '1' }] }],
  });
} catch (e) {
  broker = [e.name, e.type];
}
let unknown = null;
try {
  await admin.alterConfigs({
    resources: [{ type: TOPIC, name: topic, configEntries: [{ name: 'retention.mss', value: '1' }] }],
  });
} catch (e) {
  unknown = [e.name, e.type];
}
await admin.disconnect();
return { before, after, broker, unknown };
"""


def test_kafkajs_alter_configs_and_describe_configs_show_the_new_value_and_its_source(cluster):
    create(cluster, "alter-js", partitions=1)
    out = run_kafkajs(str(cluster.kafka_bootstrap()).split(","), _KAFKAJS_ALTER % {"topic": "alter-js"})
    assert out["before"]["retention.ms"] == ["604800000", True, 5], "the default, DEFAULT_CONFIG"
    assert out["before"]["min.insync.replicas"] == ["2", False, 1], "set at creation: TOPIC_CONFIG"
    assert out["after"]["retention.ms"] == ["3600000", False, 1]
    # AlterConfigs replaces the whole config: min.insync.replicas, not named, is back to its default.
    assert out["after"]["min.insync.replicas"] == ["1", True, 5]
    assert out["broker"] == ["KafkaJSProtocolError", "INVALID_REQUEST"], "broker configs are not dynamic"
    assert out["unknown"] == ["KafkaJSProtocolError", "INVALID_CONFIG"]
    wait_every_broker_says(cluster, "alter-js", "retention.ms", "3600000", 1)


def test_kafka_python_incremental_and_plain_alter_configs_reach_every_broker(cluster):
    create(cluster, "alter-py", partitions=1)
    bootstrap = cluster.kafka_bootstrap()
    admin = KafkaAdminClient(bootstrap_servers=bootstrap, **KAFKA_PYTHON)
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all", retries=0, **KAFKA_PYTHON)
    try:
        assert producer.send("alter-py", b"x" * 5000).get(timeout=CALL_TIMEOUT_S) is not None

        topic = ConfigResourceType.TOPIC
        result = admin.alter_configs(
            [ConfigResource(topic, "alter-py", configs={"max.message.bytes": "2000"})], incremental=True
        )
        assert result == {"topic": {"alter-py": "OK"}}
        wait_every_broker_says(cluster, "alter-py", "max.message.bytes", "2000", 1)
        with pytest.raises(kafka_errors.MessageSizeTooLargeError):
            producer.send("alter-py", b"x" * 5000).get(timeout=CALL_TIMEOUT_S)

        # APPEND applies to list configs only: INVALID_CONFIG, and nothing changes.
        result = admin.alter_configs(
            [ConfigResource(topic, "alter-py", configs={"retention.ms": (AlterConfigOp.APPEND, "1")})],
            incremental=True,
        )
        assert "[Error 40] InvalidConfigurationError" in result["topic"]["alter-py"], result

        # validate_only changes nothing; DELETE returns the config to its default.
        result = admin.alter_configs(
            [ConfigResource(topic, "alter-py", configs={"max.message.bytes": "100"})],
            validate_only=True,
            incremental=True,
        )
        assert result == {"topic": {"alter-py": "OK"}}
        assert described_by_broker(cluster, 1, "alter-py")["max.message.bytes"] == ("2000", 1)
        result = admin.alter_configs(
            [ConfigResource(topic, "alter-py", configs={"max.message.bytes": (AlterConfigOp.DELETE, None)})],
            incremental=True,
        )
        assert result == {"topic": {"alter-py": "OK"}}
        wait_every_broker_says(cluster, "alter-py", "max.message.bytes", "1048588", 5)
        assert producer.send("alter-py", b"x" * 5000).get(timeout=CALL_TIMEOUT_S) is not None

        # The plain AlterConfigs (kafka-python fills in the other modified keys itself).
        result = admin.alter_configs(
            [ConfigResource(topic, "alter-py", configs={"segment.ms": "600000"})], incremental=False
        )
        assert result == {"topic": {"alter-py": "OK"}}
        wait_every_broker_says(cluster, "alter-py", "segment.ms", "600000", 1)
        assert described_by_broker(cluster, 2, "alter-py")["min.insync.replicas"] == ("2", 1), "kept"

        result = admin.alter_configs(
            [ConfigResource(ConfigResourceType.BROKER, "1", configs={"log.retention.ms": "1"})],
            raise_on_unknown=False,
            incremental=True,
        )
        assert (
            "[Error 42] InvalidRequestError" in result["broker"]["1"]
            and "not dynamic" in result["broker"]["1"]
        )
    finally:
        producer.close(timeout=5)
        admin.close()


def test_grpc_admin_alters_describes_effective_values_and_names_unknown_configs(cluster):
    with Admin(cluster.gateway_address, **FAST) as admin:
        admin.create_topics("alter-grpc", 2, 3)
        (before,) = admin.describe_topics("alter-grpc")
        assert (
            before.config["retention.ms"] == 604_800_000 and before.config["max.message.bytes"] == 1_048_588
        )
        assert before.config["unclean.leader.election.enable"] is False
        assert set(before.config_sources.values()) == {"DEFAULT_CONFIG"}

        admin.alter_topic_configs("alter-grpc", set={"retention.ms": "60000", "min.insync.replicas": "1"})
        (after,) = admin.describe_topics("alter-grpc")
        assert (
            after.config["retention.ms"] == 60_000 and after.config_sources["retention.ms"] == "TOPIC_CONFIG"
        )
        assert after.config_sources["min.insync.replicas"] == "TOPIC_CONFIG", (
            "set, though to the default value"
        )

        admin.alter_topic_configs("alter-grpc", delete=["retention.ms"])
        (deleted,) = admin.describe_topics("alter-grpc")
        assert deleted.config["retention.ms"] == 604_800_000
        assert deleted.config_sources["retention.ms"] == "DEFAULT_CONFIG"
        assert deleted.config_sources["min.insync.replicas"] == "TOPIC_CONFIG", "kept"

        with pytest.raises(
            InvalidConfig, match=r"unknown topic config 'retention.mss'; known: .*max.message.bytes"
        ):
            admin.alter_topic_configs("alter-grpc", set={"retention.mss": "1"})
        with pytest.raises(InvalidConfig, match="larger than the replication factor 3"):
            admin.alter_topic_configs("alter-grpc", set={"min.insync.replicas": "4"})
    wait_every_broker_says(cluster, "alter-grpc", "min.insync.replicas", "1", 1)


def test_cli_alter_config_then_describe(cluster):
    runner = CliRunner()
    base = ["--bootstrap", cluster.gateway_address]
    result = runner.invoke(cli, [*base, "topic", "create", "alter-cli", "-p", "1", "-r", "3"])
    assert result.exit_code == 0, result.output
    result = runner.invoke(
        cli,
        [
            *base,
            "topic",
            "alter-config",
            "alter-cli",
            "--set",
            "segment.bytes=1048576",
            "--set",
            "retention.bytes=5000000",
        ],
    )
    assert result.exit_code == 0, result.output
    assert "changed topic alter-cli" in result.output
    result = runner.invoke(cli, [*base, "-o", "json", "topic", "describe", "alter-cli"])
    assert result.exit_code == 0, result.output
    [described] = json.loads(result.output)
    assert described["config"]["segment.bytes"] == 1_048_576
    assert described["config_sources"]["retention.bytes"] == "TOPIC_CONFIG"
    assert described["config_sources"]["segment.ms"] == "DEFAULT_CONFIG"

    result = runner.invoke(cli, [*base, "topic", "alter-config", "alter-cli", "--delete", "segment.bytes"])
    assert result.exit_code == 0, result.output
    result = runner.invoke(cli, [*base, "topic", "describe", "alter-cli"])
    assert result.exit_code == 0, result.output
    assert "retention.bytes" in result.output and "5000000" in result.output

    result = runner.invoke(cli, [*base, "topic", "alter-config", "alter-cli", "--set", "segment.bytes=1"])
    assert result.exit_code != 0
    assert "segment.bytes must be an integer from 1024" in result.output
    wait_every_broker_says(cluster, "alter-cli", "retention.bytes", "5000000", 1)


def test_a_raised_min_insync_replicas_refuses_the_leaders_next_acks_all_produce(make_cluster):
    """With one replica down (ISR 2 of 3), min.insync.replicas 3 refuses acks=all at once and 2
    accepts it again: the leader takes the topic's new config, no restart or leader change."""
    c = make_cluster(brokers=3)
    with Admin(c.gateway_address, **FAST) as admin:
        admin.create_topics(NewTopic("alter-min-isr", assignments={0: [1, 2, 3]}))
        c.kill_broker(3)
        wait_for(
            lambda: admin.describe_topics("alter-min-isr")[0].partitions[0].isr == (1, 2),
            timeout_s=CALL_TIMEOUT_S,
            what="broker 3 to leave the ISR of alter-min-isr-0",
        )
        producer = KafkaProducer(bootstrap_servers=c.kafka_bootstrap(), acks="all", retries=0, **KAFKA_PYTHON)
        try:
            # ISR 2, min.insync.replicas 1 (the default): accepted.
            assert producer.send("alter-min-isr", b"before").get(timeout=CALL_TIMEOUT_S) is not None
            admin.alter_topic_configs("alter-min-isr", set={"min.insync.replicas": "3"})
            with pytest.raises(kafka_errors.NotEnoughReplicasError):
                producer.send("alter-min-isr", b"refused").get(timeout=CALL_TIMEOUT_S)
            admin.alter_topic_configs("alter-min-isr", set={"min.insync.replicas": "2"})
            assert producer.send("alter-min-isr", b"after").get(timeout=CALL_TIMEOUT_S) is not None
        finally:
            producer.close(timeout=5)
