"""The log cleaner (issue 39): planning, the offset map, filtering, tombstones, grouping, the
throttle, and whole passes over a real Log on MemoryStorage, by the manager too.

The pure parts run on segment files written straight into MemoryStorage; the passes over a Log
use H1's swap (Log.replace_segments) and read the log back as a consumer would.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import random
import struct
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiokafka.record.default_records import DefaultRecordBatchBuilder

from clients.common.control_records import ControlType, encode_marker
from clients.common.errors import CorruptMessage
from clients.common.record_batch import (
    ATTRIBUTES_POS,
    COMPRESSION_MASK,
    check_batch,
    iter_batch_headers,
    parse_header,
    validate_batches,
)
from clients.common.records import Record, decode_batches, encode_batch
from services.broker import log_cleaner
from services.broker.log import Log, LogConfig, MemoryStorage, checkpoints
from services.broker.log.cleaner import (
    DELETE_HORIZON_MASK,
    NO_ABORTED,
    AbortedRanges,
    FilterContext,
    GroupResult,
    OffsetMap,
    Throttler,
    build_offset_map,
    clean_group,
    group_segments_by_size,
    plan_cleaning,
)
from services.broker.log.storage import Storage
from services.broker.log.txn_index import AbortedTxn
from services.broker.log_cleaner import CleanerConfig, LogCleaner
from services.broker.partition import Role
from services.broker.producer_state import ProducerStateManager
from services.common import limits

DIR = "/data/t-0"
DAY_MS = 86_400_000


@dataclass(frozen=True)
class Seg:
    """A segment as the cleaner sees it (Log.SegmentView's fields)."""

    base_offset: int
    next_offset: int
    end_offset: int
    path: str
    size_bytes: int
    max_timestamp_ms: int


Rec = tuple[bytes | None, bytes | None]  # (key, value); value None: a tombstone


def make_batch(
    base_offset: int,
    records: Sequence[Rec],
    *,
    timestamp_ms: int = 1_000,
    compression: str = "none",
    producer_id: int = -1,
    base_sequence: int = -1,
    leader_epoch: int = 3,
) -> bytes:
    buf = bytearray(
        encode_batch(
            [Record(key, value, [("h", b"v")], timestamp_ms + i) for i, (key, value) in enumerate(records)],
            compression=compression,
            producer_id=producer_id,
            producer_epoch=0 if producer_id >= 0 else -1,
            base_sequence=base_sequence,
            base_offset=base_offset,
        )
    )
    struct.pack_into(">i", buf, 12, leader_epoch)  # partition_leader_epoch, before the CRC
    return bytes(buf)


def write_segments(storage: Storage, batches_per_segment: Sequence[Sequence[bytes]]) -> list[Seg]:
    """Segment files holding these batches, adjacent (each ends where the next begins)."""
    segments: list[Seg] = []
    storage.mkdir(DIR)
    for i, batches in enumerate(batches_per_segment):
        headers = validate_batches(b"".join(batches), max_batch_bytes=None)
        path = f"{DIR}/{i:04d}.log"
        handle = storage.open(path)
        for b in batches:
            handle.append(b)
        handle.close()
        segments.append(
            Seg(
                headers[0].base_offset,
                headers[-1].next_offset,
                headers[-1].next_offset,
                path,
                sum(len(b) for b in batches),
                max(h.max_timestamp for h in headers),
            )
        )
    ends = [nxt.base_offset for nxt in segments[1:]] + [segments[-1].next_offset]
    return [
        Seg(s.base_offset, s.next_offset, end, s.path, s.size_bytes, s.max_timestamp_ms)
        for s, end in zip(segments, ends, strict=True)
    ]


_pass_numbers = itertools.count()


def run_pass(
    storage: Storage,
    segments: Sequence[Seg],
    *,
    first_dirty: int,
    now_ms: int = 10_000,
    delete_retention_ms: int = DAY_MS,
    memory_bytes: int = 1 << 20,
    producers: dict[int, int] | None = None,
    aborted: AbortedRanges = NO_ABORTED,
) -> tuple[list[Seg], int, GroupResult]:
    """One whole pass with the pure functions: map, group, clean; the cleaned segments, the new
    first dirty offset and the totals. Cleaned files replace the old ones in this test's layout."""
    offset_map = OffsetMap(memory_bytes)
    end = segments[-1].end_offset
    mapped = build_offset_map(
        storage,
        segments,
        offset_map,
        start_offset=first_dirty,
        end_offset=end,
        throttler=None,
        aborted=aborted,
    )
    ctx = FilterContext(offset_map, mapped.end_offset, now_ms, delete_retention_ms, producers or {}, aborted)
    to_clean = [s for s in segments if s.base_offset < mapped.end_offset]
    groups = group_segments_by_size(
        to_clean, max_size_bytes=1 << 30, max_index_bytes=1 << 20, index_interval_bytes=4096
    )
    total = GroupResult()
    out: list[Seg] = []
    for n, group in enumerate(groups):
        path = f"{DIR}/cleaned-{next(_pass_numbers)}-{n}.log"
        total.add(clean_group(storage, group, path, ctx, throttler=None))
        size = storage.open(path, create=False).size
        out.append(
            Seg(
                group[0].base_offset,
                group[-1].next_offset,
                group[-1].end_offset,
                path,
                size,
                group[-1].max_timestamp_ms,
            )
        )
    out += [s for s in segments if s.base_offset >= mapped.end_offset]
    return out, mapped.end_offset, total


def read_all(storage: Storage, segments: Sequence[Seg]) -> list[Record]:
    return [r for s in segments for r in decode_batches(storage.read_file(s.path))]


def latest_map(records: Sequence[Record]) -> dict[bytes | None, tuple[int, bytes | None]]:
    latest: dict[bytes | None, tuple[int, bytes | None]] = {}
    for r in records:
        latest[r.key] = (r.offset, r.value)
    return latest


def updates(keys: int, rounds: int, per_batch: int = 5, *, seed: int | None = None) -> list[list[Rec]]:
    """keys * rounds updates, each key in turn (or in a random order when seeded: then most
    batches lose only some of their records to the cleaner)."""
    rng = random.Random(seed)
    order = [i % keys if seed is None else rng.randrange(keys) for i in range(keys * rounds)]
    recs: list[Rec] = [(b"k%d" % k, b"v%d" % i) for i, k in enumerate(order)]
    return [recs[i : i + per_batch] for i in range(0, len(recs), per_batch)]


def layout(batches_of_records: Sequence[Sequence[Rec]], per_segment: int, **kw: Any) -> list[list[bytes]]:
    """Batches at contiguous offsets, `per_segment` batches a segment."""
    batches: list[bytes] = []
    offset = 0
    for recs in batches_of_records:
        batches.append(make_batch(offset, recs, **kw))
        offset += len(recs)
    return [batches[i : i + per_segment] for i in range(0, len(batches), per_segment)]


# ---- filtering -----------------------------------------------------------------------------


def test_keeps_the_latest_record_per_key_at_its_offset() -> None:
    storage = MemoryStorage()
    segments = write_segments(storage, layout(updates(keys=10, rounds=6), per_segment=3))
    before = read_all(storage, segments)
    cleaned, first_dirty, stats = run_pass(storage, segments, first_dirty=0)
    after = read_all(storage, cleaned)
    assert first_dirty == segments[-1].end_offset
    assert latest_map(after) == latest_map(before)
    assert len(after) == 10 and len({r.key for r in after}) == 10
    originals = {r.offset: (r.key, r.value, r.headers, r.timestamp_ms) for r in before}
    assert all(originals[r.offset] == (r.key, r.value, r.headers, r.timestamp_ms) for r in after)
    assert stats.records_removed == len(before) - 10


def test_a_filtered_batch_keeps_its_header_fields_and_last_offset() -> None:
    storage = MemoryStorage()
    first = make_batch(0, [(b"a", b"1"), (b"b", b"1"), (b"a", b"2")], producer_id=7, base_sequence=40)
    second = make_batch(3, [(b"c", b"1")], producer_id=7, base_sequence=43)
    segments = write_segments(storage, [[first, second]])
    cleaned, _, _ = run_pass(storage, segments, first_dirty=0)
    data = storage.read_file(cleaned[0].path)
    headers = list(iter_batch_headers(data))
    old = parse_header(first)
    new = headers[0]
    assert (new.base_offset, new.last_offset_delta, new.records_count) == (0, 2, 2)
    assert (new.producer_id, new.producer_epoch, new.base_sequence) == (7, 0, 40)
    assert new.partition_leader_epoch == old.partition_leader_epoch == 3
    assert new.attributes == old.attributes
    check_batch(data, 0, max_batch_bytes=None, exact_count=False)  # CRC and framing sound
    with pytest.raises(CorruptMessage):
        check_batch(
            data, 0, max_batch_bytes=None
        )  # a producer's batch must be full: the leader still says so
    assert [r.offset for r in decode_batches(data)] == [1, 2, 3]


def test_a_batch_with_nothing_removed_is_copied_byte_for_byte() -> None:
    storage = MemoryStorage()
    untouched = make_batch(0, [(b"a", b"1"), (b"b", b"1")])
    segments = write_segments(storage, [[untouched, make_batch(2, [(b"c", b"1")])]])
    cleaned, _, stats = run_pass(storage, segments, first_dirty=0)
    data = storage.read_file(cleaned[0].path)
    assert data == storage.read_file(segments[0].path)
    assert stats.batches_copied == 2 and stats.batches_rewritten == 0


@pytest.mark.parametrize("codec", ["gzip", "snappy", "lz4", "zstd"])
def test_compressed_batches_keep_their_codec(codec: str) -> None:
    storage = MemoryStorage()
    segments = write_segments(
        storage, layout(updates(keys=4, rounds=5, per_batch=6), per_segment=2, compression=codec)
    )
    before = read_all(storage, segments)
    cleaned, _, stats = run_pass(storage, segments, first_dirty=0)
    assert stats.batches_rewritten > 0
    for segment in cleaned:
        for header in iter_batch_headers(storage.read_file(segment.path)):
            if header.records_count:
                assert (
                    header.compression
                    == COMPRESSION_MASK & {"gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}[codec]
                )
    assert latest_map(read_all(storage, cleaned)) == latest_map(before)


def test_an_emptied_batch_is_dropped_unless_it_is_its_producers_last() -> None:
    storage = MemoryStorage()
    a = make_batch(0, [(b"x", b"1")], producer_id=5, base_sequence=0)  # emptied, not the last of 5
    b = make_batch(1, [(b"x", b"2")], producer_id=5, base_sequence=1)  # emptied, the last of 5
    c = make_batch(2, [(b"x", b"3"), (b"y", b"1")], producer_id=6, base_sequence=0)
    segments = write_segments(storage, [[a, b, c]])
    cleaned, _, stats = run_pass(storage, segments, first_dirty=0, producers={5: 1, 6: 3})
    headers = list(iter_batch_headers(storage.read_file(cleaned[0].path)))
    assert [(h.base_offset, h.records_count, h.producer_id) for h in headers] == [(1, 0, 5), (2, 2, 6)]
    assert headers[0].last_offset == 1 and headers[0].base_sequence == 1
    assert stats.batches_dropped == 1


def transactional_batch(base_offset: int, records: Sequence[Rec], producer_id: int) -> bytes:
    builder = DefaultRecordBatchBuilder(2, 0, 1, producer_id, 0, 0, 1 << 20)
    for i, (key, value) in enumerate(records):
        builder.append(i, timestamp=1_000 + i, key=key, value=value, headers=[])
    buf = bytearray(builder.build())
    struct.pack_into(">q", buf, 0, base_offset)  # before the CRC-covered bytes
    return bytes(buf)


def test_an_aborted_transactions_records_never_stand_for_their_key_and_are_removed() -> None:
    """A committed value, then the same key in a transaction that was aborted: the committed
    value is the key's latest for a read_committed reader, so it must survive the cleaning;
    the aborted batch goes, its ABORT marker stays."""
    storage = MemoryStorage()
    committed = make_batch(0, [(b"k", b"committed"), (b"j", b"1")])
    aborted = transactional_batch(2, [(b"k", b"aborted"), (b"j", b"aborted")], producer_id=7)
    marker = encode_marker(
        ControlType.ABORT,
        producer_id=7,
        producer_epoch=0,
        coordinator_epoch=0,
        timestamp_ms=1_000,
        base_offset=4,
    )
    later = make_batch(5, [(b"j", b"2")])
    segments = write_segments(storage, [[committed, aborted, marker], [later]])
    ranges = AbortedRanges.of([AbortedTxn(7, 2, 4, 2)])
    cleaned, _, stats = run_pass(storage, segments, first_dirty=0, aborted=ranges)
    headers = [h for seg in cleaned for h in iter_batch_headers(storage.read_file(seg.path))]
    assert [(h.base_offset, h.is_control) for h in headers] == [(0, False), (4, True), (5, False)], (
        "the aborted batch removed, its marker kept"
    )
    assert [(r.offset, r.key, r.value) for r in read_all(storage, cleaned)] == [
        (0, b"k", b"committed"),
        (5, b"j", b"2"),
    ]
    assert stats.records_removed == 3  # j=1 (shadowed by j=2) and both aborted records
    # Without the aborted ranges the aborted record would stand for k and remove the committed one.
    storage = MemoryStorage()
    segments = write_segments(storage, [[committed, aborted, marker], [later]])
    cleaned, _, _ = run_pass(storage, segments, first_dirty=0)
    assert (0, b"k", b"committed") not in [(r.offset, r.key, r.value) for r in read_all(storage, cleaned)]


def test_plan_never_reaches_past_the_last_stable_offset() -> None:
    """The manager passes the last stable offset: an open transaction's segment is not cleaned."""
    storage = MemoryStorage()
    log = Log.open(
        "/p/t-0", LogConfig(cleanup_policy="compact", segment_bytes=200), storage=storage, now_ms=0
    )
    clock = FakeClock(10_000)
    p = FakePartition(log, high_watermark=0)
    fill_log(log, [[(b"k", b"%d" % i)] for i in range(20)])
    p.high_watermark = log.log_end_offset
    # A transaction open since offset 0 (its producer's first transactional batch): nothing is stable.
    p.producers.update([parse_header(transactional_batch(0, [(b"t", b"x")], producer_id=9))])
    cleaner = make_cleaner({("t", 0): p}, clock)
    assert not asyncio.run(cleaner.clean_once())
    marker = encode_marker(
        ControlType.COMMIT,
        producer_id=9,
        producer_epoch=0,
        coordinator_epoch=0,
        timestamp_ms=1_000,
        base_offset=1,
    )
    p.producers.update([parse_header(marker)], {1: ControlType.COMMIT})
    assert asyncio.run(cleaner.clean_once())


# ---- tombstones ----------------------------------------------------------------------------


def test_tombstones_stay_for_delete_retention_after_the_first_cleaning_then_go() -> None:
    storage = MemoryStorage()
    recs: list[list[Rec]] = [[(b"a", b"1"), (b"b", b"1")], [(b"a", None), (b"c", b"1")], [(b"d", b"1")]]
    segments = write_segments(storage, layout(recs, per_segment=1))
    retention = 5_000
    first_clean_ms = 100_000
    cleaned, first_dirty, stats = run_pass(
        storage, segments, first_dirty=0, now_ms=first_clean_ms, delete_retention_ms=retention
    )
    assert stats.earliest_delete_horizon_ms == first_clean_ms + retention
    kept = read_all(storage, cleaned)
    assert [(r.key, r.value, r.offset) for r in kept] == [
        (b"b", b"1", 1),
        (b"a", None, 2),
        (b"c", b"1", 3),
        (b"d", b"1", 4),
    ]
    tomb_batch = next(
        h for s in cleaned for h in iter_batch_headers(storage.read_file(s.path)) if h.base_offset == 2
    )
    assert tomb_batch.attributes & DELETE_HORIZON_MASK
    assert (
        tomb_batch.first_timestamp == first_clean_ms + retention
    )  # KIP-534: the horizon is the base timestamp
    assert next(r.timestamp_ms for r in kept if r.offset == 2) == 1_000  # the record's own time survives

    # Before the horizon: another pass keeps it (and does not move the horizon).
    again, _, stats = run_pass(
        storage,
        cleaned,
        first_dirty=first_dirty,
        now_ms=first_clean_ms + retention - 1,
        delete_retention_ms=retention,
    )
    assert (b"a", None) in [(r.key, r.value) for r in read_all(storage, again)]
    assert stats.earliest_delete_horizon_ms == first_clean_ms + retention
    # At the horizon: gone, and nothing else.
    final, _, stats = run_pass(
        storage,
        again,
        first_dirty=first_dirty,
        now_ms=first_clean_ms + retention,
        delete_retention_ms=retention,
    )
    assert [(r.key, r.offset) for r in read_all(storage, final)] == [(b"b", 1), (b"c", 3), (b"d", 4)]
    assert stats.tombstones_removed == 1 and stats.earliest_delete_horizon_ms == -1


def test_a_tombstone_past_the_maps_end_stays_even_past_its_horizon() -> None:
    """Its key's older records below the map's end were not checked against it: dropping the
    tombstone would bring the key back with an older value (Kafka keeps what is past the map)."""
    storage = MemoryStorage()
    old = make_batch(0, [(b"a", b"old")])
    filler = make_batch(1, [(b"b", b"1"), (b"c", b"1")])
    tomb = make_batch(3, [(b"a", None)])
    segments = write_segments(storage, [[old, filler, tomb]])
    # Pass 1: the map holds two keys, so it ends before the tombstone, which its segment's cleaning
    # gives a horizon.
    memory = 2 * limits.LOG_CLEANER_OFFSET_MAP_ENTRY_BYTES
    cleaned, first_dirty, _ = run_pass(storage, segments, first_dirty=0, memory_bytes=memory, now_ms=1_000)
    assert first_dirty == 2
    tomb_header = list(iter_batch_headers(storage.read_file(cleaned[0].path)))[-1]
    assert tomb_header.attributes & DELETE_HORIZON_MASK and tomb_header.first_timestamp == 1_000 + DAY_MS
    # Pass 2, long past the horizon, with a map that again ends before the tombstone.
    memory = 1 * limits.LOG_CLEANER_OFFSET_MAP_ENTRY_BYTES
    again, first_dirty, _ = run_pass(
        storage, cleaned, first_dirty=first_dirty, memory_bytes=memory, now_ms=10 * DAY_MS
    )
    assert first_dirty == 3
    assert latest_map(read_all(storage, again))[b"a"] == (3, None)
    # Once a map covers it, the older value goes with it in the same pass.
    final, _, _ = run_pass(storage, again, first_dirty=first_dirty, now_ms=10 * DAY_MS)
    assert b"a" not in latest_map(read_all(storage, final))


def test_a_tombstone_in_the_dirty_part_removes_the_older_records_at_once() -> None:
    storage = MemoryStorage()
    segments = write_segments(
        storage, layout([[(b"a", b"1")], [(b"a", b"2")], [(b"a", None)]], per_segment=1)
    )
    cleaned, _, _ = run_pass(storage, segments, first_dirty=0)
    assert [(r.key, r.value, r.offset) for r in read_all(storage, cleaned)] == [(b"a", None, 2)]


# ---- bounded memory ------------------------------------------------------------------------


def test_a_tiny_dedupe_buffer_cleans_in_several_passes_to_the_same_result() -> None:
    storage = MemoryStorage()
    segments = write_segments(storage, layout(updates(keys=30, rounds=4, per_batch=7), per_segment=4))
    expected = latest_map(read_all(storage, segments))
    end = segments[-1].end_offset
    memory = 8 * limits.LOG_CLEANER_OFFSET_MAP_ENTRY_BYTES  # 8 keys a pass
    first_dirty, passes = 0, 0
    while first_dirty < end:
        segments, next_dirty, _ = run_pass(storage, segments, first_dirty=first_dirty, memory_bytes=memory)
        assert next_dirty > first_dirty  # every pass moves on
        first_dirty = next_dirty
        passes += 1
        assert passes < 100
    assert passes > 3
    records = read_all(storage, segments)
    assert latest_map(records) == expected
    # Each pass leaves one record per key below its end; the last pass covered them all.
    assert len(records) == len({r.key for r in records}) == 30


def test_the_offset_map_refuses_a_new_key_when_full() -> None:
    offset_map = OffsetMap(2 * limits.LOG_CLEANER_OFFSET_MAP_ENTRY_BYTES)
    assert offset_map.capacity_entries == 2
    assert offset_map.put(b"a" * 16, 1) and offset_map.put(b"b" * 16, 2)
    assert offset_map.put(b"a" * 16, 3)  # a known key still moves forward
    assert not offset_map.put(b"c" * 16, 4)
    assert (offset_map.get(b"a" * 16), offset_map.get(b"c" * 16), len(offset_map)) == (3, -1, 2)


# ---- planning ------------------------------------------------------------------------------


def seg(base: int, end: int, size: int = 100, max_ts: int = 1_000) -> Seg:
    return Seg(base, end, end, f"{DIR}/{base}.log", size, max_ts)


# A log end past every segment offered: the active segment holds records.
LEO_PAST = 1_000_000


def test_the_segment_ending_at_the_log_end_is_never_cleaned() -> None:
    """A periodic roll leaves the active segment empty: the segment before it holds the log's
    last batch, which cleaning could drop, leaving the log ending in a hole."""
    segments = [seg(0, 10), seg(10, 20)]
    config = LogConfig(cleanup_policy="compact")
    plan = plan_cleaning(
        segments, first_dirty_offset=0, high_watermark=20, log_end_offset=20, now_ms=10_000, config=config
    )
    assert [s.base_offset for s in plan.segments] == [0] and plan.cleanable_end == 10
    plan = plan_cleaning(
        segments, first_dirty_offset=0, high_watermark=20, log_end_offset=21, now_ms=10_000, config=config
    )
    assert [s.base_offset for s in plan.segments] == [0, 10], "the active segment holds offset 20"


def test_plan_stops_at_the_high_watermark_and_the_min_compaction_lag() -> None:
    segments = [seg(0, 10, max_ts=1_000), seg(10, 20, max_ts=5_000), seg(20, 30, max_ts=9_000)]
    config = LogConfig(cleanup_policy="compact")
    plan = plan_cleaning(
        segments,
        first_dirty_offset=0,
        high_watermark=25,
        log_end_offset=LEO_PAST,
        now_ms=10_000,
        config=config,
    )
    assert [s.base_offset for s in plan.segments] == [0, 10] and plan.cleanable_end == 20
    lagged = LogConfig(cleanup_policy="compact", min_compaction_lag_ms=4_000)
    plan = plan_cleaning(
        segments,
        first_dirty_offset=0,
        high_watermark=30,
        log_end_offset=LEO_PAST,
        now_ms=10_000,
        config=lagged,
    )
    assert [s.base_offset for s in plan.segments] == [0, 10]  # 9_000 is within 4 s of 10_000
    plan = plan_cleaning(
        segments,
        first_dirty_offset=0,
        high_watermark=30,
        log_end_offset=LEO_PAST,
        now_ms=8_000,
        config=lagged,
    )
    assert [s.base_offset for s in plan.segments] == [0]


def test_dirty_ratio_and_max_compaction_lag_decide() -> None:
    segments = [seg(0, 10, size=300, max_ts=1_000), seg(10, 20, size=100, max_ts=2_000)]
    config = LogConfig(cleanup_policy="compact", min_cleanable_dirty_ratio=0.5)
    plan = plan_cleaning(
        segments,
        first_dirty_offset=10,
        high_watermark=20,
        log_end_offset=LEO_PAST,
        now_ms=3_000,
        config=config,
    )
    assert (plan.clean_bytes, plan.dirty_bytes, plan.dirty_ratio) == (300, 100, 0.25)
    assert not plan.should_clean(config)
    forced = LogConfig(cleanup_policy="compact", max_compaction_lag_ms=500)
    plan = plan_cleaning(
        segments,
        first_dirty_offset=10,
        high_watermark=20,
        log_end_offset=LEO_PAST,
        now_ms=3_000,
        config=forced,
    )
    assert plan.past_max_compaction_lag and plan.should_clean(forced)
    plan = plan_cleaning(
        segments,
        first_dirty_offset=20,
        high_watermark=20,
        log_end_offset=LEO_PAST,
        now_ms=3_000,
        config=forced,
    )
    assert not plan.has_dirty and not plan.should_clean(forced)
    # A first dirty offset outside the log (a truncation, DeleteRecords) starts from the first segment.
    plan = plan_cleaning(
        segments,
        first_dirty_offset=99,
        high_watermark=20,
        log_end_offset=LEO_PAST,
        now_ms=3_000,
        config=config,
    )
    assert plan.first_dirty_offset == 0 and plan.dirty_ratio == 1.0


def test_groups_stay_within_segment_bytes_index_bytes_and_int32_offsets() -> None:
    segments = [seg(0, 10, 400), seg(10, 20, 400), seg(20, 30, 400), seg(30, 40, 900), seg(40, 50, 50)]
    groups = group_segments_by_size(
        segments, max_size_bytes=1000, max_index_bytes=10**6, index_interval_bytes=100
    )
    assert [[s.base_offset for s in g] for g in groups] == [[0, 10], [20], [30, 40]]
    by_index = group_segments_by_size(
        segments, max_size_bytes=10**6, max_index_bytes=120, index_interval_bytes=100
    )
    assert all(sum(s.size_bytes // 100 + 1 for s in g) * 12 <= 120 or len(g) == 1 for g in by_index)
    wide = [seg(0, 2**31 - 10), seg(2**31 - 10, 2**31 + 10)]
    assert (
        len(
            group_segments_by_size(
                wide, max_size_bytes=10**6, max_index_bytes=10**6, index_interval_bytes=100
            )
        )
        == 2
    )


# ---- the throttle --------------------------------------------------------------------------


def test_the_throttle_sleeps_to_hold_the_rate() -> None:
    now = [0.0]
    slept: list[float] = []

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        now[0] += seconds * 1000

    throttler = Throttler(1_000_000, monotonic_ms=lambda: now[0], sleep_s=sleep, check_interval_ms=100)
    for _ in range(10):
        now[0] += 50  # 1 MB every 50 ms: 20 MB/s asked, 1 MB/s allowed
        throttler.maybe_throttle(1_000_000)
    moved_bytes = 10_000_000
    assert now[0] / 1000 == pytest.approx(moved_bytes / 1_000_000, rel=0.05)
    unlimited = Throttler(0, monotonic_ms=lambda: now[0], sleep_s=sleep)
    before = len(slept)
    unlimited.maybe_throttle(10**12)
    assert len(slept) == before


def test_the_cleaner_thread_yields_after_every_batch() -> None:
    """The worker hands the GIL to the event loop's thread between batches, also unthrottled."""
    storage = MemoryStorage()
    segments = write_segments(storage, layout(updates(keys=5, rounds=4), per_segment=2))
    batches = sum(len(list(iter_batch_headers(storage.read_file(s.path)))) for s in segments)
    sleeps: list[float] = []
    throttler = Throttler(0, monotonic_ms=lambda: 0.0, sleep_s=sleeps.append)
    offset_map = OffsetMap(1 << 20)
    mapped = build_offset_map(
        storage, segments, offset_map, start_offset=0, end_offset=20, throttler=throttler
    )
    assert sleeps == [0] * batches
    ctx = FilterContext(offset_map, mapped.end_offset, 0, DAY_MS, {})
    clean_group(storage, segments, f"{DIR}/yielding.log", ctx, throttler=throttler)
    assert sleeps == [0] * (2 * batches)


# ---- whole passes over a Log ---------------------------------------------------------------

COMPACT = LogConfig(
    cleanup_policy="compact",
    segment_bytes=600,
    index_interval_bytes=200,
    retention_ms=-1,
    max_message_bytes=500,
)


def fill_log(log: Log, batches: Sequence[Sequence[Rec]], now_ms: int = 1_000) -> None:
    for recs in batches:
        log.append_as_leader(make_batch(0, recs, timestamp_ms=now_ms), leader_epoch=0, now_ms=now_ms)


def read_log(log: Log) -> list[Record]:
    records: list[Record] = []
    offset = log.log_start_offset
    while offset < log.log_end_offset:
        info = log.read(offset, max_bytes=1 << 20)
        if info.next_offset <= offset:
            break
        records += [r for r in decode_batches(info.records) if r.offset >= offset]
        offset = info.next_offset
    return records


def clean_log_once(log: Log, now_ms: int) -> int:
    """One pass over every inactive segment with the pure functions and the Log's swap; the map's end."""
    storage = log.storage
    views = log.segments_for_cleaning()
    offset_map = OffsetMap(1 << 20)
    end = views[-1].end_offset
    mapped = build_offset_map(storage, views, offset_map, start_offset=0, end_offset=end, throttler=None)
    ctx = FilterContext(offset_map, mapped.end_offset, now_ms, DAY_MS, {})
    config = log.config
    groups = group_segments_by_size(
        views,
        max_size_bytes=config.segment_bytes,
        max_index_bytes=config.max_index_bytes,
        index_interval_bytes=config.index_interval_bytes,
    )
    for group in groups:
        clean_group(storage, group, log.cleaned_segment_path(group[0].base_offset), ctx, throttler=None)
        log.replace_segments(group, now_ms)
    return mapped.end_offset


def test_a_real_log_cleaned_and_reopened_reads_back_the_same_latest_values() -> None:
    storage = MemoryStorage()
    log = Log.open(DIR, COMPACT, storage=storage, now_ms=1_000)
    fill_log(log, updates(keys=12, rounds=10, per_batch=4, seed=1))
    before = latest_map(read_log(log))
    segments_before = len(log.segments_for_cleaning())
    assert segments_before > 3
    end = clean_log_once(log, 5_000)
    after = read_log(log)
    assert latest_map(after) == before
    below = [r for r in after if r.offset < end]
    assert len(below) == len({r.key for r in below})
    # A second pass merges the small cleaned segments (groupSegmentsBySize).
    fill_log(log, updates(keys=12, rounds=3, per_batch=4, seed=2))
    before = latest_map(read_log(log))
    segments_now = len(log.segments_for_cleaning())
    end = clean_log_once(log, 6_000)
    after = read_log(log)
    assert latest_map(after) == before
    assert len(log.segments_for_cleaning()) < segments_now
    below = [r for r in after if r.offset < end]
    assert len(below) == len({r.key for r in below}) == 12
    log.close()
    reopened = Log.open(DIR, COMPACT, storage=storage, now_ms=7_000)
    assert [(r.offset, r.key, r.value) for r in read_log(reopened)] == [
        (r.offset, r.key, r.value) for r in after
    ]


def test_a_follower_appends_the_leaders_cleaned_batches() -> None:
    """A lagging follower fetches cleaned batches (fewer records than their offset range, holes)."""
    storage = MemoryStorage()
    leader = Log.open(DIR, COMPACT, storage=storage, now_ms=1_000)
    fill_log(leader, updates(keys=12, rounds=10, per_batch=4, seed=3))
    clean_log_once(leader, 5_000)
    follower = Log.open("/data/follower/t-0", COMPACT, storage=storage, now_ms=5_000)
    offset = 0
    while offset < leader.log_end_offset:
        info = leader.read(offset, max_bytes=700)
        follower.append_as_follower(info.records, now_ms=5_000)
        offset = info.next_offset
    assert [(r.offset, r.key, r.value) for r in read_log(follower)] == [
        (r.offset, r.key, r.value) for r in read_log(leader)
    ]


# ---- the manager ---------------------------------------------------------------------------


@dataclass
class FakePartition:
    log: Log
    high_watermark: int
    role: Role = Role.LEADER
    producers: ProducerStateManager = field(default_factory=ProducerStateManager)

    @property
    def last_stable_offset(self) -> int:
        return self.producers.last_stable_offset(self.high_watermark)


class FakeClock:
    def __init__(self, now_ms: int) -> None:
        self.now_ms = now_ms

    def wall_ms(self) -> int:
        return self.now_ms


def make_cleaner(partitions: dict[tuple[str, int], Any], clock: FakeClock, **kw: Any) -> LogCleaner:
    return LogCleaner(CleanerConfig(io_max_bytes_per_second=0, **kw), lambda: partitions, clock=clock)


def test_the_manager_cleans_the_dirtiest_log_checkpoints_and_leaves_clean_ones() -> None:
    storage = MemoryStorage()
    log = Log.open(DIR, COMPACT, storage=storage, now_ms=1_000)
    fill_log(log, updates(keys=8, rounds=12, per_batch=4))
    expected = latest_map(read_log(log))
    partitions = {("t", 0): FakePartition(log, log.log_end_offset)}
    clock = FakeClock(10_000)
    cleaner = make_cleaner(partitions, clock)

    async def scenario() -> None:
        assert await cleaner.clean_once()
        result = cleaner.passes[-1]
        assert result.completed and result.map_end_offset == log.segments_for_cleaning()[-1].end_offset
        stored = checkpoints.read_offset(storage, os.path.join(DIR, checkpoints.CLEANER_OFFSET_CHECKPOINT))
        assert stored == result.map_end_offset
        assert not await cleaner.clean_once()  # nothing dirty left: no tight loop of passes

    asyncio.run(scenario())
    assert latest_map(read_log(log)) == expected


def test_a_log_that_fails_to_clean_is_uncleanable_and_retried_after_a_backoff(
    caplog: pytest.LogCaptureFixture,
) -> None:
    storage = MemoryStorage()
    log = Log.open(DIR, COMPACT, storage=storage, now_ms=1_000)
    fill_log(log, updates(keys=8, rounds=12, per_batch=4))
    views = log.segments_for_cleaning()
    # Damage a record byte of the second segment's first batch on disk (the cleaner checks CRCs).
    handle = storage.open(views[1].path, create=False)
    data = bytearray(handle.read_at(0, handle.size))
    data[ATTRIBUTES_POS + 40] ^= 0xFF
    handle.truncate(0)
    handle.append(bytes(data))
    handle.close()
    partitions = {("t", 0): FakePartition(log, log.log_end_offset)}
    clock = FakeClock(10_000)
    cleaner = make_cleaner(partitions, clock)

    async def scenario() -> None:
        assert await cleaner.clean_once()  # tried and failed
        assert not await cleaner.clean_once()  # backing off: not tried again at once
        clock.now_ms += limits.LOG_CLEANER_UNCLEANABLE_RETRY_MS_MIN
        assert await cleaner.clean_once()  # retried once the backoff passed; fails again
        clock.now_ms += limits.LOG_CLEANER_UNCLEANABLE_RETRY_MS_MIN
        assert not await cleaner.clean_once()  # the second failure doubled the wait

    asyncio.run(scenario())
    errors = [r for r in caplog.records if "uncleanable" in r.getMessage()]
    assert len(errors) == 2 and "CRC" in errors[0].getMessage()
    assert not any(name.endswith(".cleaned.log") for name in storage.list_dir(DIR))  # no leftover


def test_a_pass_whose_segments_change_under_it_discards_its_file_and_waits(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A truncation (or retention, DeleteRecords) while the thread filters: no swap, no uncleanable
    mark, no leftover file, and the pass reports False so the loop waits for the backoff."""
    storage = MemoryStorage()
    log = Log.open(DIR, COMPACT, storage=storage, now_ms=1_000)
    fill_log(log, updates(keys=8, rounds=12, per_batch=4, seed=4))
    partitions = {("t", 0): FakePartition(log, log.log_end_offset)}
    cleaner = make_cleaner(partitions, FakeClock(10_000))
    entered = threading.Event()
    release = threading.Event()
    real_clean_group = clean_group  # the function log_cleaner imported

    def held_clean_group(*args: Any, **kwargs: Any) -> GroupResult:
        entered.set()
        release.wait(10)
        return real_clean_group(*args, **kwargs)

    monkeypatch.setattr(log_cleaner, "clean_group", held_clean_group)

    async def scenario() -> bool:
        running = asyncio.create_task(cleaner.clean_once())
        assert await asyncio.to_thread(entered.wait, 10)
        log.truncate_to(log.segments_for_cleaning()[0].end_offset + 1)  # a follower's truncation
        release.set()
        return await running

    assert asyncio.run(scenario()) is False
    assert not any(".cleaned" in name for name in storage.list_dir(DIR))
    assert not storage.exists(os.path.join(DIR, checkpoints.CLEANER_OFFSET_CHECKPOINT))
    state = cleaner._states[("t", 0)]
    assert state.failures == 0 and state.retry_at_ms == -1


def test_stop_ends_a_throttled_pass_at_once_and_leaves_no_file() -> None:
    storage = MemoryStorage()
    log = Log.open(DIR, COMPACT, storage=storage, now_ms=1_000)
    fill_log(log, updates(keys=8, rounds=12, per_batch=4, seed=5))
    partitions: dict[tuple[str, int], Any] = {("t", 0): FakePartition(log, log.log_end_offset)}
    # 10 B/s: each batch read makes the pass sleep for many seconds; stop() must cut that short.
    cleaner = LogCleaner(
        CleanerConfig(io_max_bytes_per_second=10, backoff_ms=10),
        lambda: partitions,
        clock=FakeClock(10_000),
    )
    slept = threading.Event()
    real_sleep = cleaner._throttle_sleep

    def sleep(seconds: float) -> None:
        if seconds > 0:
            slept.set()
        real_sleep(seconds)

    cleaner._throttler = Throttler(
        10, monotonic_ms=lambda: time.monotonic() * 1000, sleep_s=sleep, check_interval_ms=1
    )

    async def scenario() -> float:
        cleaner.start()
        assert await asyncio.to_thread(slept.wait, 10)
        started = time.monotonic()
        await cleaner.stop()
        assert cleaner._task is not None and cleaner._task.done()
        return time.monotonic() - started

    assert asyncio.run(scenario()) < 5
    assert not any(".cleaned" in name for name in storage.list_dir(DIR))
    assert cleaner._states[("t", 0)].failures == 0
