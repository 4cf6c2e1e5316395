"""Malformed requests without the security layer: INVALID_ARGUMENT and one log line, not a traceback.

gRPC parses a request before the servicer runs; bytes that do not parse make it
answer UNKNOWN ("Unexpected DecodeError", as if a handler had failed) and log a
~700-byte traceback per request, so anyone who can reach a plaintext port can
flood the log. With the security interceptor on, it parses requests itself
(services/security/interceptor.py); without it, this interceptor does the same
for our own services' unary requests: the request arrives as bytes, is parsed
here, and a failure is answered INVALID_ARGUMENT with a sentence, counted in a
metric and logged at most once per limits.MALFORMED_REQUEST_LOG_INTERVAL_S with how many were
refused since. gRPC's own services (health, reflection) are left alone.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc
import prometheus_client

from services.common import limits
from services.common.interceptors import WrappingInterceptor, as_async_iter, maybe_await

log = logging.getLogger("highwater.requests")

MALFORMED = prometheus_client.Counter(
    "highwater_malformed_requests_total", "Requests refused because their bytes do not parse", ["method"]
)


class MalformedRequestGuard(WrappingInterceptor):
    def __init__(self) -> None:
        super().__init__()
        self._last_log_s = float("-inf")
        self._since_log = 0

    def wants(self, method: str, handler: grpc.RpcMethodHandler) -> bool:
        return handler.request_deserializer is not None and not method.startswith("/grpc.")

    def _wrap(self, method: str, handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
        parse = handler.request_deserializer
        raw = {"request_deserializer": None, "response_serializer": handler.response_serializer}
        if handler.unary_unary is not None:
            inner = handler.unary_unary

            async def unary(request: bytes, context: grpc.aio.ServicerContext) -> Any:
                parsed = await self._parse(method, parse, request, context)
                return await maybe_await(inner(parsed, context))

            return grpc.unary_unary_rpc_method_handler(unary, **raw)
        if handler.unary_stream is not None:
            inner_stream = handler.unary_stream

            async def unary_stream(request: bytes, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
                parsed = await self._parse(method, parse, request, context)
                async for item in as_async_iter(inner_stream(parsed, context)):
                    yield item

            return grpc.unary_stream_rpc_method_handler(unary_stream, **raw)
        # Client-streaming methods (BrokerHeartbeat, StandbyHeartbeat, FetchStream, ProduceStream) are
        # left as they are: each answers a malformed message itself, ending its stream INVALID_ARGUMENT.
        return handler

    async def _parse(
        self, method: str, parse: Callable[[bytes], Any], request: bytes, context: grpc.aio.ServicerContext
    ) -> Any:
        try:
            return parse(request)
        except Exception as exc:  # DecodeError, or whatever a deserializer raises on garbage
            MALFORMED.labels(method).inc()
            self._since_log += 1
            now = time.monotonic()
            if now - self._last_log_s >= limits.MALFORMED_REQUEST_LOG_INTERVAL_S:
                log.warning(
                    "refused %d malformed request(s) since the last such line; latest: %s from %s (%s)",
                    self._since_log,
                    method,
                    context.peer(),
                    type(exc).__name__,
                )
                self._last_log_s, self._since_log = now, 0
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"the request bytes do not parse as the request of {method}: {type(exc).__name__}: {exc}",
            )
