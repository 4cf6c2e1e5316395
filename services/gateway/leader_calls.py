"""The gateway's data calls: Produce, Fetch, ListOffsets, DeleteRecords and DescribeLogDirs,
each split per partition leader (services/gateway/routing.py), sent concurrently and merged.

Produce's retriable routing errors (NOT_LEADER_OR_FOLLOWER, LEADER_NOT_AVAILABLE, a leader that
cannot be reached) are retried after a metadata refresh within the request's timeout, when a
retry cannot write a batch twice; the other calls answer them and refresh in the background.
Requests reach here checked (the servicer's request checks); answers name every partition asked.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

import grpc

from clients.common.types import TopicPartitionKey
from protos.highwater.v1 import common_pb2
from services.common import limits
from services.gateway import routing
from services.gateway.cluster_view import (
    ROUTING_RETRY_BACKOFF_MS,
    ROUTING_RETRY_LEADER_BEHIND_MS,
    ClusterView,
)
from services.gateway.routing import LEADER_BEHIND_CODES, RETRIABLE_ROUTING_CODES

# A partition's answer in a per-leader call (DeleteRecords, DescribeLogDirs): it has error_code.
P = TypeVar("P")

ProduceAnswers = dict[TopicPartitionKey, common_pb2.ProducePartitionResponse]


class LeaderCalls:
    """Calls routed to partition leaders over the view's metadata (`ClusterView.cache`)."""

    def __init__(self, view: ClusterView) -> None:
        self.view = view

    # ---- produce ---------------------------------------------------------------------------

    async def produce(self, request: common_pb2.ProduceRequest) -> common_pb2.ProduceResponse:
        """Route a checked Produce to the leaders, retrying what is safe to retry (see Departures)."""
        timeout_ms = min(
            request.timeout_ms or limits.PRODUCE_TIMEOUT_MS_DEFAULT, limits.PRODUCE_TIMEOUT_MS_MAX
        )
        deadline = time.monotonic() + timeout_ms / 1000
        results: ProduceAnswers = {}
        pending = list(request.topics)
        # Retrying a batch that may already be in the log would write it twice, unless
        # the leader can recognise it (an idempotent producer's sequence numbers). Read
        # from the batches only when something is to be retried (8% of the gateway's time).
        idempotent: set[TopicPartitionKey] | None = None
        await self.view.refresh_unless_known(t.topic for t in pending)
        while True:
            news = self.view.metadata_changed
            uncertain = await self._produce_once(request, pending, deadline, results)
            failed = [tp for tp, res in results.items() if res.error_code in RETRIABLE_ROUTING_CODES]
            if failed and idempotent is None:
                idempotent = routing.idempotent_partitions(request.topics)
            retry = {
                tp
                for tp in failed
                if (results[tp].base_offset < 0 and tp not in uncertain) or tp in (idempotent or ())
            }
            leader_behind = all(results[tp].error_code in LEADER_BEHIND_CODES for tp in retry)
            backoff_ms = ROUTING_RETRY_LEADER_BEHIND_MS if leader_behind else ROUTING_RETRY_BACKOFF_MS
            if not retry or time.monotonic() + backoff_ms / 1000 >= deadline:
                break
            await self.view.await_routing_retry(news, backoff_ms, force=not leader_behind)
            pending = [
                common_pb2.ProduceTopicData(
                    topic=t.topic, partitions=[pd for pd in t.partitions if (t.topic, pd.partition) in retry]
                )
                for t in request.topics
            ]
            pending = [t for t in pending if t.partitions]
        return routing.merge_produce(results, request.topics)

    async def _produce_once(
        self,
        request: common_pb2.ProduceRequest,
        pending: list[common_pb2.ProduceTopicData],
        deadline: float,
        results: ProduceAnswers,
    ) -> set[TopicPartitionKey]:
        """One routing attempt of `pending`: its answers go to `results`; returns the partitions
        whose outcome is unknown (the call to their leader failed)."""
        split = routing.split_produce(self.view.cache, pending)
        for tp, (code, message) in split.unroutable.items():
            results[tp] = common_pb2.ProducePartitionResponse(
                partition=tp[1], error_code=code, error_message=message, base_offset=-1
            )
        sends = {
            address: asyncio.ensure_future(self._produce_to(address, request, items, deadline))
            for address, items in split.by_leader.items()
        }
        uncertain: set[TopicPartitionKey] = set()
        for fut in sends.values():
            answered, unknown = await fut
            results.update(answered)
            uncertain |= unknown
        return uncertain

    async def _produce_to(
        self,
        address: str,
        template: common_pb2.ProduceRequest,
        items: list[tuple[str, common_pb2.ProducePartitionData]],
        deadline: float,
    ) -> tuple[ProduceAnswers, set[TopicPartitionKey]]:
        """One leader's answers, and the partitions whose outcome is unknown (the call itself failed)."""
        req = routing.produce_request(template, items)
        remaining_s = max(deadline - time.monotonic(), 0.001)
        req.timeout_ms = int(remaining_s * 1000)
        try:
            resp = await self.view.peers.broker(address).Produce(req, timeout=remaining_s + 1.0)
        except grpc.aio.AioRpcError as exc:
            code = (
                common_pb2.REQUEST_TIMED_OUT
                if exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED
                else common_pb2.LEADER_NOT_AVAILABLE
            )
            failed = {
                (t, pd.partition): common_pb2.ProducePartitionResponse(
                    partition=pd.partition,
                    error_code=code,
                    base_offset=-1,
                    error_message=f"the call to the leader at {address} failed ({exc.code().name}); the "
                    "write may or may not have happened (an idempotent producer's retry is safe)",
                )
                for t, pd in items
            }
            return failed, set(failed)
        out = {}
        for t in resp.topics:
            for p in t.partitions:
                out[(t.topic, p.partition)] = p
        return out, set()

    # ---- fetch / list offsets ---------------------------------------------------------------

    async def fetch(self, request: common_pb2.FetchRequest) -> common_pb2.FetchResponse:
        tps = routing.collect_partitions(request.topics)
        await self.view.refresh_unless_known(tp[0] for tp in tps)
        by_leader, unroutable = routing.split_by_leader(self.view.cache, tps)
        answer_bytes_max = routing.fetch_answer_bytes_max(request.max_bytes)
        share = routing.leader_share(answer_bytes_max, max(len(by_leader), 1))
        calls = {
            address: asyncio.ensure_future(self._fetch_from(address, request, set(group), share))
            for address, group in by_leader.items()
        }
        parts: dict[TopicPartitionKey, common_pb2.FetchPartitionResponse] = {}
        for tp, (code, message) in unroutable.items():
            parts[tp] = common_pb2.FetchPartitionResponse(
                partition=tp[1], error_code=code, error_message=message, high_watermark=-1
            )
        stale = False
        for fut in calls.values():
            for tp, pr in (await fut).items():
                parts[tp] = pr
                stale = stale or pr.error_code in RETRIABLE_ROUTING_CODES
        if stale or unroutable:
            self.view.background(self.view.refresh_metadata())
        # Built in place: a finished topic handed to the constructor would be serialised and
        # parsed again, a second copy of every record batch.
        response = common_pb2.FetchResponse()
        for t in request.topics:
            topic = response.topics.add(topic=t.topic)
            topic.partitions.extend(parts[(t.topic, p.partition)] for p in t.partitions)
        routing.keep_within((p for t in response.topics for p in t.partitions), answer_bytes_max)
        return response

    async def _fetch_from(
        self,
        address: str,
        template: common_pb2.FetchRequest,
        wanted: set[TopicPartitionKey],
        max_bytes: int,
    ) -> dict[TopicPartitionKey, common_pb2.FetchPartitionResponse]:
        req = routing.fetch_request_for(template, wanted, max_bytes)
        timeout_s = (
            min(template.max_wait_ms, limits.FETCH_MAX_WAIT_MS_MAX) / 1000 + limits.CONTROL_RPC_TIMEOUT_S
        )
        try:
            resp = await self.view.peers.broker(address).Fetch(req, timeout=timeout_s)
        except grpc.aio.AioRpcError as exc:
            return {
                tp: common_pb2.FetchPartitionResponse(
                    partition=tp[1],
                    error_code=common_pb2.LEADER_NOT_AVAILABLE,
                    high_watermark=-1,
                    error_message=f"leader at {address} could not be reached: {exc.code().name}",
                )
                for tp in wanted
            }
        return {(t.topic, p.partition): p for t in resp.topics for p in t.partitions}

    async def list_offsets(self, request: common_pb2.ListOffsetsRequest) -> common_pb2.ListOffsetsResponse:
        tps = routing.collect_partitions(request.topics)
        await self.view.refresh_unless_known(tp[0] for tp in tps)
        by_leader, unroutable = routing.split_by_leader(self.view.cache, tps)
        parts: dict[TopicPartitionKey, common_pb2.ListOffsetsPartitionResponse] = {}
        for tp, (code, message) in unroutable.items():
            parts[tp] = common_pb2.ListOffsetsPartitionResponse(
                partition=tp[1], error_code=code, error_message=message, offset=-1
            )

        async def one(address: str, group: list[TopicPartitionKey]) -> None:
            req = routing.list_offsets_request_for(request, set(group))
            try:
                resp = await self.view.peers.broker(address).ListOffsets(
                    req, timeout=limits.CONTROL_RPC_TIMEOUT_S
                )
                for t in resp.topics:
                    for p in t.partitions:
                        parts[(t.topic, p.partition)] = p
            except grpc.aio.AioRpcError as exc:
                for tp in group:
                    parts[tp] = common_pb2.ListOffsetsPartitionResponse(
                        partition=tp[1],
                        error_code=common_pb2.LEADER_NOT_AVAILABLE,
                        offset=-1,
                        error_message=f"leader at {address} could not be reached: {exc.code().name}",
                    )

        await asyncio.gather(*(one(a, g) for a, g in by_leader.items()))
        if any(p.error_code in RETRIABLE_ROUTING_CODES for p in parts.values()):
            self.view.background(self.view.refresh_metadata())
        return common_pb2.ListOffsetsResponse(
            topics=[
                common_pb2.ListOffsetsTopicResponse(
                    topic=t.topic, partitions=[parts[(t.topic, p.partition)] for p in t.partitions]
                )
                for t in request.topics
            ]
        )

    async def end_offsets(self, tps: Sequence[TopicPartitionKey]) -> dict[TopicPartitionKey, int]:
        """High watermarks of these partitions (those whose leader answered)."""
        by_topic: dict[str, list[common_pb2.ListOffsetsPartition]] = {}
        for topic, partition in tps:
            by_topic.setdefault(topic, []).append(
                common_pb2.ListOffsetsPartition(partition=partition, timestamp=-1, current_leader_epoch=-1)
            )
        request = common_pb2.ListOffsetsRequest(
            replica_id=-1,
            topics=[common_pb2.ListOffsetsTopic(topic=t, partitions=ps) for t, ps in by_topic.items()],
        )
        response = await self.list_offsets(request)
        return {
            (t.topic, p.partition): p.offset
            for t in response.topics
            for p in t.partitions
            if p.error_code == common_pb2.NONE
        }

    # ---- per-leader admin of logs --------------------------------------------------------------

    async def delete_records(
        self, request: common_pb2.DeleteRecordsRequest
    ) -> common_pb2.DeleteRecordsResponse:
        """Split per partition leader, as ListOffsets; each leader answers once its ISR has the new
        log start offset (or at the request's timeout). Not retried here: a partition whose leader
        moved is answered NOT_LEADER_OR_FOLLOWER and the client asks again (the same offset is a
        no-op where it was already taken)."""
        timeout_ms = min(
            request.timeout_ms if request.timeout_ms > 0 else limits.DELETE_RECORDS_TIMEOUT_MS_DEFAULT,
            limits.DELETE_RECORDS_TIMEOUT_MS_MAX,
        )
        # The leader answers at its timeout at the latest; the margin is for the answer's way back.
        rpc_timeout_s = timeout_ms / 1000 + limits.CONTROL_RPC_TIMEOUT_S
        parts = await self._per_leader(
            request.topics,
            lambda address, group: self.view.peers.broker(address).DeleteRecords(
                routing.delete_records_request_for(request, group), timeout=rpc_timeout_s
            ),
            lambda tp, code, message: common_pb2.DeleteRecordsPartitionResponse(
                partition=tp[1], error_code=code, error_message=message, low_watermark=-1
            ),
        )
        return common_pb2.DeleteRecordsResponse(
            topics=[
                common_pb2.DeleteRecordsTopicResponse(
                    topic=t.topic, partitions=[parts[(t.topic, p.partition)] for p in t.partitions]
                )
                for t in request.topics
            ]
        )

    async def describe_log_dirs(
        self, request: common_pb2.DescribeLogDirsRequest
    ) -> common_pb2.DescribeLogDirsResponse:
        """Split per partition leader, as ListOffsets: each leader describes its own logs."""
        parts = await self._per_leader(
            request.topics,
            lambda address, group: self.view.peers.broker(address).DescribeLogDirs(
                routing.describe_log_dirs_request_for(request, group), timeout=limits.CONTROL_RPC_TIMEOUT_S
            ),
            lambda tp, code, message: common_pb2.DescribeLogDirsPartitionResponse(
                partition=tp[1], error_code=code, error_message=message, broker_id=-1
            ),
        )
        return common_pb2.DescribeLogDirsResponse(
            topics=[
                common_pb2.DescribeLogDirsTopicResponse(
                    topic=t.topic, partitions=[parts[(t.topic, p.partition)] for p in t.partitions]
                )
                for t in request.topics
            ]
        )

    async def _per_leader(
        self,
        topics: Sequence[Any],
        send: Callable[[str, set[TopicPartitionKey]], Awaitable[Any]],
        failed: Callable[[TopicPartitionKey, common_pb2.ErrorCode, str], P],
    ) -> dict[TopicPartitionKey, P]:
        """Every partition named in `topics` (request topics with partitions), answered by its
        leader: `send(address, partitions)` to each leader at once (its answer has topics with
        partitions), `failed(tp, code, message)` for a partition with no leader known, whose
        leader could not be reached, or that its leader's answer left out. Metadata is refreshed
        first for a topic not known, and afterwards when a leader answered that it moved."""
        tps = routing.collect_partitions(topics)
        await self.view.refresh_unless_known(tp[0] for tp in tps)
        by_leader, unroutable = routing.split_by_leader(self.view.cache, tps)
        parts: dict[TopicPartitionKey, P] = {
            tp: failed(tp, code, message) for tp, (code, message) in unroutable.items()
        }

        async def one(address: str, group: list[TopicPartitionKey]) -> None:
            try:
                resp = await send(address, set(group))
            except grpc.aio.AioRpcError as exc:
                for tp in group:
                    parts[tp] = failed(
                        tp,
                        common_pb2.LEADER_NOT_AVAILABLE,
                        f"leader at {address} could not be reached: {exc.code().name}",
                    )
                return
            for t in resp.topics:
                for p in t.partitions:
                    parts[(t.topic, p.partition)] = p

        await asyncio.gather(*(one(a, g) for a, g in by_leader.items()))
        if any(p.error_code in RETRIABLE_ROUTING_CODES for p in parts.values()):  # type: ignore[attr-defined]
            self.view.background(self.view.refresh_metadata())
        for tp in tps:
            if tp not in parts:  # a leader's answer left it out: never answer nothing for a partition
                parts[tp] = failed(
                    tp, common_pb2.UNKNOWN_SERVER_ERROR, f"the leader's answer did not name {tp[0]}-{tp[1]}"
                )
        return parts
