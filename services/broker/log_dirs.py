"""DescribeLogDirs (Kafka's API 35) on a leader: what each asked partition's log holds.

Pure: reads the broker's partitions and its cleaner's per-log state, answers a proto, changes
nothing. For a compacted log the dirty ratio and cleaner lag are the cleaner's own figures: the
same `plan_cleaning` over the same segments, high watermark and first dirty offset that its next
pass would use (services/broker/log_cleaner.py), so what an operator reads is what decides when
the log is cleaned. A log the cleaner has not looked at yet (just created, or the cleaner is
off) is described from its log start offset, as the cleaner's first pass without a checkpoint
would plan it.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from typing import TYPE_CHECKING

from clients.common.types import TopicPartitionKey
from protos.highwater.v1 import common_pb2
from services.broker.log.cleaner import plan_cleaning
from services.broker.log.log import Log
from services.broker.partition import Partition, Role

if TYPE_CHECKING:  # the type only: this module stays free of the cleaner's asyncio task
    from services.broker.log_cleaner import CleanerLogView

# LogCleaner.view: the cleaner's state of one log, None before it first sees the log.
CleanerViews = Callable[[TopicPartitionKey, Log], "CleanerLogView | None"]


def describe_log_dirs(
    request: common_pb2.DescribeLogDirsRequest,
    *,
    broker_id: int,
    partitions: Mapping[TopicPartitionKey, Partition],
    topics: Collection[str],
    cleaner_view: CleanerViews,
    now_ms: int,
) -> common_pb2.DescribeLogDirsResponse:
    """One answer per asked partition, in the request's order; `topics` are the topics the
    broker's metadata knows (to tell an unknown partition from one led elsewhere)."""
    return common_pb2.DescribeLogDirsResponse(
        topics=[
            common_pb2.DescribeLogDirsTopicResponse(
                topic=t.topic,
                partitions=[
                    describe_partition(
                        (t.topic, entry.partition),
                        broker_id=broker_id,
                        partition=partitions.get((t.topic, entry.partition)),
                        topic_known=t.topic in topics,
                        cleaner_view=cleaner_view,
                        now_ms=now_ms,
                    )
                    for entry in t.partitions
                ],
            )
            for t in request.topics
        ]
    )


def describe_partition(
    tp: TopicPartitionKey,
    *,
    broker_id: int,
    partition: Partition | None,
    topic_known: bool,
    cleaner_view: CleanerViews,
    now_ms: int,
) -> common_pb2.DescribeLogDirsPartitionResponse:
    answer = common_pb2.DescribeLogDirsPartitionResponse(partition=tp[1], broker_id=broker_id)
    if partition is None or partition.role is not Role.LEADER:
        if partition is None and not topic_known:
            answer.error_code = common_pb2.UNKNOWN_TOPIC_OR_PARTITION
            answer.error_message = f"topic-partition {tp[0]}-{tp[1]} does not exist"
        else:
            answer.error_code = common_pb2.NOT_LEADER_OR_FOLLOWER
            answer.error_message = f"broker {broker_id} is not the leader of {tp[0]}-{tp[1]}"
        return answer
    log = partition.log
    if log.is_offline or log.is_closed:
        answer.error_code = common_pb2.STORAGE_ERROR
        answer.error_message = (
            f"broker {broker_id}'s replica of {tp[0]}-{tp[1]} is offline "
            "(a storage error; the broker's log names the file and the cause)"
        )
        return answer
    config = log.config
    answer.log_dir = log.directory
    answer.size_bytes = log.size_bytes
    answer.log_start_offset = log.log_start_offset
    answer.log_end_offset = log.log_end_offset
    answer.high_watermark = partition.high_watermark
    answer.last_stable_offset = partition.last_stable_offset
    answer.cleanup_policy = config.cleanup_policy
    answer.cleaner_lag_ms = -1
    answer.last_cleaned_ms = -1
    if not config.compact:
        return answer
    view = cleaner_view(tp, log)
    first_dirty = log.log_start_offset if view is None else view.first_dirty_offset
    plan = plan_cleaning(
        log.segments_for_cleaning(),
        first_dirty_offset=first_dirty,
        high_watermark=partition.high_watermark,
        log_end_offset=log.log_end_offset,
        now_ms=now_ms,
        config=config,
    )
    answer.compacted = True
    answer.dirty_ratio = plan.dirty_ratio
    answer.first_dirty_offset = plan.first_dirty_offset
    if plan.has_dirty and plan.first_dirty_timestamp_ms >= 0:
        # As the cleaner's max-compaction-delay gauge; a record time in the future reads as 0.
        answer.cleaner_lag_ms = max(0, now_ms - plan.first_dirty_timestamp_ms)
    if view is not None:
        answer.uncleanable = view.uncleanable
        answer.uncleanable_reason = view.last_error if view.uncleanable else ""
        answer.last_cleaned_ms = view.last_run_ms
    return answer
