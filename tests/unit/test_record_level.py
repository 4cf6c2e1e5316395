"""The record-level calls' pure logic: partitions as our Producer picks them, batches under
the size cap, records that round-trip through the codec, whole-request checks."""

from __future__ import annotations

import random

from clients.common.partitioner import StickyPartitioner, partition_for_key
from clients.common.record_batch import iter_batch_headers
from clients.common.records import decode_batches
from protos.highwater.v1 import common_pb2, gateway_pb2
from services.common import limits
from services.gateway import record_level


def _records(*records: gateway_pb2.ProducerRecord) -> list[gateway_pb2.ProducerRecord]:
    return list(records)


def test_keyed_records_go_where_kafkas_partitioner_puts_them():
    keys = [f"user-{i}".encode() for i in range(300)] + [b""]
    plan = record_level.plan_produce(
        "t",
        [gateway_pb2.ProducerRecord(key=k) for k in keys],
        7,
        range(7),
        StickyPartitioner(16384, random.Random(1)),
    )
    placed = {i: p for p, indexes in plan.by_partition.items() for i in indexes}
    assert placed == {i: partition_for_key(k, 7) for i, k in enumerate(keys)}


def test_an_empty_key_is_a_key_and_an_unset_one_is_sticky():
    sticky = StickyPartitioner(16384, random.Random(3))
    records = [gateway_pb2.ProducerRecord(value=b"x") for _ in range(20)] + [
        gateway_pb2.ProducerRecord(key=b"")
    ]
    plan = record_level.plan_produce("t", records, 5, range(5), sticky)
    keyless = {p for p, indexes in plan.by_partition.items() for i in indexes if i < 20}
    assert len(keyless) == 1, "keyless records under the batch size share one partition"
    assert 20 in plan.by_partition[partition_for_key(b"", 5)]


def test_an_explicit_partition_wins_and_one_out_of_range_is_refused_with_a_sentence():
    records = _records(
        gateway_pb2.ProducerRecord(key=b"k", partition=1),
        gateway_pb2.ProducerRecord(partition=9),
        gateway_pb2.ProducerRecord(partition=-1),
    )
    plan = record_level.plan_produce("orders", records, 3, range(3), StickyPartitioner(16384))
    assert plan.by_partition == {1: [0]}
    assert plan.refused[1] == (
        common_pb2.UNKNOWN_TOPIC_OR_PARTITION,
        "topic 'orders' has partitions 0..2; there is no partition 9",
    )
    assert 2 in plan.refused


def test_order_within_a_partition_follows_the_request():
    records = [gateway_pb2.ProducerRecord(key=b"same", value=str(i).encode()) for i in range(50)]
    plan = record_level.plan_produce("t", records, 4, range(4), StickyPartitioner(16384))
    assert list(plan.by_partition.values()) == [list(range(50))]


def test_batches_are_cut_under_the_cap_and_a_large_record_travels_alone():
    records = [gateway_pb2.ProducerRecord(value=b"v" * 1000) for _ in range(10)] + [
        gateway_pb2.ProducerRecord(value=b"big" * 2000)
    ]
    batches = record_level.cut_batches(records, list(range(11)), 4096)
    assert [i for b in batches for i in b] == list(range(11))
    assert batches[-1] == [10]
    for batch in batches[:-1]:
        assert (
            record_level.BATCH_OVERHEAD_BYTES + sum(record_level.record_size_bytes(records[i]) for i in batch)
            <= 4096
        )


def test_batches_hold_at_most_the_records_per_batch_limit():
    records = [gateway_pb2.ProducerRecord() for _ in range(limits.RECORDS_PER_BATCH_MAX + 1)]
    batches = record_level.cut_batches(records, list(range(len(records))), 1 << 30)
    assert [len(b) for b in batches] == [limits.RECORDS_PER_BATCH_MAX, 1]


def test_encoded_records_decode_to_what_was_sent_with_nulls_kept():
    records = _records(
        gateway_pb2.ProducerRecord(
            key=b"k",
            value=b"\x00\xff",
            timestamp_ms=5,
            headers=[
                gateway_pb2.RecordHeader(key="a", value=b"1"),
                gateway_pb2.RecordHeader(key="a", value=b""),
            ],
        ),
        gateway_pb2.ProducerRecord(),
    )
    data = record_level.encode_records(
        records, [0, 1], now_ms=77, compression="zstd", producer_id=12, producer_epoch=3, base_sequence=40
    )
    header = next(iter_batch_headers(data))
    assert (header.producer_id, header.producer_epoch, header.base_sequence, header.records_count) == (
        12,
        3,
        40,
        2,
    )
    decoded = list(decode_batches(data))
    assert [(r.key, r.value, r.headers, r.timestamp_ms) for r in decoded] == [
        (b"k", b"\x00\xff", [("a", b"1"), ("a", b"")], 5),
        (None, None, [], 77),
    ]
    consumed = record_level.consumed_records("t", 2, data, 1)
    assert [(c.offset, c.HasField("key"), c.HasField("value"), c.timestamp_ms) for c in consumed] == [
        (1, False, False, 77)
    ]


def test_sequence_numbers_wrap_like_kafkas():
    assert record_level.next_sequence(2**31 - 2, 5) == 3


def test_written_results_number_offsets_from_the_base_and_honour_log_append_time():
    got = record_level.written_results([4, 7], 1, 100, [10, 20], -1)
    assert [(got[i].offset, got[i].timestamp_ms) for i in (4, 7)] == [(100, 10), (101, 20)]
    got = record_level.written_results([0], 1, 5, [10], 999)
    assert got[0].timestamp_ms == 999


def test_whole_request_problems_are_sentences():
    ok = gateway_pb2.ProduceRecordsRequest(topic="t", records=[gateway_pb2.ProducerRecord()])
    assert record_level.produce_records_problem(ok) is None
    cases = {
        "topic is empty": gateway_pb2.ProduceRecordsRequest(records=[gateway_pb2.ProducerRecord()]),
        "records is empty": gateway_pb2.ProduceRecordsRequest(topic="t"),
        "request_id is 129 characters": gateway_pb2.ProduceRecordsRequest(
            topic="t", records=[gateway_pb2.ProducerRecord()], request_id="r" * 129
        ),
        "timeout_ms must be >= 0": gateway_pb2.ProduceRecordsRequest(
            topic="t", records=[gateway_pb2.ProducerRecord()], timeout_ms=-1
        ),
        "unknown compression 'brotli'": gateway_pb2.ProduceRecordsRequest(
            topic="t", records=[gateway_pb2.ProducerRecord()], compression="brotli"
        ),
        "record 0: timestamp_ms must be >= 0": gateway_pb2.ProduceRecordsRequest(
            topic="t", records=[gateway_pb2.ProducerRecord(timestamp_ms=-5)]
        ),
    }
    for sentence, request in cases.items():
        problem = record_level.produce_records_problem(request)
        assert problem is not None and problem.startswith(sentence), (sentence, problem)


def test_consume_request_problems_are_sentences():
    assert record_level.consume_records_problem(gateway_pb2.ConsumeRecordsRequest(topic="t")) is None
    twice = gateway_pb2.ConsumeRecordsRequest(
        topic="t",
        partitions=[gateway_pb2.ConsumePartition(partition=1), gateway_pb2.ConsumePartition(partition=1)],
    )
    assert record_level.consume_records_problem(twice) == "partition 1 is listed twice"
    assert "max_records must be >= 0" in record_level.consume_records_problem(
        gateway_pb2.ConsumeRecordsRequest(topic="t", max_records=-1)
    )
    assert "start_offset must be -2" in record_level.consume_records_problem(
        gateway_pb2.ConsumeRecordsRequest(
            topic="t", partitions=[gateway_pb2.ConsumePartition(partition=0, start_offset=-3)]
        )
    )
    assert "max_records_per_message" in record_level.consume_records_problem(
        gateway_pb2.ConsumeRecordsRequest(topic="t", max_records_per_message=10**6)
    )


# ---- ConsumeRecords' step over one Fetch answer (record_level.take_fetched) --------------------


def _answer(partition: int, base_offset: int, count: int, hw: int) -> common_pb2.FetchPartitionResponse:
    from clients.common.records import encode_batch

    records = [(b"k", b"v%d" % i, [], 0) for i in range(count)]
    return common_pb2.FetchPartitionResponse(
        partition=partition,
        high_watermark=hw,
        records=encode_batch(records, base_offset=base_offset),
    )


def test_a_fetched_answer_moves_positions_and_stops_at_the_record_limit():
    positions = {0: 10, 1: 0}
    taken = record_level.take_fetched(
        "t", [_answer(0, 10, 3, 13), _answer(1, 0, 4, 4)], positions, None, left=5
    )
    assert [(r.partition, r.offset) for r in taken.records] == [(0, 10), (0, 11), (0, 12), (1, 0), (1, 1)]
    assert positions == {0: 13, 1: 2}, "partition 1 goes on after its last record taken"
    assert not taken.errors and not taken.empty_below_hw


def test_a_fetched_answer_cuts_at_the_end_offsets_and_reports_failures_once():
    positions = {0: 0, 1: 5, 2: 7, 3: 3}
    failed = common_pb2.FetchPartitionResponse(partition=1, error_code=common_pb2.OFFSET_OUT_OF_RANGE)
    moving = common_pb2.FetchPartitionResponse(partition=2, error_code=common_pb2.NOT_LEADER_OR_FOLLOWER)
    hole = common_pb2.FetchPartitionResponse(partition=3, high_watermark=9)
    taken = record_level.take_fetched(
        "t", [_answer(0, 0, 4, 4), failed, moving, hole], positions, {0: 2, 1: 9, 2: 9, 3: 9}, left=-1
    )
    assert [r.offset for r in taken.records] == [0, 1], "records at or past the end are not sent"
    assert [(e.partition, e.error_code, e.next_offset) for e in taken.errors] == [
        (1, common_pb2.OFFSET_OUT_OF_RANGE, 5)
    ]
    assert positions == {0: 4, 2: 7, 3: 3}, "the failed partition is dropped; the moving one kept"
    assert taken.empty_below_hw == [3]


def test_a_read_committed_round_leaves_out_aborted_records_and_stops_at_the_stable_offset():
    """ConsumeRecords' isolation_level 1 (take_fetched, hole_end): an aborted transaction's
    records are dropped, the markers' offsets passed, and an empty answer below the HW but at
    the last stable offset is an open transaction to wait for, not a hole to skip."""
    from clients.common import records
    from clients.common.control_records import ControlType, encode_marker

    def txn(producer_id: int, base_offset: int, value: bytes) -> bytes:
        return records.encode_batch(
            [(None, value, [], 1_000)],
            producer_id=producer_id,
            producer_epoch=0,
            base_sequence=0,
            base_offset=base_offset,
            transactional=True,
        )

    def marker(control: ControlType, producer_id: int, base_offset: int) -> bytes:
        return encode_marker(
            control,
            producer_id=producer_id,
            producer_epoch=0,
            coordinator_epoch=1,
            timestamp_ms=2_000,
            base_offset=base_offset,
        )

    log = (
        txn(7, 0, b"aborted")
        + marker(ControlType.ABORT, 7, 1)
        + txn(8, 2, b"kept")
        + marker(ControlType.COMMIT, 8, 3)
    )
    answer = common_pb2.FetchPartitionResponse(
        partition=0,
        high_watermark=6,
        last_stable_offset=4,
        records=log,
        aborted_transactions=[{"producer_id": 7, "first_offset": 0}],
    )
    positions = {0: 0}
    committed = record_level.take_fetched("t", [answer], positions, None, 0, read_committed=True)
    assert [r.value for r in committed.records] == [b"kept"]
    assert positions == {0: 4}, "past both markers"
    uncommitted = record_level.take_fetched("t", [answer], {0: 0}, None, 0)
    assert [r.value for r in uncommitted.records] == [b"aborted", b"kept"]
    # At the LSO (4) with an open transaction above it: nothing to read, nothing to skip.
    empty = common_pb2.FetchPartitionResponse(partition=0, high_watermark=6, last_stable_offset=4)
    assert record_level.hole_end(4, empty, read_committed=True) is None
    assert record_level.hole_end(4, empty) == 6, "read_uncommitted: a hole up to the HW"
