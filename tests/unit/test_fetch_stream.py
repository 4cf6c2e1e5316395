"""A follower fetches over one FetchStream (services/broker/fetcher.py, GrpcLeaderEndpoint) against
real in-process grpc.aio servers running the broker's servicer: one stream for many fetches, a
new one after it breaks or an answer is late (failing the call as a unary call would), unary
calls to a leader without FetchStream, and the stream ended by close()."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Generator
from types import SimpleNamespace
from typing import Any

import grpc
import pytest

from clients.common.transport import stream_calls
from protos.highwater.v1 import broker_pb2, broker_pb2_grpc, common_pb2
from services.broker import fetcher
from services.broker.fetcher import GrpcLeaderEndpoint, drive
from services.broker.steps import CallLeader, RpcFailed
from services.common.request_guard import MalformedRequestGuard
from tests.unit.fetch_stream_seams import (
    EchoReplicas,
    answered,
    fetch_request,
    produce_request,
    produced,
    servicer,
    serving,
    unary_fetch_only,
)

CALL_TIMEOUT_MS = 5_000
# Bounds every wait of these tests on something other than a call with its own timeout.
WAIT_S = 10.0


def one_call(rpc: str, request: Any, timeout_ms: int = CALL_TIMEOUT_MS) -> Generator[Any, Any, Any]:
    """A core task of one leader call: what the replica fetcher's loop yields, answer included."""
    answer = yield CallLeader(rpc, request, timeout_ms)  # type: ignore[arg-type]
    return answer


async def fetch(endpoint: GrpcLeaderEndpoint, offset: int, timeout_ms: int = CALL_TIMEOUT_MS) -> Any:
    """One Fetch as the fetcher's driver performs it: a response, or RpcFailed."""
    return await drive(one_call("Fetch", fetch_request(offset), timeout_ms), leader=endpoint)


@pytest.mark.asyncio
async def test_fetches_share_one_stream_and_each_answer_is_its_own_requests() -> None:
    replicas = EchoReplicas()
    async with serving(servicer(replicas), interceptors=[MalformedRequestGuard()]) as (_, port):
        endpoint = GrpcLeaderEndpoint(f"127.0.0.1:{port}")
        try:
            for offset in range(5):
                assert answered(await fetch(endpoint, offset)) == {"t": (0, offset)}
            epochs = await drive(
                one_call("OffsetsForLeaderEpoch", broker_pb2.OffsetsForLeaderEpochRequest(replica_id=2)),
                leader=endpoint,
            )
            assert isinstance(epochs, broker_pb2.OffsetsForLeaderEpochResponse), "stays unary"
        finally:
            await endpoint.close()
    assert endpoint.streams_opened == 1
    assert [r.topics[0].partitions[0].fetch_offset for r in replicas.seen] == [0, 1, 2, 3, 4]


@pytest.mark.asyncio
async def test_a_broken_stream_fails_its_call_and_the_next_call_opens_a_new_stream() -> None:
    replicas = EchoReplicas()
    replicas.fail.add(1)
    async with serving(servicer(replicas)) as (_, port):
        endpoint = GrpcLeaderEndpoint(f"127.0.0.1:{port}")
        try:
            assert answered(await fetch(endpoint, 0)) == {"t": (0, 0)}
            broken = await fetch(endpoint, 1)
            assert isinstance(broken, RpcFailed) and broken.reason.startswith("UNKNOWN: "), broken
            assert answered(await fetch(endpoint, 2)) == {"t": (0, 2)}
        finally:
            await endpoint.close()
    assert endpoint.streams_opened == 2


@pytest.mark.asyncio
async def test_a_leader_restart_breaks_the_stream_and_fetching_resumes_on_a_new_one() -> None:
    replicas = EchoReplicas()
    async with serving(servicer(replicas)) as (server, port):
        endpoint = GrpcLeaderEndpoint(f"127.0.0.1:{port}")
        try:
            assert answered(await fetch(endpoint, 0)) == {"t": (0, 0)}
            await server.stop(None)
            failed = await fetch(endpoint, 1, timeout_ms=1_000)
            assert isinstance(failed, RpcFailed), failed
            async with serving(servicer(replicas), port=port):
                deadline = asyncio.get_running_loop().time() + WAIT_S
                while True:  # the channel reconnects with its back-off (at most 1 s)
                    answer = await fetch(endpoint, 2, timeout_ms=1_000)
                    if not isinstance(answer, RpcFailed):
                        break
                    assert asyncio.get_running_loop().time() < deadline, answer
                    await asyncio.sleep(0.05)
                assert answered(answer) == {"t": (0, 2)}
                assert answered(await fetch(endpoint, 3)) == {"t": (0, 3)}
        finally:
            await endpoint.close()
    assert endpoint.streams_opened >= 2


@pytest.mark.asyncio
async def test_a_late_answer_fails_the_call_as_a_unary_deadline_does_and_is_never_taken_for_the_next() -> (
    None
):
    replicas = EchoReplicas()
    replicas.delays[7] = 1.0
    async with serving(servicer(replicas)) as (_, port):
        endpoint = GrpcLeaderEndpoint(f"127.0.0.1:{port}")
        try:
            assert answered(await fetch(endpoint, 6)) == {"t": (0, 6)}
            late = await fetch(endpoint, 7, timeout_ms=200)
            # The same RpcFailed the unary call gives when its deadline passes.
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                unary = channel.unary_unary(
                    "/highwater.v1.BrokerService/Fetch",
                    request_serializer=common_pb2.FetchRequest.SerializeToString,
                    response_deserializer=common_pb2.FetchResponse.FromString,
                )
                with pytest.raises(grpc.aio.AioRpcError) as unary_late:
                    await unary(fetch_request(7), timeout=0.2)
            assert (
                late
                == fetcher._failure(unary_late.value)
                == RpcFailed("DEADLINE_EXCEEDED: Deadline Exceeded")
            )
            assert answered(await fetch(endpoint, 8)) == {"t": (0, 8)}
        finally:
            await endpoint.close()
    assert endpoint.streams_opened == 2


@pytest.mark.asyncio
async def test_a_leader_without_fetch_stream_is_fetched_with_unary_calls_and_the_stream_tried_again_later(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    replicas = EchoReplicas()
    async with serving(unary_fetch_only(replicas)) as (_, port):
        endpoint = GrpcLeaderEndpoint(f"127.0.0.1:{port}")
        try:
            for offset in range(3):
                assert answered(await fetch(endpoint, offset)) == {"t": (0, offset)}
            assert endpoint.streams_opened == 1, "UNIMPLEMENTED once, then unary calls"
            later = fetcher.limits.REPLICA_FETCH_STREAM_RETRY_S + 1
            monkeypatch.setattr(
                stream_calls, "time", SimpleNamespace(monotonic=lambda: time.monotonic() + later)
            )
            assert answered(await fetch(endpoint, 3)) == {"t": (0, 3)}
            assert endpoint.streams_opened == 2, "tried again once the retry period passed"
        finally:
            await endpoint.close()
    # The refused stream served nothing: each request was answered once, by a unary call.
    assert [r.topics[0].partitions[0].fetch_offset for r in replicas.seen] == [0, 1, 2, 3]


@pytest.mark.asyncio
async def test_close_ends_the_stream_on_the_leader() -> None:
    replicas = EchoReplicas()
    ended = asyncio.Event()
    async with serving(servicer(replicas, ended)) as (_, port):
        endpoint = GrpcLeaderEndpoint(f"127.0.0.1:{port}")
        assert answered(await fetch(endpoint, 0)) == {"t": (0, 0)}
        assert not ended.is_set()
        await endpoint.close()
        await asyncio.wait_for(ended.wait(), WAIT_S)


def raw_stream(channel: grpc.aio.Channel, method: str, response_type: Any) -> Any:
    """A BrokerService stream `method` whose messages are written as bytes (so a test can
    send what does not parse) and whose answers are read as `response_type`."""
    return channel.stream_stream(
        f"/highwater.v1.BrokerService/{method}",
        request_serializer=None,
        response_deserializer=response_type.FromString,
    )(timeout=WAIT_S)


@pytest.mark.asyncio
async def test_a_malformed_stream_message_is_invalid_argument_without_the_security_layer() -> None:
    replicas = EchoReplicas()
    async with (
        serving(servicer(replicas), interceptors=[MalformedRequestGuard()]) as (_, port),
        grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel,
    ):
        call = raw_stream(channel, "FetchStream", common_pb2.FetchResponse)
        await call.write(fetch_request(0).SerializeToString())
        assert answered(await call.read()) == {"t": (0, 0)}
        await call.write(b"\xff\xff\xff\xff garbage")
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await call.read()
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert len(replicas.seen) == 1


@pytest.mark.asyncio
async def test_a_produce_stream_refuses_what_the_unary_produce_refuses_and_ends() -> None:
    replicas = EchoReplicas()
    async with (
        serving(servicer(replicas), interceptors=[MalformedRequestGuard()]) as (_, port),
        grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel,
    ):
        for bad, why in ((b"\xff\xff\xff\xff garbage", "does not parse"), (None, "acks must be")):
            call = raw_stream(channel, "ProduceStream", common_pb2.ProduceResponse)
            await call.write(produce_request(0).SerializeToString())
            assert produced(await call.read()) == {"t": (0, 0)}
            if bad is None:
                wrong_acks = produce_request(1)
                wrong_acks.acks = 2
                bad = wrong_acks.SerializeToString()
            await call.write(bad)
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await call.read()
            assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert why in (refused.value.details() or "")
    assert len(replicas.produced) == 2, "nothing refused reached the replicas"


@pytest.mark.asyncio
async def test_a_stopping_broker_ends_its_open_fetch_streams_and_refuses_new_ones() -> None:
    # Otherwise the followers' idle streams would hold the server's stop for its grace period.
    replicas = EchoReplicas()
    ended = asyncio.Event()
    leader = servicer(replicas, ended)
    async with serving(leader) as (_, port):
        endpoint = GrpcLeaderEndpoint(f"127.0.0.1:{port}")
        try:
            assert answered(await fetch(endpoint, 0)) == {"t": (0, 0)}
            leader.end_streams()
            await asyncio.wait_for(ended.wait(), WAIT_S)
            failed = await fetch(endpoint, 1)
            stopping = RpcFailed("UNAVAILABLE: the broker is stopping: stream ended")
            assert failed == stopping
            assert await fetch(endpoint, 2) == stopping, "a new stream is refused too"
        finally:
            await endpoint.close()
    assert len(replicas.seen) == 1


@pytest.mark.asyncio
async def test_produces_in_flight_share_up_to_streams_max_streams_reused_and_the_rest_go_unary() -> None:
    replicas = EchoReplicas()
    replicas.produce_delay_s = 0.2  # all three are out at once
    async with serving(servicer(replicas)) as (_, port):
        channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
        stub = broker_pb2_grpc.BrokerServiceStub(channel)  # type: ignore[no-untyped-call]
        calls = stream_calls.CallsOverStreams(stub, "Produce", "leader", streams_max=2, unary_for_s=60)
        try:
            answers = await asyncio.gather(*(calls.call(produce_request(p), WAIT_S) for p in range(3)))
            assert [produced(a) for a in answers] == [{"t": (0, p)} for p in range(3)]
            assert calls.streams_opened == 2, "two streams; the third produce went as a unary call"
            replicas.produce_delay_s = 0.0
            for p in range(3, 6):
                assert produced(await calls.call(produce_request(p), WAIT_S)) == {"t": (0, p)}
            assert calls.streams_opened == 2, "the open streams are reused"
        finally:
            calls.end()
            await channel.close()
    assert sorted(r.topics[0].partitions[0].partition for r in replicas.produced) == list(range(6))
