"""Unary calls to one broker carried over its streaming twin (Fetch over FetchStream, Produce over
ProduceStream), answered exactly as the unary call would answer them.

A unary call costs a Python broker ~0.36-0.45 ms of CPU and a round trip of ~0.55 ms on
loopback; a message on an open stream ~0.17 ms and ~0.28 ms (docs/ARCHITECTURE.md, section 6).
Whoever calls the same broker again and again (a follower's replica fetcher, a consumer
reading from a leader, a producer writing to one) sends its calls here.

`CallsOverStreams.call(request, timeout_s)` behaves as `stub.<Method>(request, timeout=timeout_s)`:
the same answer, and on failure the same `grpc.aio.AioRpcError` status. Each stream carries one
request at a time (the RPCs' contract); up to `streams_max` streams are kept open per broker and
reused, opened on demand, and a call made while all of them are busy goes as a unary call. Each
answer must arrive within its call's timeout, as the unary deadline demanded; a late or failed
answer, or a cancelled caller, ends that stream (an answer still in flight can never be taken for
a later request's). A broker that answers UNIMPLEMENTED (older than the streaming method, during a
rolling upgrade) is called with unary calls, trying a stream again after `unary_for_s`.

Owned by one event loop; no locks.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import grpc

log = logging.getLogger("highwater.stream_calls")


class CallsOverStreams:
    """One broker's streams for one method, opened on demand; unary while all are busy or unsupported."""

    def __init__(self, stub: Any, method: str, address: str, *, streams_max: int, unary_for_s: float) -> None:
        if streams_max < 1:
            raise ValueError(f"streams_max must be at least 1, got {streams_max}")
        self.method = method
        self.address = address
        self.streams_max = streams_max
        self.unary_for_s = unary_for_s
        # A BrokerServiceStub (generated, unannotated): `method` and `method + "Stream"`.
        self._unary = getattr(stub, method)
        self._open_stream = getattr(stub, method + "Stream")
        self._streams: set[grpc.aio.StreamStreamCall] = set()  # every open stream, idle or busy
        self._idle: list[grpc.aio.StreamStreamCall] = []
        # While time.monotonic() is below this, calls are unary: the broker had no such stream.
        self._unary_until = float("-inf")
        self.streams_opened = 0  # for tests and logs: how many streams were begun

    async def call(self, request: Any, timeout_s: float) -> Any:
        if time.monotonic() < self._unary_until:
            return await self._unary(request, timeout=timeout_s)
        fresh = not self._idle
        if not fresh:
            stream = self._idle.pop()
        elif len(self._streams) < self.streams_max:
            # No deadline on the stream itself: each answer has its own (below).
            stream = self._open_stream()
            self._streams.add(stream)
            self.streams_opened += 1
        else:
            return await self._unary(request, timeout=timeout_s)
        deadline = time.monotonic() + timeout_s
        healthy = False
        try:
            async with asyncio.timeout(timeout_s):  # no task per call, unlike wait_for
                response = await _exchange(stream, request, self.method)
            healthy = True
            return response
        except TimeoutError:
            raise deadline_exceeded() from None
        except grpc.aio.AioRpcError as exc:
            # UNIMPLEMENTED: a broker without the method. A new stream failing at once with
            # UNKNOWN or INTERNAL is one too: a Python servicer subclassing the generated base
            # without it raises NotImplementedError, which grpc.aio does not answer as
            # UNIMPLEMENTED. Either way its first request was not served.
            if not (
                exc.code() == grpc.StatusCode.UNIMPLEMENTED
                or (fresh and exc.code() in (grpc.StatusCode.UNKNOWN, grpc.StatusCode.INTERNAL))
            ):
                raise
            why = f"{exc.code().name}: {exc.details()}"
        finally:
            # A stream that failed, timed out or whose caller was cancelled is in an unknown
            # state: it ends. A healthy one is reused, unless end() came meanwhile.
            if healthy and stream in self._streams:
                self._idle.append(stream)
            else:
                self._streams.discard(stream)
                stream.cancel()
        # An older broker: nothing was served, so this same request goes as a unary call.
        log.info(
            "broker %s has no %sStream (%s; an older version?); unary calls for %.0f s",
            self.address,
            self.method,
            why,
            self.unary_for_s,
        )
        self._unary_until = time.monotonic() + self.unary_for_s
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise deadline_exceeded()
        return await self._unary(request, timeout=remaining)

    def end(self) -> None:
        """Cancel every open stream (calls on them fail CANCELLED; later calls open new ones)."""
        streams, self._streams, self._idle = self._streams, set(), []
        for stream in streams:
            stream.cancel()


async def _exchange(stream: grpc.aio.StreamStreamCall, request: Any, method: str) -> Any:
    """One request and its answer; the stream carries one outstanding request at a time."""
    try:
        await stream.write(request)
    except asyncio.InvalidStateError:
        pass  # the call ended before this write (the broker's status is not read yet): read says why
    response = await stream.read()
    if response is grpc.aio.EOF:
        # The broker ended the stream without an error status (it never should while the call
        # is open): fail this call as a broken connection would.
        code = await stream.code()
        details = await stream.details()
        raise grpc.aio.AioRpcError(
            grpc.StatusCode.UNAVAILABLE if code == grpc.StatusCode.OK else code,
            grpc.aio.Metadata(),
            grpc.aio.Metadata(),
            details=f"the broker ended the {method}Stream ({code.name}: {details})",
        )
    return response


def deadline_exceeded() -> grpc.aio.AioRpcError:
    """What a unary call whose deadline passed raises, so a late stream answer fails the same way."""
    return grpc.aio.AioRpcError(
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.aio.Metadata(),
        grpc.aio.Metadata(),
        details="Deadline Exceeded",
    )
