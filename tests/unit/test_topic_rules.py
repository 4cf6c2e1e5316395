"""Topic names and the topic-config schema (clients/common/topics.py), and where they are enforced."""

from __future__ import annotations

import pytest

from clients.common.errors import InvalidConfig
from clients.common.topics import (
    TOPIC_CONFIG_SCHEMA,
    stored_topic_configs,
    topic_config_proto,
    topic_name_problem,
    validate_topic_configs,
)
from clients.config import check_topic_name
from clients.errors import InvalidArgument
from protos.highwater.v1 import common_pb2
from services.broker.core import log_config_from
from spark_connector.options import OptionError, check_topic


@pytest.mark.parametrize(
    "name", ["orders\n", "orders\r", "a b", "a/b", "", ".", "..", "x" * 250, "caf\u00e9", "orders\x00"]
)
def test_illegal_topic_names_are_refused_everywhere(name: str) -> None:
    assert topic_name_problem(name) is not None
    with pytest.raises(InvalidArgument):
        check_topic_name(name)
    with pytest.raises(OptionError):
        check_topic(name, "topic")


@pytest.mark.parametrize("name", ["orders", "a.b_c-D9", "x" * 249])
def test_legal_topic_names_pass(name: str) -> None:
    assert topic_name_problem(name) is None
    assert check_topic_name(name) == name


@pytest.mark.parametrize(
    "key,value,says",
    [
        ("max.message.bytes", "3000000000", "an integer from 61 to 67108864 bytes, got 3000000000"),
        ("max.message.bytes", "1", "from 61 to"),
        ("segment.bytes", "100", "from 1024 to 1073741824 bytes"),
        ("retention.ms", "0", "-1 (unlimited) or an integer from 1 to"),
        ("retention.bytes", "-2", "-1 (unlimited)"),
        ("min.insync.replicas", "0", "from 1 to 2147483647 replicas"),
        ("segment.ms", "soon", "got 'soon'"),
        ("unclean.leader.election.enable", "yes", "must be true or false"),
        (
            "message.timestamp.type",
            "logappendtime",
            "must be one of CreateTime, LogAppendTime, got 'logappendtime'",
        ),
        ("message.timestamp.after.max.ms", "-1", "an integer from 0 to 9223372036854775807 ms"),
        ("message.timestamp.before.max.ms", "9223372036854775808", "an integer from 0 to"),
    ],
)
def test_a_bad_value_is_refused_naming_the_key_and_its_bounds(key: str, value: str, says: str) -> None:
    with pytest.raises(InvalidConfig) as raised:
        validate_topic_configs({key: value})
    assert raised.value.code == common_pb2.INVALID_CONFIG
    assert key in raised.value.message and says in raised.value.message


def test_an_unknown_key_is_refused_listing_the_known_ones() -> None:
    with pytest.raises(
        InvalidConfig, match=r"unknown topic config 'retention\.hours'; known: .*max\.message\.bytes"
    ):
        validate_topic_configs({"retention.hours": "1"})


def test_valid_values_are_normalised_and_reach_the_wire_and_the_broker_log() -> None:
    configs = validate_topic_configs(
        {
            "max.message.bytes": " 2000000 ",
            "retention.ms": "-1",
            "unclean.leader.election.enable": "TRUE",
            "segment.bytes": "1073741824",
        }
    )
    assert configs == {
        "max.message.bytes": "2000000",
        "retention.ms": "-1",
        "unclean.leader.election.enable": "true",
        "segment.bytes": "1073741824",
    }
    wire = topic_config_proto(configs)
    log_config = log_config_from(wire)  # the broker's LogConfig accepts every value the schema allows
    assert (log_config.max_message_bytes, log_config.retention_ms, log_config.segment_bytes) == (
        2_000_000,
        -1,
        1 << 30,
    )


def test_the_extremes_of_every_bound_reach_the_wire_and_the_broker_log() -> None:
    for key in TOPIC_CONFIG_SCHEMA.values():
        if key.kind is not int:
            continue
        for value in (key.minimum, key.maximum):
            configs = validate_topic_configs({key.name: str(value)})
            log_config_from(topic_config_proto(configs))


def test_stored_configs_keep_the_good_values_and_explain_the_skipped_ones() -> None:
    good, skipped = stored_topic_configs(
        {"max.message.bytes": "3000000000", "retention.ms": 60_000, "no.such": "x"}
    )
    assert good == {"retention.ms": "60000"}
    assert len(skipped) == 2
    assert "max.message.bytes must be an integer from 61" in skipped[0] and "using the default" in skipped[0]
    assert "unknown topic config 'no.such'" in skipped[1]


def test_timestamp_configs_reach_the_broker_log_and_a_zero_limit_is_not_taken_for_the_default() -> None:
    configs = validate_topic_configs(
        {"message.timestamp.type": "LogAppendTime", "message.timestamp.after.max.ms": "0"}
    )
    log_config = log_config_from(topic_config_proto(configs))
    assert (
        log_config.message_timestamp_type,
        log_config.message_timestamp_after_max_ms,
        log_config.message_timestamp_before_max_ms,
    ) == ("LogAppendTime", 0, 2**63 - 1)
    defaults = log_config_from(topic_config_proto({}))
    # Kafka 4.0's defaults: CreateTime, any past, at most one hour ahead (KIP-1030).
    assert (
        defaults.message_timestamp_type,
        defaults.message_timestamp_before_max_ms,
        defaults.message_timestamp_after_max_ms,
    ) == ("CreateTime", 2**63 - 1, 3_600_000)
