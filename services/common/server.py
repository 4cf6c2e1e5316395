"""The shape every Highwater service shares (grpc examples' `serve()`).

`ServiceRuntime` wires one grpc.aio server with gRPC health checking and
reflection, a Prometheus `/metrics` HTTP endpoint, a ready file for whoever
started the process, and a clean stop on SIGTERM/SIGINT: health goes
NOT_SERVING, the service's own `on_stop` runs (a broker's controlled shutdown,
a registration's lease revoke), then in-flight RPCs get `SHUTDOWN_GRACE_S`.

With a token listener (--client-port) the process runs two grpc.aio servers, one per
listener, serving the same handlers: gRPC's connection, stream and header bounds are
per server, and the token listener needs its own (services/security/runtime.py).
"""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import os
import signal
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import grpc
import prometheus_client

# protobuf ships no type information and types-protobuf is not among the dev dependencies.
from google.protobuf import descriptor_pb2, descriptor_pool  # type: ignore[import-untyped]
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection, reflection_pb2
from grpc_reflection.v1alpha._async import ReflectionServicer

from coordinator.store import EtcdStore
from services.common import heap_debug, limits, loop_stalls
from services.common.request_guard import MalformedRequestGuard
from services.common.service_config import ServiceConfig
from services.security.runtime import ServiceSecurity

if TYPE_CHECKING:
    # services.common.peers imports this module (channel_options); PeerChannels is imported
    # where it is made, in ServiceProcess.start.
    from coordinator.registration import Registration
    from services.common.peers import PeerChannels

log = logging.getLogger("highwater.server")

GRPC_OPTIONS: list[tuple[str, int]] = [
    ("grpc.max_send_message_length", limits.GRPC_MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", limits.GRPC_MAX_MESSAGE_BYTES),
    ("grpc.so_reuseport", 0),
]


def channel_options() -> list[tuple[str, int]]:
    """Options for every channel between our processes (same message bound as servers)."""
    return [
        ("grpc.max_send_message_length", limits.GRPC_MAX_MESSAGE_BYTES),
        ("grpc.max_receive_message_length", limits.GRPC_MAX_MESSAGE_BYTES),
        # Fail fast on a dead peer instead of queueing calls forever.
        ("grpc.enable_retries", 0),
        ("grpc.initial_reconnect_backoff_ms", limits.PEER_RECONNECT_BACKOFF_MS_MIN),
        ("grpc.max_reconnect_backoff_ms", limits.PEER_RECONNECT_BACKOFF_MS_MAX),
    ]


# gRPC server reflection comes in two versions with the same messages under two package
# names; grpcio-reflection serves only v1alpha, while newer tools (grpcurl >= 1.9 first,
# Postman, grpcui, buf curl) ask v1 and some of them never fall back.
REFLECTION_V1_SERVICE = "grpc.reflection.v1.ServerReflection"
_REFLECTION_V1_FILE = "grpc/reflection/v1/reflection.proto"


def _add_reflection_v1_descriptor() -> None:
    """Put grpc/reflection/v1/reflection.proto into the default pool, so v1 can describe itself.

    Made from v1alpha's descriptor with the package renamed: the two files differ in
    nothing else that reaches the wire (grpc/grpc-proto, reflection/v1/reflection.proto).
    """
    pool = descriptor_pool.Default()
    try:
        pool.FindFileByName(_REFLECTION_V1_FILE)
        return
    except KeyError:
        pass
    proto = descriptor_pb2.FileDescriptorProto()
    reflection_pb2.DESCRIPTOR.CopyToProto(proto)
    old, new = ".grpc.reflection.v1alpha.", ".grpc.reflection.v1."
    proto.name = _REFLECTION_V1_FILE
    proto.package = "grpc.reflection.v1"
    proto.ClearField("options")
    for message in proto.message_type:
        for f in message.field:
            if f.HasField("type_name"):
                f.type_name = f.type_name.replace(old, new)
    for service in proto.service:
        for method in service.method:
            method.input_type = method.input_type.replace(old, new)
            method.output_type = method.output_type.replace(old, new)
    pool.Add(proto)


def reflection_v1_handler(servicer: ReflectionServicer) -> grpc.GenericRpcHandler:
    """grpc.reflection.v1.ServerReflection, answered by the v1alpha servicer (same message bytes)."""
    _add_reflection_v1_descriptor()
    handler = grpc.stream_stream_rpc_method_handler(
        servicer.ServerReflectionInfo,
        request_deserializer=reflection_pb2.ServerReflectionRequest.FromString,
        response_serializer=reflection_pb2.ServerReflectionResponse.SerializeToString,
    )
    return grpc.method_handlers_generic_handler(REFLECTION_V1_SERVICE, {"ServerReflectionInfo": handler})


class ServerGroup:
    """The grpc.aio servers of one process (one per listener), serving the same handlers.

    A service registers its servicer once, `add_XServicer_to_server(servicer, runtime.server)`,
    and every server gets it. `service` is the server of --port; `token` the token listener's.
    """

    def __init__(self, service: grpc.aio.Server, token: grpc.aio.Server | None = None) -> None:
        self.service = service
        self.token = token
        self.servers = [service] if token is None else [service, token]

    def add_generic_rpc_handlers(self, handlers: Sequence[grpc.GenericRpcHandler]) -> None:
        for server in self.servers:
            server.add_generic_rpc_handlers(handlers)

    def add_registered_method_handlers(
        self, service_name: str, method_handlers: dict[str, grpc.RpcMethodHandler]
    ) -> None:
        for server in self.servers:
            server.add_registered_method_handlers(service_name, method_handlers)

    async def start(self) -> None:
        for server in self.servers:
            await server.start()

    async def stop(self, grace_s: float) -> None:
        await asyncio.gather(*(server.stop(grace_s) for server in self.servers))


def settle_heap() -> None:
    """Keep what start-up built (imported modules, recovered logs) out of every later collection.

    A started broker holds ~145,000 objects from imports alone; each full (generation 2)
    collection walked all of them, 50-130 ms on the 2-core bench machine, several times a
    minute under load, and those pauses were the whole p99 of end-to-end latency. A full
    collection now walks only what the process made since (Instagram's gc.freeze() recipe).
    The price: an object made during start-up that later becomes part of a reference cycle
    (a replica recovered at start and deleted later) is freed only by reference counting;
    it is bounded by what start-up made.
    """
    gc.collect()
    gc.freeze()


@dataclass
class ServiceRuntime:
    """One service process: gRPC server, health, reflection, metrics, ready file, signals."""

    name: str
    host: str
    port: int
    metrics_port: int | None
    ready_file: Path | None
    service_names: Sequence[str]
    # services.security.runtime.ServiceSecurity: TLS listeners, the security interceptor and
    # request limits. None (or an inactive one): plaintext, exactly as without the layer.
    security: Any = None
    server: ServerGroup = field(init=False)
    health: health.aio.HealthServicer = field(init=False)
    bound_port: int = field(init=False, default=0)
    bound_metrics_port: int = field(init=False, default=0)
    stopping: asyncio.Event = field(init=False)

    def __post_init__(self) -> None:
        kwargs = (
            self.security.server_kwargs(GRPC_OPTIONS)
            if self.security is not None
            else {"options": GRPC_OPTIONS}
        )
        if not kwargs.get("interceptors"):
            # The security interceptor parses requests itself; without it, this one does.
            kwargs["interceptors"] = [MalformedRequestGuard()]
        token_kwargs = (
            self.security.token_listener_server_kwargs(GRPC_OPTIONS) if self.security is not None else None
        )
        self.server = ServerGroup(
            grpc.aio.server(**kwargs), grpc.aio.server(**token_kwargs) if token_kwargs is not None else None
        )
        self.health = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        names = [*self.service_names, health.SERVICE_NAME, reflection.SERVICE_NAME, REFLECTION_V1_SERVICE]
        for server in self.server.servers:  # reflection wants a grpc.aio.Server itself
            reflection.enable_server_reflection(names, server)
        self.server.add_generic_rpc_handlers([reflection_v1_handler(ReflectionServicer(names))])
        self.stopping = asyncio.Event()
        self.loop_stalls: loop_stalls.LoopStallWatch | None = None

    async def start(self) -> None:
        """Bind and start serving; health stays NOT_SERVING until `mark_ready`."""
        if self.security is not None:
            self.bound_port = self.security.bind(self.server.service, self.host, self.port)
        else:
            self.bound_port = self.server.service.add_insecure_port(f"{self.host}:{self.port}")
        if self.bound_port == 0:
            raise SystemExit(f"{self.name}: cannot listen on {self.host}:{self.port} (port in use?)")
        if self.server.token is not None:
            self.security.bind_token_listener(self.server.token, self.host)
        await self.server.start()
        for svc in ["", *self.service_names]:
            await self.health.set(svc, health_pb2.HealthCheckResponse.NOT_SERVING)
        if self.metrics_port is not None:
            http_server, _ = prometheus_client.start_http_server(self.metrics_port, addr=self.host)
            self.bound_metrics_port = http_server.server_address[1]
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.stopping.set)
        heap_debug.install(loop, self.name)  # SIGUSR1 heap dumps, only when its env var is set
        self.loop_stalls = loop_stalls.install(loop, self.name)
        token_port = self.security.bound_client_port if self.server.token is not None else None
        log.info(
            "%s listening on %s:%d%s (metrics on %d)",
            self.name,
            self.host,
            self.bound_port,
            f", token clients on {token_port}" if token_port else "",
            self.bound_metrics_port,
        )

    async def mark_ready(self, **extra: object) -> None:
        """Health SERVING, and write the ready file (port numbers for whoever started us)."""
        settle_heap()
        for svc in ["", *self.service_names]:
            await self.health.set(svc, health_pb2.HealthCheckResponse.SERVING)
        if self.ready_file is not None:
            info = {
                "pid": os.getpid(),
                "host": self.host,
                "port": self.bound_port,
                "metrics_port": self.bound_metrics_port,
                **(self.security.ready_info() if self.security is not None else {}),
                **extra,
            }
            tmp = self.ready_file.with_suffix(".tmp")
            tmp.write_text(json.dumps(info))
            tmp.replace(self.ready_file)

    async def run_until_stopped(
        self, on_stop: Callable[[], Awaitable[None]] | None = None, lost: asyncio.Event | None = None
    ) -> None:
        """Serve until SIGTERM/SIGINT (or `lost` is set), then stop cleanly."""
        waiters = [asyncio.create_task(self.stopping.wait())]
        if lost is not None:
            waiters.append(asyncio.create_task(lost.wait()))
        await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
        for w in waiters:
            w.cancel()
        log.info("%s stopping", self.name)
        for svc in ["", *self.service_names]:
            await self.health.set(svc, health_pb2.HealthCheckResponse.NOT_SERVING)
        if on_stop is not None:
            try:
                await on_stop()
            except Exception:
                log.exception("%s: error during shutdown", self.name)
        await self.server.stop(limits.SHUTDOWN_GRACE_S)
        if self.loop_stalls is not None:
            self.loop_stalls.stop()
        if self.ready_file is not None:
            self.ready_file.unlink(missing_ok=True)
        log.info("%s stopped", self.name)


@dataclass
class ServiceProcess:
    """What every service's serve() starts from and closes last: etcd, security, peers, runtime.

    process = await ServiceProcess.start(config, name="broker-1", service_name=..., log=log)
    add_XServicer_to_server(servicer, process.runtime.server)
    ...
    await process.close(registration)  # last step of on_stop
    """

    store: EtcdStore
    security: ServiceSecurity
    peers: PeerChannels
    runtime: ServiceRuntime
    log: logging.Logger  # the service's own logger, for what close() has to report

    @classmethod
    async def start(
        cls, config: ServiceConfig, *, name: str, service_name: str, log: logging.Logger
    ) -> ServiceProcess:
        from services.common.peers import PeerChannels

        store = await EtcdStore.connect(
            config.etcd_endpoints, prefix=config.etcd_prefix, tls=config.security.etcd_tls()
        )
        security = await ServiceSecurity.start(config.security, store)
        runtime = ServiceRuntime(
            name=name,
            host=config.host,
            port=config.port,
            metrics_port=config.metrics_port,
            ready_file=config.ready_file,
            service_names=[service_name],
            security=security,
        )
        return cls(store=store, security=security, peers=PeerChannels(), runtime=runtime, log=log)

    async def close(self, registration: Registration | None = None) -> None:
        """Revoke the registration's lease (so others see us gone at once), then close the rest."""
        if registration is not None:
            try:
                await registration.lease.stop(revoke=True)
            except Exception as exc:
                self.log.warning("could not revoke the lease: %s", exc)
        await self.peers.close()
        await self.security.close()
        await self.store.close()


def configure_logging(level: str = "INFO", json_logs: bool = False) -> None:
    """Plain or JSON-lines logs on stderr; one place so every service logs alike."""

    class JsonFormatter(logging.Formatter):
        def format(self, record: logging.LogRecord) -> str:
            out = {
                "ts": round(record.created, 3),
                "level": record.levelname,
                "logger": record.name,
                "msg": record.getMessage(),
                "pid": os.getpid(),
            }
            for key in ("topic", "partition", "leader_epoch", "controller_epoch", "broker_id", "request_id"):
                if hasattr(record, key):
                    out[key] = getattr(record, key)
            if record.exc_info:
                out["exc"] = self.formatException(record.exc_info)
            return json.dumps(out)

    handler = logging.StreamHandler()
    if json_logs:
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(
            logging.Formatter("%(asctime)s %(levelname)s %(name)s [%(process)d] %(message)s")
        )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    logging.getLogger("grpc").setLevel("WARNING")


# Exit code of a process stopped by a broken invariant (sysexits' EX_SOFTWARE).
INVARIANT_VIOLATION_EXIT_CODE = 70


def halt_on_invariant_violation(exc: BaseException, where: str) -> None:
    """A broken invariant is a bug: log it with its values and stop the process at once.

    Carrying on could spread the damage (STYLE.md, practice 5); Kafka halts a broker the
    same way. The supervisor (or the controller's failover) takes it from there.
    """
    log.critical("invariant broken in %s: %s; halting", where, exc, exc_info=exc)
    logging.shutdown()
    os._exit(INVARIANT_VIOLATION_EXIT_CODE)
