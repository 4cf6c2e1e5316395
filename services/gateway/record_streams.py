"""The gateway's read streams: Subscribe (raw batches) and ConsumeRecords (decoded records).

Each is a long-poll Fetch loop on the client's behalf, through the gateway's own routing
(LeaderCalls.fetch), that runs until the client goes away (or, for ConsumeRecords, until
max_records or stop_at_end's ends are reached). The per-answer logic is pure and lives in
services/gateway/record_level.py; this module owns the loop and its I/O. One stream is one
task (the gRPC call's); nothing is shared between streams.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable

import grpc

from clients.common.fetch_request import READ_COMMITTED, READ_UNCOMMITTED, consumer_fetch_request
from clients.common.record_batch import iter_batch_headers
from clients.common.topics import group_id_problem
from clients.common.types import TopicPartitionKey
from protos.highwater.v1 import common_pb2, gateway_pb2
from services.common import limits
from services.gateway import metrics, record_level
from services.gateway.cluster_view import ClusterView
from services.gateway.leader_calls import LeaderCalls
from services.gateway.routing import RETRIABLE_ROUTING_CODES

# A group's committed offsets (GroupCalls.fetch_committed_offsets): where ConsumeRecords starts.
FetchCommitted = Callable[
    [gateway_pb2.FetchCommittedOffsetsRequest], Awaitable[gateway_pb2.FetchCommittedOffsetsResponse]
]
# Between two polls that brought nothing: the broker's long poll already waited; this keeps an
# answer that comes back at once (an error being retried) from spinning the loop.
EMPTY_POLL_PAUSE_S = 0.01


class RecordStreams:
    """Subscribe and ConsumeRecords over the gateway's routing and metadata."""

    def __init__(self, view: ClusterView, leaders: LeaderCalls, fetch_committed: FetchCommitted) -> None:
        self.view = view
        self.leaders = leaders
        self.fetch_committed = fetch_committed

    # ---- subscribe --------------------------------------------------------------------------

    async def subscribe(
        self, request: gateway_pb2.SubscribeRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[gateway_pb2.SubscribeResponse]:
        """Push batches below the HW as it moves: a long-poll Fetch loop on the client's behalf."""
        # Each pushed message holds one partition's records of one poll: bounded as a Fetch answer.
        max_bytes = min(
            request.max_bytes or limits.SUBSCRIBE_MAX_BYTES_DEFAULT, limits.GATEWAY_FETCH_RESPONSE_MAX_BYTES
        )
        starts = [(p.topic, p.partition, p.start_offset) for p in request.partitions]
        if not starts:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "Subscribe needs at least one partition")
        positions: dict[TopicPartitionKey, int] = {}
        failure = await self._resolve_subscribe_starts(starts, positions)
        if failure is not None:
            yield failure
            return
        for t, p, s in starts:
            if s >= 0:
                positions[(t, p)] = s
        while not context.cancelled():
            req = consumer_fetch_request(
                positions,
                max_wait_ms=limits.SUBSCRIBE_POLL_WAIT_MS,
                min_bytes=1,
                max_bytes=max_bytes,
                partition_max_bytes=max_bytes,
            )
            resp = await self.leaders.fetch(req)
            for t in resp.topics:
                for pr in t.partitions:
                    tp = (t.topic, pr.partition)
                    if pr.error_code == common_pb2.NONE and pr.records:
                        headers = list(iter_batch_headers(pr.records))
                        nxt = headers[-1].next_offset if headers else positions[tp]
                        positions[tp] = nxt
                        yield gateway_pb2.SubscribeResponse(
                            topic=t.topic,
                            partition=pr.partition,
                            records=pr.records,
                            high_watermark=pr.high_watermark,
                            next_offset=nxt,
                        )
                    elif pr.error_code not in (common_pb2.NONE, *RETRIABLE_ROUTING_CODES):
                        yield gateway_pb2.SubscribeResponse(
                            topic=t.topic,
                            partition=pr.partition,
                            error_code=pr.error_code,
                            error_message=pr.error_message,
                        )
                        return
            if all(not pr.records for t in resp.topics for pr in t.partitions):
                await asyncio.sleep(EMPTY_POLL_PAUSE_S)

    async def _resolve_subscribe_starts(
        self, starts: list[tuple[str, int, int]], positions: dict[TopicPartitionKey, int]
    ) -> gateway_pb2.SubscribeResponse | None:
        """Look up Subscribe's -2 (earliest) and -1 (latest) starts into `positions`; the first
        partition whose lookup failed is returned as the stream's last message."""
        lo_req = common_pb2.ListOffsetsRequest(
            topics=[
                # current_leader_epoch -1: the gateway knows no epoch to fence with (0 would be refused as
                # FENCED_LEADER_EPOCH after the first leader change).
                common_pb2.ListOffsetsTopic(
                    topic=t,
                    partitions=[
                        common_pb2.ListOffsetsPartition(partition=p, timestamp=s, current_leader_epoch=-1)
                    ],
                )
                for t, p, s in starts
                if s < 0
            ]
        )
        if not lo_req.topics:
            return None
        # Timed as the ListOffsets call it is on the client's behalf.
        with metrics.REQUEST_LATENCY.labels("ListOffsets").time():
            resolved = await self.leaders.list_offsets(lo_req)
        for t in resolved.topics:
            for p in t.partitions:
                if p.error_code != common_pb2.NONE:
                    return gateway_pb2.SubscribeResponse(
                        topic=t.topic,
                        partition=p.partition,
                        error_code=p.error_code,
                        error_message=p.error_message,
                    )
                positions[(t.topic, p.partition)] = p.offset
        return None

    # ---- consume records ----------------------------------------------------------------------

    async def consume_records(
        self, request: gateway_pb2.ConsumeRecordsRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[gateway_pb2.ConsumeRecordsResponse]:
        """Decoded records of one topic as its HW moves: Subscribe's long-poll loop, record by record.

        A partition that fails for good (unknown, out of range, undecodable) is reported once in
        `errors` and dropped; routing errors (a leader moving) are retried on the next poll.
        With `stop_at_end`, each partition's high watermark is read once, at the start, and the
        stream ends when every partition got there (records written later are not sent).
        """
        problem = record_level.consume_records_problem(request)
        if problem is None and request.group_id:
            problem = group_id_problem(request.group_id)
        if problem is not None:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, problem)
        topic = request.topic
        read_committed = request.isolation_level == READ_COMMITTED
        await self.view.refresh_unless_known([topic])
        starts, errors = self._consume_starts(request)
        if request.group_id and starts:
            await self._start_at_committed(request.group_id, topic, starts)
        positions = await self._resolve_starts(topic, starts, errors, read_committed)
        # Offsets to stop before (stop_at_end): the high watermarks (last stable offsets) as of this call.
        ends: dict[int, int] | None = None
        if request.stop_at_end:
            ends = await self._resolve_starts(topic, dict.fromkeys(positions, -1), errors, read_committed)
            positions = record_level.positions_before_end(positions, ends)
        if errors:
            yield gateway_pb2.ConsumeRecordsResponse(errors=errors)
        per_message = request.max_records_per_message or limits.CONSUME_RECORDS_PER_MESSAGE_DEFAULT
        partition_max_bytes = min(
            request.partition_max_bytes or limits.FETCH_PARTITION_MAX_BYTES_DEFAULT,
            limits.GATEWAY_FETCH_RESPONSE_MAX_BYTES,
        )
        left = request.max_records or -1
        while positions and left != 0 and not context.cancelled():
            resp = await self.leaders.fetch(
                consumer_fetch_request(
                    {(topic, p): off for p, off in positions.items()},
                    max_wait_ms=limits.CONSUME_FETCH_WAIT_MS,
                    min_bytes=1,
                    max_bytes=limits.FETCH_MAX_BYTES_DEFAULT,
                    partition_max_bytes=partition_max_bytes,
                    read_committed=read_committed,
                )
            )
            taken = record_level.take_fetched(
                topic, resp.topics[0].partitions, positions, ends, left, read_committed
            )
            for message in record_level.consume_messages(
                taken.records, per_message, limits.CONSUME_RECORDS_MESSAGE_BYTES_MAX
            ):
                yield gateway_pb2.ConsumeRecordsResponse(records=message)
            if taken.errors:
                yield gateway_pb2.ConsumeRecordsResponse(errors=taken.errors)
            if left > 0:
                left -= len(taken.records)
            for partition in taken.empty_below_hw:
                positions[partition] = await self._position_past_hole(
                    topic, partition, positions[partition], partition_max_bytes, read_committed
                )
            if ends is not None:
                positions = record_level.positions_before_end(positions, ends)
            if not taken.records and not taken.errors:
                await asyncio.sleep(EMPTY_POLL_PAUSE_S)

    def _consume_starts(
        self, request: gateway_pb2.ConsumeRecordsRequest
    ) -> tuple[dict[int, int], list[gateway_pb2.ConsumePartitionError]]:
        """ConsumeRecords' partitions and where each starts (-2 earliest, -1 latest, or an offset),
        and an error for each partition asked that the topic does not have (or for the topic)."""
        topic = request.topic
        count = len(self.view.cache.partitions_of(topic))
        starts = (
            {p.partition: p.start_offset for p in request.partitions}
            if request.partitions
            else {p: request.default_start_offset for p in range(count)}
        )
        errors: list[gateway_pb2.ConsumePartitionError] = []
        for partition in list(starts):
            if (topic, partition) not in self.view.cache.partitions:
                errors.append(
                    gateway_pb2.ConsumePartitionError(
                        partition=partition,
                        error_code=common_pb2.UNKNOWN_TOPIC_OR_PARTITION,
                        next_offset=-1,
                        error_message=f"topic {topic!r} does not exist"
                        if count == 0
                        else f"topic {topic!r} has partitions 0..{count - 1}; there is no partition "
                        f"{partition}",
                    )
                )
                del starts[partition]
        if not starts and not errors:
            errors.append(
                gateway_pb2.ConsumePartitionError(
                    partition=-1,
                    error_code=common_pb2.UNKNOWN_TOPIC_OR_PARTITION,
                    next_offset=-1,
                    error_message=f"topic {topic!r} does not exist",
                )
            )
        return starts, errors

    async def _start_at_committed(self, group_id: str, topic: str, starts: dict[int, int]) -> None:
        """Start each partition the group has committed an offset for at that offset."""
        committed = await self.fetch_committed(
            gateway_pb2.FetchCommittedOffsetsRequest(
                group_id=group_id,
                partitions=[common_pb2.TopicPartition(topic=topic, partition=p) for p in starts],
            )
        )
        for c in committed.offsets:
            if c.offset >= 0:
                starts[c.partition] = c.offset

    async def _position_past_hole(
        self, topic: str, partition: int, position: int, partition_max_bytes: int, read_committed: bool
    ) -> int:
        """ConsumeRecords' position after an answer with no records below the HW: the HW if a
        Fetch of the partition alone proves a compacted log's hole reaches it, else `position`
        (the records were left out of a shared answer, and are fetched again next round)."""
        resp = await self.leaders.fetch(
            consumer_fetch_request(
                {(topic, partition): position},
                max_wait_ms=0,
                min_bytes=0,
                max_bytes=partition_max_bytes,
                partition_max_bytes=partition_max_bytes,
                read_committed=read_committed,
            )
        )
        for t in resp.topics:
            for pr in t.partitions:
                if pr.partition == partition:
                    end = record_level.hole_end(position, pr, read_committed)
                    return position if end is None else end
        return position

    async def _resolve_starts(
        self,
        topic: str,
        starts: dict[int, int],
        errors: list[gateway_pb2.ConsumePartitionError],
        read_committed: bool = False,
    ) -> dict[int, int]:
        """Start offsets with -2 (earliest) and -1 (latest: the last stable offset when
        `read_committed`) looked up; failures go to `errors`."""
        positions = {p: s for p, s in starts.items() if s >= 0}
        wanted = [p for p, s in starts.items() if s < 0]
        if not wanted:
            return positions
        resolved = await self.leaders.list_offsets(
            common_pb2.ListOffsetsRequest(
                replica_id=-1,
                topics=[
                    common_pb2.ListOffsetsTopic(
                        topic=topic,
                        partitions=[
                            common_pb2.ListOffsetsPartition(
                                partition=p, timestamp=starts[p], current_leader_epoch=-1
                            )
                            for p in wanted
                        ],
                    )
                ],
                isolation_level=READ_COMMITTED if read_committed else READ_UNCOMMITTED,
            )
        )
        for p in resolved.topics[0].partitions:
            if p.error_code == common_pb2.NONE:
                positions[p.partition] = p.offset
            else:
                errors.append(
                    gateway_pb2.ConsumePartitionError(
                        partition=p.partition,
                        error_code=p.error_code,
                        error_message=p.error_message,
                        next_offset=-1,
                    )
                )
        return positions
