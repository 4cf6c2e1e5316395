"""DescribeLogDirs (issue 39, "operators see it"): a leader describes its logs, a compacted one
with the cleaner's dirty ratio, lag and uncleanable state; the admin client and
`highwater topic describe` show them; the call is authorized as ListOffsets (Describe on the topic).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, cast

import pytest
from click.testing import CliRunner
from kio.schema.errors import ErrorCode as KafkaErrorCode

from clients.admin import LogDescription, log_description
from clients.common.record_batch import ATTRIBUTES_POS
from clients.tools import cli as cli_module
from clients.types import PartitionDescription, TopicDescription, TopicPartition
from protos.highwater.v1 import common_pb2
from services.broker.log import Log, LogConfig, MemoryStorage
from services.broker.log_dirs import describe_log_dirs
from services.broker.partition import Role
from services.gateway import routing
from services.kafka import acl_rules, protocol
from services.kafka.handler import KafkaHandler
from services.security import rules
from services.security.authz import Authorizer
from services.security.identity import Caller
from tests.unit.test_authz import acl
from tests.unit.test_cleaner import COMPACT, DIR, FakeClock, FakePartition, fill_log, make_cleaner, updates
from tests.unit.test_kafka_protocol import FakeBackend, request_frame
from tests.unit.test_kafka_refusal_encoding import RefusingAccess

T0 = ("t", 0)


def request(*tps: tuple[str, int]) -> common_pb2.DescribeLogDirsRequest:
    by_topic: dict[str, list[int]] = {}
    for topic, partition in tps:
        by_topic.setdefault(topic, []).append(partition)
    return common_pb2.DescribeLogDirsRequest(
        topics=[
            common_pb2.DescribeLogDirsTopic(
                topic=topic, partitions=[common_pb2.DescribeLogDirsPartition(partition=p) for p in parts]
            )
            for topic, parts in by_topic.items()
        ]
    )


def describe(
    partitions: dict[tuple[str, int], Any], cleaner: Any, now_ms: int, *tps: tuple[str, int]
) -> list[common_pb2.DescribeLogDirsPartitionResponse]:
    answer = describe_log_dirs(
        request(*(tps or (T0,))),
        broker_id=7,
        partitions=partitions,
        topics={tp[0] for tp in partitions},
        cleaner_view=cleaner.view,
        now_ms=now_ms,
    )
    return [p for t in answer.topics for p in t.partitions]


# ---- the leader's pure describe -------------------------------------------------------------


def test_a_compacted_log_shows_the_cleaners_dirty_ratio_and_lag_before_and_after_a_pass() -> None:
    log = Log.open(DIR, COMPACT, storage=MemoryStorage(), now_ms=1_000)
    fill_log(log, updates(keys=8, rounds=12, per_batch=4))
    partitions: dict[tuple[str, int], Any] = {T0: FakePartition(log, log.log_end_offset)}
    clock = FakeClock(10_000)
    cleaner = make_cleaner(partitions, clock)
    views = log.segments_for_cleaning()

    (before,) = describe(partitions, cleaner, clock.now_ms)
    assert before.error_code == common_pb2.NONE and before.broker_id == 7
    assert (before.log_start_offset, before.log_end_offset, before.high_watermark) == (0, 96, 96)
    assert before.size_bytes == log.size_bytes and before.log_dir == DIR
    assert before.cleanup_policy == "compact" and before.compacted
    # Never cleaned: every cleanable byte is dirty, and the oldest dirty segment has waited since
    # its newest record (the cleaner's max-compaction-delay measure).
    assert before.dirty_ratio == 1.0 and before.first_dirty_offset == 0
    assert before.cleaner_lag_ms == clock.now_ms - views[0].max_timestamp_ms
    assert not before.uncleanable and before.last_cleaned_ms == -1

    asyncio.run(cleaner.clean_once())
    clock.now_ms += 5_000
    (after,) = describe(partitions, cleaner, clock.now_ms)
    cleaned_to = cleaner.passes[-1].map_end_offset
    assert after.first_dirty_offset == cleaned_to > 0
    assert after.dirty_ratio == 0.0 and after.cleaner_lag_ms == -1  # nothing cleanable is dirty
    assert after.last_cleaned_ms == 10_000 and after.size_bytes < before.size_bytes

    # New updates roll new segments: part of the log is dirty again.
    fill_log(log, updates(keys=8, rounds=4, per_batch=4), now_ms=clock.now_ms)
    partitions[T0].high_watermark = log.log_end_offset
    clock.now_ms += 2_000
    (dirty,) = describe(partitions, cleaner, clock.now_ms)
    assert 0.0 < dirty.dirty_ratio < 1.0 and dirty.first_dirty_offset == cleaned_to
    # The lag runs from the newest record of the segment holding the first dirty offset: here the
    # old updates' last segment, left dirty by the first pass (it ended at the log end then).
    (first_dirty_segment,) = [
        v for v in log.segments_for_cleaning() if v.base_offset <= cleaned_to < v.end_offset
    ]
    assert dirty.cleaner_lag_ms == clock.now_ms - first_dirty_segment.max_timestamp_ms > 7_000


def test_an_uncleanable_log_says_so_and_why() -> None:
    storage = MemoryStorage()
    log = Log.open(DIR, COMPACT, storage=storage, now_ms=1_000)
    fill_log(log, updates(keys=8, rounds=12, per_batch=4))
    damaged = log.segments_for_cleaning()[1].path
    handle = storage.open(damaged, create=False)
    data = bytearray(handle.read_at(0, handle.size))
    data[ATTRIBUTES_POS + 40] ^= 0xFF  # a record byte: the cleaner checks CRCs
    handle.truncate(0)
    handle.append(bytes(data))
    handle.close()
    partitions: dict[tuple[str, int], Any] = {T0: FakePartition(log, log.log_end_offset)}
    clock = FakeClock(10_000)
    cleaner = make_cleaner(partitions, clock)
    asyncio.run(cleaner.clean_once())
    (answer,) = describe(partitions, cleaner, clock.now_ms)
    assert answer.uncleanable and "CRC" in answer.uncleanable_reason
    assert answer.dirty_ratio == 1.0  # its records are all kept, all still dirty


def test_a_delete_policy_log_has_no_cleaner_fields() -> None:
    log = Log.open(
        DIR, LogConfig(segment_bytes=600, max_message_bytes=500), storage=MemoryStorage(), now_ms=1
    )
    fill_log(log, updates(keys=8, rounds=6, per_batch=4))
    partitions: dict[tuple[str, int], Any] = {T0: FakePartition(log, log.log_end_offset)}
    (answer,) = describe(partitions, make_cleaner(partitions, FakeClock(10_000)), 10_000)
    assert answer.error_code == common_pb2.NONE and answer.cleanup_policy == "delete"
    assert answer.log_end_offset == 48 and answer.size_bytes > 0
    assert not answer.compacted and answer.dirty_ratio == 0.0
    assert answer.cleaner_lag_ms == -1 and answer.last_cleaned_ms == -1 and answer.first_dirty_offset == 0


def test_only_the_leader_describes_and_unknown_partitions_are_named() -> None:
    log = Log.open(DIR, COMPACT, storage=MemoryStorage(), now_ms=1_000)
    partitions: dict[tuple[str, int], Any] = {T0: FakePartition(log, 0, role=Role.FOLLOWER)}
    cleaner = make_cleaner(partitions, FakeClock(10_000))
    follower, elsewhere, unknown = describe(partitions, cleaner, 10_000, T0, ("t", 1), ("nope", 0))
    assert (
        follower.error_code == common_pb2.NOT_LEADER_OR_FOLLOWER and "leader of t-0" in follower.error_message
    )
    assert elsewhere.error_code == common_pb2.NOT_LEADER_OR_FOLLOWER
    assert unknown.error_code == common_pb2.UNKNOWN_TOPIC_OR_PARTITION and "nope-0" in unknown.error_message


# ---- authorization and the gateway's split --------------------------------------------------


def test_describe_log_dirs_needs_describe_on_the_topic_and_answers_the_refused_ones_per_partition() -> None:
    alice = Caller("User:alice", authenticated_by="certificate")
    authorizer = Authorizer([acl("User:alice", "Describe", "Topic", "mine")])
    admission = rules.describe_log_dirs(
        request(("mine", 0), ("theirs", 0), ("theirs", 1)),
        rules.Access(alice, authorizer, identities_checked=True),
        rules.Limits(),
    )
    assert [t.topic for t in admission.request.topics] == ["mine"]
    assert admission.respond is not None
    (refused,) = admission.respond(common_pb2.DescribeLogDirsResponse()).topics
    assert refused.topic == "theirs"
    assert [(p.partition, p.error_code) for p in refused.partitions] == [
        (0, common_pb2.TOPIC_AUTHORIZATION_FAILED),
        (1, common_pb2.TOPIC_AUTHORIZATION_FAILED),
    ]
    for service in ("/highwater.v1.GatewayService/", "/highwater.v1.BrokerService/"):
        assert rules.rule_for(service + "DescribeLogDirs") is rules.describe_log_dirs
    assert "/highwater.v1.BrokerService/DescribeLogDirs" in rules.FORWARDED_METHODS, "the client's principal"


def test_the_gateway_sends_each_leader_only_its_partitions() -> None:
    req = routing.describe_log_dirs_request_for(request(("a", 0), ("a", 1), ("b", 0)), {("a", 1), ("b", 0)})
    assert [(t.topic, [p.partition for p in t.partitions]) for t in req.topics] == [("a", [1]), ("b", [0])]


# ---- the admin client and the CLI -----------------------------------------------------------


def test_the_admin_client_reads_absent_cleaner_fields_as_none() -> None:
    compacted = log_description(
        "t",
        common_pb2.DescribeLogDirsPartitionResponse(
            partition=0, broker_id=2, compacted=True, dirty_ratio=0.0, cleaner_lag_ms=-1, last_cleaned_ms=-1
        ),
    )
    assert compacted.compacted and compacted.dirty_ratio == 0.0
    assert compacted.cleaner_lag_ms is None and compacted.last_cleaned_ms is None
    plain = log_description(
        "t", common_pb2.DescribeLogDirsPartitionResponse(partition=0, cleanup_policy="delete")
    )
    assert not plain.compacted and plain.dirty_ratio is None and plain.first_dirty_offset is None
    failed = log_description(
        "t",
        common_pb2.DescribeLogDirsPartitionResponse(
            partition=0, error_code=common_pb2.LEADER_NOT_AVAILABLE, error_message="no leader"
        ),
    )
    assert failed.error == "LEADER_NOT_AVAILABLE: no leader"


def topic(name: str, policy: str, partitions: int = 2) -> TopicDescription:
    return TopicDescription(
        name,
        f"id-{name}",
        tuple(PartitionDescription(p, 1, 0, (1, 2), (1, 2)) for p in range(partitions)),
        {"cleanup.policy": policy},
        {"cleanup.policy": "TOPIC_CONFIG"},
    )


class FakeAdmin:
    def __init__(self, topics: list[TopicDescription], logs: dict[TopicPartition, LogDescription]) -> None:
        self.topics = topics
        self.logs = logs

    def describe_topics(self, names: list[str] | None) -> list[TopicDescription]:
        return [t for t in self.topics if names is None or t.name in names]

    def describe_log_dirs(self, partitions: list[TopicPartition]) -> dict[TopicPartition, LogDescription]:
        return {tp: self.logs[tp] for tp in partitions if tp in self.logs}


LOGS = {
    TopicPartition("state", 0): LogDescription(
        "state",
        0,
        1,
        "/d/state-0",
        3 * 1024 * 1024,
        0,
        500,
        500,
        "compact",
        0.5,
        12_000,
        200,
        last_cleaned_ms=5,
    ),
    TopicPartition("state", 1): LogDescription(
        "state", 1, 1, "/d/state-1", 10, 0, 5, 5, "compact", 0.0, None, 5, True, "CorruptMessage: CRC"
    ),
    TopicPartition("events", 0): LogDescription("events", 0, 1, "/d/events-0", 2048, 3, 9, 9, "delete"),
}


@contextmanager
def fake_admin(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    admin = FakeAdmin([topic("state", "compact"), topic("events", "delete", 1)], LOGS)

    @contextmanager
    def admin_cm(self: object) -> Iterator[FakeAdmin]:
        yield admin

    monkeypatch.setattr(cli_module.CliContext, "admin", admin_cm)
    yield


def test_topic_describe_shows_the_policy_and_each_compacted_partitions_cleaner_state(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with fake_admin(monkeypatch):
        result = CliRunner().invoke(cli_module.cli, ["topic", "describe", "state", "events"])
    assert result.exit_code == 0, result.output
    state, events = result.output.split("events  (")
    assert "cleanup.policy compact" in state
    header = next(line for line in state.splitlines() if "clean to" in line)
    assert all(name in header for name in ("dirty", "lag", "cleaner"))
    row0 = next(line for line in state.splitlines() if "3.0 MiB" in line)
    assert "0.50" in row0 and "12.0 s" in row0 and "200" in row0 and "ok" in row0
    row1 = next(line for line in state.splitlines() if "10 B" in line)
    assert "failing" in row1
    assert "state-1 is uncleanable on broker 1: CorruptMessage: CRC" in state
    assert "cleanup.policy delete" in events and "2.0 KiB" in events
    assert "dirty" not in events and "lag" not in events and "clean to" not in events


def test_topic_describe_json_has_each_partitions_log(monkeypatch: pytest.MonkeyPatch) -> None:
    with fake_admin(monkeypatch):
        result = CliRunner().invoke(cli_module.cli, ["-o", "json", "topic", "describe", "state", "events"])
    assert result.exit_code == 0, result.output
    state, events = json.loads(result.output)
    assert state["cleanup_policy"] == "compact" and events["cleanup_policy"] == "delete"
    log0 = state["partitions"][0]["log"]
    assert (log0["dirty_ratio"], log0["cleaner_lag_ms"], log0["uncleanable"]) == (0.5, 12_000, False)
    assert state["partitions"][1]["log"]["uncleanable_reason"] == "CorruptMessage: CRC"
    assert events["partitions"][0]["log"]["size_bytes"] == 2048
    assert "dirty_ratio" not in events["partitions"][0]["log"]


# ---- Kafka's DescribeLogDirs (API 35) on the Kafka listener ----------------------------------


def kafka_describe_log_dirs(version: int, topics: Any, access: Any = None) -> Any:
    cls = protocol.request_class(protocol.DESCRIBE_LOG_DIRS, version)
    if topics is not None:
        topic_cls = protocol.nested(cls, "DescribableLogDirTopic")
        topics = tuple(protocol.build(topic_cls, topic=t, partitions=tuple(ps)) for t, ps in topics)
    frame = request_frame(protocol.DESCRIBE_LOG_DIRS, version, protocol.build(cls, topics=topics))
    handler = KafkaHandler(cast(Any, FakeBackend()))  # FakeBackend has only what the handler uses
    if access is not None:
        handler = handler.for_connection(access)
    answer = asyncio.run(handler.handle(protocol.decode_request(frame)))
    protocol.encode_response(protocol.DESCRIBE_LOG_DIRS, 42, answer)  # every answer encodes
    return answer


@pytest.mark.parametrize("version", [1, 2, 3, 4])
def test_kafka_describe_log_dirs_lists_this_brokers_replicas_with_sizes(version: int) -> None:
    answer = kafka_describe_log_dirs(version, None)
    (result,) = answer.results
    assert result.error_code == KafkaErrorCode.none and result.log_dir == "/data/broker-1"
    (topic_answer,) = result.topics
    assert topic_answer.name == "t"
    assert [(p.partition_index, p.partition_size, p.offset_lag) for p in topic_answer.partitions] == [
        (0, 4_096, 0),
        (1, 512, 2),
    ]
    if version >= 4:
        assert (result.total_bytes, result.usable_bytes) == (10_000_000, 4_000_000)
    named = kafka_describe_log_dirs(version, [("t", [1])])
    assert [p.partition_index for t in named.results[0].topics for p in t.partitions] == [1]


@pytest.mark.parametrize("version", [1, 3])
def test_kafka_describe_log_dirs_needs_describe_on_the_cluster(version: int) -> None:
    answer = kafka_describe_log_dirs(version, None, access=RefusingAccess())
    assert answer.results == ()
    if version >= 3:
        assert answer.error_code == KafkaErrorCode.cluster_authorization_failed
    assert protocol.DESCRIBE_LOG_DIRS in acl_rules.OTHER_APIS
