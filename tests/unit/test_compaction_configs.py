"""The compaction configs (issue 39): min.cleanable.dirty.ratio, min.compaction.lag.ms,
max.compaction.lag.ms and delete.retention.ms are honoured topic configs, from the one schema
(clients/common/topics.py) through the controller's decisions and the wire (TopicConfig) to each
replica's LogConfig and DescribeConfigs; a topic created before they were honoured (the names
carried in TopicConfig.unserved_configs) keeps its values; and Kafka's relation between the two
lags is checked at create, alter and when stored values are read back."""

from __future__ import annotations

import pytest

from clients.admin import topic_config_dict, topic_config_sources
from clients.common.errors import InvalidConfig
from clients.common.topics import (
    KAFKA_CONFIG_TYPE_DOUBLE,
    KAFKA_CONFIG_TYPE_LONG,
    TOPIC_CONFIG_SCHEMA,
    altered_topic_configs,
    effective_topic_configs,
    stored_topic_configs,
    topic_config_note,
    topic_config_proto,
    topic_configs_from_proto,
    validate_topic_configs,
)
from protos.highwater.v1 import common_pb2
from services.broker.core import log_config_from
from services.broker.log import LogConfig
from services.controller import handlers
from services.controller.results import ConfigWrite
from services.kafka.handler import topic_config_entries
from tests.unit.test_alter_configs import alter
from tests.unit.test_controller_handlers import context, with_topic

INT64_MAX = 2**63 - 1
DAY_MS = 86_400_000

COMPACTION_CONFIGS = (
    "min.cleanable.dirty.ratio",
    "min.compaction.lag.ms",
    "max.compaction.lag.ms",
    "delete.retention.ms",
)
# Kafka's defaults (LogConfig / TopicConfig) as DescribeConfigs shows them.
KAFKA_DEFAULTS = {
    "min.cleanable.dirty.ratio": "0.5",
    "min.compaction.lag.ms": "0",
    "max.compaction.lag.ms": str(INT64_MAX),
    "delete.retention.ms": str(DAY_MS),
}
# A changelog as a framework would tune it, each value off its default.
TUNED = {
    "cleanup.policy": "compact",
    "min.cleanable.dirty.ratio": "0.01",
    "min.compaction.lag.ms": "60000",
    "max.compaction.lag.ms": "3600000",
    "delete.retention.ms": "1000",
}


# ---- LogConfig ---------------------------------------------------------------------------------


def test_log_config_defaults_are_kafkas() -> None:
    config = LogConfig()
    assert (
        config.min_cleanable_dirty_ratio,
        config.min_compaction_lag_ms,
        config.max_compaction_lag_ms,
        config.delete_retention_ms,
    ) == (0.5, 0, INT64_MAX, DAY_MS)
    assert not config.compact


@pytest.mark.parametrize(
    ("policy", "compact", "retention"),
    [("delete", False, True), ("compact", True, False), ("compact,delete", True, True)],
)
def test_compact_and_retention_follow_the_policy(policy: str, compact: bool, retention: bool) -> None:
    config = LogConfig(cleanup_policy=policy)
    assert (config.compact, config.retention_applies) == (compact, retention)


@pytest.mark.parametrize(
    ("fields", "words"),
    [
        ({"min_cleanable_dirty_ratio": -0.1}, "min_cleanable_dirty_ratio -0.1 must be between 0 and 1"),
        ({"min_cleanable_dirty_ratio": 1.5}, "min_cleanable_dirty_ratio 1.5 must be between 0 and 1"),
        ({"min_compaction_lag_ms": -1}, "min_compaction_lag_ms -1 must be 0.."),
        ({"max_compaction_lag_ms": 0}, "max_compaction_lag_ms 0 must be 1.."),
        (
            {"min_compaction_lag_ms": 10, "max_compaction_lag_ms": 5},
            "max_compaction_lag_ms 5 must be >= min_compaction_lag_ms 10",
        ),
        ({"delete_retention_ms": -1}, "delete_retention_ms -1 must be 0.."),
    ],
)
def test_log_config_refuses_compaction_values_out_of_bounds(fields: dict[str, float], words: str) -> None:
    with pytest.raises(InvalidConfig) as refused:
        LogConfig(**fields)  # type: ignore[arg-type]
    assert words in refused.value.message


def test_log_config_takes_the_bounds_themselves() -> None:
    config = LogConfig(
        min_cleanable_dirty_ratio=0.0,
        min_compaction_lag_ms=7,
        max_compaction_lag_ms=7,
        delete_retention_ms=0,
    )
    assert (config.min_compaction_lag_ms, config.max_compaction_lag_ms) == (7, 7)
    assert LogConfig(min_cleanable_dirty_ratio=1.0).min_cleanable_dirty_ratio == 1.0


def test_a_compacted_log_rolls_by_max_compaction_lag_when_it_is_sooner() -> None:
    # Kafka's maxSegmentMs: the cleaner never takes the active segment, so it must roll in time.
    assert LogConfig(segment_ms=10_000, max_compaction_lag_ms=2_000).max_segment_ms == 10_000
    compacted = LogConfig(cleanup_policy="compact", segment_ms=10_000, max_compaction_lag_ms=2_000)
    assert compacted.max_segment_ms == 2_000
    assert LogConfig(cleanup_policy="compact", segment_ms=10_000).max_segment_ms == 10_000


# ---- the schema ----------------------------------------------------------------------------------


def test_the_compaction_configs_are_honoured_with_kafkas_types_and_defaults() -> None:
    for name in COMPACTION_CONFIGS:
        key = TOPIC_CONFIG_SCHEMA[name]
        assert key.honoured and topic_config_note(name) == "", name
        assert key.default == KAFKA_DEFAULTS[name], name
    assert TOPIC_CONFIG_SCHEMA["min.cleanable.dirty.ratio"].kafka_config_type == KAFKA_CONFIG_TYPE_DOUBLE
    for name in ("min.compaction.lag.ms", "max.compaction.lag.ms", "delete.retention.ms"):
        assert TOPIC_CONFIG_SCHEMA[name].kafka_config_type == KAFKA_CONFIG_TYPE_LONG, name


def test_the_schemas_defaults_are_the_log_configs() -> None:
    config = log_config_from(topic_config_proto({}))
    assert config == LogConfig()
    assert repr(config.min_cleanable_dirty_ratio) == KAFKA_DEFAULTS["min.cleanable.dirty.ratio"]
    assert str(config.max_compaction_lag_ms) == KAFKA_DEFAULTS["max.compaction.lag.ms"]
    assert str(config.delete_retention_ms) == KAFKA_DEFAULTS["delete.retention.ms"]


@pytest.mark.parametrize(
    ("name", "value", "canonical"),
    [
        ("min.cleanable.dirty.ratio", "0", "0.0"),
        ("min.cleanable.dirty.ratio", "1", "1.0"),
        ("min.cleanable.dirty.ratio", " 0.25 ", "0.25"),
        ("min.compaction.lag.ms", "0", "0"),
        ("max.compaction.lag.ms", "1", "1"),
        ("max.compaction.lag.ms", str(INT64_MAX), str(INT64_MAX)),
        ("delete.retention.ms", "0", "0"),
    ],
)
def test_values_at_the_bounds_are_taken_and_survive_the_wire(name: str, value: str, canonical: str) -> None:
    configs = validate_topic_configs({name: value})
    assert configs == {name: canonical}
    # Optional fields: a value equal to 0 is still the topic's own (TOPIC_CONFIG), not the default.
    wire = topic_config_proto(configs)
    assert wire.HasField(name.replace(".", "_")) and not wire.unserved_configs
    assert topic_configs_from_proto(wire) == configs
    assert topic_config_sources(wire)[name] == "TOPIC_CONFIG"


# ---- the two lags together (Kafka's LogConfig.validateValues) -------------------------------------


def test_create_refuses_a_max_compaction_lag_below_the_min_naming_both_and_the_fix() -> None:
    with pytest.raises(InvalidConfig) as refused:
        validate_topic_configs(
            {"cleanup.policy": "compact", "min.compaction.lag.ms": "5000", "max.compaction.lag.ms": "1000"}
        )
    message = refused.value.message
    assert "min.compaction.lag.ms=5000 is larger than max.compaction.lag.ms=1000" in message
    assert "set max.compaction.lag.ms to at least min.compaction.lag.ms" in message
    # Equal is fine, as in Kafka; so is either alone against the other's default.
    validate_topic_configs({"min.compaction.lag.ms": "1000", "max.compaction.lag.ms": "1000"})
    validate_topic_configs({"min.compaction.lag.ms": str(INT64_MAX)})
    validate_topic_configs({"max.compaction.lag.ms": "1"})


def test_an_alter_is_checked_against_the_configs_the_topic_keeps() -> None:
    current = {"max.compaction.lag.ms": "1000"}
    with pytest.raises(InvalidConfig) as refused:
        altered_topic_configs(current, {"min.compaction.lag.ms": "5000"}, [])
    assert (
        "min.compaction.lag.ms=5000 is larger than max.compaction.lag.ms=1000 (the topic's current value)"
        in refused.value.message
    )
    # Deleting the max (back to no bound) with it, or replacing the whole config, is fine.
    assert altered_topic_configs(current, {"min.compaction.lag.ms": "5000"}, ["max.compaction.lag.ms"]) == {
        "min.compaction.lag.ms": "5000"
    }
    assert altered_topic_configs(current, {"min.compaction.lag.ms": "5000"}, [], replace=True) == {
        "min.compaction.lag.ms": "5000"
    }


def test_the_controller_answers_the_conflict_as_invalid_config_and_writes_nothing() -> None:
    ctx = context([1, 2, 3])
    with_topic(
        ctx, "changelog", {0: (1, 2, 3)}, {"cleanup.policy": "compact", "max.compaction.lag.ms": "1000"}
    )
    result = handlers.on_alter_topic_configs(ctx, alter("changelog", {"min.compaction.lag.ms": "5000"}))
    (answer,) = result.response.topics
    assert answer.error_code == common_pb2.INVALID_CONFIG
    assert "max.compaction.lag.ms=1000 (the topic's current value)" in answer.error_message
    assert result.writes == [] and result.rpcs.is_empty()

    created = handlers.on_create_topics(
        ctx,
        common_pb2.CreateTopicsRequest(
            topics=[
                common_pb2.CreatableTopic(
                    name="bad",
                    num_partitions=1,
                    replication_factor=1,
                    configs={"min.compaction.lag.ms": "2", "max.compaction.lag.ms": "1"},
                )
            ]
        ),
    )
    assert created.response.topics[0].error_code == common_pb2.INVALID_CONFIG
    assert (
        "min.compaction.lag.ms=2 is larger than max.compaction.lag.ms=1"
        in created.response.topics[0].error_message
    )
    assert created.writes == []


def test_the_controller_stores_and_sends_the_compaction_configs() -> None:
    ctx = context([1, 2, 3])
    with_topic(ctx, "changelog", {0: (1, 2, 3)}, {"cleanup.policy": "compact"})
    result = handlers.on_alter_topic_configs(ctx, alter("changelog", TUNED))
    assert result.response.topics[0].error_code == common_pb2.NONE
    assert result.writes == [ConfigWrite("changelog", TUNED)]
    config = log_config_from(topic_config_proto(TUNED))
    assert (
        config.compact,
        config.min_cleanable_dirty_ratio,
        config.min_compaction_lag_ms,
        config.max_compaction_lag_ms,
        config.delete_retention_ms,
    ) == (True, 0.01, 60_000, 3_600_000, 1_000)


def test_a_conflicting_pair_stored_by_an_older_release_falls_back_to_the_defaults_with_a_reason() -> None:
    # The release before this one accepted both lags with no relation checked.
    stored = {"cleanup.policy": "compact", "min.compaction.lag.ms": "5000", "max.compaction.lag.ms": "1000"}
    good, skipped = stored_topic_configs(stored)
    assert good == {"cleanup.policy": "compact"}
    (reason,) = skipped
    assert "min.compaction.lag.ms=5000 is larger than max.compaction.lag.ms=1000" in reason
    assert "using the defaults of both" in reason


# ---- upgrades: the names in unserved_configs ------------------------------------------------------


def old_release_wire(configs: dict[str, str]) -> common_pb2.TopicConfig:
    """A TopicConfig as a controller of the release before this one sent it: cleanup.policy in its
    field, every compaction config as text in unserved_configs."""
    return common_pb2.TopicConfig(
        cleanup_policy=configs.get("cleanup.policy", ""),
        unserved_configs={name: value for name, value in configs.items() if name in COMPACTION_CONFIGS},
    )


def test_compaction_configs_sent_in_unserved_configs_take_effect_after_the_upgrade() -> None:
    wire = old_release_wire(TUNED)
    assert not any(wire.HasField(name.replace(".", "_")) for name in COMPACTION_CONFIGS)
    assert topic_configs_from_proto(wire) == TUNED
    assert log_config_from(wire) == log_config_from(topic_config_proto(TUNED))
    config = log_config_from(wire)
    assert (config.min_cleanable_dirty_ratio, config.min_compaction_lag_ms) == (0.01, 60_000)
    assert (config.max_compaction_lag_ms, config.delete_retention_ms) == (3_600_000, 1_000)
    # ... and DescribeConfigs (Kafka's and our Admin's) shows them as the topic's own values.
    entries = {name: (value, is_topic) for name, value, is_topic in topic_config_entries(wire)}
    for name in COMPACTION_CONFIGS:
        assert entries[name] == (TUNED[name], True), name
    sources = topic_config_sources(wire)
    assert {name: sources[name] for name in COMPACTION_CONFIGS} == dict.fromkeys(
        COMPACTION_CONFIGS, "TOPIC_CONFIG"
    )
    assert topic_config_dict(wire)["min.cleanable.dirty.ratio"] == 0.01
    assert topic_config_dict(wire)["delete.retention.ms"] == 1_000


def test_a_field_wins_over_the_same_name_in_unserved_configs() -> None:
    wire = topic_config_proto({"delete.retention.ms": "5"})
    wire.unserved_configs["delete.retention.ms"] = "7"
    assert topic_configs_from_proto(wire)["delete.retention.ms"] == "5"
    assert log_config_from(wire).delete_retention_ms == 5


def test_a_conflicting_pair_from_an_older_controller_does_not_break_the_replica() -> None:
    wire = old_release_wire({"min.compaction.lag.ms": "5000", "max.compaction.lag.ms": "1000"})
    config = log_config_from(wire)
    assert (config.min_compaction_lag_ms, config.max_compaction_lag_ms) == (0, INT64_MAX)


def test_the_default_compaction_configs_are_described_as_defaults() -> None:
    described = {
        entry.name: entry
        for entry in effective_topic_configs(topic_configs_from_proto(common_pb2.TopicConfig()))
    }
    for name, default in KAFKA_DEFAULTS.items():
        assert (described[name].value, described[name].source, described[name].note) == (
            default,
            "DEFAULT_CONFIG",
            "",
        ), name


def test_a_compacted_logs_active_segment_rolls_at_max_compaction_lag_ms() -> None:
    """The cleaner never cleans the active segment: a compacted log rolls it once it is older
    than max.compaction.lag.ms, so that bound holds even with a week-long segment.ms."""
    from clients.common.records import Record, encode_batch
    from services.broker.log import Log, MemoryStorage

    def log_with(config: LogConfig) -> Log:
        log = Log.open("/data/t-0", config, storage=MemoryStorage(), now_ms=0)
        log.append_as_leader(encode_batch([Record(b"k", b"v", [], 0)]), leader_epoch=0, now_ms=0)
        return log

    lag = 60_000
    compacted = log_with(LogConfig(cleanup_policy="compact", max_compaction_lag_ms=lag))
    assert not compacted.maybe_roll(lag)
    assert compacted.maybe_roll(lag + 1)
    assert len(compacted.segment_base_offsets) == 2
    # A topic that is not compacted keeps segment.ms (a week by default).
    deleted = log_with(LogConfig(cleanup_policy="delete", max_compaction_lag_ms=lag))
    assert not deleted.maybe_roll(lag + 1)


def test_a_compacted_logs_epoch_checkpoint_is_version_1_which_the_previous_release_refuses(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A compacted log has holes, which a release before the cleaner cuts as damage. Its leader
    epoch checkpoint says version 1, and a reader of version 0 only (the release of 2026-11-27)
    refuses the log instead; a log that is not compacted keeps version 0, so rolling back keeps it."""
    from clients.common.records import Record, encode_batch
    from services.broker.log import Log, MemoryStorage, checkpoints

    storage = MemoryStorage()
    plain = Log.open("/data/plain-0", LogConfig(), storage=storage, now_ms=0)
    compacted = Log.open("/data/compacted-0", LogConfig(), storage=storage, now_ms=0)
    for log in (plain, compacted):
        log.append_as_leader(encode_batch([Record(b"k", b"v", [], 0)]), leader_epoch=3, now_ms=0)
    compacted.set_config(LogConfig(cleanup_policy="compact"))
    for log in (plain, compacted):
        log.close()
    epochs = checkpoints.LEADER_EPOCH_CHECKPOINT
    assert checkpoints.read_version(storage, f"/data/plain-0/{epochs}") == 0
    assert checkpoints.read_version(storage, f"/data/compacted-0/{epochs}") == 1
    # Version 1 stays after the policy goes back to delete: the holes stay too.
    again = Log.open("/data/compacted-0", LogConfig(), storage=storage, now_ms=0)
    assert again.leader_epoch_cache.latest_epoch() == 3
    again.append_as_leader(encode_batch([Record(b"k", b"w", [], 0)]), leader_epoch=4, now_ms=0)
    again.close()
    assert checkpoints.read_version(storage, f"/data/compacted-0/{epochs}") == 1

    monkeypatch.setattr(checkpoints, "CHECKPOINT_VERSIONS_READ", (checkpoints.CHECKPOINT_VERSION,))
    with pytest.raises(checkpoints.CheckpointVersionError):
        Log.open("/data/compacted-0", LogConfig(), storage=storage, now_ms=0)
    Log.open("/data/plain-0", LogConfig(), storage=storage, now_ms=0).close()
