"""Every streaming RPC is checked on its messages, as its unary counterpart would be (issue 37).

A real in-process grpc.aio server with mutual TLS and the SecurityInterceptor, serving every
streaming method of the broker, controller and gateway protos with a recording handler: what
a refused message would have made a servicer do, it must never see. Per method, a caller with
the wrong identity (a client certificate without ACLs, another broker's certificate, a broker's
certificate on a controller's stream) or without the ACL is refused PERMISSION_DENIED with a
message naming the rule, or answered TOPIC_AUTHORIZATION_FAILED where the unary call's rule
answers so; the right identity is served.

Before issue 37 the interceptor admitted client streams before any message arrived and skipped
the rule for want of a request: any certificate of the cluster's CA could hold BrokerHeartbeat
as broker 1, which kept a killed broker 1 "connected" until its lease expired.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest
import pytest_asyncio
from google.protobuf import message_factory  # type: ignore[import-untyped]
from google.protobuf.descriptor import MethodDescriptor  # type: ignore[import-untyped]
from google.protobuf.message import Message  # type: ignore[import-untyped]

from protos.highwater.v1 import broker_pb2, common_pb2, controller_pb2, gateway_pb2
from services.security import rules
from services.security.authz import AclBinding, Authorizer
from services.security.certs import ensure_local_pki
from services.security.interceptor import SecurityInterceptor
from services.security.tls import TlsMaterial

CALL_TIMEOUT_S = 10.0
AUTH_FAILED = common_pb2.TOPIC_AUTHORIZATION_FAILED
STREAMING: dict[str, MethodDescriptor] = {
    f"/{svc.full_name}/{m.name}": m
    for module in (broker_pb2, controller_pb2, gateway_pb2)
    for svc in module.DESCRIPTOR.services_by_name.values()
    for m in svc.methods
    if m.client_streaming or m.server_streaming
}
BROKER_HEARTBEAT = "/highwater.v1.ControllerService/BrokerHeartbeat"
STANDBY_HEARTBEAT = "/highwater.v1.ControllerService/StandbyHeartbeat"
FETCH_STREAM = "/highwater.v1.BrokerService/FetchStream"
PRODUCE_STREAM = "/highwater.v1.BrokerService/ProduceStream"
SUBSCRIBE = "/highwater.v1.GatewayService/Subscribe"
CONSUME_RECORDS = "/highwater.v1.GatewayService/ConsumeRecords"
CERTIFICATES = ["controller-1", "controller-2", "controller", "broker-1", "broker-2", "gateway-1", "alice"]


def message_class(descriptor: Any) -> type[Message]:
    cls: type[Message] = message_factory.GetMessageClass(descriptor)
    return cls


@dataclass
class Verifier:
    """The interceptor's view of the security cache: alice may Read and Write topic t and Read group g."""

    authorizer: Authorizer = field(
        default_factory=lambda: Authorizer(
            [
                AclBinding.of("User:alice", "Read", "Topic", "t"),
                AclBinding.of("User:alice", "Write", "Topic", "t"),
                AclBinding.of("User:alice", "Read", "Group", "g"),
            ]
        )
    )

    def verify_token(self, token: str, now_ms: int) -> str | None:
        return None


@dataclass
class Server:
    tls_dir: Path
    port: int
    # (method, request) for every message a handler read.
    seen: list[tuple[str, Message]]

    def channel(self, name: str) -> grpc.aio.Channel:
        tls = TlsMaterial.load(self.tls_dir, name)
        return grpc.aio.secure_channel(f"127.0.0.1:{self.port}", tls.channel_credentials())

    def seen_by(self, method: str) -> list[Message]:
        return [request for m, request in self.seen if m == method]


def recording_handler(path: str, method: MethodDescriptor, seen: list[tuple[str, Message]]) -> Any:
    """A servicer method that notes every request it reads and answers each with an empty response."""
    request_cls, response_cls = message_class(method.input_type), message_class(method.output_type)
    codec = {
        "request_deserializer": request_cls.FromString,
        "response_serializer": response_cls.SerializeToString,
    }
    if method.client_streaming:

        async def stream(requests: AsyncIterator[Message], context: grpc.aio.ServicerContext) -> Any:
            async for request in requests:
                seen.append((path, request))
                yield response_cls()

        return grpc.stream_stream_rpc_method_handler(stream, **codec)

    async def unary_stream(request: Message, context: grpc.aio.ServicerContext) -> Any:
        seen.append((path, request))
        yield response_cls()

    return grpc.unary_stream_rpc_method_handler(unary_stream, **codec)


@pytest.fixture(scope="module")
def tls_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return ensure_local_pki(tmp_path_factory.mktemp("tls"), CERTIFICATES)


@pytest_asyncio.fixture
async def server(tls_dir: Path) -> AsyncIterator[Server]:
    """Every streaming method behind the interceptor (TLS identities and ACLs on)."""
    seen: list[tuple[str, Message]] = []
    server = grpc.aio.server(
        interceptors=[
            SecurityInterceptor(tls=True, cache=Verifier(), acl=True, limits=rules.Limits(), quotas=None)
        ]
    )
    by_service: dict[str, dict[str, Any]] = {}
    for path, method in STREAMING.items():
        by_service.setdefault(method.containing_service.full_name, {})[method.name] = recording_handler(
            path, method, seen
        )
    server.add_generic_rpc_handlers(
        [grpc.method_handlers_generic_handler(name, handlers) for name, handlers in by_service.items()]
    )
    tls = TlsMaterial.load(tls_dir, "controller-1")
    port = server.add_secure_port("127.0.0.1:0", tls.server_credentials(require_client_cert=True))
    await server.start()
    try:
        yield Server(tls_dir, port, seen)
    finally:
        await server.stop(None)


async def exchange(server: Server, certificate: str, path: str, *requests: Message) -> list[Any]:
    """Send requests on path as `certificate`: the answers, then the AioRpcError that ended the call
    (if one did). A client stream sends each request after the answer to the one before."""
    method = STREAMING[path]
    request_cls, response_cls = message_class(method.input_type), message_class(method.output_type)
    got: list[Any] = []
    async with server.channel(certificate) as channel:
        try:
            if method.client_streaming:
                call = channel.stream_stream(
                    path,
                    request_serializer=request_cls.SerializeToString,
                    response_deserializer=response_cls.FromString,
                )(timeout=CALL_TIMEOUT_S)
                for request in requests:
                    await call.write(request)
                    got.append(await call.read())
                await call.done_writing()
            else:
                (request,) = requests
                call = channel.unary_stream(
                    path,
                    request_serializer=request_cls.SerializeToString,
                    response_deserializer=response_cls.FromString,
                )(request, timeout=CALL_TIMEOUT_S)
                got.extend([answer async for answer in call])
        except grpc.aio.AioRpcError as exc:
            got.append(exc)
    return got


def denied(got: list[Any], *needles: str) -> grpc.aio.AioRpcError:
    """The call's end, which must be PERMISSION_DENIED with each needle in its details."""
    assert got and isinstance(got[-1], grpc.aio.AioRpcError), got
    end: grpc.aio.AioRpcError = got[-1]
    assert end.code() == grpc.StatusCode.PERMISSION_DENIED, (end.code(), end.details())
    for needle in needles:
        assert needle in (end.details() or ""), (needle, end.details())
    return end


def beat(broker_id: int) -> controller_pb2.BrokerHeartbeatRequest:
    return controller_pb2.BrokerHeartbeatRequest(broker_id=broker_id, broker_epoch=42)


def fetch(replica_id: int) -> common_pb2.FetchRequest:
    return common_pb2.FetchRequest(
        replica_id=replica_id,
        topics=[common_pb2.FetchTopic(topic="t", partitions=[common_pb2.FetchPartition(partition=0)])],
    )


def produce(topic: str) -> common_pb2.ProduceRequest:
    return common_pb2.ProduceRequest(
        acks=-1,
        timeout_ms=100,
        topics=[
            common_pb2.ProduceTopicData(
                topic=topic, partitions=[common_pb2.ProducePartitionData(partition=0, records=b"")]
            )
        ],
    )


# --- one case per streaming method: the wrong identity (or ACL) is refused before the servicer ----


@dataclass(frozen=True)
class WrongIdentity:
    """certificate sends request on path; check(answers) holds, and the servicer saw nothing."""

    path: str
    certificate: str
    request: Message
    check: Callable[[list[Any]], object]


WRONG_IDENTITY = [
    # A client certificate without ACLs holding broker 1's liveness stream (the reviewer's case).
    WrongIdentity(
        BROKER_HEARTBEAT,
        "alice",
        beat(1),
        lambda got: denied(got, "BrokerHeartbeat is only accepted from broker certificates", "User:alice"),
    ),
    # Another broker's certificate naming broker 1.
    WrongIdentity(
        BROKER_HEARTBEAT,
        "broker-2",
        beat(1),
        lambda got: denied(got, "BrokerHeartbeat names broker 1 but the certificate is broker-2"),
    ),
    WrongIdentity(
        BROKER_HEARTBEAT,
        "controller-1",
        beat(1),
        lambda got: denied(got, "BrokerHeartbeat is only accepted from broker certificates"),
    ),
    WrongIdentity(
        STANDBY_HEARTBEAT,
        "alice",
        controller_pb2.StandbyHeartbeatRequest(controller_id=2),
        lambda got: denied(got, "StandbyHeartbeat is only accepted from controller certificates"),
    ),
    WrongIdentity(
        STANDBY_HEARTBEAT,
        "broker-1",
        controller_pb2.StandbyHeartbeatRequest(controller_id=2),
        lambda got: denied(got, "StandbyHeartbeat is only accepted from controller certificates"),
    ),
    WrongIdentity(
        STANDBY_HEARTBEAT,
        "gateway-1",
        controller_pb2.StandbyHeartbeatRequest(controller_id=2),
        lambda got: denied(got, "StandbyHeartbeat is only accepted from controller certificates"),
    ),
    # Replication: a follower fetch only from the certificate of the broker it names.
    WrongIdentity(
        FETCH_STREAM,
        "broker-2",
        fetch(replica_id=1),
        lambda got: denied(got, "Fetch with replica id 1 names broker 1 but the certificate is broker-2"),
    ),
    WrongIdentity(
        FETCH_STREAM,
        "alice",
        fetch(replica_id=1),
        lambda got: denied(got, "Fetch with replica id 1 is only accepted from broker certificates"),
    ),
    # Data-plane streams answer a refused topic as their unary calls do.
    WrongIdentity(
        PRODUCE_STREAM,
        "alice",
        produce("secret"),
        lambda got: (
            [(t.topic, p.error_code) for t in got[0].topics for p in t.partitions]
            == [("secret", AUTH_FAILED)]
        ),
    ),
    WrongIdentity(
        SUBSCRIBE,
        "alice",
        gateway_pb2.SubscribeRequest(
            partitions=[gateway_pb2.SubscribePartition(topic="secret", partition=0)]
        ),
        lambda got: [(a.topic, a.error_code) for a in got] == [("secret", AUTH_FAILED)],
    ),
    WrongIdentity(
        CONSUME_RECORDS,
        "alice",
        gateway_pb2.ConsumeRecordsRequest(topic="t", group_id="not-g"),
        lambda got: denied(got, "may not Read Group 'not-g' (ConsumeRecords"),
    ),
]


def test_every_streaming_method_of_the_protos_has_a_wrong_identity_case() -> None:
    """A new streaming RPC needs its case here (and its rule in rules.RULES)."""
    assert {case.path for case in WRONG_IDENTITY} == set(STREAMING)


@pytest.mark.asyncio
@pytest.mark.parametrize(
    "case", WRONG_IDENTITY, ids=[f"{c.path.rsplit('/', 1)[1]}-as-{c.certificate}" for c in WRONG_IDENTITY]
)
async def test_a_stream_with_the_wrong_identity_is_refused_before_its_servicer_sees_it(
    server: Server, case: WrongIdentity
) -> None:
    got = await exchange(server, case.certificate, case.path, case.request)
    assert case.check(got), got
    assert server.seen == [], "the servicer saw a refused message"


# --- the right identity is served; a later message is checked as the first -----------------------


@pytest.mark.asyncio
async def test_a_broker_holds_its_own_heartbeat_and_a_later_message_naming_another_broker_ends_it(
    server: Server,
) -> None:
    got = await exchange(server, "broker-1", BROKER_HEARTBEAT, beat(1), beat(1), beat(2))
    assert got[:2] == [controller_pb2.BrokerHeartbeatResponse()] * 2
    denied(got, "BrokerHeartbeat names broker 2 but the certificate is broker-1")
    assert server.seen_by(BROKER_HEARTBEAT) == [beat(1), beat(1)], "the servicer never saw broker 2 named"


@pytest.mark.asyncio
@pytest.mark.parametrize("certificate", ["controller-2", "controller"])
async def test_any_controller_certificate_holds_a_standby_heartbeat(server: Server, certificate: str) -> None:
    """controller_id only names the standby in logs; a plain "controller" certificate has no id."""
    request = controller_pb2.StandbyHeartbeatRequest(controller_id=2)
    got = await exchange(server, certificate, STANDBY_HEARTBEAT, request)
    assert got == [controller_pb2.StandbyHeartbeatResponse()]
    assert server.seen_by(STANDBY_HEARTBEAT) == [request]


@pytest.mark.asyncio
async def test_a_heartbeat_that_does_not_parse_is_invalid_argument_before_the_servicer(
    server: Server,
) -> None:
    async with server.channel("broker-1") as channel:
        call = channel.stream_stream(BROKER_HEARTBEAT)(timeout=CALL_TIMEOUT_S)
        await call.write(b"\xff\xff\xff\xff garbage")
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await call.read()
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "BrokerHeartbeat" in (refused.value.details() or "")
    assert server.seen == []


@pytest.mark.asyncio
async def test_a_stream_closed_before_its_first_message_reaches_its_servicer_empty(server: Server) -> None:
    async with server.channel("broker-1") as channel:
        call = channel.stream_stream(BROKER_HEARTBEAT)(timeout=CALL_TIMEOUT_S)
        await call.done_writing()
        assert await call.read() == grpc.aio.EOF
        assert await call.code() == grpc.StatusCode.OK
    assert server.seen == []
