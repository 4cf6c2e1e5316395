"""The fetch gateway: stateless routing between clients and partition leaders.

It registers under /gateways/ids with a lease so the controller pushes it
UpdateMetadata; it also pulls DescribeCluster from the active controller at
start and whenever a leader answers that the gateway's picture is stale.
Produce is split per leader, sent concurrently and merged; retriable
routing errors (NOT_LEADER_OR_FOLLOWER, LEADER_NOT_AVAILABLE, a leader that
cannot be reached) are retried after a metadata refresh within the request's
timeout. Consumer offsets live in etcd, one transaction per commit.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import grpc

from clients.common import errors
from clients.common.errors import CorruptMessage
from clients.common.fetch_request import consumer_fetch_request
from clients.common.record_batch import iter_batch_headers
from clients.common.topics import group_id_problem
from clients.common.types import TopicPartitionKey
from coordinator import consumer_offsets, values
from coordinator.election import current_controller
from coordinator.registration import register_gateway, register_waiting_for_old_lease
from coordinator.store import Compare, CoordinatorError, EtcdStore
from protos.highwater.v1 import broker_pb2, common_pb2, controller_pb2, gateway_pb2, gateway_pb2_grpc
from services.common import limits
from services.common.metadata_cache import MetadataCache
from services.common.peers import PeerChannels
from services.common.request_checks import consumer_fetch_problem, produce_request_problem
from services.common.server import ServiceProcess
from services.gateway import metrics, record_level, routing
from services.gateway.groups import GROUP_ERROR_CODES, GROUP_ERROR_MESSAGES, GroupService, GroupStateConflict
from services.gateway.record_producer import RecordProducer
from services.groups import offset_commits
from services.groups.coordinator import GroupError
from services.security.config import SecurityConfig

log = logging.getLogger("highwater.gateway")

# The response message type of one admin call passed through to the controller.
R = TypeVar("R")
# A partition's answer in a per-leader call (DeleteRecords, DescribeLogDirs): it has error_code.
P = TypeVar("P")

# Per-partition answers the gateway retries itself (within the request's deadline), after
# refreshing metadata: the error flags' policy, except UNKNOWN_TOPIC_OR_PARTITION, which the
# gateway's own metadata already decided (a leader saying it goes back to the client, whose
# retry policy waits for a topic still being created).
RETRIABLE_ROUTING_CODES = errors.RETRIABLE_AFTER_REFRESH_CODES - {common_pb2.UNKNOWN_TOPIC_OR_PARTITION}
# Between two routing attempts of one request, unless new metadata arrives first.
ROUTING_RETRY_BACKOFF_MS = 100
# The same when the leader named by the metadata answered but has not yet applied its
# leadership (NOT_LEADER_OR_FOLLOWER): the controller's LeaderAndIsr reaches it in milliseconds,
# and the push of UpdateMetadata to this gateway often comes first.
ROUTING_RETRY_LEADER_BEHIND_MS = 20
# Between two attempts in any case: a burst of metadata pushes must not spin the loop.
ROUTING_RETRY_MIN_MS = 5
# Answers from a broker that is up, but not (yet) the leader it is named as.
LEADER_BEHIND_CODES = frozenset({common_pb2.NOT_LEADER_OR_FOLLOWER, common_pb2.UNKNOWN_LEADER_EPOCH})
# Statuses of the controller's own authorization checks, passed on as they are.
AUTHORIZATION_STATUSES = frozenset({grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.UNAUTHENTICATED})


@dataclass(frozen=True)
class GatewayConfig:
    gateway_id: int
    etcd_endpoints: list[str]
    host: str = "127.0.0.1"
    port: int = 0
    metrics_port: int | None = 0
    etcd_prefix: str = "/highwater"
    lease_ttl_s: int = limits.LEASE_TTL_S
    ready_file: Any = None
    security: SecurityConfig = field(default_factory=SecurityConfig)


Req = TypeVar("Req")


def _pass_through(
    rpc: str, request_cls: type[Req], response_cls: Callable[..., R], *, pass_refusals: bool = False
) -> Callable[[GatewayServicer, Req, grpc.aio.ServicerContext], Awaitable[R]]:
    """A GatewayService method that hands its request to the active controller (`_admin`).

    With `pass_refusals`, the controller's authorization refusals reach the client as their
    status (see `_admin`). `request_cls` only types the method. grpc finds the method by its
    name on the servicer: `rpc`.
    """

    async def method(self: GatewayServicer, request: Req, context: grpc.aio.ServicerContext) -> R:
        return await self._admin(rpc, request, response_cls, context if pass_refusals else None)

    method.__name__ = method.__qualname__ = rpc
    return method


class GatewayServicer(gateway_pb2_grpc.GatewayServiceServicer):
    def __init__(self, store: EtcdStore, peers: PeerChannels, security: SecurityConfig | None = None) -> None:
        self.store = store
        self.peers = peers
        self.cache = MetadataCache()
        # Set (and replaced) whenever the cache changes: a request waiting to route again
        # goes as soon as the controller's push names a new leader, not at its next back-off.
        self._metadata_changed = asyncio.Event()
        self._last_refresh = 0.0
        self._refresh_lock = asyncio.Lock()
        self._tasks: set[asyncio.Future[None]] = set()
        # DescribeCluster carries it; UpdateMetadata does not, so it is kept from the last pull.
        self.cluster_id = ""
        # Batches the gateway makes must pass the brokers' request limits, which the gateway shares.
        security = security or SecurityConfig()
        self.records = RecordProducer(
            self.cache,
            self._produce,
            self._init_producer_id,
            self.refresh_metadata,
            records_per_batch_max=min(
                security.max_batch_records or limits.RECORDS_PER_BATCH_MAX, limits.RECORDS_PER_BATCH_MAX
            ),
            request_bytes_max=security.max_request_bytes or limits.GRPC_MAX_MESSAGE_BYTES,
        )
        self.groups = GroupService(store, self.partition_counts, self.end_offsets)

    def _background(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # ---- metadata ------------------------------------------------------------------------

    async def controller_address(self) -> str | None:
        info = await current_controller(self.store)
        return f"{info['host']}:{info['port']}" if info else None

    async def refresh_metadata(self, *, force: bool = False) -> None:
        async with self._refresh_lock:
            if (
                not force
                and (time.monotonic() - self._last_refresh) * 1000
                < limits.GATEWAY_METADATA_REFRESH_INTERVAL_MS_MIN
            ):
                return
            address = await self.controller_address()
            if address is None:
                return
            try:
                resp = await self.peers.controller(address).DescribeCluster(
                    common_pb2.DescribeClusterRequest(), timeout=limits.CONTROL_RPC_TIMEOUT_S
                )
            except grpc.aio.AioRpcError as exc:
                log.warning("metadata refresh from controller at %s failed: %s", address, exc.code().name)
                return
            if resp.error_code == common_pb2.NONE:
                self.cache.apply_describe(resp)
                self.cluster_id = resp.cluster_id or self.cluster_id
                self._last_refresh = time.monotonic()
                self._announce_metadata()

    def _announce_metadata(self) -> None:
        changed, self._metadata_changed = self._metadata_changed, asyncio.Event()
        changed.set()

    async def _await_routing_retry(self, news: asyncio.Event, backoff_ms: int, *, force: bool) -> None:
        """Before routing again: at once if metadata changed since the attempt began (`news`
        set), else when it changes or after backoff_ms, then from the controller itself:
        always with `force`, else at most once per GATEWAY_METADATA_REFRESH_INTERVAL_MS_MIN
        (the short leader-behind wait must not pull the whole cluster every 20 ms)."""
        if news.is_set():
            await asyncio.sleep(ROUTING_RETRY_MIN_MS / 1000)
            return
        try:
            await asyncio.wait_for(news.wait(), backoff_ms / 1000)
        except TimeoutError:
            await self.refresh_metadata(force=force)

    async def UpdateMetadata(
        self, request: broker_pb2.UpdateMetadataRequest, context: grpc.aio.ServicerContext
    ) -> broker_pb2.UpdateMetadataResponse:
        if request.header.controller_epoch < self.cache.controller_epoch:
            return broker_pb2.UpdateMetadataResponse(
                error_code=common_pb2.STALE_CONTROLLER_EPOCH,
                error_message=f"controller epoch {request.header.controller_epoch} is older than "
                f"{self.cache.controller_epoch}",
            )
        self.cache.apply(request)
        self._announce_metadata()
        return broker_pb2.UpdateMetadataResponse()

    async def Metadata(
        self, request: common_pb2.MetadataRequest, context: grpc.aio.ServicerContext
    ) -> common_pb2.MetadataResponse:
        with metrics.REQUEST_LATENCY.labels("Metadata").time():
            return await self._metadata(request, context)

    async def _metadata(
        self, request: common_pb2.MetadataRequest, context: grpc.aio.ServicerContext
    ) -> common_pb2.MetadataResponse:
        missing = [t for t in request.topics if t not in self.cache.topics()]
        if missing or not self.cache.brokers or not self.cluster_id:
            await self.refresh_metadata()
        response = self.cache.metadata_response(list(request.topics))
        response.cluster_id = self.cluster_id
        return response

    # ---- produce ---------------------------------------------------------------------------

    async def Produce(
        self, request: common_pb2.ProduceRequest, context: grpc.aio.ServicerContext
    ) -> common_pb2.ProduceResponse:
        return await _checked_and_timed(
            "Produce", produce_request_problem(request), context, lambda: self._produce(request)
        )

    async def _produce(self, request: common_pb2.ProduceRequest) -> common_pb2.ProduceResponse:
        """Route a checked Produce to the leaders, retrying what is safe to retry (see Departures)."""
        timeout_ms = min(
            request.timeout_ms or limits.PRODUCE_TIMEOUT_MS_DEFAULT, limits.PRODUCE_TIMEOUT_MS_MAX
        )
        deadline = time.monotonic() + timeout_ms / 1000
        results: dict[TopicPartitionKey, common_pb2.ProducePartitionResponse] = {}
        pending = list(request.topics)
        # Retrying a batch that may already be in the log would write it twice, unless
        # the leader can recognise it (an idempotent producer's sequence numbers). Read
        # from the batches only when something is to be retried (8% of the gateway's time).
        idempotent: set[TopicPartitionKey] | None = None
        if any(t.topic not in self.cache.topics() for t in pending):
            await self.refresh_metadata()
        while True:
            news = self._metadata_changed
            split = routing.split_produce(self.cache, pending)
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
            await self._await_routing_retry(news, backoff_ms, force=not leader_behind)
            pending = [
                common_pb2.ProduceTopicData(
                    topic=t.topic, partitions=[pd for pd in t.partitions if (t.topic, pd.partition) in retry]
                )
                for t in request.topics
            ]
            pending = [t for t in pending if t.partitions]
        return routing.merge_produce(results, request.topics)

    async def _produce_to(
        self,
        address: str,
        template: common_pb2.ProduceRequest,
        items: list[tuple[str, common_pb2.ProducePartitionData]],
        deadline: float,
    ) -> tuple[dict[TopicPartitionKey, common_pb2.ProducePartitionResponse], set[TopicPartitionKey]]:
        """One leader's answers, and the partitions whose outcome is unknown (the call itself failed)."""
        req = routing.produce_request(template, items)
        remaining_s = max(deadline - time.monotonic(), 0.001)
        req.timeout_ms = int(remaining_s * 1000)
        try:
            resp = await self.peers.broker(address).Produce(req, timeout=remaining_s + 1.0)
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

    async def Fetch(
        self, request: common_pb2.FetchRequest, context: grpc.aio.ServicerContext
    ) -> common_pb2.FetchResponse:
        return await _checked_and_timed(
            "Fetch", consumer_fetch_problem(request), context, lambda: self._fetch(request)
        )

    async def _fetch(self, request: common_pb2.FetchRequest) -> common_pb2.FetchResponse:
        tps = routing.collect_partitions(request.topics)
        if any(tp[0] not in self.cache.topics() for tp in tps):
            await self.refresh_metadata()
        by_leader, unroutable = routing.split_by_leader(self.cache, tps)
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
            self._background(self.refresh_metadata())
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
            resp = await self.peers.broker(address).Fetch(req, timeout=timeout_s)
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

    async def ListOffsets(
        self, request: common_pb2.ListOffsetsRequest, context: grpc.aio.ServicerContext
    ) -> common_pb2.ListOffsetsResponse:
        with metrics.REQUEST_LATENCY.labels("ListOffsets").time():
            return await self._list_offsets(request, context)

    async def _list_offsets(
        self, request: common_pb2.ListOffsetsRequest, context: grpc.aio.ServicerContext | None
    ) -> common_pb2.ListOffsetsResponse:
        tps = routing.collect_partitions(request.topics)
        if any(tp[0] not in self.cache.topics() for tp in tps):
            await self.refresh_metadata()
        by_leader, unroutable = routing.split_by_leader(self.cache, tps)
        parts: dict[TopicPartitionKey, common_pb2.ListOffsetsPartitionResponse] = {}
        for tp, (code, message) in unroutable.items():
            parts[tp] = common_pb2.ListOffsetsPartitionResponse(
                partition=tp[1], error_code=code, error_message=message, offset=-1
            )

        async def one(address: str, group: list[TopicPartitionKey]) -> None:
            req = routing.list_offsets_request_for(request, set(group))
            try:
                resp = await self.peers.broker(address).ListOffsets(req, timeout=limits.CONTROL_RPC_TIMEOUT_S)
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
            self._background(self.refresh_metadata())
        return common_pb2.ListOffsetsResponse(
            topics=[
                common_pb2.ListOffsetsTopicResponse(
                    topic=t.topic, partitions=[parts[(t.topic, p.partition)] for p in t.partitions]
                )
                for t in request.topics
            ]
        )

    async def DeleteRecords(
        self, request: common_pb2.DeleteRecordsRequest, context: grpc.aio.ServicerContext
    ) -> common_pb2.DeleteRecordsResponse:
        """Split per partition leader, as ListOffsets; each leader answers once its ISR has the new
        log start offset (or at the request's timeout). Not retried here: a partition whose leader
        moved is answered NOT_LEADER_OR_FOLLOWER and the client asks again (the same offset is a
        no-op where it was already taken)."""
        with metrics.REQUEST_LATENCY.labels("DeleteRecords").time():
            return await self._delete_records(request)

    async def _delete_records(
        self, request: common_pb2.DeleteRecordsRequest
    ) -> common_pb2.DeleteRecordsResponse:
        timeout_ms = min(
            request.timeout_ms if request.timeout_ms > 0 else limits.DELETE_RECORDS_TIMEOUT_MS_DEFAULT,
            limits.DELETE_RECORDS_TIMEOUT_MS_MAX,
        )
        # The leader answers at its timeout at the latest; the margin is for the answer's way back.
        rpc_timeout_s = timeout_ms / 1000 + limits.CONTROL_RPC_TIMEOUT_S
        parts = await self._per_leader(
            request.topics,
            lambda address, group: self.peers.broker(address).DeleteRecords(
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

    async def DescribeLogDirs(
        self, request: common_pb2.DescribeLogDirsRequest, context: grpc.aio.ServicerContext
    ) -> common_pb2.DescribeLogDirsResponse:
        """Split per partition leader, as ListOffsets: each leader describes its own logs."""
        with metrics.REQUEST_LATENCY.labels("DescribeLogDirs").time():
            return await self._describe_log_dirs(request)

    async def _describe_log_dirs(
        self, request: common_pb2.DescribeLogDirsRequest
    ) -> common_pb2.DescribeLogDirsResponse:
        parts = await self._per_leader(
            request.topics,
            lambda address, group: self.peers.broker(address).DescribeLogDirs(
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
        if any(tp[0] not in self.cache.topics() for tp in tps):
            await self.refresh_metadata()
        by_leader, unroutable = routing.split_by_leader(self.cache, tps)
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
            self._background(self.refresh_metadata())
        for tp in tps:
            if tp not in parts:  # a leader's answer left it out: never answer nothing for a partition
                parts[tp] = failed(
                    tp, common_pb2.UNKNOWN_SERVER_ERROR, f"the leader's answer did not name {tp[0]}-{tp[1]}"
                )
        return parts

    # ---- subscribe --------------------------------------------------------------------------

    async def Subscribe(
        self, request: gateway_pb2.SubscribeRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[gateway_pb2.SubscribeResponse]:
        """Push batches below the HW as it moves: a long-poll Fetch loop on the client's behalf."""
        # Each pushed message holds one partition's records of one poll: bounded as a Fetch answer.
        max_bytes = min(
            request.max_bytes or limits.SUBSCRIBE_MAX_BYTES_DEFAULT, limits.GATEWAY_FETCH_RESPONSE_MAX_BYTES
        )
        positions: dict[TopicPartitionKey, int] = {}
        starts = [(p.topic, p.partition, p.start_offset) for p in request.partitions]
        if not starts:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "Subscribe needs at least one partition")
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
        if lo_req.topics:
            resolved = await self.ListOffsets(lo_req, context)
            for t in resolved.topics:
                for p in t.partitions:
                    if p.error_code != common_pb2.NONE:
                        yield gateway_pb2.SubscribeResponse(
                            topic=t.topic,
                            partition=p.partition,
                            error_code=p.error_code,
                            error_message=p.error_message,
                        )
                        return
                    positions[(t.topic, p.partition)] = p.offset
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
            resp = await self._fetch(req)
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
                await asyncio.sleep(0.01)

    # ---- record-level calls (docs/GRPC.md) ----------------------------------------------------

    async def ProduceRecords(
        self, request: gateway_pb2.ProduceRecordsRequest, context: grpc.aio.ServicerContext
    ) -> gateway_pb2.ProduceRecordsResponse:
        """Partition, batch, encode and write plain records idempotently (record_producer.py)."""
        return await _checked_and_timed(
            "ProduceRecords",
            record_level.produce_records_problem(request),
            context,
            lambda: self.records.produce(request),
        )

    async def _init_producer_id(
        self, request: common_pb2.InitProducerIdRequest
    ) -> common_pb2.InitProducerIdResponse:
        return await self._admin("InitProducerId", request, common_pb2.InitProducerIdResponse)

    async def ConsumeRecords(
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
        if topic not in self.cache.topics():
            await self.refresh_metadata()
        count = len(self.cache.partitions_of(topic))
        starts = (
            {p.partition: p.start_offset for p in request.partitions}
            if request.partitions
            else {p: request.default_start_offset for p in range(count)}
        )
        errors: list[gateway_pb2.ConsumePartitionError] = []
        for partition in list(starts):
            if (topic, partition) not in self.cache.partitions:
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
        if request.group_id and starts:
            committed = await self._fetch_committed_offsets(
                gateway_pb2.FetchCommittedOffsetsRequest(
                    group_id=request.group_id,
                    partitions=[common_pb2.TopicPartition(topic=topic, partition=p) for p in starts],
                ),
                context,
            )
            for c in committed.offsets:
                if c.offset >= 0:
                    starts[c.partition] = c.offset
        positions = await self._resolve_starts(topic, starts, errors)
        # Offsets to stop before (stop_at_end): the high watermarks as of this call.
        ends: dict[int, int] | None = None
        if request.stop_at_end:
            ends = await self._resolve_starts(topic, dict.fromkeys(positions, -1), errors)
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
            resp = await self._fetch(
                consumer_fetch_request(
                    {(topic, p): off for p, off in positions.items()},
                    max_wait_ms=limits.CONSUME_FETCH_WAIT_MS,
                    min_bytes=1,
                    max_bytes=limits.FETCH_MAX_BYTES_DEFAULT,
                    partition_max_bytes=partition_max_bytes,
                )
            )
            records: list[gateway_pb2.ConsumedRecord] = []
            errors = []
            empty_below_hw: list[int] = []
            for pr in resp.topics[0].partitions:
                position = positions[pr.partition]
                if pr.error_code in RETRIABLE_ROUTING_CODES:
                    continue
                if record_level.hole_end(position, pr) is not None:
                    empty_below_hw.append(pr.partition)
                    continue
                if pr.error_code == common_pb2.NONE:
                    try:
                        got = record_level.consumed_records(topic, pr.partition, pr.records, position)
                    except CorruptMessage as exc:
                        pr = common_pb2.FetchPartitionResponse(
                            partition=pr.partition, error_code=exc.code, error_message=str(exc)
                        )
                    else:
                        headers = list(iter_batch_headers(pr.records))
                        if headers:
                            positions[pr.partition] = max(position, headers[-1].next_offset)
                        if ends is not None:
                            got = record_level.records_before(got, ends[pr.partition])
                        if 0 < left < len(records) + len(got):
                            got = got[: left - len(records)]
                            positions[pr.partition] = got[-1].offset + 1 if got else position
                        records.extend(got)
                        continue
                errors.append(
                    gateway_pb2.ConsumePartitionError(
                        partition=pr.partition,
                        error_code=pr.error_code,
                        error_message=pr.error_message,
                        next_offset=position,
                    )
                )
                del positions[pr.partition]
            for message in record_level.consume_messages(
                records, per_message, limits.CONSUME_RECORDS_MESSAGE_BYTES_MAX
            ):
                yield gateway_pb2.ConsumeRecordsResponse(records=message)
            if errors:
                yield gateway_pb2.ConsumeRecordsResponse(errors=errors)
            if left > 0:
                left -= len(records)
            for partition in empty_below_hw:
                positions[partition] = await self._position_past_hole(
                    topic, partition, positions[partition], partition_max_bytes
                )
            if ends is not None:
                positions = record_level.positions_before_end(positions, ends)
            if not records and not errors:
                await asyncio.sleep(0.01)

    async def _position_past_hole(
        self, topic: str, partition: int, position: int, partition_max_bytes: int
    ) -> int:
        """ConsumeRecords' position after an answer with no records below the HW: the HW if a
        Fetch of the partition alone proves a compacted log's hole reaches it, else `position`
        (the records were left out of a shared answer, and are fetched again next round)."""
        resp = await self._fetch(
            consumer_fetch_request(
                {(topic, partition): position},
                max_wait_ms=0,
                min_bytes=0,
                max_bytes=partition_max_bytes,
                partition_max_bytes=partition_max_bytes,
            )
        )
        for t in resp.topics:
            for pr in t.partitions:
                if pr.partition == partition:
                    end = record_level.hole_end(position, pr)
                    return position if end is None else end
        return position

    async def _resolve_starts(
        self, topic: str, starts: dict[int, int], errors: list[gateway_pb2.ConsumePartitionError]
    ) -> dict[int, int]:
        """Start offsets with -2 (earliest) and -1 (latest) looked up; failures go to `errors`."""
        positions = {p: s for p, s in starts.items() if s >= 0}
        wanted = [p for p, s in starts.items() if s < 0]
        if not wanted:
            return positions
        resolved = await self._list_offsets(
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
            ),
            None,
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

    # ---- consumer offsets ---------------------------------------------------------------------

    async def CommitOffsets(
        self, request: gateway_pb2.CommitOffsetsRequest, context: grpc.aio.ServicerContext
    ) -> gateway_pb2.CommitOffsetsResponse:
        return await _for_valid_group(
            "CommitOffsets",
            request.group_id,
            gateway_pb2.CommitOffsetsResponse,
            lambda: self._commit_offsets(request, context),
        )

    async def _commit_offsets(
        self, request: gateway_pb2.CommitOffsetsRequest, context: grpc.aio.ServicerContext
    ) -> gateway_pb2.CommitOffsetsResponse:
        """CommitOffsets' adapter: the rules are services/groups/offset_commits.py's, this maps
        them to protobuf codes. Partitions with a problem answer it; the rest are one fenced
        commit, all refused together when the group refuses it (nothing was written)."""
        if any(t.topic not in self.cache.topics() for t in request.topics):
            await self.refresh_metadata()
        commits: list[offset_commits.Commit] = []
        results = []
        for t in request.topics:
            for p in t.partitions:
                commit = offset_commits.Commit(t.topic, p.partition, p.offset, p.metadata, p.leader_epoch)
                problem = offset_commits.partition_problem(
                    commit, commit.key in self.cache.partitions, negative_offset_allowed=False
                )
                code, message = (common_pb2.NONE, "") if problem is None else _problem_answer(commit, problem)
                results.append(
                    common_pb2.PartitionResult(
                        topic=t.topic, partition=p.partition, error_code=code, error_message=message
                    )
                )
                if problem is None:
                    commits.append(commit)
        if offset_commits.too_many_offsets(len(commits)):
            return gateway_pb2.CommitOffsetsResponse(
                error_code=common_pb2.INVALID_REQUEST,
                error_message=f"{len(commits)} offsets in one commit; the limit is "
                f"{limits.COMMIT_OFFSETS_PER_REQUEST_MAX}",
            )
        if not commits:
            return gateway_pb2.CommitOffsetsResponse(partitions=results)

        async def write_changed(guard: Compare, changed: Sequence[offset_commits.Commit]) -> bool:
            written = await consumer_offsets.commit_changed(
                self.store, request.group_id, guard, changed, int(time.time() * 1000)
            )
            if not written:
                self.groups.forget(request.group_id)  # its copy of the state is stale
            return written

        refusal = await offset_commits.commit_fenced(
            request.member_id,
            request.member_epoch,
            commits,
            lambda: self.groups.commit_guard(request.group_id),
            write_changed,
        )
        if refusal is not None:
            code, message = _refusal_answer(request.group_id, refusal)
            for r in results:
                if r.error_code == common_pb2.NONE:
                    r.error_code, r.error_message = code, message
        return gateway_pb2.CommitOffsetsResponse(partitions=results)

    async def FetchCommittedOffsets(
        self, request: gateway_pb2.FetchCommittedOffsetsRequest, context: grpc.aio.ServicerContext
    ) -> gateway_pb2.FetchCommittedOffsetsResponse:
        return await _for_valid_group(
            "FetchCommittedOffsets",
            request.group_id,
            gateway_pb2.FetchCommittedOffsetsResponse,
            lambda: self._fetch_committed_offsets(request, context),
        )

    async def _fetch_committed_offsets(
        self, request: gateway_pb2.FetchCommittedOffsetsRequest, context: grpc.aio.ServicerContext
    ) -> gateway_pb2.FetchCommittedOffsetsResponse:
        """The group's committed offsets; its id is already checked (FetchCommittedOffsets,
        ConsumeRecords)."""
        kvs, _ = await self.store.get_prefix(self.store.keys.consumer_group_prefix(request.group_id))
        stored: dict[TopicPartitionKey, values.CommittedOffsetValue] = {}
        for kv in kvs:
            parsed = self.store.keys.parse_consumer_offset(kv.key)
            if parsed is not None:
                stored[(parsed[1], parsed[2])] = values.decode_consumer_offset(kv.value)
        wanted = [(p.topic, p.partition) for p in request.partitions] or sorted(stored)
        offsets = []
        for tp in wanted:
            entry = stored.get(tp)
            offsets.append(
                gateway_pb2.CommittedOffset(
                    topic=tp[0],
                    partition=tp[1],
                    offset=entry["offset"] if entry else -1,
                    metadata=entry.get("metadata", "") if entry else "",
                    leader_epoch=entry.get("leader_epoch", -1) if entry else -1,
                )
            )
        return gateway_pb2.FetchCommittedOffsetsResponse(offsets=offsets)

    # ---- consumer groups (services/gateway/groups.py) -------------------------------------------

    async def partition_counts(self, topics: Sequence[str]) -> dict[str, int]:
        """Partition counts of the named topics that exist (the group coordinator's input)."""
        if any(t not in self.cache.topics() for t in topics):
            await self.refresh_metadata()
        known = self.cache.topics()
        return {t: len(self.cache.partitions_of(t)) for t in topics if t in known}

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
        response = await self._list_offsets(request, None)
        return {
            (t.topic, p.partition): p.offset
            for t in response.topics
            for p in t.partitions
            if p.error_code == common_pb2.NONE
        }

    async def ConsumerGroupHeartbeat(
        self, request: gateway_pb2.ConsumerGroupHeartbeatRequest, context: grpc.aio.ServicerContext
    ) -> gateway_pb2.ConsumerGroupHeartbeatResponse:
        with metrics.REQUEST_LATENCY.labels("ConsumerGroupHeartbeat").time():
            try:
                return await self.groups.heartbeat(request, _peer_host(context.peer()))
            except (GroupStateConflict, CoordinatorError) as exc:
                return gateway_pb2.ConsumerGroupHeartbeatResponse(
                    error_code=common_pb2.REQUEST_TIMED_OUT, error_message=f"{exc}; retry"
                )

    async def ListGroups(
        self, request: gateway_pb2.ListGroupsRequest, context: grpc.aio.ServicerContext
    ) -> gateway_pb2.ListGroupsResponse:
        with metrics.REQUEST_LATENCY.labels("ListGroups").time():
            return await self.groups.list_groups()

    async def DescribeGroups(
        self, request: gateway_pb2.DescribeGroupsRequest, context: grpc.aio.ServicerContext
    ) -> gateway_pb2.DescribeGroupsResponse:
        with metrics.REQUEST_LATENCY.labels("DescribeGroups").time():
            response = gateway_pb2.DescribeGroupsResponse()
            await _answer_each_group(request.group_ids, response.groups, self.groups.describe)
            return response

    async def DeleteGroups(
        self, request: gateway_pb2.DeleteGroupsRequest, context: grpc.aio.ServicerContext
    ) -> gateway_pb2.DeleteGroupsResponse:
        with metrics.REQUEST_LATENCY.labels("DeleteGroups").time():
            response = gateway_pb2.DeleteGroupsResponse()
            await _answer_each_group(request.group_ids, response.results, self.groups.delete)
            return response

    # ---- admin pass-through -------------------------------------------------------------------

    async def _admin(
        self,
        rpc: str,
        request: Any,
        response_cls: Callable[..., R],
        context: grpc.aio.ServicerContext | None = None,
    ) -> R:
        """Call the active controller; follow one NOT_CONTROLLER redirect.

        With `context`, a refusal of the controller's own authorization (it re-checks the
        forwarded principal) is passed on to the client as that status, not as a
        retriable NOT_CONTROLLER: the ACL and token calls give it.
        """
        with metrics.REQUEST_LATENCY.labels(rpc).time():
            return await self._admin_timed(rpc, request, response_cls, context)

    async def _admin_timed(
        self,
        rpc: str,
        request: Any,
        response_cls: Callable[..., R],
        context: grpc.aio.ServicerContext | None = None,
    ) -> R:
        address = await self.controller_address()
        for _ in range(3):
            if address is None:
                return response_cls(
                    error_code=common_pb2.NOT_CONTROLLER,
                    error_message="no controller is active; start one or retry shortly",
                )
            try:
                # The generated stubs are untyped: the answer is the response_cls message.
                answer = await getattr(self.peers.controller(address), rpc)(request, timeout=30.0)
            except grpc.aio.AioRpcError as exc:
                if context is not None and exc.code() in AUTHORIZATION_STATUSES:
                    await context.abort(exc.code(), f"the controller refused: {exc.details()}")
                return response_cls(
                    error_code=common_pb2.NOT_CONTROLLER,
                    error_message=f"controller at {address} could not be reached: {exc.code().name}",
                )
            resp: R = answer
            if answer.error_code == common_pb2.NOT_CONTROLLER and answer.active_controller.port:
                address = f"{answer.active_controller.host}:{answer.active_controller.port}"
                continue
            if rpc in (
                "CreateTopics",
                "DeleteTopics",
                "CreatePartitions",
                "ElectLeaders",
                "AlterTopicConfigs",
            ):
                await self.refresh_metadata(force=True)
            return resp
        return resp

    CreateTopics = _pass_through(
        "CreateTopics", common_pb2.CreateTopicsRequest, common_pb2.CreateTopicsResponse
    )
    DeleteTopics = _pass_through(
        "DeleteTopics", common_pb2.DeleteTopicsRequest, common_pb2.DeleteTopicsResponse
    )
    CreatePartitions = _pass_through(
        "CreatePartitions", common_pb2.CreatePartitionsRequest, common_pb2.CreatePartitionsResponse
    )
    AlterTopicConfigs = _pass_through(
        "AlterTopicConfigs", common_pb2.AlterTopicConfigsRequest, common_pb2.AlterTopicConfigsResponse
    )
    AlterPartitionReassignments = _pass_through(
        "AlterPartitionReassignments",
        common_pb2.AlterPartitionReassignmentsRequest,
        common_pb2.AlterPartitionReassignmentsResponse,
    )
    ListPartitionReassignments = _pass_through(
        "ListPartitionReassignments",
        common_pb2.ListPartitionReassignmentsRequest,
        common_pb2.ListPartitionReassignmentsResponse,
    )
    ElectLeaders = _pass_through(
        "ElectLeaders", common_pb2.ElectLeadersRequest, common_pb2.ElectLeadersResponse
    )
    DescribeCluster = _pass_through(
        "DescribeCluster", common_pb2.DescribeClusterRequest, common_pb2.DescribeClusterResponse
    )
    InitProducerId = _pass_through(
        "InitProducerId", common_pb2.InitProducerIdRequest, common_pb2.InitProducerIdResponse
    )

    # ACLs and tokens: authorized here and again at the controller, which sees the client's
    # principal (rules.FORWARDED_METHODS), never the gateway's own identity.

    CreateAcls = _pass_through(
        "CreateAcls", controller_pb2.CreateAclsRequest, controller_pb2.CreateAclsResponse, pass_refusals=True
    )
    DeleteAcls = _pass_through(
        "DeleteAcls", controller_pb2.DeleteAclsRequest, controller_pb2.DeleteAclsResponse, pass_refusals=True
    )
    DescribeAcls = _pass_through(
        "DescribeAcls",
        controller_pb2.DescribeAclsRequest,
        controller_pb2.DescribeAclsResponse,
        pass_refusals=True,
    )
    CreateToken = _pass_through(
        "CreateToken",
        controller_pb2.CreateTokenRequest,
        controller_pb2.CreateTokenResponse,
        pass_refusals=True,
    )
    RevokeToken = _pass_through(
        "RevokeToken",
        controller_pb2.RevokeTokenRequest,
        controller_pb2.RevokeTokenResponse,
        pass_refusals=True,
    )
    ListTokens = _pass_through(
        "ListTokens", controller_pb2.ListTokensRequest, controller_pb2.ListTokensResponse, pass_refusals=True
    )


async def _checked_and_timed(
    rpc: str, problem: str | None, context: grpc.aio.ServicerContext, answer: Callable[[], Awaitable[R]]
) -> R:
    """`answer()`, timed under REQUEST_LATENCY as `rpc`; a request with a `problem` is aborted
    with INVALID_ARGUMENT first, outside the timing."""
    if problem is not None:
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, problem)
    with metrics.REQUEST_LATENCY.labels(rpc).time():
        return await answer()


async def _for_valid_group(
    rpc: str, group_id: str, response_cls: Callable[..., R], answer: Callable[[], Awaitable[R]]
) -> R:
    """`answer()`, timed under REQUEST_LATENCY as `rpc`; a malformed group id gets an
    INVALID_REQUEST response instead and is never looked up."""
    with metrics.REQUEST_LATENCY.labels(rpc).time():
        problem = group_id_problem(group_id)
        if problem is not None:
            return response_cls(error_code=common_pb2.INVALID_REQUEST, error_message=problem)
        return await answer()


async def _answer_each_group(
    group_ids: Sequence[str], answers: Any, answer: Callable[[str], Awaitable[Any]]
) -> None:
    """Append `answer(group)` to `answers` (a repeated field) for each group id; a malformed
    id gets an INVALID_REQUEST entry instead and is never looked up."""
    for group in group_ids:
        problem = group_id_problem(group)
        if problem is not None:
            answers.add(group_id=group, error_code=common_pb2.INVALID_REQUEST, error_message=problem)
        else:
            answers.append(await answer(group))


def _problem_answer(
    commit: offset_commits.Commit, problem: offset_commits.PartitionProblem
) -> tuple[common_pb2.ErrorCode, str]:
    """A partition of CommitOffsets that is not stored: its code and what to do."""
    if problem == offset_commits.PartitionProblem.UNKNOWN_TOPIC_OR_PARTITION:
        return common_pb2.UNKNOWN_TOPIC_OR_PARTITION, f"{commit.topic}-{commit.partition} does not exist"
    if problem == offset_commits.PartitionProblem.INVALID_COMMIT_OFFSET:
        return common_pb2.INVALID_COMMIT_OFFSET, f"offset must be >= 0, got {commit.offset}"
    # OFFSET_METADATA_TOO_LARGE: answered INVALID_REQUEST, the gateway API's code for it.
    return common_pb2.INVALID_REQUEST, (
        f"offset metadata is {len(commit.metadata)} characters; the limit is "
        f"{limits.OFFSET_METADATA_MAX_CHARS}"
    )


def _refusal_answer(group: str, refusal: offset_commits.CommitRefusal) -> tuple[common_pb2.ErrorCode, str]:
    """A refused CommitOffsets: the code every partition of it answers, and what to do."""
    if refusal == offset_commits.CommitRefusal.NON_EMPTY_GROUP:
        return common_pb2.NON_EMPTY_GROUP, (
            f"group {group!r} has members: its offsets are theirs to commit; stop them before "
            "resetting its offsets"
        )
    if refusal == offset_commits.CommitRefusal.GROUP_KEPT_CHANGING:
        return (
            common_pb2.REQUEST_TIMED_OUT,
            "the group kept changing while committing (a rebalance); commit again",
        )
    error = GroupError(refusal.value)
    return GROUP_ERROR_CODES[error], GROUP_ERROR_MESSAGES[error]


def _peer_host(peer: str) -> str:
    """The client's address from gRPC's peer string ("ipv4:127.0.0.1:5123", "ipv6:[::1]:5123")."""
    kind, _, rest = peer.partition(":")
    if kind in ("ipv4", "ipv6"):
        return rest.rsplit(":", 1)[0].strip("[]")
    return peer


async def serve(config: GatewayConfig) -> None:
    process = await ServiceProcess.start(
        config,
        name=f"gateway-{config.gateway_id}",
        service_name=gateway_pb2.DESCRIPTOR.services_by_name["GatewayService"].full_name,
        log=log,
    )
    store, runtime = process.store, process.runtime
    servicer = GatewayServicer(store, process.peers, config.security)
    # Generated by grpcio-tools without annotations (pyproject.toml: protos.* is not checked).
    gateway_pb2_grpc.add_GatewayServiceServicer_to_server(servicer, runtime.server)  # type: ignore[no-untyped-call]
    await runtime.start()
    info = {
        "gateway_id": config.gateway_id,
        "host": config.host,
        "port": runtime.bound_port,
        "pid": os.getpid(),
    }
    registration = await register_waiting_for_old_lease(
        lambda: register_gateway(store, config.gateway_id, info, ttl_s=config.lease_ttl_s),
        ttl_s=config.lease_ttl_s,
        what=f"gateway {config.gateway_id}",
    )
    await servicer.refresh_metadata(force=True)
    servicer.groups.start()
    await runtime.mark_ready(gateway_id=config.gateway_id)

    async def on_stop() -> None:
        await servicer.groups.stop()
        await process.close(registration)

    await runtime.run_until_stopped(on_stop)
