"""The admin client's record and log calls: describe partitions' logs on their leaders
(DescribeLogDirs) and delete records below an offset (DeleteRecords) (AsyncAdmin,
clients/admin.py)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from clients.admin_calls import AdminCalls, per_partition
from clients.config import check_int
from clients.consumer import check_partitions
from clients.errors import InvalidArgument
from clients.types import TopicPartition
from protos.highwater.v1 import common_pb2


@dataclass(frozen=True)
class LogDescription:
    """One partition's log on its leader (DescribeLogDirs, Kafka's API 35), or why it could not
    be described (`error`, with every other field at its default).

    The cleaner fields are set for a compacted log (cleanup.policy has "compact") only:
    dirty_ratio is the share of the cleanable bytes not cleaned yet (the cleaner takes the log at
    min.cleanable.dirty.ratio), cleaner_lag_ms how long the oldest uncleaned cleanable record
    has waited (None: nothing cleanable is dirty), uncleanable whether the cleaner failed on it
    and waits to try again (uncleanable_reason says why).
    """

    topic: str
    partition: int
    broker_id: int = -1
    log_dir: str = ""
    size_bytes: int = 0
    log_start_offset: int = 0
    log_end_offset: int = 0
    high_watermark: int = 0
    cleanup_policy: str = ""
    dirty_ratio: float | None = None
    cleaner_lag_ms: int | None = None
    first_dirty_offset: int | None = None
    uncleanable: bool = False
    uncleanable_reason: str = ""
    last_cleaned_ms: int | None = None  # wall time of the leader's last finished pass since its start
    error: str = ""
    # Where read_committed consumers stop: below the HW while a transaction is open (last, so
    # that positional construction from before it keeps working).
    last_stable_offset: int = 0

    @property
    def compacted(self) -> bool:
        return self.dirty_ratio is not None


def log_description(topic: str, p: common_pb2.DescribeLogDirsPartitionResponse) -> LogDescription:
    """A DescribeLogDirs answer's partition as a LogDescription."""
    if p.error_code != common_pb2.NONE:
        name = (
            common_pb2.ErrorCode.Name(p.error_code) if p.error_code in common_pb2.ErrorCode.values() else ""
        )
        return LogDescription(topic, p.partition, error=f"{name or p.error_code}: {p.error_message}")
    return LogDescription(
        topic,
        p.partition,
        broker_id=p.broker_id,
        log_dir=p.log_dir,
        size_bytes=p.size_bytes,
        log_start_offset=p.log_start_offset,
        log_end_offset=p.log_end_offset,
        high_watermark=p.high_watermark,
        last_stable_offset=p.last_stable_offset if p.HasField("last_stable_offset") else p.high_watermark,
        cleanup_policy=p.cleanup_policy,
        dirty_ratio=p.dirty_ratio if p.compacted else None,
        cleaner_lag_ms=p.cleaner_lag_ms if p.compacted and p.cleaner_lag_ms >= 0 else None,
        first_dirty_offset=p.first_dirty_offset if p.compacted else None,
        uncleanable=p.uncleanable,
        uncleanable_reason=p.uncleanable_reason,
        last_cleaned_ms=p.last_cleaned_ms if p.compacted and p.last_cleaned_ms >= 0 else None,
    )


class RecordAdmin(AdminCalls):
    """Partitions' logs and their records: AsyncAdmin's record calls."""

    async def describe_log_dirs(
        self, partitions: Iterable[TopicPartition]
    ) -> dict[TopicPartition, LogDescription]:
        """Each partition's log as its leader holds it (Kafka's describeLogDirs, narrowed to the
        partitions asked): size, offsets and, for a compacted topic, the cleaner's dirty ratio, lag
        and whether the log is uncleanable. A partition that cannot be described now (no leader,
        leadership moving, no Describe on its topic) is answered with its `error` set, never
        raised, so one offline partition does not hide the others."""
        by_topic: dict[str, list[common_pb2.DescribeLogDirsPartition]] = {}
        for tp in check_partitions(partitions):
            by_topic.setdefault(tp.topic, []).append(
                common_pb2.DescribeLogDirsPartition(partition=tp.partition)
            )
        if not by_topic:
            return {}
        response = await self._conn().call(
            "DescribeLogDirs",
            common_pb2.DescribeLogDirsRequest(
                topics=[common_pb2.DescribeLogDirsTopic(topic=t, partitions=p) for t, p in by_topic.items()]
            ),
        )
        return {
            TopicPartition(topic.topic, p.partition): log_description(topic.topic, p)
            for topic in response.topics
            for p in topic.partitions
        }

    async def delete_records(self, offsets: Mapping[TopicPartition, int]) -> dict[TopicPartition, int]:
        """Delete every record below each partition's offset (Kafka's deleteRecords); -1 means
        the high watermark. Returns each partition's low watermark (its new log start offset once
        every in-sync replica has it).

        The records below become unreadable at once (a consumer there gets OffsetOutOfRange and
        resets); whole segments below go from disk. An offset at or below the current start
        changes nothing. Raises OffsetOutOfRange above the high watermark, RequestTimedOut when
        an in-sync replica did not take the new start within request_timeout_ms (the leader has
        all the same), NotLeaderOrFollower / LeaderNotAvailable while leadership moves.
        """
        by_topic: dict[str, list[common_pb2.DeleteRecordsPartition]] = {}
        for tp in check_partitions(offsets):
            offset = check_int(f"offset for {tp}", offsets[tp], minimum=-1)
            by_topic.setdefault(tp.topic, []).append(
                common_pb2.DeleteRecordsPartition(partition=tp.partition, offset=offset)
            )
        if not by_topic:
            raise InvalidArgument("delete_records() needs at least one partition")
        timeout_ms = self.config.request_timeout_ms
        response = await self._conn().call(
            "DeleteRecords",
            common_pb2.DeleteRecordsRequest(
                timeout_ms=timeout_ms,
                topics=[common_pb2.DeleteRecordsTopic(topic=t, partitions=p) for t, p in by_topic.items()],
            ),
            # The leaders wait up to timeout_ms for their ISR; the answer needs a moment more.
            timeout_ms=2 * timeout_ms,
        )
        return per_partition(response, "DeleteRecords", lambda p: p.low_watermark)
