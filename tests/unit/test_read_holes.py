"""Readers across a compacted log's holes (issue 39).

The log cleaner removes records and whole batches and keeps the offsets of the rest, so a
compacted log has holes: gaps between batches, batches whose last records are gone (their
last offset delta kept, as Kafka keeps it), batches left with no record at all (a
producer's last batch), and a hole that may reach the high watermark (the active segment
is empty after a time roll). Each reader here is fed Fetch answers of such a log by a fake
leader that reads as the broker does (a Fetch at an offset inside a hole answers from the
next batch; the first batch of an answer always goes whole; nothing at or past the HW),
and must hand out exactly the records kept, once each, in order, and know where the log
ends: the Consumer (positions, lag, seek), the Spark reader's offset ranges, and the
gateway's record-level ConsumeRecords (stop_at_end, max_records).
"""

from __future__ import annotations

import asyncio
import struct
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import pytest
from aiokafka.record.default_records import DefaultRecordBatchBuilder
from crc32c import crc32c

from clients.common.record_batch import (
    CRC_POS,
    CRC_START_POS,
    LAST_OFFSET_DELTA_POS,
    iter_batch_headers,
    parse_header,
)
from clients.common.records import COMPRESSION_CODES, decode_batches
from clients.consumer import AsyncConsumer
from clients.types import TopicPartition
from protos.highwater.v1 import common_pb2, gateway_pb2
from spark_connector.fetch_response import FetchedPartition
from spark_connector.planning import OffsetRange
from spark_connector.reader import read_range

TOPIC = "holes"
TP0 = TopicPartition(TOPIC, 0)
TIMESTAMP_MS = 1_700_000_000_000
WAIT_S_MAX = 10.0  # a bound on every wait here, never reached when the tests pass


# --- a compacted log ------------------------------------------------------------------------------


def cleaned_batch(
    base_offset: int, kept: Sequence[int], last_offset_delta: int, compression: str = "none"
) -> bytes:
    """A batch as the cleaner leaves it: records at offset deltas `kept` (increasing, possibly
    none), the original last_offset_delta, base offset and codec kept, the CRC recomputed."""
    builder = DefaultRecordBatchBuilder(2, COMPRESSION_CODES[compression], 0, -1, -1, -1, 2**31 - 1)
    for delta in kept:
        offset = base_offset + delta
        builder.append(delta, TIMESTAMP_MS + offset, f"k{offset}".encode(), f"v{offset}".encode(), [])
    out = bytearray(builder.build())
    struct.pack_into(">q", out, 0, base_offset)
    struct.pack_into(">i", out, LAST_OFFSET_DELTA_POS, last_offset_delta)
    struct.pack_into(">I", out, CRC_POS, crc32c(memoryview(out)[CRC_START_POS:]))
    return bytes(out)


# Offsets 0..39 were written; the cleaner kept 0, 1, 2, 11, 13, 20..25 and 36 (HW 38):
#   [0, 5)   records 3 and 4 gone from its end, last offset delta 4 kept
#   [5, 10)  removed whole
#   [10, 14) zstd, records 11 and 13 kept
#   [14, 17) no record left (a producer's last batch)
#   [17, 20) removed whole
#   [20, 25) whole
#   [25, 35) record 25 only
#   [35, 38) record 36 only, in the middle
#   [38, 40) removed whole: a hole that reaches the log end offset 40 (HW 40 in HOLE_AT_END)
BATCHES = [
    cleaned_batch(0, [0, 1, 2], 4),
    cleaned_batch(10, [1, 3], 3, "zstd"),
    cleaned_batch(14, [], 2),
    cleaned_batch(20, [0, 1, 2, 3, 4], 4, "lz4"),
    cleaned_batch(25, [0], 9),
    cleaned_batch(35, [1], 2, "gzip"),
]
KEPT = [0, 1, 2, 11, 13, 20, 21, 22, 23, 24, 25, 36]
HW = 38
HOLE_AT_END = 40


@dataclass
class CompactedLog:
    """A leader's copy of the log: reads as services/broker/log reads across holes."""

    batches: list[bytes]
    high_watermark: int
    log_start_offset: int = 0

    def read(self, offset: int, max_bytes: int, *, first_in_answer: bool = True) -> bytes:
        """Whole batches from the first whose next offset is past `offset`, below the HW, within
        max_bytes, the first whole whatever its size when it is the answer's first."""
        out = bytearray()
        for batch in self.batches:
            header = parse_header(batch)
            if header.next_offset <= offset:
                continue
            if header.next_offset > self.high_watermark:
                break
            if len(out) + len(batch) > max_bytes and (out or not first_in_answer):
                break
            out += batch
        return bytes(out)

    def answer(
        self, partition: int, offset: int, max_bytes: int, *, first_in_answer: bool = True
    ) -> common_pb2.FetchPartitionResponse:
        return common_pb2.FetchPartitionResponse(
            partition=partition,
            high_watermark=self.high_watermark,
            log_start_offset=self.log_start_offset,
            log_end_offset=max(self.high_watermark, HOLE_AT_END),
            records=self.read(offset, max_bytes, first_in_answer=first_in_answer),
        )


def test_the_fake_leader_reads_as_the_broker_across_holes() -> None:
    log = CompactedLog(BATCHES, HW)
    assert [r.offset for r in decode_batches(log.read(0, 1 << 20))] == KEPT
    # Inside a hole (and inside a batch's removed tail): the next batch.
    assert parse_header(log.read(6, 1)).base_offset == 10
    assert parse_header(log.read(3, 1)).base_offset == 0
    assert [h.next_offset for h in iter_batch_headers(log.read(0, 1 << 20))] == [5, 14, 17, 25, 35, 38]
    assert log.read(HW, 1 << 20) == b""


# --- the Consumer -------------------------------------------------------------------------------


class FakeGateway:
    """Fetch and ListOffsets over one CompactedLog per partition; the Consumer's connection seam."""

    def __init__(self, logs: dict[TopicPartition, CompactedLog], answer_bytes: int) -> None:
        self.logs = logs
        self.answer_bytes = answer_bytes
        self.ever_answered = True
        self.fetches: list[dict[TopicPartition, int]] = []

    async def call(self, method: str, request: Any, **_: Any) -> Any:
        if method == "ListOffsets":
            return common_pb2.ListOffsetsResponse(
                topics=[
                    common_pb2.ListOffsetsTopicResponse(
                        topic=t.topic,
                        partitions=[
                            common_pb2.ListOffsetsPartitionResponse(
                                partition=p.partition,
                                offset=self.logs[TopicPartition(t.topic, p.partition)].high_watermark,
                            )
                            for p in t.partitions
                        ],
                    )
                    for t in request.topics
                ]
            )
        assert method == "Fetch", method
        asked = {
            TopicPartition(t.topic, p.partition): p.fetch_offset for t in request.topics for p in t.partitions
        }
        self.fetches.append(asked)
        answers: list[common_pb2.FetchPartitionResponse] = []
        used = 0
        for tp, offset in asked.items():
            # The answer's byte budget as a broker spends it: later partitions get what is left.
            pr = self.logs[tp].answer(
                tp.partition, offset, max(self.answer_bytes - used, 1), first_in_answer=used == 0
            )
            used += len(pr.records)
            answers.append(pr)
        await asyncio.sleep(0)
        return common_pb2.FetchResponse(
            topics=[common_pb2.FetchTopicResponse(topic=TOPIC, partitions=answers)]
        )

    async def close(self) -> None:
        pass


def consumer_on(gateway: FakeGateway) -> AsyncConsumer:
    consumer = AsyncConsumer(
        bootstrap="127.0.0.1:1", enable_auto_commit=False, direct_to_leaders=False, fetch_max_wait_ms=10
    )
    consumer._connection = gateway  # type: ignore[assignment]  # the seam: the gateway connection
    return consumer


async def poll_until(
    consumer: AsyncConsumer, done: Callable[[list[int]], bool], max_records: int
) -> list[int]:
    got: list[int] = []
    deadline = time.monotonic() + WAIT_S_MAX
    while not done(got):
        assert time.monotonic() < deadline, f"not done within {WAIT_S_MAX} s: {got}"
        for record in await consumer.poll(timeout_ms=20, max_records=max_records):
            assert record.value == f"v{record.offset}".encode() and record.key == f"k{record.offset}".encode()
            got.append(record.offset)
    return got


@pytest.mark.asyncio
@pytest.mark.parametrize("max_records", [1, 2, 5, 500])
@pytest.mark.parametrize("answer_bytes", [1, 200, 1 << 20], ids=["batch-per-answer", "some", "all"])
async def test_the_consumer_hands_out_every_kept_record_once_and_ends_at_the_last_batchs_next_offset(
    max_records: int, answer_bytes: int
) -> None:
    consumer = consumer_on(FakeGateway({TP0: CompactedLog(BATCHES, HW)}, answer_bytes))
    consumer.assign([TP0])
    consumer.seek(TP0, 0)
    got = await poll_until(consumer, lambda got: bool(got) and got[-1] == KEPT[-1], max_records)
    assert got == KEPT
    # Record 36 was its batch's last record, but the batch ends at 37: the position is 38.
    assert await consumer.position(TP0) == HW
    assert await consumer.lag(TP0) == 0
    await consumer.close()


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("seek_to", "first"),
    [
        (3, 11),
        (4, 11),
        (5, 11),
        (9, 11),
        (10, 11),
        (12, 13),
        (14, 20),
        (16, 20),
        (18, 20),
        (26, 36),
        (37, 36),
    ],
)
async def test_a_seek_into_a_hole_reads_on_from_the_next_kept_record(seek_to: int, first: int) -> None:
    consumer = consumer_on(FakeGateway({TP0: CompactedLog(BATCHES, HW)}, 1 << 20))
    consumer.assign([TP0])
    consumer.seek(TP0, seek_to)
    if first < seek_to:  # 37: nothing kept at or after it below the HW
        assert await consumer.poll(timeout_ms=50) == []
        return
    got = await poll_until(consumer, lambda got: bool(got) and got[-1] == KEPT[-1], 500)
    assert got == [o for o in KEPT if o >= seek_to] and got[0] == first
    await consumer.close()


@pytest.mark.asyncio
@pytest.mark.parametrize("answer_bytes", [1, 1 << 20])
async def test_the_consumer_moves_past_a_hole_that_reaches_the_high_watermark(answer_bytes: int) -> None:
    """The last batch [38, 40) was removed whole: a Fetch at 38 finds nothing below HW 40, and
    asked alone that proves the hole. The position reaches the HW, the lag is 0: a reader
    waiting for position >= end offset finishes."""
    consumer = consumer_on(FakeGateway({TP0: CompactedLog(BATCHES, HOLE_AT_END)}, answer_bytes))
    consumer.assign([TP0])
    consumer.seek(TP0, 0)
    got = await poll_until(consumer, lambda got: bool(got) and got[-1] == KEPT[-1], 500)
    assert got == KEPT
    deadline = time.monotonic() + WAIT_S_MAX
    while await consumer.position(TP0) < HOLE_AT_END:
        assert time.monotonic() < deadline, f"position stuck at {await consumer.position(TP0)}"
        assert await consumer.poll(timeout_ms=20) == []
    assert await consumer.position(TP0) == HOLE_AT_END
    assert await consumer.lag(TP0) == 0
    await consumer.close()


@pytest.mark.asyncio
async def test_an_empty_answer_in_a_shared_fetch_does_not_skip_records() -> None:
    """Two partitions in one Fetch whose byte budget the first uses up: the second comes back
    empty below its HW though it has records. That proves no hole: its position stays."""
    tp1 = TopicPartition(TOPIC, 1)
    gateway = FakeGateway({TP0: CompactedLog(BATCHES, HW), tp1: CompactedLog(BATCHES, HW)}, 1)
    consumer = consumer_on(gateway)
    consumer.assign([TP0, tp1])
    consumer.seek(TP0, 0)
    consumer.seek(tp1, 0)
    got: dict[int, list[int]] = {0: [], 1: []}
    deadline = time.monotonic() + WAIT_S_MAX
    while got[0] != KEPT or got[1] != KEPT:
        assert time.monotonic() < deadline, got
        for record in await consumer.poll(timeout_ms=20, max_records=500):
            got[record.partition].append(record.offset)
    assert any(len(f) == 2 for f in gateway.fetches), "the partitions were fetched together"
    await consumer.close()


# --- the Spark reader ---------------------------------------------------------------------------


class FakeSparkClient:
    """The GatewayClient surface read_range uses: one-partition Fetches of a CompactedLog."""

    def __init__(self, log: CompactedLog) -> None:
        self.log = log
        self.settings = SimpleNamespace(retry_timeout_ms=300)
        self.fetches: list[int] = []

    def fetch_future(
        self, tp: tuple[str, int], offset: int, max_bytes: int, max_wait_ms: int = 0
    ) -> Callable[[], FetchedPartition]:
        self.fetches.append(offset)
        pr = self.log.answer(tp[1], offset, max_bytes)
        return lambda: FetchedPartition(
            pr.partition, pr.error_code, pr.high_watermark, pr.log_start_offset, pr.log_end_offset, pr.records
        )


def spark_read(log: CompactedLog, start: int, end: int, max_bytes: int = 1 << 20) -> list[int]:
    client = FakeSparkClient(log)
    options: Any = SimpleNamespace(
        client=SimpleNamespace(fetch_max_bytes=max_bytes),
        include_headers=False,
        fail_on_data_loss=True,
        read_committed=False,
    )
    rows: list[int] = []
    for batch in read_range(client, OffsetRange(TOPIC, 0, start, end), options):  # type: ignore[arg-type]
        rows += batch.column("offset").to_pylist()
    return rows


@pytest.mark.parametrize("max_bytes", [1, 1 << 20], ids=["batch-per-fetch", "all"])
@pytest.mark.parametrize(
    ("start", "end"),
    [
        (0, HW),
        (0, 3),
        (0, 5),
        (3, 12),
        (5, 10),
        (6, 14),
        (12, 21),
        (14, 20),
        (17, 26),
        (25, 36),
        (26, 35),
        (36, 37),
    ],
)
def test_a_spark_range_holds_the_kept_records_of_its_offsets_whatever_their_count(
    start: int, end: int, max_bytes: int
) -> None:
    assert spark_read(CompactedLog(BATCHES, HW), start, end, max_bytes) == [
        o for o in KEPT if start <= o < end
    ]


@pytest.mark.parametrize("start", [0, 26, 37, 38, 39])
def test_a_spark_range_ending_in_a_hole_that_reaches_the_high_watermark_is_complete(start: int) -> None:
    """[38, 40) holds no record: a Fetch there finds nothing below HW 40. The range is read
    once the position passes 39, at once, not after highwater.retry.timeout.ms of waiting."""
    assert spark_read(CompactedLog(BATCHES, HOLE_AT_END), start, HOLE_AT_END) == [
        o for o in KEPT if o >= start
    ]


def test_spark_task_ranges_split_by_offsets_each_read_whole() -> None:
    """Ranges split by offsets (minPartitions) hold different numbers of rows; together they
    read every kept record once."""
    from spark_connector.planning import split_ranges

    pieces = split_ranges([OffsetRange(TOPIC, 0, 0, HOLE_AT_END)], min_partitions=7)
    assert len(pieces) == 7
    rows = [row for p in pieces for row in spark_read(CompactedLog(BATCHES, HOLE_AT_END), p.start, p.end)]
    assert rows == KEPT


# --- the gateway's ConsumeRecords ---------------------------------------------------------------


class FakeContext:
    def cancelled(self) -> bool:
        return False

    async def abort(self, code: Any, details: str) -> None:
        raise AssertionError(f"aborted: {code} {details}")


class FakeCache:
    def __init__(self, partitions: int) -> None:
        self.count = partitions

    def topics(self) -> list[str]:
        return [TOPIC]

    def partitions_of(self, topic: str) -> list[int]:
        return list(range(self.count))

    @property
    def partitions(self) -> dict[tuple[str, int], object]:
        return {(TOPIC, p): object() for p in range(self.count)}


def gateway_on(logs: dict[int, CompactedLog], answer_bytes: int) -> Any:
    from coordinator.memory_store import MemoryStore
    from services.gateway.server import GatewayServicer

    gw = GatewayServicer(MemoryStore(), None)  # type: ignore[arg-type]  # no peer is called here
    gw.view.cache = FakeCache(len(logs))  # type: ignore[assignment]
    gw.fetches = []  # type: ignore[attr-defined]

    async def fetch(request: common_pb2.FetchRequest) -> common_pb2.FetchResponse:
        answers = []
        used = 0
        for p in request.topics[0].partitions:
            gw.fetches.append(p.fetch_offset)  # type: ignore[attr-defined]
            pr = logs[p.partition].answer(
                p.partition, p.fetch_offset, max(answer_bytes - used, 1), first_in_answer=used == 0
            )
            used += len(pr.records)
            answers.append(pr)
        await asyncio.sleep(0)
        return common_pb2.FetchResponse(
            topics=[common_pb2.FetchTopicResponse(topic=TOPIC, partitions=answers)]
        )

    async def resolve_starts(
        topic: str, starts: dict[int, int], errors: list[Any], read_committed: bool = False
    ) -> dict[int, int]:
        # -1 (latest) is the HW, -2 (earliest) the log start (no transactions here: LSO = HW).
        return {
            p: (logs[p].high_watermark if s == -1 else logs[p].log_start_offset if s == -2 else s)
            for p, s in starts.items()
        }

    gw.leaders.fetch = fetch  # type: ignore[method-assign]
    gw.streams._resolve_starts = resolve_starts  # type: ignore[method-assign]
    return gw


async def consume_records(gw: Any, request: gateway_pb2.ConsumeRecordsRequest) -> list[tuple[int, int]]:
    """(partition, offset) of every record of a ConsumeRecords stream, which must end by itself."""
    got: list[tuple[int, int]] = []

    async def drain(stream: AsyncIterator[gateway_pb2.ConsumeRecordsResponse]) -> None:
        async for message in stream:
            assert not message.errors, message.errors
            got.extend((r.partition, r.offset) for r in message.records)

    await asyncio.wait_for(drain(gw.ConsumeRecords(request, FakeContext())), WAIT_S_MAX)
    return got


@pytest.mark.asyncio
@pytest.mark.parametrize("answer_bytes", [1, 1 << 20])
@pytest.mark.parametrize("hw", [HW, HOLE_AT_END], ids=["hw-after-a-batch", "hw-after-a-hole"])
async def test_consume_records_stop_at_end_ends_after_the_last_kept_record(
    answer_bytes: int, hw: int
) -> None:
    gw = gateway_on({0: CompactedLog(BATCHES, hw), 1: CompactedLog(BATCHES, hw)}, answer_bytes)
    got = await consume_records(
        gw, gateway_pb2.ConsumeRecordsRequest(topic=TOPIC, default_start_offset=-2, stop_at_end=True)
    )
    for partition in (0, 1):
        assert [o for p, o in got if p == partition] == KEPT


@pytest.mark.asyncio
@pytest.mark.parametrize("hw", [HW, HOLE_AT_END], ids=["hw-after-a-batch", "hw-after-a-hole"])
@pytest.mark.parametrize("start", [3, 5, 12, 14, 18, 37])
async def test_consume_records_from_inside_a_hole(start: int, hw: int) -> None:
    gw = gateway_on({0: CompactedLog(BATCHES, hw)}, 1 << 20)
    got = await consume_records(
        gw,
        gateway_pb2.ConsumeRecordsRequest(
            topic=TOPIC,
            partitions=[gateway_pb2.ConsumePartition(partition=0, start_offset=start)],
            stop_at_end=True,
        ),
    )
    assert [o for _, o in got] == [o for o in KEPT if o >= start]


@pytest.mark.asyncio
@pytest.mark.parametrize("max_records", [1, 3, 4, 11])
async def test_consume_records_max_records_counts_records_not_offsets(max_records: int) -> None:
    gw = gateway_on({0: CompactedLog(BATCHES, HOLE_AT_END)}, 1 << 20)
    got = await consume_records(
        gw, gateway_pb2.ConsumeRecordsRequest(topic=TOPIC, default_start_offset=-2, max_records=max_records)
    )
    assert [o for _, o in got] == KEPT[:max_records]
