"""Open files of the partition log are bounded (issue 17, item 4b).

Only the active segment of a log keeps its three files (log, offset index, time index)
open; every other segment file goes through the storage's broker-wide OpenFileCache,
which closes the least recently used beyond its bound and reopens it on the next read.
Before this, every segment kept three descriptors for ever: a producer that made many
small segments (segment_bytes down to 1 KiB, or offset jumps) took three brokers to
20,000 open files and STORAGE_ERROR "Too many open files".

File counts here are the process's real descriptors (/proc/self/fd) on the test's own
files where FileStorage is used, so a handle the cache forgot to close would show.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest

from clients.common.errors import InvariantViolation, StorageError
from clients.common.records import decode_batches, encode_values
from services.broker.log import Log, LogConfig, MemoryStorage
from services.broker.log.file_storage import FileStorage, open_real_file_count
from services.common.limits import OPEN_SEGMENT_FILES_MAX

# The smallest segment a topic may ask for: about four of the batches below per segment.
TINY = LogConfig(segment_bytes=1024, index_interval_bytes=100, retention_ms=-1, max_message_bytes=1024)
SEGMENTS = 500
# A small cache, so that the 500 segments' 1,500 files are evicted and reopened over and over.
CACHE_FILES = 8
# Only the active segment's .log is pinned open outside the cache's bound; its indexes live in
# memory and their files go through the cache like any other.
ACTIVE_FILES = 1


def open_fds(under: Path) -> int:
    """Descriptors of this process open on files below `under`.

    Only the test's own directory counts: threads left by earlier tests in this process
    (gRPC channels, etcd clients) open and close descriptors of their own at any moment.
    """
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except FileNotFoundError:  # closed between the listing and the read
            continue
        if target.startswith(f"{under}/"):
            count += 1
    return count


def value(offset: int) -> bytes:
    return b"value-%06d-" % offset + b"x" * 30


def fill_segments(log: Log, segments: int) -> None:
    """Append 4-record batches until the log has `segments` segments."""
    now_ms = 0
    while len(log.segment_base_offsets) < segments:
        first = log.log_end_offset
        log.append_as_leader(
            encode_values([value(first + i) for i in range(4)], timestamp_ms=now_ms),
            leader_epoch=0,
            now_ms=now_ms,
        )
        now_ms += 1


def check_every_record(log: Log, *, max_bytes: int = 300) -> int:
    """Read the log front to back as a catch-up consumer would; every value must be the one written."""
    offset = log.log_start_offset
    reads = 0
    while offset < log.log_end_offset:
        fetched = log.read(offset, max_bytes=max_bytes)
        records = [record for record in decode_batches(fetched.records) if record.offset >= offset]
        assert records, f"no progress at offset {offset}"
        for record in records:
            assert record.value == value(record.offset)
        offset = fetched.next_offset
        reads += 1
    return reads


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="counts descriptors through /proc")
def test_a_log_of_500_tiny_segments_keeps_a_bounded_number_of_files_open(tmp_path: Path) -> None:
    directory = str(tmp_path / "topic-0")
    storage = FileStorage(open_files_max=CACHE_FILES)
    fds_before = open_fds(tmp_path)
    real_before = open_real_file_count()

    log = Log.open(directory, TINY, storage=storage, now_ms=0)
    fill_segments(log, SEGMENTS)
    segment_files = [
        name for name in os.listdir(directory) if name.endswith((".log", ".index", ".timeindex"))
    ]
    assert len(segment_files) == 3 * SEGMENTS  # every file exists on disk ...
    assert open_fds(tmp_path) - fds_before <= ACTIVE_FILES + CACHE_FILES  # ... but few are open
    open_now = open_fds(tmp_path) - fds_before
    assert open_real_file_count() - real_before == storage.open_files.open_count == open_now

    # Every old segment still reads right, front to back and in a random order.
    check_every_record(log)
    bases = log.segment_base_offsets
    for base in reversed(bases[::7]):
        fetched = log.read(base + 1, max_bytes=1)
        assert [r.value for r in decode_batches(fetched.records)][1] == value(base + 1)
        assert log.offset_for_timestamp(base // 4) is not None  # the time index of an evicted segment
    assert open_fds(tmp_path) - fds_before <= ACTIVE_FILES + CACHE_FILES

    # A follower truncating into an old, evicted segment: it becomes the active one again.
    target = bases[300] + 4  # the second batch of segment 300
    log.truncate_to(target)
    assert log.log_end_offset == target and log.segment_base_offsets[-1] == bases[300]
    fill_segments(log, 320)
    check_every_record(log)
    assert len([n for n in os.listdir(directory) if n.endswith(".log")]) == 320

    # Retention (DeleteRecords, then by size after a restart): deleted segments' handles go with them.
    log.advance_log_start_offset(bases[100])
    assert log.segment_base_offsets[0] == bases[100]
    assert not os.path.exists(os.path.join(directory, f"{bases[99]:020d}.log"))
    log.close()
    assert open_fds(tmp_path) == fds_before
    by_size = Log.open(
        directory,
        LogConfig(
            segment_bytes=1024,
            index_interval_bytes=100,
            retention_ms=-1,
            max_message_bytes=1024,
            retention_bytes=50 * 1024,
        ),
        storage=storage,
        now_ms=0,
    )
    # Opening 220 segments stays bounded too.
    assert open_fds(tmp_path) - fds_before <= ACTIVE_FILES + CACHE_FILES
    assert by_size.delete_old_segments(now_ms=0, high_watermark=by_size.log_end_offset) > 100
    assert by_size.size_bytes <= 50 * 1024 + TINY.segment_bytes  # whole segments go
    check_every_record(by_size)
    assert open_fds(tmp_path) - fds_before <= ACTIVE_FILES + CACHE_FILES
    by_size.delete()
    assert open_fds(tmp_path) == fds_before and storage.open_files.open_count == 0
    assert not os.path.exists(directory)


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="counts descriptors through /proc")
def test_the_default_bound_holds_for_a_log_of_more_segments_than_it(tmp_path: Path) -> None:
    storage = FileStorage()
    fds_before = open_fds(tmp_path)
    log = Log.open(tmp_path / "topic-0", TINY, storage=storage, now_ms=0)
    fill_segments(log, OPEN_SEGMENT_FILES_MAX // 3 + 200)  # more files than the cache holds
    assert open_fds(tmp_path) - fds_before <= ACTIVE_FILES + OPEN_SEGMENT_FILES_MAX
    check_every_record(log)
    log.close()
    assert open_fds(tmp_path) == fds_before


def test_a_sequential_reader_reopens_an_old_segment_once_not_per_read(tmp_path: Path) -> None:
    config = LogConfig(segment_bytes=64 * 1024, index_interval_bytes=1024, retention_ms=-1)
    storage = FileStorage(open_files_max=2)  # room for exactly one reader's log and offset index
    log = Log.open(tmp_path / "topic-0", config, storage=storage, now_ms=0)
    fill_segments(log, 10)
    log.roll(now_ms=0)
    reopened_before = storage.open_files.reopen_count
    reads = check_every_record(log, max_bytes=1024)
    reopens = storage.open_files.reopen_count - reopened_before
    assert reads > 500
    # Each of the ten old segments: its offset index and its log, once each (the time index is not read).
    assert reopens <= 2 * 10


@pytest.mark.parametrize("make_storage", [MemoryStorage, FileStorage], ids=["memory", "file"])
def test_both_storages_count_the_same_open_files(tmp_path: Path, make_storage: type) -> None:
    storage = make_storage(open_files_max=CACHE_FILES)
    directory = "/data/topic-0" if isinstance(storage, MemoryStorage) else str(tmp_path / "topic-0")
    log = Log.open(directory, TINY, storage=storage, now_ms=0)
    fill_segments(log, 50)
    assert storage.open_files.open_count == ACTIVE_FILES + CACHE_FILES
    check_every_record(log)
    assert storage.open_files.reopen_count > 0
    log.close()
    assert storage.open_files.open_count == 0


def test_data_written_before_an_eviction_is_made_durable_by_a_flush_after_it() -> None:
    """The crash model holds across a close and reopen: durability belongs to the file, not the handle."""
    storage = MemoryStorage(open_files_max=1)
    log = Log.open("/data/topic-0", TINY, storage=storage, now_ms=0)
    fill_segments(log, 20)  # 19 rolled segments, written but never fsynced, their handles evicted
    assert storage.open_files.open_count == ACTIVE_FILES + 1
    end = log.log_end_offset
    log.flush(now_ms=0)  # reopens each old segment to fsync it
    fill_segments(log, 25)  # not flushed: lost in the crash
    log.abandon()
    storage.crash()
    recovered = Log.open("/data/topic-0", TINY, storage=storage, now_ms=0)
    assert recovered.log_end_offset == end
    check_every_record(recovered)


def test_many_replicas_hold_one_handle_each_and_flushes_reopen_only_indexes_with_new_entries() -> None:
    """10,000 replicas per broker need one held handle each, not three (issue 42): the active
    segment's index files sit in the cache, and a flush reopens one only to sync new entries."""
    storage = MemoryStorage(open_files_max=CACHE_FILES)
    sparse = dataclasses.replace(TINY, segment_bytes=1 << 20, index_interval_bytes=1 << 16)
    logs = [Log.open(f"/data/topic-{i}", sparse, storage=storage, now_ms=0) for i in range(40)]
    assert storage.open_files.open_count == len(logs) + CACHE_FILES

    def append_everywhere() -> None:
        for log in logs:
            first = log.log_end_offset
            log.append_as_leader(encode_values([value(first)], timestamp_ms=0), leader_epoch=0, now_ms=0)

    append_everywhere()
    for log in logs:
        log.flush(now_ms=0)  # the first flush syncs each index file once, whatever it held
    reopened = storage.open_files.reopen_count
    append_everywhere()  # no new index entries: 1 record each, far below index_interval_bytes
    for log in logs:
        log.flush(now_ms=0)
    assert storage.open_files.reopen_count == reopened
    assert storage.open_files.open_count == len(logs) + CACHE_FILES

    for log in logs:
        log.abandon()
    storage.crash()  # everything flushed survives, one record more per log than the first flush
    for i in range(len(logs)):
        recovered = Log.open(f"/data/topic-{i}", sparse, storage=storage, now_ms=0)
        assert recovered.log_end_offset == 2
        check_every_record(recovered)


def test_a_log_kept_across_a_crash_fails_loudly_instead_of_reading_the_new_disk() -> None:
    storage = MemoryStorage(open_files_max=2)
    log = Log.open("/data/topic-0", TINY, storage=storage, now_ms=0)
    fill_segments(log, 5)
    storage.crash()
    with pytest.raises(InvariantViolation, match="used after"):
        log.read(0, max_bytes=100)  # an evicted segment: its file may not be reopened
    with pytest.raises(InvariantViolation, match="used after"):
        log.read(log.segment_base_offsets[-1], max_bytes=100)  # the active segment: its handle died


def test_a_segment_file_changed_while_its_handle_was_closed_is_a_storage_error(tmp_path: Path) -> None:
    storage = FileStorage(open_files_max=1)
    directory = tmp_path / "topic-0"
    log = Log.open(directory, TINY, storage=storage, now_ms=0)
    fill_segments(log, 5)
    first_segment = directory / f"{0:020d}.log"
    os.truncate(first_segment, 100)  # something other than the broker cut it
    with pytest.raises(StorageError, match="bytes on reopening"):
        log.read(0, max_bytes=100)
    first_segment.unlink()
    with pytest.raises(StorageError, match="cannot open"):  # never recreated empty
        log.read(0, max_bytes=100)
    assert not first_segment.exists()
    log.abandon()


def test_the_broker_gauge_reports_the_open_segment_files(tmp_path: Path) -> None:
    from services.broker.metrics import OPEN_SEGMENT_FILES

    OPEN_SEGMENT_FILES.set_function(open_real_file_count)  # as the broker's replica manager does

    def gauge() -> float:
        return next(iter(OPEN_SEGMENT_FILES.collect())).samples[0].value

    before = gauge()
    log = Log.open(tmp_path / "topic-0", TINY, storage=FileStorage(open_files_max=CACHE_FILES), now_ms=0)
    fill_segments(log, 50)
    assert gauge() - before == ACTIVE_FILES + CACHE_FILES
    log.close()
    assert gauge() == before
