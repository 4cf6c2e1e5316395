"""The Consumer fetches straight from each partition's leader (direct_to_leaders, the default).

An in-process cluster of gRPC servers: a fake gateway (Metadata naming the leaders, and Fetch
for every partition, as a gateway routes) and fake leaders (BrokerService.Fetch for the
partitions each leads, NOT_LEADER_OR_FOLLOWER for the others), all reading the same logs.
Fetches long-poll as a broker's do: an answer with nothing waits up to max_wait_ms for a
record to be appended. Every test checks what poll() handed out: every offset once, in order.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import grpc
import pytest

from clients.common.records import encode_batch
from clients.consumer import Consumer
from clients.errors import InvalidArgument
from clients.loop_thread import LoopThread
from clients.types import ConsumerRecord, TopicPartition
from protos.highwater.v1 import broker_pb2_grpc, common_pb2, gateway_pb2_grpc

TOPIC = "t"
TP0, TP1 = TopicPartition(TOPIC, 0), TopicPartition(TOPIC, 1)
BATCHES_PER_ANSWER = 2
WAIT_S_MAX = 10.0  # a bound on every wait in these tests, never reached when they pass
# Settings that keep the tests quick: short back-off, no group.
FAST = {"retry_backoff_ms": 20, "connect_timeout_ms": 1_000, "enable_auto_commit": False}


@dataclass
class FakeLogs:
    """The partitions' logs (one batch per append) and who leads each (a broker id, -1: none)."""

    partitions: int = 2
    batches: dict[int, list[tuple[int, bytes]]] = field(default_factory=dict)  # (base offset, batch)
    ends: dict[int, int] = field(default_factory=dict)
    leaders: dict[int, int] = field(default_factory=dict)
    brokers: list[common_pb2.BrokerNode] = field(default_factory=list)
    appended: asyncio.Event = field(default_factory=asyncio.Event)

    def append(self, partition: int, count: int) -> None:
        """`count` records "p:offset" at the end of the partition's log (on the servers' loop)."""
        base = self.ends.get(partition, 0)
        batch = encode_batch(
            [(None, f"{partition}:{base + i}".encode(), [], 1_000 + base + i) for i in range(count)],
            base_offset=base,
        )
        self.batches.setdefault(partition, []).append((base, batch))
        self.ends[partition] = base + count
        self.appended.set()
        self.appended = asyncio.Event()

    def answer(self, partition: int, offset: int) -> common_pb2.FetchPartitionResponse:
        """The batch holding `offset` and the next ones (the consumer skips records before it)."""
        batches = self.batches.get(partition, [])
        ends = [base for base, _ in batches[1:]] + [self.ends.get(partition, 0)] if batches else []
        chosen = [batch for (_, batch), end in zip(batches, ends, strict=True) if end > offset]
        return common_pb2.FetchPartitionResponse(
            partition=partition,
            high_watermark=self.ends.get(partition, 0),
            records=b"".join(chosen[:BATCHES_PER_ANSWER]),
        )

    async def fetch(
        self, request: common_pb2.FetchRequest, leads: set[int] | None
    ) -> common_pb2.FetchResponse:
        """A Fetch as a broker answers it (`leads`: the partitions it leads; None: a gateway,
        which routes every partition). Waits up to max_wait_ms while nothing is there."""
        deadline = time.monotonic() + request.max_wait_ms / 1000
        while True:
            parts: list[common_pb2.FetchPartitionResponse] = []
            for topic in request.topics:
                for asked in topic.partitions:
                    if leads is not None and asked.partition not in leads:
                        parts.append(
                            common_pb2.FetchPartitionResponse(
                                partition=asked.partition,
                                error_code=common_pb2.NOT_LEADER_OR_FOLLOWER,
                                high_watermark=-1,
                            )
                        )
                    else:
                        parts.append(self.answer(asked.partition, asked.fetch_offset))
            remaining = deadline - time.monotonic()
            if any(p.records or p.error_code for p in parts) or remaining <= 0:
                return common_pb2.FetchResponse(
                    topics=[common_pb2.FetchTopicResponse(topic=TOPIC, partitions=parts)]
                )
            appended = self.appended
            try:
                await asyncio.wait_for(appended.wait(), remaining)
            except TimeoutError:
                pass

    def metadata(self) -> common_pb2.MetadataResponse:
        return common_pb2.MetadataResponse(
            cluster_id="fake",
            controller_id=1,
            brokers=self.brokers,
            topics=[
                common_pb2.TopicMetadata(
                    name=TOPIC,
                    topic_id="id-t",
                    partitions=[
                        common_pb2.PartitionMetadata(partition=p, leader=self.leaders.get(p, -1))
                        for p in range(self.partitions)
                    ],
                )
            ],
        )


class FakeGateway(gateway_pb2_grpc.GatewayServiceServicer):
    def __init__(self, logs: FakeLogs) -> None:
        self.logs = logs
        self.fetch_calls = 0
        self.metadata_calls = 0

    async def Metadata(self, request, context):
        self.metadata_calls += 1
        return self.logs.metadata()

    async def Fetch(self, request, context):
        self.fetch_calls += 1
        return await self.logs.fetch(request, None)


class FakeLeader(broker_pb2_grpc.BrokerServiceServicer):
    """Broker `broker_id`: Fetch of the partitions FakeLogs.leaders names it for, unary and
    over FetchStream (each message answered as the unary call, as a broker does). Records
    when each of its Fetches was out (for the tests on concurrency)."""

    def __init__(self, logs: FakeLogs, broker_id: int) -> None:
        self.logs = logs
        self.broker_id = broker_id
        self.unary_calls = 0
        self.stream_messages = 0
        self.streams_opened = 0
        self.out: list[tuple[float, float]] = []  # (sent, answered), time.monotonic()
        self.hang = False  # take Fetches and never answer them (until the server stops)

    @property
    def fetch_calls(self) -> int:
        return self.unary_calls + self.stream_messages

    async def Fetch(self, request, context):
        self.unary_calls += 1
        return await self._fetch(request)

    async def FetchStream(self, request_iterator, context):
        self.streams_opened += 1
        async for request in request_iterator:
            self.stream_messages += 1
            yield await self._fetch(request)

    async def _fetch(self, request):
        if self.hang:
            await asyncio.Event().wait()
        started = time.monotonic()
        leads = {p for p, leader in self.logs.leaders.items() if leader == self.broker_id}
        try:
            return await self.logs.fetch(request, leads)
        finally:
            self.out.append((started, time.monotonic()))


class UnaryOnlyLeader(FakeLeader):
    """A broker without FetchStream: the generated servicer's own method (NotImplementedError)."""

    FetchStream = broker_pb2_grpc.BrokerServiceServicer.FetchStream  # type: ignore[assignment]


@dataclass
class FakeCluster:
    logs: FakeLogs
    gateway: FakeGateway
    leaders: dict[int, FakeLeader]
    servers: dict[int, grpc.aio.Server]  # 0: the gateway; then each broker id
    thread: LoopThread
    address: str

    def append(self, partition: int, count: int) -> None:
        async def _append() -> None:
            self.logs.append(partition, count)

        self.thread.run(_append())

    def stop_leader(self, broker_id: int) -> None:
        self.thread.run(self.servers[broker_id].stop(None))


@pytest.fixture
def cluster(request: pytest.FixtureRequest) -> Iterator[FakeCluster]:
    """A gateway and two leaders: broker 1 leads partition 0, broker 2 partition 1
    (indirect parameter "unary_only": leaders without FetchStream)."""
    thread = LoopThread("fake-cluster")
    leader_class = UnaryOnlyLeader if getattr(request, "param", None) == "unary_only" else FakeLeader

    async def start() -> FakeCluster:
        logs = FakeLogs(leaders={0: 1, 1: 2})
        gateway = FakeGateway(logs)
        servers: dict[int, grpc.aio.Server] = {}
        server = grpc.aio.server()
        gateway_pb2_grpc.add_GatewayServiceServicer_to_server(gateway, server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        servers[0] = server
        leaders: dict[int, FakeLeader] = {}
        for broker_id in (1, 2):
            leaders[broker_id] = leader_class(logs, broker_id)
            server = grpc.aio.server()
            broker_pb2_grpc.add_BrokerServiceServicer_to_server(leaders[broker_id], server)
            broker_port = server.add_insecure_port("127.0.0.1:0")
            await server.start()
            servers[broker_id] = server
            logs.brokers.append(
                common_pb2.BrokerNode(broker_id=broker_id, host="127.0.0.1", port=broker_port)
            )
        return FakeCluster(logs, gateway, leaders, servers, thread, f"127.0.0.1:{port}")

    fake = thread.run(start())
    try:
        yield fake
    finally:
        for server in fake.servers.values():
            thread.run(server.stop(None))
        thread.stop()


def record_offsets(records: list[ConsumerRecord], into: dict[TopicPartition, list[int]]) -> None:
    for r in records:
        assert r.value == f"{r.partition}:{r.offset}".encode(), r
        into.setdefault(TopicPartition(r.topic, r.partition), []).append(r.offset)


def poll_until(
    consumer: Consumer, into: dict[TopicPartition, list[int]], ends: dict[TopicPartition, int]
) -> None:
    """poll() until every partition's records up to its end offset were handed out (bounded)."""
    deadline = time.monotonic() + WAIT_S_MAX
    while any(len(into.get(tp, [])) < end for tp, end in ends.items()):
        assert time.monotonic() < deadline, f"not every record within {WAIT_S_MAX} s: {into}"
        record_offsets(consumer.poll(timeout_ms=200, max_records=7), into)


def assert_once_each(into: dict[TopicPartition, list[int]], ends: dict[TopicPartition, int]) -> None:
    for tp, end in ends.items():
        assert into.get(tp, []) == list(range(end)), f"{tp}: expected 0..{end - 1} once each: {into.get(tp)}"


def consumer_on(cluster: FakeCluster, **settings: object) -> Consumer:
    consumer = Consumer(bootstrap=cluster.address, **{**FAST, **settings})
    consumer.assign([TP0, TP1])
    consumer.seek(TP0, 0)
    consumer.seek(TP1, 0)
    return consumer


def read_all_knowing_the_leaders(cluster: FakeCluster) -> None:
    """Append 20 records to partition 0 and 15 to partition 1, and read every one once with a
    consumer that has Metadata first (so no Fetch needs a gateway)."""
    for _ in range(5):
        cluster.append(0, 4)
        cluster.append(1, 3)
    got: dict[TopicPartition, list[int]] = {}
    with consumer_on(cluster) as consumer:
        assert consumer.partitions_for_topic(TOPIC) == [0, 1]  # Metadata: the leaders are known
        poll_until(consumer, got, {TP0: 20, TP1: 15})
    assert_once_each(got, {TP0: 20, TP1: 15})


def test_fetches_go_straight_to_each_partitions_leader(cluster: FakeCluster) -> None:
    read_all_knowing_the_leaders(cluster)
    assert cluster.gateway.fetch_calls == 0, "a Fetch went through the gateway"
    for leader in cluster.leaders.values():
        assert leader.fetch_calls >= 1
        assert leader.unary_calls == 0 and leader.streams_opened == 1, "one FetchStream per leader"


@pytest.mark.parametrize("cluster", ["unary_only"], indirect=True)
def test_a_leader_without_fetch_stream_is_read_with_unary_fetches(cluster: FakeCluster) -> None:
    read_all_knowing_the_leaders(cluster)
    assert cluster.gateway.fetch_calls == 0, "a refused stream sent the fetch through the gateway"
    for leader in cluster.leaders.values():
        assert leader.unary_calls >= 1 and leader.stream_messages == 0
        assert leader.streams_opened == 0, "the generated servicer refuses before the handler runs"


def test_without_metadata_the_first_fetch_goes_through_the_gateway_and_the_next_to_the_leaders(
    cluster: FakeCluster,
) -> None:
    cluster.append(0, 4)
    cluster.append(1, 4)
    got: dict[TopicPartition, list[int]] = {}
    with consumer_on(cluster) as consumer:
        poll_until(consumer, got, {TP0: 4, TP1: 4})
        deadline = time.monotonic() + WAIT_S_MAX
        while consumer._async._metadata.leader_address(TP1) is None:  # the background refresh
            assert time.monotonic() < deadline, "no Metadata refresh"
            time.sleep(0.01)
        for _ in range(4):
            cluster.append(0, 4)
            cluster.append(1, 4)
        gateway_fetches = cluster.gateway.fetch_calls
        poll_until(consumer, got, {TP0: 20, TP1: 20})
    assert_once_each(got, {TP0: 20, TP1: 20})
    assert gateway_fetches >= 1 and cluster.gateway.fetch_calls <= gateway_fetches + 1
    assert cluster.leaders[1].fetch_calls >= 1 and cluster.leaders[2].fetch_calls >= 1


def test_two_leaders_are_fetched_at_once_and_records_do_not_wait_for_the_others_long_poll(
    cluster: FakeCluster,
) -> None:
    long_poll_ms = 4_000
    got: dict[TopicPartition, list[int]] = {}
    leader_1, leader_2 = cluster.leaders[1], cluster.leaders[2]
    with consumer_on(cluster, fetch_max_wait_ms=long_poll_ms) as consumer:
        consumer.partitions_for_topic(TOPIC)
        # Nothing to read yet: the poll sends one Fetch to each leader, and both long-poll.
        # Records for partition 0 only come a moment later: its leader answers, and poll()
        # returns them at once, while partition 1's leader is still long-polling.
        appender = threading.Timer(0.3, cluster.append, (0, 5))
        appender.start()
        try:
            started = time.monotonic()
            record_offsets(consumer.poll(timeout_ms=long_poll_ms), got)
            waited_ms = (time.monotonic() - started) * 1000
        finally:
            appender.join(WAIT_S_MAX)
        assert got == {TP0: [0, 1, 2, 3, 4]}
        assert waited_ms < long_poll_ms / 2, f"partition 0's records waited {waited_ms:.0f} ms"
        assert leader_2.fetch_calls == 1 and not leader_2.out, "partition 1's long poll is still out"
        (sent_1, answered_1) = leader_1.out[0]
        assert sent_1 < answered_1 and leader_2.fetch_calls == 1, "both leaders were asked at once"
        cluster.append(1, 3)
        poll_until(consumer, got, {TP0: 5, TP1: 3})
    assert_once_each(got, {TP0: 5, TP1: 3})
    assert leader_2.out[0][0] < answered_1, "partition 1's Fetch was out while partition 0's was answered"
    assert cluster.gateway.fetch_calls == 0


def test_a_stopped_leader_sends_its_partitions_through_the_gateway_and_no_record_is_lost_or_repeated(
    cluster: FakeCluster,
) -> None:
    for _ in range(3):
        cluster.append(0, 5)
        cluster.append(1, 5)
    got: dict[TopicPartition, list[int]] = {}
    with consumer_on(cluster, fetch_max_wait_ms=1_000) as consumer:
        consumer.partitions_for_topic(TOPIC)
        poll_until(consumer, got, {TP0: 15, TP1: 15})
        # Broker 1 goes while its long poll is out (the Fetch ahead); no new leader is named yet.
        metadata_calls = cluster.gateway.metadata_calls
        cluster.stop_leader(1)
        cluster.logs.leaders[0] = -1
        for _ in range(4):
            cluster.append(0, 5)
            cluster.append(1, 5)
        poll_until(consumer, got, {TP0: 35, TP1: 35})
        assert cluster.gateway.fetch_calls >= 1, "partition 0 was not read through the gateway"
        assert cluster.gateway.metadata_calls > metadata_calls, "Metadata was not asked again"
        # A new leader is named: partition 0 goes straight to it (broker 2) once it is known.
        cluster.logs.leaders[0] = 2
        deadline = time.monotonic() + WAIT_S_MAX
        while consumer._async._metadata.leader_address(TP0) is None:
            assert time.monotonic() < deadline, "the new leader was not learned"
            consumer.poll(timeout_ms=50)
        gateway_fetches = cluster.gateway.fetch_calls
        cluster.append(0, 5)
        cluster.append(1, 5)
        poll_until(consumer, got, {TP0: 40, TP1: 40})
    assert_once_each(got, {TP0: 40, TP1: 40})
    assert cluster.gateway.fetch_calls <= gateway_fetches + 1
    assert cluster.leaders[1].fetch_calls >= 1


def test_a_not_leader_answer_refreshes_metadata_and_reads_on_through_the_gateway(
    cluster: FakeCluster,
) -> None:
    for _ in range(3):
        cluster.append(0, 5)
        cluster.append(1, 5)
    got: dict[TopicPartition, list[int]] = {}
    with consumer_on(cluster) as consumer:
        consumer.partitions_for_topic(TOPIC)
        # Broker 2 no longer leads partition 1, and Metadata names no leader for it for now.
        cluster.logs.leaders[1] = -1
        metadata_calls = cluster.gateway.metadata_calls
        poll_until(consumer, got, {TP0: 15, TP1: 15})
        assert cluster.gateway.fetch_calls >= 1 and cluster.gateway.metadata_calls > metadata_calls
    assert_once_each(got, {TP0: 15, TP1: 15})


def test_a_leader_that_does_not_answer_holds_up_neither_poll_nor_the_other_leader(
    cluster: FakeCluster,
) -> None:
    cluster.leaders[1].hang = True
    for _ in range(3):
        cluster.append(0, 5)
        cluster.append(1, 5)
    got: dict[TopicPartition, list[int]] = {}
    with consumer_on(cluster, fetch_max_wait_ms=5_000, request_timeout_ms=5_000) as consumer:
        consumer.partitions_for_topic(TOPIC)
        deadline = time.monotonic() + WAIT_S_MAX
        while len(got.get(TP1, [])) < 15:
            assert time.monotonic() < deadline, f"partition 1 not read within {WAIT_S_MAX} s: {got}"
            started = time.monotonic()
            record_offsets(consumer.poll(timeout_ms=200), got)
            elapsed_ms = (time.monotonic() - started) * 1000
            # poll's bound (docs/CLIENTS.md): timeout + POLL_CALL_GRACE_MS; a loaded machine adds a little.
            assert elapsed_ms < 200 + 50 + 500, elapsed_ms
    assert got == {TP1: list(range(15))}


def test_a_fetch_to_a_silent_leader_is_given_up_once_metadata_names_another(
    cluster: FakeCluster,
) -> None:
    """Broker 1 stops answering with a Fetch out (paused); Metadata then names broker 2 as
    partition 0's leader. The consumer leaves the unanswered Fetch 1 s past its max wait and
    reads on from broker 2, long before request_timeout_ms (30 s)."""
    cluster.append(0, 5)
    got: dict[TopicPartition, list[int]] = {}
    with consumer_on(cluster, fetch_max_wait_ms=100, request_timeout_ms=30_000) as consumer:
        consumer.partitions_for_topic(TOPIC)
        poll_until(consumer, got, {TP0: 5})
        cluster.leaders[1].hang = True
        assert consumer.poll(timeout_ms=300) == []  # its next Fetch is out at broker 1
        cluster.logs.leaders[0] = 2
        cluster.append(0, 5)
        started = time.monotonic()
        poll_until(consumer, got, {TP0: 10})
        took_s = time.monotonic() - started
    assert took_s < 5, f"partition 0 read on after {took_s:.1f} s"
    assert_once_each(got, {TP0: 10})
    assert cluster.gateway.fetch_calls == 0, "straight to the new leader, not through the gateway"


def test_direct_to_leaders_off_fetches_only_through_the_gateway(cluster: FakeCluster) -> None:
    for _ in range(3):
        cluster.append(0, 5)
        cluster.append(1, 5)
    got: dict[TopicPartition, list[int]] = {}
    with consumer_on(cluster, direct_to_leaders=False) as consumer:
        consumer.partitions_for_topic(TOPIC)
        poll_until(consumer, got, {TP0: 15, TP1: 15})
    assert_once_each(got, {TP0: 15, TP1: 15})
    assert cluster.leaders[1].fetch_calls == 0 and cluster.leaders[2].fetch_calls == 0
    assert cluster.gateway.fetch_calls >= 1
    with pytest.raises(InvalidArgument, match="direct_to_leaders"):
        Consumer(bootstrap=cluster.address, direct_to_leaders="yes")
