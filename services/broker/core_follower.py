"""A follower's replicas as its replica fetchers see them (fetcher_core.FollowerLogs): the
follower's side of replication and of the high watermark."""

from __future__ import annotations

from clients.common.types import TopicPartitionKey
from protos.highwater.v1 import common_pb2
from services.broker.core_state import CoreState
from services.broker.partition import Role


class FollowerReplicas(CoreState):
    """The broker core as `FollowerLogs`: what a FetcherCore reads of, and does to, a follower replica."""

    def local_leo(self, tp: TopicPartitionKey) -> int | None:
        p = self.partitions.get(tp)
        return p.log.log_end_offset if p is not None else None

    def local_log_start(self, tp: TopicPartitionKey) -> int:
        p = self.partitions.get(tp)
        return p.log.log_start_offset if p is not None else 0

    def local_high_watermark(self, tp: TopicPartitionKey) -> int | None:
        p = self.partitions.get(tp)
        return p.high_watermark if p is not None else None

    def latest_local_epoch(self, tp: TopicPartitionKey) -> int | None:
        p = self.partitions.get(tp)
        return p.log.leader_epoch_cache.latest_epoch() if p is not None else None

    def local_end_offset_for_epoch(self, tp: TopicPartitionKey, epoch: int) -> int:
        p = self.partitions.get(tp)
        if p is None:
            return 0
        _, end = p.log.leader_epoch_cache.end_offset_for_epoch(epoch)
        return end if end >= 0 else p.log.log_end_offset

    def truncate(self, tp: TopicPartitionKey, offset: int) -> None:
        p = self.partitions.get(tp)
        if p is not None:
            p.truncate_to(offset)

    def truncate_fully_and_start_at(self, tp: TopicPartitionKey, offset: int) -> None:
        p = self.partitions.get(tp)
        if p is not None:
            p.log.truncate_fully_and_start_at(offset)
            p.high_watermark = offset
            p.rebuild_producer_state()

    def append_fetched(self, tp: TopicPartitionKey, response: common_pb2.FetchPartitionResponse) -> None:
        """Append what the leader sent; take its HW and, as Kafka's follower does, its log start offset."""
        p = self.partitions.get(tp)
        if p is None or p.role is not Role.FOLLOWER:
            return
        if response.records:
            p.append_as_follower(response.records, now_ms=self.clock.wall_ms())
            self.observer.on_follower_append(p)
        moved = p.update_follower_high_watermark(response.high_watermark)
        # Retention on the leader moved its log start: follow it up to our HW (never past
        # what is committed here, never back).
        leader_start = min(response.log_start_offset, p.high_watermark)
        if leader_start > p.log.log_start_offset:
            p.log.advance_log_start_offset(leader_start)
        if moved:
            self.notify(tp)
