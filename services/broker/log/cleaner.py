"""The log cleaner's work on one compacted log: plan, map, filter (Kafka's Cleaner, our own code).

A pass over a log (services/broker/log_cleaner.py drives it):

1. `plan_cleaning` (pure, on the event loop): from the log's inactive segments, its first dirty
   offset (everything below it was cleaned once), its high watermark and the clock, which
   segments may be cleaned and how dirty the log is. A segment is cleanable when it lies wholly
   below the high watermark and every record in it is older than min.compaction.lag.ms; the
   first that is not ends the cleanable range (the active segment is never offered).
2. `build_offset_map` (worker thread): read the dirty part [first dirty, cleanable end) and
   record each key's latest offset in an `OffsetMap` of bounded size. When it fills, the pass
   ends the map at the last offset it holds: the rest stays dirty for the next pass.
3. `group_segments_by_size` (pure): the segments below the map's end, in runs whose cleaned
   output fits one segment (Kafka's groupSegmentsBySize).
4. `clean_group` (worker thread): filter each group into one file at the log's
   cleaned_segment_path, fsynced; then the driver checks and indexes it with Log.prepare_swap
   (still on the thread) and swaps it in with Log.commit_swap on the loop.

What a record keeps (Kafka's rules): a record whose key has a later offset in the map is
removed; offsets never change (a cleaned batch keeps its base offset and last offset delta, so
it may hold fewer records than its offset range, or none). A record without a key is kept (a
compacted topic refuses them at produce time; one written before that rule is left alone rather
than deleted). Control batches (transaction markers) are copied untouched. The batches of an
aborted transaction (the log's aborted-transaction index says which, `AbortedRanges`) hold no
key's latest value and are removed whole, as Kafka's cleaner discards them: a read_committed
consumer never sees them, and an aborted record must never stand for its key and remove the
committed one before it. A pass never reaches an open transaction (`plan_cleaning` is given the
last stable offset), whose outcome is not known yet. A batch from which nothing is removed is
copied byte for byte; a filtered one is re-encoded with the same codec, attributes, producer
id/epoch/base sequence, partition leader epoch, base offset and last offset delta. A batch left
empty is dropped unless it is its producer's last batch, whose header the producer state is
rebuilt from after a restart (services/broker/producer_state.py): it is kept as an empty batch.

Tombstones (a key's null value): kept for delete.retention.ms after the batch holding them is
first cleaned, then removed. When that is is stored in the batch itself, as Kafka's KIP-534 does:
the first cleaning that finds a tombstone in a batch without one rewrites the batch with the
delete-horizon attribute (bit 6) and its base timestamp set to now + delete.retention.ms (record
timestamps are deltas from it, so every record keeps its own timestamp). Every replica decides
for its own copy; the horizon survives restarts and swaps because it is in the data, and no
per-log clock state has to be kept consistent with the segments.

Pure where it can be: the functions here take a Storage, a clock and a throttle; none reads the
wall clock or touches asyncio. The worker-thread functions read old segment files by path
(Storage.open(path, create=False)) and write only the cleaned file; they call no Log method.
"""

from __future__ import annotations

import secrets
import struct
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar

import numpy as np
from aiokafka.codec import gzip_encode, lz4_encode, snappy_encode, zstd_encode

from clients.common.errors import CorruptMessage, HighwaterError, InvariantViolation
from clients.common.record_batch import (
    ATTRIBUTES_POS,
    BATCH_HEADER_SIZE,
    COMPRESSION_MASK,
    CRC_POS,
    LOG_OVERHEAD,
    MAGIC_V2,
    BatchHeader,
    batch_crc,
    check_batch,
)
from clients.common.record_validation import decompress_records
from services.common import limits

from . import cleaner_kernels as kernels
from .config import INT64_MAX, TIME_INDEX_ENTRY_BYTES, LogConfig
from .storage import Storage, StorageFile
from .txn_index import AbortedTxn

# KIP-534: attribute bit 6 says the batch's base (first) timestamp is its delete horizon, the
# wall-clock time after which its tombstones may be removed.
DELETE_HORIZON_MASK = 0x40
TIMESTAMP_TYPE_LOG_APPEND = 0x08
NO_PRODUCER_ID = -1

_COMPRESSORS: dict[int, Callable[[bytes], bytes]] = {
    1: gzip_encode,
    2: snappy_encode,
    3: lz4_encode,
    4: zstd_encode,
}


class CleanableSegment(Protocol):
    """What the cleaner needs of a segment: SegmentView (services/broker/log/swap.py) has it."""

    @property
    def base_offset(self) -> int: ...
    @property
    def next_offset(self) -> int: ...
    @property
    def end_offset(self) -> int: ...
    @property
    def path(self) -> str: ...
    @property
    def size_bytes(self) -> int: ...
    @property
    def max_timestamp_ms(self) -> int: ...


# A concrete segment type (Log.SegmentView in the broker): what goes in comes back out.
S = TypeVar("S", bound=CleanableSegment)

# ---- planning (pure) ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CleaningPlan(Generic[S]):
    """How dirty a log is and what a pass over it may touch.

    `segments` are the cleanable ones from the oldest on: [their first base, `cleanable_end`).
    The dirty part is [first_dirty_offset, cleanable_end); `clean_bytes` and `dirty_bytes` are
    the sizes of the segments below and from the one holding the first dirty offset (Kafka's
    estimate: a segment cleaned halfway counts as dirty).
    """

    segments: tuple[S, ...]
    first_dirty_offset: int
    cleanable_end: int
    clean_bytes: int
    dirty_bytes: int
    # The newest record time of the first dirty segment (-1: none): KIP-354's lag is measured
    # from it, so a dirty record waits at most max.compaction.lag.ms plus one segment's span.
    first_dirty_timestamp_ms: int
    # Whether max.compaction.lag.ms forces this log to be cleaned whatever its dirty ratio.
    past_max_compaction_lag: bool

    @property
    def dirty_ratio(self) -> float:
        total = self.clean_bytes + self.dirty_bytes
        return self.dirty_bytes / total if total else 0.0

    @property
    def has_dirty(self) -> bool:
        return self.cleanable_end > self.first_dirty_offset and self.dirty_bytes > 0

    def should_clean(self, config: LogConfig) -> bool:
        """Kafka's choice: dirty enough (min.cleanable.dirty.ratio) or past max.compaction.lag.ms."""
        if not self.has_dirty:
            return False
        return self.past_max_compaction_lag or self.dirty_ratio >= config.min_cleanable_dirty_ratio


def plan_cleaning(
    segments: Sequence[S],
    *,
    first_dirty_offset: int,
    high_watermark: int,
    log_end_offset: int,
    now_ms: int,
    config: LogConfig,
) -> CleaningPlan[S]:
    """Which of `segments` (the log's inactive segments, oldest first) one pass may clean.

    A segment is cleanable when it ends at or below the high watermark (never a record a new
    leader could truncate) and its newest record is older than min.compaction.lag.ms (so a
    consumer within that lag reads every update); the first one that is not ends the range.
    Nor is the segment that ends at the log end (the active segment is empty: a periodic roll,
    Log.maybe_roll): it holds the log's last batch, and cleaning could drop it, leaving a hole
    at the end of the log that a Kafka consumer reading "up to the high watermark" never
    crosses (its fetch at the hole answers nothing). Kafka rolls only on append, so its last
    batch is always in the active segment, which it never cleans either.
    `first_dirty_offset` is clamped to the log: a checkpoint from before a truncation or a
    DeleteRecords starts over from the first segment.
    """
    cleanable: list[S] = []
    for segment in segments:
        if segment.end_offset > high_watermark or segment.end_offset >= log_end_offset:
            break
        if config.min_compaction_lag_ms and segment.max_timestamp_ms > now_ms - config.min_compaction_lag_ms:
            break
        cleanable.append(segment)
    if not cleanable:
        start = segments[0].base_offset if segments else first_dirty_offset
        return CleaningPlan((), start, start, 0, 0, -1, False)
    start = cleanable[0].base_offset
    end = cleanable[-1].end_offset
    first_dirty = first_dirty_offset if start <= first_dirty_offset <= end else start
    clean_bytes = dirty_bytes = 0
    first_dirty_timestamp_ms = -1
    for segment in cleanable:
        if segment.end_offset <= first_dirty:
            clean_bytes += segment.size_bytes
        else:
            if first_dirty_timestamp_ms < 0 and dirty_bytes == 0:
                first_dirty_timestamp_ms = segment.max_timestamp_ms
            dirty_bytes += segment.size_bytes
    past_lag = (
        first_dirty_timestamp_ms >= 0
        and config.max_compaction_lag_ms < INT64_MAX
        and now_ms - first_dirty_timestamp_ms > config.max_compaction_lag_ms
    )
    return CleaningPlan(
        tuple(cleanable), first_dirty, end, clean_bytes, dirty_bytes, first_dirty_timestamp_ms, past_lag
    )


def group_segments_by_size(
    segments: Sequence[S],
    *,
    max_size_bytes: int,
    max_index_bytes: int,
    index_interval_bytes: int,
) -> list[list[S]]:
    """Adjacent segments in runs whose cleaned output fits one segment (Kafka's groupSegmentsBySize).

    A run's input sizes add up to at most `max_size_bytes` (its output is no bigger), its offset
    range fits the int32 relative offsets of an index, and its estimated index (one entry per
    `index_interval_bytes`, plus one per segment) fits `max_index_bytes`. A segment alone is
    always a group of its own, whatever its size.
    """
    groups: list[list[S]] = []
    index = 0
    while index < len(segments):
        group = [segments[index]]
        size = segments[index].size_bytes
        index_bytes = _index_bytes_estimate(segments[index], index_interval_bytes)
        index += 1
        while index < len(segments):
            candidate = segments[index]
            candidate_index = _index_bytes_estimate(candidate, index_interval_bytes)
            if (
                size + candidate.size_bytes > max_size_bytes
                or index_bytes + candidate_index > max_index_bytes
                or candidate.end_offset - group[0].base_offset - 1 > 2**31 - 1
            ):
                break
            group.append(candidate)
            size += candidate.size_bytes
            index_bytes += candidate_index
            index += 1
        groups.append(group)
    return groups


def _index_bytes_estimate(segment: CleanableSegment, index_interval_bytes: int) -> int:
    entries = segment.size_bytes // max(index_interval_bytes, 1) + 1
    return entries * TIME_INDEX_ENTRY_BYTES


# ---- the offset map ------------------------------------------------------------------------


class OffsetMap:
    """Key hash -> latest offset, bounded by memory (Kafka's SkimpyOffsetMap).

    The table is a numpy array the kernels (cleaner_kernels.py) fill and read without the GIL.
    `capacity_entries` = memory bytes / LOG_CLEANER_OFFSET_MAP_ENTRY_BYTES keys. The table
    starts small and doubles as keys arrive (up to the capacity), so a log with few keys costs a
    small table that stays in the CPU's caches; `release` gives the memory back between passes.
    Keys are hashed with MurmurHash3 x64-128 under a seed drawn per map: two keys share an entry
    with odds of about n²/2¹²⁹ for n keys, and a writer cannot choose keys that collide without
    knowing the seed. Offsets must be put in increasing order (a pass reads the log forward).
    """

    def __init__(self, memory_bytes: int, *, seed: int | None = None) -> None:
        self.capacity_entries = max(1, memory_bytes // limits.LOG_CLEANER_OFFSET_MAP_ENTRY_BYTES)
        self.seed = np.uint64(secrets.randbits(32) if seed is None else seed)
        # [keys held, latest offset put, records put]: the kernels update it in place.
        self._state = np.array([0, -1, 0], dtype=np.int64)
        self._keys_room = 1
        self._table = _table(1)
        self.peak_table_bytes = 0

    def __len__(self) -> int:
        return int(self._state[0])

    @property
    def latest_offset(self) -> int:
        return int(self._state[1])

    @property
    def table_bytes(self) -> int:
        """What the table's array holds now."""
        return int(self._table.nbytes)

    def clear(self) -> None:
        """Empty the map (its table keeps its size)."""
        self._table.fill(0)
        self._state[:] = (0, -1, 0)

    def release(self) -> None:
        """Empty the map and give its table's memory back (between passes)."""
        self._keys_room = 1
        self._table = _table(1)
        self._state[:] = (0, -1, 0)

    def _grow(self) -> bool:
        """Double the table (up to the capacity); False if it is at the capacity already."""
        if self._keys_room >= self.capacity_entries:
            return False
        keys = min(self.capacity_entries, max(_MAP_KEYS_FIRST, self._keys_room * 2))
        table = _table(keys)
        kernels.map_copy(self._table, table)
        self._table, self._keys_room = table, keys
        self.peak_table_bytes = max(self.peak_table_bytes, self.table_bytes)
        return True

    def put(self, digest: bytes, offset: int) -> bool:
        """Record `offset` for the key whose 16-byte hash is `digest`; False, recording nothing,
        if a new key would overfill the map (tests and tools; a pass puts a batch's records at
        once with `put_records`)."""
        h1, h2 = _digest_halves(digest)
        while True:
            status = kernels.map_put(self._table, self._state, self._keys_room, h1, h2, offset)
            if status != kernels.STATUS_FULL or not self._grow():
                break
        if status == kernels.STATUS_OFFSET_NOT_INCREASING:
            raise InvariantViolation(
                f"offset map: offset {offset} put after {self.latest_offset}; a pass reads forward"
            )
        return bool(status == kernels.STATUS_OK)

    def get(self, digest: bytes) -> int:
        """The latest offset recorded for the key whose 16-byte hash is `digest`, -1 if none."""
        h1, h2 = _digest_halves(digest)
        return int(kernels.map_get(self._table, h1, h2))

    def put_records(
        self, section: np.ndarray, count: int, base_offset: int, start_offset: int, end_offset: int
    ) -> tuple[int, int]:
        """kernels.map_records over one batch's records section, growing the table as it fills:
        (status, value) as the kernel answers, STATUS_FULL only at the map's capacity."""
        while True:
            status, value = kernels.map_records(
                section,
                count,
                base_offset,
                start_offset,
                end_offset,
                self._table,
                self._state,
                self._keys_room,
                self.seed,
            )
            if status != kernels.STATUS_FULL or not self._grow():
                return int(status), int(value)
            # The kernel put every record below `value` (offsets increase): go on from there.
            start_offset = int(value)

    @property
    def records_put(self) -> int:
        """Records put since the map was last emptied."""
        return int(self._state[2])

    def filter_records(
        self,
        section: np.ndarray,
        header: BatchHeader,
        map_end_offset: int,
        now_ms: int,
        horizon_ms: int,
        scratch: np.ndarray,
    ) -> tuple[int, int, int, int, int, int, int]:
        """kernels.filter_records over one batch's records section against this map."""
        answer = kernels.filter_records(
            section,
            header.records_count,
            header.base_offset,
            header.first_timestamp,
            map_end_offset,
            self._table,
            self.seed,
            now_ms,
            horizon_ms,
            scratch,
        )
        return tuple(int(v) for v in answer)  # type: ignore[return-value]


# The table's first size when keys arrive: 64k keys, 2 MiB (small logs never grow it further).
_MAP_KEYS_FIRST = 65_536


def _table(keys: int) -> np.ndarray:
    # Linear probing stays short while at most 3/4 of the slots are used. A slot is 24 bytes
    # (two hash halves and an offset): 32 a key with that slack, LOG_CLEANER_OFFSET_MAP_ENTRY_BYTES.
    # np.zeros maps fresh pages: only the slots written cost memory.
    return np.zeros((keys * 4 // 3 + 1, kernels.TABLE_COLUMNS), dtype=np.uint64)


def _digest_halves(digest: bytes) -> tuple[np.uint64, np.uint64]:
    if len(digest) != 16:
        raise InvariantViolation(f"offset map: a key hash is 16 bytes, got {len(digest)}")
    h1, h2 = struct.unpack("<QQ", digest)
    return np.uint64(h1), np.uint64(h2)


# ---- the throttle --------------------------------------------------------------------------


class Throttler:
    """Hold the cleaner's I/O to `bytes_per_second` (Kafka's Throttler) and its CPU to
    `cpu_share` of one core: sleep when ahead of either.

    The CPU budget is ours: Kafka's cleaner threads run beside the broker's on other cores, but
    here the cleaner shares a process, and often a small machine, with the broker's event loop;
    what it spends is taken from produce and fetch. `thread_cpu_s` is the cleaner thread's CPU
    clock (time.thread_time). `monotonic_ms`, `sleep_s` and `thread_cpu_s` are injected (the
    real ones in the broker, fakes in tests). 0 bytes_per_second or cpu_share: no limit
    (`between_batches` still yields). Used by the cleaner thread only.
    """

    def __init__(
        self,
        bytes_per_second: int,
        *,
        monotonic_ms: Callable[[], float],
        sleep_s: Callable[[float], None],
        check_interval_ms: int = limits.LOG_CLEANER_THROTTLE_CHECK_INTERVAL_MS,
        cpu_share: float = 0.0,
        thread_cpu_s: Callable[[], float] | None = None,
        thread_id: Callable[[], int] = lambda: 0,
        cpu_share_under_pressure: float | None = None,
        cpu_pressure: Callable[[], float | None] | None = None,
    ) -> None:
        self.bytes_per_second = bytes_per_second
        self.cpu_share = cpu_share
        # Under CPU contention (cpu_pressure(): the fraction of recent time runnable tasks
        # waited for a CPU, None when unknown) the share drops to cpu_share_under_pressure.
        self.cpu_share_under_pressure = cpu_share_under_pressure
        self._cpu_pressure = cpu_pressure
        self.pressured_checks = 0  # CPU-budget checks that found the machine contended
        self._monotonic_ms = monotonic_ms
        self._sleep_s = sleep_s
        self._thread_cpu_s = thread_cpu_s
        self._check_interval_ms = check_interval_ms
        self._period_start_ms = monotonic_ms()
        self._observed_bytes = 0
        self._thread_id = thread_id
        # The thread whose CPU clock the current period reads: a thread's clock means nothing
        # to another, so a call from a new thread starts a new period. The broker passes
        # threading.get_ident (this module stays pure: no threading here).
        self._cpu_thread: int | None = None
        self._cpu_period_start_ms = self._period_start_ms
        self._cpu_period_start_s = 0.0
        self.slept_s = 0.0
        self.cpu_slept_s = 0.0

    def between_batches(self) -> None:
        """Let other threads run: `sleep_s(0)` (the broker's releases the GIL); then hold the
        CPU budget.

        The cleaner thread's Python work between kernels holds the GIL; the event loop's thread,
        waiting behind it, would stall produce and fetch. Handing it over after every batch cut
        the loop's longest stall behind the offset-map thread from 12-27 ms to 2-3 ms on a busy
        2-core host (tests/unit/test_cleaner.py has the rule, bench/cleaner_bench.py the figure).
        """
        self._sleep_s(0)
        if self.cpu_share <= 0 or self._thread_cpu_s is None:
            return
        now_ms = self._monotonic_ms()
        thread = self._thread_id()
        if thread != self._cpu_thread:
            self._cpu_thread = thread
            self._cpu_period_start_ms = now_ms
            self._cpu_period_start_s = self._thread_cpu_s()
            return
        elapsed_ms = now_ms - self._cpu_period_start_ms
        if elapsed_ms < self._check_interval_ms:
            return
        cpu_s = self._thread_cpu_s() - self._cpu_period_start_s
        # Sleep until the CPU spent would be the allowed share of the time passed.
        sleep_s = cpu_s / self.current_cpu_share() - elapsed_ms / 1000.0
        if sleep_s > 0:
            self._sleep_s(sleep_s)
            self.cpu_slept_s += sleep_s
        self._cpu_period_start_ms = self._monotonic_ms()
        self._cpu_period_start_s = self._thread_cpu_s()

    def current_cpu_share(self) -> float:
        """cpu_share, or the lower cpu_share_under_pressure while the machine's CPUs are contended."""
        floor = self.cpu_share_under_pressure
        if floor is None or self._cpu_pressure is None or floor >= self.cpu_share:
            return self.cpu_share
        pressure = self._cpu_pressure()
        if pressure is None or pressure < limits.LOG_CLEANER_CPU_PRESSURE_THRESHOLD:
            return self.cpu_share
        self.pressured_checks += 1
        return max(floor, 1e-3)  # a floor of 0 would never finish a pass: keep a crawl

    def maybe_throttle(self, observed_bytes: int) -> None:
        """Account for `observed_bytes` of I/O; sleep if the rate since the last check is too high."""
        if self.bytes_per_second <= 0:
            return
        self._observed_bytes += observed_bytes
        now = self._monotonic_ms()
        elapsed_ms = now - self._period_start_ms
        if elapsed_ms < self._check_interval_ms:
            return
        rate = self._observed_bytes * 1000.0 / max(elapsed_ms, 1e-3)
        if rate > self.bytes_per_second:
            # Sleep until the bytes seen would have taken the allowed rate's time.
            sleep_s = self._observed_bytes / self.bytes_per_second - elapsed_ms / 1000.0
            if sleep_s > 0:
                self._sleep_s(sleep_s)
                self.slept_s += sleep_s
        self._period_start_ms = self._monotonic_ms()
        self._observed_bytes = 0


class CleaningAborted(Exception):
    """The broker is stopping: the pass gave up between two batches (its cleaned file is discarded)."""


# ---- reading segments ----------------------------------------------------------------------


def read_batches(
    storage: Storage,
    path: str,
    throttler: Throttler | None,
    chunk_bytes: int = limits.LOG_CLEANER_READ_CHUNK_BYTES,
    stop: Callable[[], bool] | None = None,
) -> Iterator[tuple[BatchHeader, memoryview]]:
    """Each batch of the segment file at `path`, checked (framing, CRC), with its bytes.

    Reads `chunk_bytes` at a time (a larger batch is read whole). A torn or corrupt batch raises
    CorruptMessage naming the file: the cleaner never cleans past damage (the log's recovery
    deals with it at the next start; the log is marked uncleanable meanwhile).
    """
    handle = storage.open(path, create=False)
    try:
        size = handle.size
        position = 0
        want = chunk_bytes
        while position < size:
            if stop is not None and stop():
                raise CleaningAborted(f"stopped while reading {path}")
            data = handle.read_at(position, min(want, size - position))
            want = chunk_bytes
            if throttler is not None:
                throttler.maybe_throttle(len(data))
            view = memoryview(data)
            offset_in_chunk = 0
            while len(data) - offset_in_chunk >= LOG_OVERHEAD:
                (batch_length,) = struct.unpack_from(">i", data, offset_in_chunk + 8)
                batch_size = batch_length + LOG_OVERHEAD
                if batch_size > len(data) - offset_in_chunk:
                    break
                try:
                    header = check_batch(
                        data, offset_in_chunk, max_batch_bytes=None, position_base=position, exact_count=False
                    )
                except CorruptMessage as error:
                    raise CorruptMessage(f"segment {path}: {error.message}") from error
                yield header, view[offset_in_chunk : offset_in_chunk + batch_size]
                if throttler is not None:
                    throttler.between_batches()
                if stop is not None and stop():
                    raise CleaningAborted(f"stopped while reading {path}")
                offset_in_chunk += batch_size
            if offset_in_chunk == 0:
                # The next batch is bigger than a chunk: read it whole (bounded by the file).
                if len(data) < LOG_OVERHEAD:
                    raise CorruptMessage(f"segment {path}: torn batch at byte {position}")
                (batch_length,) = struct.unpack_from(">i", data, 8)
                whole = batch_length + LOG_OVERHEAD
                if whole <= len(data) or position + whole > size or batch_length < 0:
                    raise CorruptMessage(
                        f"segment {path}: batch at byte {position} declares {whole} bytes, "
                        f"{size - position} remain in the file"
                    )
                want = whole
                continue
            position += offset_in_chunk
    finally:
        handle.close()


def records_section(header: BatchHeader, batch: memoryview) -> np.ndarray:
    """A data batch's records section, decompressed, as the kernels read it."""
    stored = np.frombuffer(batch, dtype=np.uint8, offset=BATCH_HEADER_SIZE)
    codec = header.compression
    if not codec:
        return stored
    try:
        return decompress_records(codec, stored, f"batch at offset {header.base_offset}")
    except HighwaterError as error:
        raise CorruptMessage(f"batch at offset {header.base_offset}: {error.message}") from error
    except MemoryError:
        raise
    except Exception as error:  # each codec has its own errors (zlib.error, cramjam's ...)
        raise CorruptMessage(
            f"batch at offset {header.base_offset}: its records do not decompress "
            f"({type(error).__name__}: {error})"
        ) from error


def _check_status(status: int, header: BatchHeader) -> None:
    """Raise for a kernel's error status: damage (CorruptMessage) or a broken rule."""
    if status == kernels.STATUS_OFFSET_NOT_INCREASING:
        raise InvariantViolation(
            f"offset map: batch at offset {header.base_offset} puts an offset at or below one "
            "already in the map; a pass reads forward"
        )
    if status < 0:
        raise CorruptMessage(
            f"batch at offset {header.base_offset}: {kernels.STATUS_MESSAGES.get(status, f'status {status}')}"
        )


# ---- aborted transactions ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class AbortedRanges:
    """The offset ranges of a log's aborted transactions by producer id (from its
    aborted-transaction index: first offset to the ABORT marker's offset), for the worker thread."""

    by_producer: Mapping[int, tuple[tuple[int, int], ...]] = field(default_factory=dict)

    @classmethod
    def of(cls, aborted: Iterable[AbortedTxn]) -> AbortedRanges:
        ranges: dict[int, list[tuple[int, int]]] = {}
        for txn in aborted:
            ranges.setdefault(txn.producer_id, []).append((txn.first_offset, txn.last_offset))
        return cls({pid: tuple(rs) for pid, rs in ranges.items()})

    def holds(self, header: BatchHeader) -> bool:
        """Whether the batch is data of an aborted transaction (never a marker)."""
        if not header.is_transactional or header.is_control:
            return False
        ranges = self.by_producer.get(header.producer_id, ())
        return any(first <= header.base_offset <= last for first, last in ranges)


NO_ABORTED = AbortedRanges()


# ---- pass step 2: the offset map -----------------------------------------------------------


@dataclass(slots=True)
class MapResult:
    """How far the map reaches: every key's latest offset in [start, end_offset) is in it."""

    end_offset: int
    full: bool
    bytes_read: int
    records: int


def build_offset_map(
    storage: Storage,
    segments: Sequence[CleanableSegment],
    offset_map: OffsetMap,
    *,
    start_offset: int,
    end_offset: int,
    throttler: Throttler | None,
    stop: Callable[[], bool] | None = None,
    aborted: AbortedRanges = NO_ABORTED,
) -> MapResult:
    """Fill `offset_map` from the records of `segments` in [start_offset, end_offset).

    Kafka's buildOffsetMap.

    Stops when a new key would overfill the map: the map then reaches the offset of the
    record it could not take (exclusive), and only the log below it is cleaned this pass.
    Control batches and keyless records hold no key and are skipped, and so are the batches of
    `aborted` transactions: their records are no key's latest value.
    """
    offset_map.release()  # a fresh, small table: it grows with the keys this range holds
    bytes_read = 0
    for segment in segments:
        if segment.end_offset <= start_offset or segment.base_offset >= end_offset:
            continue
        for header, batch in read_batches(storage, segment.path, throttler, stop=stop):
            bytes_read += header.size_bytes
            if header.next_offset <= start_offset or header.is_control or aborted.holds(header):
                continue
            if header.base_offset >= end_offset:
                return MapResult(end_offset, False, bytes_read, offset_map.records_put)
            status, value = offset_map.put_records(
                records_section(header, batch),
                header.records_count,
                header.base_offset,
                start_offset,
                end_offset,
            )
            if status == kernels.STATUS_REACHED_END:
                return MapResult(end_offset, False, bytes_read, offset_map.records_put)
            if status == kernels.STATUS_FULL:
                return MapResult(value, True, bytes_read, offset_map.records_put)
            _check_status(status, header)
    return MapResult(end_offset, False, bytes_read, offset_map.records_put)


# ---- pass step 4: filtering ----------------------------------------------------------------


@dataclass(slots=True)
class GroupResult:
    """What cleaning one group did."""

    bytes_read: int = 0
    bytes_written: int = 0
    records_kept: int = 0
    records_removed: int = 0
    tombstones_removed: int = 0
    batches_copied: int = 0
    batches_rewritten: int = 0
    batches_dropped: int = 0
    # The earliest delete horizon of a kept tombstone (-1: none kept): when a pass may remove more.
    earliest_delete_horizon_ms: int = -1

    def add(self, other: GroupResult) -> None:
        for name in (
            "bytes_read",
            "bytes_written",
            "records_kept",
            "records_removed",
            "tombstones_removed",
            "batches_copied",
            "batches_rewritten",
            "batches_dropped",
        ):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.earliest_delete_horizon_ms = _earliest(
            self.earliest_delete_horizon_ms, other.earliest_delete_horizon_ms
        )


def _earliest(a: int, b: int) -> int:
    if a < 0:
        return b
    if b < 0:
        return a
    return min(a, b)


@dataclass(frozen=True, slots=True)
class FilterContext:
    """What decides a record's fate in one pass."""

    offset_map: OffsetMap
    # Records at or past this offset are never removed (the map knows nothing of them).
    map_end_offset: int
    now_ms: int
    delete_retention_ms: int
    # Each producer id's last batch's last offset in the log (from the partition's producer
    # state, Kafka's lastRecordsOfActiveProducers): that batch is kept even if left empty.
    producer_last_offsets: Mapping[int, int]
    # The log's aborted transactions: their batches are removed whole.
    aborted: AbortedRanges = NO_ABORTED


def _emptied(header: BatchHeader, ctx: FilterContext, result: GroupResult) -> bytes | None:
    """A batch left with no record: dropped, or kept empty when it is its producer's last."""
    if (
        header.producer_id != NO_PRODUCER_ID
        and ctx.producer_last_offsets.get(header.producer_id) == header.last_offset
    ):
        result.batches_rewritten += 1
        return _empty_batch(header)
    result.batches_dropped += 1
    return None


def filter_batch(
    header: BatchHeader, batch: memoryview, ctx: FilterContext, result: GroupResult
) -> bytes | memoryview | None:
    """The batch as the cleaned segment holds it: the same bytes, a re-encoded copy, or None (dropped)."""
    if header.is_control:
        result.batches_copied += 1
        return batch
    if ctx.aborted.holds(header):
        result.records_removed += header.records_count
        return _emptied(header, ctx, result)
    has_horizon = bool(header.attributes & DELETE_HORIZON_MASK)
    horizon_ms = header.first_timestamp if has_horizon else -1
    section = records_section(header, batch)
    count = header.records_count
    scratch = np.empty((count, kernels.SCRATCH_COLUMNS), dtype=np.int64)
    # Past the map's end nothing is removed (Kafka's pastLatestOffset), tombstones included: a
    # tombstone is dropped only by a pass whose map covered it or a later one, and such a pass
    # removed every older record of its key (they all lie below it, in its range).
    status, removed, tombstones_removed, kept_tombstones, kept, first_kept_ms, max_kept_ms = (
        ctx.offset_map.filter_records(section, header, ctx.map_end_offset, ctx.now_ms, horizon_ms, scratch)
    )
    _check_status(status, header)
    result.records_kept += kept
    result.records_removed += removed
    result.tombstones_removed += tombstones_removed
    kept_tombstone = kept_tombstones > 0
    needs_horizon = kept_tombstone and not has_horizon
    horizon: int | None = None
    if kept_tombstone:
        horizon = horizon_ms if has_horizon else ctx.now_ms + ctx.delete_retention_ms
        result.earliest_delete_horizon_ms = _earliest(result.earliest_delete_horizon_ms, horizon)
    if removed == 0 and not needs_horizon:
        result.batches_copied += 1
        return batch
    if not kept:
        return _emptied(header, ctx, result)
    result.batches_rewritten += 1
    # The base timestamp is the delete horizon when there is one (attribute bit 6), else the
    # first kept record's; each record's delta moves so that its own timestamp stays.
    first_timestamp = horizon if horizon is not None else first_kept_ms
    out = np.empty(len(section) + count * _RECORD_GROWTH_BYTES_MAX, dtype=np.uint8)
    size = kernels.encode_kept(section, count, scratch, header.first_timestamp - first_timestamp, out)
    body = out[:size].tobytes()
    attributes = header.attributes & ~DELETE_HORIZON_MASK
    if horizon is not None:
        attributes |= DELETE_HORIZON_MASK
    max_timestamp = header.max_timestamp if header.attributes & TIMESTAMP_TYPE_LOG_APPEND else max_kept_ms
    codec = header.compression
    if codec:
        compress = _COMPRESSORS.get(codec)
        if compress is None:
            raise CorruptMessage(f"batch at offset {header.base_offset}: unknown compression codec {codec}")
        body = compress(body)
    return _batch_bytes(header, attributes, first_timestamp, max_timestamp, kept, body)


# A kept record re-encoded may grow: its timestamp delta's varint by up to 10 - 1 bytes and its
# length's by up to 5 - 1 (kernels.encode_kept's output bound).
_RECORD_GROWTH_BYTES_MAX = 15


def _empty_batch(header: BatchHeader) -> bytes:
    """Kafka's empty batch in `header`'s place: the header alone, uncompressed, both timestamps
    the batch's max timestamp, kept for its producer state (Kafka's MemoryRecords.filterTo)."""
    attributes = header.attributes & ~DELETE_HORIZON_MASK & ~COMPRESSION_MASK
    return _batch_bytes(header, attributes, header.max_timestamp, header.max_timestamp, 0, b"")


def _batch_bytes(
    header: BatchHeader, attributes: int, first_timestamp: int, max_timestamp: int, count: int, body: bytes
) -> bytes:
    """A batch of `count` records (`body`, encoded and compressed) in `header`'s place.

    Keeps the base offset, last offset delta, partition leader epoch and producer id/epoch/base
    sequence of `header` (Kafka's filterTo with overrideLastOffset): offsets never change.
    """
    after_crc = struct.pack(
        ">hiqqqhii",
        attributes,
        header.last_offset_delta,
        first_timestamp,
        max_timestamp,
        header.producer_id,
        header.producer_epoch,
        header.base_sequence,
        count,
    )
    batch_length = BATCH_HEADER_SIZE - LOG_OVERHEAD + len(body)
    out = bytearray(
        struct.pack(">qiib", header.base_offset, batch_length, header.partition_leader_epoch, MAGIC_V2)
        + b"\x00\x00\x00\x00"
        + after_crc
        + body
    )
    struct.pack_into(">I", out, CRC_POS, batch_crc(out, 0, len(out)))
    return bytes(out)


def clean_group(
    storage: Storage,
    group: Sequence[CleanableSegment],
    out_path: str,
    ctx: FilterContext,
    *,
    throttler: Throttler | None,
    stop: Callable[[], bool] | None = None,
) -> GroupResult:
    """Filter `group` into a new file at `out_path`, fsynced; return what was kept and removed.

    The file holds the kept batches in offset order (possibly none). An existing file at
    `out_path` (left by a pass that died) is replaced. Raises CorruptMessage for a damaged
    batch and StorageError when a file cannot be read or written; the caller deletes
    `out_path` then (`discard_cleaned`).
    """
    result = GroupResult()
    if storage.exists(out_path):
        storage.delete(out_path)
    out = storage.open(out_path, create=True)
    try:
        pending: list[bytes | memoryview] = []
        pending_bytes = 0
        for segment in group:
            for header, batch in read_batches(storage, segment.path, throttler, stop=stop):
                result.bytes_read += header.size_bytes
                kept = filter_batch(header, batch, ctx, result)
                if kept is None:
                    continue
                pending.append(kept)
                pending_bytes += len(kept)
                if pending_bytes >= limits.LOG_CLEANER_WRITE_CHUNK_BYTES:
                    _write(out, pending, pending_bytes, result, throttler)
                    pending, pending_bytes = [], 0
        if pending:
            _write(out, pending, pending_bytes, result, throttler)
        out.fsync()
    finally:
        out.close()
    return result


def _write(
    out: StorageFile,
    pending: list[bytes | memoryview],
    size: int,
    result: GroupResult,
    throttler: Throttler | None,
) -> None:
    out.append(b"".join(pending))
    result.bytes_written += size
    if throttler is not None:
        throttler.maybe_throttle(size)


def discard_cleaned(storage: Storage, out_path: str) -> None:
    """Delete a cleaned file that will not be swapped in (a failed or abandoned group)."""
    if storage.exists(out_path):
        storage.delete(out_path)


def attributes_of(batch: bytes | memoryview) -> int:
    """The attributes field of a batch's bytes (tests and tools)."""
    (attributes,) = struct.unpack_from(">h", batch, ATTRIBUTES_POS)
    return int(attributes)
