"""The broker process: gRPC servicer around the ReplicaManager, etcd registration.

Start-up order matters: the data directory is checked first (a missing or
unwritable one stops the broker with a clear message), then etcd is reached,
then the gRPC server binds, and only then does the broker register under its
lease, because registration is what tells the controller to send it
LeaderAndIsr. A lost lease (a pause past the TTL) re-registers with a new
broker epoch, so requests meant for the old incarnation are fenced
(services/broker/registration_life.py drives coordinator/broker_life.py's rules).
"""

from __future__ import annotations

import asyncio
import logging
import os
import resource
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
from google.protobuf.message import DecodeError  # type: ignore[import-untyped]

from coordinator.election import current_controller
from coordinator.limits import LEASE_KEEPALIVES_PER_TTL
from coordinator.registration import Registration
from coordinator.store import CoordinatorError, EtcdStore, MetadataStore
from protos.highwater.v1 import broker_pb2, broker_pb2_grpc, common_pb2
from services.broker import metrics
from services.broker.heartbeat import ControllerHeartbeat
from services.broker.log_cleaner import CleanerConfig
from services.broker.log_dirs import describe_log_dirs
from services.broker.purgatory import produce_response
from services.broker.registration_life import BrokerRegistrationLife
from services.broker.replica_manager import ReplicaManager, SystemClock
from services.common import limits
from services.common.peers import PeerChannels
from services.common.server import ServiceProcess
from services.common.service_config import ServiceConfig
from services.common.stream_ends import STREAM_ENDS
from services.kafka.acl_rules import ConnectionAccess
from services.kafka.backend import BrokerKafkaBackend
from services.kafka.fetch_sessions import broker_cache
from services.kafka.handler import KafkaAccess, KafkaHandler
from services.kafka.listener import KafkaListener, reserve_port
from services.kafka.listener_limits import KafkaListenerLimits
from services.security.identity import Caller
from services.transactions import coordinator as rules
from services.transactions.coordinator import TxnError
from services.transactions.produce_check import split_refused_produce, transactional_batches
from services.transactions.produce_verifier import ProduceVerifier

log = logging.getLogger("highwater.broker")

STREAMS_ENDED = "the broker is stopping: stream ended"


@dataclass(frozen=True)
class BrokerConfig(ServiceConfig):
    broker_id: int
    data_dir: Path
    rack: str = ""
    replica_lag_time_max_ms: int = limits.REPLICA_LAG_TIME_MAX_MS
    # The newest bytes of each log file left in the page cache (limits.LOG_CACHE_WINDOW_BYTES_DEFAULT);
    # limits.LOG_CACHE_WINDOW_OFF: the kernel's to manage.
    log_cache_window_bytes: int = limits.LOG_CACHE_WINDOW_BYTES_DEFAULT
    # The replicas this broker prepares for (open files) and registers, so the controller places
    # no more on it (limits.REPLICAS_PER_BROKER_MAX unless raised).
    replicas_max: int = limits.REPLICAS_PER_BROKER_MAX
    # The most one consumer Fetch answer carries, gRPC or Kafka (Kafka's fetch.max.bytes;
    # limits.FETCH_RESPONSE_MAX_BYTES_DEFAULT).
    fetch_max_bytes: int = limits.FETCH_RESPONSE_MAX_BYTES_DEFAULT
    # Kafka's wire protocol on its own port (docs/KAFKA.md); None: no Kafka listener, 0: any free port.
    kafka_port: int | None = None
    # Its per-client bounds (--kafka-connections-per-ip-max, --kafka-request-body-timeout-ms, ...).
    kafka_limits: KafkaListenerLimits = field(default_factory=KafkaListenerLimits)
    # The log cleaner of compacted topics (--log-cleaner-*, Kafka's log.cleaner.* settings).
    cleaner: CleanerConfig = field(default_factory=CleanerConfig)

    def check(self) -> None:
        limits.check_relations(
            lease_ttl_s=self.lease_ttl_s,
            keepalive_interval_s=self.lease_ttl_s / LEASE_KEEPALIVES_PER_TTL,
            replica_lag_time_max_ms=self.replica_lag_time_max_ms,
            replica_fetch_wait_max_ms=limits.REPLICA_FETCH_WAIT_MAX_MS,
        )
        if self.broker_id < 0:
            raise SystemExit(f"--broker-id must be >= 0, got {self.broker_id}")
        if (
            self.log_cache_window_bytes != limits.LOG_CACHE_WINDOW_OFF
            and self.log_cache_window_bytes < limits.LOG_CACHE_WINDOW_BYTES_MIN
        ):
            raise SystemExit(
                f"--log-cache-window-bytes must be at least {limits.LOG_CACHE_WINDOW_BYTES_MIN} "
                f"(1 MiB), or {limits.LOG_CACHE_WINDOW_OFF} to leave the page cache to the kernel; "
                f"got {self.log_cache_window_bytes}"
            )
        if self.kafka_port is not None and self.security.acl and not self.security.tls:
            # ACLs need a principal; a plaintext Kafka port has none to check (no SASL here).
            raise SystemExit(
                "--kafka-port with --authorizer acl needs --tls-dir: the Kafka protocol listener "
                "authenticates clients by certificate only (mutual TLS; no SASL), so without TLS "
                "it has no principal to check ACLs for (docs/KAFKA.md, Security)"
            )
        if self.kafka_port is not None and self.security.quotas:
            # Byte-rate quotas are charged by the gRPC interceptor only: the Kafka port would escape them.
            raise SystemExit(
                "--kafka-port cannot be used with --producer-byte-rate/--consumer-byte-rate: the "
                "Kafka protocol listener does not charge quotas yet (docs/KAFKA.md, Security)"
            )
        if (
            not limits.FETCH_RESPONSE_MAX_BYTES_MIN
            <= self.fetch_max_bytes
            <= limits.FETCH_RESPONSE_MAX_BYTES_CEILING
        ):
            raise SystemExit(
                f"--fetch-max-bytes must be within {limits.FETCH_RESPONSE_MAX_BYTES_MIN}.."
                f"{limits.FETCH_RESPONSE_MAX_BYTES_CEILING} (a Fetch answer is one gRPC message of at most "
                f"{limits.GRPC_MAX_MESSAGE_BYTES} bytes), got {self.fetch_max_bytes}"
            )
        kafka_problem = self.kafka_limits.problem(
            self.security.max_request_bytes or limits.KAFKA_REQUEST_BYTES_MAX
        )
        if self.kafka_port is not None and kafka_problem is not None:
            raise SystemExit(kafka_problem)
        cleaner_problem = self.cleaner.problem()
        if cleaner_problem is not None:
            raise SystemExit(cleaner_problem)
        if not 1 <= self.replicas_max <= limits.REPLICAS_PER_BROKER_MAX_CEILING:
            raise SystemExit(
                f"--replicas-max must be within 1..{limits.REPLICAS_PER_BROKER_MAX_CEILING}, "
                f"got {self.replicas_max}"
            )


def prepare_data_dir(path: Path) -> None:
    """Create the data directory, or stop with a clear message (never lose data silently)."""
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / ".write-probe"
        probe.write_bytes(b"ok")
        probe.unlink()
    except OSError as exc:
        raise SystemExit(
            f"STORAGE_ERROR: data directory {path} is not usable ({exc.strerror}); "
            "fix its permissions or pass another --data-dir"
        ) from exc


class BrokerServicer(broker_pb2_grpc.BrokerServiceServicer):
    """Translation only: protobuf in, ReplicaManager call, protobuf out."""

    def __init__(self, replicas: ReplicaManager, store: MetadataStore) -> None:
        self.replicas = replicas
        # The KIP-890 check of a transactional Produce, over the coordinator's state in etcd.
        self._transactions = ProduceVerifier(store)
        # The tasks of the open FetchStream and ProduceStream calls (end_streams ends them).
        self._streams: set[asyncio.Task[Any]] = set()
        self._closing = False

    async def LeaderAndIsr(
        self, request: broker_pb2.LeaderAndIsrRequest, context: grpc.aio.ServicerContext
    ) -> broker_pb2.LeaderAndIsrResponse:
        with metrics.REQUEST_LATENCY.labels("LeaderAndIsr").time():
            return await self.replicas.leader_and_isr(request)

    async def UpdateMetadata(
        self, request: broker_pb2.UpdateMetadataRequest, context: grpc.aio.ServicerContext
    ) -> broker_pb2.UpdateMetadataResponse:
        with metrics.REQUEST_LATENCY.labels("UpdateMetadata").time():
            return await self.replicas.update_metadata(request)

    async def StopReplica(
        self, request: broker_pb2.StopReplicaRequest, context: grpc.aio.ServicerContext
    ) -> broker_pb2.StopReplicaResponse:
        with metrics.REQUEST_LATENCY.labels("StopReplica").time():
            return await self.replicas.stop_replica(request)

    async def Produce(
        self, request: common_pb2.ProduceRequest, context: grpc.aio.ServicerContext
    ) -> common_pb2.ProduceResponse:
        if request.acks not in (0, 1, -1):
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT, f"acks must be 0, 1 or -1 (all), got {request.acks}"
            )
        with metrics.REQUEST_LATENCY.labels("Produce").time():
            if request.transactional_id:
                return await self._transactional_produce(request)
            return await self.replicas.produce(request)

    async def _transactional_produce(self, request: common_pb2.ProduceRequest) -> common_pb2.ProduceResponse:
        """A transactional producer's Produce (docs/CLIENTS.md, Transactions): its batches are
        appended only to partitions in its ongoing transaction (produce_check.py); the others
        are answered with the check's error, as the Kafka listener answers them."""
        try:
            refused = await asyncio.wait_for(
                self._transactions.refusals(
                    request.transactional_id, request, self.replicas.core.open_transaction_epoch
                ),
                limits.KAFKA_BACKEND_CALL_TIMEOUT_S,
            )
        except (CoordinatorError, TimeoutError) as exc:
            log.warning(
                "transactional Produce of %r: etcd could not be read (%s)", request.transactional_id, exc
            )
            refused = {
                tp: TxnError.COORDINATOR_NOT_AVAILABLE
                for tps in transactional_batches(request).values()
                for tp in tps
            }
        if rules.transactional_id_problem(request.transactional_id) is not None:
            every = [(t.topic, p.partition) for t in request.topics for p in t.partitions]
            refused = dict.fromkeys(every, TxnError.INVALID_REQUEST)
        if not refused:
            return await self.replicas.produce(request, transactional=True)
        kept, answers = split_refused_produce(request, refused)
        if kept.topics:
            written = await self.replicas.produce(kept, transactional=True)
            answers.update(((t.topic, p.partition), p) for t in written.topics for p in t.partitions)
        return produce_response(answers)

    async def Fetch(
        self, request: common_pb2.FetchRequest, context: grpc.aio.ServicerContext
    ) -> common_pb2.FetchResponse:
        with metrics.REQUEST_LATENCY.labels("Fetch").time():
            return await self.replicas.fetch(request)

    async def FetchStream(
        self, request_iterator: AsyncIterator[common_pb2.FetchRequest], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[common_pb2.FetchResponse]:
        """Fetch over one stream (a follower's replica fetcher, a consumer reading from this
        leader): each request answered in order, exactly as the unary Fetch answers it, under the
        same metrics label. The client sends the next request only after this answer; with
        security on, the interceptor has admitted each one as a unary Fetch
        (services/security/rules.py, UNARY_OVER_STREAM)."""
        async for response in self._unary_over_stream("FetchStream", self.Fetch, request_iterator, context):
            yield response

    async def ProduceStream(
        self, request_iterator: AsyncIterator[common_pb2.ProduceRequest], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[common_pb2.ProduceResponse]:
        """Produce over one stream (a producer writing to this leader): as FetchStream, each
        request answered in order exactly as the unary Produce answers it."""
        answers = self._unary_over_stream("ProduceStream", self.Produce, request_iterator, context)
        async for response in answers:
            yield response

    async def _unary_over_stream(
        self,
        name: str,
        unary: Callable[[Any, grpc.aio.ServicerContext], Awaitable[Any]],
        request_iterator: AsyncIterator[Any],
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[Any]:
        """Each request of the stream answered by `unary`, one at a time, in order."""
        if self._closing:
            await context.abort(grpc.StatusCode.UNAVAILABLE, STREAMS_ENDED)
        task = asyncio.current_task()  # the RPC's own task (grpc.aio runs each call in one)
        if task is not None:
            self._streams.add(task)
        requests = aiter(request_iterator)
        try:
            while True:
                try:
                    request = await STREAM_ENDS.next_message(requests, context)
                except StopAsyncIteration:
                    return
                except DecodeError as exc:
                    # Without the security interceptor gRPC parses streamed requests itself
                    # (request_guard.py covers unary ones only): answer as a malformed unary call is.
                    await context.abort(
                        grpc.StatusCode.INVALID_ARGUMENT, f"{name}: the request does not parse: {exc}"
                    )
                    raise  # abort raises; never reached
                yield await unary(request, context)
        finally:
            if task is not None:
                self._streams.discard(task)

    def end_streams(self) -> None:
        """End every open FetchStream and ProduceStream with UNAVAILABLE, once the broker's close
        has answered its waiting requests: unlike a unary call, a stream outlives its answers, and
        the followers' and clients' streams would hold the server's stop for its whole grace period
        (5 s). Each ends where it waits for its caller's next request
        (services/common/stream_ends.py); new ones are refused."""
        self._closing = True
        STREAM_ENDS.end(list(self._streams), STREAMS_ENDED)

    async def ListOffsets(
        self, request: common_pb2.ListOffsetsRequest, context: grpc.aio.ServicerContext
    ) -> common_pb2.ListOffsetsResponse:
        with metrics.REQUEST_LATENCY.labels("ListOffsets").time():
            return self.replicas.list_offsets(request)

    async def DeleteRecords(
        self, request: common_pb2.DeleteRecordsRequest, context: grpc.aio.ServicerContext
    ) -> common_pb2.DeleteRecordsResponse:
        with metrics.REQUEST_LATENCY.labels("DeleteRecords").time():
            return await self.replicas.delete_records(request)

    async def DescribeLogDirs(
        self, request: common_pb2.DescribeLogDirsRequest, context: grpc.aio.ServicerContext
    ) -> common_pb2.DescribeLogDirsResponse:
        with metrics.REQUEST_LATENCY.labels("DescribeLogDirs").time():
            core, cleaner = self.replicas.core, self.replicas.cleaner
            return describe_log_dirs(
                request,
                broker_id=core.broker_id,
                partitions=core.partitions,
                topics=core.metadata.topics(),
                cleaner_view=(lambda tp, log: None) if cleaner is None else cleaner.view,
                now_ms=core.clock.wall_ms(),
            )

    async def OffsetsForLeaderEpoch(
        self, request: broker_pb2.OffsetsForLeaderEpochRequest, context: grpc.aio.ServicerContext
    ) -> broker_pb2.OffsetsForLeaderEpochResponse:
        with metrics.REQUEST_LATENCY.labels("OffsetsForLeaderEpoch").time():
            return self.replicas.offsets_for_leader_epoch(request)

    async def Metadata(
        self, request: common_pb2.MetadataRequest, context: grpc.aio.ServicerContext
    ) -> common_pb2.MetadataResponse:
        with metrics.REQUEST_LATENCY.labels("Metadata").time():
            return self.replicas.metadata.metadata_response(list(request.topics))

    async def WriteTxnMarkers(
        self, request: broker_pb2.WriteTxnMarkersRequest, context: grpc.aio.ServicerContext
    ) -> broker_pb2.WriteTxnMarkersResponse:
        with metrics.REQUEST_LATENCY.labels("WriteTxnMarkers").time():
            return await self.replicas.write_txn_markers(request)


class ControllerClient:
    """Finds the active controller in etcd and calls it (AlterPartition, ControlledShutdown)."""

    def __init__(self, store: EtcdStore, peers: PeerChannels) -> None:
        self.store = store
        self.peers = peers

    async def _address(self) -> str:
        info = await current_controller(self.store)
        if not info:
            raise ConnectionError("no active controller registered in etcd")
        return f"{info['host']}:{info['port']}"

    async def call(self, rpc: str, request: Any, timeout_s: float) -> Any:
        """One call to the active controller (AlterPartition, ControlledShutdown)."""
        stub = self.peers.controller(await self._address())
        method = {"AlterPartition": stub.AlterPartition, "ControlledShutdown": stub.ControlledShutdown}[rpc]
        return await method(request, timeout=timeout_s)


def raise_open_files_limit(replicas_max: int) -> int:
    """Lift the open-files limit to what replicas_max replicas need (each replica's active segment
    holds its .log open, other files share a bounded cache; Kafka's docs ask for 100,000 or more):
    the soft limit up to the hard one, and the hard one too where the process may (root).
    Returns the limit in force."""
    # Pinned: the active .log per replica; cached: OPEN_SEGMENT_FILES_MAX of the others
    # (storage.py); the rest is sockets and the process's own files.
    wanted = (
        limits.OPEN_FILES_PER_REPLICA * replicas_max
        + limits.OPEN_SEGMENT_FILES_MAX
        + limits.OPEN_FILES_OTHER_MIN
    )
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = max(hard, wanted) if hard != resource.RLIM_INFINITY else hard
    if soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, target))
            soft = target
        except (ValueError, OSError):
            try:
                resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
                soft = hard
            except (ValueError, OSError) as exc:
                log.warning("could not raise the open-files limit from %d to %d: %s", soft, hard, exc)
    if soft < wanted:
        log.warning(
            "open-files limit %d is below the %d a broker may need (%d per replica for %d replicas, %d "
            "cached segment files, %d for sockets); raise it (ulimit -n, LimitNOFILE) or lower "
            "--replicas-max",
            soft,
            wanted,
            limits.OPEN_FILES_PER_REPLICA,
            replicas_max,
            limits.OPEN_SEGMENT_FILES_MAX,
            limits.OPEN_FILES_OTHER_MIN,
        )
    return soft


def _kafka_listener(
    config: BrokerConfig,
    port: int,
    process: ServiceProcess,
    kafka_backend: BrokerKafkaBackend,
    kafka_socket: socket.socket | None,
) -> KafkaListener:
    """Kafka's wire protocol on its own port (docs/KAFKA.md), under the broker's bounds, TLS and ACLs."""
    # The request bounds an operator set for the gRPC listeners hold here too.
    bounds = config.security
    security = process.security
    tls = security.tls
    cache = security.cache
    access_for = None
    if config.security.acl and cache is not None:
        # The broker's own ACL snapshot, the one its gRPC interceptor asks (kept current by
        # its etcd watch): a change applies to both listeners at once.
        def access_for(caller: Caller) -> KafkaAccess:
            return ConnectionAccess(caller, lambda: cache.authorizer)

    return KafkaListener(
        KafkaHandler(
            kafka_backend,
            max_batch_records=bounds.max_batch_records,
            fetch_session_cache=broker_cache(SystemClock()),
        ),
        config.host,
        port,
        request_bytes_max=bounds.max_request_bytes or limits.KAFKA_REQUEST_BYTES_MAX,
        in_flight_max=bounds.max_requests_per_connection
        or limits.KAFKA_REQUESTS_IN_FLIGHT_PER_CONNECTION_MAX,
        connections_per_ip_max=config.kafka_limits.connections_per_ip_max,
        connections_per_ip_overrides=config.kafka_limits.connections_per_ip_overrides,
        request_body_timeout_ms=config.kafka_limits.request_body_timeout_ms,
        partial_frame_bytes_max=config.kafka_limits.partial_frame_bytes_max,
        ssl_context=tls.server_ssl_context() if tls is not None else None,
        access_for=access_for,
        sock=kafka_socket,
    )


async def serve(config: BrokerConfig) -> None:
    config.check()
    prepare_data_dir(config.data_dir)
    # Taken before the gRPC server binds a free port, which could otherwise be this very port.
    kafka_socket = reserve_port(config.host, config.kafka_port) if config.kafka_port is not None else None
    raise_open_files_limit(config.replicas_max)
    process = await ServiceProcess.start(
        config,
        name=f"broker-{config.broker_id}",
        service_name=broker_pb2.DESCRIPTOR.services_by_name["BrokerService"].full_name,
        log=log,
    )
    store, runtime = process.store, process.runtime
    controller = ControllerClient(store, process.peers)
    replicas = ReplicaManager(
        broker_id=config.broker_id,
        data_dir=config.data_dir,
        call_controller=controller.call,
        replica_lag_time_max_ms=config.replica_lag_time_max_ms,
        log_cache_window_bytes=config.log_cache_window_bytes,
        fetch_max_bytes=config.fetch_max_bytes,
        cleaner_config=config.cleaner,
    )
    servicer = BrokerServicer(replicas, store)
    # The generated *_pb2_grpc module is unannotated.
    broker_pb2_grpc.add_BrokerServiceServicer_to_server(  # type: ignore[no-untyped-call]
        servicer, runtime.server
    )
    # Control requests that arrive between here and registration are answered
    # BROKER_NOT_AVAILABLE (the controller retries them): the broker epoch is not known yet.
    await runtime.start()
    kafka: KafkaListener | None = None
    kafka_backend = BrokerKafkaBackend(config.broker_id, replicas, store, process.peers)
    if config.kafka_port is not None:
        kafka = _kafka_listener(config, config.kafka_port, process, kafka_backend, kafka_socket)
        kafka_backend.start()
        await kafka.start()
    unclean_shutdown = replicas.start()
    info = {
        "broker_id": config.broker_id,
        "host": config.host,
        "port": runtime.bound_port,
        "rack": config.rack,
        "metrics_port": runtime.bound_metrics_port,
        "pid": os.getpid(),
        "unclean_shutdown": unclean_shutdown,
        "kafka_port": kafka.port if kafka is not None else 0,
        "replicas_max": config.replicas_max,
    }

    # The liveness stream to the active controller (heartbeat.py), started once registered.
    heartbeat = ControllerHeartbeat(store, config.broker_id, lambda: replicas.broker_epoch)

    def registered(registration: Registration) -> None:
        replicas.broker_epoch = registration.broker_epoch
        heartbeat.reopen()  # the stream must name this incarnation

    life = BrokerRegistrationLife(
        store,
        config.broker_id,
        info,
        ttl_s=config.lease_ttl_s,
        on_registered=registered,
        stop_process=runtime.stopping.set,
    )
    await life.register()
    metrics.LEASE_KEEPALIVE_FAILURES.set_function(lambda: life.registration.lease.keepalive_failures_total)
    await runtime.mark_ready(
        broker_id=config.broker_id, broker_epoch=replicas.broker_epoch, kafka_port=info["kafka_port"]
    )
    lease_watcher = asyncio.create_task(life.watch_lease(), name="broker-lease-watch")
    heartbeat_task = asyncio.create_task(heartbeat.run(), name="controller-heartbeat")

    async def on_stop() -> None:
        lease_watcher.cancel()
        life.shutting_down()
        await replicas.controlled_shutdown()
        if kafka is not None:
            await kafka.close()
            await kafka_backend.close()
        await replicas.close()
        servicer.end_streams()
        # Closed only now, next to the lease's revocation: a stream closed during the controlled
        # shutdown would let the controller revoke the lease before the leaderships had moved.
        heartbeat_task.cancel()
        try:
            await heartbeat_task
        except asyncio.CancelledError:
            pass
        await process.close(life.current)
        life.stopped()

    await runtime.run_until_stopped(on_stop)
