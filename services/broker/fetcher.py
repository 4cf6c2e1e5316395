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
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import grpc

from clients.common.errors import InvariantViolation
from clients.common.transport.stream_calls import CallsOverStreams
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

    Fetch goes over one FetchStream (clients/common/transport/stream_calls.py: opened at the first
    Fetch, again after it breaks; each answer within its call's timeout, failing with the status a
    unary call would have got): a unary call costs the leader ~0.45 ms of CPU, a stream message
    ~0.17 ms (docs/ARCHITECTURE.md, section 6), and a follower fetches after every append. A leader
    that answers UNIMPLEMENTED (an older broker) is fetched from with unary calls, trying the stream
    again after limits.REPLICA_FETCH_STREAM_RETRY_S. OffsetsForLeaderEpoch, rare, stays unary.
    Calls come one at a time, from the fetcher's loop.
    """

    def __init__(self, address: str) -> None:
        self.address = address
        self._channel = open_channel(address, channel_options())
        self._stub = broker_pb2_grpc.BrokerServiceStub(self._channel)  # type: ignore[no-untyped-call]  # generated, unannotated
        # Calls come one at a time: one stream.
        self._fetches = CallsOverStreams(
            self._stub, "Fetch", address, streams_max=1, unary_for_s=limits.REPLICA_FETCH_STREAM_RETRY_S
        )

    @property
    def streams_opened(self) -> int:
        """For tests and logs: how many FetchStreams this endpoint began."""
        return self._fetches.streams_opened

    async def call(self, rpc: str, request: Any, timeout_s: float) -> Any:
        if rpc == "Fetch":
            return await self._fetches.call(request, timeout_s)
        if rpc == "OffsetsForLeaderEpoch":
            return await self._stub.OffsetsForLeaderEpoch(request, timeout=timeout_s)
        raise InvariantViolation(f"the leader endpoint has no RPC {rpc!r}")

    async def close(self) -> None:
        self._fetches.end()
        await self._channel.close()


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
