"""Ending a server's open request streams between messages, when the service stops.

A unary call ends with its answer; a stream of calls (FetchStream) outlives its answers,
so a stopping server would wait its whole grace period for callers that keep their
streams open. grpc.aio has no way to end a call from outside its handler, and cancelling
the call's task at any moment can leave gRPC without a status to send (the cancellation
may land in gRPC's own write, which takes it for the caller's). So a stream is ended only
where it waits for the caller's next message: whichever layer reads the messages (the
servicer, or the security interceptor in front of it) reads them through `next_message`,
which ends the call with UNAVAILABLE once `end` named its task: at once if it is waiting
there, else at its next read. Owned by the service's event loop; no locks.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any, NoReturn

import grpc


class StreamEnds:
    """The tasks of open request streams that wait for their callers, and those told to end."""

    def __init__(self) -> None:
        self._waiting: set[asyncio.Task[Any]] = set()
        self._ending: dict[asyncio.Task[Any], str] = {}

    async def next_message(self, messages: AsyncIterator[Any], context: grpc.aio.ServicerContext) -> Any:
        """The caller's next message (StopAsyncIteration when it ended the stream); aborts the call
        with UNAVAILABLE when `end` named this task."""
        task = asyncio.current_task()
        if task is None:
            return await anext(messages)
        reason = self._ending.get(task)
        if reason is not None:
            await self._abort(task, reason, context)
        self._waiting.add(task)
        try:
            return await anext(messages)
        except asyncio.CancelledError:
            reason = self._ending.get(task)
            if reason is None:
                raise  # gRPC's own: the caller went away
            task.uncancel()  # ours, from `end`: taken back, the call ends with a status instead
            await self._abort(task, reason, context)
        finally:
            self._waiting.discard(task)

    def end(self, tasks: list[asyncio.Task[Any]], reason: str) -> None:
        """End these streams' calls with UNAVAILABLE (reason for the caller) at their next read."""
        for task in tasks:
            if task.done() or task in self._ending:
                continue
            self._ending[task] = reason
            if task in self._waiting:
                task.cancel()

    async def _abort(
        self, task: asyncio.Task[Any], reason: str, context: grpc.aio.ServicerContext
    ) -> NoReturn:
        self._ending.pop(task, None)
        await context.abort(grpc.StatusCode.UNAVAILABLE, reason)
        raise RuntimeError("grpc.aio ServicerContext.abort returned instead of raising")


# One per process: a service's servicers and its interceptor read through the same one.
STREAM_ENDS = StreamEnds()
