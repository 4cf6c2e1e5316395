"""Changing a topic's configs: the schema's rules, the controller's decision, the Kafka requests'
translation, and a broker's replicas taking the new values."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from kio.schema.errors import ErrorCode as K

from clients.common.errors import InvalidConfig, InvalidRequest
from clients.common.records import Record, encode_batch
from clients.common.topics import (
    TOPIC_CONFIG_SCHEMA,
    altered_topic_configs,
    effective_topic_configs,
    topic_config_proto,
    topic_configs_from_proto,
)
from protos.highwater.v1 import broker_pb2, common_pb2
from services.common import limits
from services.controller import handlers
from services.controller.results import ConfigWrite
from services.kafka import config_changes, protocol
from services.kafka.handler import topic_config_entries
from tests.unit.broker_seams import lone_leader, partition_error
from tests.unit.test_controller_handlers import commit, context, with_topic
from tests.unit.test_kafka_acl_rules import access, decided

# ---- the schema --------------------------------------------------------------------------------


def test_a_change_sets_and_deletes_the_named_keys_and_keeps_the_rest() -> None:
    current = {"retention.ms": "1000", "max.message.bytes": "5000", "min.insync.replicas": "2"}
    new = altered_topic_configs(current, {"retention.ms": " 2000 "}, ["max.message.bytes"])
    assert new == {"retention.ms": "2000", "min.insync.replicas": "2"}


def test_a_replacing_change_returns_every_unnamed_key_to_its_default() -> None:
    current = {"retention.ms": "1000", "min.insync.replicas": "2"}
    assert altered_topic_configs(current, {"segment.ms": "60000"}, [], replace=True) == {
        "segment.ms": "60000"
    }


def test_an_unknown_name_is_refused_naming_it_and_the_known_ones_whether_set_or_deleted() -> None:
    for set_configs, deleted in (({"retention.mss": "1"}, []), ({}, ["retention.mss"])):
        with pytest.raises(InvalidConfig) as raised:
            altered_topic_configs({}, set_configs, deleted)
        assert "'retention.mss'" in raised.value.message
        assert all(name in raised.value.message for name in TOPIC_CONFIG_SCHEMA)


def test_a_value_out_of_bounds_is_refused_with_the_bounds() -> None:
    with pytest.raises(InvalidConfig, match=r"max.message.bytes must be an integer from 61 to"):
        altered_topic_configs({}, {"max.message.bytes": "10"}, [])
    with pytest.raises(InvalidConfig, match=r"retention.ms must be -1 \(unlimited\) or"):
        altered_topic_configs({}, {"retention.ms": "0"}, [])


def test_a_key_both_set_and_deleted_is_an_invalid_request() -> None:
    with pytest.raises(InvalidRequest, match="both set and deleted"):
        altered_topic_configs({}, {"retention.ms": "5"}, ["retention.ms"])


def test_effective_configs_show_every_default_and_where_each_value_comes_from() -> None:
    entries = {e.name: e for e in effective_topic_configs({"retention.ms": "5"})}
    assert list(entries) == list(TOPIC_CONFIG_SCHEMA)
    assert (entries["retention.ms"].value, entries["retention.ms"].source) == ("5", "TOPIC_CONFIG")
    assert entries["max.message.bytes"].value == str(limits.MAX_MESSAGE_BYTES)
    assert entries["segment.bytes"].value == str(limits.LOG_SEGMENT_BYTES_DEFAULT)
    assert entries["min.insync.replicas"].value == "1"
    assert entries["unclean.leader.election.enable"].typed() is False
    assert all(e.source == "DEFAULT_CONFIG" for name, e in entries.items() if name != "retention.ms")


def test_a_config_set_to_its_default_value_is_still_reported_as_the_topics_own() -> None:
    """min.insync.replicas=1 and unclean.leader.election.enable=false were indistinguishable from
    unset on the wire: both are optional fields now."""
    configs = {"min.insync.replicas": "1", "unclean.leader.election.enable": "false"}
    assert topic_configs_from_proto(topic_config_proto(configs)) == configs
    assert topic_configs_from_proto(topic_config_proto({})) == {}
    sources = {name: set_here for name, _, set_here in topic_config_entries(topic_config_proto(configs))}
    assert sources["min.insync.replicas"] and sources["unclean.leader.election.enable"]
    assert not sources["retention.ms"]


def test_every_schema_value_survives_the_wire() -> None:
    configs = {
        "min.insync.replicas": "2",
        "unclean.leader.election.enable": "true",
        "retention.ms": "-1",
        "retention.bytes": "123456",
        "segment.bytes": "2048",
        "segment.ms": "1",
        "max.message.bytes": "100000",
        "message.timestamp.type": "LogAppendTime",
        "message.timestamp.before.max.ms": "0",
        "message.timestamp.after.max.ms": "0",
        "cleanup.policy": "compact,delete",
        # 0 is legal for these: their fields are optional, so a 0 set on the topic is not lost.
        "min.cleanable.dirty.ratio": "0.0",
        "min.compaction.lag.ms": "0",
        "max.compaction.lag.ms": "1",
        "delete.retention.ms": "0",
    }
    # Every honoured config has its own field (the accepted ones travel as text: see
    # tests/unit/test_topic_configs_kafka_names.py).
    assert set(configs) == {name for name, key in TOPIC_CONFIG_SCHEMA.items() if key.honoured}
    assert topic_configs_from_proto(topic_config_proto(configs)) == configs


# ---- the controller's decision --------------------------------------------------------------------


def alter(
    name: str,
    set_configs: dict[str, str] | None = None,
    delete: list[str] | None = None,
    *,
    replace: bool = False,
    validate_only: bool = False,
) -> common_pb2.AlterTopicConfigsRequest:
    return common_pb2.AlterTopicConfigsRequest(
        topics=[
            common_pb2.AlterTopicConfigsTopic(
                name=name, set_configs=set_configs or {}, delete_configs=delete or [], replace=replace
            )
        ],
        validate_only=validate_only,
    )


def test_alter_writes_the_new_configs_and_tells_every_broker_of_each_partition() -> None:
    ctx = context([1, 2, 3])
    with_topic(ctx, "orders", {0: (1, 2, 3), 1: (2, 3, 1)}, {"retention.ms": "1000"})
    result = handlers.on_alter_topic_configs(
        ctx, alter("orders", {"max.message.bytes": "4096", "min.insync.replicas": "2"}, ["retention.ms"])
    )
    (answer,) = result.response.topics
    assert (answer.error_code, answer.num_partitions, answer.replication_factor) == (common_pb2.NONE, 2, 3)
    assert result.writes == [ConfigWrite("orders", {"max.message.bytes": "4096", "min.insync.replicas": "2"})]
    assert result.rpcs.update_metadata == {("orders", 0), ("orders", 1)}
    assert ctx.topics["orders"].configs == {"retention.ms": "1000"}, "decided, not yet applied"
    commit(ctx, result)
    assert ctx.topics["orders"].configs == {"max.message.bytes": "4096", "min.insync.replicas": "2"}
    assert ctx.topics["orders"].min_insync_replicas == 2


def test_validate_only_answers_and_changes_nothing() -> None:
    ctx = context([1])
    with_topic(ctx, "t", {0: (1,)})
    result = handlers.on_alter_topic_configs(ctx, alter("t", {"retention.ms": "5"}, validate_only=True))
    assert result.response.topics[0].error_code == common_pb2.NONE
    assert result.writes == [] and result.rpcs.is_empty()


def test_a_change_to_the_same_configs_writes_nothing() -> None:
    ctx = context([1])
    with_topic(ctx, "t", {0: (1,)}, {"retention.ms": "5"})
    result = handlers.on_alter_topic_configs(ctx, alter("t", {"retention.ms": "5"}))
    assert result.response.topics[0].error_code == common_pb2.NONE
    assert result.writes == [] and result.rpcs.is_empty()


def test_alter_replace_keeps_only_what_it_names() -> None:
    ctx = context([1])
    with_topic(ctx, "t", {0: (1,)}, {"retention.ms": "5", "segment.ms": "10"})
    result = handlers.on_alter_topic_configs(ctx, alter("t", {"segment.ms": "20"}, replace=True))
    assert result.writes == [ConfigWrite("t", {"segment.ms": "20"})]


def test_each_topic_is_answered_on_its_own() -> None:
    ctx = context([1, 2])
    with_topic(ctx, "t", {0: (1, 2)})
    req = common_pb2.AlterTopicConfigsRequest(
        topics=[
            common_pb2.AlterTopicConfigsTopic(name="missing", set_configs={"retention.ms": "5"}),
            common_pb2.AlterTopicConfigsTopic(name="t", set_configs={"min.insync.replicas": "3"}),
            common_pb2.AlterTopicConfigsTopic(name="t", set_configs={"bogus": "1"}),
            common_pb2.AlterTopicConfigsTopic(name="t", set_configs={"retention.ms": "7"}),
        ]
    )
    result = handlers.on_alter_topic_configs(ctx, req)
    codes = [(a.name, a.error_code) for a in result.response.topics]
    assert codes == [
        ("missing", common_pb2.UNKNOWN_TOPIC_OR_PARTITION),
        ("t", common_pb2.INVALID_CONFIG),  # min.insync.replicas above the replication factor
        ("t", common_pb2.INVALID_REQUEST),  # named twice
        ("t", common_pb2.INVALID_REQUEST),
    ]
    assert "larger than the replication factor 2" in result.response.topics[1].error_message
    assert result.writes == []


def test_a_topic_being_deleted_cannot_be_altered() -> None:
    ctx = context([1])
    with_topic(ctx, "t", {0: (1,)})
    ctx.topics_to_delete.add("t")
    result = handlers.on_alter_topic_configs(ctx, alter("t", {"retention.ms": "5"}))
    assert result.response.topics[0].error_code == common_pb2.UNKNOWN_TOPIC_OR_PARTITION
    assert result.writes == []


# ---- Kafka's requests, read into the controller's change -----------------------------------------


def kafka_resource(
    *configs: tuple[str, int, str | None], resource_type: int = config_changes.RESOURCE_TOPIC
) -> SimpleNamespace:
    return SimpleNamespace(
        resource_type=resource_type,
        resource_name="t",
        configs=[SimpleNamespace(name=n, config_operation=op, value=v) for n, op, v in configs],
    )


def test_incremental_set_and_delete_keep_the_other_keys() -> None:
    change = config_changes.topic_change(
        kafka_resource(
            ("retention.ms", config_changes.OP_SET, "5"), ("segment.ms", config_changes.OP_DELETE, None)
        ),
        incremental=True,
    )
    assert dict(change.set_configs) == {"retention.ms": "5"}
    assert list(change.delete_configs) == ["segment.ms"] and not change.replace


def test_alter_configs_replaces_the_whole_config() -> None:
    change = config_changes.topic_change(kafka_resource(("retention.ms", 0, "5")), incremental=False)
    assert dict(change.set_configs) == {"retention.ms": "5"} and change.replace


@pytest.mark.parametrize("operation", [config_changes.OP_APPEND, config_changes.OP_SUBTRACT])
def test_append_and_subtract_are_invalid_config_for_a_config_that_is_not_a_list(operation: int) -> None:
    with pytest.raises(config_changes.Refused) as raised:
        config_changes.topic_change(kafka_resource(("retention.ms", operation, "5")), incremental=True)
    assert raised.value.code == K.invalid_config and "not a list" in raised.value.message


def test_a_null_set_a_duplicate_key_or_an_unknown_operation_is_an_invalid_request() -> None:
    for resource in (
        kafka_resource(("retention.ms", config_changes.OP_SET, None)),
        kafka_resource(
            ("retention.ms", config_changes.OP_SET, "1"), ("retention.ms", config_changes.OP_DELETE, None)
        ),
        kafka_resource(("retention.ms", 9, "1")),
    ):
        with pytest.raises(config_changes.Refused) as raised:
            config_changes.topic_change(resource, incremental=True)
        assert raised.value.code == K.invalid_request


def test_a_broker_resource_is_refused_as_not_dynamic_and_a_topic_is_not() -> None:
    refusal = config_changes.refusal_of_resource_type(config_changes.RESOURCE_BROKER, "1")
    assert refusal is not None and refusal.code == K.invalid_request
    assert "not dynamic" in refusal.message and "restart" in refusal.message
    assert config_changes.refusal_of_resource_type(config_changes.RESOURCE_TOPIC, "t") is None


# ---- a broker's replicas take the new values ----------------------------------------------------


def test_an_update_metadata_with_a_changed_config_reaches_the_live_log_and_the_min_isr() -> None:
    b = lone_leader()
    big = encode_batch([Record(None, b"x" * 500, [], 1_000)])
    (first,) = b.produce(big, acks=1)
    assert partition_error(first) == common_pb2.NONE
    config = topic_config_proto(
        {"max.message.bytes": "200", "min.insync.replicas": "2", "retention.ms": "60000"}
    )
    resp = b.core.update_metadata(
        broker_pb2.UpdateMetadataRequest(header=b.header(), topic_configs={"t": config})
    )
    assert resp.error_code == common_pb2.NONE
    p = b.core.partitions[("t", 0)]
    assert (p.log.config.max_message_bytes, p.log.config.retention_ms) == (200, 60_000)
    (too_large,) = b.produce(big, acks=1)
    assert partition_error(too_large) == common_pb2.MESSAGE_TOO_LARGE
    small = encode_batch([Record(None, b"y", [], 1_000)])
    (below_min_isr,) = b.produce(small, acks=-1)
    assert partition_error(below_min_isr) == common_pb2.NOT_ENOUGH_REPLICAS
    # Back to the defaults: an UpdateMetadata with the topic's config now empty.
    b.core.update_metadata(
        broker_pb2.UpdateMetadataRequest(header=b.header(), topic_configs={"t": topic_config_proto({})})
    )
    assert p.log.config.max_message_bytes == limits.MAX_MESSAGE_BYTES and p.min_insync_replicas == 1
    (again,) = b.produce(big, acks=-1)
    assert partition_error(again) == common_pb2.NONE


def test_altering_a_topics_configs_over_kafka_needs_alter_on_the_topic() -> None:
    a = access(("Alter", "Topic", "mine"), ("Describe", "Topic", "theirs"))
    resources = SimpleNamespace(
        resources=[
            SimpleNamespace(resource_type=config_changes.RESOURCE_TOPIC, resource_name="mine"),
            SimpleNamespace(resource_type=config_changes.RESOURCE_TOPIC, resource_name="theirs"),
            SimpleNamespace(resource_type=config_changes.RESOURCE_BROKER, resource_name="1"),
        ]
    )
    for api_key in (protocol.ALTER_CONFIGS, protocol.INCREMENTAL_ALTER_CONFIGS):
        assert decided(a, api_key, resources).topics_refused == {"theirs"}
