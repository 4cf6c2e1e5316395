"""The controller process: campaigns in etcd, runs the event loop while active.

Every instance serves ControllerService from the start. While standing by it
answers NOT_CONTROLLER with the active controller's address and keeps the
cluster's metadata in memory from etcd's watch (metadata_image.MetadataFollower);
once it wins the election it takes that copy, caught up to the election's
revision, and runs the event loop until it loses its lease or is fenced, then it
stops acting at once and stands by again (a fresh load, then the watch).

The security admin calls (ACLs, tokens) are decided in security_admin.py and
written here, one at a time, in a transaction fenced by the active epoch;
they touch nothing the event loop owns, so they do not queue behind it.

While standing by it holds a StandbyHeartbeat stream to the active controller and revokes the
active one's lease when that stream breaks and stays broken (standby_watch.py); from winning the
election until standing down it holds the standbys' streams in turn.

While active it also holds each broker's BrokerHeartbeat stream; a stream that ends and is
not reopened by the same broker incarnation within the grace period gets that incarnation's
lease revoked (`BrokerConnectionWatch`, decided by liveness.py), so a crashed broker is
handled within the grace period rather than a lease TTL.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

import grpc
from google.protobuf.message import DecodeError  # type: ignore[import-untyped]

from clients.common.errors import HighwaterError
from coordinator.acls import SecurityChange, acl_change, commit_security_changes, load_security
from coordinator.election import ControllerElection, ControllerFenced, current_controller
from coordinator.etcd_status import poll_status
from coordinator.registration import revoke_broker_incarnation
from coordinator.store import CoordinatorError, EtcdStatus, EtcdStore
from protos.highwater.v1 import common_pb2, controller_pb2, controller_pb2_grpc
from services.common import limits
from services.common.request_checks import init_producer_id_problem
from services.common.server import ServiceProcess
from services.common.service_config import ServiceConfig
from services.controller import deletion, handlers, metrics, reassignment, results, security_admin, wire
from services.controller.candidacy import Candidacy
from services.controller.context import ControllerContext
from services.controller.event_loop import ControllerEventLoop, ControllerResigned
from services.controller.liveness import BrokerConnections

log = logging.getLogger("highwater.controller")

R = TypeVar("R")
# How long an admin call waits for the control RPCs its change caused (so a
# created topic is usable when CreateTopics returns).


@dataclass(frozen=True)
class ControllerConfig(ServiceConfig):
    controller_id: int
    delete_topic_enable: bool = True
    auto_leader_rebalance_enable: bool = True
    leader_imbalance_check_interval_s: float = 300.0
    leader_imbalance_per_broker_percentage: int = 10
    broker_connection_grace_ms: int = limits.BROKER_CONNECTION_GRACE_MS
    controller_connection_grace_ms: int = limits.CONTROLLER_CONNECTION_GRACE_MS

    def check(self) -> None:
        limits.check_connection_grace(grace_ms=self.broker_connection_grace_ms, lease_ttl_s=self.lease_ttl_s)
        limits.check_connection_grace(
            grace_ms=self.controller_connection_grace_ms, lease_ttl_s=self.lease_ttl_s, of="controller"
        )


Req = TypeVar("Req")
ServicerMethod = Callable[["ControllerServicer", Req, grpc.aio.ServicerContext], Awaitable[R]]


def _event_loop_rpc(
    name: str,
    response_cls: Callable[..., R],
    handle: Callable[[ControllerContext, Req], results.ControllerResult],
    *,
    wait_rpcs: bool = False,
) -> ServicerMethod[Req, R]:
    """A ControllerService method decided by `handle` on the event loop (`ControllerServicer._run`).

    grpc finds the method by its name on the servicer: `name`.
    """

    async def method(self: ControllerServicer, request: Req, context: grpc.aio.ServicerContext) -> R:
        return await self._run(name, response_cls, lambda lp: handle(lp.ctx, request), wait_rpcs=wait_rpcs)

    method.__name__ = method.__qualname__ = name
    return method


def _security_rpc(
    name: str,
    response_cls: Callable[..., R],
    decide: Callable[[security_admin.SecurityState, Req], security_admin.Decision],
) -> ServicerMethod[Req, R]:
    """A security admin method decided by `decide` (`ControllerServicer._security`), named `name`."""

    async def method(self: ControllerServicer, request: Req, context: grpc.aio.ServicerContext) -> R:
        return await self._security(name, response_cls, lambda state: decide(state, request))

    method.__name__ = method.__qualname__ = name
    return method


def _monotonic_ms() -> int:
    return int(time.monotonic() * 1000)


class BrokerConnectionWatch:
    """The asyncio side of liveness.BrokerConnections for one active period of this controller.

    Streams report opening and closing; a task sleeps until the next grace period ends and
    revokes the lease of every incarnation still disconnected then, if etcd still names that
    incarnation (coordinator/registration.py). The registration watch then sees the key go and
    the event loop handles a broker failure as for an expired lease: one failure path.
    """

    def __init__(self, store: EtcdStore, grace_ms: int, clock_ms: Callable[[], int] = _monotonic_ms) -> None:
        self.store = store
        self.grace_ms = grace_ms
        self.connections = BrokerConnections(grace_ms)
        self._clock_ms = clock_ms
        self._wake = asyncio.Event()
        # Set when this controller stops acting: every stream it holds ends, so each broker
        # finds the controller that acts now.
        self.stopped = asyncio.Event()
        self._task = asyncio.create_task(self._run(), name="broker-connection-watch")

    def opened(self, broker_id: int, broker_epoch: int) -> None:
        self.connections.opened(broker_id, broker_epoch)
        metrics.BROKER_CONNECTIONS.set(self.connections.connected_count())

    def closed(self, broker_id: int, broker_epoch: int) -> None:
        if self.stopped.is_set():
            return  # this controller no longer acts: streams end because it stood down
        self.connections.closed(broker_id, broker_epoch, self._clock_ms())
        metrics.BROKER_CONNECTIONS.set(self.connections.connected_count())
        self._wake.set()

    def stop(self) -> None:
        """Stop acting at once (this controller is no longer active): nothing more is revoked."""
        self.stopped.set()
        self._task.cancel()
        metrics.BROKER_CONNECTIONS.set(0)

    async def _run(self) -> None:
        while True:
            self._wake.clear()
            deadline_ms = self.connections.next_deadline_ms()
            now_ms = self._clock_ms()
            if deadline_ms is None or deadline_ms > now_ms:
                timeout_s = None if deadline_ms is None else (deadline_ms - now_ms) / 1000
                try:
                    await asyncio.wait_for(self._wake.wait(), timeout_s)
                except TimeoutError:
                    pass
                continue
            for broker_id, broker_epoch in self.connections.due(now_ms):
                await self._revoke(broker_id, broker_epoch)

    async def _revoke(self, broker_id: int, broker_epoch: int) -> None:
        try:
            revoked = await revoke_broker_incarnation(self.store, broker_id, broker_epoch)
        except CoordinatorError as exc:
            # etcd unreachable: the broker's lease expires on its own if it is really gone.
            log.warning("could not revoke broker %d's lease after its connection closed: %s", broker_id, exc)
            return
        if revoked:
            metrics.BROKER_CONNECTION_REVOCATIONS.inc()
            log.warning(
                "broker %d's connection closed and was not reopened within %d ms (broker epoch %d): "
                "revoking its lease; handled as a broker failure",
                broker_id,
                self.grace_ms,
                broker_epoch,
            )


async def _drain(
    requests: AsyncIterator[controller_pb2.BrokerHeartbeatRequest | controller_pb2.StandbyHeartbeatRequest],
) -> None:
    """Read a stream's requests until the broker's side ends (closed, cancelled or reset).

    Whatever ends the reading ends the stream as a close would: bytes that are not a request,
    or a later message the security interceptor refuses (it aborts the call, and the read
    raises). Nothing is raised: the task is cancelled, never awaited, once the stream ends,
    and an exception left in it would be logged as never retrieved.
    """
    try:
        async for _ in requests:
            pass
    except DecodeError:
        pass  # bytes that are not a request: the stream ends as if closed
    except Exception as exc:
        log.debug("liveness stream ended by its reader: %r", exc)


Q = TypeVar("Q")


async def _first_request(
    name: str, requests: AsyncIterator[Q], context: grpc.aio.ServicerContext
) -> Q | None:
    """A liveness stream's first request (None: the caller ended the stream before sending one);
    bytes that do not parse abort the call with INVALID_ARGUMENT."""
    try:
        return await anext(aiter(requests), None)
    except DecodeError as exc:
        # gRPC parses streamed requests itself (request_guard.py covers unary ones only).
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"{name}: the request does not parse: {exc}")
        raise  # abort raises; never reached


class ControllerServicer(controller_pb2_grpc.ControllerServiceServicer):
    def __init__(self, store: EtcdStore) -> None:
        self.store = store
        self.active: ControllerEventLoop | None = None
        # Set while active: the brokers' liveness streams of this active period.
        self.connection_watch: BrokerConnectionWatch | None = None
        self.host = ""
        self.port = 0
        # Set from winning the election until standing down (before activation too: a controller
        # loading its metadata is alive): standbys' StandbyHeartbeat streams are held meanwhile.
        self.term_epoch: int | None = None
        self._term_ended = asyncio.Event()
        # Security admin calls read, decide and write one at a time, so two of them never
        # decide on the same snapshot (an ACL counted as created twice, a limit passed).
        self._security_lock = asyncio.Lock()
        # etcd's size as last read (etcd_status.poll_status), for DescribeCluster.
        self.etcd_status: EtcdStatus | None = None

    def on_etcd_status(self, status: EtcdStatus) -> None:
        self.etcd_status = status
        metrics.ETCD_DB_SIZE_BYTES.set(status.db_size_bytes)
        metrics.ETCD_DB_SIZE_IN_USE_BYTES.set(status.db_size_in_use_bytes)
        metrics.ETCD_QUOTA_BYTES.set(status.quota_bytes)
        metrics.ETCD_NOSPACE_ALARM.set(1 if status.nospace_alarm else 0)
        metrics.ETCD_REVISION.set(status.revision)

    async def _not_controller(self, response_cls: Callable[..., R]) -> R:
        info = await current_controller(self.store)
        active = common_pb2.NotControllerInfo(controller_id=-1)
        message = "no controller is active yet; retry shortly"
        if info:
            active = common_pb2.NotControllerInfo(
                controller_id=int(info["controller_id"]), host=str(info["host"]), port=int(info["port"])
            )
            message = (
                f"this is a standby controller; the active one is {active.controller_id} at "
                f"{active.host}:{active.port}"
            )
        return response_cls(
            error_code=common_pb2.NOT_CONTROLLER,
            error_message=message,
            active_controller=active,
        )

    def activate(self, loop: ControllerEventLoop, broker_connection_grace_ms: int) -> None:
        """This controller is active with `loop`: answer RPCs and hold the brokers' streams."""
        self.connection_watch = BrokerConnectionWatch(self.store, broker_connection_grace_ms)
        self.active = loop

    def begin_term(self, epoch: int) -> None:
        """Won the election at epoch: hold the standbys' streams from now on."""
        self.term_epoch = epoch
        self._term_ended = asyncio.Event()

    def stand_by(self) -> None:
        """Stop acting: answer NOT_CONTROLLER, end every stream held and revoke nothing more."""
        self.term_epoch = None
        self._term_ended.set()
        self.active = None
        if self.connection_watch is not None:
            self.connection_watch.stop()
            self.connection_watch = None

    async def BrokerHeartbeat(
        self,
        request_iterator: AsyncIterator[controller_pb2.BrokerHeartbeatRequest],
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[controller_pb2.BrokerHeartbeatResponse]:
        """A broker's liveness stream: accepted while active and held open until either side ends it.

        The first request names the incarnation; the stream is "connected" until it ends (the
        broker closed it, cancelled it, or its connection was reset) or this controller stops
        acting (the broker then finds the new one). Its end starts the grace period.
        """
        first = await _first_request("BrokerHeartbeat", request_iterator, context)
        if first is None:
            return
        loop, watch = self.active, self.connection_watch
        if loop is None or watch is None:
            yield await self._not_controller(controller_pb2.BrokerHeartbeatResponse)
            return
        watch.opened(first.broker_id, first.broker_epoch)
        drained = asyncio.ensure_future(_drain(request_iterator))
        stopped = asyncio.ensure_future(watch.stopped.wait())
        try:
            yield controller_pb2.BrokerHeartbeatResponse(controller_epoch=loop.epoch)
            await asyncio.wait([drained, stopped], return_when=asyncio.FIRST_COMPLETED)
        finally:
            drained.cancel()
            stopped.cancel()
            watch.closed(first.broker_id, first.broker_epoch)

    async def StandbyHeartbeat(
        self,
        request_iterator: AsyncIterator[controller_pb2.StandbyHeartbeatRequest],
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[controller_pb2.StandbyHeartbeatResponse]:
        """A standby controller's liveness stream (standby_watch.py): accepted from the election won
        until this controller stands down, which ends it; the standby alone decides what its end means."""
        first = await _first_request("StandbyHeartbeat", request_iterator, context)
        if first is None:
            return
        epoch, term_ended = self.term_epoch, self._term_ended
        if epoch is None:
            yield await self._not_controller(controller_pb2.StandbyHeartbeatResponse)
            return
        drained = asyncio.ensure_future(_drain(request_iterator))
        ended = asyncio.ensure_future(term_ended.wait())
        try:
            yield controller_pb2.StandbyHeartbeatResponse(controller_epoch=epoch)
            await asyncio.wait([drained, ended], return_when=asyncio.FIRST_COMPLETED)
        finally:
            drained.cancel()
            ended.cancel()

    async def _run(
        self,
        name: str,
        response_cls: Callable[..., R],
        decide: Callable[[ControllerEventLoop], results.ControllerResult],
        *,
        wait_rpcs: bool = False,
    ) -> R:
        with metrics.REQUEST_LATENCY.labels(name).time():
            return await self._run_timed(name, response_cls, decide, wait_rpcs=wait_rpcs)

    async def _run_timed(
        self,
        name: str,
        response_cls: Callable[..., R],
        decide: Callable[[ControllerEventLoop], results.ControllerResult],
        *,
        wait_rpcs: bool,
    ) -> R:
        loop = self.active
        if loop is None:
            return await self._not_controller(response_cls)
        try:
            result = await loop.submit(name, lambda: decide(loop))
        except ControllerResigned:
            return await self._not_controller(response_cls)
        except HighwaterError as exc:
            return response_cls(error_code=exc.code, error_message=exc.message)
        if wait_rpcs and result.rpc_futures:
            await asyncio.wait(result.rpc_futures, timeout=limits.ADMIN_PROPAGATION_WAIT_S)
        response: R = result.response  # the handler's answer, a response_cls message
        return response

    CreateTopics = _event_loop_rpc(
        "CreateTopics", common_pb2.CreateTopicsResponse, handlers.on_create_topics, wait_rpcs=True
    )

    async def DeleteTopics(
        self, request: common_pb2.DeleteTopicsRequest, context: grpc.aio.ServicerContext
    ) -> common_pb2.DeleteTopicsResponse:
        """Start the deletion and wait (bounded) until every replica confirmed it, as Kafka's DeleteTopics."""
        response = await self._run(
            "DeleteTopics",
            common_pb2.DeleteTopicsResponse,
            lambda lp: deletion.on_delete_topics(
                lp.ctx, list(request.names), deletion_enabled=lp.delete_topic_enable
            ),
            wait_rpcs=True,
        )
        loop = self.active
        wait_s = (request.timeout_ms or 30_000) / 1000
        deadline = asyncio.get_running_loop().time() + wait_s
        for answer in response.topics:
            if answer.error_code != common_pb2.NONE or loop is None:
                continue
            while answer.name in loop.ctx.topics and asyncio.get_running_loop().time() < deadline:
                await asyncio.sleep(0.02)
            if answer.name in loop.ctx.topics:
                answer.error_code = common_pb2.REQUEST_TIMED_OUT
                answer.error_message = (
                    f"deletion of {answer.name!r} started but not every replica confirmed "
                    f"within {wait_s:.0f} s (a broker is down?); it completes when they do"
                )
        return response

    CreatePartitions = _event_loop_rpc(
        "CreatePartitions", common_pb2.CreatePartitionsResponse, handlers.on_create_partitions, wait_rpcs=True
    )

    ElectLeaders = _event_loop_rpc(
        "ElectLeaders", common_pb2.ElectLeadersResponse, handlers.on_elect_leaders, wait_rpcs=True
    )

    AlterTopicConfigs = _event_loop_rpc(
        "AlterTopicConfigs",
        common_pb2.AlterTopicConfigsResponse,
        handlers.on_alter_topic_configs,
        wait_rpcs=True,
    )

    AlterPartition = _event_loop_rpc(
        "AlterPartition", controller_pb2.AlterPartitionResponse, handlers.on_alter_partition
    )

    async def ControlledShutdown(
        self, request: controller_pb2.ControlledShutdownRequest, context: grpc.aio.ServicerContext
    ) -> controller_pb2.ControlledShutdownResponse:
        return await self._run(
            "ControlledShutdown",
            controller_pb2.ControlledShutdownResponse,
            lambda lp: handlers.on_controlled_shutdown(lp.ctx, request.broker_id, request.broker_epoch),
            wait_rpcs=True,
        )

    AlterPartitionReassignments = _event_loop_rpc(
        "AlterPartitionReassignments",
        common_pb2.AlterPartitionReassignmentsResponse,
        reassignment.on_alter_reassignments,
        wait_rpcs=True,
    )

    async def ListPartitionReassignments(
        self, request: common_pb2.ListPartitionReassignmentsRequest, context: grpc.aio.ServicerContext
    ) -> common_pb2.ListPartitionReassignmentsResponse:
        loop = self.active
        if loop is None:
            return await self._not_controller(common_pb2.ListPartitionReassignmentsResponse)
        return reassignment.list_reassignments(loop.ctx, request)

    async def DescribeCluster(
        self, request: common_pb2.DescribeClusterRequest, context: grpc.aio.ServicerContext
    ) -> common_pb2.DescribeClusterResponse:
        loop = self.active
        if loop is None:
            return await self._not_controller(common_pb2.DescribeClusterResponse)
        ctx = loop.ctx
        rest = common_pb2.DescribeClusterResponse(
            cluster_id=loop.cluster_id,
            controller_host=self.host,
            controller_port=self.port,
            controller_id=ctx.controller_id,
            controller_epoch=ctx.epoch,
            brokers=[b.to_proto() for b in sorted(ctx.live_brokers.values(), key=lambda b: b.broker_id)],
            gateways=[
                common_pb2.GatewayNode(gateway_id=g.gateway_id, host=g.host, port=g.port)
                for g in ctx.live_gateways.values()
            ],
            topic_configs={t: loop.config_proto(t) for t in ctx.topics},
        )
        if self.etcd_status is not None:
            rest.etcd_space.CopyFrom(
                common_pb2.EtcdSpace(
                    db_size_bytes=self.etcd_status.db_size_bytes,
                    db_size_in_use_bytes=self.etcd_status.db_size_in_use_bytes,
                    quota_bytes=self.etcd_status.quota_bytes,
                    nospace_alarm=self.etcd_status.nospace_alarm,
                )
            )
        # The partitions from their kept encodings (wire.py): 0.24 s composed at 100,000.
        return wire.describe_cluster(rest, loop.partition_wires())

    # ---- security admin: ACLs and tokens (authorized by the interceptor's rules) ---------------

    async def _security(
        self,
        name: str,
        response_cls: Callable[..., R],
        decide: Callable[[security_admin.SecurityState], security_admin.Decision],
    ) -> R:
        with metrics.REQUEST_LATENCY.labels(name).time():
            loop = self.active
            if loop is None:
                return await self._not_controller(response_cls)
            async with self._security_lock:
                try:
                    snapshot = await load_security(self.store)
                    decision = decide(
                        security_admin.SecurityState.from_records(snapshot.acls.values(), snapshot.tokens)
                    )
                    if decision.writes:
                        await commit_security_changes(
                            self.store, loop.epoch, [_security_change(w) for w in decision.writes]
                        )
                except ControllerFenced:
                    loop.resigned.set()  # a newer controller exists: stop acting
                    return await self._not_controller(response_cls)
                except CoordinatorError as exc:
                    return response_cls(
                        error_code=common_pb2.REQUEST_TIMED_OUT,
                        error_message=f"{name}: etcd did not take the change ({exc}); retry",
                    )
            response: R = decision.response
            return response

    CreateAcls = _security_rpc("CreateAcls", controller_pb2.CreateAclsResponse, security_admin.create_acls)

    DeleteAcls = _security_rpc("DeleteAcls", controller_pb2.DeleteAclsResponse, security_admin.delete_acls)

    DescribeAcls = _security_rpc(
        "DescribeAcls", controller_pb2.DescribeAclsResponse, security_admin.describe_acls
    )

    async def CreateToken(
        self, request: controller_pb2.CreateTokenRequest, context: grpc.aio.ServicerContext
    ) -> controller_pb2.CreateTokenResponse:
        now_ms = int(time.time() * 1000)  # wall clock: expiry is checked against every service's wall clock
        return await self._security(
            "CreateToken",
            controller_pb2.CreateTokenResponse,
            lambda state: security_admin.create_token(state, request, now_ms=now_ms),
        )

    RevokeToken = _security_rpc(
        "RevokeToken", controller_pb2.RevokeTokenResponse, security_admin.revoke_token
    )

    ListTokens = _security_rpc("ListTokens", controller_pb2.ListTokensResponse, security_admin.list_tokens)

    async def InitProducerId(
        self, request: common_pb2.InitProducerIdRequest, context: grpc.aio.ServicerContext
    ) -> common_pb2.InitProducerIdResponse:
        loop = self.active
        if loop is None:
            return await self._not_controller(common_pb2.InitProducerIdResponse)
        problem = init_producer_id_problem(request)
        if problem is not None:
            return common_pb2.InitProducerIdResponse(
                error_code=common_pb2.INVALID_REQUEST, error_message=problem
            )
        if request.producer_id >= 0 and request.producer_epoch < limits.PRODUCER_EPOCH_MAX:
            # A known producer bumps its epoch (fencing its older incarnation); one whose epoch is
            # exhausted gets a new producer id below, as Kafka's KIP-360 does.
            return common_pb2.InitProducerIdResponse(
                producer_id=request.producer_id, producer_epoch=max(request.producer_epoch, 0) + 1
            )
        try:
            producer_id = await loop.next_producer_id()
        except ControllerFenced:
            loop.resigned.set()  # a newer controller exists: stop acting
            return await self._not_controller(common_pb2.InitProducerIdResponse)
        return common_pb2.InitProducerIdResponse(producer_id=producer_id, producer_epoch=0)


def _security_change(write: security_admin.SecurityWrite) -> SecurityChange:
    if isinstance(write, security_admin.AclWrite):
        return acl_change(write.binding, delete=write.delete)
    return SecurityChange("token", write.token_id, write.record)


async def serve(config: ControllerConfig) -> None:
    config.check()
    process = await ServiceProcess.start(
        config,
        name=f"controller-{config.controller_id}",
        service_name=controller_pb2.DESCRIPTOR.services_by_name["ControllerService"].full_name,
        log=log,
    )
    store, peers, runtime = process.store, process.peers, process.runtime
    servicer = ControllerServicer(store)
    # Generated by grpcio-tools without annotations (pyproject.toml: protos.* is not checked).
    controller_pb2_grpc.add_ControllerServiceServicer_to_server(servicer, runtime.server)  # type: ignore[no-untyped-call]
    await runtime.start()
    servicer.host, servicer.port = config.host, runtime.bound_port
    election = ControllerElection(
        store,
        config.controller_id,
        {"host": config.host, "port": runtime.bound_port},
        ttl_s=config.lease_ttl_s,
    )
    await runtime.mark_ready(controller_id=config.controller_id)

    candidacy = Candidacy(config, store, peers, servicer, election)
    actor = asyncio.create_task(candidacy.run(), name="controller-campaign")
    etcd_status = asyncio.create_task(poll_status(store, servicer.on_etcd_status), name="etcd-status")

    async def on_stop() -> None:
        # Hand over first: stop acting, then revoke the lease so a standby takes over at once
        # (not a lease TTL later); the campaign task is cancelled after, and must not win
        # the election back in between.
        await candidacy.hand_over()
        actor.cancel()
        etcd_status.cancel()
        for task in (actor, etcd_status):
            try:
                await task
            except (asyncio.CancelledError, Exception):
                pass
        await process.close()

    await runtime.run_until_stopped(on_stop)
