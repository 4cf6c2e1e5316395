"""The Kafka listener's socket side (services/kafka/listener.py) on loopback with a fake backend:
answers in request order while a slow request is in progress, no answer for acks=0, the request
size bound, and connections closed for bytes that are not a request."""

from __future__ import annotations

import asyncio
import datetime
import struct
from typing import Any

import pytest

from protos.highwater.v1 import common_pb2
from services.kafka import protocol
from services.kafka.handler import KafkaHandler
from services.kafka.listener import KafkaListener
from tests.unit.test_kafka_protocol import FakeBackend, module_of, request_frame

WAIT_S = 5.0


class SlowFetchBackend(FakeBackend):
    """Fetch waits until released, as a long poll does."""

    def __init__(self) -> None:
        super().__init__()
        self.release = asyncio.Event()

    async def fetch(self, req: common_pb2.FetchRequest) -> common_pb2.FetchResponse:
        await self.release.wait()
        return await super().fetch(req)


def fetch_body() -> Any:
    cls = protocol.request_class(protocol.FETCH, 12)
    mod = module_of(cls)
    return cls(
        max_wait=datetime.timedelta(milliseconds=500),
        min_bytes=1,
        topics=(
            mod.FetchTopic(
                topic="t",
                partitions=(mod.FetchPartition(partition=0, fetch_offset=0, partition_max_bytes=1),),
            ),
        ),
        forgotten_topics_data=(),
    )


def produce_body(acks: int) -> Any:
    cls = protocol.request_class(protocol.PRODUCE, 9)
    mod = module_of(cls)
    return cls(
        transactional_id=None,
        acks=acks,
        timeout=datetime.timedelta(seconds=1),
        topic_data=(
            mod.TopicProduceData(name="t", partition_data=(mod.PartitionProduceData(index=0, records=b"b"),)),
        ),
    )


def api_versions_body() -> Any:
    return protocol.build(
        protocol.request_class(protocol.API_VERSIONS, 3),
        client_software_name="x",
        client_software_version="1",
    )


async def read_answer(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    (size,) = struct.unpack(">i", await asyncio.wait_for(reader.readexactly(4), WAIT_S))
    frame = await asyncio.wait_for(reader.readexactly(size), WAIT_S)
    (correlation_id,) = struct.unpack_from(">i", frame)
    return correlation_id, frame


def framed(frame: bytes) -> bytes:
    return struct.pack(">i", len(frame)) + frame


async def with_listener(backend: FakeBackend, test: Any, **bounds: int) -> None:
    listener = KafkaListener(KafkaHandler(backend), "127.0.0.1", 0, **bounds)
    port = await listener.start()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        await test(reader, writer)
    finally:
        writer.close()
        await listener.close()


def test_answers_leave_in_request_order_and_acks_zero_gets_none():
    backend = SlowFetchBackend()

    async def test(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(framed(request_frame(protocol.FETCH, 12, fetch_body(), correlation_id=1)))
        writer.write(framed(request_frame(protocol.PRODUCE, 9, produce_body(0), correlation_id=2)))
        writer.write(framed(request_frame(protocol.PRODUCE, 9, produce_body(-1), correlation_id=3)))
        await writer.drain()
        await asyncio.sleep(0.2)
        assert len(backend.produced) == 2, "the produces ran while the fetch waited"
        backend.release.set()
        first, _ = await read_answer(reader)
        second, _ = await read_answer(reader)
        assert (first, second) == (1, 3), "in request order; acks=0 (2) answered with nothing"

    asyncio.run(with_listener(backend, test))


def test_a_request_over_the_size_bound_closes_the_connection():
    async def test(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(struct.pack(">i", 1025) + b"\0" * 16)
        await writer.drain()
        assert await asyncio.wait_for(reader.read(), WAIT_S) == b"", "closed without an answer"

    asyncio.run(with_listener(FakeBackend(), test, request_bytes_max=1024))


@pytest.mark.parametrize(
    "frame",
    [
        struct.pack(">hhi", protocol.FETCH, 99, 1) + b"\0\0",  # a version not served
        struct.pack(">hhi", protocol.METADATA, 12, 1) + b"\xff\xff\xff",  # a body that cannot be read
    ],
)
def test_unanswerable_requests_close_the_connection(frame: bytes):
    async def test(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(framed(frame))
        await writer.drain()
        assert await asyncio.wait_for(reader.read(), WAIT_S) == b""

    asyncio.run(with_listener(FakeBackend(), test))


def test_api_versions_at_an_unknown_version_is_answered_in_v0():
    async def test(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(framed(struct.pack(">hhi", protocol.API_VERSIONS, 77, 9) + b"\0\0anything"))
        await writer.drain()
        correlation_id, frame = await read_answer(reader)
        assert correlation_id == 9
        (error_code,) = struct.unpack_from(">h", frame, 4)
        assert error_code == 35, "UNSUPPORTED_VERSION"
        # The connection stays usable: the client asks again with a version it now knows.
        writer.write(framed(request_frame(protocol.API_VERSIONS, 3, api_versions_body(), correlation_id=10)))
        await writer.drain()
        assert (await read_answer(reader))[0] == 10

    asyncio.run(with_listener(FakeBackend(), test))


def test_an_idle_connection_is_closed():
    async def test(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        assert await asyncio.wait_for(reader.read(), WAIT_S) == b""

    asyncio.run(with_listener(FakeBackend(), test, idle_ms_max=100))


class RecordingBackend(SlowFetchBackend):
    def __init__(self) -> None:
        super().__init__()
        self.events: list[str] = []

    async def fetch(self, req: common_pb2.FetchRequest) -> common_pb2.FetchResponse:
        self.events.append("fetch started")
        answer = await super().fetch(req)
        self.events.append("fetch done")
        return answer

    async def kafka_brokers(self) -> list[Any]:
        self.events.append("coordinator looked up")
        return await super().kafka_brokers()

    async def produce(self, req: common_pb2.ProduceRequest) -> common_pb2.ProduceResponse:
        self.events.append("produce")
        return await super().produce(req)


def test_requests_off_the_data_path_act_in_turn_as_kafka_processes_a_connection():
    backend = RecordingBackend()
    find = protocol.request_class(protocol.FIND_COORDINATOR, 3)

    async def test(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(framed(request_frame(protocol.FETCH, 12, fetch_body(), correlation_id=1)))
        writer.write(
            framed(request_frame(protocol.FIND_COORDINATOR, 3, find(key="g", key_type=0), correlation_id=2))
        )
        writer.write(framed(request_frame(protocol.PRODUCE, 9, produce_body(-1), correlation_id=3)))
        await writer.drain()
        await asyncio.sleep(0.2)
        assert backend.events == ["fetch started"], (
            "FindCoordinator waits for the Fetch, the Produce for both"
        )
        backend.release.set()
        assert [(await read_answer(reader))[0] for _ in range(3)] == [1, 2, 3]
        assert backend.events == ["fetch started", "fetch done", "coordinator looked up", "produce"]

    asyncio.run(with_listener(backend, test))


# ---- mutual TLS and ACLs (docs/KAFKA.md, Security) ------------------------------------------


def test_tls_listener_requires_a_cluster_certificate_and_checks_its_principal(tmp_path):
    import ssl

    from services.kafka.acl_rules import ConnectionAccess
    from services.security.authz import AclBinding, Authorizer
    from services.security.certs import ensure_local_pki
    from services.security.tls import TlsMaterial

    ensure_local_pki(tmp_path, ["broker-1", "alice"])
    acls = Authorizer([AclBinding.of("User:alice", "Write", "Topic", "t")])
    backend = FakeBackend()
    principals: list[str] = []

    def access_for(caller: Any) -> ConnectionAccess:
        principals.append(caller.principal)
        return ConnectionAccess(caller, lambda: acls)

    def client_context(name: str | None) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=str(tmp_path / "ca.pem"))
        if name:
            context.load_cert_chain(tmp_path / f"{name}.pem", tmp_path / f"{name}-key.pem")
        return context

    async def main() -> None:
        listener = KafkaListener(
            KafkaHandler(backend),
            "127.0.0.1",
            0,
            ssl_context=TlsMaterial.load(tmp_path, "broker-1").server_ssl_context(),
            access_for=access_for,
        )
        port = await listener.start()
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=client_context("alice"))
            writer.write(framed(request_frame(protocol.PRODUCE, 9, produce_body(-1), correlation_id=5)))
            await writer.drain()
            correlation_id, _ = await read_answer(reader)
            assert correlation_id == 5 and principals == ["User:alice"]
            assert len(backend.produced) == 1, "alice may write t"
            writer.close()

            # No client certificate: the handshake is refused, no request is read.
            with pytest.raises((ssl.SSLError, ConnectionError, asyncio.IncompleteReadError)):
                reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=client_context(None))
                writer.write(framed(request_frame(protocol.API_VERSIONS, 3, api_versions_body())))
                await writer.drain()
                await read_answer(reader)
            assert principals == ["User:alice"]
        finally:
            await listener.close()

    asyncio.run(main())


def test_acls_without_tls_are_refused():
    with pytest.raises(ValueError, match="need TLS"):
        KafkaListener(KafkaHandler(FakeBackend()), "127.0.0.1", 0, access_for=lambda caller: caller)
