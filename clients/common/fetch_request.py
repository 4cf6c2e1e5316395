"""A consumer's Fetch request, as every reader that is not a follower sends it.

The client library, the gateway (Subscribe, ConsumeRecords), the Spark connector and the
benchmarks read through here, so the consumer's constants are said once: replica_id -1
(a consumer, served up to the high watermark) and current_leader_epoch -1 (no leader-epoch
fencing: a consumer learns of a new leader from a NOT_LEADER answer and its metadata).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TypeVar

from clients.common.types import TopicPartitionKey
from protos.highwater.v1 import common_pb2

# Fetch's and ListOffsets' isolation_level (Kafka's IsolationLevel): read up to the high
# watermark, or up to the last stable offset without aborted transactions' records.
READ_UNCOMMITTED = 0
READ_COMMITTED = 1

# The caller's own key type (TopicPartition or the plain tuple), so that its dicts pass as they are.
Key = TypeVar("Key", bound=TopicPartitionKey)


def consumer_fetch_request(
    positions: Mapping[Key, int],
    *,
    max_wait_ms: int,
    min_bytes: int,
    max_bytes: int,
    partition_max_bytes: int,
    partition_max_bytes_by: Mapping[Key, int] | None = None,
    read_committed: bool = False,
    topic_ids: Mapping[str, str] | None = None,
) -> common_pb2.FetchRequest:
    """A Fetch from each partition in `positions` at its offset: one FetchTopic a topic, the
    topics and their partitions in `positions`' order.

    Every partition may take `partition_max_bytes`, or its own bound from
    `partition_max_bytes_by` where that has one (the consumer grows it for a record larger
    than the default). `topic_ids`: each topic's id from Metadata, sent so that a leader still
    holding a deleted topic of the same name refuses the read (INCONSISTENT_TOPIC_ID) instead
    of answering with the old topic's records.
    """
    by_topic: dict[str, list[common_pb2.FetchPartition]] = {}
    for tp, offset in positions.items():
        limit = partition_max_bytes
        if partition_max_bytes_by is not None:
            limit = partition_max_bytes_by.get(tp, partition_max_bytes)
        by_topic.setdefault(tp[0], []).append(
            common_pb2.FetchPartition(
                partition=tp[1],
                fetch_offset=offset,
                current_leader_epoch=-1,
                partition_max_bytes=limit,
            )
        )
    return common_pb2.FetchRequest(
        replica_id=-1,
        max_wait_ms=max_wait_ms,
        min_bytes=min_bytes,
        max_bytes=max_bytes,
        topics=[
            common_pb2.FetchTopic(topic=t, topic_id=(topic_ids or {}).get(t, ""), partitions=parts)
            for t, parts in by_topic.items()
        ],
        isolation_level=READ_COMMITTED if read_committed else READ_UNCOMMITTED,
    )


def last_stable_offset(part: common_pb2.FetchPartitionResponse) -> int:
    """A Fetch answer's last stable offset; the HW from a broker of a release before
    transactions, which does not send it (and had no open transaction to stop at)."""
    return part.last_stable_offset if part.HasField("last_stable_offset") else part.high_watermark
