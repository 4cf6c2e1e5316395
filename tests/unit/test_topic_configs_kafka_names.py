"""Every topic config Kafka 3.x defines is honoured or accepted by the one schema
(clients/common/topics.py): validated with Kafka's type and bounds, stored, carried on the wire
and described with its default; and retention deletes nothing under cleanup.policy=compact.

Stream-processing frameworks (quixstreams, faust, Kafka Streams) create changelog topics with
cleanup.policy=compact and a handful of other configs; one unknown name fails them outright.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from clients.common.errors import InvalidConfig
from clients.common.records import encode_values
from clients.common.topics import (
    TOPIC_CONFIG_SCHEMA,
    effective_topic_configs,
    retention_applies,
    stored_topic_configs,
    topic_config_proto,
    topic_configs_from_proto,
    validate_topic_configs,
)
from services.broker.core import log_config_from
from services.broker.log import Log, LogConfig, MemoryStorage

INT64_MAX = str(2**63 - 1)

# Kafka 3.x's topic configs (TopicConfig / LogConfig up to 3.9): a legal value other than the
# default, a value Kafka refuses, and the words the refusal must name (the valid range).
KAFKA_TOPIC_CONFIGS: dict[str, tuple[str, str, str]] = {
    "cleanup.policy": ("compact", "shred", "compact, delete"),
    "compression.type": ("zstd", "brotli", "producer"),
    "compression.gzip.level": ("5", "0", "-1 (gzip's default level) or an integer from 1 to 9"),
    "compression.lz4.level": ("12", "18", "from 1 to 17"),
    "compression.zstd.level": ("-5", "23", "from -131072 to 22"),
    "delete.retention.ms": ("3600000", "-1", "from 0 to"),
    "file.delete.delay.ms": ("1000", "-5", "from 0 to"),
    "flush.messages": ("10000", "0", "from 1 to"),
    "flush.ms": ("1000", "-1", "from 0 to"),
    "follower.replication.throttled.replicas": ("0:1,1:2", "0-1", "partition:broker pairs"),
    "index.interval.bytes": ("8192", "-1", "from 0 to 2147483647"),
    "leader.replication.throttled.replicas": ("*", "x:y", "partition:broker pairs"),
    "local.retention.bytes": ("1048576", "-3", "from -2 to"),
    "local.retention.ms": ("-2", "-3", "from -2 to"),
    "max.compaction.lag.ms": ("86400000", "0", "from 1 to"),
    "max.message.bytes": ("2097152", "12", "from 61 to"),
    "message.downconversion.enable": ("false", "maybe", "true or false"),
    "message.format.version": ("2.8-IV1", "latest", "a Kafka version such as"),
    "message.timestamp.after.max.ms": ("60000", "-1", "from 0 to"),
    "message.timestamp.before.max.ms": ("60000", "-1", "from 0 to"),
    "message.timestamp.difference.max.ms": ("60000", "-1", "from 0 to"),
    "message.timestamp.type": ("LogAppendTime", "WallClock", "CreateTime, LogAppendTime"),
    "min.cleanable.dirty.ratio": ("0.1", "1.5", "from 0 to 1"),
    "min.compaction.lag.ms": ("100", "-1", "from 0 to"),
    "min.insync.replicas": ("2", "0", "from 1 to"),
    "preallocate": ("true", "yes", "true or false"),
    "remote.log.copy.disable": ("true", "2", "true or false"),
    "remote.log.delete.on.disable": ("true", "2", "true or false"),
    "remote.storage.enable": ("false", "true", "tiered storage"),
    "retention.bytes": ("1073741824", "-2", "-1 (unlimited) or"),
    "retention.ms": ("-1", "0", "-1 (unlimited) or"),
    "segment.bytes": ("1048576", "100", "from 1024 to"),
    "segment.index.bytes": ("1048576", "3", "from 4 to"),
    "segment.jitter.ms": ("1000", "-1", "from 0 to"),
    "segment.ms": ("3600000", "0", "from 1 to"),
    "unclean.leader.election.enable": ("true", "1", "true or false"),
}

# Kafka's defaults of configs Highwater honours or only accepts (LogConfig / KafkaConfig, 3.7-3.9).
KAFKA_DEFAULTS = {
    "cleanup.policy": "delete",
    "compression.type": "producer",
    "compression.gzip.level": "-1",
    "compression.lz4.level": "9",
    "compression.zstd.level": "3",
    "delete.retention.ms": "86400000",
    "file.delete.delay.ms": "60000",
    "flush.messages": INT64_MAX,
    "flush.ms": INT64_MAX,
    "follower.replication.throttled.replicas": "",
    "index.interval.bytes": "4096",
    "leader.replication.throttled.replicas": "",
    "local.retention.bytes": "-2",
    "local.retention.ms": "-2",
    "max.compaction.lag.ms": INT64_MAX,
    "message.downconversion.enable": "true",
    "message.format.version": "3.0-IV1",
    "message.timestamp.difference.max.ms": INT64_MAX,
    "min.cleanable.dirty.ratio": "0.5",
    "min.compaction.lag.ms": "0",
    "preallocate": "false",
    "remote.log.copy.disable": "false",
    "remote.log.delete.on.disable": "false",
    "remote.storage.enable": "false",
    "segment.index.bytes": "10485760",
    "segment.jitter.ms": "0",
}

# What quixstreams, faust and Kafka Streams send when they create a changelog topic.
CHANGELOG_CONFIGS = {
    "cleanup.policy": "compact",
    "min.compaction.lag.ms": "0",
    "segment.ms": "600000",
    "message.timestamp.type": "CreateTime",
    "retention.ms": "-1",
    "min.cleanable.dirty.ratio": "0.01",
    "max.message.bytes": "1048588",
}


def test_the_schema_knows_every_kafka_topic_config() -> None:
    assert sorted(KAFKA_TOPIC_CONFIGS) == sorted(TOPIC_CONFIG_SCHEMA)


@pytest.mark.parametrize("name", sorted(KAFKA_TOPIC_CONFIGS))
def test_a_kafka_config_with_a_legal_value_is_stored_carried_and_described(name: str) -> None:
    value = KAFKA_TOPIC_CONFIGS[name][0]
    configs = validate_topic_configs({name: value})
    assert configs == {name: value}
    # The wire form the controller sends to brokers and gateways keeps it ...
    assert topic_configs_from_proto(topic_config_proto(configs)) == configs
    # ... and so does etcd's.
    assert stored_topic_configs(configs) == (configs, [])
    described = {entry.name: entry for entry in effective_topic_configs(configs)}
    assert (described[name].value, described[name].source) == (value, "TOPIC_CONFIG")


@pytest.mark.parametrize("name", sorted(KAFKA_TOPIC_CONFIGS))
def test_a_kafka_config_with_a_bad_value_is_refused_naming_it_the_value_and_the_range(name: str) -> None:
    _, bad, range_words = KAFKA_TOPIC_CONFIGS[name]
    with pytest.raises(InvalidConfig) as refused:
        validate_topic_configs({name: bad})
    assert name in refused.value.message
    assert bad in refused.value.message
    assert range_words in refused.value.message


def test_an_unset_config_is_described_with_kafkas_default_and_why_it_has_no_effect() -> None:
    described = {entry.name: entry for entry in effective_topic_configs({})}
    assert set(described) == set(KAFKA_TOPIC_CONFIGS)
    for name, default in KAFKA_DEFAULTS.items():
        assert (described[name].value, described[name].source) == (default, "DEFAULT_CONFIG"), name
    honoured = {name for name, entry in described.items() if not entry.note}
    assert honoured == {
        "cleanup.policy",
        "delete.retention.ms",
        "max.compaction.lag.ms",
        "min.cleanable.dirty.ratio",
        "min.compaction.lag.ms",
        "max.message.bytes",
        "message.timestamp.after.max.ms",
        "message.timestamp.before.max.ms",
        "message.timestamp.type",
        "min.insync.replicas",
        "retention.bytes",
        "retention.ms",
        "segment.bytes",
        "segment.ms",
        "unclean.leader.election.enable",
    }
    for name in set(described) - honoured:
        assert described[name].note.startswith("no effect here: "), name


def test_an_unknown_config_is_still_refused_naming_it() -> None:
    with pytest.raises(InvalidConfig, match=r"unknown topic config 'cleanup\.polcy'"):
        validate_topic_configs({"cleanup.policy": "compact", "cleanup.polcy": "compact"})


def test_a_changelog_topics_configs_are_accepted_as_frameworks_send_them() -> None:
    configs = validate_topic_configs(CHANGELOG_CONFIGS)
    assert configs == CHANGELOG_CONFIGS
    assert topic_configs_from_proto(topic_config_proto(configs)) == configs


@pytest.mark.parametrize(
    ("sent", "canonical", "retention"),
    [
        ("delete", "delete", True),
        ("compact", "compact", False),
        ("compact,delete", "compact,delete", True),
        ("delete, compact", "compact,delete", True),
        ("compact,compact", "compact", False),
    ],
)
def test_cleanup_policy_is_a_set_and_retention_applies_only_with_delete(
    sent: str, canonical: str, retention: bool
) -> None:
    assert validate_topic_configs({"cleanup.policy": sent}) == {"cleanup.policy": canonical}
    assert retention_applies(canonical) is retention
    config = log_config_from(topic_config_proto({"cleanup.policy": canonical}))
    assert (config.cleanup_policy, config.retention_applies) == (canonical, retention)


@pytest.mark.parametrize("sent", ["", " , ", "compact,shred"])
def test_cleanup_policy_needs_compact_or_delete(sent: str) -> None:
    with pytest.raises(
        InvalidConfig, match=r"cleanup\.policy must be a comma-separated list of compact, delete"
    ):
        validate_topic_configs({"cleanup.policy": sent})


def test_a_topic_without_cleanup_policy_keeps_deleting_by_retention() -> None:
    assert log_config_from(topic_config_proto({})).cleanup_policy == "delete"
    assert retention_applies("")


def _old_segments_log(policy: str) -> tuple[Log, list[int]]:
    config = LogConfig(
        segment_bytes=2_000,
        index_interval_bytes=100,
        retention_ms=10_000,
        retention_bytes=1,
        cleanup_policy=policy,
    )
    log = Log.open("/data/changelog-0", config, storage=MemoryStorage(), now_ms=0)
    for i in range(60):
        log.append_as_leader(
            encode_values([b"v%08d" % i] * 3, timestamp_ms=1_000 + i), leader_epoch=0, now_ms=i
        )
    return log, log.segment_base_offsets


def test_retention_deletes_nothing_from_a_compacted_log() -> None:
    log, bases = _old_segments_log("compact")
    assert len(bases) > 3
    assert log.delete_old_segments(now_ms=10**9, high_watermark=log.log_end_offset) == 0
    assert (log.segment_base_offsets, log.log_start_offset) == (bases, 0)
    # The log start offset still moves when asked, as in Kafka's log (Kafka's DeleteRecords
    # checks the policy before it gets there).
    log.advance_log_start_offset(bases[2])
    assert log.delete_old_segments(now_ms=10**9, high_watermark=log.log_end_offset) == 0
    assert log.segment_base_offsets == bases[2:]


@pytest.mark.parametrize("policy", ["delete", "compact,delete"])
def test_retention_deletes_old_segments_under_a_policy_with_delete(policy: str) -> None:
    log, bases = _old_segments_log(policy)
    assert log.delete_old_segments(now_ms=10**9, high_watermark=log.log_end_offset) == len(bases) - 1
    assert log.segment_base_offsets == bases[-1:]


def test_log_config_refuses_an_unknown_cleanup_policy() -> None:
    with pytest.raises(InvalidConfig, match="cleanup_policy 'shred'"):
        LogConfig(cleanup_policy="shred")


def test_docs_kafka_md_lists_every_topic_config() -> None:
    docs = (Path(__file__).resolve().parents[2] / "docs" / "KAFKA.md").read_text()
    missing = [name for name in TOPIC_CONFIG_SCHEMA if f"`{name}`" not in docs]
    assert missing == []
