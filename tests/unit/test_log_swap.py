"""Swapping a cleaned segment into the log (issue 39): Log.replace_segments and its recovery.

The cleaner writes a cleaned file beside the old segments; replace_segments swaps it in with
a rename protocol whose commit point is one rename (swap.py's docstring). The cleaner splits it:
Log.prepare_swap (the scan and the index writes) on its thread, Log.commit_swap on the loop. Here the cleaned
file is made by copying some of the old batches' bytes (what a cleaner keeps of them). The
storage is instrumented to die at its k-th mutating call, for every k of a swap, followed by
a power cut (MemoryStorage.crash) or a process kill (real files) and Log.open: the log must
hold exactly the old segments or exactly the new one, with every record at its offset.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import random
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from aiokafka.record.default_records import DefaultRecordBatchBuilder

from clients.common.errors import CorruptMessage, StorageError
from clients.common.record_batch import (
    BASE_OFFSET_POS,
    PARTITION_LEADER_EPOCH_POS,
    BatchHeader,
    iter_batch_headers,
)
from clients.common.records import Record, decode_batches, encode_batch, encode_values
from clients.common.transport.local_reads import NotReadableHere, read_located
from protos.highwater.v1 import common_pb2
from services.broker.log import Log, LogConfig, MemoryStorage
from services.broker.log.file_storage import FileStorage, open_real_file_count
from services.broker.log.log import PreparedSwap, SegmentsChanged, SegmentView
from services.broker.log.segment import LogSegment
from services.broker.log.storage import (
    CachedFile,
    OpenFileCache,
    Storage,
    StorageFile,
)
from services.broker.log_cleaner import CleanerConfig, LogCleaner
from services.broker.partition import Role
from services.broker.producer_state import ProducerStateManager
from tests.storage_faults import StepStorage

# Cleaned logs are compacted ones: recovery allows holes only there.
CONFIG = LogConfig(
    segment_bytes=500,
    index_interval_bytes=150,
    retention_ms=-1,
    max_message_bytes=500,
    cleanup_policy="compact",
)
DIRECTORY = "/data/topic-0"

Records = list[tuple[int, bytes | None]]
Keep = Callable[[BatchHeader], bool]


class SimulatedCrash(Exception):
    """The process died at this storage call: nothing after it runs."""


class _ThreadCheckedCache(OpenFileCache):
    """The shared cache of open files, noting which threads use it: only the loop's may."""

    def __init__(self, storage: Storage, max_open: int, threads: set[int]) -> None:
        super().__init__(storage, max_open)
        self.threads = threads

    def open(self, path: str, *, pinned: bool) -> CachedFile:
        self.threads.add(threading.get_ident())
        return super().open(path, pinned=pinned)

    def reopen(self, file: CachedFile, path: str) -> StorageFile:
        self.threads.add(threading.get_ident())
        return super().reopen(file, path)

    def touch(self, file: CachedFile) -> None:
        self.threads.add(threading.get_ident())
        super().touch(file)


class CrashAt(StepStorage):
    """A Storage over MemoryStorage or FileStorage that dies at its `crash_at`-th mutating call
    (counted from when it is armed) and refuses every call after it, as a dead process makes none."""

    def __init__(self, inner: MemoryStorage | FileStorage) -> None:
        super().__init__(inner)
        self.inner: MemoryStorage | FileStorage = inner
        # Tiny: files are evicted and reopened all the time.
        # The threads that used the cache (the loop's only: see _ThreadCheckedCache).
        self.cache_threads: set[int] = set()
        self.open_files: OpenFileCache = _ThreadCheckedCache(self, 2, self.cache_threads)
        self.bytes_read = 0
        self.crash_at: int | None = None
        self.steps: list[str] = []
        # What the call at crash_at raises: a crash, or a failed disk (StorageError) the process survives.
        self.failure: type[Exception] = SimulatedCrash

    def step(self, what: str) -> None:
        if self.crash_at is None:
            return
        if len(self.steps) >= self.crash_at:
            if self.failure is not SimulatedCrash:
                self.crash_at = None  # a failed call; the process lives on and calls again
            raise self.failure(what)
        self.steps.append(what)

    def arm(self, crash_at: int) -> None:
        self.crash_at = crash_at
        self.steps = []

    def restart(self, rng: random.Random | None = None) -> None:
        """The process is gone: after a power cut on memory (torn writes with `rng`); real
        files keep what was written (a kill)."""
        self.open_files.crash()
        self.open_files = _ThreadCheckedCache(self, 2, self.cache_threads)
        if isinstance(self.inner, MemoryStorage):
            self.inner.crash(rng)
        self.crash_at = None

    def read_bytes(self, count: int) -> None:
        self.bytes_read += count


def read_records(log: Log) -> list[Record]:
    records: list[Record] = []
    offset = log.log_start_offset
    while offset < log.log_end_offset:
        fetched = log.read(offset, max_bytes=1 << 20)
        records.extend(r for r in decode_batches(fetched.records) if r.offset >= offset)
        offset = fetched.next_offset
    return records


def read_everything(log: Log) -> Records:
    offset = log.log_start_offset
    seen: Records = []
    while offset < log.log_end_offset:
        fetched = log.read(offset, max_bytes=400)
        if fetched.is_empty:
            break
        seen.extend((r.offset, r.value) for r in decode_batches(fetched.records) if r.offset >= offset)
        offset = fetched.next_offset
    return seen


def filled_log(storage: Storage, directory: str = DIRECTORY, batches: int = 40) -> Log:
    log = Log.open(directory, CONFIG, storage=storage, now_ms=0)
    for i in range(batches):
        values = [b"v%d-%d" % (i, j) for j in range(1 + i % 3)]
        log.append_as_leader(
            encode_values(values, timestamp_ms=1_000 + i), leader_epoch=1 + i // 15, now_ms=i
        )
    log.flush(now_ms=0)
    return log


def write_cleaned(log: Log, views: list[SegmentView], keep: Keep) -> set[int]:
    """Write (and fsync) the cleaned file as a cleaner would: the kept batches' bytes, in order.
    Returns the base offsets of the batches kept."""
    storage = log.storage
    out = storage.open(log.cleaned_segment_path(views[0].base_offset))
    kept: set[int] = set()
    for view in views:
        source = storage.open(view.path, create=False)
        data = source.read_at(0, source.size)
        source.close()
        for header in iter_batch_headers(data):
            if keep(header):
                out.append(data[header.position : header.end_position])
                kept.add(header.base_offset)
    out.fsync()
    out.close()
    return kept


def expected_after(before: Records, views: list[SegmentView], kept_bases: set[int], log: Log) -> Records:
    """The records the log holds once the swap is done: those outside the range, and in it those
    of the kept batches."""
    start, end = views[0].base_offset, views[-1].end_offset
    batch_of: dict[int, int] = {}
    for header in log.batch_headers():
        for offset in range(header.base_offset, header.next_offset):
            batch_of[offset] = header.base_offset
    return [(o, v) for o, v in before if not start <= o < end or batch_of[o] in kept_bases]


def every_other_batch(header: BatchHeader) -> bool:
    return header.base_offset % 2 == 0


def test_replace_segments_keeps_every_kept_record_at_its_offset() -> None:
    storage = MemoryStorage(open_files_max=2)
    log = filled_log(storage)
    views = log.segments_for_cleaning()
    assert len(views) >= 4
    assert all(v.end_offset == w.base_offset for v, w in itertools.pairwise(views))
    run = views[:3]
    before = read_everything(log)
    kept = write_cleaned(log, run, every_other_batch)
    after = expected_after(before, run, kept, log)
    assert len(after) < len(before)
    log.replace_segments(run, now_ms=5)
    bases = log.segment_base_offsets
    assert bases[0] == run[0].base_offset and bases[1] == run[-1].end_offset
    assert read_everything(log) == after
    # Every offset answers from the first kept batch at or after it.
    headers = list(log.batch_headers())
    for offset in range(log.log_end_offset):
        holder = next(h for h in headers if h.next_offset > offset)
        assert log.read(offset, max_bytes=1).first_offset == holder.base_offset
        assert log.locate(offset)[2] == holder.base_offset  # type: ignore[index]
    new_view = log.segments_for_cleaning()[0]
    assert (new_view.base_offset, new_view.end_offset) == (run[0].base_offset, run[-1].end_offset)
    assert not [n for n in storage.list_dir(DIRECTORY) if ".cleaned" in n or ".swap" in n]
    # A clean reopen and a crash both keep it; appends go on.
    log.close()
    reopened = Log.open(DIRECTORY, CONFIG, storage=storage, now_ms=0)
    assert reopened.segment_base_offsets == bases
    assert read_everything(reopened) == after
    reopened.append_as_leader(encode_values([b"new"], timestamp_ms=9), leader_epoch=9, now_ms=9)
    reopened.flush(now_ms=9)
    storage.crash()
    again = Log.open(DIRECTORY, CONFIG, storage=storage, now_ms=0)
    assert read_everything(again)[:-1] == after


def test_a_cleaned_run_that_drops_whole_segments_and_is_cleaned_again() -> None:
    storage = MemoryStorage()
    log = filled_log(storage, batches=60)
    views = log.segments_for_cleaning()
    run = views[:3]
    last_base = run[-1].base_offset
    before = read_everything(log)
    # Nothing kept of the last segment: a hole up to the next segment's base.
    kept = write_cleaned(log, run, lambda h: h.base_offset < last_base and h.base_offset % 3 == 0)
    after = expected_after(before, run, kept, log)
    log.replace_segments(run, now_ms=1)
    assert read_everything(log) == after
    new = log.segments_for_cleaning()[0]
    assert new.next_offset < new.end_offset
    # The cleaned segment grouped with the next one, everything of it dropped but one batch.
    second = log.segments_for_cleaning()[:2]
    keep_one = max(kept)
    kept2 = write_cleaned(log, second, lambda h: h.base_offset == keep_one)
    after2 = expected_after(after, second, kept2, log)
    log.replace_segments(second, now_ms=2)
    assert read_everything(log) == after2
    storage.crash()
    assert read_everything(Log.open(DIRECTORY, CONFIG, storage=storage, now_ms=0)) == after2


def test_an_emptied_first_segment_keeps_the_log_start() -> None:
    storage = MemoryStorage()
    log = filled_log(storage)
    run = log.segments_for_cleaning()[:1]
    before = read_everything(log)
    write_cleaned(log, run, lambda h: False)
    log.replace_segments(run, now_ms=1)
    assert log.log_start_offset == 0
    assert read_everything(log) == [r for r in before if r[0] >= run[0].end_offset]
    assert log.read(0, max_bytes=1).first_offset == run[0].end_offset
    log.close()
    reopened = Log.open(DIRECTORY, CONFIG, storage=storage, now_ms=0)
    assert reopened.log_start_offset == 0
    assert reopened.segment_base_offsets[0] == 0


@pytest.mark.parametrize("change", ["retention", "delete-records", "truncation", "became-active", "resized"])
def test_segments_changed_meanwhile_refuses_the_swap(change: str) -> None:
    storage = MemoryStorage()
    log = filled_log(storage)
    views = log.segments_for_cleaning()
    run = views[:2] if change != "became-active" else views[-2:]
    write_cleaned(log, run, every_other_batch)
    if change in ("retention", "delete-records"):
        log.advance_log_start_offset(views[1].base_offset)  # the first segment goes
    elif change == "truncation":
        log.truncate_to(views[1].base_offset + 1)
    elif change == "became-active":
        log.truncate_to(views[-1].end_offset - 1)  # the last inactive segment is the active one now
    else:
        other = filled_log(storage, DIRECTORY + "-b", batches=2)
        run = [
            SegmentView(
                v.base_offset, v.next_offset, v.end_offset, v.path, v.size_bytes + 1, v.max_timestamp_ms
            )
            for v in run
        ]
        other.close()
    before = read_everything(log)
    bases = log.segment_base_offsets
    with pytest.raises(SegmentsChanged, match="changed since the cleaner read them"):
        log.replace_segments(run, now_ms=1)
    assert isinstance(SegmentsChanged(""), StorageError)
    assert read_everything(log) == before and log.segment_base_offsets == bases
    assert not log.is_offline


@pytest.mark.parametrize("damage", ["past-the-range", "torn", "garbage"])
def test_a_bad_cleaned_file_is_refused_and_deleted(damage: str) -> None:
    storage = MemoryStorage()
    log = filled_log(storage)
    views = log.segments_for_cleaning()
    run = views[:2]
    before = read_everything(log)
    if damage == "past-the-range":
        write_cleaned(log, views[:3], every_other_batch)  # holds offsets of the third segment
    else:
        write_cleaned(log, run, every_other_batch)
        cleaned = storage.open(log.cleaned_segment_path(run[0].base_offset))
        cleaned.append(b"\x00" * 30 if damage == "torn" else os.urandom(200))
        cleaned.fsync()
    with pytest.raises(CorruptMessage, match="cleaned segment"):
        log.replace_segments(run, now_ms=1)
    assert read_everything(log) == before
    assert not [n for n in storage.list_dir(DIRECTORY) if ".cleaned" in n or ".swap" in n]


def crash_run(
    storage: CrashAt, directory: str, crash_at: int, *, split: bool = False
) -> tuple[bool, Records, Records, list[int], list[int]]:
    """Build the log, write the cleaned file, die at the crash_at-th call of the swap: in one
    replace_segments, or (`split`) as the cleaner runs it: prepare_swap on a thread, commit_swap
    later on this one. (finished?, records before, records after, bases before, bases after)."""
    log = filled_log(storage, directory)
    run = log.segments_for_cleaning()[1:4]
    before = read_everything(log)
    bases_before = log.segment_base_offsets
    kept = write_cleaned(log, run, lambda h: h.base_offset % 3 != 1)
    after = expected_after(before, run, kept, log)
    bases_after = [b for b in bases_before if not run[0].base_offset < b < run[-1].end_offset]
    storage.arm(crash_at)
    try:
        if split:
            with ThreadPoolExecutor(1) as thread:
                prepared = thread.submit(log.prepare_swap, run, log.config).result()
            log.commit_swap(prepared, now_ms=1)
            prepared.close()
        else:
            log.replace_segments(run, now_ms=1)
        finished = True
    except SimulatedCrash:
        finished = False
    return finished, before, after, bases_before, bases_after


@pytest.mark.parametrize("split", [False, True], ids=["replace", "prepare-then-commit"])
@pytest.mark.parametrize("cut", ["power-cut", "torn-power-cut", "kill"])
def test_a_crash_at_every_step_of_the_swap_leaves_old_or_new_never_a_mix(
    cut: str, split: bool, tmp_path: Path
) -> None:
    outcomes: list[str] = []
    k = 0
    while True:
        directory = str(tmp_path / f"t-{k}") if cut == "kill" else DIRECTORY
        inner: MemoryStorage | FileStorage = FileStorage() if cut == "kill" else MemoryStorage()
        storage = CrashAt(inner)
        finished, before, after, bases_before, bases_after = crash_run(storage, directory, k, split=split)
        steps = list(storage.steps)
        storage.restart(random.Random(k) if cut == "torn-power-cut" else None)
        reopened = Log.open(directory, CONFIG, storage=storage, now_ms=0)
        state = (read_everything(reopened), reopened.segment_base_offsets)
        if state == (before, bases_before):
            outcomes.append("old")
        else:
            assert state == (after, bases_after), f"crash at step {k} ({steps[-1:] or 'none'}): a mix"
            outcomes.append("new")
        assert not [n for n in storage.list_dir(directory) if ".cleaned" in n or ".swap" in n]
        # The recovered log works on, and a second open agrees.
        reopened.append_as_leader(encode_values([b"z"], timestamp_ms=5), leader_epoch=7, now_ms=0)
        reopened.close()
        again = Log.open(directory, CONFIG, storage=storage, now_ms=0)
        assert read_everything(again)[:-1] == state[0]
        again.close()
        if finished:
            break
        k += 1
    # Old up to the commit point, new from it on; the swap had several steps on each side.
    assert outcomes[-1] == "new" and outcomes == sorted(outcomes, key=lambda o: o == "new")
    assert outcomes.count("old") >= 5 and outcomes.count("new") >= 5, outcomes


def test_a_located_read_cannot_read_a_swapped_out_file(tmp_path: Path) -> None:
    storage = FileStorage()
    log = filled_log(storage, str(tmp_path / "t-0"))
    run = log.segments_for_cleaning()[:2]
    located = log.read_location(0, max_bytes=300)
    assert located is not None
    where = storage.file_location(located.path)
    assert where is not None
    location = common_pb2.RecordsLocation(
        path=where.path,
        position=located.position,
        size=located.size,
        device=where.device,
        inode=where.inode,
        host_id=where.host_id,
    )
    assert read_located(location) == log.read(0, max_bytes=300).records
    write_cleaned(log, run, every_other_batch)
    log.replace_segments(run, now_ms=1)
    assert os.stat(located.path).st_ino != where.inode  # the path names the new file
    with pytest.raises(NotReadableHere):
        read_located(location)


def test_a_storage_failure_past_the_commit_point_takes_the_log_offline_until_reopened() -> None:
    storage = CrashAt(MemoryStorage())
    log = filled_log(storage)
    run = log.segments_for_cleaning()[1:3]
    before = read_everything(log)
    kept = write_cleaned(log, run, every_other_batch)
    after = expected_after(before, run, kept, log)
    storage.failure = StorageError
    storage.arm(12)  # a delete of an old segment, past the commit rename
    with pytest.raises(StorageError, match="swap of cleaned segment"):
        log.replace_segments(run, now_ms=1)
    assert storage.steps[-3].startswith("rename") and storage.steps[-3].endswith(".swap")
    assert log.is_offline
    with pytest.raises(StorageError, match="restart the broker"):
        log.read(0, max_bytes=100)
    with pytest.raises(StorageError):
        log.append_as_leader(encode_values([b"x"], timestamp_ms=1), leader_epoch=9, now_ms=1)
    log.abandon()
    reopened = Log.open(DIRECTORY, CONFIG, storage=storage, now_ms=0)
    assert read_everything(reopened) == after


def test_a_storage_failure_before_the_commit_point_leaves_the_log_usable() -> None:
    storage = CrashAt(MemoryStorage())
    log = filled_log(storage)
    run = log.segments_for_cleaning()[1:3]
    before = read_everything(log)
    write_cleaned(log, run, every_other_batch)
    storage.failure = StorageError
    storage.arm(5)  # writing the cleaned indexes
    with pytest.raises(StorageError):
        log.replace_segments(run, now_ms=1)
    assert not log.is_offline
    assert read_everything(log) == before
    assert not [n for n in storage.list_dir(DIRECTORY) if ".cleaned" in n or ".swap" in n]


def filtered(batch: bytes, header: BatchHeader, drop: Callable[[int], bool]) -> bytes | None:
    """The batch as a cleaner re-encodes it: the records at offsets `drop` refuses removed, its
    base offset, last offset delta and leader epoch kept (Kafka's); None when none is left."""
    records = [r for r in decode_batches(batch) if not drop(r.offset)]
    if not records:
        return None
    builder = DefaultRecordBatchBuilder(2, 0, 0, -1, -1, -1, 1 << 20)
    for record in records:
        builder.append(record.offset - header.base_offset, record.timestamp_ms, record.key, record.value, [])
    # The builder takes the last offset delta from the last record: keep that one.
    assert records[-1].offset == header.last_offset
    out = bytearray(builder.build())
    out[BASE_OFFSET_POS : BASE_OFFSET_POS + 8] = header.base_offset.to_bytes(8, "big")
    epoch = header.partition_leader_epoch.to_bytes(4, "big", signed=True)
    out[PARTITION_LEADER_EPOCH_POS : PARTITION_LEADER_EPOCH_POS + 4] = epoch
    return bytes(out)


def test_batches_with_fewer_records_than_their_range_swap_in_and_read_back() -> None:
    storage = MemoryStorage(open_files_max=2)
    log = filled_log(storage)
    run = log.segments_for_cleaning()[:3]
    before = read_everything(log)
    # Drop the first record of every batch of three (its last one stays: the range is kept).
    firsts = {h.base_offset for h in log.batch_headers() if h.records_count == 3}
    out = storage.open(log.cleaned_segment_path(run[0].base_offset))
    for view in run:
        source = storage.open(view.path, create=False)
        data = source.read_at(0, source.size)
        for header in iter_batch_headers(data):
            kept = filtered(data[header.position : header.end_position], header, lambda o: o in firsts)
            if kept is not None:
                out.append(kept)
    out.fsync()
    after = [(o, v) for o, v in before if o not in firsts or o >= run[-1].end_offset]
    log.replace_segments(run, now_ms=1)
    assert read_everything(log) == after
    for offset in firsts:
        if offset < run[-1].end_offset:
            fetched = log.read(offset, max_bytes=1)
            assert fetched.first_offset == offset  # the batch still starts there
            assert [r.offset for r in decode_batches(fetched.records)] == [offset + 1, offset + 2]
    log.flush(now_ms=1)
    storage.crash()
    reopened = Log.open(DIRECTORY, CONFIG, storage=storage, now_ms=0)
    assert read_everything(reopened) == after
    # A follower copies such batches as they are.
    follower = Log.open(DIRECTORY + "-f", CONFIG, storage=storage, now_ms=0)
    offset = 0
    while offset < reopened.log_end_offset:
        fetched = reopened.read(offset, max_bytes=300)
        follower.append_as_follower(fetched.records, now_ms=0)
        offset = fetched.next_offset
    assert read_everything(follower) == after


# ---- the swap split: prepare_swap on the cleaner's thread, commit_swap on the loop -----------

# Segments big enough that the scan of a cleaned file is far more than commit_swap may read.
BIG = LogConfig(
    segment_bytes=64 * 1024,
    index_interval_bytes=1024,
    retention_ms=-1,
    max_message_bytes=4096,
    cleanup_policy="compact",
)


def big_log(storage: Storage, directory: str = DIRECTORY) -> Log:
    log = Log.open(directory, BIG, storage=storage, now_ms=0)
    for i in range(1_200):
        values = [b"v%d-%d-" % (i, j) + b"x" * 40 for j in range(1 + i % 4)]
        log.append_as_leader(encode_values(values, timestamp_ms=1_000 + i), leader_epoch=1, now_ms=i)
    log.flush(now_ms=0)
    return log


def recovery_indexes(storage: Storage, cleaned_path: str, base: int, config: LogConfig) -> tuple[bytes, ...]:
    """The .index and .timeindex LogSegment.recover builds for the cleaned file (a copy of it)."""
    directory = "/data/reference"
    storage.mkdir(directory)
    copy = storage.open(os.path.join(directory, f"{base:020d}.log"))
    copy.append(storage.read_file(cleaned_path))
    copy.fsync()
    segment = LogSegment(storage, directory, base, config, active=False)
    assert segment.recover(latest_epoch=None).dropped_bytes == 0
    segment.flush()
    segment.close()
    return storage.read_file(segment.index_path), storage.read_file(segment.time_index_path)


def prepare_on_a_thread(log: Log, run: Sequence[SegmentView]) -> PreparedSwap:
    with ThreadPoolExecutor(1) as thread:
        return thread.submit(log.prepare_swap, run, log.config).result()


def test_prepare_on_a_thread_then_commit_later_while_the_log_goes_on() -> None:
    storage = CrashAt(MemoryStorage())
    log = big_log(storage)
    run = log.segments_for_cleaning()[1:4]
    before = read_everything(log)
    kept = write_cleaned(log, run, every_other_batch)
    after = expected_after(before, run, kept, log)
    cleaned_path = log.cleaned_segment_path(run[0].base_offset)
    cleaned_size = storage.inner.read_file(cleaned_path).__len__()
    assert cleaned_size > 20 * BIG.index_interval_bytes
    storage.cache_threads.clear()
    prepared = prepare_on_a_thread(log, run)
    # The thread never touched the loop's shared cache of open files.
    assert storage.cache_threads <= {threading.get_ident()}
    assert (prepared.base_offset, prepared.end_offset, prepared.size_bytes) == (
        run[0].base_offset,
        run[-1].end_offset,
        cleaned_size,
    )
    stem = cleaned_path[: -len(".log")]
    # The indexes prepare wrote are the very ones recovery would build.
    assert (storage.inner.read_file(stem + ".index"), storage.inner.read_file(stem + ".timeindex")) == (
        recovery_indexes(storage.inner, cleaned_path, run[0].base_offset, BIG)
    )
    assert storage.inner.read_file(stem + ".index")  # a non-trivial index
    # Meanwhile the log is used: appends (a roll too) and reads of the segments being replaced.
    for i in range(40):
        info = log.append_as_leader(
            encode_values([b"later-%d" % i], timestamp_ms=9_000), leader_epoch=2, now_ms=9
        )
        after.append((info.first_offset, b"later-%d" % i))
    assert read_everything(log) == before + after[len(after) - 40 :]
    # The commit on the loop: renames and deletes only, no fsync of data, no scan of the file.
    storage.arm(10_000)
    storage.bytes_read = 0
    log.commit_swap(prepared, now_ms=10)
    prepared.close()
    assert not [s for s in storage.steps if s.startswith(("fsync", "append", "create", "truncate"))], (
        storage.steps
    )
    assert storage.bytes_read < 8 * BIG.index_interval_bytes < cleaned_size
    storage.crash_at = None
    assert read_everything(log) == after
    assert not [n for n in storage.list_dir(DIRECTORY) if ".cleaned" in n or ".swap" in n]
    log.close()
    assert read_everything(Log.open(DIRECTORY, BIG, storage=storage, now_ms=0)) == after


@pytest.mark.parametrize("change", ["retention", "truncation", "became-active", "closed-and-reopened"])
def test_segments_changed_between_prepare_and_commit_refuse_it_and_delete_the_prepared_files(
    change: str,
) -> None:
    storage = MemoryStorage()
    log = filled_log(storage)
    views = log.segments_for_cleaning()
    run = views[:2] if change != "became-active" else views[-2:]
    write_cleaned(log, run, every_other_batch)
    prepared = prepare_on_a_thread(log, run)
    assert len([n for n in storage.list_dir(DIRECTORY) if ".cleaned." in n]) == 3
    if change == "retention":
        log.advance_log_start_offset(views[1].base_offset)  # the first segment goes
    elif change == "truncation":
        log.truncate_to(views[1].base_offset + 1)
    elif change == "became-active":
        log.truncate_to(views[-1].end_offset - 1)  # the last inactive segment is the active one now
    else:
        log.close()
        log = Log.open(DIRECTORY, CONFIG, storage=storage, now_ms=0)  # its open deleted the files
        log.truncate_to(views[0].end_offset + 1)
    before = read_everything(log)
    bases = log.segment_base_offsets
    with pytest.raises(SegmentsChanged, match="changed since the cleaner read them"):
        log.commit_swap(prepared, now_ms=1)
    prepared.close()
    assert read_everything(log) == before and log.segment_base_offsets == bases
    assert not log.is_offline
    assert not [n for n in storage.list_dir(DIRECTORY) if ".cleaned" in n or ".swap" in n]


def test_an_old_segment_is_freed_at_the_prepared_swaps_close_and_no_file_stays_open(tmp_path: Path) -> None:
    storage = FileStorage()
    log = filled_log(storage, str(tmp_path / "t-0"))
    run = log.segments_for_cleaning()[1:3]
    old_bytes = [Path(view.path).read_bytes() for view in run]
    write_cleaned(log, run, every_other_batch)
    files_open = open_real_file_count()
    prepared = prepare_on_a_thread(log, run)
    log.commit_swap(prepared, now_ms=1)
    assert not Path(run[1].path).exists()
    # Deleted by name only: the held handle still reads the old bytes until its close.
    assert [file.read_at(0, file.size) for file in prepared.held_files] == old_bytes
    prepared.close()
    prepared.close()  # idempotent
    assert open_real_file_count() <= files_open
    # A discarded prepared swap closes its files too.
    run = log.segments_for_cleaning()[2:4]
    write_cleaned(log, run, every_other_batch)
    files_open = open_real_file_count()
    prepared = prepare_on_a_thread(log, run)
    assert prepared.held_files
    log.discard_prepared(prepared)
    assert open_real_file_count() <= files_open
    assert not [p for p in os.listdir(tmp_path / "t-0") if ".cleaned" in p]


@dataclass
class _Replica:
    """What the cleaner reads of a partition (services/broker/partition.py's fields)."""

    log: Log
    high_watermark: int
    role: Role = Role.LEADER
    producers: ProducerStateManager = field(default_factory=ProducerStateManager)


def test_the_cleaner_prepares_on_its_thread_and_commits_on_the_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    config = LogConfig(cleanup_policy="compact", segment_bytes=600, index_interval_bytes=200, retention_ms=-1)
    storage = MemoryStorage()
    log = Log.open(DIRECTORY, config, storage=storage, now_ms=0)
    for i in range(60):
        records = [Record(b"k%d" % ((i * 3 + j) % 7), b"v%d" % i, [], 1_000 + i) for j in range(3)]
        log.append_as_leader(encode_batch(records), leader_epoch=0, now_ms=1_000)
    latest = {r.key: (r.offset, r.value) for r in read_records(log)}
    threads: dict[str, set[int]] = {"prepare_swap": set(), "commit_swap": set(), "replace_segments": set()}
    for name in threads:
        original = getattr(Log, name)

        def noted(
            self: Log, *args: object, _name: str = name, _original: Callable[..., object] = original
        ) -> object:
            threads[_name].add(threading.get_ident())
            return _original(self, *args)

        monkeypatch.setattr(Log, name, noted)
    replica = _Replica(log, log.log_end_offset)
    cleaner = LogCleaner(
        CleanerConfig(io_max_bytes_per_second=0),
        lambda: {("t", 0): replica},  # type: ignore[dict-item]  # the partition's fields it reads
    )

    async def clean() -> int:
        assert await cleaner.clean_once()
        return threading.get_ident()

    loop_thread = asyncio.run(clean())
    assert cleaner.passes[-1].swapped >= 1
    assert threads["prepare_swap"] and loop_thread not in threads["prepare_swap"]
    assert threads["commit_swap"] == {loop_thread}
    assert not threads["replace_segments"]
    read = read_records(log)
    assert {r.key: (r.offset, r.value) for r in read} == latest
    assert len(read) < 180
