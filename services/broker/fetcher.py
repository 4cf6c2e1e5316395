"""The replica fetcher: one asyncio task per source (leader) broker.

Kafka's AbstractFetcherThread/ReplicaFetcherThread: `do_work` = maybe_truncate
then maybe_fetch. The leader sits behind the `LeaderEndpoint` seam (a gRPC
stub here, an in-memory one in the simulation). Partition state itself is
changed only through the ReplicaManager callbacks, which run on the same
event loop, so no locks are needed.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Protocol

import grpc

from protos.highwater.v1 import broker_pb2, broker_pb2_grpc, common_pb2
from services.broker.fetch_state import (
    FetchPhase,
    PartitionFetchState,
    backoff_after_error,
    truncation_offset,
)
from services.common import limits
from services.common.errors import InvariantViolation
from services.common.server import channel_options, halt_on_invariant_violation
from services.security.channels import open_channel

log = logging.getLogger("highwater.fetcher")

TopicPartitionKey = tuple[str, int]


class LeaderEndpoint(Protocol):
    address: str

    async def fetch(self, request: common_pb2.FetchRequest) -> common_pb2.FetchResponse: ...
    async def offsets_for_leader_epoch(
        self, request: broker_pb2.OffsetsForLeaderEpochRequest) -> broker_pb2.OffsetsForLeaderEpochResponse: ...
    async def close(self) -> None: ...


class GrpcLeaderEndpoint:
    def __init__(self, address: str) -> None:
        self.address = address
        self._channel = open_channel(address, channel_options())
        self._stub = broker_pb2_grpc.BrokerServiceStub(self._channel)

    async def fetch(self, request: common_pb2.FetchRequest) -> common_pb2.FetchResponse:
        timeout_s = request.max_wait_ms / 1000 + limits.CONTROL_RPC_TIMEOUT_S
        return await self._stub.Fetch(request, timeout=timeout_s)

    async def offsets_for_leader_epoch(
            self, request: broker_pb2.OffsetsForLeaderEpochRequest) -> broker_pb2.OffsetsForLeaderEpochResponse:
        return await self._stub.OffsetsForLeaderEpoch(request, timeout=limits.CONTROL_RPC_TIMEOUT_S)

    async def close(self) -> None:
        await self._channel.close()


class FollowerCallbacks(Protocol):
    """What the fetcher needs from the ReplicaManager (all run on the event loop)."""

    def local_leo(self, tp: TopicPartitionKey) -> int | None: ...
    def latest_local_epoch(self, tp: TopicPartitionKey) -> int | None: ...
    def local_end_offset_for_epoch(self, tp: TopicPartitionKey, epoch: int) -> int: ...
    def truncate(self, tp: TopicPartitionKey, offset: int) -> None: ...
    def truncate_fully_and_start_at(self, tp: TopicPartitionKey, offset: int) -> None: ...
    def append_fetched(self, tp: TopicPartitionKey, fetch_offset: int, response: common_pb2.FetchPartitionResponse
                       ) -> None: ...
    def local_log_start(self, tp: TopicPartitionKey) -> int: ...


class ReplicaFetcher:
    """Fetches every partition this broker follows from one leader broker."""

    def __init__(self, *, local_broker_id: int, broker_epoch: Callable[[], int], leader_id: int,
                 endpoint: LeaderEndpoint, callbacks: FollowerCallbacks,
                 fetch_wait_max_ms: int = limits.REPLICA_FETCH_WAIT_MAX_MS,
                 fetch_max_bytes: int = limits.REPLICA_FETCH_MAX_BYTES,
                 partition_max_bytes: int = limits.REPLICA_FETCH_PARTITION_MAX_BYTES,
                 backoff_ms: int = limits.REPLICA_FETCH_BACKOFF_MS) -> None:
        self.local_broker_id = local_broker_id
        self.broker_epoch = broker_epoch
        self.leader_id = leader_id
        self.endpoint = endpoint
        self.callbacks = callbacks
        self.fetch_wait_max_ms = fetch_wait_max_ms
        self.fetch_max_bytes = fetch_max_bytes
        self.partition_max_bytes = partition_max_bytes
        self.backoff_ms = backoff_ms
        # Insertion order is the round-robin order; a partition that got data moves to the end.
        self.partitions: OrderedDict[TopicPartitionKey, PartitionFetchState] = OrderedDict()
        self._task: asyncio.Task[None] | None = None
        self._wakeup = asyncio.Event()
        self.max_lag = 0

    def add_partition(self, tp: TopicPartitionKey, leader_epoch: int, fetch_offset: int) -> None:
        self.partitions[tp] = PartitionFetchState(tp[0], tp[1], fetch_offset, leader_epoch)
        self._wakeup.set()

    def remove_partition(self, tp: TopicPartitionKey) -> None:
        self.partitions.pop(tp, None)

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name=f"replica-fetcher-{self.leader_id}")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except (asyncio.CancelledError, Exception):
                pass
        await self.endpoint.close()

    @staticmethod
    def _now_ms() -> int:
        return int(time.monotonic() * 1000)

    async def _run(self) -> None:
        while True:
            try:
                if not self.partitions:
                    self._wakeup.clear()
                    await asyncio.wait_for(self._wakeup.wait(), timeout=1.0)
                    continue
                await self.maybe_truncate()
                fetched = await self.maybe_fetch()
                if not fetched:
                    # Everything delayed: sleep until the next partition is due (bounded).
                    await asyncio.sleep(min(self.backoff_ms, 100) / 1000)
            except asyncio.CancelledError:
                raise
            except TimeoutError:
                continue
            except grpc.aio.AioRpcError as exc:
                log.warning("fetch from leader %d failed: %s; backing off %d ms", self.leader_id,
                            exc.code().name, self.backoff_ms)
                now = self._now_ms()
                for st in self.partitions.values():
                    if st.phase is not FetchPhase.DELAYED:
                        st.delay(now, self.backoff_ms, st.phase)
                await asyncio.sleep(self.backoff_ms / 1000)
            except InvariantViolation as exc:
                halt_on_invariant_violation(exc, f"replica fetcher for leader {self.leader_id}")
            except Exception:
                log.exception("replica fetcher for leader %d failed; retrying", self.leader_id)
                await asyncio.sleep(self.backoff_ms / 1000)

    async def maybe_truncate(self) -> None:
        now = self._now_ms()
        truncating = {tp: st for tp, st in self.partitions.items()
                      if st.ready(now) and st.phase is FetchPhase.TRUNCATING}
        if not truncating:
            return
        by_topic: dict[str, list[broker_pb2.OffsetsForLeaderEpochPartition]] = {}
        no_epoch: list[TopicPartitionKey] = []
        asked: dict[TopicPartitionKey, int] = {}
        for tp, st in truncating.items():
            epoch = self.callbacks.latest_local_epoch(tp)
            if epoch is None:
                no_epoch.append(tp)
                continue
            asked[tp] = epoch
            by_topic.setdefault(tp[0], []).append(broker_pb2.OffsetsForLeaderEpochPartition(
                partition=tp[1], current_leader_epoch=st.current_leader_epoch, leader_epoch=epoch))
        for tp in no_epoch:
            # An empty log has nothing to truncate; fetch from our LEO.
            st = truncating[tp]
            st.fetch_offset = self.callbacks.local_leo(tp) or 0
            st.move(FetchPhase.FETCHING)
        if not by_topic:
            return
        request = broker_pb2.OffsetsForLeaderEpochRequest(
            replica_id=self.local_broker_id,
            topics=[broker_pb2.OffsetsForLeaderEpochTopic(topic=t, partitions=ps) for t, ps in by_topic.items()])
        response = await self.endpoint.offsets_for_leader_epoch(request)
        now = self._now_ms()
        for topic in response.topics:
            for result in topic.partitions:
                tp = (topic.topic, result.partition)
                st = self.partitions.get(tp)
                if st is None or tp not in asked:
                    continue
                if result.error_code != common_pb2.NONE:
                    backoff_ms = backoff_after_error(result.error_code, self.backoff_ms)
                    log.info("OffsetsForLeaderEpoch for %s-%d: %s; retrying after %d ms", *tp,
                             common_pb2.ErrorCode.Name(result.error_code), backoff_ms)
                    st.delay(now, backoff_ms, FetchPhase.TRUNCATING)
                    continue
                local_leo = self.callbacks.local_leo(tp)
                if local_leo is None:
                    continue
                if result.leader_epoch < 0 or result.end_offset < 0:
                    offset = local_leo  # the leader knows no epoch at all: keep ours (HW truncation is below)
                else:
                    offset = truncation_offset(
                        local_leo=local_leo, requested_epoch=asked[tp], leader_epoch=result.leader_epoch,
                        leader_end_offset=result.end_offset,
                        local_end_offset_for_leader_epoch=self.callbacks.local_end_offset_for_epoch(
                            tp, result.leader_epoch))
                if offset < local_leo:
                    log.info("truncating %s-%d from %d to %d (leader epoch %d ends at %d)", *tp, local_leo,
                             offset, result.leader_epoch, result.end_offset)
                # Always: even with nothing to cut, epochs of ours starting at the offset go.
                self.callbacks.truncate(tp, offset)
                st.fetch_offset = offset
                st.move(FetchPhase.FETCHING)

    async def maybe_fetch(self) -> bool:
        now = self._now_ms()
        ready = [(tp, st) for tp, st in self.partitions.items() if st.ready(now) and st.phase is FetchPhase.FETCHING]
        if not ready:
            return False
        by_topic: dict[str, list[common_pb2.FetchPartition]] = {}
        for tp, st in ready:
            by_topic.setdefault(tp[0], []).append(common_pb2.FetchPartition(
                partition=tp[1], fetch_offset=st.fetch_offset, partition_max_bytes=self.partition_max_bytes,
                current_leader_epoch=st.current_leader_epoch, log_start_offset=self.callbacks.local_log_start(tp)))
        request = common_pb2.FetchRequest(
            replica_id=self.local_broker_id, replica_epoch=self.broker_epoch(), max_wait_ms=self.fetch_wait_max_ms,
            min_bytes=limits.REPLICA_FETCH_MIN_BYTES, max_bytes=self.fetch_max_bytes,
            topics=[common_pb2.FetchTopic(topic=t, partitions=ps) for t, ps in by_topic.items()])
        response = await self.endpoint.fetch(request)
        now = self._now_ms()
        max_lag = 0
        for topic in response.topics:
            for pr in topic.partitions:
                tp = (topic.topic, pr.partition)
                st = self.partitions.get(tp)
                if st is None or st.phase is not FetchPhase.FETCHING:
                    continue  # removed or re-added while the fetch was in flight
                code = pr.error_code
                if code == common_pb2.NONE:
                    local_leo = self.callbacks.local_leo(tp)
                    if local_leo != st.fetch_offset:
                        # The log moved under us (truncated by a newer LeaderAndIsr): start over.
                        st.move(FetchPhase.TRUNCATING)
                        continue
                    self.callbacks.append_fetched(tp, st.fetch_offset, pr)
                    new_leo = self.callbacks.local_leo(tp)
                    if new_leo is not None and new_leo > st.fetch_offset:
                        st.fetch_offset = new_leo
                        self.partitions.move_to_end(tp)
                    max_lag = max(max_lag, pr.high_watermark - st.fetch_offset)
                elif code == common_pb2.OFFSET_OUT_OF_RANGE:
                    self._handle_out_of_range(tp, st, pr)
                else:
                    backoff_ms = backoff_after_error(code, self.backoff_ms)
                    log.info("fetch %s-%d from leader %d: %s; backing off %d ms", *tp, self.leader_id,
                             common_pb2.ErrorCode.Name(code), backoff_ms)
                    st.delay(now, backoff_ms, FetchPhase.TRUNCATING)
        self.max_lag = max_lag
        return True

    def _handle_out_of_range(self, tp: TopicPartitionKey, st: PartitionFetchState,
                             pr: common_pb2.FetchPartitionResponse) -> None:
        """Our offset is outside the leader's log: above its LEO -> truncate; below its start -> reset."""
        if st.fetch_offset > pr.log_end_offset >= 0:
            log.info("%s-%d: fetch offset %d above leader LEO %d; truncating", *tp, st.fetch_offset,
                     pr.log_end_offset)
            self.callbacks.truncate(tp, pr.log_end_offset)
            st.fetch_offset = pr.log_end_offset
        else:
            log.info("%s-%d: fetch offset %d below leader log start %d; restarting the log there", *tp,
                     st.fetch_offset, pr.log_start_offset)
            self.callbacks.truncate_fully_and_start_at(tp, pr.log_start_offset)
            st.fetch_offset = pr.log_start_offset
