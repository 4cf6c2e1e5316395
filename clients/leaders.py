"""Channels straight to partition leaders, as Kafka's clients talk to each partition's leader.

A Producer sends each Produce to the broker that Metadata names as the leader of its
partitions (the broker's own BrokerService.Produce: the same request, checks, ACLs
and quotas as through a gateway), which saves every record a second trip through a
gateway process. `LeaderConnections.call(address, method, request)` makes one such RPC.
Fetch and Produce go over the broker's FetchStream and ProduceStream
(clients/common/transport/stream_calls.py: the same answers, about half the leader's CPU per call
and half the round trip of a unary call): one Fetch stream per leader (a Consumer has one Fetch out
per leader), and up to PRODUCE_STREAMS_PER_LEADER_MAX Produce streams (one per request in flight).

Unlike GatewayConnection there is no failover to another address: no other broker
leads the partition. A broker that cannot be reached (no connection before the
connect bound, or the call ends UNAVAILABLE/CANCELLED because it stopped) raises
LeaderUnavailable, which is retriable and asks for new Metadata: the caller marks the
topic stale, and its next attempt goes to the new leader (or, while no leader is known,
through a gateway, which waits for the controller's election itself).

A leader that stops answering without failing the call (paused, overloaded, cut off)
would hold a request until its timeout (request_timeout_ms, 30 s); `unless_leader_moves`
gives the request up as soon as Metadata names another leader for one of its partitions,
so a client waits about the dead leader's lease instead.

Owned by one event loop, like GatewayConnection.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, TypeVar

import grpc

from clients.common.transport.channels import (
    UNREACHABLE_CODES,
    aio_channel,
    unreachable_reason,
    wait_connected,
)
from clients.common.transport.stream_calls import CallsOverStreams
from clients.common.transport.tls import ClientTls
from clients.common.types import TopicPartition
from clients.config import LEADER_MOVE_CHECK_AFTER_MS, LEADER_MOVE_CHECK_INTERVAL_MS, ConnectionConfig
from clients.connection import current_call_deadline, error_from_status
from clients.errors import ClientClosed, LeaderMoved, LeaderUnavailable, RequestTimedOut
from protos.highwater.v1 import broker_pb2_grpc

# How long a call waits for a connection to a leader that has none yet. A leader is one
# fixed broker: when it does not accept a connection this soon, new Metadata (a moved
# leadership, or the gateway's own wait for an election) is worth more than waiting on.
LEADER_CONNECT_TIMEOUT_MS_MAX = 2_000
# A broker that answered UNIMPLEMENTED to FetchStream or ProduceStream (older, during a rolling
# upgrade) gets unary calls this long before a stream is tried again.
STREAM_UNARY_FOR_S = 60.0
# Produce streams kept open per leader: the Producer's default max_in_flight_requests. A
# producer allowed more requests in flight sends the extra ones as unary calls.
PRODUCE_STREAMS_PER_LEADER_MAX = 5
# The methods carried over streams, and how many streams each keeps open per broker.
STREAMED_METHODS = {"Fetch": 1, "Produce": PRODUCE_STREAMS_PER_LEADER_MAX}


class LeaderConnections:
    """One channel per broker address, made on first use and kept until close()."""

    def __init__(
        self,
        *,
        request_timeout_ms: int,
        connect_timeout_ms: int,
        tls: ClientTls | None = None,
    ) -> None:
        self.request_timeout_ms = request_timeout_ms
        self.connect_timeout_ms = min(connect_timeout_ms, LEADER_CONNECT_TIMEOUT_MS_MAX)
        self.tls = tls
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._stubs: dict[str, broker_pb2_grpc.BrokerServiceStub] = {}
        self._streamed: dict[tuple[str, str], CallsOverStreams] = {}  # (address, method)
        # Kafka's KIP-219 per connection: a throttled answer mutes calls to that broker.
        self._throttled_until: dict[str, float] = {}
        self._closed = False

    @classmethod
    def from_config(cls, config: ConnectionConfig, tls: ClientTls | None) -> LeaderConnections:
        return cls(
            request_timeout_ms=config.request_timeout_ms,
            connect_timeout_ms=config.connect_timeout_ms,
            tls=tls,
        )

    def _stub(self, address: str) -> broker_pb2_grpc.BrokerServiceStub:
        stub = self._stubs.get(address)
        if stub is None:
            channel = aio_channel(address, self.tls)
            self._channels[address] = channel
            # The generated *_pb2_grpc stubs carry no annotations (pyproject.toml, [tool.mypy]).
            stub = broker_pb2_grpc.BrokerServiceStub(channel)  # type: ignore[no-untyped-call]
            self._stubs[address] = stub
            for method, streams_max in STREAMED_METHODS.items():
                self._streamed[(address, method)] = CallsOverStreams(
                    stub, method, address, streams_max=streams_max, unary_for_s=STREAM_UNARY_FOR_S
                )
        return stub

    async def call(
        self,
        address: str,
        method: str,
        request: Any,
        *,
        timeout_ms: int | None = None,
        deadline: float | None = None,
    ) -> Any:
        """Send `request` to BrokerService.`method` at `address` (a leader from Metadata).

        `timeout_ms` (default request_timeout_ms) bounds the RPC once connected; `deadline`
        (time.monotonic() seconds) and the enclosing `call_deadline` bound the whole call.
        Raises LeaderUnavailable, RequestTimedOut or another HighwaterError.
        """
        if self._closed:
            raise ClientClosed(f"connections to the partition leaders are closed ({method} to {address})")
        caller_deadline = current_call_deadline()
        if caller_deadline is not None:
            deadline = caller_deadline if deadline is None else min(deadline, caller_deadline)
        throttled_s = self._throttled_until.get(address, 0.0) - time.monotonic()
        if throttled_s > 0:
            if deadline is not None:
                throttled_s = min(throttled_s, max(0.0, deadline - time.monotonic()))
            await asyncio.sleep(throttled_s)
        stub = self._stub(address)
        connect_deadline = time.monotonic() + self.connect_timeout_ms / 1000
        if deadline is not None:
            connect_deadline = min(connect_deadline, deadline)
        why = await wait_connected(self._channels[address], connect_deadline)
        if why:
            if deadline is not None and time.monotonic() >= deadline:
                raise RequestTimedOut(
                    f"{method}: the caller's deadline passed before leader {address} connected"
                )
            raise LeaderUnavailable(f"{method}: leader {address} unusable: {why}")
        rpc_timeout_s = (timeout_ms if timeout_ms is not None else self.request_timeout_ms) / 1000
        if deadline is not None:
            rpc_timeout_s = max(0.0, min(rpc_timeout_s, deadline - time.monotonic()))
        try:
            streamed = self._streamed.get((address, method))
            if streamed is not None:
                response = await streamed.call(request, rpc_timeout_s)
            else:
                response = await getattr(stub, method)(request, timeout=rpc_timeout_s)
        except grpc.aio.AioRpcError as error:
            if error.code() in UNREACHABLE_CODES:
                raise LeaderUnavailable(
                    f"{method}: leader {address} unusable: {unreachable_reason(error)}"
                ) from None
            raise error_from_status(error, method, address, role="leader") from None
        throttle_ms = getattr(response, "throttle_time_ms", 0)
        if throttle_ms > 0:
            self._throttled_until[address] = max(
                self._throttled_until.get(address, 0.0), time.monotonic() + throttle_ms / 1000
            )
        return response

    async def close(self) -> None:
        """Close every channel; calls in flight end CANCELLED."""
        self._closed = True
        for streamed in self._streamed.values():
            streamed.end()
        channels, self._channels, self._stubs, self._streamed = list(self._channels.values()), {}, {}, {}
        for channel in channels:
            await channel.close(grace=None)


T = TypeVar("T")


async def unless_leader_moves(
    start_call: Callable[[], Awaitable[T]],
    *,
    rpc: str,
    destination: str,
    partitions: Iterable[TopicPartition],
    leader_address: Callable[[TopicPartition], str | None],
    refresh_topic: Callable[[str], None] | None,
    check_after_ms: int = LEADER_MOVE_CHECK_AFTER_MS,
) -> T:
    """Make and await the call `start_call()` (an `rpc` to leader `destination` about
    `partitions`), unless Metadata names another leader for one of them first: then
    LeaderMoved (retriable), and the call is cancelled. The call is made here, not by the
    caller: a task running this that is cancelled before it starts leaves no call made and
    never awaited.

    Nothing is asked while the call is younger than `check_after_ms` (far above a healthy
    answer; a long-poll Fetch adds its max wait); then `refresh_topic` is asked for each
    topic every LEADER_MOVE_CHECK_INTERVAL_MS (it bounds its own rate) and `leader_address`
    read. The caller must be able to send the request again at the new leader without harm:
    a Fetch, or idempotent Produce batches (the new leader answers a batch the old one had
    replicated as a duplicate).
    """
    partitions = list(partitions)
    started = time.monotonic()
    answer = asyncio.ensure_future(start_call())
    try:
        done, _ = await asyncio.wait({answer}, timeout=check_after_ms / 1000)
        while not done:
            moved = [tp for tp in partitions if leader_address(tp) not in (None, destination)]
            if moved:
                raise LeaderMoved(
                    f"{rpc} to {destination} unanswered for {(time.monotonic() - started) * 1000:.0f} ms "
                    f"and Metadata names another leader for {', '.join(map(str, moved))}"
                )
            if refresh_topic is not None:
                for topic in {tp.topic for tp in partitions}:
                    refresh_topic(topic)
            done, _ = await asyncio.wait({answer}, timeout=LEADER_MOVE_CHECK_INTERVAL_MS / 1000)
        return answer.result()
    finally:
        if not answer.done():
            answer.cancel()
