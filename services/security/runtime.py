"""ServiceSecurity: the security layer of one running service, as ServiceProcess and ServiceRuntime use it.

ServiceProcess.start (services/common/server.py) takes these steps for every service:

    store = await EtcdStore.connect(..., tls=config.security.etcd_tls())
    security = await ServiceSecurity.start(config.security, store)
    runtime = ServiceRuntime(..., security=security)   # interceptor, TLS listeners, limits
    ...
    await security.close()

With every flag off, `start` returns an inactive object that changes nothing:
ServiceRuntime builds the same plaintext server as before.

Listeners with --tls-dir: the service port (`--port`, the one registered in
etcd and used by peers) is mutual TLS; `--client-port` adds a TLS listener
without client certificates for bearer-token clients (gRPC Python cannot make
a client certificate optional on one port). Both run the same servicers
behind the same interceptor, but on two grpc.aio servers: on the token
listener nobody is known before a call's headers are read, so it has bounds of
its own (gRPC's limits are per server; limits.TOKEN_LISTENER_*) and
`TokenListenerGate` in front, which refuses a call without a valid token
before gRPC reads its body.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator
from typing import Any

import grpc
from grpc_health.v1 import health_pb2

from coordinator.store import MetadataStore
from services.common import limits
from services.common.interceptors import MethodInterceptor
from services.security import channels, rules, tokens
from services.security.cache import SecurityCache
from services.security.config import SecurityConfig
from services.security.identity import parse_service_name
from services.security.interceptor import (
    AUTHORIZATION_KEY,
    REFUSED,
    ConnectionLimiter,
    ForwardPrincipal,
    SecurityInterceptor,
    TokenVerifier,
)
from services.security.quotas import QuotaManager
from services.security.tls import TlsMaterial

log = logging.getLogger("highwater.security")

# gRPC server options of the token listener (limits.py says why each bound and what it costs).
TOKEN_LISTENER_OPTIONS: list[tuple[str, int]] = [
    ("grpc.max_allowed_incoming_connections", limits.TOKEN_LISTENER_CONNECTIONS_MAX),
    ("grpc.max_concurrent_streams", limits.TOKEN_LISTENER_STREAMS_PER_CONNECTION_MAX),
    ("grpc.server.max_pending_requests", limits.TOKEN_LISTENER_PENDING_CALLS_MAX),
    ("grpc.max_metadata_size", limits.TOKEN_LISTENER_METADATA_BYTES_MAX),
    ("grpc.server_handshake_timeout_ms", limits.TOKEN_LISTENER_HANDSHAKE_TIMEOUT_MS),
    ("grpc.max_connection_idle_ms", limits.TOKEN_LISTENER_CONNECTION_IDLE_MS),
]
_EMPTY_HEALTH_REQUEST = health_pb2.HealthCheckRequest()


class TokenListenerGate(MethodInterceptor):
    """On the token listener: a call without a valid bearer token is refused before its body is read.

    grpc.aio asks the interceptors for a method's handler once the call's headers are in, and
    only then reads the request, for unary-request methods before the handler runs. The
    SecurityInterceptor decides in the handler, so it sees a caller only after the whole body
    (up to the receive bound, 64 MiB) was received: 16 such bodies without credentials once
    took a gateway past 1.4 GiB. This gate decides from the headers alone and answers a call
    without a valid token with a handler that takes the request as a stream and never reads
    it: UNAUTHENTICATED, at the cost of the headers and one flow-control window.

    Health checks stay open to load balancers without credentials; their body is not read
    either: they are answered for the whole server (service ""), which ServiceRuntime keeps
    in step with every service name. A call that passes still goes through the
    SecurityInterceptor, which authenticates it again with the rest of its checks (the token
    may be revoked in between) -- this gate only keeps unknown callers' bytes out.
    Runs on the service's event loop; keeps no state of its own.
    """

    def __init__(self, verifier: TokenVerifier) -> None:
        self.verifier = verifier

    def _intercept(
        self, method: str, handler: grpc.RpcMethodHandler, handler_call_details: grpc.HandlerCallDetails
    ) -> grpc.RpcMethodHandler:
        reason = self._unauthenticated(handler_call_details.invocation_metadata or ())
        if reason is None:
            return handler
        if method in rules.UNAUTHENTICATED_METHODS:
            return _health_without_body(handler)
        REFUSED.labels(method, reason).inc()
        log.debug("refused %s on the token listener before its body (%s)", method, reason)
        return _refusal(
            handler,
            "no valid bearer token: this listener takes token clients only (`authorization: Bearer hwt...`)",
        )

    def _unauthenticated(self, metadata: Any) -> str | None:
        """None when the headers carry a valid bearer token, else the reason (REFUSED's label)."""
        for key, value in metadata:
            if key == AUTHORIZATION_KEY:
                token = tokens.bearer_value(
                    value if isinstance(value, str) else value.decode(errors="replace")
                )
                if token and self.verifier.verify_token(token, int(time.time() * 1000)) is not None:
                    return None
                return "bad_token"
        return "no_credentials"


def _refusal(handler: grpc.RpcMethodHandler, message: str) -> grpc.RpcMethodHandler:
    """A handler of the same response kind that refuses without reading the request.

    Request-streaming on our side whatever the method: gRPC reads a unary request before
    calling the handler, a stream only when the handler iterates it (the wire is the same)."""

    async def refuse(request_iterator: Any, context: grpc.aio.ServicerContext) -> None:
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, message)

    async def refuse_stream(request_iterator: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, message)
        yield  # unreachable: abort raises; makes this an async generator

    if handler.response_streaming:
        return grpc.stream_stream_rpc_method_handler(refuse_stream)
    return grpc.stream_unary_rpc_method_handler(refuse)


def _health_without_body(handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
    """Health Check/Watch answered for the whole server, the request never read (see the gate)."""
    if handler.unary_unary is not None:
        check = handler.unary_unary

        async def check_server(request_iterator: Any, context: grpc.aio.ServicerContext) -> Any:
            return await check(_EMPTY_HEALTH_REQUEST, context)

        return grpc.stream_unary_rpc_method_handler(
            check_server, response_serializer=handler.response_serializer
        )
    watch = handler.unary_stream

    async def watch_server(request_iterator: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        async for item in watch(_EMPTY_HEALTH_REQUEST, context):
            yield item

    return grpc.stream_stream_rpc_method_handler(
        watch_server, response_serializer=handler.response_serializer
    )


class ServiceSecurity:
    """TLS material, the ACL/token cache and the interceptor of one service process."""

    def __init__(
        self,
        config: SecurityConfig,
        tls: TlsMaterial | None,
        cache: SecurityCache | None,
        interceptor: SecurityInterceptor | None,
    ) -> None:
        self.config = config
        self.tls = tls
        self.cache = cache
        self.interceptor = interceptor
        self.bound_client_port = 0

    @property
    def active(self) -> bool:
        return self.config.active

    @classmethod
    async def start(cls, config: SecurityConfig, store: MetadataStore) -> ServiceSecurity:
        """Check the flags, read certificates, load ACLs and tokens. Raises SystemExit on bad settings."""
        config.check()
        if not config.active:
            return cls(config, None, None, None)
        tls = config.tls_material()
        cache = None
        if tls is not None:
            cache = SecurityCache(store, super_users=config.super_users)
            await cache.start()
            identity = parse_service_name(config.name)
            forward = [ForwardPrincipal()] if identity is not None and identity.kind == "gateway" else []
            channels.configure(tls.channel_credentials(), forward)
        quotas = None
        if config.quotas:
            quotas = QuotaManager(
                produce_bytes_per_s=config.producer_byte_rate, fetch_bytes_per_s=config.consumer_byte_rate
            )
        interceptor = None
        if config.needs_interceptor:
            interceptor = SecurityInterceptor(
                tls=tls is not None,
                cache=cache,
                acl=config.acl,
                limits=rules.Limits(max_batch_records=config.max_batch_records),
                quotas=quotas,
                connections=ConnectionLimiter(config.max_requests_per_connection)
                if config.max_requests_per_connection
                else None,
            )
        log.info(
            "security: tls=%s authorizer=%s super_users=%s quotas(produce=%d B/s, fetch=%d B/s) "
            "max_request_bytes=%d max_batch_records=%d max_requests_per_connection=%d client_port=%s",
            tls is not None,
            config.authorizer,
            ",".join(config.super_users) or "-",
            config.producer_byte_rate,
            config.consumer_byte_rate,
            config.max_request_bytes,
            config.max_batch_records,
            config.max_requests_per_connection,
            config.client_port,
        )
        return cls(config, tls, cache, interceptor)

    def server_kwargs(self, options: list[tuple[str, Any]]) -> dict[str, Any]:
        """Keyword arguments for grpc.aio.server: the options with our limits, and the interceptor."""
        if not self.active:
            return {"options": options}
        merged = dict(options)
        if self.config.max_request_bytes:
            merged["grpc.max_receive_message_length"] = self.config.max_request_bytes
        kwargs: dict[str, Any] = {"options": list(merged.items())}
        if self.interceptor is not None:
            kwargs["interceptors"] = [self.interceptor]
        return kwargs

    def token_listener_server_kwargs(self, options: list[tuple[str, Any]]) -> dict[str, Any] | None:
        """Keyword arguments for the token listener's own grpc.aio server (None without --client-port).

        The service port's options and interceptor, plus the TOKEN_LISTENER_* bounds and
        TokenListenerGate in front. The receive bound stays the service's: only callers with
        a valid token get their body read, and a token client may produce a batch as large
        as a topic's max.message.bytes allows (up to GRPC_MAX_MESSAGE_BYTES).
        """
        if self.tls is None or self.cache is None or self.config.client_port is None:
            return None
        kwargs = self.server_kwargs(options)
        kwargs["options"] = list({**dict(kwargs["options"]), **dict(TOKEN_LISTENER_OPTIONS)}.items())
        kwargs["interceptors"] = [TokenListenerGate(self.cache), *kwargs.get("interceptors", ())]
        return kwargs

    def bind(self, server: grpc.aio.Server, host: str, port: int) -> int:
        """Add the service port; returns its number (0 if it could not be bound)."""
        bound: int
        if self.tls is None:
            bound = server.add_insecure_port(f"{host}:{port}")
        else:
            bound = server.add_secure_port(
                f"{host}:{port}", self.tls.server_credentials(require_client_cert=True)
            )
        return bound

    def bind_token_listener(self, server: grpc.aio.Server, host: str) -> None:
        """Add --client-port to the server made from `token_listener_server_kwargs`. Raises SystemExit."""
        if self.tls is None or self.config.client_port is None:
            raise ValueError("bind_token_listener needs --tls-dir and --client-port")
        self.bound_client_port = server.add_secure_port(
            f"{host}:{self.config.client_port}", self.tls.server_credentials(require_client_cert=False)
        )
        if self.bound_client_port == 0:
            raise SystemExit(
                f"cannot listen on {host}:{self.config.client_port} for token clients (port in use?)"
            )

    def ready_info(self) -> dict[str, Any]:
        """Extra fields for the ready file."""
        if self.tls is None:
            return {}
        info: dict[str, Any] = {"tls": True}
        if self.bound_client_port:
            info["client_port"] = self.bound_client_port
        return info

    async def close(self) -> None:
        if self.cache is not None:
            await self.cache.close()
