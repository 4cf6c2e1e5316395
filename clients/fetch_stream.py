"""Fetch calls to one broker over one BrokerService.FetchStream, as a unary Fetch would answer them.

A unary call costs a Python broker ~0.36-0.45 ms of CPU and a round trip of ~0.55 ms on
loopback; a message on an open stream ~0.17 ms and ~0.28 ms (docs/ARCHITECTURE.md, section 6).
Whoever fetches again and again from the same broker (a follower's replica fetcher, a
consumer reading straight from a leader) sends its Fetches here.

`FetchOverStream.fetch(request, timeout_s)` behaves as `stub.Fetch(request, timeout=timeout_s)`:
the same answer, and on failure the same `grpc.aio.AioRpcError` status. The stream is opened at
the first fetch and again after it breaks. Each answer must arrive within its call's timeout,
as the unary deadline demanded; a late or failed answer, or a cancelled caller, ends the
stream, so the next fetch opens a new one (an answer still in flight can never be taken for a
later request's). One request is outstanding per stream (the RPC's contract): a fetch made
while another is out goes as a unary call. A broker that answers UNIMPLEMENTED (older than
FetchStream, during a rolling upgrade) is fetched from with unary calls, trying the stream
again after `unary_for_s`.

Owned by one event loop; no locks.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, cast

import grpc

from protos.highwater.v1 import common_pb2

log = logging.getLogger("highwater.fetch_stream")


class FetchOverStream:
    """One broker's FetchStream, opened on demand; unary Fetch while it is busy or unsupported."""

    def __init__(self, stub: Any, address: str, *, unary_for_s: float) -> None:
        self.address = address
        self.unary_for_s = unary_for_s
        self._stub = stub  # a BrokerServiceStub (generated, unannotated)
        self._stream: grpc.aio.StreamStreamCall | None = None
        self._busy = False
        # While time.monotonic() is below this, Fetch is unary: the broker had no FetchStream.
        self._unary_until = float("-inf")
        self.streams_opened = 0  # for tests and logs: how many FetchStreams were begun

    async def fetch(self, request: common_pb2.FetchRequest, timeout_s: float) -> common_pb2.FetchResponse:
        if self._busy or time.monotonic() < self._unary_until:
            response: common_pb2.FetchResponse = await self._stub.Fetch(request, timeout=timeout_s)
            return response
        deadline = time.monotonic() + timeout_s
        stream = self._stream
        fresh = stream is None
        if stream is None:
            # No deadline on the stream itself: each answer has its own (below).
            stream = self._stream = self._stub.FetchStream()
            self.streams_opened += 1
        self._busy = True
        try:
            async with asyncio.timeout(timeout_s):  # no task per call, unlike wait_for
                return await _exchange(stream, request)
        except TimeoutError:
            self.end()
            raise deadline_exceeded() from None
        except grpc.aio.AioRpcError as exc:
            self.end()
            # UNIMPLEMENTED: a broker without the method. A new stream failing at once with
            # UNKNOWN or INTERNAL is one too: a Python servicer subclassing the generated base
            # without FetchStream raises NotImplementedError, which grpc.aio does not answer as
            # UNIMPLEMENTED. Either way its first request was not served.
            if not (
                exc.code() == grpc.StatusCode.UNIMPLEMENTED
                or (fresh and exc.code() in (grpc.StatusCode.UNKNOWN, grpc.StatusCode.INTERNAL))
            ):
                raise
            why = f"{exc.code().name}: {exc.details()}"
        except BaseException:
            # A cancelled caller, or anything unforeseen: the stream's state is unknown.
            self.end()
            raise
        finally:
            self._busy = False
        # An older broker: nothing was served, so this same request goes as a unary call.
        log.info(
            "broker %s has no FetchStream (%s; an older version?); fetching with unary calls for %.0f s",
            self.address,
            why,
            self.unary_for_s,
        )
        self._unary_until = time.monotonic() + self.unary_for_s
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise deadline_exceeded()
        response = await self._stub.Fetch(request, timeout=remaining)
        return response

    def end(self) -> None:
        """Cancel the open stream, if any (the next fetch opens a new one)."""
        stream, self._stream = self._stream, None
        if stream is not None:
            stream.cancel()


async def _exchange(
    stream: grpc.aio.StreamStreamCall, request: common_pb2.FetchRequest
) -> common_pb2.FetchResponse:
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
            details=f"the broker ended the FetchStream ({code.name}: {details})",
        )
    return cast(common_pb2.FetchResponse, response)


def deadline_exceeded() -> grpc.aio.AioRpcError:
    """What a unary call whose deadline passed raises, so a late stream answer fails the same way."""
    return grpc.aio.AioRpcError(
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.aio.Metadata(),
        grpc.aio.Metadata(),
        details="Deadline Exceeded",
    )
