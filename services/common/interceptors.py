"""What our grpc.aio server interceptors share: the method's name, and one wrapped handler per method.

gRPC asks an interceptor for a method's handler on every call; building the wrapper
each time would cost a closure per call, so it is built once per method and kept as
long as gRPC hands out the same handler.
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc


def method_name(handler_call_details: grpc.HandlerCallDetails) -> str:
    """The call's full method name, "/package.Service/Method" (gRPC may hand it over as bytes)."""
    method = handler_call_details.method
    return method.decode() if isinstance(method, bytes) else method


async def maybe_await(value: Any) -> Any:
    """The result of a wrapped handler: grpc.aio serves plain and async servicer methods alike,
    so a wrapper in front of one must take either."""
    return await value if inspect.isawaitable(value) else value


async def as_async_iter(items: Any) -> AsyncIterator[Any]:
    """The items of a wrapped streaming handler, whether it is an async generator or returns a
    plain iterable (grpc.aio accepts both)."""
    if hasattr(items, "__aiter__"):
        async for item in items:
            yield item
    else:
        for item in items:
            yield item


class MethodInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[misc]  # grpc.aio is untyped
    """An interceptor that decides per method, from the handler gRPC found for the call."""

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[Any]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> Any:
        handler = await continuation(handler_call_details)
        if handler is None:
            return None
        return self._intercept(method_name(handler_call_details), handler, handler_call_details)

    def _intercept(
        self, method: str, handler: grpc.RpcMethodHandler, handler_call_details: grpc.HandlerCallDetails
    ) -> grpc.RpcMethodHandler:
        """The handler to serve `method` with: `handler` itself, or one in its place."""
        raise NotImplementedError


class WrappingInterceptor(MethodInterceptor):
    """An interceptor that replaces the handlers of the methods it `wants` with `_wrap(method, handler)`."""

    def __init__(self) -> None:
        self._wrapped: dict[str, tuple[grpc.RpcMethodHandler, grpc.RpcMethodHandler]] = {}

    def wants(self, method: str, handler: grpc.RpcMethodHandler) -> bool:
        return True

    def _wrap(self, method: str, handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
        raise NotImplementedError

    def _intercept(
        self, method: str, handler: grpc.RpcMethodHandler, handler_call_details: grpc.HandlerCallDetails
    ) -> grpc.RpcMethodHandler:
        if not self.wants(method, handler):
            return handler
        cached = self._wrapped.get(method)
        if cached is not None and cached[0] is handler:
            return cached[1]
        wrapped = self._wrap(method, handler)
        self._wrapped[method] = (handler, wrapped)
        return wrapped
