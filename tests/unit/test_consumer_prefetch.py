"""The Consumer's Fetch ahead: sent while poll() hands out the last answer, used only while it
still continues the consumer's positions.

An AsyncConsumer reads from an in-memory gateway (the real consumer code, the connection
swapped at its seam) whose Fetch answers the test can hold back. Every test reads the whole
log and checks what poll() handed out: from each position, every offset exactly once and in
order (no record twice, none skipped), whatever happened to the answer in flight — a seek,
a new assignment, a rebalance revoking a partition, pause/resume.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import pytest

from clients.common.errors import CorruptMessage
from clients.common.records import encode_batch
from clients.consumer import AsyncConsumer, Consumer
from clients.types import ConsumerRecord, TopicPartition
from protos.highwater.v1 import common_pb2, gateway_pb2

TOPIC = "prefetch"
TP0, TP1 = TopicPartition(TOPIC, 0), TopicPartition(TOPIC, 1)
RECORDS_PER_BATCH = 5
BATCHES_PER_ANSWER = 2  # an answer holds 10 records of a partition: several polls of 3
LOG_RECORDS = 60
WAIT_S_MAX = 10.0  # a bound on every wait in these tests, never reached when they pass


class FakeGateway:
    """Fetch and FetchCommittedOffsets over fixed logs of LOG_RECORDS records per partition.

    `hold` keeps Fetch answers back until `release()`; every request is recorded."""

    def __init__(self, partitions: tuple[TopicPartition, ...] = (TP0, TP1)) -> None:
        self.logs = {
            tp: [
                encode_batch(
                    [
                        (None, f"{tp.partition}:{base + i}".encode(), [], 1_000 + base + i)
                        for i in range(RECORDS_PER_BATCH)
                    ],
                    base_offset=base,
                )
                for base in range(0, LOG_RECORDS, RECORDS_PER_BATCH)
            ]
            for tp in partitions
        }
        self.ever_answered = True
        self.hold = False
        self._released = asyncio.Event()
        self.fetches: list[dict[TopicPartition, int]] = []
        self.answered = 0

    def release(self) -> None:
        self.hold = False
        self._released.set()

    async def call(self, method: str, request: Any, **_: Any) -> Any:
        if method == "FetchCommittedOffsets":
            return gateway_pb2.FetchCommittedOffsetsResponse(
                offsets=[
                    gateway_pb2.CommittedOffset(topic=p.topic, partition=p.partition, offset=0)
                    for p in request.partitions
                ]
            )
        assert method == "Fetch", method
        asked = {
            TopicPartition(t.topic, p.partition): p.fetch_offset for t in request.topics for p in t.partitions
        }
        self.fetches.append(asked)
        if self.hold:
            self._released.clear()
            await self._released.wait()
        self.answered += 1
        by_topic: dict[str, list[common_pb2.FetchPartitionResponse]] = {}
        for tp, offset in asked.items():
            first = offset // RECORDS_PER_BATCH  # the batch holding `offset`: the consumer skips before it
            batches = self.logs[tp][first : first + BATCHES_PER_ANSWER]
            by_topic.setdefault(tp.topic, []).append(
                common_pb2.FetchPartitionResponse(
                    partition=tp.partition, high_watermark=LOG_RECORDS, records=b"".join(batches)
                )
            )
        return common_pb2.FetchResponse(
            topics=[common_pb2.FetchTopicResponse(topic=t, partitions=p) for t, p in by_topic.items()]
        )

    async def close(self) -> None:
        self.release()


class FakeMember:
    """A group member whose target assignment the test sets (clients/group_member.py's surface
    that AsyncConsumer._reconcile reads)."""

    def __init__(self, target: frozenset[TopicPartition]) -> None:
        self.changed = asyncio.Event()
        self.error = None
        self.lost = False
        self.target: frozenset[TopicPartition] | None = target
        self.active = True
        self.member_id = "m-1"
        self.epoch = 1

    def move_to(self, target: frozenset[TopicPartition]) -> None:
        self.target = target
        self.changed.set()

    def report_owned(self, owned: frozenset[TopicPartition]) -> None:
        pass

    def was_fenced(self) -> bool:
        return False

    async def leave(self) -> None:
        pass


def consumer_on(gateway: FakeGateway, **settings: Any) -> AsyncConsumer:
    consumer = AsyncConsumer(bootstrap="127.0.0.1:1", enable_auto_commit=False, **settings)
    consumer._connection = gateway  # type: ignore[assignment]  # the seam: the gateway connection
    return consumer


async def until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT_S_MAX
    while not condition():
        assert time.monotonic() < deadline, f"not within {WAIT_S_MAX} s: {what}"
        await asyncio.sleep(0.001)


async def poll_some(
    consumer: AsyncConsumer, into: dict[TopicPartition, list[int]], max_records: int = 3
) -> None:
    """One poll() that returns records (bounded)."""
    deadline = time.monotonic() + WAIT_S_MAX
    while True:
        got = await consumer.poll(timeout_ms=100, max_records=max_records)
        if got:
            record_offsets(got, into)
            return
        assert time.monotonic() < deadline, "poll() returned nothing"


async def poll_to_end(
    consumer: AsyncConsumer, into: dict[TopicPartition, list[int]], partitions: list[TopicPartition]
) -> None:
    deadline = time.monotonic() + WAIT_S_MAX
    while any(not into.get(tp) or into[tp][-1] < LOG_RECORDS - 1 for tp in partitions):
        assert time.monotonic() < deadline, f"the log's end not reached: {into}"
        record_offsets(await consumer.poll(timeout_ms=100, max_records=3), into)


def record_offsets(records: list[ConsumerRecord], into: dict[TopicPartition, list[int]]) -> None:
    for r in records:
        assert r.value == f"{r.partition}:{r.offset}".encode(), r
        into.setdefault(TopicPartition(r.topic, r.partition), []).append(r.offset)


def assert_contiguous(offsets: list[int], start: int) -> None:
    assert offsets == list(range(start, LOG_RECORDS)), (
        f"expected {start}..{LOG_RECORDS - 1} once each: {offsets}"
    )


@pytest.mark.asyncio
async def test_the_next_fetch_is_out_while_poll_hands_out_the_last_answer() -> None:
    gateway = FakeGateway((TP0,))
    consumer = consumer_on(gateway)
    consumer.assign([TP0])
    consumer.seek(TP0, 0)
    got: dict[TopicPartition, list[int]] = {}
    await poll_some(consumer, got)
    assert got[TP0] == [0, 1, 2]
    # Records 3-9 are still buffered, and the Fetch for what follows them goes out now.
    await until(lambda: len(gateway.fetches) == 2, "the Fetch ahead")
    assert gateway.fetches == [{TP0: 0}, {TP0: 10}]
    await poll_to_end(consumer, got, [TP0])
    assert_contiguous(got[TP0], 0)
    assert len(gateway.fetches) <= LOG_RECORDS // (RECORDS_PER_BATCH * BATCHES_PER_ANSWER) + 2
    await consumer.close()


@pytest.mark.asyncio
@pytest.mark.parametrize("answered", [True, False], ids=["answer-waiting", "answer-still-out"])
@pytest.mark.parametrize("seek_to", [0, 2, 10, 25])
async def test_a_seek_drops_the_answer_fetched_ahead(answered: bool, seek_to: int) -> None:
    gateway = FakeGateway()
    consumer = consumer_on(gateway)
    consumer.assign([TP0, TP1])
    consumer.seek(TP0, 0)
    consumer.seek(TP1, 0)
    before: dict[TopicPartition, list[int]] = {}
    await poll_some(consumer, before, max_records=12)  # the first answer: polls on after it
    gateway.hold = not answered  # before the Fetch ahead leaves: poll() returned without yielding
    await until(lambda: len(gateway.fetches) == 2, "a Fetch sent ahead")
    if answered:
        await until(lambda: gateway.answered == 2, "the Fetch ahead answered")
    consumer.seek(TP0, seek_to)
    gateway.release()
    after: dict[TopicPartition, list[int]] = {}
    await poll_to_end(consumer, after, [TP0, TP1])
    assert_contiguous(after[TP0], seek_to)
    # TP1 was not sought: it goes on from its position, whatever of the answer was dropped.
    assert_contiguous(before.get(TP1, []) + after[TP1], 0)
    await consumer.close()


@pytest.mark.asyncio
@pytest.mark.parametrize("answered", [True, False], ids=["answer-waiting", "answer-still-out"])
async def test_seek_to_beginning_drops_the_answer_fetched_ahead(answered: bool) -> None:
    gateway = FakeGateway((TP0,))
    consumer = consumer_on(gateway)
    consumer.assign([TP0])
    consumer.seek(TP0, 30)
    await poll_some(consumer, {})
    gateway.hold = not answered
    await until(lambda: gateway.answered == (2 if answered else 1), "the Fetch ahead")
    consumer.seek(TP0, 0)  # as seek_to_beginning would, with a position known here
    consumer.seek_to_beginning(TP0)
    consumer.seek(TP0, 5)
    gateway.release()
    after: dict[TopicPartition, list[int]] = {}
    await poll_to_end(consumer, after, [TP0])
    assert_contiguous(after[TP0], 5)
    await consumer.close()


@pytest.mark.asyncio
@pytest.mark.parametrize("answered", [True, False], ids=["answer-waiting", "answer-still-out"])
async def test_a_new_assignment_drops_the_answers_of_the_partitions_it_removes(answered: bool) -> None:
    gateway = FakeGateway()
    consumer = consumer_on(gateway)
    consumer.assign([TP0, TP1])
    consumer.seek(TP0, 0)
    consumer.seek(TP1, 0)
    got: dict[TopicPartition, list[int]] = {}
    await poll_some(consumer, got, max_records=12)
    gateway.hold = not answered
    await until(lambda: gateway.answered == (2 if answered else 1), "the Fetch ahead")
    consumer.assign([TP1])  # TP1 keeps its position; TP0 goes
    gateway.release()
    tp0_before = list(got.get(TP0, []))
    await poll_to_end(consumer, got, [TP1])
    assert got.get(TP0, []) == tp0_before, "a record of an unassigned partition was handed out"
    assert_contiguous(got[TP1], 0)
    consumer.assign([TP0, TP1])  # back, from an explicit position
    consumer.seek(TP0, 7)
    after: dict[TopicPartition, list[int]] = {}
    await poll_to_end(consumer, after, [TP0])
    assert_contiguous(after[TP0], 7)
    await consumer.close()


@pytest.mark.asyncio
@pytest.mark.parametrize("answered", [True, False], ids=["answer-waiting", "answer-still-out"])
async def test_a_rebalance_revoking_a_partition_drops_its_answer(answered: bool) -> None:
    gateway = FakeGateway()
    consumer = consumer_on(gateway, group_id="billing")
    consumer.subscribe([TOPIC])
    member = FakeMember(frozenset({TP0, TP1}))
    consumer._member = member  # type: ignore[assignment]  # the seam: the group's coordinator
    gateway.hold = False
    got: dict[TopicPartition, list[int]] = {}
    await poll_some(consumer, got, max_records=12)
    assert consumer.assignment() == [TP0, TP1]
    await poll_some(consumer, got, max_records=3)
    gateway.hold = not answered
    await until(lambda: len(gateway.fetches) >= 2, "the Fetch ahead")
    if answered:
        await until(lambda: gateway.answered == len(gateway.fetches), "the Fetch ahead answered")
    member.move_to(frozenset({TP1}))
    tp0_before = list(got.get(TP0, []))
    gateway.release()
    await poll_to_end(consumer, got, [TP1])
    assert consumer.assignment() == [TP1]
    assert got.get(TP0, []) == tp0_before, "a record of a revoked partition was handed out"
    assert_contiguous(got[TP1], 0)
    await consumer.close()


@pytest.mark.asyncio
@pytest.mark.parametrize("answered", [True, False], ids=["answer-waiting", "answer-still-out"])
async def test_pause_drops_the_answer_fetched_ahead_and_resume_goes_on_from_the_position(
    answered: bool,
) -> None:
    gateway = FakeGateway()
    consumer = consumer_on(gateway)
    consumer.assign([TP0, TP1])
    consumer.seek(TP0, 0)
    consumer.seek(TP1, 0)
    got: dict[TopicPartition, list[int]] = {}
    await poll_some(consumer, got, max_records=12)
    gateway.hold = not answered
    await until(lambda: gateway.answered == (2 if answered else 1), "the Fetch ahead")
    consumer.pause(TP0)
    gateway.release()
    tp0_paused = list(got.get(TP0, []))
    await poll_to_end(consumer, got, [TP1])
    assert got.get(TP0, []) == tp0_paused, "a record of a paused partition was handed out"
    assert all(TP0 not in asked for asked in gateway.fetches[2:]), "a paused partition was fetched"
    consumer.resume(TP0)
    await poll_to_end(consumer, got, [TP0])
    assert_contiguous(got[TP0], 0)
    assert_contiguous(got[TP1], 0)
    await consumer.close()


@pytest.mark.asyncio
async def test_poll_returns_within_its_timeout_while_the_fetch_ahead_is_unanswered() -> None:
    gateway = FakeGateway((TP0,))
    consumer = consumer_on(gateway)
    consumer.assign([TP0])
    consumer.seek(TP0, 0)
    got: dict[TopicPartition, list[int]] = {}
    record_offsets(await consumer.poll(timeout_ms=5_000, max_records=100), got)
    assert got[TP0] == list(range(10))
    gateway.hold = True  # the gateway stops answering: the Fetch ahead stays out
    await until(lambda: len(gateway.fetches) == 2, "the Fetch ahead")
    for _ in range(2):
        started = time.monotonic()
        assert await consumer.poll(timeout_ms=200) == []
        elapsed_ms = (time.monotonic() - started) * 1000
        # poll's bound (docs/CLIENTS.md): its timeout + POLL_CALL_GRACE_MS; a loaded machine adds a little.
        assert 200 <= elapsed_ms < 200 + 50 + 500, elapsed_ms
    assert len(gateway.fetches) == 2, "a poll sent a second Fetch while one was out"
    gateway.release()
    await poll_to_end(consumer, got, [TP0])
    assert_contiguous(got[TP0], 0)
    await consumer.close()


@pytest.mark.asyncio
async def test_a_corrupt_batch_is_raised_after_the_records_before_it_and_until_a_seek_passes_it() -> None:
    """Answers are decoded a batch at a time as poll() hands them out: a corrupt batch costs
    none of the records ahead of it, is raised at every poll that reaches it (the position
    stays before it, as Kafka's consumer stays at a corrupt record), and a seek moves past."""
    gateway = FakeGateway((TP0,))
    corrupt = bytearray(gateway.logs[TP0][1])  # offsets 5-9
    corrupt[-1] ^= 0xFF  # a value byte: the CRC no longer matches
    gateway.logs[TP0][1] = bytes(corrupt)
    consumer = consumer_on(gateway)
    consumer.assign([TP0])
    consumer.seek(TP0, 0)
    got: dict[TopicPartition, list[int]] = {}
    record_offsets(await consumer.poll(timeout_ms=1_000, max_records=100), got)
    assert got[TP0] == [0, 1, 2, 3, 4]
    for _ in range(2):
        with pytest.raises(CorruptMessage, match="CRC"):
            await consumer.poll(timeout_ms=100)
        assert await consumer.position(TP0) == 5
    consumer.seek(TP0, 10)
    after: dict[TopicPartition, list[int]] = {}
    await poll_to_end(consumer, after, [TP0])
    assert_contiguous(after[TP0], 10)
    await consumer.close()


def test_the_sync_consumer_hands_out_a_fetched_answer_on_the_callers_thread() -> None:
    """Consumer.poll takes records already fetched without the hop to its loop thread while
    the next Fetch is out; every record still comes once, in order."""
    gateway = FakeGateway((TP0,))
    consumer = Consumer(bootstrap="127.0.0.1:1", enable_auto_commit=False)
    consumer._async._connection = gateway  # type: ignore[assignment]  # the seam, as above
    hops = 0
    run = consumer._run

    def counting_run(coro: Any, what: str) -> Any:
        nonlocal hops
        hops += 1
        return run(coro, what)

    consumer._run = counting_run  # type: ignore[method-assign]
    try:
        consumer.assign([TP0])
        consumer.seek(TP0, 0)
        got: dict[TopicPartition, list[int]] = {}
        polls = 0
        deadline = time.monotonic() + WAIT_S_MAX
        while not got.get(TP0) or got[TP0][-1] < LOG_RECORDS - 1:
            assert time.monotonic() < deadline, f"the log's end not reached: {got}"
            record_offsets(consumer.poll(timeout_ms=100, max_records=3), got)
            polls += 1
        assert_contiguous(got[TP0], 0)
        # An answer of 10 records is 4 polls of 3: the first goes to the loop, the rest need not.
        assert hops <= polls // 2, (hops, polls)
    finally:
        consumer.close()
