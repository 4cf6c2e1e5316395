"""The producer: accumulator rules (pure, clock passed in), sequence numbers, and the whole
Producer / AsyncProducer against an in-process fake gateway that keeps a log per partition,
deduplicates by (producer id, epoch, sequence) as a leader does, and fails on request.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import grpc
import pytest

from clients import FailedRecord
from clients.accumulator import RecordAccumulator
from clients.common import errors, records
from clients.common.partitioner import partition_for_key
from clients.common.record_batch import iter_batch_headers
from clients.errors import ClientClosed, GatewayUnavailable, InvalidArgument, MessageTooLarge, RequestTimedOut
from clients.idempotence import SEQUENCE_MODULUS, IdempotenceState
from clients.loop_thread import LoopThread
from clients.producer import AsyncProducer, Producer
from clients.sender import backoff_ms
from clients.types import RecordMetadata, TopicPartition
from protos.highwater.v1 import broker_pb2_grpc, common_pb2, gateway_pb2_grpc

TP0 = TopicPartition("t", 0)
TP1 = TopicPartition("t", 1)


def record(value: bytes = b"v" * 100, ts: int = 1) -> tuple[None, bytes, int]:
    return (None, value, ts)


def accumulator(**overrides: int) -> RecordAccumulator:
    settings = {
        "batch_size_bytes": 1000,
        "linger_ms": 5,
        "max_batch_bytes": 4000,
        "buffer_memory_bytes": 100_000,
    }
    settings.update(overrides)
    return RecordAccumulator(**settings)


# --- accumulator --------------------------------------------------------------------


def test_a_batch_waits_for_linger_ms_then_is_ready() -> None:
    acc = accumulator(linger_ms=5)
    created, full = acc.append(TP0, record(), None, 136, None, None, now_ms=100)
    assert (created, full) == (True, False)
    assert acc.ready(102, set()) == ([], 3), "3 ms of linger left"
    assert acc.ready(105, set()) == ([TP0], None)


def test_a_full_batch_is_ready_at_once_and_the_next_record_opens_a_new_one() -> None:
    acc = accumulator(batch_size_bytes=500, linger_ms=1_000)
    flags = [acc.append(TP0, record(), None, 136, None, None, now_ms=0) for _ in range(4)]
    # 61 header + 3 x 136 = 469 fits; the 4th would pass 500: new batch, first one closed.
    assert flags == [(True, False), (False, False), (False, False), (True, False)]
    ready, _ = acc.ready(0, set())
    assert ready == [TP0], "a closed batch does not wait for linger"
    batches = acc.drain(ready, max_request_bytes=10_000)
    assert [b.record_count for b in batches] == [4], "never-sent batches of a partition merge at drain"


def test_a_record_bigger_than_batch_size_gets_its_own_batch() -> None:
    acc = accumulator(batch_size_bytes=200, max_batch_bytes=4000)
    acc.append(TP0, record(), None, 136, None, None, now_ms=0)
    created, full = acc.append(TP0, record(b"x" * 1000), None, 1036, None, None, now_ms=0)
    assert created and full


def test_drain_merges_up_to_max_batch_bytes_and_keeps_order() -> None:
    acc = accumulator(batch_size_bytes=300, max_batch_bytes=700)
    for i in range(10):
        acc.append(TP0, record(bytes([i]) * 100), None, 136, None, None, now_ms=0)
    first = acc.drain(acc.ready(0, set())[0], max_request_bytes=100_000)
    assert len(first) == 1 and first[0].size_bytes <= 700
    values = [r[1][0] for r in first[0].records]
    assert values == list(range(len(values))), "records keep their send order"
    rest = acc.drain(acc.ready(0, set())[0], max_request_bytes=100_000)
    assert rest[0].records[0][1][0] == len(values)


def test_drain_takes_one_batch_per_partition_within_max_request_bytes() -> None:
    acc = accumulator(batch_size_bytes=200)
    for tp in (TP0, TP1, TopicPartition("u", 0)):
        acc.append(tp, record(), None, 136, None, None, now_ms=0)
    ready, _ = acc.ready(10, set())
    assert len(ready) == 3
    batches = acc.drain(ready, max_request_bytes=400)
    assert len(batches) == 2, "a third 197-byte batch would pass 400 bytes"
    assert len({b.tp for b in batches}) == 2


def test_muted_partitions_are_not_ready() -> None:
    acc = accumulator()
    acc.append(TP0, record(), None, 136, None, None, now_ms=0)
    assert acc.ready(100, {TP0}) == ([], None)


def test_flush_closing_and_memory_waiters_skip_linger() -> None:
    acc = accumulator(linger_ms=10_000)
    acc.append(TP0, record(), None, 136, None, None, now_ms=0)
    assert acc.ready(1, set())[0] == []
    acc.flushes_in_progress = 1
    assert acc.ready(1, set())[0] == [TP0]
    acc.flushes_in_progress = 0
    acc.memory_waiters = 1
    assert acc.ready(1, set())[0] == [TP0]


def test_a_retried_batch_goes_back_to_the_head_after_its_backoff() -> None:
    acc = accumulator(batch_size_bytes=200, linger_ms=0)
    acc.append(TP0, record(b"a" * 100), None, 136, None, None, now_ms=0)
    [first] = acc.drain(acc.ready(0, set())[0], 100_000)
    acc.append(TP0, record(b"b" * 100), None, 136, None, None, now_ms=1)
    acc.reenqueue(first, retry_at_ms=50)
    assert acc.ready(10, set()) == ([], 40), "the retry waits its backoff, and blocks the newer batch"
    [again] = acc.drain(acc.ready(50, set())[0], 100_000)
    assert again is first and again.attempts == 2
    assert again.record_count == 1, "a batch that was sent never absorbs others (its bytes are fixed)"


def test_expire_fails_queued_batches_past_the_delivery_timeout() -> None:
    acc = accumulator()
    acc.append(TP0, record(), None, 136, None, None, now_ms=0)
    acc.append(TP1, record(), None, 136, None, None, now_ms=50)
    expired = acc.expire(now_ms=100, delivery_timeout_ms=100)
    assert [b.tp for b in expired] == [TP0]


def test_buffer_memory_bounds_appends_until_batches_complete() -> None:
    acc = accumulator(batch_size_bytes=1000, max_batch_bytes=1000, buffer_memory_bytes=1000)
    for _ in range(6):
        assert acc.has_room(136)
        acc.append(TP0, record(), None, 136, None, None, now_ms=0)
    assert not acc.has_room(136)
    for batch in acc.drain(acc.ready(100, set())[0], 100_000):
        acc.complete(batch)
    assert acc.buffered_bytes == 0 and acc.has_room(136)


def test_done_up_to_tracks_batches_merged_into_others() -> None:
    acc = accumulator(batch_size_bytes=200)
    for _ in range(3):
        acc.append(TP0, record(), None, 136, None, None, now_ms=0)
    target = acc.last_batch_id
    [merged] = acc.drain(acc.ready(0, set())[0], 100_000)
    assert merged.absorbed_ids and not acc.done_up_to(target)
    acc.complete(merged)
    assert acc.done_up_to(target)


# --- sequence numbers -----------------------------------------------------------------


def test_sequences_count_records_per_partition_and_survive_retries() -> None:
    acc = accumulator(batch_size_bytes=200, linger_ms=0)
    state = IdempotenceState()
    state.set_producer(7, 0)
    acc.append(TP0, record(), None, 136, None, None, 0)
    acc.append(TP0, record(), None, 136, None, None, 0)
    acc.append(TP1, record(), None, 136, None, None, 0)
    batches = acc.drain(acc.ready(0, set())[0], 100_000)
    for batch in batches:
        assert state.assign(batch)
    by_tp = {b.tp: b for b in batches}
    assert by_tp[TP0].base_sequence == 0 and by_tp[TP0].record_count == 2
    assert by_tp[TP1].base_sequence == 0
    assert state.next_sequence_for(TP0) == 2
    assert not state.assign(by_tp[TP0]), "a retry keeps its numbers"
    assert (by_tp[TP0].producer_id, by_tp[TP0].producer_epoch) == (7, 0)


def test_a_lost_batch_bumps_the_epoch_and_renumbers_from_zero() -> None:
    acc = accumulator(linger_ms=0)
    state = IdempotenceState()
    state.set_producer(7, 0)
    acc.append(TP0, record(), None, 136, None, None, 0)
    [batch] = acc.drain(acc.ready(0, set())[0], 100_000)
    state.assign(batch)
    state.on_batch_lost(batch)
    assert not state.has_producer_id
    state.set_producer(7, 1)
    assert state.assign(batch) and batch.base_sequence == 0 and batch.producer_epoch == 1


def test_sequence_numbers_wrap_like_kafka() -> None:
    from clients.idempotence import next_sequence

    assert next_sequence(SEQUENCE_MODULUS - 2, 5) == 3


def test_backoff_is_exponential_and_capped() -> None:
    assert [backoff_ms(a, 100, 1000) for a in (1, 2, 3, 4, 5)] == [100, 200, 400, 800, 1000]


# --- a fake gateway ---------------------------------------------------------------------------


@dataclass
class FakeGateway(gateway_pb2_grpc.GatewayServiceServicer):
    """Metadata for topic "t", InitProducerId, and Produce into per-partition logs with a
    leader's duplicate detection. `faults[(topic, partition)]` lists what the next Produce
    attempts do: "lose-ack" (append, then answer REQUEST_TIMED_OUT), or an ErrorCode."""

    partitions: int = 3
    logs: dict[tuple[str, int], list[records.Record]] = field(default_factory=lambda: defaultdict(list))
    seen: dict[tuple[int, int, int, str, int], int] = field(default_factory=dict)
    faults: dict[tuple[str, int], list[object]] = field(default_factory=lambda: defaultdict(list))
    produce_calls: int = 0
    hang: bool = False
    next_producer_id: int = 1000
    init_requests: list[tuple[int, int]] = field(default_factory=list)
    # Brokers Metadata lists (none: clients know no leader address and go through the gateway).
    brokers: list[common_pb2.BrokerNode] = field(default_factory=list)
    # The broker Metadata names as every partition's leader (-1: none elected).
    leader: int = 1
    metadata_calls: int = 0
    # As a leader: a batch whose first sequence is not the next expected one is refused
    # OUT_OF_ORDER_SEQUENCE_NUMBER (duplicates of what was written are still recognised; a
    # producer's first batch may start anywhere, as on a broker).
    strict_sequences: bool = False
    expected_sequence: dict[tuple[int, int, str, int], int] = field(default_factory=dict)
    # As a slow leader: every Produce waits this long before it is handled.
    delay_s: float = 0.0
    # Per Produce call, in order: (seconds before it is handled, seconds after that before it
    # is answered); calls past the list use (delay_s, 0). A leader checks sequences when a
    # request arrives and answers once every partition in it is replicated, so a refusal can
    # come back after the answer to a request that arrived later.
    produce_timings: list[tuple[float, float]] = field(default_factory=list)
    in_flight: int = 0
    most_in_flight: int = 0

    async def Metadata(self, request, context):
        self.metadata_calls += 1
        return common_pb2.MetadataResponse(
            cluster_id="fake",
            controller_id=1,
            brokers=self.brokers,
            topics=[
                common_pb2.TopicMetadata(
                    name="t",
                    topic_id="id-t",
                    partitions=[
                        common_pb2.PartitionMetadata(
                            partition=p, leader=self.leader, replicas=[1, 2], isr=[1, 2]
                        )
                        for p in range(self.partitions)
                    ],
                )
            ]
            if not request.topics or "t" in request.topics
            else [
                common_pb2.TopicMetadata(
                    name=name,
                    error_code=common_pb2.UNKNOWN_TOPIC_OR_PARTITION,
                    error_message=f"topic {name!r} does not exist",
                )
                for name in request.topics
            ],
        )

    async def InitProducerId(self, request, context):
        self.init_requests.append((request.producer_id, request.producer_epoch))
        if request.producer_id >= 0:
            return common_pb2.InitProducerIdResponse(
                producer_id=request.producer_id, producer_epoch=request.producer_epoch + 1
            )
        self.next_producer_id += 1
        return common_pb2.InitProducerIdResponse(producer_id=self.next_producer_id, producer_epoch=0)

    async def Produce(self, request, context):
        self.produce_calls += 1
        if self.hang:
            await asyncio.Event().wait()
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            handle_after_s, answer_after_s = (
                self.produce_timings.pop(0) if self.produce_timings else (self.delay_s, 0.0)
            )
            if handle_after_s:
                await asyncio.sleep(handle_after_s)
            response = self._produce(request)
            if answer_after_s:
                await asyncio.sleep(answer_after_s)
            return response
        finally:
            self.in_flight -= 1

    def _produce(self, request: common_pb2.ProduceRequest) -> common_pb2.ProduceResponse:
        topics = []
        for topic in request.topics:
            parts = []
            for data in topic.partitions:
                key = (topic.topic, data.partition)
                fault = self.faults[key].pop(0) if self.faults[key] else None
                if isinstance(fault, int):
                    parts.append(
                        common_pb2.ProducePartitionResponse(
                            partition=data.partition,
                            error_code=fault,
                            error_message="injected",
                            base_offset=-1,
                        )
                    )
                    continue
                if self._out_of_order(key, data.records):
                    parts.append(
                        common_pb2.ProducePartitionResponse(
                            partition=data.partition,
                            error_code=common_pb2.OUT_OF_ORDER_SEQUENCE_NUMBER,
                            base_offset=-1,
                        )
                    )
                    continue
                base_offset = self._append(key, data.records)
                if fault == "lose-ack":
                    parts.append(
                        common_pb2.ProducePartitionResponse(
                            partition=data.partition, error_code=common_pb2.REQUEST_TIMED_OUT, base_offset=-1
                        )
                    )
                else:
                    parts.append(
                        common_pb2.ProducePartitionResponse(partition=data.partition, base_offset=base_offset)
                    )
            topics.append(common_pb2.ProduceTopicResponse(topic=topic.topic, partitions=parts))
        return common_pb2.ProduceResponse(topics=topics)

    def _out_of_order(self, key: tuple[str, int], buf: bytes) -> bool:
        if not self.strict_sequences:
            return False
        [header] = list(iter_batch_headers(buf))
        if (header.producer_id, header.producer_epoch, header.base_sequence, *key) in self.seen:
            return False  # a duplicate: answered with its first offset
        expected = self.expected_sequence.get((header.producer_id, header.producer_epoch, *key))
        # As a broker: a producer it knows nothing of yet may start at any sequence.
        return expected is not None and header.base_sequence != expected

    def _append(self, key: tuple[str, int], buf: bytes) -> int:
        [header] = list(iter_batch_headers(buf))
        dedup = (header.producer_id, header.producer_epoch, header.base_sequence, *key)
        if header.producer_id >= 0 and dedup in self.seen:
            return self.seen[dedup]  # a duplicate: answer with the first append's offset
        log = self.logs[key]
        base = len(log)
        for r in records.decode_batches(buf):
            r.offset = base + r.offset
            log.append(r)
        if header.producer_id >= 0:
            self.seen[dedup] = base
            count = header.last_offset_delta + 1
            self.expected_sequence[(header.producer_id, header.producer_epoch, *key)] = (
                header.base_sequence + count
            )
        return base


@pytest.fixture
def gateway() -> Iterator[tuple[FakeGateway, str]]:
    fake = FakeGateway()
    thread = LoopThread("fake-gateway")

    async def start() -> tuple[grpc.aio.Server, int]:
        server = grpc.aio.server()
        gateway_pb2_grpc.add_GatewayServiceServicer_to_server(fake, server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        return server, port

    server, port = thread.run(start())
    try:
        yield fake, f"127.0.0.1:{port}"
    finally:
        thread.run(server.stop(None))
        thread.stop()


class FakeLeader(broker_pb2_grpc.BrokerServiceServicer):
    """Broker 1, the leader of every partition of the fake gateway's topic: its Produce writes
    into the gateway's logs (one log per partition, whoever is asked) and counts its calls."""

    def __init__(self, gateway: FakeGateway) -> None:
        self.gateway = gateway
        self.produce_calls = 0
        self.hang = False  # answer nothing, as a paused (SIGSTOP) broker

    async def Produce(self, request, context):
        self.produce_calls += 1
        if self.hang:
            await asyncio.Event().wait()
        return await self.gateway.Produce(request, context)


@pytest.fixture
def gateway_and_two_leaders() -> Iterator[tuple[FakeGateway, str, FakeLeader, FakeLeader]]:
    """A fake gateway naming broker 1 or 2 (`fake.leader`) as every partition's leader."""
    fake = FakeGateway()
    leaders = [FakeLeader(fake), FakeLeader(fake)]
    thread = LoopThread("fake-cluster")

    async def start() -> list[tuple[grpc.aio.Server, int]]:
        started = []
        for servicer, add in [
            (fake, gateway_pb2_grpc.add_GatewayServiceServicer_to_server),
            (leaders[0], broker_pb2_grpc.add_BrokerServiceServicer_to_server),
            (leaders[1], broker_pb2_grpc.add_BrokerServiceServicer_to_server),
        ]:
            server = grpc.aio.server()
            add(servicer, server)
            port = server.add_insecure_port("127.0.0.1:0")
            await server.start()
            started.append((server, port))
        return started

    started = thread.run(start())
    fake.brokers = [
        common_pb2.BrokerNode(broker_id=broker_id, host="127.0.0.1", port=port)
        for broker_id, (_, port) in zip((1, 2), started[1:], strict=True)
    ]
    try:
        yield fake, f"127.0.0.1:{started[0][1]}", leaders[0], leaders[1]
    finally:
        for server, _ in started:
            thread.run(server.stop(None))
        thread.stop()


@pytest.fixture
def gateway_and_leader() -> Iterator[tuple[FakeGateway, str, FakeLeader, LoopThread, list[grpc.aio.Server]]]:
    """A fake gateway whose Metadata names broker 1 (a FakeLeader on its own port) as leader."""
    fake = FakeGateway()
    leader = FakeLeader(fake)
    thread = LoopThread("fake-cluster")

    async def start() -> tuple[grpc.aio.Server, int, grpc.aio.Server, int]:
        gateway_server = grpc.aio.server()
        gateway_pb2_grpc.add_GatewayServiceServicer_to_server(fake, gateway_server)
        gateway_port = gateway_server.add_insecure_port("127.0.0.1:0")
        leader_server = grpc.aio.server()
        broker_pb2_grpc.add_BrokerServiceServicer_to_server(leader, leader_server)
        leader_port = leader_server.add_insecure_port("127.0.0.1:0")
        await gateway_server.start()
        await leader_server.start()
        return gateway_server, gateway_port, leader_server, leader_port

    gateway_server, gateway_port, leader_server, leader_port = thread.run(start())
    fake.brokers = [common_pb2.BrokerNode(broker_id=1, host="127.0.0.1", port=leader_port)]
    servers = [gateway_server, leader_server]
    try:
        yield fake, f"127.0.0.1:{gateway_port}", leader, thread, servers
    finally:
        for server in servers:
            thread.run(server.stop(None))
        thread.stop()


FAST = {
    "linger_ms": 1,
    "retry_backoff_ms": 10,
    "request_timeout_ms": 2_000,
    "delivery_timeout_ms": 10_000,
    "connect_timeout_ms": 2_000,
}


def test_keyed_records_are_delivered_in_order_with_offsets_and_headers(gateway) -> None:
    fake, address = gateway
    with Producer(address, **FAST) as producer:
        futures = [producer.send("t", f"v{i}".encode(), key=b"k", headers=[("h", b"x")]) for i in range(50)]
        producer.flush(timeout_ms=5_000)
        metadata = [f.result(timeout=1) for f in futures]
    partition = partition_for_key(b"k", 3)
    assert [m.partition for m in metadata] == [partition] * 50
    assert [m.offset for m in metadata] == list(range(50))
    log = fake.logs[("t", partition)]
    assert [r.value for r in log] == [f"v{i}".encode() for i in range(50)]
    assert all(r.key == b"k" and r.headers == [("h", b"x")] for r in log)


def test_a_retried_batch_whose_ack_was_lost_is_written_once(gateway) -> None:
    fake, address = gateway
    fake.faults[("t", 0)] = ["lose-ack", "lose-ack"]
    with Producer(address, **FAST) as producer:
        futures = [producer.send("t", f"v{i}".encode(), partition=0) for i in range(20)]
        producer.flush(timeout_ms=5_000)
        offsets = [f.result(timeout=1).offset for f in futures]
    assert offsets == list(range(20))
    assert [r.value for r in fake.logs[("t", 0)]] == [f"v{i}".encode() for i in range(20)], "no duplicates"
    assert fake.produce_calls >= 3


def test_retriable_errors_are_retried_and_fatal_ones_fail_the_batch(gateway) -> None:
    fake, address = gateway
    fake.faults[("t", 1)] = [common_pb2.NOT_LEADER_OR_FOLLOWER, common_pb2.LEADER_NOT_AVAILABLE]
    fake.faults[("t", 2)] = [common_pb2.CORRUPT_MESSAGE]
    delivered: list[tuple[RecordMetadata | None, errors.HighwaterError | None]] = []
    with Producer(address, **FAST) as producer:
        ok = producer.send("t", b"ok", partition=1)
        bad = producer.send("t", b"bad", partition=2, callback=lambda m, e: delivered.append((m, e)))
        producer.flush(timeout_ms=5_000)
        assert ok.result(timeout=1).offset == 0
        with pytest.raises(errors.CorruptMessage):
            bad.result(timeout=1)
        # The lost batch had sequence numbers: the next one goes out under a new epoch.
        again = producer.send("t", b"again", partition=2)
        assert again.result(timeout=5).offset == 0
    # The callback of a failed record names it (topic, partition, key, value), not None.
    assert len(delivered) == 1 and isinstance(delivered[0][1], errors.CorruptMessage)
    failed = delivered[0][0]
    assert isinstance(failed, FailedRecord) and (failed.topic, failed.partition, failed.value) == (
        "t",
        2,
        b"bad",
    )
    assert any(pid >= 0 for pid, _ in fake.init_requests), "the producer epoch was bumped"


def test_retriable_errors_fail_with_a_timeout_after_delivery_timeout_ms(gateway) -> None:
    fake, address = gateway
    fake.faults[("t", 0)] = [common_pb2.NOT_ENOUGH_REPLICAS] * 1000
    settings = dict(FAST, request_timeout_ms=200, delivery_timeout_ms=600)
    with Producer(address, **settings) as producer:
        future = producer.send("t", b"x", partition=0)
        with pytest.raises(RequestTimedOut, match="NOT_ENOUGH_REPLICAS"):
            future.result(timeout=5)


def test_bad_arguments_raise_typed_errors_and_queue_nothing(gateway) -> None:
    _, address = gateway
    with Producer(address, **FAST) as producer:
        for call, error in [
            (lambda: producer.send("", b"v"), InvalidArgument),
            (lambda: producer.send("no spaces", b"v"), InvalidArgument),
            (lambda: producer.send(7, b"v"), InvalidArgument),
            (lambda: producer.send("t", "text"), InvalidArgument),
            (lambda: producer.send("t", b"v", key=1), InvalidArgument),
            (lambda: producer.send("t", b"v", partition=-1), InvalidArgument),
            (lambda: producer.send("t", b"v", partition=3), errors.UnknownTopicOrPartition),
            (lambda: producer.send("t", b"v", headers=[("h", "not bytes")]), InvalidArgument),
            (lambda: producer.send("t", b"v", timestamp_ms=-5), InvalidArgument),
            (lambda: producer.send("t", b"x" * (2 * 1024 * 1024)), MessageTooLarge),
        ]:
            with pytest.raises(error):
                call()
        assert producer._core.accumulator.incomplete_count == 0
    with pytest.raises(InvalidArgument, match="linger_ms"):
        Producer(address, linger_ms=-1)
    with pytest.raises(InvalidArgument, match="unknown ProducerConfig setting"):
        Producer(address, lingerms=5)
    with pytest.raises(InvalidArgument, match="acks"):
        Producer(address, acks=1)  # idempotence needs acks=all


def test_default_configs_are_valid() -> None:
    from clients.config import ConnectionConfig, ConsumerConfig, ProducerConfig

    ConnectionConfig()
    ConsumerConfig()
    assert ProducerConfig().acks == -1 and ProducerConfig(acks="1", enable_idempotence=False).acks == 1


def test_send_after_close_raises(gateway) -> None:
    _, address = gateway
    producer = Producer(address, **FAST)
    producer.close()
    with pytest.raises(ClientClosed):
        producer.send("t", b"v")


def test_close_fails_what_cannot_be_delivered_in_time(gateway) -> None:
    fake, address = gateway
    fake.hang = True
    producer = Producer(address, **dict(FAST, request_timeout_ms=30_000, delivery_timeout_ms=60_000))
    futures = [producer.send("t", b"v", partition=p) for p in range(3)]
    with pytest.raises(RequestTimedOut, match="flush"):
        producer.flush(timeout_ms=200)
    started = time.monotonic()
    producer.close(timeout_ms=200)
    assert time.monotonic() - started < 5
    for future in futures:
        with pytest.raises(ClientClosed):
            future.result(timeout=1)


def test_an_unreachable_gateway_is_a_one_line_gateway_unavailable() -> None:
    with (
        Producer("127.0.0.1:1", connect_timeout_ms=300) as producer,
        pytest.raises(GatewayUnavailable) as caught,
    ):
        producer.send("t", b"v")
    message = str(caught.value)
    assert message.startswith("GATEWAY_UNAVAILABLE: ") and "127.0.0.1:1" in message and "\n" not in message


def test_produce_fast_path_reports_through_callbacks(gateway) -> None:
    fake, address = gateway
    done = threading.Event()
    results: list[RecordMetadata] = []

    def on_delivery(metadata: RecordMetadata | None, error: errors.HighwaterError | None) -> None:
        assert error is None and metadata is not None
        results.append(metadata)
        if len(results) == 2000:
            done.set()

    with Producer(address, **FAST) as producer:
        for i in range(2000):
            producer.produce("t", i.to_bytes(4, "big"), callback=on_delivery)
        producer.flush(timeout_ms=10_000)
    assert done.wait(1)
    assert sum(len(log) for log in fake.logs.values()) == 2000


def test_async_producer(gateway) -> None:
    _, address = gateway

    async def main() -> list[RecordMetadata]:
        async with AsyncProducer(address, **FAST) as producer:
            futures = [await producer.send("t", f"a{i}".encode(), key=b"same") for i in range(10)]
            last = await producer.send_and_wait("t", b"last", key=b"same")
            return [*(await asyncio.gather(*futures)), last]

    metadata = asyncio.run(main())
    assert [m.offset for m in metadata] == list(range(11))
    assert all(isinstance(f, RecordMetadata) for f in metadata)


def test_sync_send_returns_a_concurrent_future(gateway) -> None:
    _, address = gateway
    with Producer(address, **FAST) as producer:
        future = producer.send("t", b"v")
        assert isinstance(future, concurrent.futures.Future)
        assert isinstance(future.result(timeout=5), RecordMetadata)


def test_the_bulk_path_encodes_per_batch_with_the_compiled_codec() -> None:
    """send_batch's path: check, cut into batches, drain, encode (no I/O) — work per batch.

    Its speed is measured by bench/client_bench.py, not here; this checks the two things
    that would make it slow: the pure-Python codec, and an encode call per record.
    """
    import asyncio as asyncio_

    from clients.config import ProducerConfig
    from clients.metadata import TopicInfo
    from clients.producer import _ProducerCore
    from clients.sender import encode_producer_batch

    loop = asyncio_.new_event_loop()
    try:
        core = _ProducerCore(
            ProducerConfig(buffer_memory_bytes=1 << 30), loop, wake=lambda: None, on_batch_done=lambda: None
        )
        info = TopicInfo(
            "t",
            "id",
            (0, 1, 2),
            (0, 1, 2),
            common_pb2.TopicMetadata(name="t"),
            0,
            tuple(TopicPartition("t", p) for p in range(3)),
        )
        values = [b"x" * 100] * 10_000
        encoded = 0
        encode_calls = 0
        for _ in range(20):
            _, runs, (key, all_values, timestamp_ms), headers = core.prepare_runs(
                info, values, None, None, None, None
            )
            sink = type("Sink", (), {"settle": lambda *args: None})()
            for tp, start, end, size in runs:
                run = (key, all_values[start:end], timestamp_ms)
                assert core.try_append_run(tp, run, headers, size, sink, start)
            ready, _ = core.accumulator.ready(10**12, set())
            while ready:
                for batch in core.accumulator.drain(ready, core.config.max_request_bytes):
                    assert encode_producer_batch(batch, "none")
                    encode_calls += 1
                    encoded += batch.record_count
                    core.accumulator.complete(batch)
                ready, _ = core.accumulator.ready(10**12, set())
    finally:
        loop.close()
    assert encoded == 200_000
    assert records.codec_is_accelerated(), "aiokafka's compiled _crecords is not in use"
    assert encode_calls * 100 <= encoded, f"{encode_calls} encode calls for {encoded} records: not per batch"


def _bulk_core() -> Any:
    import asyncio as asyncio_

    from clients.config import ProducerConfig
    from clients.metadata import TopicInfo
    from clients.producer import _ProducerCore

    wakes: list[int] = []
    core = _ProducerCore(
        ProducerConfig(buffer_memory_bytes=1 << 30, batch_size_bytes=1_000),
        asyncio_.new_event_loop(),
        wake=lambda: wakes.append(1),
        on_batch_done=lambda: None,
    )
    info = TopicInfo("t", "id", (0,), (0,), common_pb2.TopicMetadata(name="t"), 0, (TopicPartition("t", 0),))
    return core, info, wakes


def test_a_bulk_send_is_encoded_from_the_callers_values_with_its_key_and_timestamp() -> None:
    """A run keeps the caller's values (no tuple per record); what is sent is what was given
    at the call, even if the caller reuses its list; one wake-up for the whole call."""
    from clients.sender import SentRecords, encode_producer_batch

    core, info, wakes = _bulk_core()
    values = [bytes([i]) * 50 for i in range(100)]
    future: Any = concurrent.futures.Future()
    for _ in core.queue_bulk(info, values, b"k", None, 0, 1_234, future):
        raise AssertionError("the buffer has room")
    assert len(wakes) == 1, "one wake-up per send_batch call, not per batch"
    values[0] = b"changed after the call"
    batches = core.accumulator.drain(core.accumulator.ready(10**12, set())[0], 10**9)
    sent = []
    for batch in batches:
        assert batch.runs is not None and batch.records == [], "no tuple per record"
        sent.extend(records.decode_batches(encode_producer_batch(batch, "none")))
    assert [(r.key, r.value, r.timestamp_ms) for r in sent] == [
        (b"k", bytes([i]) * 50, 1_234) for i in range(100)
    ]
    for batch in batches:
        from clients.sender import settle_batch

        settle_batch(batch, 10, -1, None)
    result = future.result(timeout=0)
    assert isinstance(result, SentRecords) and len(result) == 100
    assert result[99].timestamp_ms == 1_234 and result[0].partition == 0


def test_a_bulk_run_merged_with_single_records_keeps_the_order() -> None:
    """Batches never sent merge at drain; a run among them is expanded to tuples first."""
    acc = accumulator(batch_size_bytes=300, max_batch_bytes=4_000)
    acc.append(TP0, record(b"a", ts=1), None, 40, None, None, now_ms=0)
    sink = type("Sink", (), {"settle": lambda *args: None})()
    acc.append_run(TP0, (None, [b"b", b"c"], 2), None, 80, sink, 0, now_ms=0)
    acc.append(TP0, record(b"d", ts=3), None, 40, None, None, now_ms=0)
    (batch,) = acc.drain(acc.ready(10**12, set())[0], max_request_bytes=100_000)
    assert batch.runs is None and batch.record_count == 4
    assert [(value, ts) for _, value, ts in batch.records] == [(b"a", 1), (b"b", 2), (b"c", 2), (b"d", 3)]
    assert batch.sinks == [(1, 2, sink, 0)], "the run's sink still names its records"


def test_bulk_runs_of_separate_calls_merge_without_a_tuple_per_record() -> None:
    """Runs queued by separate send_batch calls (their own key and timestamp) merge at drain as
    runs, and the batch carries each record's own key and timestamp."""
    from clients.sender import encode_producer_batch

    acc = accumulator(batch_size_bytes=300, max_batch_bytes=4_000)
    sink = type("Sink", (), {"settle": lambda *args: None})()
    acc.append_run(TP0, (None, [b"a", b"b"], 1), None, 80, sink, 0, now_ms=0)
    acc.append_run(TP0, (b"k", [b"c"], 2), None, 40, sink, 0, now_ms=0)
    (batch,) = acc.drain(acc.ready(10**12, set())[0], max_request_bytes=100_000)
    assert batch.runs is not None and batch.records == [] and batch.record_count == 3
    assert [batch.timestamp_ms(i) for i in range(3)] == [1, 1, 2]
    decoded = list(records.decode_batches(encode_producer_batch(batch, "none")))
    assert [(r.key, r.value, r.timestamp_ms, r.offset) for r in decoded] == [
        (None, b"a", 1, 0),
        (None, b"b", 1, 1),
        (b"k", b"c", 2, 2),
    ]
    assert batch.sinks == [(0, 2, sink, 0), (2, 1, sink, 0)]


# --- straight to the leaders ---------------------------------------------------------------


def test_batches_go_straight_to_the_leader_that_metadata_names(gateway_and_leader) -> None:
    fake, address, leader, _thread, _servers = gateway_and_leader
    with Producer(address, **FAST) as producer:
        futures = [producer.send("t", f"v{i}".encode(), partition=i % 3) for i in range(30)]
        producer.flush(timeout_ms=5_000)
        offsets = [f.result(timeout=1).offset for f in futures]
    assert offsets == [i // 3 for i in range(30)]
    assert leader.produce_calls >= 1 and fake.produce_calls == leader.produce_calls, "none via the gateway"


def test_direct_to_leaders_off_sends_everything_through_the_gateway(gateway_and_leader) -> None:
    fake, address, leader, _thread, _servers = gateway_and_leader
    with Producer(address, direct_to_leaders=False, **FAST) as producer:
        producer.send("t", b"v", partition=0).result(timeout=5)
    assert leader.produce_calls == 0 and fake.produce_calls == 1
    with pytest.raises(InvalidArgument, match="direct_to_leaders"):
        Producer(address, direct_to_leaders="yes")


def test_an_unreachable_leader_is_retried_through_the_gateway_and_nothing_is_written_twice(
    gateway_and_leader,
) -> None:
    fake, address, leader, thread, servers = gateway_and_leader
    with Producer(address, **FAST) as producer:
        producer.send("t", b"first", partition=0).result(timeout=5)
        assert leader.produce_calls == 1
        thread.run(servers[1].stop(None))  # the leader is gone; the gateway routes on
        futures = [producer.send("t", f"v{i}".encode(), partition=0) for i in range(10)]
        producer.flush(timeout_ms=5_000)
        offsets = [f.result(timeout=1).offset for f in futures]
    assert offsets == list(range(1, 11))
    assert [r.value for r in fake.logs[("t", 0)]] == [b"first"] + [f"v{i}".encode() for i in range(10)]
    assert fake.produce_calls > leader.produce_calls, "the retries went through the gateway"


def test_a_not_leader_answer_sends_the_retry_through_the_gateway_and_refreshes(gateway_and_leader) -> None:
    fake, address, leader, _thread, _servers = gateway_and_leader
    fake.faults[("t", 1)] = [common_pb2.NOT_LEADER_OR_FOLLOWER]
    with Producer(address, **FAST) as producer:
        assert producer.send("t", b"x", partition=1).result(timeout=5).offset == 0
        # Metadata was asked again, and the next batch goes straight to the leader again.
        deadline = time.monotonic() + 5
        while producer._core.metadata.is_stale("t") and time.monotonic() < deadline:
            time.sleep(0.01)
        calls = leader.produce_calls
        assert producer.send("t", b"y", partition=1).result(timeout=5).offset == 1
    assert leader.produce_calls == calls + 1
    assert [r.value for r in fake.logs[("t", 1)]] == [b"x", b"y"]


def test_a_request_to_a_silent_leader_goes_to_the_new_one_once_metadata_names_it(
    gateway_and_two_leaders,
) -> None:
    """A paused leader answers nothing until request_timeout_ms (30 s here); the producer asks
    Metadata meanwhile and sends the idempotent batch to the new leader as soon as it is named."""
    fake, address, first, second = gateway_and_two_leaders
    settings = dict(FAST, request_timeout_ms=30_000, delivery_timeout_ms=60_000)
    with Producer(address, **settings) as producer:
        assert producer.send("t", b"before", partition=0).result(timeout=5).offset == 0
        first.hang = True
        started = time.monotonic()
        future = producer.send("t", b"during", partition=0)
        with pytest.raises(concurrent.futures.TimeoutError):
            future.result(timeout=1.5)  # still waiting on the silent leader: nothing moved yet
        fake.leader = 2  # the controller elected broker 2
        assert future.result(timeout=5).offset == 1
        took_s = time.monotonic() - started
    assert took_s < 1.5 + 2.0, f"{took_s:.2f} s: sent to the new leader within a couple of checks"
    assert second.produce_calls == 1
    assert [r.value for r in fake.logs[("t", 0)]] == [b"before", b"during"], "written once"


def test_a_silent_leader_is_waited_for_when_the_batch_is_not_idempotent(gateway_and_two_leaders) -> None:
    """Without idempotence a resend could write the batch twice: the request is waited out."""
    fake, address, first, _second = gateway_and_two_leaders
    settings = dict(FAST, request_timeout_ms=1_000, delivery_timeout_ms=60_000)
    with Producer(address, enable_idempotence=False, **settings) as producer:
        first.hang = True
        future = producer.send("t", b"x", partition=0)
        time.sleep(0.3)
        fake.leader = 2
        with pytest.raises(concurrent.futures.TimeoutError):
            future.result(timeout=1.5)  # not abandoned because the leader moved
        # Retried after its own timeout, through the gateway while Metadata is asked again.
        assert future.result(timeout=10).offset == 0
    assert first.produce_calls == 1
    assert [r.value for r in fake.logs[("t", 0)]] == [b"x"]


# --- several batches of a partition in flight ------------------------------------------------


def test_an_idempotent_producer_keeps_several_batches_of_a_partition_in_flight_in_order(
    gateway_and_leader,
) -> None:
    """A slow leader that refuses a batch arriving before its predecessor (OUT_OF_ORDER), and
    whose first answer is NOT_LEADER (a leader that knows no sequence of this producer yet
    would take a second batch first: the first goes alone): every record is written once
    and in the order sent."""
    fake, address, _leader, _thread, _servers = gateway_and_leader
    fake.strict_sequences = True
    fake.delay_s = 0.03
    fake.faults[("t", 0)] = [common_pb2.NOT_LEADER_OR_FOLLOWER]
    values = [f"v{i}".encode() for i in range(400)]
    # Small batches: a batch follows one in flight only once it is full.
    with Producer(address, batch_size_bytes=200, **FAST) as producer:
        futures = []
        for value in values:
            futures.append(producer.send("t", value, partition=0))
            time.sleep(0.0005)  # a steady stream: new batches while earlier ones are in flight
        producer.flush(timeout_ms=10_000)
        offsets = [f.result(timeout=1).offset for f in futures]
    assert [r.value for r in fake.logs[("t", 0)]] == values, "once each, in order"
    assert offsets == list(range(len(values)))
    assert fake.most_in_flight >= 2, "batches of one partition were pipelined"


def test_a_batch_refused_for_overtaking_is_sent_again_when_the_answer_behind_it_came_first(
    gateway_and_leader,
) -> None:
    """Batches of a partition go in separate requests (on separate streams), so the second can
    reach the leader first and be refused OUT_OF_ORDER, and that refusal can come back after
    the first batch's success. The refused batch had overtaken: it is sent again, not failed
    (a 10 KB produce run at 128 KiB batches lost a batch of 13 records so)."""
    fake, address, _leader, _thread, _servers = gateway_and_leader
    fake.strict_sequences = True
    values = [f"v{i:02}".encode() for i in range(40)]
    with Producer(address, batch_size_bytes=200, **FAST) as producer:
        producer.send("t", b"first", partition=0).result(timeout=5)  # the leader knows us
        # The next request (the first batch) is handled late; the one after it (the second
        # batch) at once, refused, and its refusal answered after the first batch's success.
        fake.produce_timings = [(0.2, 0.0), (0.0, 0.4)]
        futures = [producer.send("t", value, partition=0) for value in values[:10]]
        deadline = time.monotonic() + 5
        while fake.in_flight == 0:  # the first batch is at the leader, not yet handled
            assert time.monotonic() < deadline, "the first batch was never sent"
            time.sleep(0.001)
        futures += [producer.send("t", value, partition=0) for value in values[10:]]
        producer.flush(timeout_ms=10_000)
        errors = [f.exception(timeout=1) for f in futures]
    assert errors == [None] * len(values)
    assert [r.value for r in fake.logs[("t", 0)]] == [b"first", *values], "once each, in order"
    assert not fake.produce_timings, "both timed requests were sent"


def test_without_idempotence_a_partition_has_one_batch_in_flight(gateway_and_leader) -> None:
    fake, address, _leader, _thread, _servers = gateway_and_leader
    fake.delay_s = 0.03
    with Producer(address, enable_idempotence=False, acks=1, batch_size_bytes=200, **FAST) as producer:
        futures = []
        for i in range(200):
            futures.append(producer.send("t", f"v{i}".encode(), partition=0))
            time.sleep(0.0005)
        producer.flush(timeout_ms=10_000)
        assert [f.result(timeout=1).offset for f in futures] == list(range(200))
    assert fake.most_in_flight == 1


def test_the_batches_in_flight_bound_is_the_leaders_dedup_window() -> None:
    from clients.config import IDEMPOTENT_BATCHES_IN_FLIGHT_MAX
    from services.common.limits import PRODUCER_BATCHES_KEPT

    assert IDEMPOTENT_BATCHES_IN_FLIGHT_MAX == PRODUCER_BATCHES_KEPT


def test_a_partial_batch_waits_for_the_one_in_flight_instead_of_a_request_of_its_own(
    gateway_and_leader,
) -> None:
    """At a low rate (records trickling in, linger 0) a partition sends its next batch when
    the one in flight is answered, not one request per record: requests cost the leader more
    than their bytes."""
    fake, address, _leader, _thread, _servers = gateway_and_leader
    fake.delay_s = 0.02
    with Producer(address, **dict(FAST, linger_ms=0)) as producer:
        producer.send("t", b"first", partition=0).result(timeout=5)  # the leader knows us
        calls = fake.produce_calls
        futures = []
        for i in range(100):
            futures.append(producer.send("t", f"v{i}".encode(), partition=0))
            time.sleep(0.001)
        producer.flush(timeout_ms=10_000)
        assert [f.result(timeout=1).offset for f in futures] == list(range(1, 101))
    requests = fake.produce_calls - calls
    # ~100 ms of sends, each request in flight 20 ms: a handful of requests, not 100.
    assert requests <= 20, f"{requests} requests for 100 records"


def test_metadata_is_asked_at_most_once_per_retry_backoff_while_a_partition_has_no_leader(
    gateway_and_leader,
) -> None:
    """While no leader is elected the records go through the gateway, and the sender asks for
    new Metadata on every pass: at most once per retry_backoff_ms, not once per record."""
    fake, address, _leader, _thread, _servers = gateway_and_leader
    with Producer(address, **dict(FAST, retry_backoff_ms=100, linger_ms=0)) as producer:
        producer.send("t", b"first", partition=0).result(timeout=5)
        fake.leader = -1
        producer._core.metadata.mark_stale("t")
        calls = fake.metadata_calls
        started = time.monotonic()
        for i in range(200):
            producer.send("t", f"v{i}".encode(), partition=0)
            time.sleep(0.002)
        producer.flush(timeout_ms=10_000)
        took_s = time.monotonic() - started
    asked = fake.metadata_calls - calls
    assert asked <= took_s / 0.1 + 2, f"Metadata asked {asked} times in {took_s:.2f} s"
    assert [r.value for r in fake.logs[("t", 0)]][1:] == [f"v{i}".encode() for i in range(200)]
