"""The fetch gateway: stateless routing between clients and partition leaders.

It registers under /gateways/ids with a lease so the controller pushes it
UpdateMetadata, and registers again if the lease is lost (registration_life.py);
it also pulls DescribeCluster from the active controller at start and whenever
a leader answers that the gateway's picture is stale.
Produce is split per leader, sent concurrently and merged; retriable
routing errors (NOT_LEADER_OR_FOLLOWER, LEADER_NOT_AVAILABLE, a leader that
cannot be reached) are retried after a metadata refresh within the request's
timeout. Consumer offsets live in etcd, one transaction per commit.

This module is the gRPC adapter: GatewayServicer checks and times each call and hands it to
the part that answers it:
- cluster_view.py: the metadata cache, its refreshes, UpdateMetadata and Metadata;
- leader_calls.py: Produce, Fetch, ListOffsets, DeleteRecords, DescribeLogDirs per leader;
- record_streams.py: Subscribe and ConsumeRecords; record_producer.py: ProduceRecords;
- group_calls.py: offsets, heartbeats and group admin (over groups.py);
- controller_calls.py: admin calls passed through to the active controller;
- transaction_calls.py: a transactional producer's calls (its InitProducerId, AddPartitionsToTxn,
  AddOffsetsToTxn, TxnOffsetCommit, EndTxn); transactions_admin.py: the operators' views and abort.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

import grpc

from coordinator.store import EtcdStore
from protos.highwater.v1 import broker_pb2, common_pb2, controller_pb2, gateway_pb2, gateway_pb2_grpc
from services.common import limits
from services.common.peers import PeerChannels
from services.common.request_checks import consumer_fetch_problem, produce_request_problem
from services.common.server import ServiceProcess
from services.common.service_config import ServiceConfig
from services.gateway import metrics, record_level
from services.gateway.cluster_view import ClusterView
from services.gateway.controller_calls import ControllerCalls
from services.gateway.group_calls import GroupCalls
from services.gateway.groups import GroupService
from services.gateway.leader_calls import LeaderCalls
from services.gateway.record_producer import RecordProducer
from services.gateway.record_streams import RecordStreams
from services.gateway.registration_life import gateway_registration_life
from services.gateway.transaction_calls import GatewayTransactions
from services.gateway.transactions_admin import TransactionsAdmin
from services.security.config import SecurityConfig

log = logging.getLogger("highwater.gateway")

# The response message type of one call.
R = TypeVar("R")
Req = TypeVar("Req")


@dataclass(frozen=True)
class GatewayConfig(ServiceConfig):
    """A gateway's settings: the common ones (ServiceConfig) and its id."""

    gateway_id: int


def _pass_through(
    rpc: str, request_cls: type[Req], response_cls: Callable[..., R], *, pass_refusals: bool = False
) -> Callable[[GatewayServicer, Req, grpc.aio.ServicerContext], Awaitable[R]]:
    """A GatewayService method that hands its request to the active controller (ControllerCalls).

    With `pass_refusals`, the controller's authorization refusals reach the client as their
    status (see `ControllerCalls.call`). `request_cls` only types the method. grpc finds the
    method by its name on the servicer: `rpc`.
    """

    async def method(self: GatewayServicer, request: Req, context: grpc.aio.ServicerContext) -> R:
        return await self.controller.call(rpc, request, response_cls, context if pass_refusals else None)

    method.__name__ = method.__qualname__ = rpc
    return method


class GatewayServicer(gateway_pb2_grpc.GatewayServiceServicer):
    """GatewayService's gRPC adapter: request checks, latency metrics, and the call handed on.

    Every part shares one ClusterView (`view`), whose cache they read at each call.
    """

    def __init__(self, store: EtcdStore, peers: PeerChannels, security: SecurityConfig | None = None) -> None:
        self.view = ClusterView(store, peers)
        self.leaders = LeaderCalls(self.view)
        self.controller = ControllerCalls(self.view)
        self.groups = GroupService(store, self.view.partition_counts, self.leaders.end_offsets)
        self.group_calls = GroupCalls(store, self.view, self.groups)
        self.transactions = GatewayTransactions(store, self.view, self.controller)
        self.transactions_admin = TransactionsAdmin(store, self.transactions.driver)
        self.streams = RecordStreams(self.view, self.leaders, self.group_calls.committed_offsets)
        # Batches the gateway makes must pass the brokers' request limits, which the gateway shares.
        security = security or SecurityConfig()
        self.records = RecordProducer(
            self.view.cache,
            self.leaders.produce,
            self.controller.init_producer_id,
            self.view.refresh_metadata,
            records_per_batch_max=min(
                security.max_batch_records or limits.RECORDS_PER_BATCH_MAX, limits.RECORDS_PER_BATCH_MAX
            ),
            request_bytes_max=security.max_request_bytes or limits.GRPC_MAX_MESSAGE_BYTES,
            transactions=self.transactions,
        )

    # ---- metadata (cluster_view.py) -----------------------------------------------------------

    async def UpdateMetadata(
        self, request: broker_pb2.UpdateMetadataRequest, context: grpc.aio.ServicerContext
    ) -> broker_pb2.UpdateMetadataResponse:
        return self.view.update_metadata(request)

    async def Metadata(
        self, request: common_pb2.MetadataRequest, context: grpc.aio.ServicerContext
    ) -> common_pb2.MetadataResponse:
        with metrics.REQUEST_LATENCY.labels("Metadata").time():
            return await self.view.metadata(request)

    # ---- data calls routed to leaders (leader_calls.py) ----------------------------------------

    async def Produce(
        self, request: common_pb2.ProduceRequest, context: grpc.aio.ServicerContext
    ) -> common_pb2.ProduceResponse:
        return await _checked_and_timed(
            "Produce", produce_request_problem(request), context, lambda: self.leaders.produce(request)
        )

    async def Fetch(
        self, request: common_pb2.FetchRequest, context: grpc.aio.ServicerContext
    ) -> common_pb2.FetchResponse:
        return await _checked_and_timed(
            "Fetch", consumer_fetch_problem(request), context, lambda: self.leaders.fetch(request)
        )

    async def ListOffsets(
        self, request: common_pb2.ListOffsetsRequest, context: grpc.aio.ServicerContext
    ) -> common_pb2.ListOffsetsResponse:
        with metrics.REQUEST_LATENCY.labels("ListOffsets").time():
            return await self.leaders.list_offsets(request)

    async def DeleteRecords(
        self, request: common_pb2.DeleteRecordsRequest, context: grpc.aio.ServicerContext
    ) -> common_pb2.DeleteRecordsResponse:
        with metrics.REQUEST_LATENCY.labels("DeleteRecords").time():
            return await self.leaders.delete_records(request)

    async def DescribeLogDirs(
        self, request: common_pb2.DescribeLogDirsRequest, context: grpc.aio.ServicerContext
    ) -> common_pb2.DescribeLogDirsResponse:
        with metrics.REQUEST_LATENCY.labels("DescribeLogDirs").time():
            return await self.leaders.describe_log_dirs(request)

    # ---- record streams and record-level calls (docs/GRPC.md) ----------------------------------

    async def Subscribe(
        self, request: gateway_pb2.SubscribeRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[gateway_pb2.SubscribeResponse]:
        """Push batches below the HW as it moves (record_streams.py). An async generator, as
        grpc.aio takes a server-streaming method to be."""
        async for message in self.streams.subscribe(request, context):
            yield message

    async def ConsumeRecords(
        self, request: gateway_pb2.ConsumeRecordsRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[gateway_pb2.ConsumeRecordsResponse]:
        """Decoded records of one topic as its HW moves (record_streams.py)."""
        async for message in self.streams.consume_records(request, context):
            yield message

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

    # ---- consumer offsets and groups (group_calls.py) ------------------------------------------

    async def CommitOffsets(
        self, request: gateway_pb2.CommitOffsetsRequest, context: grpc.aio.ServicerContext
    ) -> gateway_pb2.CommitOffsetsResponse:
        with metrics.REQUEST_LATENCY.labels("CommitOffsets").time():
            return await self.group_calls.commit_offsets(request)

    async def FetchCommittedOffsets(
        self, request: gateway_pb2.FetchCommittedOffsetsRequest, context: grpc.aio.ServicerContext
    ) -> gateway_pb2.FetchCommittedOffsetsResponse:
        with metrics.REQUEST_LATENCY.labels("FetchCommittedOffsets").time():
            return await self.group_calls.fetch_committed_offsets(request)

    async def ConsumerGroupHeartbeat(
        self, request: gateway_pb2.ConsumerGroupHeartbeatRequest, context: grpc.aio.ServicerContext
    ) -> gateway_pb2.ConsumerGroupHeartbeatResponse:
        with metrics.REQUEST_LATENCY.labels("ConsumerGroupHeartbeat").time():
            return await self.group_calls.heartbeat(request, context.peer())

    async def ListGroups(
        self, request: gateway_pb2.ListGroupsRequest, context: grpc.aio.ServicerContext
    ) -> gateway_pb2.ListGroupsResponse:
        with metrics.REQUEST_LATENCY.labels("ListGroups").time():
            return await self.group_calls.list_groups()

    async def DescribeGroups(
        self, request: gateway_pb2.DescribeGroupsRequest, context: grpc.aio.ServicerContext
    ) -> gateway_pb2.DescribeGroupsResponse:
        with metrics.REQUEST_LATENCY.labels("DescribeGroups").time():
            return await self.group_calls.describe_groups(request)

    async def DeleteGroups(
        self, request: gateway_pb2.DeleteGroupsRequest, context: grpc.aio.ServicerContext
    ) -> gateway_pb2.DeleteGroupsResponse:
        with metrics.REQUEST_LATENCY.labels("DeleteGroups").time():
            return await self.group_calls.delete_groups(request)

    # ---- transactions (transaction_calls.py, transactions_admin.py) ---------------------------

    async def InitProducerId(
        self, request: common_pb2.InitProducerIdRequest, context: grpc.aio.ServicerContext
    ) -> common_pb2.InitProducerIdResponse:
        """A transactional producer's id from the transaction coordinator; an idempotent one's
        from the controller."""
        if not request.transactional_id:
            return await self.controller.call("InitProducerId", request, common_pb2.InitProducerIdResponse)
        with metrics.REQUEST_LATENCY.labels("InitProducerId").time():
            return await self.transactions.init_producer_id(request)

    async def AddPartitionsToTxn(
        self, request: gateway_pb2.AddPartitionsToTxnRequest, context: grpc.aio.ServicerContext
    ) -> gateway_pb2.AddPartitionsToTxnResponse:
        with metrics.REQUEST_LATENCY.labels("AddPartitionsToTxn").time():
            return await self.transactions.add_partitions(request)

    async def AddOffsetsToTxn(
        self, request: gateway_pb2.AddOffsetsToTxnRequest, context: grpc.aio.ServicerContext
    ) -> gateway_pb2.AddOffsetsToTxnResponse:
        with metrics.REQUEST_LATENCY.labels("AddOffsetsToTxn").time():
            return await self.transactions.add_offsets(request)

    async def TxnOffsetCommit(
        self, request: gateway_pb2.TxnOffsetCommitRequest, context: grpc.aio.ServicerContext
    ) -> gateway_pb2.TxnOffsetCommitResponse:
        with metrics.REQUEST_LATENCY.labels("TxnOffsetCommit").time():
            return await self.transactions.txn_offset_commit(request)

    async def EndTxn(
        self, request: gateway_pb2.EndTxnRequest, context: grpc.aio.ServicerContext
    ) -> gateway_pb2.EndTxnResponse:
        with metrics.REQUEST_LATENCY.labels("EndTxn").time():
            return await self.transactions.end_txn(request)

    async def ListTransactions(
        self, request: gateway_pb2.ListTransactionsRequest, context: grpc.aio.ServicerContext
    ) -> gateway_pb2.ListTransactionsResponse:
        with metrics.REQUEST_LATENCY.labels("ListTransactions").time():
            return await self.transactions_admin.list_transactions(request)

    async def DescribeTransactions(
        self, request: gateway_pb2.DescribeTransactionsRequest, context: grpc.aio.ServicerContext
    ) -> gateway_pb2.DescribeTransactionsResponse:
        with metrics.REQUEST_LATENCY.labels("DescribeTransactions").time():
            return await self.transactions_admin.describe_transactions(request)

    async def AbortTransaction(
        self, request: gateway_pb2.AbortTransactionRequest, context: grpc.aio.ServicerContext
    ) -> gateway_pb2.AbortTransactionResponse:
        with metrics.REQUEST_LATENCY.labels("AbortTransaction").time():
            return await self.transactions_admin.abort_transaction(request)

    # ---- passed through to the active controller (controller_calls.py) -------------------------

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


async def serve(config: GatewayConfig) -> None:
    """Start the gateway: serve, register (and keep registered: registration_life.py), take the
    cluster's metadata, serve the groups; stop on a signal or when re-registering gave up."""
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
    life = gateway_registration_life(
        store, config.gateway_id, info, ttl_s=config.lease_ttl_s, stop_process=runtime.stopping.set
    )
    await life.register()
    await servicer.view.refresh_metadata(force=True)
    servicer.groups.start()
    servicer.transactions.start()
    await runtime.mark_ready(gateway_id=config.gateway_id)
    lease_watcher = asyncio.create_task(life.watch_lease(), name="gateway-lease-watch")

    async def on_stop() -> None:
        lease_watcher.cancel()
        life.shutting_down()
        await servicer.groups.stop()
        await servicer.transactions.stop()
        await process.close(life.current)
        life.stopped()

    await runtime.run_until_stopped(on_stop)
