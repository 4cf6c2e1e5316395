"""The Kafka listener's socket side (services/kafka/listener.py) on loopback with a fake backend:
answers in request order while a slow request is in progress, no answer for acks=0, the request
size bound, connections closed for bytes that are not a request or an answer that cannot be
encoded, the body deadline, the partial-frame budget and the per-address connection bounds."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime
import socket
import struct
import time
from typing import Any

import pytest

from protos.highwater.v1 import common_pb2
from services.kafka import protocol
from services.kafka.handler import KafkaHandler
from services.kafka.listener import KafkaListener, reserve_port
from services.kafka.listener_limits import parse_connection_overrides
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


async def with_listener(backend: FakeBackend, test: Any, **bounds: Any) -> None:
    listener = KafkaListener(KafkaHandler(backend), "127.0.0.1", 0, **bounds)
    port = await listener.start()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        await test(reader, writer)
    finally:
        writer.close()
        await listener.close()


def test_answers_leave_in_request_order_and_acks_zero_gets_none() -> None:
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


class AcceptRecorder(KafkaListener):
    """The listener as it ships, keeping each accepted connection's writer for the test to look at."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.accepted: list[asyncio.StreamWriter] = []

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted.append(writer)
        await super()._accept(reader, writer)


@pytest.mark.parametrize("reserved", [True, False], ids=["port reserved as the broker does", "host and port"])
def test_answers_are_sent_without_nagle_delay(reserved: bool) -> None:
    """Nagle's algorithm is off on every accepted connection, also on the broker's reserved port
    (socket.create_server's socket has proto 0, and asyncio then leaves Nagle on): with it on, a
    client with requests in flight waited for its own delayed ACK, ~40 ms, for each answer."""

    async def main() -> None:
        sock = reserve_port("127.0.0.1", 0) if reserved else None
        listener = AcceptRecorder(KafkaHandler(FakeBackend()), "127.0.0.1", 0, sock=sock)
        port = await listener.start()
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            writer.write(
                framed(request_frame(protocol.API_VERSIONS, 3, api_versions_body(), correlation_id=1))
            )
            await writer.drain()
            assert (await read_answer(reader))[0] == 1
            (accepted,) = listener.accepted
            server_side = accepted.get_extra_info("socket")
            assert server_side.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0
        finally:
            writer.close()
            await listener.close()

    asyncio.run(main())


def test_a_request_over_the_size_bound_closes_the_connection() -> None:
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
def test_unanswerable_requests_close_the_connection(frame: bytes) -> None:
    async def test(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(framed(frame))
        await writer.drain()
        assert await asyncio.wait_for(reader.read(), WAIT_S) == b""

    asyncio.run(with_listener(FakeBackend(), test))


def test_api_versions_at_an_unknown_version_is_answered_in_v0() -> None:
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


def test_an_idle_connection_is_closed() -> None:
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

    async def produce(
        self, req: common_pb2.ProduceRequest, *, transactional: bool = False
    ) -> common_pb2.ProduceResponse:
        self.events.append("produce")
        return await super().produce(req)


def test_requests_off_the_data_path_act_in_turn_as_kafka_processes_a_connection() -> None:
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


def test_tls_listener_requires_a_cluster_certificate_and_checks_its_principal(tmp_path: Any) -> None:
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


def test_acls_without_tls_are_refused() -> None:
    with pytest.raises(ValueError, match="need TLS"):
        KafkaListener(KafkaHandler(FakeBackend()), "127.0.0.1", 0, access_for=lambda caller: caller)  # type: ignore[arg-type,return-value]


# ---- answers that cannot be encoded, bounded reads, per-address bounds (issue 37) -------------


class UnencodableHandler(KafkaHandler):
    """Answers with a None its version cannot carry, as JoinGroup v2-v6's refusal once did
    (protocol_name=None where the field is not nullable)."""

    async def handle(self, request: protocol.Request) -> Any:
        answer: Any = await super().handle(request)
        return dataclasses.replace(answer, error_code=None)


def test_an_answer_that_cannot_be_encoded_closes_the_connection_and_says_why(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def main() -> None:
        listener = KafkaListener(UnencodableHandler(FakeBackend()), "127.0.0.1", 0)
        port = await listener.start()
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            writer.write(
                framed(request_frame(protocol.API_VERSIONS, 3, api_versions_body(), correlation_id=4))
            )
            await writer.drain()
            assert await asyncio.wait_for(reader.read(), WAIT_S) == b"", "closed, not left waiting"
        finally:
            writer.close()
            await listener.close()

    asyncio.run(main())
    assert "api_versions (api key 18) v3 cannot be encoded" in caplog.text


def test_a_body_that_does_not_arrive_in_time_closes_the_connection() -> None:
    async def test(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(struct.pack(">i", 1024 * 1024) + b"\0" * 100)  # announces 1 MiB, sends 100 bytes
        await writer.drain()
        started = time.monotonic()
        assert await asyncio.wait_for(reader.read(), WAIT_S) == b""
        assert time.monotonic() - started < 2.0, "closed at the body deadline, not the idle bound"

    asyncio.run(with_listener(FakeBackend(), test, request_body_timeout_ms=200))


def test_partial_frames_share_one_budget_and_the_connection_that_would_pass_it_is_closed() -> None:
    async def main() -> None:
        listener = KafkaListener(
            KafkaHandler(FakeBackend()),
            "127.0.0.1",
            0,
            request_bytes_max=3_000_000,
            partial_frame_bytes_max=3_000_000,
        )
        port = await listener.start()
        first = await asyncio.open_connection("127.0.0.1", port)
        second = await asyncio.open_connection("127.0.0.1", port)
        try:
            # 2.5 MB announced and 2 MB sent: its first two 1 MiB pieces are counted, the third awaited.
            first[1].write(struct.pack(">i", 2_500_000) + b"\0" * 2_000_000)
            await first[1].drain()
            deadline = time.monotonic() + WAIT_S
            while listener._partial_frame_bytes < 3 * 1024 * 1024 - 1_000_000 and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
            # The second's first piece would pass 3 MB: it is closed; the first is not.
            second[1].write(struct.pack(">i", 2_000_000) + b"\0" * 10)
            await second[1].drain()
            assert await asyncio.wait_for(second[0].read(), WAIT_S) == b""
            assert not first[0].at_eof()
        finally:
            first[1].close()
            second[1].close()
            await listener.close()
        assert listener._partial_frame_bytes == 0, "every counted piece is given back"

    asyncio.run(main())


def test_connections_are_bounded_per_client_address_with_overrides() -> None:
    async def main() -> None:
        listener = KafkaListener(
            KafkaHandler(FakeBackend()),
            "127.0.0.1",
            0,
            connections_per_ip_max=2,
            connections_per_ip_overrides={"127.0.0.2": 3},
        )
        port = await listener.start()
        opened: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []

        async def answered(local: str) -> bool:
            reader, writer = await asyncio.open_connection("127.0.0.1", port, local_addr=(local, 0))
            opened.append((reader, writer))
            writer.write(
                framed(request_frame(protocol.API_VERSIONS, 3, api_versions_body(), correlation_id=1))
            )
            with contextlib.suppress(ConnectionError):
                await writer.drain()
            try:
                return (await read_answer(reader))[0] == 1
            except (asyncio.IncompleteReadError, ConnectionError):
                return False

        try:
            assert [await answered("127.0.0.1") for _ in range(3)] == [True, True, False]
            assert [await answered("127.0.0.2") for _ in range(4)] == [True, True, True, False]
            assert listener.connections_allowed("127.0.0.3") == 2
        finally:
            for _, writer in opened:
                writer.close()
            await listener.close()

    asyncio.run(main())


def test_listener_bounds_that_contradict_each_other_are_refused() -> None:
    with pytest.raises(ValueError, match="at least the largest request"):
        KafkaListener(
            KafkaHandler(FakeBackend()), "127.0.0.1", 0, request_bytes_max=10, partial_frame_bytes_max=9
        )
    assert parse_connection_overrides("127.0.0.2:500, ::1:7,") == {"127.0.0.2": 500, "::1": 7}
    with pytest.raises(ValueError, match="not address:count"):
        parse_connection_overrides("127.0.0.2")
