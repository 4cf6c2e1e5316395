"""The partition log: appends, reads, segments, retention, truncation, checkpoints, recovery.

Every behaviour runs against MemoryStorage and real files (tmp_path) unless it needs
one of them: crash semantics need MemoryStorage, on-disk formats need real files.
"""

from __future__ import annotations

import ast
import logging
import os
import random
import struct
from pathlib import Path

import pytest

from clients.common.errors import (
    CorruptMessage,
    InvalidConfig,
    InvariantViolation,
    MessageTooLarge,
    OffsetOutOfRange,
    StorageError,
)
from clients.common.record_batch import (
    BASE_OFFSET_POS,
    TIMESTAMP_TYPE_MASK,
    BatchFix,
    apply_batch_fixes,
    assign_offsets,
    validate_batches,
)
from clients.common.records import decode_batches, encode_batch, encode_values
from services.broker.log import (
    EARLIEST_TIMESTAMP,
    LATEST_TIMESTAMP,
    MAX_TIMESTAMP,
    Log,
    LogConfig,
    MemoryStorage,
    checkpoints,
)
from services.broker.log.checkpoints import HighWatermarkCheckpoint
from services.broker.log.file_storage import FileStorage
from services.broker.log.storage import Storage
from services.common.limits import OPEN_SEGMENT_FILES_MAX
from tests.python_source import parse_python

SMALL = LogConfig(segment_bytes=2_000, index_interval_bytes=100, retention_ms=-1, max_message_bytes=1_500)


def batch(count: int = 3, timestamp_ms: int = 1_000, size: int = 10) -> bytes:
    return encode_values([b"%0*d" % (size, i) for i in range(count)], timestamp_ms=timestamp_ms)


def offsets(records: bytes) -> list[int]:
    return [record.offset for record in decode_batches(records)]


@pytest.fixture(params=["memory", "file", "memory-evicting", "file-evicting"])
def place(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[Storage, str]:
    # "-evicting": a cache of two open files, so inactive segments' files are closed and
    # reopened all the time (tests/unit/test_segment_handles.py has the bound itself).
    open_files_max = 2 if request.param.endswith("-evicting") else OPEN_SEGMENT_FILES_MAX
    if request.param.startswith("memory"):
        return MemoryStorage(open_files_max=open_files_max), "/data/topic-0"
    return FileStorage(open_files_max=open_files_max), str(tmp_path / "topic-0")


def open_log(place: tuple[Storage, str], config: LogConfig = SMALL, now_ms: int = 0) -> Log:
    storage, directory = place
    return Log.open(directory, config, storage=storage, now_ms=now_ms)


def fill(log: Log, batches: int, *, count: int = 3, epoch: int = 0, timestamp_ms: int = 1_000) -> None:
    for i in range(batches):
        log.append_as_leader(batch(count, timestamp_ms + i), leader_epoch=epoch, now_ms=i)


def read_all(log: Log, start: int | None = None, max_bytes: int = 700) -> list[int]:
    offset = log.log_start_offset if start is None else start
    seen: list[int] = []
    while offset < log.log_end_offset:
        fetched = log.read(offset, max_bytes=max_bytes)
        got = offsets(fetched.records)
        assert got, f"no progress at {offset}"
        seen.extend(o for o in got if o >= offset)
        offset = fetched.next_offset
    return seen


# --- appends -------------------------------------------------------------------------


def test_leader_append_assigns_contiguous_offsets_from_the_leo(place: tuple[Storage, str]) -> None:
    log = open_log(place)
    first = log.append_as_leader(batch(3) + batch(2), leader_epoch=4, now_ms=0)
    second = log.append_as_leader(batch(5, timestamp_ms=2_000), leader_epoch=4, now_ms=1)
    assert (first.first_offset, first.last_offset, first.next_offset, first.batch_count) == (0, 4, 5, 2)
    assert [(h.base_offset, h.partition_leader_epoch) for h in first.headers] == [(0, 4), (3, 4)]
    assert (second.first_offset, second.next_offset, second.max_timestamp_ms) == (5, 10, 2_000)
    assert first.size_bytes == len(batch(3) + batch(2))
    assert log.log_end_offset == 10
    assert offsets(log.read(0, max_bytes=10_000).records) == list(range(10))


def test_invalid_batch_reaches_nothing(place: tuple[Storage, str]) -> None:
    log = open_log(place)
    fill(log, 2)
    size = log.size_bytes
    damaged = bytearray(batch())
    damaged[-1] ^= 1
    with pytest.raises(CorruptMessage):
        log.append_as_leader(batch() + bytes(damaged), leader_epoch=0, now_ms=0)
    with pytest.raises(MessageTooLarge):
        log.append_as_leader(batch(200, size=100), leader_epoch=0, now_ms=0)
    assert (log.size_bytes, log.log_end_offset) == (size, 6)


def test_message_too_large_uses_max_message_bytes(place: tuple[Storage, str]) -> None:
    data = batch(20, size=50)
    log = open_log(place, LogConfig(max_message_bytes=len(data) - 1))
    with pytest.raises(MessageTooLarge):
        log.append_as_leader(data, leader_epoch=0, now_ms=0)
    log2 = Log.open(log.directory + "-b", LogConfig(max_message_bytes=len(data)), storage=place[0], now_ms=0)
    assert log2.append_as_leader(data, leader_epoch=0, now_ms=0).next_offset == 20


def test_leader_append_in_an_older_epoch_is_a_bug(place: tuple[Storage, str]) -> None:
    log = open_log(place)
    fill(log, 1, epoch=5)
    with pytest.raises(InvariantViolation, match="epoch 4"):
        log.append_as_leader(batch(), leader_epoch=4, now_ms=0)


def test_follower_append_keeps_leader_offsets_and_learns_epochs(place: tuple[Storage, str]) -> None:
    leader = Log.open(place[1] + "-leader", SMALL, storage=place[0], now_ms=0)
    fill(leader, 2, epoch=1)
    fill(leader, 2, epoch=3)
    follower = open_log(place)
    fetched = leader.read(0, max_bytes=100_000)
    info = follower.append_as_follower(fetched.records, now_ms=0)
    assert (info.first_offset, info.next_offset) == (0, 12)
    assert follower.leader_epoch_cache.entries() == [(1, 0), (3, 6)]
    assert follower.read(0, max_bytes=100_000).records == fetched.records


def test_follower_append_before_the_leo_is_refused(place: tuple[Storage, str]) -> None:
    # One past the LEO is a compacted leader's hole (tests/unit/test_log_holes.py); before it is a bug.
    follower = open_log(place)
    follower.append_as_follower(batch(), now_ms=0)
    data = bytearray(batch())
    struct.pack_into(">q", data, BASE_OFFSET_POS, 2)
    with pytest.raises(InvariantViolation, match="offset 2, expected at least 3"):
        follower.append_as_follower(data, now_ms=0)
    assert follower.log_end_offset == 3


def test_follower_append_with_falling_epoch_is_refused(place: tuple[Storage, str]) -> None:
    leader = Log.open(place[1] + "-leader", SMALL, storage=place[0], now_ms=0)
    fill(leader, 1, epoch=5)
    follower = open_log(place)
    follower.append_as_follower(leader.read(0, max_bytes=10_000).records, now_ms=0)
    stale = bytearray(batch())
    assign_offsets(stale, validate_batches(stale, max_batch_bytes=None), 3, leader_epoch=4)
    with pytest.raises(InvariantViolation, match="epoch 4"):
        follower.append_as_follower(stale, now_ms=0)


# --- reads ---------------------------------------------------------------------------


def test_read_starts_at_the_batch_holding_the_offset(place: tuple[Storage, str]) -> None:
    log = open_log(place)
    fill(log, 10)
    fetched = log.read(4, max_bytes=1)
    assert (fetched.first_offset, fetched.next_offset) == (3, 6)
    assert offsets(fetched.records) == [3, 4, 5]


def test_read_returns_whole_batches_within_max_bytes(place: tuple[Storage, str]) -> None:
    log = open_log(place)
    fill(log, 10)
    one = len(batch())
    fetched = log.read(0, max_bytes=3 * one + one // 2)
    assert offsets(fetched.records) == list(range(9))
    assert len(fetched.records) == 3 * one


def test_read_gives_one_oversized_batch_only_with_min_one_message(place: tuple[Storage, str]) -> None:
    log = open_log(place)
    fill(log, 3)
    assert offsets(log.read(3, max_bytes=5).records) == [3, 4, 5]
    empty = log.read(3, max_bytes=5, min_one_message=False)
    assert empty.is_empty and (empty.first_offset, empty.next_offset) == (3, 3)


def test_read_never_passes_max_offset(place: tuple[Storage, str]) -> None:
    log = open_log(place)
    fill(log, 10)
    assert offsets(log.read(0, max_bytes=100_000, max_offset=9).records) == list(range(9))
    assert log.read(0, max_bytes=100_000, max_offset=8).next_offset == 6  # batch 6..8 straddles 8
    assert log.read(6, max_bytes=100_000, max_offset=8).is_empty
    assert log.read(9, max_bytes=100_000, max_offset=9).is_empty


def test_read_at_the_leo_is_empty_and_outside_the_range_is_out_of_range(place: tuple[Storage, str]) -> None:
    log = open_log(place)
    fill(log, 2)
    at_end = log.read(6, max_bytes=100)
    assert at_end.is_empty and at_end.log_end_offset == 6
    with pytest.raises(OffsetOutOfRange, match=r"fetch offset 7 is outside the log's range \[0, 6\]"):
        log.read(7, max_bytes=100)
    log.advance_log_start_offset(3)
    with pytest.raises(OffsetOutOfRange, match=r"\[3, 6\]"):
        log.read(2, max_bytes=100)


def test_reads_cross_segments_and_every_offset_is_found_by_index(place: tuple[Storage, str]) -> None:
    log = open_log(place)
    fill(log, 80)
    assert len(log.segment_base_offsets) > 3
    assert read_all(log) == list(range(240))
    for offset in range(0, 240, 7):
        fetched = log.read(offset, max_bytes=1)
        assert fetched.first_offset <= offset < fetched.next_offset


def test_reads_after_reopen_use_the_files_not_memory(place: tuple[Storage, str]) -> None:
    log = open_log(place)
    fill(log, 80)
    log.close()
    reopened = open_log(place)
    assert reopened.recovery_report.clean_shutdown
    assert reopened.recovery_report.segments_recovered == 0
    assert read_all(reopened) == list(range(240))
    assert read_all(reopened, 100, max_bytes=50) == list(range(100, 240))


# --- segments ------------------------------------------------------------------------


def test_segments_roll_by_size(place: tuple[Storage, str]) -> None:
    log = open_log(place)
    fill(log, 60)
    bases = log.segment_base_offsets
    assert bases[0] == 0 and len(bases) > 2
    storage, directory = place
    names = storage.list_dir(directory)
    for base in bases:
        assert (
            f"{base:020d}.log" in names
            and f"{base:020d}.index" in names
            and f"{base:020d}.timeindex" in names
        )


def test_an_append_bigger_than_the_room_left_spreads_over_segments(place: tuple[Storage, str]) -> None:
    log = open_log(place)
    big = b"".join(batch() for _ in range(50))
    info = log.append_as_leader(big, leader_epoch=0, now_ms=0)
    assert info.next_offset == 150 and len(log.segment_base_offsets) > 2
    assert read_all(log) == list(range(150))


def test_segments_roll_by_time(place: tuple[Storage, str]) -> None:
    log = open_log(place, LogConfig(segment_ms=1_000))
    log.append_as_leader(batch(), leader_epoch=0, now_ms=10_000)
    assert not log.maybe_roll(10_500)
    log.append_as_leader(batch(), leader_epoch=0, now_ms=10_900)
    assert log.segment_base_offsets == [0]
    log.append_as_leader(batch(), leader_epoch=0, now_ms=11_001)
    assert log.segment_base_offsets == [0, 6]
    assert log.maybe_roll(12_002)
    assert log.segment_base_offsets == [0, 6, 9]
    assert not log.maybe_roll(99_999)  # an empty active segment never rolls


# --- timestamps ----------------------------------------------------------------------


def test_offset_for_timestamp_finds_the_first_batch_at_or_after(place: tuple[Storage, str]) -> None:
    log = open_log(place)
    fill(log, 60, timestamp_ms=1_000)  # batch i holds offsets 3i..3i+2 at 1_000 + i
    assert log.offset_for_timestamp(1_000) == (0, 1_000)
    assert log.offset_for_timestamp(1_031) == (93, 1_031)
    assert log.offset_for_timestamp(1_059) == (177, 1_059)
    assert log.offset_for_timestamp(1_060) is None
    assert log.offset_for_timestamp(LATEST_TIMESTAMP) == (180, -1)
    assert log.offset_for_timestamp(EARLIEST_TIMESTAMP) == (0, -1)
    log.advance_log_start_offset(100)
    assert log.offset_for_timestamp(1_000) == (100, 1_033)
    log.close()
    assert open_log(place).offset_for_timestamp(1_045) == (135, 1_045)


# Batches of many records, to ask for timestamps inside a batch; a segment rolls every few batches.
TIMED = LogConfig(segment_bytes=3_000, index_interval_bytes=100, retention_ms=-1, max_message_bytes=2_900)


def timed_batch(timestamps: list[int], compression: str = "none") -> bytes:
    # Values that do not compress, so that compressed batches fill segments too.
    return encode_batch(
        [(None, random.Random(t).randbytes(16), [], t) for t in timestamps], compression=compression
    )


def fill_timed(log: Log, batches: int, count: int, compression: str = "none") -> None:
    """Batch i holds offsets count*i .. count*i+count-1, record at offset o stamped 10_000 + 10*o."""
    for i in range(batches):
        first = i * count
        stamps = [10_000 + 10 * o for o in range(first, first + count)]
        log.append_as_leader(timed_batch(stamps, compression), leader_epoch=0, now_ms=0)


@pytest.mark.parametrize("compression", ["none", "gzip", "snappy", "lz4", "zstd"])
def test_offset_for_timestamp_answers_the_first_record_inside_a_batch(
    place: tuple[Storage, str], compression: str
) -> None:
    # Kafka's LogSegment.findOffsetByTimestamp: the batch is found by its max_timestamp, the
    # answer is its first record at or after the target, with that record's own timestamp.
    log = open_log(place, TIMED)
    fill_timed(log, 8, 50, compression)  # 400 records, several segments
    assert len(log.segment_base_offsets) > 1
    assert log.offset_for_timestamp(10_000) == (0, 10_000)
    assert log.offset_for_timestamp(10_000 + 10 * 25) == (25, 10_250)
    assert log.offset_for_timestamp(10_000 + 10 * 25 - 3) == (25, 10_250)  # between two records
    assert log.offset_for_timestamp(10_000 + 10 * 49) == (49, 10_490)  # a batch's last record
    assert log.offset_for_timestamp(10_000 + 10 * 50) == (50, 10_500)  # the next batch's first
    assert log.offset_for_timestamp(10_000 + 10 * 333) == (333, 13_330)
    assert log.offset_for_timestamp(10_000 + 10 * 399) == (399, 13_990)
    assert log.offset_for_timestamp(10_000 + 10 * 399 + 1) is None
    log.close()
    assert open_log(place, TIMED).offset_for_timestamp(10_000 + 10 * 275) == (275, 12_750)


def test_offset_for_timestamp_takes_the_first_record_by_offset_not_the_earliest(
    place: tuple[Storage, str],
) -> None:
    # Timestamps inside a batch need not grow: the answer is the lowest offset that reaches
    # the target, even when a later record is closer to it.
    log = open_log(place, TIMED)
    log.append_as_leader(timed_batch([100, 500, 200, 300, 900, 250]), leader_epoch=0, now_ms=0)
    assert log.offset_for_timestamp(250) == (1, 500)
    assert log.offset_for_timestamp(501) == (4, 900)
    assert log.offset_for_timestamp(100) == (0, 100)
    assert log.offset_for_timestamp(901) is None


def test_offset_for_timestamp_never_answers_below_the_log_start(place: tuple[Storage, str]) -> None:
    log = open_log(place, TIMED)
    # Batch 0: offsets 0..5, the late records first; batch 1: offsets 6..8.
    log.append_as_leader(timed_batch([900, 800, 100, 110, 120, 130]), leader_epoch=0, now_ms=0)
    log.append_as_leader(timed_batch([140, 850, 950]), leader_epoch=0, now_ms=0)
    log.advance_log_start_offset(3)
    assert log.offset_for_timestamp(0) == (3, 110)
    assert log.offset_for_timestamp(115) == (4, 120)
    # Batch 0 reaches 900 only below the log start: the answer lies in the next batch.
    assert log.offset_for_timestamp(700) == (7, 850)
    assert log.offset_for_timestamp(900) == (8, 950)


def test_offset_for_timestamp_in_a_log_append_time_batch_answers_the_append_time(
    place: tuple[Storage, str],
) -> None:
    # With LogAppendTime every record's timestamp is the batch's (the leader's clock), as Kafka reads it.
    log = open_log(place, TIMED)
    log.append_as_leader(timed_batch([100, 200, 300]), leader_epoch=0, now_ms=0)
    created = timed_batch([10, 20, 30])
    (header,) = validate_batches(created, max_batch_bytes=None)
    stamped, _ = apply_batch_fixes(
        created, [header], [BatchFix(header.position, header.attributes | TIMESTAMP_TYPE_MASK, 5_000)]
    )
    log.append_as_leader(bytes(stamped), leader_epoch=0, now_ms=0)  # offsets 3..5, all at 5_000
    assert log.offset_for_timestamp(250) == (2, 300)
    assert log.offset_for_timestamp(301) == (3, 5_000)
    assert log.offset_for_timestamp(MAX_TIMESTAMP) == (3, 5_000)


def test_max_timestamp_answers_the_record_holding_it(place: tuple[Storage, str]) -> None:
    # KIP-734: ListOffsets -3 answers the offset and timestamp of the record with the largest
    # timestamp, the first of them on a tie; the specials keep Kafka's answers.
    log = open_log(place, TIMED)
    assert log.offset_for_timestamp(MAX_TIMESTAMP) is None
    fill_timed(log, 4, 50)  # offsets 0..199 at 10_000 + 10*o
    log.append_as_leader(timed_batch([1, 99_000, 2, 99_000, 3]), leader_epoch=0, now_ms=0)  # 200..204
    log.append_as_leader(timed_batch([50_000, 60_000]), leader_epoch=0, now_ms=0)  # 205..206
    assert log.offset_for_timestamp(MAX_TIMESTAMP) == (201, 99_000)
    assert log.offset_for_timestamp(LATEST_TIMESTAMP) == (207, -1)
    assert log.offset_for_timestamp(EARLIEST_TIMESTAMP) == (0, -1)
    log.advance_log_start_offset(202)
    assert log.offset_for_timestamp(MAX_TIMESTAMP) == (203, 99_000)
    assert log.offset_for_timestamp(EARLIEST_TIMESTAMP) == (202, -1)
    log.advance_log_start_offset(204)
    # The batch the log start cuts still holds 3 at 204; past it the largest is 60_000.
    assert log.offset_for_timestamp(MAX_TIMESTAMP) == (206, 60_000)
    log.close()
    assert open_log(place, TIMED).offset_for_timestamp(MAX_TIMESTAMP) == (206, 60_000)


# --- truncation ----------------------------------------------------------------------


def test_truncate_to_drops_the_suffix_and_its_epochs(place: tuple[Storage, str]) -> None:
    log = open_log(place)
    fill(log, 30, epoch=1)
    fill(log, 30, epoch=2)
    assert log.leader_epoch_cache.entries() == [(1, 0), (2, 90)]
    log.truncate_to(60)
    assert log.log_end_offset == 60 and log.leader_epoch_cache.entries() == [(1, 0)]
    assert log.segment_base_offsets[-1] <= 60
    assert read_all(log) == list(range(60))
    fill(log, 1, epoch=3)
    assert read_all(log) == list(range(63))
    assert log.leader_epoch_cache.entries() == [(1, 0), (3, 60)]


def test_truncate_inside_a_batch_drops_the_whole_batch(place: tuple[Storage, str]) -> None:
    log = open_log(place)
    fill(log, 5)
    log.truncate_to(7)
    assert log.log_end_offset == 6


def test_truncate_to_a_segment_base_leaves_it_empty_and_active(place: tuple[Storage, str]) -> None:
    log = open_log(place)
    fill(log, 60)
    base = log.segment_base_offsets[2]
    log.truncate_to(base)
    assert log.segment_base_offsets[-1] == base and log.log_end_offset == base
    fill(log, 2)
    assert read_all(log) == list(range(base + 6))


def test_truncate_fully_and_start_at(place: tuple[Storage, str]) -> None:
    log = open_log(place)
    fill(log, 40, epoch=2)
    log.truncate_fully_and_start_at(1_000)
    assert (log.log_start_offset, log.log_end_offset, log.size_bytes) == (1_000, 1_000, 0)
    assert log.leader_epoch_cache.entries() == []
    assert log.segment_base_offsets == [1_000]
    with pytest.raises(OffsetOutOfRange):
        log.read(0, max_bytes=100)
    fill(log, 1, epoch=3)
    assert offsets(log.read(1_000, max_bytes=1_000).records) == [1_000, 1_001, 1_002]
    log.close()
    reopened = open_log(place)
    assert (reopened.log_start_offset, reopened.log_end_offset) == (1_000, 1_003)


# --- log start and retention ---------------------------------------------------------


def test_advance_log_start_deletes_whole_segments_below_and_survives_reopen(
    place: tuple[Storage, str],
) -> None:
    log = open_log(place)
    fill(log, 60)
    second = log.segment_base_offsets[1]
    log.advance_log_start_offset(second + 1)
    assert log.log_start_offset == second + 1
    assert log.segment_base_offsets[0] == second
    log.advance_log_start_offset(5)  # never moves back
    assert log.log_start_offset == second + 1
    with pytest.raises(OffsetOutOfRange):
        log.advance_log_start_offset(log.log_end_offset + 1)
    log.close()
    assert open_log(place).log_start_offset == second + 1


def test_retention_by_time_deletes_old_segments_below_the_hw_only(place: tuple[Storage, str]) -> None:
    log = open_log(place, LogConfig(segment_bytes=2_000, index_interval_bytes=100, retention_ms=10_000))
    fill(log, 60, timestamp_ms=1_000)
    bases = log.segment_base_offsets
    assert log.delete_old_segments(now_ms=5_000, high_watermark=180) == 0
    assert log.delete_old_segments(now_ms=100_000, high_watermark=bases[2]) == 2
    assert log.segment_base_offsets == bases[2:]
    assert log.log_start_offset == bases[2]
    assert log.delete_old_segments(now_ms=100_000, high_watermark=180) == len(bases) - 3
    assert log.segment_base_offsets == bases[-1:]  # never the active segment
    assert read_all(log) == list(range(bases[-1], 180))


def test_retention_by_size_keeps_at_least_retention_bytes(place: tuple[Storage, str]) -> None:
    config = LogConfig(segment_bytes=2_000, index_interval_bytes=100, retention_ms=-1, retention_bytes=4_500)
    log = open_log(place, config)
    fill(log, 100)
    total = log.size_bytes
    deleted = log.delete_old_segments(now_ms=0, high_watermark=log.log_end_offset)
    assert deleted > 0
    assert 4_500 <= log.size_bytes < 4_500 + 2_000 < total
    assert log.log_start_offset == log.segment_base_offsets[0]


def test_epoch_cache_start_moves_with_the_log_start(place: tuple[Storage, str]) -> None:
    log = open_log(place)
    fill(log, 30, epoch=1)
    fill(log, 30, epoch=2)
    log.advance_log_start_offset(50)
    assert log.leader_epoch_cache.entries() == [(1, 50), (2, 90)]


# --- epoch cache ---------------------------------------------------------------------


def test_end_offset_for_epoch_follows_kafka(place: tuple[Storage, str]) -> None:
    log = open_log(place)
    cache = log.leader_epoch_cache
    assert cache.end_offset_for_epoch(0) == (-1, -1)
    fill(log, 2, epoch=2)  # [0, 6)
    fill(log, 2, epoch=5)  # [6, 12)
    fill(log, 1, epoch=7)  # [12, 15)
    assert cache.latest_epoch() == 7
    assert cache.end_offset_for_epoch(7) == (7, 15)  # latest: the LEO
    assert cache.end_offset_for_epoch(5) == (5, 12)
    assert cache.end_offset_for_epoch(6) == (5, 12)  # unknown in between: the largest below
    assert cache.end_offset_for_epoch(1) == (1, 0)  # below every epoch: the first start
    assert cache.end_offset_for_epoch(8) == (-1, -1)  # above every epoch
    assert cache.end_offset_for_epoch(-1) == (-1, -1)


def test_epoch_cache_assign_drops_non_monotonic_entries() -> None:
    storage = MemoryStorage()
    log = Log.open("/d/p-0", SMALL, storage=storage, now_ms=0)
    cache = log.leader_epoch_cache
    cache.assign(1, 0)
    cache.assign(3, 10)
    cache.assign(3, 12)  # same epoch, later start: no change
    assert cache.entries() == [(1, 0), (3, 10)]
    cache.assign(2, 5)  # as Kafka: entries with epoch >= 2 or start >= 5 go
    assert cache.entries() == [(1, 0), (2, 5)]
    cache.truncate_from_end(5)
    assert cache.entries() == [(1, 0)]


def test_epoch_cache_is_persisted_in_kafka_text_format(tmp_path: Path) -> None:
    log = Log.open(tmp_path / "t-0", SMALL, storage=FileStorage(), now_ms=0)
    fill(log, 2, epoch=3)
    fill(log, 1, epoch=8)
    assert log.leader_epoch_cache.persist_if_dirty()
    text = (tmp_path / "t-0" / "leader-epoch-checkpoint").read_text()
    assert text == "0\n2\n3 0\n8 6\n"
    log.close()
    assert Log.open(
        tmp_path / "t-0", SMALL, storage=FileStorage(), now_ms=0
    ).leader_epoch_cache.entries() == [(3, 0), (8, 6)]


# --- checkpoints, close, delete ------------------------------------------------------


def test_high_watermark_checkpoint_round_trips(place: tuple[Storage, str]) -> None:
    storage, directory = place
    data_dir = os.path.dirname(directory)
    hws = HighWatermarkCheckpoint(storage, data_dir)
    assert hws.stored_at_start(("t", 0)) == 0
    assert hws.write({("t", 0): 42, ("other", 3): 7})
    again = HighWatermarkCheckpoint(storage, data_dir)
    assert again.stored_at_start(("t", 0)) == 42 and again.stored_at_start(("other", 3)) == 7


def test_high_watermark_checkpoint_keeps_replicas_not_loaded_yet_and_skips_unchanged_writes(
    tmp_path: Path,
) -> None:
    storage = MemoryStorage()
    first = HighWatermarkCheckpoint(storage, "/data")
    assert first.write({("a", 0): 5, ("b", 1): 9, ("gone", 0): 3})
    assert not first.write({("a", 0): 5, ("b", 1): 9, ("gone", 0): 3}), "nothing moved: no write, no fsync"
    restarted = HighWatermarkCheckpoint(storage, "/data")
    assert restarted.stored_at_start(("a", 0)) == 5  # a LeaderAndIsr opened a-0 only
    restarted.forget(("gone", 0))  # StopReplica(delete) of a replica never opened
    assert restarted.write({("a", 0): 6})
    storage.crash()  # written atomically with an fsync: it survives
    last = HighWatermarkCheckpoint(storage, "/data")
    assert (
        last.stored_at_start(("a", 0)),
        last.stored_at_start(("b", 1)),
        last.stored_at_start(("gone", 0)),
    ) == (6, 9, 0)


def test_high_watermark_checkpoint_is_kafkas_text_format(tmp_path: Path) -> None:
    assert HighWatermarkCheckpoint(FileStorage(), str(tmp_path)).write({("t", 1): 9, ("t", 0): 12})
    assert (tmp_path / "replication-offset-checkpoint").read_text() == "0\n2\nt 0 12\nt 1 9\n"


def test_a_malformed_high_watermark_checkpoint_is_reported_and_rewritten_not_fatal() -> None:
    # What a topic named "orders\n" once did to the file: every broker hosting it then refused to start.
    storage = MemoryStorage()
    storage.mkdir("/data")
    storage.write_atomic("/data/replication-offset-checkpoint", b"0\n2\norders\n 0 5\nt 0 7\n")
    warnings: list[str] = []
    hws = HighWatermarkCheckpoint(storage, "/data", warn=lambda msg, *args: warnings.append(msg % args))
    assert "malformed checkpoint /data/replication-offset-checkpoint" in warnings[0]
    assert "high watermark 0" in warnings[0]
    assert hws.stored_at_start(("t", 0)) == 0, "HW 0 is never above what is committed"
    assert hws.write({("t", 0): 7})
    assert HighWatermarkCheckpoint(storage, "/data").stored_at_start(("t", 0)) == 7


def test_a_topic_name_that_would_break_a_checkpoint_line_is_left_out_of_it() -> None:
    storage = MemoryStorage()
    warnings: list[str] = []
    hws = HighWatermarkCheckpoint(storage, "/data", warn=lambda msg, *args: warnings.append(msg % args))
    assert hws.write({("orders\n", 0): 5, ("t", 0): 7})
    assert storage.read_file("/data/replication-offset-checkpoint") == b"0\n1\nt 0 7\n"
    assert "'orders\\n' cannot be written" in warnings[0]


def test_checkpoint_files_have_a_version_line(tmp_path: Path) -> None:
    log = Log.open(tmp_path / "t-0", SMALL, storage=FileStorage(), now_ms=0)
    fill(log, 3)
    log.close()
    directory = tmp_path / "t-0"
    assert (directory / "recovery-point-checkpoint").read_text() == "0\n1\n9\n"
    assert (directory / "log-start-offset-checkpoint").read_text() == "0\n1\n0\n"
    assert (directory / ".clean-shutdown").exists()
    assert not [name for name in os.listdir(directory) if name.endswith(".tmp")]


def test_the_clean_shutdown_marker_is_removed_on_open(place: tuple[Storage, str]) -> None:
    log = open_log(place)
    fill(log, 3)
    log.close()
    storage, directory = place
    assert storage.exists(os.path.join(directory, ".clean-shutdown"))
    open_log(place)
    assert not storage.exists(os.path.join(directory, ".clean-shutdown"))


def test_delete_removes_the_directory(place: tuple[Storage, str]) -> None:
    log = open_log(place)
    fill(log, 3)
    log.delete()
    assert not place[0].exists(place[1])


def test_closed_log_refuses_appends(place: tuple[Storage, str]) -> None:
    log = open_log(place)
    log.close()
    with pytest.raises(InvariantViolation, match="closed"):
        log.append_as_leader(batch(), leader_epoch=0, now_ms=0)


# --- durability and crashes (MemoryStorage) --------------------------------------------


def memory_log(storage: MemoryStorage, config: LogConfig = SMALL, now_ms: int = 0) -> Log:
    return Log.open("/data/topic-0", config, storage=storage, now_ms=now_ms)


def test_a_crash_loses_exactly_the_unflushed_suffix() -> None:
    storage = MemoryStorage()
    log = memory_log(storage)
    fill(log, 30)
    log.flush(now_ms=0)
    fill(log, 30)
    storage.crash()
    recovered = memory_log(storage)
    assert recovered.log_end_offset == 90
    assert not recovered.recovery_report.clean_shutdown
    assert read_all(recovered) == list(range(90))
    fill(recovered, 1)
    assert recovered.log_end_offset == 93


def test_flush_messages_fsyncs_every_n_messages() -> None:
    storage = MemoryStorage()
    log = memory_log(storage, LogConfig(flush_messages=6))
    fill(log, 5)  # 15 messages: flushes after 6 and 12
    assert log.recovery_point == 12
    storage.crash()
    assert memory_log(storage).log_end_offset == 12


def test_flush_ms_fsyncs_after_the_interval() -> None:
    storage = MemoryStorage()
    log = memory_log(storage, LogConfig(flush_ms=1_000), now_ms=0)
    log.append_as_leader(batch(), leader_epoch=0, now_ms=500)
    assert log.recovery_point == 0
    assert not log.maybe_flush(now_ms=900)
    log.append_as_leader(batch(), leader_epoch=0, now_ms=1_000)  # the interval passed: flushed
    assert log.recovery_point == 6
    log.append_as_leader(batch(), leader_epoch=0, now_ms=1_100)
    assert log.maybe_flush(now_ms=2_000) and log.recovery_point == 9


def test_new_epoch_entries_are_written_only_when_asked() -> None:
    storage = MemoryStorage()
    log = memory_log(storage)
    log.leader_epoch_cache.assign(4, 0)  # what become_leader does: no fsync on the request path
    path = "/data/topic-0/leader-epoch-checkpoint"
    assert log.leader_epoch_cache.dirty and not storage.exists(path)
    assert log.leader_epoch_cache.persist_if_dirty()
    assert not log.leader_epoch_cache.persist_if_dirty()  # nothing new: no second write
    storage.crash()
    assert checkpoints.read_entries(storage, path, fields_per_entry=2) == [(4, 0)]


def test_flush_persists_epoch_entries_before_the_recovery_point_passes_them() -> None:
    storage = MemoryStorage()
    log = memory_log(storage)
    fill(log, 2, epoch=1)
    fill(log, 2, epoch=5)
    log.flush(now_ms=0)  # recovery will trust offsets < 12 and not rebuild their epochs
    storage.crash()
    reopened = memory_log(storage)
    assert reopened.recovery_point == 12
    assert reopened.leader_epoch_cache.entries() == [(1, 0), (5, 6)]


def test_a_crash_before_the_epoch_checkpoint_rebuilds_entries_from_the_batches() -> None:
    storage = MemoryStorage()
    log = memory_log(storage)
    fill(log, 2, epoch=1)
    log.flush(now_ms=0)
    fill(log, 2, epoch=5)  # epoch 5 is in memory and in the (unflushed) segment only
    log.leader_epoch_cache.assign(7, log.log_end_offset)  # an epoch with no data yet
    for segment_file in storage.list_dir("/data/topic-0"):
        if segment_file.endswith(".log"):
            storage.open(f"/data/topic-0/{segment_file}").fsync()  # the batches reached the disk
    storage.crash()
    reopened = memory_log(storage)
    # Epoch 5 comes back from its batches; epoch 7 had no data, so no replica can need it.
    assert reopened.leader_epoch_cache.entries() == [(1, 0), (5, 6)]
    assert reopened.log_end_offset == 12


def test_truncation_persists_the_epoch_cache_at_once() -> None:
    storage = MemoryStorage()
    log = memory_log(storage)
    fill(log, 2, epoch=1)
    fill(log, 2, epoch=5)
    log.flush(now_ms=0)
    log.truncate_to(6)
    assert not log.leader_epoch_cache.dirty
    storage.crash()
    assert memory_log(storage).leader_epoch_cache.entries() == [(1, 0)]


def test_clean_close_survives_a_crash_and_skips_the_scan() -> None:
    storage = MemoryStorage()
    log = memory_log(storage)
    fill(log, 40)
    log.close()
    storage.crash()
    reopened = memory_log(storage)
    assert reopened.recovery_report.clean_shutdown and reopened.recovery_report.bytes_scanned == 0
    assert read_all(reopened) == list(range(120))


def test_a_failed_write_takes_the_log_offline_without_a_clean_marker() -> None:
    storage = MemoryStorage()
    log = memory_log(storage)
    fill(log, 2)
    storage.fail_writes = True
    with pytest.raises(StorageError):
        log.append_as_leader(batch(), leader_epoch=0, now_ms=0)
    storage.fail_writes = False
    with pytest.raises(StorageError, match="offline"):
        log.append_as_leader(batch(), leader_epoch=0, now_ms=0)
    log.close()
    assert not storage.exists("/data/topic-0/.clean-shutdown")
    assert memory_log(storage).log_end_offset == 6


# --- corruption and recovery (real files) -----------------------------------------------


def segment_path(log: Log, index: int, suffix: str = ".log") -> Path:
    return Path(log.directory) / f"{log.segment_base_offsets[index]:020d}{suffix}"


def crash_files(tmp_path: Path, batches: int = 60) -> Log:
    """A log on real files left without its clean-shutdown marker (as after kill -9)."""
    log = Log.open(tmp_path / "t-0", SMALL, storage=FileStorage(), now_ms=0)
    fill(log, batches)
    log.flush(now_ms=0)
    return log


def reopen(tmp_path: Path) -> Log:
    return Log.open(tmp_path / "t-0", SMALL, storage=FileStorage(), now_ms=0)


def test_recovery_cuts_a_torn_tail_at_the_last_whole_batch(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    crash_files(tmp_path, 10)  # one segment of 10 batches
    path = tmp_path / "t-0" / f"{0:020d}.log"
    one = len(batch())
    os.truncate(path, 7 * one + 20)
    with caplog.at_level(logging.WARNING, logger="highwater.log"):
        log = reopen(tmp_path)
    assert log.log_end_offset == 21
    assert log.recovery_report.bytes_dropped == 20
    assert path.stat().st_size == 7 * one
    assert "dropped 20 bytes" in caplog.text
    assert read_all(log) == list(range(21))


def test_recovery_cuts_exactly_at_a_corrupt_batch_and_drops_later_segments(tmp_path: Path) -> None:
    # The recovery point must lie before the damage for the damaged segment to be scanned.
    log = Log.open(tmp_path / "t-0", SMALL, storage=FileStorage(), now_ms=0)
    fill(log, 60)
    bases = log.segment_base_offsets
    later_bytes = sum((Path(log.directory) / f"{b:020d}.log").stat().st_size for b in bases[2:])
    path = segment_path(log, 1)
    size = path.stat().st_size
    one = len(batch())
    data = bytearray(path.read_bytes())
    data[4 * one + 70] ^= 0x10  # a record byte of the fifth batch of segment 1
    path.write_bytes(bytes(data))
    recovered = reopen(tmp_path)  # no marker, recovery point 0: everything is scanned
    assert recovered.log_end_offset == bases[1] + 12
    assert path.stat().st_size == 4 * one
    assert recovered.segment_base_offsets == bases[:2]
    assert recovered.recovery_report.bytes_dropped == size - 4 * one + later_bytes
    assert "CRC mismatch" in recovered.recovery_report.reason
    assert read_all(recovered) == list(range(bases[1] + 12))


def test_recovery_catches_a_damaged_base_offset_outside_the_crc(tmp_path: Path) -> None:
    crash_files(tmp_path, 10)
    path = tmp_path / "t-0" / f"{0:020d}.log"
    one = len(batch())
    data = bytearray(path.read_bytes())
    # Only a base offset that goes down is caught: one past the previous batch's end could be
    # a compacted log's hole (issue 39), as in Kafka.
    struct.pack_into(">q", data, 5 * one + BASE_OFFSET_POS, 3)
    path.write_bytes(bytes(data))
    recovered = reopen(tmp_path)
    assert recovered.log_end_offset == 15
    assert "below the previous batch's next offset 15" in recovered.recovery_report.reason


def test_recovery_skips_segments_before_the_recovery_point(tmp_path: Path) -> None:
    log = crash_files(tmp_path, 60)
    fill(log, 20)  # unflushed; a new segment holds the recovery point's successor
    recovered = reopen(tmp_path)
    report = recovered.recovery_report
    assert report.segments_recovered < len(recovered.segment_base_offsets)
    assert recovered.log_end_offset == 240
    assert read_all(recovered) == list(range(240))


def test_a_garbage_index_is_rebuilt_from_the_log(tmp_path: Path) -> None:
    log = Log.open(tmp_path / "t-0", SMALL, storage=FileStorage(), now_ms=0)
    fill(log, 60)
    log.close()
    index = tmp_path / "t-0" / f"{0:020d}.index"
    index.write_bytes(b"\xff" * 13)  # not a whole number of entries
    reopened = reopen(tmp_path)
    assert read_all(reopened, max_bytes=1) == list(range(180))


def test_orphan_index_files_and_temp_files_are_removed_on_open(tmp_path: Path) -> None:
    log = Log.open(tmp_path / "t-0", SMALL, storage=FileStorage(), now_ms=0)
    fill(log, 3)
    log.close()
    directory = tmp_path / "t-0"
    (directory / f"{500:020d}.index").write_bytes(b"")
    (directory / "recovery-point-checkpoint.tmp").write_bytes(b"junk")
    reopen(tmp_path)
    assert not (directory / f"{500:020d}.index").exists()
    assert not (directory / "recovery-point-checkpoint.tmp").exists()


# --- configuration and purity ----------------------------------------------------------


@pytest.mark.parametrize(
    "settings",
    [
        {"segment_bytes": 10},
        {"segment_bytes": 2**31 - 100},
        {"segment_ms": 0},
        {"retention_bytes": -2},
        {"retention_ms": -5},
        {"max_message_bytes": 20},
        {"index_interval_bytes": -1},
        {"max_index_bytes": 8},
        {"flush_messages": 0},
        {"flush_ms": -1},
    ],
)
def test_config_rejects_impossible_limits(settings: dict[str, int]) -> None:
    with pytest.raises(InvalidConfig):
        LogConfig(**settings)


def test_storage_engine_imports_no_io_framework_and_reads_no_clock() -> None:
    root = Path(__file__).resolve().parents[2]
    files = [*sorted((root / "services/broker/log").glob("*.py")), root / "clients/common/record_batch.py"]
    forbidden = {"grpc", "asyncio", "etcd3aio", "time", "datetime", "threading"}
    for path in files:
        tree = parse_python(path.read_text())
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            for name in names:
                assert name.split(".")[0] not in forbidden, f"{path.name} imports {name}"


# --- index search in files, recovery in pieces -----------------------------------------


def test_lookups_in_a_large_inactive_index_search_the_file_in_pieces(place: tuple[Storage, str]) -> None:
    config = LogConfig(index_interval_bytes=0, retention_ms=-1)
    log = open_log(place, config)
    for i in range(3_000):
        log.append_as_leader(batch(1, timestamp_ms=10_000 + i), leader_epoch=0, now_ms=0)
    log.roll(now_ms=0)  # the segment becomes inactive: its index is searched on disk
    for offset in [0, 1, 511, 512, 513, 1_777, 2_998, 2_999]:
        fetched = log.read(offset, max_bytes=1)
        assert offsets(fetched.records) == [offset]
    assert log.offset_for_timestamp(10_000 + 2_345) == (2_345, 10_000 + 2_345)
    log.truncate_to(2_500)
    assert read_all(log, 2_400) == list(range(2_400, 2_500))
    assert log.offset_for_timestamp(10_000 + 2_499) == (2_499, 10_000 + 2_499)
    assert log.offset_for_timestamp(10_000 + 2_500) is None


def test_recovery_reads_in_pieces_and_keeps_batches_that_cross_piece_ends(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from services.broker.log import segment as segment_module

    monkeypatch.setattr(segment_module, "RECOVERY_CHUNK_BYTES", 300)
    config = LogConfig(retention_ms=-1)
    log = Log.open(tmp_path / "t-0", config, storage=FileStorage(), now_ms=0)
    sizes = [1, 9, 2, 30, 1, 3, 40, 2]  # some batches are bigger than a piece
    for count in sizes:
        log.append_as_leader(batch(count, size=20), leader_epoch=0, now_ms=0)
    total = sum(sizes)
    log.abandon()
    path = tmp_path / "t-0" / f"{0:020d}.log"
    full = path.stat().st_size
    recovered = Log.open(tmp_path / "t-0", config, storage=FileStorage(), now_ms=0)
    assert recovered.log_end_offset == total and recovered.recovery_report.bytes_dropped == 0
    assert read_all(recovered) == list(range(total))
    recovered.abandon()
    os.truncate(path, full - 5)
    cut = Log.open(tmp_path / "t-0", config, storage=FileStorage(), now_ms=0)
    assert cut.log_end_offset == total - sizes[-1]
    assert cut.recovery_report.bytes_dropped == len(batch(sizes[-1], size=20)) - 5


def test_batch_headers_walks_every_batch_from_an_offset_for_producer_state(
    place: tuple[Storage, str],
) -> None:
    log = open_log(place)
    fill(log, 40)
    assert [h.base_offset for h in log.batch_headers()] == list(range(0, 120, 3))
    assert [h.base_offset for h in log.batch_headers(100)] == list(range(99, 120, 3))
    log.advance_log_start_offset(50)
    assert next(iter(log.batch_headers())).base_offset == 48


def test_locate_names_the_segment_position_and_batch_of_an_offset(place: tuple[Storage, str]) -> None:
    log = open_log(place)
    fill(log, 40)
    second = log.segment_base_offsets[1]
    assert log.locate(0) == (0, 0, 0)
    assert log.locate(second + 4) == (second, len(batch()), second + 3)  # the second batch of the segment
    assert log.locate(log.log_end_offset) is None


def test_file_storage_directory_calls_fail_as_storage_errors(tmp_path: Path) -> None:
    """Listing or creating a directory that fails is a StorageError like every other file call,
    so a replica's creation at the open-files limit answers STORAGE_ERROR for its partition
    instead of escaping LeaderAndIsr as an unexpected exception."""
    storage = FileStorage()
    with pytest.raises(StorageError, match="cannot list the directory"):
        storage.list_dir(str(tmp_path / "missing"))
    (tmp_path / "a-file").write_bytes(b"")
    with pytest.raises(StorageError, match="cannot create the directory"):
        storage.mkdir(str(tmp_path / "a-file" / "below"))
