"""Reading a partition log: fetches, zero-copy locations, offset lookups, ListOffsets by time.

DESIGN.md section 5. Pure functions over the log's segments, which the Log passes in after
checking that it is readable (Log.read and its siblings delegate here): they change nothing,
read no clock, and touch files only through the segments' reads. Offsets are half-open: the
log holds [log_start_offset, LEO), the LEO being the last segment's next offset. Reads return
whole batches, never a split one; a read in a hole (a compacted log) answers from the first
batch after it. One exception to "the broker never decodes records": ListOffsets by
timestamp decodes the one batch it lands on, because its answer is a record.

Called on the owner's thread only (the partition's task on the broker's event loop): the
segments share the storage's OpenFileCache.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from clients.common.errors import CorruptMessage, OffsetOutOfRange, check
from clients.common.record_batch import BatchHeader, iter_batch_headers
from clients.common.records import decode_batches

from .segment import LogSegment
from .state import LogState

# ListOffsets' special timestamps, as Kafka's.
LATEST_TIMESTAMP = -1
EARLIEST_TIMESTAMP = -2
MAX_TIMESTAMP = -3  # KIP-734: the record with the largest timestamp


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


def read_batches(
    directory: str,
    segments: Sequence[LogSegment],
    base_offsets: Sequence[int],
    log_start_offset: int,
    fetch_offset: int,
    *,
    max_bytes: int,
    max_offset: int | None,
    min_one_message: bool,
) -> FetchInfo:
    """Whole batches from the one holding `fetch_offset`, within max_bytes and below max_offset.

    `max_offset` is exclusive (the HW for consumers): a batch is returned only if all its
    offsets are below it. At least one batch is returned when min_one_message, even if it
    is bigger than max_bytes. Reads at most one segment, and only the bytes it returns
    plus one short header scan after an index lookup. Raises OffsetOutOfRange when
    fetch_offset is outside [log_start_offset, LEO].
    """
    leo = segments[-1].next_offset
    start = _first_readable_batch(
        directory,
        segments,
        base_offsets,
        log_start_offset,
        fetch_offset,
        max_bytes,
        max_offset,
        min_one_message,
    )
    if start is None:
        return FetchInfo(b"", fetch_offset, fetch_offset, log_start_offset, leo)
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
    return FetchInfo(records, first.base_offset, next_offset, log_start_offset, leo)


def locate_batches(
    directory: str,
    segments: Sequence[LogSegment],
    base_offsets: Sequence[int],
    log_start_offset: int,
    fetch_offset: int,
    *,
    max_bytes: int,
    max_offset: int | None,
    min_one_message: bool,
) -> LocatedRecords | None:
    """Where the bytes `read_batches` would return lie in a segment file, without reading them.

    For short-circuit local reads (a consumer on this host preads the file itself).
    Same rules and errors as `read_batches`; None where it would return no records. Only
    batch headers are read, to find the cut.
    """
    start = _first_readable_batch(
        directory,
        segments,
        base_offsets,
        log_start_offset,
        fetch_offset,
        max_bytes,
        max_offset,
        min_one_message,
    )
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
        log_start_offset,
        segments[-1].next_offset,
    )


def _first_readable_batch(
    directory: str,
    segments: Sequence[LogSegment],
    base_offsets: Sequence[int],
    log_start: int,
    fetch_offset: int,
    max_bytes: int,
    max_offset: int | None,
    min_one_message: bool,
) -> tuple[LogSegment, BatchHeader, int] | None:
    """(segment, header of the batch holding fetch_offset, exclusive upper offset), or None."""
    leo = segments[-1].next_offset
    if fetch_offset < log_start or fetch_offset > leo:
        raise OffsetOutOfRange(f"fetch offset {fetch_offset} is outside the log's range [{log_start}, {leo}]")
    upper = leo if max_offset is None else min(max_offset, leo)
    if fetch_offset >= upper:
        return None
    index = bisect.bisect_right(base_offsets, fetch_offset) - 1
    check(
        index >= 0,
        "log %s: offset %d lies before the first segment %d",
        directory,
        fetch_offset,
        base_offsets[0],
    )
    while index < len(segments):
        segment = segments[index]
        first = segment.find_batch(fetch_offset)
        if first is None:
            index += 1
            continue
        if first.last_offset >= upper or (first.size_bytes > max_bytes and not min_one_message):
            return None
        return segment, first, upper
    return None


def segment_and_batch(
    segments: Sequence[LogSegment], base_offsets: Sequence[int], log_start_offset: int, offset: int
) -> tuple[LogSegment, BatchHeader] | None:
    """The segment and header of the batch holding `offset`; None outside the log
    [log_start_offset, LEO). An offset in a hole gives the first batch after it."""
    if not log_start_offset <= offset < segments[-1].next_offset:
        return None
    index = bisect.bisect_right(base_offsets, offset) - 1
    while 0 <= index < len(segments):
        header = segments[index].find_batch(offset)
        if header is not None:
            return segments[index], header
        index += 1
    return None


def batch_headers_from(
    segments: Sequence[LogSegment], base_offsets: Sequence[int], offset: int
) -> Iterator[BatchHeader]:
    """Headers of every batch from the one holding `offset` to the LEO (Log.batch_headers says
    what for). Positions are within each batch's segment."""
    index = max(0, bisect.bisect_right(base_offsets, offset) - 1)
    for segment in segments[index:]:
        first = segment.find_batch(offset) if segment.base_offset < offset else None
        position = first.position if first is not None else 0
        if segment.base_offset < offset and first is None:
            continue
        yield from segment.iter_headers(position)


def find_offset_for_timestamp(
    directory: str,
    segments: Sequence[LogSegment],
    base_offsets: Sequence[int],
    log_start_offset: int,
    timestamp_ms: int,
) -> tuple[int, int] | None:
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
    if timestamp_ms == LATEST_TIMESTAMP:
        return segments[-1].next_offset, -1
    if timestamp_ms == EARLIEST_TIMESTAMP:
        return log_start_offset, -1
    if timestamp_ms == MAX_TIMESTAMP:
        return _record_with_max_timestamp(directory, segments, base_offsets, log_start_offset)
    check(
        timestamp_ms >= 0,
        "log %s: offset for timestamp %d, not a ListOffsets value",
        directory,
        timestamp_ms,
    )
    for segment in segments:
        if segment.next_offset <= log_start_offset or segment.max_timestamp_ms < timestamp_ms:
            continue
        min_offset = log_start_offset
        # A batch the log start cuts may hold its records at or after the target only below
        # the log start: then the answer lies in a later batch.
        while (header := segment.find_by_timestamp(timestamp_ms, min_offset=min_offset)) is not None:
            found = _first_record_at_or_after(segment, header, timestamp_ms, log_start_offset)
            if found is not None:
                return found
            min_offset = header.next_offset
    return None


def _record_with_max_timestamp(
    directory: str, segments: Sequence[LogSegment], base_offsets: Sequence[int], log_start_offset: int
) -> tuple[int, int] | None:
    """(offset, timestamp) of the first record at or after the log start holding the
    largest timestamp there (Kafka's MAX_TIMESTAMP lookup, KIP-734); None for an empty log.

    A batch the log start cuts is decoded for the records it still holds; past it, the
    first batch with the largest max_timestamp holds the answer (a CreateTime batch's
    max_timestamp is its largest record timestamp: the leader sets it so on append).
    """
    start = log_start_offset
    best: tuple[int, int] | None = None
    cut = segment_and_batch(segments, base_offsets, log_start_offset, start)
    if cut is not None and cut[1].base_offset < start:
        best = _record_with_max_timestamp_in(cut[0], cut[1], start)
        start = cut[1].next_offset
    found = _first_batch_with_max_timestamp(segments, start)
    if found is None or (best is not None and found[1].max_timestamp <= best[1]):
        return best
    segment, header = found
    answer = _first_record_at_or_after(segment, header, header.max_timestamp, start)
    if answer is None:
        raise CorruptMessage(
            f"log {directory}: the batch at offset {header.base_offset} has max_timestamp "
            f"{header.max_timestamp} but none of its records has that timestamp; the stored batch "
            "disagrees with its header. Delete the replica so that it is copied again from the leader"
        )
    return answer


def _first_batch_with_max_timestamp(
    segments: Sequence[LogSegment], min_offset: int
) -> tuple[LogSegment, BatchHeader] | None:
    """The first batch with the largest max_timestamp among those starting at or after
    `min_offset` (a batch boundary); None if there are none."""
    best: tuple[LogSegment, BatchHeader] | None = None
    for segment in segments:
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


class LogReads(LogState):
    """The reads of `Log`: each checks that the log is readable, then asks the functions above."""

    def read(
        self,
        fetch_offset: int,
        *,
        max_bytes: int,
        max_offset: int | None = None,
        min_one_message: bool = True,
    ) -> FetchInfo:
        """Whole batches from the one holding `fetch_offset`, within max_bytes and below the
        exclusive max_offset (reads.read_batches has the rules). Raises OffsetOutOfRange when
        fetch_offset is outside [log_start_offset, LEO]."""
        self._check_readable()
        return read_batches(
            self._directory,
            self._segments,
            self._base_offsets,
            self._log_start_offset,
            fetch_offset,
            max_bytes=max_bytes,
            max_offset=max_offset,
            min_one_message=min_one_message,
        )

    def read_location(
        self,
        fetch_offset: int,
        *,
        max_bytes: int,
        max_offset: int | None = None,
        min_one_message: bool = True,
    ) -> LocatedRecords | None:
        """Where the bytes `read` would return lie in a segment file, without reading them (for
        short-circuit local reads; reads.locate_batches). None where `read` returns no records."""
        self._check_readable()
        return locate_batches(
            self._directory,
            self._segments,
            self._base_offsets,
            self._log_start_offset,
            fetch_offset,
            max_bytes=max_bytes,
            max_offset=max_offset,
            min_one_message=min_one_message,
        )

    def locate(self, offset: int) -> tuple[int, int, int] | None:
        """(segment base offset, byte position, batch base offset) of the batch holding `offset`.

        The index lookup plus short scan that a read starts with; None outside the log.
        For tools and benchmarks.
        """
        self._check_readable()
        found = segment_and_batch(self._segments, self._base_offsets, self._log_start_offset, offset)
        if found is None:
            return None
        segment, header = found
        return segment.base_offset, header.position, header.base_offset

    def batch_headers(self, start_offset: int | None = None) -> Iterator[BatchHeader]:
        """Headers of every batch from the one holding `start_offset` (default: the log start) to the LEO.

        Reads headers only (no records, no CRC): for rebuilding producer state (idempotence,
        DESIGN.md invariant 8) after open. Positions are within each batch's segment.
        The log must not change while the iterator is in use.
        """
        self._check_readable()
        offset = self._log_start_offset if start_offset is None else start_offset
        yield from batch_headers_from(self._segments, self._base_offsets, offset)

    def offset_for_timestamp(self, timestamp_ms: int) -> tuple[int, int] | None:
        """(offset, timestamp) of the first record with timestamp >= timestamp_ms, else None;
        ListOffsets' special timestamps as find_offset_for_timestamp says. Raises CorruptMessage
        if the found batch does not decode."""
        self._check_readable()
        return find_offset_for_timestamp(
            self._directory, self._segments, self._base_offsets, self._log_start_offset, timestamp_ms
        )
