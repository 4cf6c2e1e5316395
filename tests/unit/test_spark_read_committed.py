"""The Spark reader with kafka.isolation.level=read_committed (issue 41), against a fake leader.

The fake answers as the broker does (services/broker/core.py's Fetch): a read_committed Fetch
reads below the last stable offset and names the aborted transactions whose marker lies at or
after the Fetch offset and that began below the LSO; its first batch always goes whole. A task
must then hand out every committed and non-transactional record of its range once, in offset
order, none of an aborted transaction, and stop at the LSO without waiting for records of a
transaction still open. The GatewayClient must ask Fetch and ListOffsets for read_committed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import pytest
from aiokafka.record.default_records import DefaultRecordBatchBuilder

from clients.common.control_records import ControlType, encode_marker
from clients.common.fetch_request import READ_COMMITTED, READ_UNCOMMITTED
from clients.common.record_batch import iter_batch_headers
from clients.common.records import Record, encode_batch
from protos.highwater.v1 import common_pb2
from spark_connector import columnar, reader
from spark_connector.fetch_response import FetchedPartition
from spark_connector.gateway import GatewayClient, HighwaterSparkError
from spark_connector.options import ClientSettings
from spark_connector.planning import OffsetRange
from spark_connector.reader import read_range

TOPIC = "txns"
ABORTED, COMMITTED, OPEN = 7, 8, 9


def plain(base_offset: int, n: int = 1) -> bytes:
    return encode_batch(
        [Record(None, f"p{base_offset + i}".encode(), [], 1_000) for i in range(n)], base_offset=base_offset
    )


def txn(producer_id: int, base_offset: int, n: int = 2) -> bytes:
    builder = DefaultRecordBatchBuilder(2, 0, 1, producer_id, 0, base_offset, 1 << 20)  # transactional
    for i in range(n):
        builder.append(i, 1_000, None, f"t{base_offset + i}".encode(), [])
    buf = builder.build()
    buf[0:8] = base_offset.to_bytes(8, "big")
    return bytes(buf)


def marker(control: ControlType, producer_id: int, base_offset: int) -> bytes:
    return encode_marker(
        control,
        producer_id=producer_id,
        producer_epoch=0,
        coordinator_epoch=1,
        timestamp_ms=2_000,
        base_offset=base_offset,
    )


# offsets 0-1 plain, 2-3 aborted, 4 plain, 5-6 committed, 7 ABORT, 8 COMMIT, 9 plain, 10-11 an
# open transaction (the LSO is 10), 12 plain (below the HW 13, above the LSO).
LOG = [
    plain(0, 2),
    txn(ABORTED, 2),
    plain(4),
    txn(COMMITTED, 5),
    marker(ControlType.ABORT, ABORTED, 7),
    marker(ControlType.COMMIT, COMMITTED, 8),
    plain(9),
    txn(OPEN, 10),
    plain(12),
]
HW, LSO = 13, 10
ABORTED_TXNS = [(ABORTED, 2, 7)]  # producer, first offset, marker offset
COMMITTED_OFFSETS = [0, 1, 4, 5, 6, 9]


@dataclass
class FakeLeader:
    """The GatewayClient surface read_range uses, answering from LOG."""

    read_committed: bool
    aborted_txns: Sequence[tuple[int, int, int]] = tuple(ABORTED_TXNS)

    def __post_init__(self) -> None:
        self.settings = SimpleNamespace(retry_timeout_ms=300)
        self.fetches: list[int] = []

    def fetch_future(
        self, tp: tuple[str, int], offset: int, max_bytes: int, max_wait_ms: int = 0
    ) -> Callable[[], FetchedPartition]:
        self.fetches.append(offset)
        bound = LSO if self.read_committed else HW
        records = b""
        for batch in LOG:
            (h,) = iter_batch_headers(batch)
            if h.last_offset < offset or h.base_offset >= bound:
                continue
            if records and len(records) + len(batch) > max_bytes:
                break
            records += batch
        aborted = tuple(
            (producer, first)
            for producer, first, end in self.aborted_txns
            if self.read_committed and records and end >= offset and first < bound
        )
        answer = FetchedPartition(
            partition=tp[1],
            high_watermark=HW,
            log_end_offset=HW,
            records=memoryview(records),
            last_stable_offset=LSO,
            aborted_transactions=aborted,
        )
        return lambda: answer


def spark_read(leader: FakeLeader, start: int, end: int, max_bytes: int = 1 << 20) -> list[tuple[int, bytes]]:
    options: Any = SimpleNamespace(
        client=SimpleNamespace(fetch_max_bytes=max_bytes),
        include_headers=False,
        fail_on_data_loss=True,
        read_committed=leader.read_committed,
    )
    rows: list[tuple[int, bytes]] = []
    for batch in read_range(leader, OffsetRange(TOPIC, 0, start, end), options):  # type: ignore[arg-type]
        rows += zip(batch.column("offset").to_pylist(), batch.column("value").to_pylist(), strict=True)
    return rows


@pytest.mark.parametrize("max_bytes", [1, 1 << 20], ids=["batch-per-fetch", "all"])
@pytest.mark.parametrize(("start", "end"), [(0, LSO), (0, 4), (2, 6), (3, 8), (5, LSO), (7, LSO)])
def test_a_read_committed_range_holds_no_record_of_an_aborted_transaction(
    start: int, end: int, max_bytes: int
) -> None:
    got = spark_read(FakeLeader(read_committed=True), start, end, max_bytes)
    assert [o for o, _ in got] == [o for o in COMMITTED_OFFSETS if start <= o < end]
    assert all(value in (f"p{o}".encode(), f"t{o}".encode()) for o, value in got)


def test_a_read_uncommitted_range_holds_every_data_record_as_before() -> None:
    got = spark_read(FakeLeader(read_committed=False), 0, HW)
    assert [o for o, _ in got] == [0, 1, 2, 3, 4, 5, 6, 9, 10, 11, 12]


def test_a_read_committed_range_ending_at_the_lso_is_read_at_once() -> None:
    """The plan's end is the LSO (planning's latest): the task ends there, past a marker, and never
    waits for the open transaction's records."""
    leader = FakeLeader(read_committed=True)
    assert [o for o, _ in spark_read(leader, 9, LSO)] == [9]
    assert leader.fetches == [9]


def test_a_range_past_the_lso_waits_for_it_then_fails_naming_it() -> None:
    """Records above the LSO are not read while their transaction is open: a range reaching past
    it (a plan from before the LSO fell back, as after a leader change) makes no progress there,
    and after highwater.retry.timeout.ms the error says what it waited for."""
    with pytest.raises(
        HighwaterSparkError, match=r"no progress at offset 10 .*no records \(last stable offset 10\)"
    ):
        spark_read(FakeLeader(read_committed=True), 9, 12)


def test_an_answer_that_drops_nothing_is_decoded_from_the_received_view(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """No copy when no batch goes: an aborted transaction named whose batches are not in the answer."""
    seen: list[object] = []
    decode = columnar.decode_columns

    def spy(buf: Any, **kwargs: Any) -> Any:
        seen.append(buf)
        return decode(buf, **kwargs)

    monkeypatch.setattr(reader, "decode_columns", spy)
    leader = FakeLeader(read_committed=True, aborted_txns=[(OPEN + 100, 0, 8)])
    assert [o for o, _ in spark_read(leader, 0, 4)] == [0, 1, 2, 3]
    assert seen and all(isinstance(buf, memoryview) for buf in seen)
    seen.clear()
    assert [o for o, _ in spark_read(FakeLeader(read_committed=True), 0, 4)] == [0, 1]
    assert seen and all(isinstance(buf, bytes) for buf in seen), "dropping copies the kept batches"


def test_the_client_asks_fetch_and_list_offsets_for_its_isolation_level(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    asked: list[Any] = []

    def call(method: str, request: Any, **_: Any) -> common_pb2.ListOffsetsResponse:
        asked.append(request)
        partition = common_pb2.ListOffsetsPartitionResponse(partition=0, offset=LSO)
        return common_pb2.ListOffsetsResponse(
            topics=[common_pb2.ListOffsetsTopicResponse(topic=TOPIC, partitions=[partition])]
        )

    for read_committed, level in ((False, READ_UNCOMMITTED), (True, READ_COMMITTED)):
        client = GatewayClient("127.0.0.1:1", ClientSettings(), read_committed=read_committed)
        assert client.fetch_request((TOPIC, 0), 5, 1024).isolation_level == level
        monkeypatch.setattr(client, "call", call)
        assert client.list_offsets({(TOPIC, 0): -1}) == {(TOPIC, 0): (LSO, common_pb2.NONE)}
        assert asked.pop().isolation_level == level
