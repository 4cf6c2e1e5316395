"""The partition log: segments, offsets, recovery, retention and checkpoints of one partition.

DESIGN.md section 5. Offsets are half-open: the log holds [log_start_offset,
log_end_offset); the LEO is the next offset to be written. The broker never decodes
records: appends are checked and stamped per batch (clients/common/record_batch.py)
and reads return file bytes, whole batches only. One exception: ListOffsets by timestamp
decodes the one batch it lands on (offset_for_timestamp), because its answer is a record.

Invariants kept here (DESIGN.md section 8):
- offsets strictly increase: every batch starts at or after the previous batch's next
  offset, and segment i+1 starts at or after segment i's next offset. They are equal
  (contiguous) unless the log was compacted (issue 39): the cleaner removes records but
  never changes an offset, so a compacted log has holes. A read, fetch or locate at an
  offset in a hole answers from the first batch after it; a follower copies a leader's
  hole (append_as_follower takes a batch starting past its LEO); the leader's own appends
  stay contiguous (offsets assigned from the LEO). The LEO is the active segment's next
  offset: its last batch's, or its base while it is empty; so a truncation into a hole
  leaves it at most at the target;
- log_start_offset <= LEO, and neither goes down except through truncate_to /
  truncate_fully_and_start_at, which the replication layer calls deliberately;
- leader epochs never decrease along the log, and the leader epoch cache names, for
  every epoch present, the offset where it starts (a new entry is written to disk when
  the recovery point is about to pass it, so it becomes durable with the data it names;
  epoch_cache.py says why);
- nothing invalid reaches a segment: a batch is written only after its CRC and header
  checks pass, and recovery cuts whatever a crash left torn or corrupt.

Ownership: one Log belongs to the one task that owns its partition (STYLE.md practice
3). It holds no locks, reads no clock (now_ms is an argument) and does no asyncio; the
broker calls it from its event loop, never from another thread; it is not safe to
call from two threads at once. The exceptions are prepare_swap, discard_prepared and
PreparedSwap.close, which the cleaner calls from its thread: they read only what never
changes after construction (the directory, the storage), the immutable SegmentViews and
a config passed in, and touch only the cleaned segment's files and handles of their own
(never the OpenFileCache). All the logs of one Storage share its OpenFileCache (a read may
close another log's file), so they must all be called from one thread: the broker's event
loop.
Durability comes from replication; fsync happens on flush(), by the flush_messages /
flush_ms settings (off by default, as Kafka), after recovery, on truncation and on close().

Swapping in a cleaned segment (replace_segments; Kafka's .cleaned -> .swap protocol).
The cleaner (another thread) writes and fsyncs `B.cleaned.log` (cleaned_segment_path(B))
beside the old segments, which cover [B, E) (E: the next segment's base). The swap then:
  1. checks that the old segments are still as the cleaner saw them (SegmentsChanged if not);
  2. scans `B.cleaned.log` (CRC, offset order, every offset in [B, E)) and writes its
     indexes `B.cleaned.index` / `B.cleaned.timeindex`; fsyncs the three files;
  3. COMMIT: renames `B.cleaned.log` to `B.E.swap` (one rename, durable at once: the
     directory is fsynced). Before it the old segments are the log; after it the new one is;
  4. deletes the .log of every old segment (every base in [B, E)), then the indexes of
     those other than B;
  5. renames `B.cleaned.index` / `B.cleaned.timeindex` over `B.index` / `B.timeindex`;
  6. renames `B.E.swap` to `B.log`: the swap is done.
Step 2 (a scan of the whole file, two index files, three fsyncs: tens of ms) runs in
prepare_swap on the cleaner's thread, which touches only the `B.cleaned.*` files; steps 1 and
3-6 and the in-memory update run in commit_swap on the event loop, step 1 again there, since
retention, DeleteRecords or truncation may have run meanwhile (then the prepared files are
deleted). prepare_swap also opens the old segments' .log files and PreparedSwap holds them, so
that step 4's deletes only remove names on the loop and the kernel frees the blocks at the
handles' close, on the thread. replace_segments does both on the caller's thread.
Log.open first completes every swap whose `.swap` file exists (steps 4-6 again: each is
idempotent, and the name says exactly which segments it replaces: every one with a base in
[B, E), since the next segment started at E and nothing is written below it; the range
lives in the name so that the commit is one rename of an already durable file, with no
manifest to write and fsync, and recovery needs only the directory listing), then
deletes every `*.cleaned.*` file left (an uncommitted swap: the old segments are whole).
A crash at any step thus leaves either every old segment or the new one, never a mix.

Zero-copy readers across a swap: the log's own reads locate and read in one call on the
event loop, which is where swaps run, so nothing changes between them. A short-circuit
reader (read_location, clients/local_reads.py) opens the path later and checks the file's
device and inode against the location: after a swap the path names a new inode (the
cleaned file was created while the old one still existed, so it cannot reuse its number),
and the reader gets NotReadableHere and fetches the bytes instead; one that opened the old
file before it was deleted reads the old bytes, which were right for those offsets.
"""

from __future__ import annotations

import bisect
import logging
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from clients.common.errors import CorruptMessage, OffsetOutOfRange, StorageError, check
from clients.common.record_batch import (
    BATCH_HEADER_SIZE,
    BatchHeader,
    Buffer,
    assign_offsets,
    iter_batch_headers,
    peek_batch_extent,
    valid_prefix,
    validate_batches,
    with_assigned_offset,
)
from clients.common.records import decode_batches

from . import checkpoints
from .checkpoints import (
    ABORTED_TXN_INDEX,
    CLEAN_SHUTDOWN_MARKER,
    LEADER_EPOCH_CHECKPOINT,
    LOG_START_OFFSET_CHECKPOINT,
    PRODUCER_SNAPSHOT,
    RECOVERY_POINT_CHECKPOINT,
)
from .config import LogConfig
from .epoch_cache import LeaderEpochCache
from .index import OffsetIndex, TimeIndex
from .segment import (
    INDEX_SUFFIX,
    LOG_SUFFIX,
    NO_TIMESTAMP,
    RECOVERY_CHUNK_BYTES,
    RELATIVE_OFFSET_MAX,
    TIME_INDEX_SUFFIX,
    LogSegment,
    parse_segment_file_name,
    segment_file_name,
)
from .storage import TEMP_SUFFIX, Storage, StorageFile
from .txn_index import AbortedTxn, AbortedTxnIndex, UnreadableTxnIndex

logger = logging.getLogger("highwater.log")

# close_logs writes the new files of a batched close here, under the sync root (the broker's
# data directory), and renames them into the logs' directories. Not a partition directory:
# those are "{topic}-{partition number}".
CLOSE_STAGING_DIR = ".close-staging"

# A retention rule: (segment, base offset of the next segment) -> delete it?
_Breach = Callable[[LogSegment, int], bool]

# ListOffsets' special timestamps, as Kafka's.
LATEST_TIMESTAMP = -1
EARLIEST_TIMESTAMP = -2
MAX_TIMESTAMP = -3  # KIP-734: the record with the largest timestamp


@dataclass(frozen=True, slots=True)
class AppendInfo:
    """What an append wrote: offsets [first_offset, next_offset), headers as written (offsets assigned)."""

    first_offset: int
    last_offset: int
    next_offset: int
    max_timestamp_ms: int
    batch_count: int
    size_bytes: int
    headers: list[BatchHeader]


@dataclass(frozen=True, slots=True)
class FetchInfo:
    """Whole batches read from the log.

    `records` covers offsets [first_offset, next_offset); first_offset is the base offset
    of the first batch, which may lie below the fetch offset (a batch is never split).
    Empty records: first_offset == next_offset == the fetch offset.
    """

    records: bytes
    first_offset: int
    next_offset: int
    log_start_offset: int
    log_end_offset: int

    @property
    def is_empty(self) -> bool:
        return not self.records


@dataclass(frozen=True, slots=True)
class LocatedRecords:
    """Where the batches a read would return lie: `size` bytes from `position` of `path`.

    Covers offsets [first_offset, next_offset), whole batches, as FetchInfo.records would.
    """

    path: str
    position: int
    size: int
    first_offset: int
    next_offset: int
    log_start_offset: int
    log_end_offset: int


@dataclass(frozen=True, slots=True)
class RecoveryReport:
    """What opening the log did: for logs, metrics and tests."""

    clean_shutdown: bool
    segments_recovered: int
    bytes_scanned: int
    bytes_dropped: int
    segments_dropped: int
    reason: str


@dataclass(frozen=True, slots=True)
class SegmentView:
    """An inactive segment as the cleaner sees it (immutable data, safe to hand to its thread)."""

    base_offset: int
    # Its last batch's last offset + 1 (base_offset when empty).
    next_offset: int
    # The next segment's base offset: the end of the range of offsets it covers.
    end_offset: int
    # Its .log file: the cleaner reads it with storage.open(path, create=False).
    path: str
    size_bytes: int
    # The largest batch max_timestamp in it (-1 when empty).
    max_timestamp_ms: int


class SegmentsChanged(StorageError):  # type: ignore[misc, valid-type]  # a class built by _error
    """replace_segments was given segments the log no longer has as they were (retention,
    DeleteRecords or truncation ran meanwhile). Retriable: delete the cleaned file, clean again."""


# A cleaned segment's files before the swap: "{base}.cleaned.log" (the cleaner writes it)
# with ".cleaned.index" / ".cleaned.timeindex" (replace_segments writes them).
CLEANED_STEM_SUFFIX = ".cleaned"
# The committed swap: "{base}.{end}.swap", the cleaned .log renamed (the module docstring).
SWAP_SUFFIX = ".swap"


def swap_file_name(base_offset: int, end_offset: int) -> str:
    return f"{base_offset:020d}.{end_offset:020d}{SWAP_SUFFIX}"


def parse_swap_file_name(name: str) -> tuple[int, int] | None:
    """(base offset, end offset) of the segments a committed swap replaces; None for other names."""
    if not name.endswith(SWAP_SUFFIX):
        return None
    base, dot, end = name[: -len(SWAP_SUFFIX)].partition(".")
    if not dot or len(base) != 20 or len(end) != 20 or not base.isdigit() or not end.isdigit():
        return None
    return int(base), int(end)


class Log:
    """One partition's log. Create with `Log.open`."""

    def __init__(self, directory: str, config: LogConfig, storage: Storage) -> None:
        self._directory = directory
        self._config = config
        self._storage = storage
        self._segments: list[LogSegment] = []
        self._base_offsets: list[int] = []
        self._log_start_offset = 0
        # The log start offset as the checkpoint file holds it (every change is written at once).
        self._log_start_offset_on_disk: int | None = None
        self._recovery_point = 0
        self._unflushed_messages = 0
        self._last_flush_ms = 0
        self._closed = False
        # Set when a write failed: the log's files may not match its memory, so it refuses
        # further use until reopened (Kafka takes the log directory offline).
        self._offline_reason: str | None = None
        # A swap failed past its commit point: reads are refused too (_check_readable).
        self._swap_failed = False
        # The version line of the leader epoch checkpoint on disk (_checkpoint_version says why).
        self._epoch_file_version = checkpoints.CHECKPOINT_VERSION
        self._epoch_cache = LeaderEpochCache(
            [], log_end_offset=lambda: self.log_end_offset, persist=self._persist_epochs
        )
        self.recovery_report = RecoveryReport(True, 0, 0, 0, 0, "")
        # The partition's producer state snapshot as of the log end (services/broker/
        # producer_state.py), None when it has none to keep. Written just before the log start
        # moves forward (retention, DeleteRecords, a follower taking its leader's log start):
        # the batches it describes may be deleted next. And at a clean close, so the next open
        # replays no batch to rebuild the state.
        self.producer_snapshot: Callable[[], bytes | None] | None = None
        # Transactions aborted in this log (txn_index.py), as its ABORTED_TXN_INDEX file holds them.
        self._aborted = AbortedTxnIndex()

    # --- opening ----------------------------------------------------------------------

    @classmethod
    def open(
        cls,
        directory: str | Path,
        config: LogConfig,
        *,
        storage: Storage,
        now_ms: int,
        recover: bool = True,
    ) -> Log:
        """Open (creating if needed) the log in `directory`, recovering it after an unclean stop.

        Without the clean-shutdown marker, every segment from the one holding the recovery
        point on is scanned batch by batch (length, magic, CRC, offset contiguity, epoch
        order); the first unsound batch and everything after it is cut, and the number of
        bytes dropped is logged. With the marker (or recover=False, for tools), segments are
        trusted and only each one's tail after its last index entry is read.
        """
        log = cls(str(directory), config, storage)
        log._load(now_ms=now_ms, recover=recover)
        return log

    def _path(self, name: str) -> str:
        return os.path.join(self._directory, name)

    def _load(self, *, now_ms: int, recover: bool) -> None:
        storage = self._storage
        storage.mkdir(self._directory)
        self._finish_interrupted_swaps()
        names = storage.list_dir(self._directory)
        clean = CLEAN_SHUTDOWN_MARKER in names
        bases: list[int] = []
        for name in names:
            parsed = parse_segment_file_name(name)
            if name.endswith(TEMP_SUFFIX):
                storage.delete(self._path(name))
            elif parsed is not None and parsed[1] == LOG_SUFFIX:
                bases.append(parsed[0])
        bases.sort()
        for name in names:
            parsed = parse_segment_file_name(name)
            if (
                parsed is not None
                and parsed[1] in (INDEX_SUFFIX, TIME_INDEX_SUFFIX)
                and parsed[0] not in bases
            ):
                storage.delete(self._path(name))  # orphan index of a segment deleted before a crash

        log_start_checkpoint = checkpoints.read_offset(storage, self._path(LOG_START_OFFSET_CHECKPOINT))
        recovery_point = checkpoints.read_offset(storage, self._path(RECOVERY_POINT_CHECKPOINT)) or 0
        epoch_entries = (
            checkpoints.read_entries(storage, self._path(LEADER_EPOCH_CHECKPOINT), fields_per_entry=2) or []
        )
        self._epoch_file_version = (
            checkpoints.read_version(storage, self._path(LEADER_EPOCH_CHECKPOINT))
            or checkpoints.CHECKPOINT_VERSION
        )
        self._epoch_cache = LeaderEpochCache(
            [(epoch, start) for epoch, start in epoch_entries],
            log_end_offset=lambda: self.log_end_offset,
            persist=self._persist_epochs,
        )
        if not bases:
            bases = [log_start_checkpoint or 0]
        segments = [
            LogSegment(storage, self._directory, base, self._config, active=(i == len(bases) - 1))
            for i, base in enumerate(bases)
        ]

        trust_all = clean or not recover
        first_recovered = len(segments)
        if not trust_all:
            first_recovered = max(0, bisect.bisect_right(bases, recovery_point) - 1)
        kept: list[LogSegment] = []
        scanned = dropped = recovered_count = 0
        reason = ""
        latest_epoch: int | None = None
        # Holes are legal only in a log that is or was compacted (_checkpoint_version); in any
        # other a gap is damage, cut at as before compaction existed.
        holes_allowed = self._checkpoint_version == checkpoints.CHECKPOINT_VERSION_HOLES
        for i, segment in enumerate(segments):
            if kept and (
                segment.base_offset < kept[-1].next_offset
                or (not holes_allowed and segment.base_offset != kept[-1].next_offset)
            ):
                # Past it is a hole (a compacted log); before it, two segments overlap.
                reason = (
                    f"segment {segment.base_offset} starts before segment {kept[-1].base_offset} "
                    f"ends ({kept[-1].next_offset})"
                )
                break
            must_scan = i >= first_recovered or segment.index_suspect()
            if not must_scan:
                end = segment.load_tail()
                must_scan = end != segment.size_bytes
            if must_scan:
                if latest_epoch is None:
                    latest_epoch = self._epoch_cache.epoch_for_offset(segment.base_offset)
                result = segment.recover(latest_epoch=latest_epoch, holes_allowed=holes_allowed)
                recovered_count += 1
                scanned += result.valid_bytes + result.dropped_bytes
                for epoch, start_offset in result.epoch_starts:
                    if latest_epoch is None or epoch > latest_epoch:
                        latest_epoch = epoch
                    self._epoch_cache.assign(epoch, start_offset)
                if result.dropped_bytes:
                    dropped += result.dropped_bytes
                    reason = result.reason
                    kept.append(segment)
                    logger.warning(
                        "log %s: dropped %d bytes at byte %d of segment %d (%s)",
                        self._directory,
                        result.dropped_bytes,
                        result.valid_bytes,
                        segment.base_offset,
                        result.reason,
                    )
                    break
            kept.append(segment)
        segments_dropped = len(segments) - len(kept)
        for segment in reversed(segments[len(kept) :]):
            dropped += segment.size_bytes
            logger.warning(
                "log %s: dropped segment %d (%d bytes) after the damage (%s)",
                self._directory,
                segment.base_offset,
                segment.size_bytes,
                reason,
            )
            segment.delete_files()
        self._segments = kept
        self._base_offsets = [segment.base_offset for segment in kept]
        for segment in kept[:-1]:
            segment.make_inactive()
        kept[-1].make_active()
        if not dropped and recovery_point > self.log_end_offset:
            # A cleaned segment may end in a hole (its last records removed); when the segments
            # after it were lost unflushed, the log would end in that hole, below offsets that
            # were durable (the recovery point), and the next append would reuse committed
            # offsets (tests/sim/test_cleaner_sim.py, seed 2343). The log ends there at least.
            if self._segments[-1].is_empty:
                self._restart_empty_active_at(recovery_point)
            else:
                self.roll(now_ms, base_offset=recovery_point)

        leo = self.log_end_offset
        self._epoch_cache.truncate_from_end(leo)
        self._log_start_offset = max(log_start_checkpoint or 0, kept[0].base_offset)
        if self._log_start_offset > leo:
            logger.warning(
                "log %s: log start offset %d is past the end %d after recovery; starting empty at %d",
                self._directory,
                self._log_start_offset,
                leo,
                self._log_start_offset,
            )
            self.truncate_fully_and_start_at(self._log_start_offset)
        self._epoch_cache.truncate_from_start(self._log_start_offset)
        if log_start_checkpoint != self._log_start_offset:
            checkpoints.write_offset(storage, self._path(LOG_START_OFFSET_CHECKPOINT), self._log_start_offset)
        self._log_start_offset_on_disk = self._log_start_offset

        if recovered_count or dropped:
            # What recovery kept is exactly what is on disk: make it durable, then trust it.
            for segment in self._segments:
                segment.flush()
        # Epoch entries cover what lies below the recovery point before it moves there.
        self._epoch_cache.persist_if_dirty()
        self._mark_holes_possible()
        self._recovery_point = self.log_end_offset
        checkpoints.write_offset(storage, self._path(RECOVERY_POINT_CHECKPOINT), self._recovery_point)
        self._load_aborted_txns()
        if clean:
            # From here on a crash is an unclean stop again.
            storage.delete(self._path(CLEAN_SHUTDOWN_MARKER))
        self._last_flush_ms = now_ms
        self.recovery_report = RecoveryReport(
            clean, recovered_count, scanned, dropped, segments_dropped, reason
        )
        if scanned and not clean:
            logger.info(
                "log %s: recovered %d segment(s), scanned %d bytes, dropped %d bytes; offsets [%d, %d)",
                self._directory,
                recovered_count,
                scanned,
                dropped,
                self._log_start_offset,
                self.log_end_offset,
            )

    # --- state ------------------------------------------------------------------------

    @property
    def directory(self) -> str:
        return self._directory

    @property
    def config(self) -> LogConfig:
        return self._config

    def set_config(self, config: LogConfig) -> None:
        """Take a topic's changed config (AlterConfigs): the next append, roll and retention pass
        use it. Segments keep a reference to the config, so each is given the new one; records
        already written stay as they are (a lower max.message.bytes refuses only new batches)."""
        self._config = config
        for segment in self._segments:
            segment.config = config
        self._mark_holes_possible()

    @property
    def log_start_offset(self) -> int:
        """First readable offset: fetches below it are OffsetOutOfRange."""
        return self._log_start_offset

    @property
    def log_end_offset(self) -> int:
        """LEO: the next offset to be written."""
        return self._segments[-1].next_offset

    @property
    def size_bytes(self) -> int:
        return sum(segment.size_bytes for segment in self._segments)

    @property
    def recovery_point(self) -> int:
        """Offsets below this were fsynced; recovery scans from the segment holding it."""
        return self._recovery_point

    @property
    def leader_epoch_cache(self) -> LeaderEpochCache:
        return self._epoch_cache

    @property
    def segment_base_offsets(self) -> list[int]:
        return list(self._base_offsets)

    @property
    def _active(self) -> LogSegment:
        return self._segments[-1]

    def _check_readable(self) -> None:
        """Reads go on while the log is offline after a failed write (the files hold what memory
        says, up to the failed write), but not after a swap failed past its commit point: the
        replaced segments' files are closed or gone, and only the next open completes the swap."""
        check(not self._closed, "log %s is closed", self._directory)
        if self._swap_failed:
            raise StorageError(
                f"log {self._directory} is offline: {self._offline_reason}; restart the broker, "
                "whose open of the log completes the swap"
            )

    def _ensure_usable(self) -> None:
        check(not self._closed, "log %s is closed", self._directory)
        if self._offline_reason is not None:
            raise StorageError(
                f"log {self._directory} is offline after a failed write: {self._offline_reason}"
            )

    # --- appending --------------------------------------------------------------------

    def append_as_leader(
        self, records: Buffer, *, leader_epoch: int, now_ms: int, validated: list[BatchHeader] | None = None
    ) -> AppendInfo:
        """Validate, assign offsets from the LEO, stamp `leader_epoch`, and write.

        Raises CorruptMessage / MessageTooLarge (nothing is written) for a bad batch.
        `validated`: the headers validate_batches already returned for these exact bytes
        (the partition checks them first for idempotence), so the CRC is not computed twice.
        The caller (the partition, as leader in `leader_epoch`) has fenced stale epochs;
        an epoch below the latest one in the log is a bug.
        """
        self._ensure_usable()
        headers = (
            validated
            if validated is not None
            else validate_batches(records, max_batch_bytes=self._config.max_message_bytes)
        )
        latest_epoch = self._epoch_cache.latest_epoch()
        check(
            leader_epoch >= 0 and (latest_epoch is None or leader_epoch >= latest_epoch),
            "log %s: leader append in epoch %d, but the log already holds epoch %s",
            self._directory,
            leader_epoch,
            latest_epoch,
        )
        buf = bytearray(records)
        first_offset = self.log_end_offset
        next_offset = assign_offsets(buf, headers, first_offset, leader_epoch)
        assigned: list[BatchHeader] = []
        offset = first_offset
        for header in headers:
            assigned.append(with_assigned_offset(header, offset, leader_epoch))
            offset += header.last_offset_delta + 1
        check(offset == next_offset, "assign_offsets ended at %d, headers at %d", next_offset, offset)
        if latest_epoch != leader_epoch:
            self._epoch_cache.assign(leader_epoch, first_offset)
        return self._write(buf, assigned, now_ms)

    def append_as_follower(self, records: Buffer, *, now_ms: int) -> AppendInfo:
        """Write batches whose offsets and epochs the leader assigned, after checking them.

        Raises CorruptMessage for a bad batch (nothing is written). The fetcher has checked
        that the batches continue this log. A batch may start past the previous one's next
        offset (the LEO for the first): the leader's log is compacted and has a hole there
        (Kafka's appendAsFollower checks only that offsets increase). A batch starting
        before it, or a falling leader epoch, is an InvariantViolation here (the last line
        of defence).
        """
        self._ensure_usable()
        # A cleaned batch holds fewer records than its offset range (the cleaner keeps its last offset).
        headers = validate_batches(records, max_batch_bytes=None, exact_count=False)
        expected = self.log_end_offset
        latest_epoch = self._epoch_cache.latest_epoch()
        new_epochs: list[tuple[int, int]] = []
        for header in headers:
            check(
                header.base_offset >= expected,
                "log %s: follower append of a batch at offset %d, expected at least %d (LEO %d)",
                self._directory,
                header.base_offset,
                expected,
                self.log_end_offset,
            )
            epoch = header.partition_leader_epoch
            check(
                latest_epoch is None or epoch >= latest_epoch,
                "log %s: follower batch at offset %d has leader epoch %d below %s",
                self._directory,
                header.base_offset,
                epoch,
                latest_epoch,
            )
            if epoch >= 0 and epoch != latest_epoch:
                new_epochs.append((epoch, header.base_offset))
                latest_epoch = epoch
            expected = header.next_offset
        for epoch, start_offset in new_epochs:
            self._epoch_cache.assign(epoch, start_offset)
        return self._write(records, headers, now_ms)

    def _write(self, buf: Buffer, headers: list[BatchHeader], now_ms: int) -> AppendInfo:
        """Write batches (offsets increasing), rolling to a new segment whenever the next group
        does not fit. A new segment starts at the base offset of the batch it is rolled for."""
        segment_bytes = self._config.segment_bytes
        count = len(headers)
        first = 0
        try:
            while first < count:
                active = self._active
                room = segment_bytes - active.size_bytes
                end = first
                group_bytes = 0
                # A group also spans at most the index's int32 relative offsets (a hole may be wide).
                span_end = headers[first].base_offset + RELATIVE_OFFSET_MAX
                while (
                    end < count
                    and group_bytes + headers[end].size_bytes <= room
                    and headers[end].last_offset <= span_end
                ):
                    group_bytes += headers[end].size_bytes
                    end += 1
                if end == first:
                    if not active.is_empty:
                        self.roll(now_ms, base_offset=headers[first].base_offset)
                        continue
                    end = first + 1  # a batch bigger than a segment gets an empty segment of its own
                    group_bytes = headers[first].size_bytes
                if (
                    active.is_empty
                    and headers[end - 1].last_offset - active.base_offset > RELATIVE_OFFSET_MAX
                ):
                    self._restart_empty_active_at(headers[first].base_offset)
                    continue
                if active.should_roll(group_bytes, headers[end - 1].last_offset, now_ms):
                    self.roll(now_ms, base_offset=headers[first].base_offset)
                    continue
                active.append(buf, headers[first:end], now_ms)
                first = end
        except StorageError as error:
            self._offline_reason = str(error)
            logger.error("log %s: write failed, log offline: %s", self._directory, error)
            raise
        first_offset = headers[0].base_offset
        next_offset = headers[-1].next_offset
        # Records, not offsets: a follower's batches may span holes.
        self._unflushed_messages += sum(header.records_count for header in headers)
        flush_messages = self._config.flush_messages
        if flush_messages is not None and self._unflushed_messages >= flush_messages:
            self.flush(now_ms)
        else:
            self.maybe_flush(now_ms)
        return AppendInfo(
            first_offset=first_offset,
            last_offset=next_offset - 1,
            next_offset=next_offset,
            max_timestamp_ms=max(header.max_timestamp for header in headers),
            batch_count=count,
            size_bytes=headers[-1].end_position - headers[0].position,
            headers=headers,
        )

    # --- segments ---------------------------------------------------------------------

    def roll(self, now_ms: int, *, base_offset: int | None = None) -> None:
        """Start a new active segment at `base_offset`, default the LEO (no-op when the active
        segment is empty). A follower rolls at the batch it writes next, which may start past
        the LEO (a compacted leader's hole): relative offsets in the new segment stay small."""
        self._ensure_usable()
        active = self._active
        if active.is_empty:
            return
        if base_offset is None:
            base_offset = active.next_offset
        check(
            base_offset >= active.next_offset,
            "log %s: roll to a segment at %d, below the LEO %d",
            self._directory,
            base_offset,
            active.next_offset,
        )
        segment = LogSegment(self._storage, self._directory, base_offset, self._config, active=True)
        segment.next_offset = base_offset
        active.make_inactive()
        self._segments.append(segment)
        self._base_offsets.append(base_offset)
        logger.debug("log %s: rolled to segment %d at %d ms", self._directory, base_offset, now_ms)

    def _restart_empty_active_at(self, base_offset: int) -> None:
        """Replace the empty active segment by one at `base_offset`: a follower's next batch lies
        past a hole wider than the index's relative offsets can span from the empty one's base."""
        empty = self._active
        check(
            empty.is_empty and base_offset > empty.base_offset,
            "log %s: restart of the active segment %d at %d",
            self._directory,
            empty.base_offset,
            base_offset,
        )
        if len(self._segments) == 1 and self._log_start_offset < base_offset:
            # Nothing lies below it: the log starts there (as after truncate_fully_and_start_at).
            self._set_log_start_offset(base_offset)
        segment = LogSegment(self._storage, self._directory, base_offset, self._config, active=True)
        empty.delete_files()
        self._segments[-1] = segment
        self._base_offsets[-1] = base_offset

    def maybe_roll(self, now_ms: int) -> bool:
        """Roll when the active segment is older than segment_ms, or than max_compaction_lag_ms
        on a compacted log (LogConfig.max_segment_ms); called by a periodic task."""
        active = self._active
        if active.should_roll(0, max(active.base_offset, self.log_end_offset - 1), now_ms):
            self.roll(now_ms)
            return True
        return False

    # --- the producer state snapshot (its bytes; services/broker/producer_state.py reads them) --

    def _write_producer_snapshot(self) -> None:
        data = self.producer_snapshot() if self.producer_snapshot is not None else None
        if data is not None:
            self.write_producer_snapshot(data)

    def write_producer_snapshot(self, data: bytes) -> None:
        self._ensure_usable()
        self._storage.write_atomic(self._path(PRODUCER_SNAPSHOT), data)

    def read_producer_snapshot(self) -> bytes | None:
        path = self._path(PRODUCER_SNAPSHOT)
        return self._storage.read_file(path) if self._storage.exists(path) else None

    # --- aborted transactions (txn_index.py) --------------------------------------------

    def _load_aborted_txns(self) -> None:
        """Read the index, without what recovery cut off or retention passed. An unreadable
        one is rebuilt: the producer state snapshot goes too, so the partition's rebuild
        replays every batch of the log and meets every ABORT marker still in it again."""
        path = self._path(ABORTED_TXN_INDEX)
        if not self._storage.exists(path):
            return
        try:
            self._aborted = AbortedTxnIndex.decode(self._storage.read_file(path))
        except UnreadableTxnIndex as exc:
            logger.warning(
                "log %s: aborted transaction index: %s; rebuilding it from the log", self._directory, exc
            )
            self._storage.delete(path)
            if self._storage.exists(self._path(PRODUCER_SNAPSHOT)):
                self._storage.delete(self._path(PRODUCER_SNAPSHOT))
            return
        cut = self._aborted.truncate_from(self.log_end_offset)
        if self._aborted.drop_below(self._log_start_offset) or cut:
            self._write_aborted_txns()

    def _write_aborted_txns(self) -> None:
        path = self._path(ABORTED_TXN_INDEX)
        if len(self._aborted):
            self._storage.write_atomic(path, self._aborted.encode())
        elif self._storage.exists(path):
            self._storage.delete(path)

    def append_aborted_txn(self, entry: AbortedTxn) -> None:
        """Record a transaction an ABORT marker in this log ended (written before returning)."""
        self._ensure_usable()
        check(
            entry.last_offset < self.log_end_offset,
            "log %s: aborted transaction %s ends past the log end %d",
            self._directory,
            entry,
            self.log_end_offset,
        )
        if self._aborted.append(entry):
            self._write_aborted_txns()

    def aborted_txns(self, fetch_offset: int, upper_bound_offset: int) -> list[AbortedTxn]:
        """The aborted transactions overlapping [fetch_offset, upper_bound_offset)."""
        return self._aborted.collect(fetch_offset, upper_bound_offset)

    # --- compaction: the cleaner's view of the segments, and the swap -----------------
    # The module docstring has the swap's steps and its commit point.

    @property
    def storage(self) -> Storage:
        """The storage the log lives on: the cleaner reads old segments and writes cleaned ones there."""
        return self._storage

    def segments_for_cleaning(self) -> list[SegmentView]:
        """Every segment but the active one, oldest first."""
        self._check_readable()
        return [self._view(i) for i in range(len(self._segments) - 1)]

    def _view(self, index: int) -> SegmentView:
        segment = self._segments[index]
        return SegmentView(
            base_offset=segment.base_offset,
            next_offset=segment.next_offset,
            end_offset=self._base_offsets[index + 1],
            path=segment.log_path,
            size_bytes=segment.size_bytes,
            max_timestamp_ms=segment.max_timestamp_ms,
        )

    def cleaned_segment_path(self, base_offset: int) -> str:
        """Where the cleaner writes the cleaned segment replacing those from `base_offset` on."""
        return self._path(segment_file_name(base_offset, CLEANED_STEM_SUFFIX + LOG_SUFFIX))

    def replace_segments(self, old: Sequence[SegmentView], now_ms: int) -> None:
        """Swap the cleaned file at cleaned_segment_path(old[0].base_offset) in for the segments `old`.

        `old`: a run of adjacent inactive segments, as segments_for_cleaning gave them. The
        cleaner has written and fsynced the cleaned file: batches in increasing offset
        order, every offset within [old[0].base_offset, old[-1].end_offset), holes allowed.
        The new segment has the same base offset and covers the same range; every record it
        holds reads back at its offset. Crash-safe at every step (the module docstring).

        prepare_swap then commit_swap in one call, all on the caller's thread (tests, tools; the
        cleaner splits them: the scan and the index writes off the loop). Raises SegmentsChanged
        (nothing done, the cleaned file left to the caller) when `old` no longer matches the
        log, and CorruptMessage (the cleaned files deleted, nothing else done) when the cleaned
        file does not hold sound batches within the range. A storage failure after the commit
        point takes the log offline: its next open completes the swap.
        """
        self._ensure_usable()
        check(bool(old), "log %s: replace_segments of no segment", self._directory)
        self._matching_run(old)
        prepared = self.prepare_swap(old, self._config)
        try:
            self.commit_swap(prepared, now_ms)
        finally:
            prepared.close()

    def prepare_swap(self, old: Sequence[SegmentView], config: LogConfig) -> PreparedSwap:
        """Step 2 of the swap, callable from the cleaner's thread: check the cleaned file at
        cleaned_segment_path(old[0].base_offset) (CRC, offset order, every offset within
        [old[0].base_offset, old[-1].end_offset)), write its indexes `*.cleaned.index` /
        `*.cleaned.timeindex` and fsync the three. commit_swap (on the loop) swaps it in.

        Thread rules: this reads only the log's directory and storage (fixed at construction),
        the views `old` (immutable) and `config` (the log's config, read by the caller on the
        loop: its index settings are used), and touches only the cleaned segment's own
        files, opened directly on the storage (not through the shared OpenFileCache, which
        belongs to the loop). A crash here leaves only `*.cleaned.*` files: the old segments
        are whole and the next open deletes them.

        Raises CorruptMessage (the cleaned files deleted) when the cleaned file is not sound
        batches within the range; StorageError when it is missing or a write fails (the
        caller deletes what is left; the next open does too).
        """
        check(bool(old), "log %s: prepare_swap of no segment", self._directory)
        base, end = old[0].base_offset, old[-1].end_offset
        storage = self._storage
        stem = segment_file_name(base, CLEANED_STEM_SUFFIX)
        log_path = self.cleaned_segment_path(base)
        for suffix in (INDEX_SUFFIX, TIME_INDEX_SUFFIX):
            storage.delete(self._path(stem + suffix))  # an earlier attempt's
        if not storage.exists(log_path):
            raise StorageError(
                f"log {self._directory}: no cleaned segment at {log_path}; "
                "the cleaner writes it before the swap"
            )
        if end - 1 - base > RELATIVE_OFFSET_MAX:
            problem = f"its range [{base}, {end}) is too long for the index's int32 relative offsets"
            scan = _CleanedScan(0, base, problem)
        else:
            try:
                scan = _scan_cleaned(storage, log_path, self._path(stem), base, end, config)
            except BaseException:
                self._delete_cleaned(stem)
                raise
        if scan.problem:
            self._delete_cleaned(stem)
            raise CorruptMessage(
                f"log {self._directory}: the cleaned segment for [{base}, {end}) is refused and deleted: "
                f"{scan.problem}. The old segments stay; this is a cleaner bug or a disk fault"
            )
        return PreparedSwap(tuple(old), base, end, scan.size_bytes, scan.next_offset, _hold(storage, old))

    def discard_prepared(self, prepared: PreparedSwap) -> None:
        """Delete a prepared swap's files (it will not be committed) and close what it holds.
        Thread-safe as prepare_swap."""
        prepared.close()
        self._delete_cleaned(segment_file_name(prepared.base_offset, CLEANED_STEM_SUFFIX))

    def commit_swap(self, prepared: PreparedSwap, now_ms: int) -> None:
        """Steps 3-6 of the swap on the loop: the commit rename, the old segments' deletes, the
        renames, the in-memory update. Raises SegmentsChanged, with the prepared files deleted,
        when the segments prepare_swap saw are no longer the log's (retention, DeleteRecords or
        truncation ran meanwhile). A storage failure after the commit point takes the log
        offline: its next open completes the swap."""
        self._ensure_usable()
        old, base, end = prepared.old, prepared.base_offset, prepared.end_offset
        try:
            first = self._matching_run(old)
        except SegmentsChanged:
            self.discard_prepared(prepared)
            raise
        storage = self._storage
        try:
            # 3. The commit point: from here on, the new segment is the log.
            storage.rename(self.cleaned_segment_path(base), self._path(swap_file_name(base, end)))
            replaced = self._segments[first : first + len(old)]
            for segment in replaced:
                segment.close()
            self._swap_in(base, end)  # 4-6
            # Inactive: its index stays on disk (prepare_swap wrote it); load_tail reads the
            # last entries and the bytes after the last offset entry only (at most about
            # index_interval_bytes and a batch), so this costs no scan of the file.
            segment = LogSegment(storage, self._directory, base, self._config, active=False)
            tail = segment.load_tail()
        except (StorageError, OSError) as error:
            self._offline_reason = f"swap of cleaned segment {base} failed: {error}"
            self._swap_failed = True
            logger.error(
                "log %s: %s; the log is offline, its next open completes the swap",
                self._directory,
                self._offline_reason,
            )
            raise StorageError(f"log {self._directory}: {self._offline_reason}") from error
        if (
            tail != prepared.size_bytes
            or segment.size_bytes != prepared.size_bytes
            or segment.next_offset != prepared.next_offset
        ):
            self._offline_reason = f"swapped-in segment {base} does not read back as scanned"
            self._swap_failed = True
        check(
            tail == prepared.size_bytes == segment.size_bytes and segment.next_offset == prepared.next_offset,
            "log %s: swapped-in segment %d reads %d of %d bytes up to offset %d; the scan found %d "
            "bytes up to offset %d",
            self._directory,
            base,
            tail,
            segment.size_bytes,
            segment.next_offset,
            prepared.size_bytes,
            prepared.next_offset,
        )
        self._segments[first : first + len(old)] = [segment]
        self._base_offsets[first : first + len(old)] = [base]
        logger.info(
            "log %s: swapped cleaned segment %d in for %d segment(s) [%d, %d): %d -> %d bytes at %d ms",
            self._directory,
            base,
            len(old),
            base,
            end,
            sum(view.size_bytes for view in old),
            segment.size_bytes,
            now_ms,
        )

    def _matching_run(self, old: Sequence[SegmentView]) -> int:
        """Index of old[0] among the segments if `old` is still a run of inactive segments as they
        were seen; else SegmentsChanged."""
        first = bisect.bisect_left(self._base_offsets, old[0].base_offset)
        if first + len(old) < len(self._segments) and all(
            self._view(first + i) == view for i, view in enumerate(old)
        ):
            return first
        raise SegmentsChanged(
            f"log {self._directory}: segments [{old[0].base_offset}, {old[-1].end_offset}) changed "
            "since the cleaner read them (retention, DeleteRecords or truncation ran meanwhile, or "
            "one became active); delete the cleaned file and clean them again"
        )

    def _delete_cleaned(self, stem: str) -> None:
        """Best effort: what is left is deleted by the next open (an uncommitted swap's files)."""
        try:
            for suffix in (LOG_SUFFIX, INDEX_SUFFIX, TIME_INDEX_SUFFIX):
                self._storage.delete(self._path(stem + suffix))
        except (StorageError, OSError) as error:
            logger.warning("log %s: cannot delete the cleaned segment %s (%s)", self._directory, stem, error)

    def _swap_in(self, base: int, end: int) -> None:
        """Steps 4-6 of the swap of `{base}.{end}.swap`: each idempotent, so recovery repeats them all."""
        storage = self._storage
        replaced: list[tuple[int, str, str]] = []
        for name in storage.list_dir(self._directory):
            parsed = parse_segment_file_name(name)
            if parsed is not None and base <= parsed[0] < end:
                replaced.append((parsed[0], parsed[1], name))
        for _, suffix, name in replaced:
            if suffix == LOG_SUFFIX:
                storage.delete(self._path(name))
        for segment_base, suffix, name in replaced:
            if suffix in (INDEX_SUFFIX, TIME_INDEX_SUFFIX) and segment_base != base:
                storage.delete(self._path(name))
        stem = segment_file_name(base, CLEANED_STEM_SUFFIX)
        for suffix in (INDEX_SUFFIX, TIME_INDEX_SUFFIX):
            cleaned_index = self._path(stem + suffix)
            if storage.exists(cleaned_index):
                storage.rename(cleaned_index, self._path(segment_file_name(base, suffix)))
        storage.rename(self._path(swap_file_name(base, end)), self._path(segment_file_name(base, LOG_SUFFIX)))

    def _finish_interrupted_swaps(self) -> None:
        """On open: complete every committed swap, then delete what uncommitted ones left."""
        storage = self._storage
        for name in storage.list_dir(self._directory):
            swap = parse_swap_file_name(name)
            if swap is not None:
                logger.warning(
                    "log %s: completing the interrupted swap of the cleaned segment for offsets [%d, %d)",
                    self._directory,
                    *swap,
                )
                self._swap_in(*swap)
        for name in storage.list_dir(self._directory):
            parsed = parse_segment_file_name(name)
            if parsed is not None and parsed[1].startswith(CLEANED_STEM_SUFFIX + "."):
                storage.delete(self._path(name))  # an uncommitted swap: the old segments are whole

    # --- reading ----------------------------------------------------------------------

    def read(
        self,
        fetch_offset: int,
        *,
        max_bytes: int,
        max_offset: int | None = None,
        min_one_message: bool = True,
    ) -> FetchInfo:
        """Whole batches from the one holding `fetch_offset`, within max_bytes and below max_offset.

        `max_offset` is exclusive (the HW for consumers): a batch is returned only if all its
        offsets are below it. At least one batch is returned when min_one_message, even if it
        is bigger than max_bytes. Reads at most one segment, and only the bytes it returns
        plus one short header scan after an index lookup. Raises OffsetOutOfRange when
        fetch_offset is outside [log_start_offset, LEO].
        """
        start = self._first_readable_batch(fetch_offset, max_bytes, max_offset, min_one_message)
        if start is None:
            return FetchInfo(b"", fetch_offset, fetch_offset, self._log_start_offset, self.log_end_offset)
        segment, first, upper = start
        chunk = segment.read(first.position, max(max_bytes, first.size_bytes))
        cut = first.size_bytes
        next_offset = first.next_offset
        for header in iter_batch_headers(chunk, first.size_bytes):
            if header.last_offset >= upper:
                break
            cut = header.end_position
            next_offset = header.next_offset
        records = chunk if cut == len(chunk) else chunk[:cut]
        return FetchInfo(records, first.base_offset, next_offset, self._log_start_offset, self.log_end_offset)

    def read_location(
        self,
        fetch_offset: int,
        *,
        max_bytes: int,
        max_offset: int | None = None,
        min_one_message: bool = True,
    ) -> LocatedRecords | None:
        """Where the bytes `read` would return lie in a segment file, without reading them.

        For short-circuit local reads (a consumer on this host preads the file itself).
        Same rules and errors as `read`; None where `read` would return no records. Only
        batch headers are read, to find the cut.
        """
        start = self._first_readable_batch(fetch_offset, max_bytes, max_offset, min_one_message)
        if start is None:
            return None
        segment, first, upper = start
        end_position = first.end_position
        next_offset = first.next_offset
        limit = first.position + max(max_bytes, first.size_bytes)
        for header in segment.iter_headers(end_position, min(limit, segment.size_bytes)):
            if header.last_offset >= upper:
                break
            end_position = header.end_position
            next_offset = header.next_offset
        return LocatedRecords(
            segment.log_path,
            first.position,
            end_position - first.position,
            first.base_offset,
            next_offset,
            self._log_start_offset,
            self.log_end_offset,
        )

    def _first_readable_batch(
        self, fetch_offset: int, max_bytes: int, max_offset: int | None, min_one_message: bool
    ) -> tuple[LogSegment, BatchHeader, int] | None:
        """(segment, header of the batch holding fetch_offset, exclusive upper offset), or None."""
        self._check_readable()
        log_start = self._log_start_offset
        leo = self.log_end_offset
        if fetch_offset < log_start or fetch_offset > leo:
            raise OffsetOutOfRange(
                f"fetch offset {fetch_offset} is outside the log's range [{log_start}, {leo}]"
            )
        upper = leo if max_offset is None else min(max_offset, leo)
        if fetch_offset >= upper:
            return None
        index = bisect.bisect_right(self._base_offsets, fetch_offset) - 1
        check(
            index >= 0,
            "log %s: offset %d lies before the first segment %d",
            self._directory,
            fetch_offset,
            self._base_offsets[0],
        )
        while index < len(self._segments):
            segment = self._segments[index]
            first = segment.find_batch(fetch_offset)
            if first is None:
                index += 1
                continue
            if first.last_offset >= upper or (first.size_bytes > max_bytes and not min_one_message):
                return None
            return segment, first, upper
        return None

    def locate(self, offset: int) -> tuple[int, int, int] | None:
        """(segment base offset, byte position, batch base offset) of the batch holding `offset`.

        The index lookup plus short scan that a read starts with; None outside the log.
        For tools and benchmarks.
        """
        self._check_readable()
        if not self._log_start_offset <= offset < self.log_end_offset:
            return None
        index = bisect.bisect_right(self._base_offsets, offset) - 1
        while 0 <= index < len(self._segments):
            header = self._segments[index].find_batch(offset)
            if header is not None:
                return self._base_offsets[index], header.position, header.base_offset
            index += 1
        return None

    def batch_headers(self, start_offset: int | None = None) -> Iterator[BatchHeader]:
        """Headers of every batch from the one holding `start_offset` (default: the log start) to the LEO.

        Reads headers only (no records, no CRC): for rebuilding producer state (idempotence,
        DESIGN.md invariant 8) after open. Positions are within each batch's segment.
        The log must not change while the iterator is in use.
        """
        self._check_readable()
        offset = self._log_start_offset if start_offset is None else start_offset
        index = max(0, bisect.bisect_right(self._base_offsets, offset) - 1)
        for segment in self._segments[index:]:
            first = segment.find_batch(offset) if segment.base_offset < offset else None
            position = first.position if first is not None else 0
            if segment.base_offset < offset and first is None:
                continue
            yield from segment.iter_headers(position)

    def offset_for_timestamp(self, timestamp_ms: int) -> tuple[int, int] | None:
        """(offset, timestamp) of the first record with timestamp >= timestamp_ms, else None.

        Kafka's LogSegment.findOffsetByTimestamp: the time index and batch headers find the
        first batch whose max_timestamp reaches timestamp_ms, then that batch's records are
        decoded for the first one that does (a batch's records need not be in time order, and
        one at or after the log start may lie past a batch the log start cuts). The answer is
        that record's offset and its own timestamp, never a batch's.

        LATEST_TIMESTAMP (-1) gives (LEO, -1) and EARLIEST_TIMESTAMP (-2) gives
        (log_start_offset, -1); MAX_TIMESTAMP (-3) gives the first record holding the largest
        timestamp (KIP-734). Other negative timestamps are a caller's error. The offset is
        never below the log start. Raises CorruptMessage if the found batch does not decode.
        """
        self._check_readable()
        if timestamp_ms == LATEST_TIMESTAMP:
            return self.log_end_offset, -1
        if timestamp_ms == EARLIEST_TIMESTAMP:
            return self._log_start_offset, -1
        if timestamp_ms == MAX_TIMESTAMP:
            return self._record_with_max_timestamp()
        check(
            timestamp_ms >= 0,
            "log %s: offset for timestamp %d, not a ListOffsets value",
            self._directory,
            timestamp_ms,
        )
        for segment in self._segments:
            if segment.next_offset <= self._log_start_offset or segment.max_timestamp_ms < timestamp_ms:
                continue
            min_offset = self._log_start_offset
            # A batch the log start cuts may hold its records at or after the target only below
            # the log start: then the answer lies in a later batch.
            while (header := segment.find_by_timestamp(timestamp_ms, min_offset=min_offset)) is not None:
                found = _first_record_at_or_after(segment, header, timestamp_ms, self._log_start_offset)
                if found is not None:
                    return found
                min_offset = header.next_offset
        return None

    def _record_with_max_timestamp(self) -> tuple[int, int] | None:
        """(offset, timestamp) of the first record at or after the log start holding the
        largest timestamp there (Kafka's MAX_TIMESTAMP lookup, KIP-734); None for an empty log.

        A batch the log start cuts is decoded for the records it still holds; past it, the
        first batch with the largest max_timestamp holds the answer (a CreateTime batch's
        max_timestamp is its largest record timestamp: the leader sets it so on append).
        """
        start = self._log_start_offset
        best: tuple[int, int] | None = None
        cut = self._segment_and_batch(start)
        if cut is not None and cut[1].base_offset < start:
            best = _record_with_max_timestamp_in(cut[0], cut[1], start)
            start = cut[1].next_offset
        found = self._first_batch_with_max_timestamp(start)
        if found is None or (best is not None and found[1].max_timestamp <= best[1]):
            return best
        segment, header = found
        answer = _first_record_at_or_after(segment, header, header.max_timestamp, start)
        if answer is None:
            raise CorruptMessage(
                f"log {self._directory}: the batch at offset {header.base_offset} has max_timestamp "
                f"{header.max_timestamp} but none of its records has that timestamp; the stored batch "
                "disagrees with its header. Delete the replica so that it is copied again from the leader"
            )
        return answer

    def _first_batch_with_max_timestamp(self, min_offset: int) -> tuple[LogSegment, BatchHeader] | None:
        """The first batch with the largest max_timestamp among those starting at or after
        `min_offset` (a batch boundary); None if there are none."""
        best: tuple[LogSegment, BatchHeader] | None = None
        for segment in self._segments:
            if segment.next_offset <= min_offset or (
                best is not None and segment.max_timestamp_ms <= best[1].max_timestamp
            ):
                continue
            header = segment.find_by_timestamp(segment.max_timestamp_ms, min_offset=min_offset)
            if header is None:
                # The segment's largest timestamp lies below min_offset: scan what is left of it.
                holding = segment.find_batch(min_offset)
                for candidate in segment.iter_headers(holding.position if holding is not None else 0):
                    if header is None or candidate.max_timestamp > header.max_timestamp:
                        header = candidate
            if header is not None and (best is None or header.max_timestamp > best[1].max_timestamp):
                best = segment, header
        return best

    def _segment_and_batch(self, offset: int) -> tuple[LogSegment, BatchHeader] | None:
        """The segment and header of the batch holding `offset`; None outside the log."""
        if not self._log_start_offset <= offset < self.log_end_offset:
            return None
        index = bisect.bisect_right(self._base_offsets, offset) - 1
        while 0 <= index < len(self._segments):
            header = self._segments[index].find_batch(offset)
            if header is not None:
                return self._segments[index], header
            index += 1
        return None

    # --- truncation and deletion ------------------------------------------------------

    def truncate_to(self, offset: int) -> None:
        """Drop every offset >= `offset` (a follower cutting a divergent suffix).

        A batch straddling `offset` goes whole: the LEO becomes its base offset. The epoch
        cache is cut first and the truncated files are fsynced, so the dropped suffix does
        not come back after a crash.
        """
        self._ensure_usable()
        check(offset >= 0, "log %s: truncate to negative offset %d", self._directory, offset)
        if offset >= self.log_end_offset:
            # No record to cut, but an epoch that started here (a leader that wrote
            # nothing) must go, or the follower refuses its new leader's older-epoch
            # batches forever (sim seed KI-2; Kafka truncates the cache the same way).
            self._epoch_cache.truncate_from_end(offset)
            return
        if offset < self._base_offsets[0]:
            self.truncate_fully_and_start_at(offset)
            return
        self._epoch_cache.truncate_from_end(offset)
        keep = bisect.bisect_right(self._base_offsets, offset)
        for segment in reversed(self._segments[keep:]):
            segment.delete_files()
        del self._segments[keep:]
        del self._base_offsets[keep:]
        active = self._active
        active.make_active()
        new_end = active.truncate_to(offset)
        # Every segment, not only the active one: an fsync that made a later segment durable
        # while an earlier one was not would let a crash lose the earlier one and keep the log
        # end past it, a hole the replica never fetches again (tests/sim/test_cleaner_sim.py).
        for segment in self._segments:
            segment.flush()
        if new_end < offset:
            self._epoch_cache.truncate_from_end(new_end)
        if self._aborted.truncate_from(new_end):
            self._write_aborted_txns()
        if new_end < self._log_start_offset:
            self._set_log_start_offset(new_end)
        if self._recovery_point > new_end:
            self._recovery_point = new_end
            checkpoints.write_offset(self._storage, self._path(RECOVERY_POINT_CHECKPOINT), new_end)
        self._unflushed_messages = 0

    def truncate_fully_and_start_at(self, offset: int) -> None:
        """Delete every segment and start empty at `offset` (a follower far behind the leader's log start)."""
        check(not self._closed, "log %s is closed", self._directory)
        check(offset >= 0, "log %s: start at negative offset %d", self._directory, offset)
        self._epoch_cache.clear()
        self._set_log_start_offset(offset)
        if self._aborted.truncate_from(0):
            self._write_aborted_txns()
        for segment in reversed(self._segments):
            segment.delete_files()
        segment = LogSegment(self._storage, self._directory, offset, self._config, active=True)
        segment.unflushed = True
        segment.flush()  # the empty segment must survive a crash, or the log would reappear elsewhere
        self._segments = [segment]
        self._base_offsets = [offset]
        self._recovery_point = offset
        checkpoints.write_offset(self._storage, self._path(RECOVERY_POINT_CHECKPOINT), offset)
        self._unflushed_messages = 0

    def advance_log_start_offset(self, offset: int) -> None:
        """Make offsets below `offset` unreadable (DeleteRecords); whole segments below it are deleted.

        Never moves the log start back. Raises OffsetOutOfRange past the LEO; the caller
        keeps it at or below the high watermark.
        """
        self._ensure_usable()
        if offset > self.log_end_offset:
            raise OffsetOutOfRange(f"log start offset {offset} is past the log end {self.log_end_offset}")
        if offset <= self._log_start_offset:
            return
        self._set_log_start_offset(offset)
        self._epoch_cache.truncate_from_start(offset)
        self._delete_prefix(lambda segment, next_base: next_base <= offset, high_watermark=offset)

    def delete_old_segments(self, now_ms: int, high_watermark: int) -> int:
        """Apply retention; return how many segments were deleted.

        Deletes whole, inactive segments from the oldest on, and only those wholly below
        `high_watermark` (never a segment holding or above the HW: uncommitted data stays):
        first those below the log start, then those whose newest batch is older than
        retention_ms, then the oldest while the log is bigger than retention_bytes. The last two
        only under a cleanup.policy with "delete": a compacted log keeps every segment (Kafka
        leaves it to the cleaner, and there is none yet).
        """
        self._ensure_usable()
        deleted = self._delete_prefix(
            lambda segment, next_base: next_base <= self._log_start_offset, high_watermark=high_watermark
        )
        if not self._config.retention_applies:
            return deleted
        retention_ms = self._config.retention_ms
        if retention_ms >= 0:
            deleted += self._delete_prefix(
                lambda segment, next_base: now_ms - segment.max_timestamp_ms > retention_ms,
                high_watermark=high_watermark,
            )
        retention_bytes = self._config.retention_bytes
        if retention_bytes >= 0:
            excess = self.size_bytes - retention_bytes

            def over_size(segment: LogSegment, next_base: int) -> bool:
                nonlocal excess
                if segment.size_bytes <= excess:
                    excess -= segment.size_bytes
                    return True
                return False

            deleted += self._delete_prefix(over_size, high_watermark=high_watermark)
        return deleted

    def _delete_prefix(self, breached: _Breach, *, high_watermark: int) -> int:
        """Delete the longest prefix of inactive segments that breach and lie below the HW."""
        count = 0
        while len(self._segments) > 1:
            segment = self._segments[0]
            next_base = self._base_offsets[1]
            if next_base > high_watermark or not breached(segment, next_base):
                break
            if next_base > self._log_start_offset:
                # The log start checkpoint moves first: after a crash mid-delete the old
                # segment's offsets stay unreadable.
                self._set_log_start_offset(next_base)
                self._epoch_cache.truncate_from_start(next_base)
            segment.delete_files()
            del self._segments[0]
            del self._base_offsets[0]
            count += 1
        return count

    def _set_log_start_offset(self, offset: int) -> None:
        if offset > self._log_start_offset:
            self._write_producer_snapshot()
            if self._aborted.drop_below(offset):
                self._write_aborted_txns()
        self._log_start_offset = offset
        checkpoints.write_offset(self._storage, self._path(LOG_START_OFFSET_CHECKPOINT), offset)
        self._log_start_offset_on_disk = offset

    # --- durability -------------------------------------------------------------------

    def flush(self, now_ms: int) -> None:
        """fsync every segment with unflushed data, then move the recovery point to the LEO."""
        self._ensure_usable()
        try:
            for segment in self._segments:
                segment.flush()
        except StorageError as error:
            self._offline_reason = str(error)
            raise
        self._unflushed_messages = 0
        self._last_flush_ms = now_ms
        if self._recovery_point != self.log_end_offset:
            # Recovery rebuilds epoch entries only past the recovery point: persist first.
            self._epoch_cache.persist_if_dirty()
            self._recovery_point = self.log_end_offset
            checkpoints.write_offset(
                self._storage, self._path(RECOVERY_POINT_CHECKPOINT), self._recovery_point
            )

    def maybe_flush(self, now_ms: int) -> bool:
        """Flush when flush_ms has passed since the last flush and there is something to flush."""
        flush_ms = self._config.flush_ms
        if flush_ms is not None and self._unflushed_messages and now_ms - self._last_flush_ms >= flush_ms:
            self.flush(now_ms)
            return True
        return False

    def _persist_epochs(self, entries: list[tuple[int, int]]) -> None:
        version = self._checkpoint_version
        checkpoints.write_entries(
            self._storage, self._path(LEADER_EPOCH_CHECKPOINT), list(entries), version=version
        )
        self._epoch_file_version = version

    @property
    def _checkpoint_version(self) -> int:
        """The leader epoch checkpoint's version: CHECKPOINT_VERSION_HOLES once the log may have
        holes (it is compacted, or was), which older releases refuse rather than cut."""
        if self._config.compact or self._epoch_file_version == checkpoints.CHECKPOINT_VERSION_HOLES:
            return checkpoints.CHECKPOINT_VERSION_HOLES
        return checkpoints.CHECKPOINT_VERSION

    def _mark_holes_possible(self) -> None:
        """Write the leader epoch checkpoint in version 1 now if the log became compacted. A dirty
        cache is left to persist_if_dirty, which writes it in version 1 too: an entry is written
        only with the data it names (epoch_cache.py)."""
        if self._epoch_file_version != self._checkpoint_version and not self._epoch_cache.dirty:
            self._persist_epochs(list(self._epoch_cache.entries()))

    def close(self) -> None:
        """Flush, checkpoint, write the clean-shutdown marker (skips the scan on next open), close files.

        An offline log gets no marker: its next open must recover.
        """
        if self._closed:
            return
        if self._offline_reason is None:
            for segment in self._segments:
                segment.flush()
            self._epoch_cache.persist_if_dirty()
            self._recovery_point = self.log_end_offset
            checkpoints.write_offset(
                self._storage, self._path(RECOVERY_POINT_CHECKPOINT), self._recovery_point
            )
            checkpoints.write_offset(
                self._storage, self._path(LOG_START_OFFSET_CHECKPOINT), self._log_start_offset
            )
            self._write_producer_snapshot()
            self._storage.write_atomic(self._path(CLEAN_SHUTDOWN_MARKER), b"")
        for segment in self._segments:
            segment.close()
        self._closed = True

    # --- the batched clean close (close_logs) -------------------------------------------
    # close() above costs about eleven fsyncs per log; close_logs does the same work for
    # many logs in three phases separated by one Storage.sync_all each.

    @property
    def is_closed(self) -> bool:
        return self._closed

    @property
    def is_offline(self) -> bool:
        return self._offline_reason is not None

    def _stage_clean_close(self, staging_prefix: str) -> list[tuple[str, str]]:
        """Phase 1 of close_logs: write what a clean close writes, without fsync.

        Returns (staged path, final path) of the checkpoints staged, each written to
        `staging_prefix` + its name. Segment bytes and index entries go to their own files.
        Of the checkpoints only those a clean open relies on and that differ from the files
        are staged: the leader epochs (a clean open trusts the file and rebuilds none), the
        log start offset (normally written at every change already), and the producer state
        snapshot (the next open then replays no batch to rebuild it). Not the recovery point: an open that
        finds the marker does not use it (it trusts every segment and writes the point at
        the end itself, durably, before it removes the marker), and one that does not find
        the marker scans from the old, lower point, which is safe.
        """
        self._ensure_usable()
        for segment in self._segments:
            segment.write_buffered()
        staged: list[tuple[str, str, bytes]] = []
        if self._epoch_cache.dirty or self._epoch_file_version != self._checkpoint_version:
            entries = checkpoints.encode_entries(
                list(self._epoch_cache.entries()), version=self._checkpoint_version
            )
            staged.append((LEADER_EPOCH_CHECKPOINT, self._path(LEADER_EPOCH_CHECKPOINT), entries))
        if self._log_start_offset_on_disk != self._log_start_offset:
            start = checkpoints.encode_entries([(self._log_start_offset,)])
            staged.append((LOG_START_OFFSET_CHECKPOINT, self._path(LOG_START_OFFSET_CHECKPOINT), start))
        snapshot = self.producer_snapshot() if self.producer_snapshot is not None else None
        if snapshot is not None:
            staged.append((PRODUCER_SNAPSHOT, self._path(PRODUCER_SNAPSHOT), snapshot))
        for name, _, data in staged:
            self._storage.write_unsynced(staging_prefix + name, data)
        return [(staging_prefix + name, final) for name, final, _ in staged]

    def _finish_clean_close(self) -> None:
        """After the last sync_all: every byte is durable and the marker vouches for it; close the files."""
        self._epoch_cache.mark_persisted()
        self._epoch_file_version = self._checkpoint_version
        self._recovery_point = self.log_end_offset  # as the next open will take it
        self._log_start_offset_on_disk = self._log_start_offset
        for segment in self._segments:
            segment.unflushed = False
            segment.close()
        self._closed = True

    def abandon(self) -> None:
        """Drop the log as a killed process would: close the files, flush nothing, leave no marker.

        For tests and the simulation; the next open recovers.
        """
        if not self._closed:
            for segment in self._segments:
                segment.close()
            self._closed = True

    def delete(self) -> None:
        """Close the files and remove the whole partition directory (the partition left this broker)."""
        if not self._closed:
            for segment in self._segments:
                segment.close()
            self._closed = True
        self._storage.delete_dir(self._directory)


def _first_record_at_or_after(
    segment: LogSegment, header: BatchHeader, timestamp_ms: int, min_offset: int
) -> tuple[int, int] | None:
    """(offset, timestamp) of the first record of the batch `header` names, at or after
    min_offset, whose timestamp is >= timestamp_ms; None if none is.

    Decodes the batch (decompressing it if need be) with the clients' decoder: the leader
    checked on append that its records decode, within limits.DECOMPRESSED_BATCH_BYTES_MAX
    (clients/common/record_validation.py). A LogAppendTime batch's records all carry its
    max_timestamp, as in Kafka. Raises CorruptMessage if the stored bytes no longer decode.
    """
    for record in decode_batches(segment.read(header.position, header.size_bytes)):
        if record.offset >= min_offset and record.timestamp_ms >= timestamp_ms:
            return record.offset, record.timestamp_ms
    return None


def _record_with_max_timestamp_in(
    segment: LogSegment, header: BatchHeader, min_offset: int
) -> tuple[int, int] | None:
    """(offset, timestamp) of the first record of the batch, at or after min_offset, with the
    largest timestamp among those; None if no record is at or after min_offset.
    Raises CorruptMessage if the stored bytes no longer decode."""
    best: tuple[int, int] | None = None
    for record in decode_batches(segment.read(header.position, header.size_bytes)):
        if record.offset >= min_offset and (best is None or record.timestamp_ms > best[1]):
            best = record.offset, record.timestamp_ms
    return best


@dataclass(frozen=True, slots=True)
class PreparedSwap:
    """A cleaned segment checked, indexed and fsynced by Log.prepare_swap, for Log.commit_swap."""

    # The segments it replaces, as the cleaner saw them: commit_swap checks they still are.
    old: tuple[SegmentView, ...]
    base_offset: int
    # The range it covers ends here: old[-1].end_offset.
    end_offset: int
    size_bytes: int
    # Its last batch's next offset, as the scan found it (base_offset when empty).
    next_offset: int
    # The old segments' .log files, opened by prepare_swap and held until close(): commit_swap's
    # delete of an old segment then only removes its name, and the costly part of a delete (the
    # kernel freeing the file's blocks and cached pages: ms per few MiB) happens at the last
    # close, which the caller makes on its thread.
    held_files: tuple[StorageFile, ...] = ()

    def close(self) -> None:
        """Close the held old segment files: call after commit_swap or discard_prepared, off the
        event loop (the cleaner's thread). Idempotent."""
        for file in self.held_files:
            file.close()


@dataclass(frozen=True, slots=True)
class _CleanedScan:
    size_bytes: int
    next_offset: int
    # Why the cleaned file is refused; "" when it is sound.
    problem: str


def _scan_cleaned(
    storage: Storage, log_path: str, stem_path: str, base: int, end: int, config: LogConfig
) -> _CleanedScan:
    """Check a cleaned segment file and write its two indexes beside it (`stem_path` + suffix),
    then fsync the three. Thread-safe: only these files, opened directly on the storage.

    The checks are recovery's (LogSegment.recover: lengths, magic, CRC, counts, offsets strictly
    increasing, leader epochs never going down), plus every offset within [base, end); the index
    entries are those LogSegment._track writes for the same batches. Memory stays bounded: the
    file is read in RECOVERY_CHUNK_BYTES pieces and each piece's entries written at once.
    """
    log_file = storage.open(log_path, create=False)
    files: list[StorageFile] = [log_file]
    try:
        entries_max = config.max_index_entries
        offset_index = OffsetIndex(
            _opened(storage, stem_path + INDEX_SUFFIX, files), max_entries=entries_max, in_memory=False
        )
        time_index = TimeIndex(
            _opened(storage, stem_path + TIME_INDEX_SUFFIX, files), max_entries=entries_max, in_memory=False
        )
        index_interval_bytes = config.index_interval_bytes
        size = log_file.size
        position = 0
        chunk_bytes = RECOVERY_CHUNK_BYTES
        expected = base
        epoch: int | None = None
        max_timestamp = last_indexed_timestamp = NO_TIMESTAMP
        bytes_since = 0
        while position < size:
            chunk = log_file.read_at(position, min(chunk_bytes, size - position))
            headers, valid_end, reason = valid_prefix(chunk, position_base=position)
            offset_entries: list[tuple[int, int]] = []
            time_entries: list[tuple[int, int]] = []
            for header in headers:
                problem = ""
                if header.base_offset < expected:
                    problem = (
                        f"batch at byte {header.position} has base offset {header.base_offset}, "
                        f"below the previous batch's next offset {expected}"
                    )
                elif header.next_offset > end:
                    problem = f"it holds offsets up to {header.last_offset}, past the range's end {end}"
                elif epoch is not None and header.partition_leader_epoch < epoch:
                    problem = (
                        f"batch at byte {header.position} has leader epoch "
                        f"{header.partition_leader_epoch} below the previous {epoch}"
                    )
                if problem:
                    return _CleanedScan(size, expected, problem)
                if epoch is None or header.partition_leader_epoch > epoch:
                    epoch = header.partition_leader_epoch
                expected = header.next_offset
                max_timestamp = max(max_timestamp, header.max_timestamp)
                if bytes_since > index_interval_bytes:
                    relative = header.base_offset - base
                    offset_entries.append((relative, header.position))
                    if max_timestamp > last_indexed_timestamp:
                        time_entries.append((max_timestamp, relative))
                        last_indexed_timestamp = max_timestamp
                    bytes_since = 0
                bytes_since += header.size_bytes
            offset_index.append_entries(offset_entries)
            time_index.append_entries(time_entries)
            if reason:
                # A batch crossing the piece's end is read again from its start, in a piece big
                # enough to hold it (as LogSegment.recover).
                local = valid_end - position
                extent = peek_batch_extent(chunk, local)
                cut_off = extent is None or (
                    extent[1] >= BATCH_HEADER_SIZE and extent[1] > len(chunk) - local
                )
                needed = extent[1] if extent is not None else 0
                if position + len(chunk) < size and cut_off and needed <= size - valid_end:
                    chunk_bytes = max(RECOVERY_CHUNK_BYTES, needed)
                    position = valid_end
                    continue
                return _CleanedScan(
                    size, expected, f"its bytes from {valid_end} on are not sound batches ({reason})"
                )
            chunk_bytes = RECOVERY_CHUNK_BYTES
            position = valid_end
        for file in files:
            file.fsync()
        return _CleanedScan(size, expected, "")
    finally:
        for file in files:
            file.close()


def _hold(storage: Storage, old: Sequence[SegmentView]) -> tuple[StorageFile, ...]:
    """Open the old segments' files for PreparedSwap.held_files; one gone already (retention ran
    meanwhile: commit_swap will find the segments changed) is skipped."""
    held: list[StorageFile] = []
    for view in old:
        try:
            held.append(storage.open(view.path, create=False))
        except StorageError:
            continue
    return tuple(held)


def _opened(storage: Storage, path: str, files: list[StorageFile]) -> StorageFile:
    """A new empty file at `path`, remembered in `files` (closed by the caller)."""
    file = storage.open(path, create=True)
    files.append(file)
    return file


def close_logs(
    logs: list[Log], *, storage: Storage, sync_root: str, on_phase: Callable[[str], None] = lambda phase: None
) -> list[tuple[Log, Exception]]:
    """Close many logs cleanly, as `Log.close` each, with three `sync_all`s instead of ~11 fsyncs per log.

    Every log lies under `sync_root`. The phases keep Log.close's order of durability:
    1. segment bytes and index entries are written to their files, each log's changed
       checkpoints to new files in one staging directory (CLOSE_STAGING_DIR), and one empty
       file there; sync_all: all of it is durable;
    2. the staged checkpoints are renamed into their logs' directories (a rename of durable
       bytes: all or nothing, as write_atomic); sync_all: the renames are durable;
    3. each log's clean-shutdown marker is made a hard link to that one empty file (a
       marker is an empty file whose presence is all that counts); sync_all: the markers
       are durable.
    A marker thus never exists (even after a power cut) before the data and checkpoints it
    vouches for. New files are kept few because making one cost 0.4-0.7 ms on the busy
    2-core test machine, just after the broker made thousands of files, while a rename or
    a link cost ~0.01 ms: only a changed checkpoint gets a file of its own.

    If a sync_all fails, no marker of this pass is left, and every log not finished is
    closed by `Log.close`, whose per-file fsyncs tell which log is damaged (its next open
    recovers). An offline log or one whose staging failed also goes that way. Returns the
    logs whose close failed, with the error. ARCHITECTURE.md section 5 says why one barrier
    over the file system rather than threads of fsyncs. `on_phase` is called with each
    phase's name as it ends (the broker logs how long each took).
    """
    staging = os.path.join(sync_root, CLOSE_STAGING_DIR)
    empty = os.path.join(staging, CLEAN_SHUTDOWN_MARKER)
    open_logs = [log for log in logs if not log.is_closed]
    slow: list[Log] = []
    fast: list[tuple[Log, list[tuple[str, str]]]] = []
    try:
        storage.delete_dir(staging)  # what a crash in an earlier close left
        storage.mkdir(staging)
        storage.write_unsynced(empty, b"")
    except StorageError as error:
        logger.warning("cannot stage the close of the logs under %s (%s)", sync_root, error)
        slow = open_logs
    else:
        for i, log in enumerate(open_logs):
            if log.is_offline:
                slow.append(log)  # Log.close gives it no marker: its next open recovers
                continue
            try:
                fast.append((log, log._stage_clean_close(os.path.join(staging, f"{i}."))))
            except StorageError:
                slow.append(log)
        on_phase("staged")
        if fast:
            marked = _sync_and_mark(
                fast, slow, storage=storage, sync_root=sync_root, empty=empty, on_phase=on_phase
            )
            for log in marked:
                log._finish_clean_close()
        storage.delete_dir(staging)
    failures: list[tuple[Log, Exception]] = []
    for log in slow:
        try:
            log.close()
        except Exception as error:
            failures.append((log, error))
    return failures


def _sync_and_mark(
    fast: list[tuple[Log, list[tuple[str, str]]]],
    slow: list[Log],
    *,
    storage: Storage,
    sync_root: str,
    empty: str,
    on_phase: Callable[[str], None],
) -> list[Log]:
    """Phases 1 (its sync) to 3 of close_logs; returns the logs now durably marked clean.

    A log that cannot take part from here on is added to `slow`, and all of them if a
    sync_all fails (then the markers of this pass are removed first).
    """
    marked: list[Log] = []
    try:
        storage.sync_all(sync_root)
        on_phase("data synced")
        ready: list[Log] = []
        for log, staged in fast:
            try:
                for staged_path, final_path in staged:
                    storage.rename_unsynced(staged_path, final_path)
                ready.append(log)
            except StorageError:
                slow.append(log)
        if any(staged for _, staged in fast):
            on_phase("renamed")
            storage.sync_all(sync_root)  # the renames, before any marker that relies on them
            on_phase("renames synced")
        for log in ready:
            try:
                storage.link_unsynced(empty, log._path(CLEAN_SHUTDOWN_MARKER))
                marked.append(log)
            except StorageError:
                slow.append(log)
        on_phase("marked")
        storage.sync_all(sync_root)
        on_phase("markers synced")
        return marked
    except StorageError as error:
        logger.warning("syncing the logs under %s failed (%s); closing them one by one", sync_root, error)
        for log in marked:
            storage.delete(log._path(CLEAN_SHUTDOWN_MARKER))
        going_slow = {id(log) for log in slow}
        slow.extend(log for log, _ in fast if id(log) not in going_slow)
        return []
