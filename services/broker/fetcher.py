"""The asyncio side of the broker core's tasks: gRPC to leaders and the controller, real sleeps.

The rules live in fetcher_core.py and core.py; this module only performs the steps
their tasks yield (services/broker/steps.py): `drive` runs one task to its end, and
`run_replica_fetcher` keeps one replica fetcher's loop going until it is stopped,
halting the broker on a broken invariant. The leader sits behind `GrpcLeaderEndpoint`
(the simulation's in-memory side is tests/sim/sim_broker.py).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import grpc

from clients.common.errors import InvariantViolation
from protos.highwater.v1 import broker_pb2_grpc
from services.broker.fetcher_core import FetcherCore
from services.broker.steps import AwaitWork, CallController, CallLeader, RpcFailed, Sleep, Step, Task
from services.common import limits
from services.common.server import channel_options, halt_on_invariant_violation
from services.security.channels import open_channel

log = logging.getLogger("highwater.fetcher")

R = TypeVar("R")
# Calls the active controller: (rpc name, request, timeout in seconds) -> response.
ControllerCall = Callable[[str, Any, float], Awaitable[Any]]


class GrpcLeaderEndpoint:
    """The leader broker a fetcher follows, over one gRPC channel.

    Fetch goes over one FetchStream (opened at the first Fetch, again after it breaks): a
    unary call costs the leader ~0.45 ms of CPU, a stream message ~0.1 ms (docs/ARCHITECTURE.md,
    section 6), and a follower fetches after every append. Each answer must arrive within the
    call's timeout, as the unary call's deadline demanded; a late or failed answer fails the
    call with the same status a unary call would have got and ends the stream, so the next
    call opens a new one (an answer still in flight can never be taken for a later request's).
    A leader that answers UNIMPLEMENTED (an older broker) is fetched from with unary calls,
    trying the stream again after limits.REPLICA_FETCH_STREAM_RETRY_S. OffsetsForLeaderEpoch,
    rare, stays unary. Calls come one at a time, from the fetcher's loop.
    """

    def __init__(self, address: str) -> None:
        self.address = address
        self._channel = open_channel(address, channel_options())
        self._stub = broker_pb2_grpc.BrokerServiceStub(self._channel)  # type: ignore[no-untyped-call]  # generated, unannotated
        self._stream: grpc.aio.StreamStreamCall | None = None
        # While time.monotonic() is below this, Fetch is unary: the leader had no FetchStream.
        self._unary_fetch_until = float("-inf")
        self.streams_opened = 0  # for tests and logs: how many FetchStreams this endpoint began

    async def call(self, rpc: str, request: Any, timeout_s: float) -> Any:
        if rpc == "Fetch":
            if time.monotonic() >= self._unary_fetch_until:
                return await self._fetch_over_stream(request, timeout_s)
            return await self._stub.Fetch(request, timeout=timeout_s)
        if rpc == "OffsetsForLeaderEpoch":
            return await self._stub.OffsetsForLeaderEpoch(request, timeout=timeout_s)
        raise InvariantViolation(f"the leader endpoint has no RPC {rpc!r}")

    async def _fetch_over_stream(self, request: Any, timeout_s: float) -> Any:
        deadline = time.monotonic() + timeout_s
        stream = self._stream
        if stream is None:
            # No deadline on the stream itself: each answer has its own (below).
            stream = self._stream = self._stub.FetchStream()
            self.streams_opened += 1
        try:
            async with asyncio.timeout(timeout_s):  # no task per call, unlike wait_for
                return await self._exchange(stream, request)
        except TimeoutError:
            self._end_stream()
            raise _deadline_exceeded() from None
        except grpc.aio.AioRpcError as exc:
            self._end_stream()
            if exc.code() != grpc.StatusCode.UNIMPLEMENTED:
                raise
        except BaseException:
            # A cancelled fetcher, or anything unforeseen: the stream's state is unknown.
            self._end_stream()
            raise
        # An older leader: nothing was served, so this same request goes as a unary call.
        log.info(
            "leader %s has no FetchStream (an older broker?); fetching with unary calls for %.0f s",
            self.address,
            limits.REPLICA_FETCH_STREAM_RETRY_S,
        )
        self._unary_fetch_until = time.monotonic() + limits.REPLICA_FETCH_STREAM_RETRY_S
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise _deadline_exceeded()
        return await self._stub.Fetch(request, timeout=remaining)

    @staticmethod
    async def _exchange(stream: grpc.aio.StreamStreamCall, request: Any) -> Any:
        """One request and its answer; the stream must carry one outstanding request at a time."""
        try:
            await stream.write(request)
        except asyncio.InvalidStateError:
            pass  # the call ended before this write (the leader's status is not read yet): read says why
        response = await stream.read()
        if response is grpc.aio.EOF:
            # The leader ended the stream without an error status (it never should while the call
            # is open): fail this call as a broken connection would.
            code = await stream.code()
            details = await stream.details()
            raise grpc.aio.AioRpcError(
                grpc.StatusCode.UNAVAILABLE if code == grpc.StatusCode.OK else code,
                grpc.aio.Metadata(),
                grpc.aio.Metadata(),
                details=f"the leader ended the FetchStream ({code.name}: {details})",
            )
        return response

    def _end_stream(self) -> None:
        stream, self._stream = self._stream, None
        if stream is not None:
            stream.cancel()

    async def close(self) -> None:
        self._end_stream()
        await self._channel.close()


def _deadline_exceeded() -> grpc.aio.AioRpcError:
    """What a unary call whose deadline passed raises, so a late stream answer fails the same way."""
    return grpc.aio.AioRpcError(
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.aio.Metadata(),
        grpc.aio.Metadata(),
        details="Deadline Exceeded",
    )


def _failure(exc: Exception) -> RpcFailed:
    if isinstance(exc, grpc.aio.AioRpcError):
        return RpcFailed(f"{exc.code().name}: {exc.details()}")
    return RpcFailed(f"{type(exc).__name__}: {exc}")


async def drive(
    task: Task[R],
    *,
    controller: ControllerCall | None = None,
    leader: GrpcLeaderEndpoint | None = None,
    wakeup: asyncio.Event | None = None,
) -> R:
    """Run a core task to its end, performing each step it yields."""
    answer: Any = None
    while True:
        try:
            step: Step = task.send(answer)
        except StopIteration as done:
            result: R = done.value  # StopIteration.value is Any; the generator's type says R
            return result
        answer = None
        if isinstance(step, Sleep):
            await asyncio.sleep(step.ms / 1000)
        elif isinstance(step, AwaitWork):
            if wakeup is None:
                await asyncio.sleep(step.timeout_ms / 1000)
                continue
            # The task checked for work just before yielding, on this same loop: a wake-up
            # cannot fall between that check and this clear().
            wakeup.clear()
            try:
                await asyncio.wait_for(wakeup.wait(), timeout=step.timeout_ms / 1000)
            except TimeoutError:
                pass
        elif isinstance(step, CallLeader):
            if leader is None:
                raise InvariantViolation(f"a task without a leader endpoint asked for {step.rpc}")
            try:
                answer = await leader.call(step.rpc, step.request, step.timeout_ms / 1000)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                answer = _failure(exc)
        elif isinstance(step, CallController):
            if controller is None:
                raise InvariantViolation(f"a task without a controller client asked for {step.rpc}")
            try:
                answer = await controller(step.rpc, step.request, step.timeout_ms / 1000)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                answer = _failure(exc)
        else:
            raise InvariantViolation(f"unknown task step {step!r}")


async def run_replica_fetcher(
    fetcher: FetcherCore, endpoint: GrpcLeaderEndpoint, wakeup: asyncio.Event
) -> None:
    """One replica fetcher's loop until it is stopped (cancelled); the channel closes with it."""
    try:
        while not fetcher.stopped:
            try:
                await drive(fetcher.run(), leader=endpoint, wakeup=wakeup)
            except InvariantViolation as exc:
                halt_on_invariant_violation(exc, f"replica fetcher for leader {fetcher.leader_id}")
            except asyncio.CancelledError:
                raise
            except Exception:
                # A bug outside any one partition: start the loop again after a back-off.
                log.exception("replica fetcher for leader %d failed; restarting it", fetcher.leader_id)
                await asyncio.sleep(fetcher.settings.backoff_ms / 1000)
    finally:
        await endpoint.close()
