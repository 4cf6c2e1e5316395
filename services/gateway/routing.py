"""Splitting client requests per partition leader and merging the answers: pure.

The gateway's leader calls (leader_calls.py) send each split to its leader concurrently; these
functions only move protobuf pieces around, so they are tested without any
process.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

from clients.common import errors
from clients.common.errors import check
from clients.common.record_batch import iter_batch_headers
from clients.common.types import TopicPartitionKey
from protos.highwater.v1 import common_pb2
from services.common import limits
from services.common.metadata_cache import MetadataCache

T = TypeVar("T")

# Per-partition answers the gateway retries itself (within the request's deadline), after
# refreshing metadata: the error flags' policy, except UNKNOWN_TOPIC_OR_PARTITION, which the
# gateway's own metadata already decided (a leader saying it goes back to the client, whose
# retry policy waits for a topic still being created).
RETRIABLE_ROUTING_CODES = errors.RETRIABLE_AFTER_REFRESH_CODES - {common_pb2.UNKNOWN_TOPIC_OR_PARTITION}
# Answers from a broker that is up, but not (yet) the leader it is named as.
LEADER_BEHIND_CODES = frozenset({common_pb2.NOT_LEADER_OR_FOLLOWER, common_pb2.UNKNOWN_LEADER_EPOCH})


@dataclass
class ProduceSplit:
    """Produce partitions grouped by leader address, and those that cannot be routed."""

    by_leader: dict[str, list[tuple[str, common_pb2.ProducePartitionData]]] = field(default_factory=dict)
    unroutable: dict[TopicPartitionKey, tuple[common_pb2.ErrorCode, str]] = field(default_factory=dict)


def route_error(cache: MetadataCache, tp: TopicPartitionKey) -> tuple[common_pb2.ErrorCode, str] | None:
    """Why tp cannot be routed now, or None if its leader is known."""
    state = cache.partitions.get(tp)
    if state is None:
        # Only here is the topic looked for: a per-partition scan of every partition made a
        # 1,000-partition Produce cost a million steps.
        count = len(cache.partitions_of(tp[0]))
        if count == 0:
            return common_pb2.UNKNOWN_TOPIC_OR_PARTITION, f"topic {tp[0]!r} does not exist"
        return (
            common_pb2.UNKNOWN_TOPIC_OR_PARTITION,
            f"topic {tp[0]!r} has partitions 0..{count - 1}; there is no partition {tp[1]}",
        )
    if state.leader < 0 or state.leader not in cache.brokers:
        return common_pb2.LEADER_NOT_AVAILABLE, f"{tp[0]}-{tp[1]} has no live leader right now"
    return None


def split_produce(cache: MetadataCache, topics: Iterable[common_pb2.ProduceTopicData]) -> ProduceSplit:
    split = ProduceSplit()
    for t in topics:
        for pd in t.partitions:
            tp = (t.topic, pd.partition)
            err = route_error(cache, tp)
            if err is not None:
                split.unroutable[tp] = err
                continue
            address = cache.leader_address(tp)
            check(address is not None, "route_error passed %s but no leader address", tp)
            split.by_leader.setdefault(str(address), []).append((t.topic, pd))
    return split


def idempotent_partitions(topics: Iterable[common_pb2.ProduceTopicData]) -> set[TopicPartitionKey]:
    """Partitions whose batches all carry a producer id (the leader deduplicates their retries)."""
    out = set()
    for t in topics:
        for pd in t.partitions:
            headers = list(iter_batch_headers(pd.records))
            if headers and all(h.producer_id >= 0 for h in headers):
                out.add((t.topic, pd.partition))
    return out


def produce_request(
    template: common_pb2.ProduceRequest, items: list[tuple[str, common_pb2.ProducePartitionData]]
) -> common_pb2.ProduceRequest:
    """One leader's share of a Produce, built in place: composing finished messages copied
    every batch once per level (upb merges a sub-message given to a constructor)."""
    request = common_pb2.ProduceRequest(
        acks=template.acks, timeout_ms=template.timeout_ms, transactional_id=template.transactional_id
    )
    by_topic: dict[str, common_pb2.ProduceTopicData] = {}
    for topic, pd in items:
        topic_data = by_topic.get(topic)
        if topic_data is None:
            topic_data = by_topic[topic] = request.topics.add(topic=topic)
        topic_data.partitions.append(pd)
    return request


def merge_produce(
    results: dict[TopicPartitionKey, common_pb2.ProducePartitionResponse],
    order: Iterable[common_pb2.ProduceTopicData],
) -> common_pb2.ProduceResponse:
    """Answers in the order the client asked, one per partition."""
    topics = []
    for t in order:
        topics.append(
            common_pb2.ProduceTopicResponse(
                topic=t.topic, partitions=[results[(t.topic, pd.partition)] for pd in t.partitions]
            )
        )
    return common_pb2.ProduceResponse(topics=topics)


def split_by_leader(
    cache: MetadataCache, tps: Iterable[TopicPartitionKey]
) -> tuple[dict[str, list[TopicPartitionKey]], dict[TopicPartitionKey, tuple[common_pb2.ErrorCode, str]]]:
    by_leader: dict[str, list[TopicPartitionKey]] = {}
    unroutable: dict[TopicPartitionKey, tuple[common_pb2.ErrorCode, str]] = {}
    for tp in tps:
        err = route_error(cache, tp)
        if err is not None:
            unroutable[tp] = err
            continue
        address = cache.leader_address(tp)
        check(address is not None, "route_error passed %s but no leader address", tp)
        by_leader.setdefault(str(address), []).append(tp)
    return by_leader, unroutable


def fetch_request_for(
    template: common_pb2.FetchRequest, wanted: set[TopicPartitionKey], max_bytes: int | None = None
) -> common_pb2.FetchRequest:
    """The part of template one leader answers, asking it for at most max_bytes (leader_share;
    None: the template's)."""
    topics = _wanted_topics(template.topics, wanted, common_pb2.FetchTopic)
    # Never locate_records: a location names a file on the leader's host, of no use to a
    # client that could not reach the leader itself. Gateways answer bytes.
    return common_pb2.FetchRequest(
        replica_id=-1,
        max_wait_ms=template.max_wait_ms,
        min_bytes=template.min_bytes,
        max_bytes=template.max_bytes if max_bytes is None else max_bytes,
        topics=topics,
        isolation_level=template.isolation_level,
    )


def fetch_answer_bytes_max(requested: int) -> int:
    """The record bytes a gateway Fetch answer may hold: what the client asked (0: the default), at
    most limits.GATEWAY_FETCH_RESPONSE_MAX_BYTES, whatever it asked."""
    return min(requested or limits.FETCH_MAX_BYTES_DEFAULT, limits.GATEWAY_FETCH_RESPONSE_MAX_BYTES)


def leader_share(answer_bytes_max: int, leaders: int) -> int:
    """What each of `leaders` leaders asked at once may answer, so that their answers together,
    merged into one gRPC message, stay within answer_bytes_max (but for each leader's first batch,
    which a leader returns whole: keep_within)."""
    check(leaders > 0 and answer_bytes_max > 0, "leader_share(%s, %s)", answer_bytes_max, leaders)
    return max(answer_bytes_max // leaders, 1)


def keep_within(partitions: Iterable[common_pb2.FetchPartitionResponse], answer_bytes_max: int) -> None:
    """Empty, in place, the records of the partitions (in answer order) past answer_bytes_max,
    but for the first partition with records, kept whole as a leader keeps its first batch.

    Several leaders may each return one batch larger than their share; without this their answers
    together could pass the bound and the gRPC message limit. A partition left empty is answered
    without error and its records are fetched again from the same offset.
    """
    total = 0
    for pr in partitions:
        size = len(pr.records)
        if not size:
            continue
        if total and total + size > answer_bytes_max:
            pr.ClearField("records")
            continue
        total += size


def list_offsets_request_for(
    template: common_pb2.ListOffsetsRequest, wanted: set[TopicPartitionKey]
) -> common_pb2.ListOffsetsRequest:
    topics = _wanted_topics(template.topics, wanted, common_pb2.ListOffsetsTopic)
    return common_pb2.ListOffsetsRequest(
        replica_id=-1, topics=topics, isolation_level=template.isolation_level
    )


def delete_records_request_for(
    template: common_pb2.DeleteRecordsRequest, wanted: set[TopicPartitionKey]
) -> common_pb2.DeleteRecordsRequest:
    """One leader's share of a DeleteRecords (Kafka's admin client sends one to each leader)."""
    topics = _wanted_topics(template.topics, wanted, common_pb2.DeleteRecordsTopic)
    return common_pb2.DeleteRecordsRequest(timeout_ms=template.timeout_ms, topics=topics)


def describe_log_dirs_request_for(
    template: common_pb2.DescribeLogDirsRequest, wanted: set[TopicPartitionKey]
) -> common_pb2.DescribeLogDirsRequest:
    """One leader's share of a DescribeLogDirs."""
    topics = _wanted_topics(template.topics, wanted, common_pb2.DescribeLogDirsTopic)
    return common_pb2.DescribeLogDirsRequest(topics=topics)


class PartitionRef(Protocol):
    """A request's per-partition entry (FetchPartition, ListOffsetsPartition, ...)."""

    @property
    def partition(self) -> int: ...


class TopicRef(Protocol):
    """A request's per-topic entry: a topic name and its partition entries."""

    @property
    def topic(self) -> str: ...

    @property
    def partitions(self) -> Iterable[PartitionRef]: ...


def _wanted_topics(
    topics: Iterable[TopicRef], wanted: set[TopicPartitionKey], topic_cls: Callable[..., T]
) -> list[T]:
    """The request entries of `topics` narrowed to the partitions in `wanted`, one `topic_cls`
    message a topic; a topic with none of them is left out, so each leader sees only its own."""
    out = []
    for t in topics:
        parts = [p for p in t.partitions if (t.topic, p.partition) in wanted]
        if parts:
            out.append(topic_cls(topic=t.topic, partitions=parts))
    return out


def collect_partitions(
    topics: Iterable[TopicRef],
    partition_of: Callable[[PartitionRef], int] = lambda p: p.partition,
) -> list[TopicPartitionKey]:
    out = []
    for t in topics:
        for p in t.partitions:
            out.append((t.topic, partition_of(p)))
    return out
