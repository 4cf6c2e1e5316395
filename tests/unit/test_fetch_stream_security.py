"""The security interceptor admits each FetchStream message as a unary Fetch (rules.UNARY_OVER_STREAM):
a real in-process grpc.aio server with mutual TLS, the SecurityInterceptor and the broker's servicer.

Follower fetches (replica_id >= 0) only from that very broker's certificate; consumer fetches
(replica_id -1) with per-topic Read ACLs, refused topics answered TOPIC_AUTHORIZATION_FAILED and
merged into the answer; quotas charged per message; a bearer token checked before every message;
a malformed message refused. Whatever a stream message gets, the unary Fetch gets too.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest
import pytest_asyncio

from protos.highwater.v1 import common_pb2
from services.security import rules
from services.security.authz import AclBinding, Authorizer
from services.security.certs import ensure_local_pki
from services.security.interceptor import SecurityInterceptor
from services.security.quotas import QuotaManager
from services.security.tls import TlsMaterial
from tests.unit.fetch_stream_seams import (
    EchoReplicas,
    answered,
    fetch_request,
    produce_request,
    produced,
    servicer,
)

FETCH = "/highwater.v1.BrokerService/Fetch"
FETCH_STREAM = "/highwater.v1.BrokerService/FetchStream"
PRODUCE = "/highwater.v1.BrokerService/Produce"
PRODUCE_STREAM = "/highwater.v1.BrokerService/ProduceStream"
CALL_TIMEOUT_S = 10.0
TOKEN = "hwt-test-token"
AUTH_FAILED = common_pb2.TOPIC_AUTHORIZATION_FAILED


@dataclass
class Verifier:
    """The interceptor's view of the security cache: ACLs, and one token until it is revoked."""

    authorizer: Authorizer
    tokens: dict[str, str] = field(default_factory=dict)

    def verify_token(self, token: str, now_ms: int) -> str | None:
        return self.tokens.get(token)


@dataclass
class Cluster:
    tls_dir: Path
    port: int
    token_port: int
    replicas: EchoReplicas
    verifier: Verifier
    servicer: Any

    def channel(self, name: str | None) -> grpc.aio.Channel:
        """A channel presenting `name`'s certificate (None: none, to the token port)."""
        tls = TlsMaterial.load(self.tls_dir, name, require_cert=name is not None)
        port = self.port if name is not None else self.token_port
        return grpc.aio.secure_channel(f"127.0.0.1:{port}", tls.channel_credentials())


@pytest.fixture(scope="module")
def tls_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return ensure_local_pki(tmp_path_factory.mktemp("tls"), ["broker-1", "broker-2", "broker-3", "alice"])


@pytest_asyncio.fixture
async def cluster(tls_dir: Path) -> AsyncIterator[Cluster]:
    """broker-1's BrokerService behind the interceptor: alice may Read topic t only; her fetches
    are limited to 20 kB/s with a burst of 1 s."""
    verifier = Verifier(
        Authorizer(
            [
                AclBinding.of("User:alice", "Read", "Topic", "t"),
                AclBinding.of("User:alice", "Write", "Topic", "t"),
            ]
        ),
        {TOKEN: "User:alice"},
    )
    interceptor = SecurityInterceptor(
        tls=True,
        cache=verifier,
        acl=True,
        limits=rules.Limits(),
        quotas=QuotaManager(fetch_bytes_per_s=20_000, burst_s=1.0),
    )
    replicas = EchoReplicas()
    server = grpc.aio.server(interceptors=[interceptor])
    from protos.highwater.v1 import broker_pb2_grpc

    leader = servicer(replicas)
    broker_pb2_grpc.add_BrokerServiceServicer_to_server(leader, server)  # type: ignore[no-untyped-call]
    tls = TlsMaterial.load(tls_dir, "broker-1")
    port = server.add_secure_port("127.0.0.1:0", tls.server_credentials(require_client_cert=True))
    token_port = server.add_secure_port("127.0.0.1:0", tls.server_credentials(require_client_cert=False))
    await server.start()
    try:
        yield Cluster(tls_dir, port, token_port, replicas, verifier, leader)
    finally:
        await server.stop(None)


def open_stream(channel: grpc.aio.Channel, *, token: str | None = None, raw: bool = False) -> Any:
    metadata = (("authorization", f"Bearer {token}"),) if token else None
    return channel.stream_stream(
        FETCH_STREAM,
        request_serializer=None if raw else common_pb2.FetchRequest.SerializeToString,
        response_deserializer=common_pb2.FetchResponse.FromString,
    )(timeout=CALL_TIMEOUT_S, metadata=metadata)


async def exchange(call: Any, request: Any) -> common_pb2.FetchResponse:
    await call.write(request)
    response: common_pb2.FetchResponse = await call.read()
    return response


async def unary_fetch(
    channel: grpc.aio.Channel, request: common_pb2.FetchRequest
) -> common_pb2.FetchResponse:
    method = channel.unary_unary(
        FETCH,
        request_serializer=common_pb2.FetchRequest.SerializeToString,
        response_deserializer=common_pb2.FetchResponse.FromString,
    )
    response: common_pb2.FetchResponse = await method(request, timeout=CALL_TIMEOUT_S)
    return response


async def refusal(call: Any, request: Any) -> grpc.aio.AioRpcError:
    """How the server ended a stream it refuses. A refusal from the call's headers alone (no
    credentials) can end the call before our message is written: then the write raises it, or
    finds the call already finished and the status is the call's own."""
    try:
        await call.write(request)
    except grpc.aio.AioRpcError as ended:
        return ended
    except asyncio.InvalidStateError:
        return grpc.aio.AioRpcError(
            await call.code(),
            await call.initial_metadata(),
            await call.trailing_metadata(),
            await call.details(),
        )
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await call.read()
    return refused.value


@pytest.mark.asyncio
async def test_a_follower_fetches_as_itself_and_is_refused_as_another_broker(cluster: Cluster) -> None:
    async with cluster.channel("broker-2") as channel:
        call = open_stream(channel)
        for offset in range(3):
            assert answered(await exchange(call, fetch_request(offset, replica_id=2))) == {"t": (0, offset)}
        refused = await refusal(call, fetch_request(3, replica_id=3))
        assert refused.code() == grpc.StatusCode.PERMISSION_DENIED
        assert "names broker 3 but the certificate is broker-2" in (refused.details() or "")
        # The unary Fetch refuses the same request the same way.
        with pytest.raises(grpc.aio.AioRpcError) as unary:
            await unary_fetch(channel, fetch_request(3, replica_id=3))
        assert (unary.value.code(), unary.value.details()) == (refused.code(), refused.details())
    assert [r.replica_id for r in cluster.replicas.seen] == [2, 2, 2], "nothing refused reached the servicer"


@pytest.mark.asyncio
async def test_a_consumer_without_read_gets_topic_authorization_failed_for_that_topic_only(
    cluster: Cluster,
) -> None:
    async with cluster.channel("alice") as channel:
        call = open_stream(channel)
        both = fetch_request(5, replica_id=-1, topics=("t", "secret"))
        got = await exchange(call, both)
        assert answered(got) == {"t": (0, 5), "secret": (AUTH_FAILED, -1)}
        assert [t.topic for t in cluster.replicas.seen[-1].topics] == ["t"], "the servicer saw t only"
        # Only refused topics: answered by the interceptor alone, and the stream goes on.
        seen = len(cluster.replicas.seen)
        only_secret = await exchange(call, fetch_request(6, replica_id=-1, topics=("secret",)))
        assert answered(only_secret) == {"secret": (AUTH_FAILED, -1)}
        assert len(cluster.replicas.seen) == seen
        assert answered(await exchange(call, fetch_request(7, replica_id=-1))) == {"t": (0, 7)}
        # A consumer's certificate cannot fetch as a follower, on the stream or not.
        refused = await refusal(call, fetch_request(8, replica_id=1))
        assert refused.code() == grpc.StatusCode.PERMISSION_DENIED
        unary = await unary_fetch(channel, both)
    assert answered(unary) == answered(got)
    assert unary.topics[1].partitions[0].error_message == got.topics[1].partitions[0].error_message


@pytest.mark.asyncio
async def test_a_producer_without_write_gets_topic_authorization_failed_on_the_stream_as_on_unary(
    cluster: Cluster,
) -> None:
    async with cluster.channel("alice") as channel:
        call = channel.stream_stream(
            PRODUCE_STREAM,
            request_serializer=common_pb2.ProduceRequest.SerializeToString,
            response_deserializer=common_pb2.ProduceResponse.FromString,
        )(timeout=CALL_TIMEOUT_S)
        both = produce_request(3, topics=("t", "secret"))
        got = await exchange(call, both)
        assert produced(got) == {"t": (0, 3), "secret": (AUTH_FAILED, -1)}
        assert [t.topic for t in cluster.replicas.produced[-1].topics] == ["t"], "the servicer saw t only"
        # Only refused topics: answered by the interceptor alone, and the stream goes on.
        only_secret = await exchange(call, produce_request(4, topics=("secret",)))
        assert produced(only_secret) == {"secret": (AUTH_FAILED, -1)}
        assert produced(await exchange(call, produce_request(5))) == {"t": (0, 5)}
        unary = await channel.unary_unary(
            PRODUCE,
            request_serializer=common_pb2.ProduceRequest.SerializeToString,
            response_deserializer=common_pb2.ProduceResponse.FromString,
        )(both, timeout=CALL_TIMEOUT_S)
    assert produced(unary) == produced(got)
    assert unary.topics[1].partitions[0].error_message == got.topics[1].partitions[0].error_message
    assert [[t.topic for t in r.topics] for r in cluster.replicas.produced] == [["t"], ["t"], ["t"]]


@pytest.mark.asyncio
async def test_a_consumers_stream_messages_are_charged_to_its_fetch_quota_as_unary_fetches(
    cluster: Cluster,
) -> None:
    cluster.replicas.delays.clear()
    big = fetch_request(0, replica_id=-1, topics=tuple(f"t{'x' * 9_000}" for _ in range(1)))
    # alice may not read that topic: the answer carries its ~9 kB name (and the refusal) back.
    async with cluster.channel("alice") as channel:
        call = open_stream(channel)
        throttles = [(await exchange(call, big)).throttle_time_ms for _ in range(4)]
    assert throttles[0] == 0, "within the burst"
    assert throttles[-1] > 0, f"past the 20 kB/s quota the answers say so: {throttles}"


@pytest.mark.asyncio
async def test_a_malformed_message_ends_the_stream_invalid_argument(cluster: Cluster) -> None:
    async with cluster.channel("broker-2") as channel:
        call = open_stream(channel, raw=True)
        assert answered(await exchange(call, fetch_request(0).SerializeToString())) == {"t": (0, 0)}
        refused = await refusal(call, b"\xff\xff\xff\xff garbage")
    assert refused.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert len(cluster.replicas.seen) == 1


@pytest.mark.asyncio
async def test_a_bearer_token_is_checked_before_every_message(cluster: Cluster) -> None:
    async with cluster.channel(None) as channel:
        call = open_stream(channel, token=TOKEN)
        assert answered(await exchange(call, fetch_request(0, replica_id=-1))) == {"t": (0, 0)}
        cluster.verifier.tokens.clear()  # revoked
        refused = await refusal(call, fetch_request(1, replica_id=-1))
    assert refused.code() == grpc.StatusCode.UNAUTHENTICATED
    assert len(cluster.replicas.seen) == 1


@pytest.mark.asyncio
async def test_an_idle_stream_ends_when_its_token_is_revoked(cluster: Cluster) -> None:
    async with cluster.channel(None) as channel:
        call = open_stream(channel, token=TOKEN)
        assert answered(await exchange(call, fetch_request(0, replica_id=-1))) == {"t": (0, 0)}
        cluster.verifier.tokens.clear()
        with pytest.raises(grpc.aio.AioRpcError) as ended:
            await asyncio.wait_for(call.read(), CALL_TIMEOUT_S)  # nothing sent: the re-check ends it
    assert ended.value.code() == grpc.StatusCode.UNAUTHENTICATED


@pytest.mark.asyncio
async def test_without_credentials_the_stream_is_refused(cluster: Cluster) -> None:
    async with cluster.channel(None) as channel:
        refused = await refusal(open_stream(channel), fetch_request(0, replica_id=-1))
    assert refused.code() == grpc.StatusCode.UNAUTHENTICATED
    assert cluster.replicas.seen == []


@pytest.mark.asyncio
async def test_a_stopping_broker_ends_an_idle_stream_waiting_in_the_interceptor(cluster: Cluster) -> None:
    # With security on, the interceptor (not the servicer) waits for the caller's next message.
    async with cluster.channel("broker-2") as channel:
        call = open_stream(channel)
        assert answered(await exchange(call, fetch_request(0))) == {"t": (0, 0)}
        cluster.servicer.end_streams()
        with pytest.raises(grpc.aio.AioRpcError) as ended:
            await asyncio.wait_for(call.read(), CALL_TIMEOUT_S)  # nothing sent: ended where it waits
        assert ended.value.code() == grpc.StatusCode.UNAVAILABLE
        refused = await refusal(open_stream(channel), fetch_request(1))
        assert refused.code() == grpc.StatusCode.UNAVAILABLE, "a new stream is refused"
    assert len(cluster.replicas.seen) == 1
