"""One log segment: `{base_offset:020d}.log` with its `.index` and `.timeindex`.

A segment holds batches within offsets [base_offset, next_offset), back to back, as
they arrived (DESIGN.md section 5). A compacted log's segments have holes (issue 39): the
cleaner removes records but never changes an offset, so a batch may start after the
previous one's next offset, and the first batch after base_offset. Only the last segment
of a log (the active one) is appended to. Indexes are sparse and rebuilt from the log whenever in doubt.

Open files (issues 17, 42): the active segment pins its .log open and keeps its indexes in
memory; an inactive one keeps in memory only its sizes, next offset, max timestamp and last
index entries. Every other file (the active segment's index files too) is opened through the
storage's broker-wide `OpenFileCache`, closed when the cache evicts it and reopened at its
next use.

Invariants kept here:
- batch offsets strictly increase: each batch starts at or after the previous one's next
  offset (equal unless the log was compacted), the first at or after base_offset, and
  every offset fits the index's int32 relative offset;
- byte positions fit int32 (LogConfig keeps segment_bytes + max_message_bytes < 2 GiB);
- index keys strictly increase; an index entry never points past the log's end.

Owned by the Log (one task); no locks, no clock: times arrive as arguments.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass

from clients.common.errors import check
from clients.common.record_batch import (
    BATCH_HEADER_SIZE,
    MIN_BATCH_LENGTH,
    BatchHeader,
    Buffer,
    iter_batch_headers,
    parse_header,
    peek_batch_extent,
    valid_prefix,
)

from .config import OFFSET_INDEX_ENTRY_BYTES, TIME_INDEX_ENTRY_BYTES, LogConfig
from .index import OffsetIndex, TimeIndex
from .storage import Storage

LOG_SUFFIX = ".log"
INDEX_SUFFIX = ".index"
TIME_INDEX_SUFFIX = ".timeindex"

# Header walks read this much at a time: several small batches per read, one header per
# read for big batches (then only the header is used).
_SCAN_CHUNK_BYTES = 16 * 1024
# Recovery reads the log in pieces of this size: bounded memory, few syscalls.
RECOVERY_CHUNK_BYTES = 8 * 1024 * 1024

NO_TIMESTAMP = -1

# Index entries hold offsets relative to the segment's base as int32.
RELATIVE_OFFSET_MAX = 2**31 - 1


def segment_file_name(base_offset: int, suffix: str) -> str:
    return f"{base_offset:020d}{suffix}"


def parse_segment_file_name(name: str) -> tuple[int, str] | None:
    """(base offset, suffix) for a segment file name, None for anything else."""
    stem, dot, suffix = name.partition(".")
    if not dot or len(stem) != 20 or not stem.isdigit():
        return None
    return int(stem), "." + suffix


@dataclass(frozen=True, slots=True)
class RecoveryResult:
    """What recovering one segment found: where the sound data ends and why."""

    valid_bytes: int
    dropped_bytes: int
    next_offset: int
    # (epoch, first offset) each time partition_leader_epoch changed, in order.
    epoch_starts: list[tuple[int, int]]
    reason: str


class LogSegment:
    """Files and in-memory state of one segment."""

    def __init__(
        self,
        storage: Storage,
        directory: str,
        base_offset: int,
        config: LogConfig,
        *,
        active: bool,
        file_stem: str | None = None,
    ) -> None:
        """`file_stem`: the files' names without their suffix; default the 20-digit base offset.
        Another stem names a segment that is not (yet) part of the log: a cleaned one (log.py)."""
        self.base_offset = base_offset
        self.config = config
        self.storage = storage
        stem = segment_file_name(base_offset, "") if file_stem is None else file_stem
        self.log_path = os.path.join(directory, stem + LOG_SUFFIX)
        self.index_path = os.path.join(directory, stem + INDEX_SUFFIX)
        self.time_index_path = os.path.join(directory, stem + TIME_INDEX_SUFFIX)
        # Only the active segment's .log is pinned open (appended to on every produce). Its
        # indexes are kept in memory and written once per ~500 entries, so their files sit in
        # the shared LRU like any inactive segment's: one held handle per replica, not three,
        # is what lets a broker hold 10,000 replicas under a 20,000 open-files limit.
        self.log = storage.open_files.open(self.log_path, pinned=active)
        index_file = storage.open_files.open(self.index_path, pinned=False)
        time_index_file = storage.open_files.open(self.time_index_path, pinned=False)
        # A torn index write leaves a partial entry: such an index is rebuilt, never trusted.
        self.index_damaged = (
            index_file.size % OFFSET_INDEX_ENTRY_BYTES != 0
            or time_index_file.size % TIME_INDEX_ENTRY_BYTES != 0
        )
        if self.index_damaged:
            index_file.truncate(0)
            time_index_file.truncate(0)
        self.offset_index = OffsetIndex(index_file, max_entries=config.max_index_entries, in_memory=active)
        self.time_index = TimeIndex(time_index_file, max_entries=config.max_index_entries, in_memory=active)
        # Exclusive end of the segment's offsets; set by load_tail/recover/append.
        self.next_offset = base_offset
        self.max_timestamp_ms = NO_TIMESTAMP
        self._bytes_since_index_entry = 0
        # (base offset, file position) of the last batch: a tailing reader (a follower, a
        # consumer at the end) asks for it, and small batches have no index entry of their own.
        self._last_batch: tuple[int, int] | None = None
        # Base time of time-based rolling: now_ms of the first live append, or the first
        # batch's max_timestamp for a segment found on disk (as Kafka's rollingBasedTimestamp).
        self.rolling_base_ms: int | None = None
        self.unflushed = False

    # --- state ------------------------------------------------------------------------

    @property
    def size_bytes(self) -> int:
        return self.log.size

    @property
    def is_empty(self) -> bool:
        return self.log.size == 0

    def make_active(self) -> None:
        """Pin the .log open and keep the indexes in memory: appends and truncation come here."""
        self.log.pin()
        self.offset_index.load()
        self.time_index.load()

    def make_inactive(self) -> None:
        """Drop the in-memory indexes and let the cache close the .log between reads."""
        self.offset_index.unload()
        self.time_index.unload()
        self.log.unpin()

    def should_roll(self, incoming_bytes: int, last_offset: int, now_ms: int) -> bool:
        """Whether a batch group must go to a new segment (never for an empty segment)."""
        if self.is_empty:
            return False
        return (
            self.size_bytes + incoming_bytes > self.config.segment_bytes
            or (
                self.rolling_base_ms is not None
                and now_ms - self.rolling_base_ms > self.config.max_segment_ms
            )
            or self.offset_index.is_full
            or self.time_index.is_full
            # Relative offsets in the index are int32.
            or last_offset - self.base_offset > RELATIVE_OFFSET_MAX
        )

    def index_suspect(self) -> bool:
        """An index that cannot be right for this log: rebuild it rather than trust it."""
        return (
            self.index_damaged
            or not self.offset_index.sane_for(self.size_bytes)
            or (
                self.offset_index.entry_count == 0
                and self.size_bytes > 2 * self.config.index_interval_bytes + (1 << 20)
            )
        )

    # --- writing ----------------------------------------------------------------------

    def append(self, buf: Buffer, headers: list[BatchHeader], now_ms: int) -> None:
        """Write the batches `headers` (positions in `buf`, back to back, offsets increasing)
        at the end of the segment. The first may start after next_offset (a follower copying
        a compacted leader's hole) but never before it."""
        first = headers[0]
        check(
            first.base_offset >= self.next_offset,
            "segment %d: append at offset %d but the segment ends at %d",
            self.base_offset,
            first.base_offset,
            self.next_offset,
        )
        check(
            headers[-1].last_offset - self.base_offset <= RELATIVE_OFFSET_MAX,
            "segment %d: a batch ending at offset %d is too far for the index's int32 relative offsets",
            self.base_offset,
            headers[-1].last_offset,
        )
        start = first.position
        file_position = self.log.append(memoryview(buf)[start : headers[-1].end_position])
        if self.rolling_base_ms is None:
            self.rolling_base_ms = now_ms
        self._track(headers, file_position - start)
        self.unflushed = True

    def _track(self, headers: list[BatchHeader], position_shift: int) -> None:
        """Advance next_offset, max timestamp and the sparse indexes over written batches."""
        offset_entries: list[tuple[int, int]] = []
        time_entries: list[tuple[int, int]] = []
        interval = self.config.index_interval_bytes
        base = self.base_offset
        max_timestamp = self.max_timestamp_ms
        last_time_entry = self.time_index.last_entry()
        last_indexed_timestamp = last_time_entry[0] if last_time_entry else NO_TIMESTAMP
        bytes_since = self._bytes_since_index_entry
        for header in headers:
            if header.max_timestamp > max_timestamp:
                max_timestamp = header.max_timestamp
            if bytes_since > interval:
                relative = header.base_offset - base
                offset_entries.append((relative, header.position + position_shift))
                if max_timestamp > last_indexed_timestamp:
                    time_entries.append((max_timestamp, relative))
                    last_indexed_timestamp = max_timestamp
                bytes_since = 0
            bytes_since += header.size_bytes
        self._bytes_since_index_entry = bytes_since
        self.max_timestamp_ms = max_timestamp
        self.next_offset = headers[-1].next_offset
        self._last_batch = (headers[-1].base_offset, headers[-1].position + position_shift)
        self.offset_index.append_entries(offset_entries)
        self.time_index.append_entries(time_entries)

    def write_buffered(self) -> None:
        """Write the buffered index entries to their files, without fsync: a `Storage.sync_all`
        after this makes the segment as durable as `flush` would (the batched close)."""
        self.offset_index.write_pending()
        self.time_index.write_pending()

    def flush(self) -> None:
        if self.unflushed:
            self.log.fsync()
            self.offset_index.fsync()
            self.time_index.fsync()
            self.unflushed = False

    # --- reading ----------------------------------------------------------------------

    def iter_headers(self, position: int, end_position: int | None = None) -> Iterator[BatchHeader]:
        """Headers (with file positions) of the complete batches from `position` on, no CRC check."""
        end = self.log.size if end_position is None else end_position
        while end - position >= BATCH_HEADER_SIZE:
            chunk = self.log.read_at(position, min(_SCAN_CHUNK_BYTES, end - position))
            consumed = 0
            for header in iter_batch_headers(chunk, position_base=position):
                yield header
                consumed = header.end_position - position
            if consumed == 0:
                # One batch bigger than the chunk: its header is enough to step over it.
                header = parse_header(chunk, 0, position_base=position)
                if header.batch_length < MIN_BATCH_LENGTH or header.size_bytes > end - position:
                    return
                yield header
                consumed = header.size_bytes
            position += consumed

    def find_batch(self, offset: int) -> BatchHeader | None:
        """The first batch whose last offset is >= `offset`, None past the end: the one holding
        `offset`, or the first one after it when `offset` lies in a hole (a compacted log)."""
        if offset >= self.next_offset:
            return None
        last = self._last_batch
        if last is not None and offset >= last[0]:
            position = last[1]
        else:
            _, position = self.offset_index.lookup(max(0, offset - self.base_offset))
        # Most lookups land on the very batch (big batches get an entry each): try its header alone.
        probe = self.log.read_at(position, BATCH_HEADER_SIZE)
        if len(probe) == BATCH_HEADER_SIZE:
            header = parse_header(probe, 0, position_base=position)
            if header.batch_length >= MIN_BATCH_LENGTH and header.next_offset > offset:
                return header
        for header in self.iter_headers(position):
            if header.next_offset > offset:
                return header
        return None

    def find_by_timestamp(self, timestamp_ms: int, *, min_offset: int = 0) -> BatchHeader | None:
        """The first batch holding offsets >= `min_offset` with max_timestamp >= `timestamp_ms`."""
        if self.max_timestamp_ms < timestamp_ms or min_offset >= self.next_offset:
            return None
        entry = self.time_index.last_before(timestamp_ms)
        position = self.offset_index.lookup(entry[1])[1] if entry is not None else 0
        if min_offset > self.base_offset:
            holding = self.find_batch(min_offset)
            if holding is not None and holding.position > position:
                position = holding.position
        for header in self.iter_headers(position):
            if header.max_timestamp >= timestamp_ms and header.next_offset > min_offset:
                return header
        return None

    def read(self, position: int, size: int) -> bytes:
        return self.log.read_at(position, size)

    # --- loading, recovery, truncation ------------------------------------------------

    def load_tail(self) -> int:
        """Restore in-memory state of a segment trusted as written; return the end of its complete batches.

        Uses the last index entries and scans only the batches after the last offset
        entry, so opening a large log costs one short scan per segment. A return value
        below `size_bytes` means a torn tail that the caller must handle.
        """
        _, position = self.offset_index.lookup(2**31 - 1)
        last_time_entry = self.time_index.last_entry()
        max_timestamp = last_time_entry[0] if last_time_entry else NO_TIMESTAMP
        next_offset = self.base_offset
        if position:
            last_offset_entry = self.offset_index.last_entry()
            next_offset = self.base_offset + (last_offset_entry[0] if last_offset_entry else 0)
        end = position
        last_batch = None
        for header in self.iter_headers(position):
            if header.max_timestamp > max_timestamp:
                max_timestamp = header.max_timestamp
            next_offset = header.next_offset
            end = header.end_position
            last_batch = (header.base_offset, header.position)
        self._last_batch = last_batch
        self.next_offset = next_offset
        self.max_timestamp_ms = max_timestamp
        self._bytes_since_index_entry = end - position
        self.rolling_base_ms = self._first_batch_timestamp()
        return end

    def _first_batch_timestamp(self) -> int | None:
        if self.log.size < BATCH_HEADER_SIZE:
            return None
        return parse_header(self.log.read_at(0, BATCH_HEADER_SIZE)).max_timestamp

    def recover(self, *, latest_epoch: int | None, holes_allowed: bool = True) -> RecoveryResult:
        """Scan every batch (length, magic, CRC, counts, offset order, epoch order), rebuild
        both indexes, and cut the log at the first unsound batch.

        `latest_epoch` is the last epoch seen in earlier segments: epochs never go down along
        the log, so a lower one means a damaged header (base_offset and partition_leader_epoch
        lie outside the CRC, so offset and epoch order are their only checks). Offsets must
        strictly increase, not be contiguous: a compacted segment has holes (issue 39). A log
        that never was compacted cannot have any (`holes_allowed` False): there a gap is a
        damaged base offset, and the scan cuts at it, as before compaction existed.
        """
        self.offset_index.truncate_entries(0)
        self.time_index.truncate_entries(0)
        self.max_timestamp_ms = NO_TIMESTAMP
        self._bytes_since_index_entry = 0
        self.next_offset = self.base_offset
        self._last_batch = None
        file_size = self.log.size
        position = 0
        chunk_bytes = RECOVERY_CHUNK_BYTES
        epoch_starts: list[tuple[int, int]] = []
        epoch = latest_epoch
        reason = ""
        while position < file_size:
            chunk_start = position
            chunk = self.log.read_at(chunk_start, min(chunk_bytes, file_size - chunk_start))
            headers, position, reason = valid_prefix(chunk, position_base=chunk_start)
            broken_lineage = False
            expected = self.next_offset
            for count, header in enumerate(headers):
                if header.base_offset < expected or (not holes_allowed and header.base_offset != expected):
                    reason = (
                        f"batch at byte {header.position} has base offset {header.base_offset}, "
                        f"{'below' if header.base_offset < expected else 'not'} the previous batch's next "
                        f"offset {expected}"
                    )
                elif header.last_offset - self.base_offset > RELATIVE_OFFSET_MAX:
                    reason = (
                        f"batch at byte {header.position} ends at offset {header.last_offset}, "
                        f"too far past the segment's base {self.base_offset}"
                    )
                elif epoch is not None and header.partition_leader_epoch < epoch:
                    reason = (
                        f"batch at byte {header.position} has leader epoch {header.partition_leader_epoch} "
                        f"below the previous {epoch}"
                    )
                else:
                    if epoch is None or header.partition_leader_epoch > epoch:
                        epoch = header.partition_leader_epoch
                        if epoch >= 0:
                            epoch_starts.append((epoch, header.base_offset))
                    expected = header.next_offset
                    continue
                broken_lineage = True
                headers = headers[:count]
                position = header.position
                break
            if headers:
                self._track(headers, 0)
            if not reason:
                chunk_bytes = RECOVERY_CHUNK_BYTES
                continue
            local = position - chunk_start
            if not broken_lineage and chunk_start + len(chunk) < file_size and _incomplete_at(chunk, local):
                # The batch crosses the chunk's end: read again from its start, big enough to hold it.
                extent = peek_batch_extent(chunk, local)
                needed = extent[1] if extent is not None else 0
                if needed <= file_size - position:
                    chunk_bytes = max(RECOVERY_CHUNK_BYTES, needed)
                    reason = ""
                    continue
            break
        dropped = file_size - position
        if dropped:
            self.log.truncate(position)
        self.rolling_base_ms = self._first_batch_timestamp()
        self.unflushed = True
        return RecoveryResult(position, dropped, self.next_offset, epoch_starts, reason)

    def truncate_to(self, offset: int) -> int:
        """Drop batches holding offsets >= `offset`; a batch straddling it goes whole.

        Returns the segment's new next_offset: the kept last batch's next offset, which is
        at most `offset` (below it when a batch straddles it or `offset` lies in a hole).
        """
        header = self.find_batch(offset)
        if header is None:
            return self.next_offset
        relative = header.base_offset - self.base_offset
        self.offset_index.truncate_to_offset(relative)
        self.time_index.truncate_to_offset(relative)
        self.log.truncate(header.position)
        end = self.load_tail()
        check(
            end == header.position,
            "segment %d: after truncation the batches end at byte %d, not %d",
            self.base_offset,
            end,
            header.position,
        )
        if self.is_empty:
            self.rolling_base_ms = None
        self.unflushed = True
        return self.next_offset

    def close(self) -> None:
        self.log.close()
        self.offset_index.close()
        self.time_index.close()

    def delete_files(self) -> None:
        """Close and remove the segment. The .log goes first: orphan indexes are cleaned on open."""
        self.close()
        self.storage.delete(self.log_path)
        self.storage.delete(self.index_path)
        self.storage.delete(self.time_index_path)


def _incomplete_at(chunk: bytes, position: int) -> bool:
    """Whether the bytes at `position` are the start of a batch cut off by the chunk's end."""
    extent = peek_batch_extent(chunk, position)
    if extent is None:
        return True
    size = extent[1]
    return size >= BATCH_HEADER_SIZE and size > len(chunk) - position
