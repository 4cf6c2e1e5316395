"""The I/O steps of the broker core's tasks: what a driver does on the core's behalf.

The broker core (services/broker/core.py, fetcher_core.py) never sends, sleeps or
waits. A task of the core (a replica fetcher's loop, an AlterPartition with its
retries, a controlled shutdown) is a generator: it yields one of the steps below
and is resumed with the answer (`send(answer)`). Two drivers run the same tasks:
the asyncio one (services/broker/replica_manager.py: gRPC stubs, asyncio.sleep)
and the simulation's (tests/sim/sim_broker.py: simulated network and clock). An
RPC that failed as a whole (unreachable, timed out, refused) comes back as
`RpcFailed`; a step that waits comes back with None.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

R = TypeVar("R")


@dataclass(frozen=True, slots=True)
class Sleep:
    """Resume after ms milliseconds."""

    ms: int


@dataclass(frozen=True, slots=True)
class AwaitWork:
    """Resume when the task's owner calls its `wake` (new work), or after timeout_ms."""

    timeout_ms: int


@dataclass(frozen=True, slots=True)
class CallLeader:
    """An RPC to the leader broker a replica fetcher follows (its LeaderEndpoint)."""

    rpc: Literal["Fetch", "OffsetsForLeaderEpoch"]
    request: Any
    timeout_ms: int


@dataclass(frozen=True, slots=True)
class CallController:
    """An RPC to the active controller, wherever etcd says it is."""

    rpc: Literal["AlterPartition", "ControlledShutdown"]
    request: Any
    timeout_ms: int


@dataclass(frozen=True, slots=True)
class RpcFailed:
    """The answer to a call that got no response: what went wrong, for the log."""

    reason: str


Step = Sleep | AwaitWork | CallLeader | CallController
# A task: yields steps, is resumed with their answers (a response message, RpcFailed or None).
Task = Generator[Step, Any, R]


def run_to_completion(slices: Generator[None, None, R]) -> R:
    """Run a sliced core call (one that yields between slices of work) without pausing."""
    while True:
        try:
            next(slices)
        except StopIteration as done:
            result: R = done.value  # StopIteration.value is Any; the generator's type says R
            return result


def run_at_once(fn: Callable[[], None], then: Callable[[BaseException | None], None]) -> None:
    """BrokerIO.run_blocking for a driver without threads (the simulation, unit seams): fn now,
    then `then` with its exception or None."""
    try:
        fn()
    except Exception as exc:
        then(exc)
        return
    then(None)
