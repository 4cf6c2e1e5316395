"""Swapping a cleaned segment in for the segments it replaces (Kafka's .cleaned -> .swap protocol).

DESIGN.md section 5, issue 39. The Log's replace_segments / prepare_swap / commit_swap run
these steps; its open completes an interrupted swap with finish_interrupted_swaps.

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
reader (read_location, clients/common/transport/local_reads.py) opens the path later and checks the file's
device and inode against the location: after a swap the path names a new inode (the
cleaned file was created while the old one still existed, so it cannot reuse its number),
and the reader gets NotReadableHere and fetches the bytes instead; one that opened the old
file before it was deleted reads the old bytes, which were right for those offsets.

Thread rules: prepare_swap, discard_prepared, delete_cleaned and PreparedSwap.close may run
on the cleaner's thread (they touch only the cleaned segment's files and handles of their
own, opened directly on the storage); everything else here runs on the log's owner (the
event loop), as the Log does.
"""

from __future__ import annotations

import bisect
import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass

from clients.common.errors import CorruptMessage, StorageError, check
from clients.common.record_batch import BATCH_HEADER_SIZE, peek_batch_extent, valid_prefix

from .config import LogConfig
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
from .state import LogState
from .storage import Storage, StorageFile

logger = logging.getLogger("highwater.log")

# A cleaned segment's files before the swap: "{base}.cleaned.log" (the cleaner writes it)
# with ".cleaned.index" / ".cleaned.timeindex" (prepare_swap writes them).
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


def cleaned_log_path(directory: str, base_offset: int) -> str:
    """Where the cleaner writes the cleaned segment replacing those from `base_offset` on."""
    return os.path.join(directory, segment_file_name(base_offset, CLEANED_STEM_SUFFIX + LOG_SUFFIX))


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


def segment_view(segments: Sequence[LogSegment], base_offsets: Sequence[int], index: int) -> SegmentView:
    """The inactive segment `index` as the cleaner sees it (there is a segment after it)."""
    segment = segments[index]
    return SegmentView(
        base_offset=segment.base_offset,
        next_offset=segment.next_offset,
        end_offset=base_offsets[index + 1],
        path=segment.log_path,
        size_bytes=segment.size_bytes,
        max_timestamp_ms=segment.max_timestamp_ms,
    )


def matching_run(
    directory: str, segments: Sequence[LogSegment], base_offsets: Sequence[int], old: Sequence[SegmentView]
) -> int:
    """Step 1: the index of old[0] among the segments if `old` is still a run of inactive segments
    as they were seen; else SegmentsChanged."""
    first = bisect.bisect_left(base_offsets, old[0].base_offset)
    if first + len(old) < len(segments) and all(
        segment_view(segments, base_offsets, first + i) == view for i, view in enumerate(old)
    ):
        return first
    raise SegmentsChanged(
        f"log {directory}: segments [{old[0].base_offset}, {old[-1].end_offset}) changed "
        "since the cleaner read them (retention, DeleteRecords or truncation ran meanwhile, or "
        "one became active); delete the cleaned file and clean them again"
    )


def prepare_cleaned(
    storage: Storage, directory: str, old: Sequence[SegmentView], config: LogConfig
) -> PreparedSwap:
    """Step 2 (Log.prepare_swap says when it runs and on which thread). Raises CorruptMessage
    (the cleaned files deleted) when the cleaned file is not sound batches within the range;
    StorageError when it is missing or a write fails (the caller deletes what is left; the
    next open does too)."""
    base, end = old[0].base_offset, old[-1].end_offset
    stem = segment_file_name(base, CLEANED_STEM_SUFFIX)
    log_path = cleaned_log_path(directory, base)
    for suffix in (INDEX_SUFFIX, TIME_INDEX_SUFFIX):
        storage.delete(os.path.join(directory, stem + suffix))  # an earlier attempt's
    if not storage.exists(log_path):
        raise StorageError(
            f"log {directory}: no cleaned segment at {log_path}; the cleaner writes it before the swap"
        )
    if end - 1 - base > RELATIVE_OFFSET_MAX:
        problem = f"its range [{base}, {end}) is too long for the index's int32 relative offsets"
        scan = _CleanedScan(0, base, problem)
    else:
        try:
            scan = _scan_cleaned(storage, log_path, os.path.join(directory, stem), base, end, config)
        except BaseException:
            delete_cleaned(storage, directory, stem)
            raise
    if scan.problem:
        delete_cleaned(storage, directory, stem)
        raise CorruptMessage(
            f"log {directory}: the cleaned segment for [{base}, {end}) is refused and deleted: "
            f"{scan.problem}. The old segments stay; this is a cleaner bug or a disk fault"
        )
    return PreparedSwap(tuple(old), base, end, scan.size_bytes, scan.next_offset, _hold(storage, old))


def discard_cleaned(storage: Storage, directory: str, prepared: PreparedSwap) -> None:
    """Delete a prepared swap's files (it will not be committed) and close what it holds."""
    prepared.close()
    delete_cleaned(storage, directory, segment_file_name(prepared.base_offset, CLEANED_STEM_SUFFIX))


def delete_cleaned(storage: Storage, directory: str, stem: str) -> None:
    """Best effort: what is left is deleted by the next open (an uncommitted swap's files)."""
    try:
        for suffix in (LOG_SUFFIX, INDEX_SUFFIX, TIME_INDEX_SUFFIX):
            storage.delete(os.path.join(directory, stem + suffix))
    except (StorageError, OSError) as error:
        logger.warning("log %s: cannot delete the cleaned segment %s (%s)", directory, stem, error)


def commit_files(
    storage: Storage,
    directory: str,
    replaced: Sequence[LogSegment],
    prepared: PreparedSwap,
    config: LogConfig,
) -> tuple[LogSegment, int]:
    """Steps 3-6 on disk: the commit rename, closing the `replaced` segments, swap_in; then the new
    segment opened. Returns it and the byte size its load_tail found, for the caller to check
    against the scan. Raises StorageError / OSError (the caller takes the log offline)."""
    base, end = prepared.base_offset, prepared.end_offset
    # 3. The commit point: from here on, the new segment is the log.
    storage.rename(cleaned_log_path(directory, base), os.path.join(directory, swap_file_name(base, end)))
    for segment in replaced:
        segment.close()
    swap_in(storage, directory, base, end)  # 4-6
    # Inactive: its index stays on disk (prepare_swap wrote it); load_tail reads the
    # last entries and the bytes after the last offset entry only (at most about
    # index_interval_bytes and a batch), so this costs no scan of the file.
    segment = LogSegment(storage, directory, base, config, active=False)
    return segment, segment.load_tail()


def swap_in(storage: Storage, directory: str, base: int, end: int) -> None:
    """Steps 4-6 of the swap of `{base}.{end}.swap`: each idempotent, so recovery repeats them all."""
    replaced: list[tuple[int, str, str]] = []
    for name in storage.list_dir(directory):
        parsed = parse_segment_file_name(name)
        if parsed is not None and base <= parsed[0] < end:
            replaced.append((parsed[0], parsed[1], name))
    for _, suffix, name in replaced:
        if suffix == LOG_SUFFIX:
            storage.delete(os.path.join(directory, name))
    for segment_base, suffix, name in replaced:
        if suffix in (INDEX_SUFFIX, TIME_INDEX_SUFFIX) and segment_base != base:
            storage.delete(os.path.join(directory, name))
    stem = segment_file_name(base, CLEANED_STEM_SUFFIX)
    for suffix in (INDEX_SUFFIX, TIME_INDEX_SUFFIX):
        cleaned_index = os.path.join(directory, stem + suffix)
        if storage.exists(cleaned_index):
            storage.rename(cleaned_index, os.path.join(directory, segment_file_name(base, suffix)))
    storage.rename(
        os.path.join(directory, swap_file_name(base, end)),
        os.path.join(directory, segment_file_name(base, LOG_SUFFIX)),
    )


def finish_interrupted_swaps(storage: Storage, directory: str) -> None:
    """On open: complete every committed swap, then delete what uncommitted ones left."""
    for name in storage.list_dir(directory):
        swap = parse_swap_file_name(name)
        if swap is not None:
            logger.warning(
                "log %s: completing the interrupted swap of the cleaned segment for offsets [%d, %d)",
                directory,
                *swap,
            )
            swap_in(storage, directory, *swap)
    for name in storage.list_dir(directory):
        parsed = parse_segment_file_name(name)
        if parsed is not None and parsed[1].startswith(CLEANED_STEM_SUFFIX + "."):
            storage.delete(os.path.join(directory, name))  # an uncommitted swap: the old segments are whole


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


class LogSwaps(LogState):
    """The swap as `Log` offers it to the cleaner (services/broker/log_cleaner.py): the views of
    its inactive segments and the steps above, on the log's own state."""

    def segments_for_cleaning(self) -> list[SegmentView]:
        """Every segment but the active one, oldest first."""
        self._check_readable()
        return [segment_view(self._segments, self._base_offsets, i) for i in range(len(self._segments) - 1)]

    def cleaned_segment_path(self, base_offset: int) -> str:
        """Where the cleaner writes the cleaned segment replacing those from `base_offset` on."""
        return cleaned_log_path(self._directory, base_offset)

    def replace_segments(self, old: Sequence[SegmentView], now_ms: int) -> None:
        """Swap the cleaned file at cleaned_segment_path(old[0].base_offset) in for the segments `old`.

        `old`: a run of adjacent inactive segments, as segments_for_cleaning gave them. The
        cleaner has written and fsynced the cleaned file: batches in increasing offset
        order, every offset within [old[0].base_offset, old[-1].end_offset), holes allowed.
        The new segment has the same base offset and covers the same range; every record it
        holds reads back at its offset. Crash-safe at every step (swap.py).

        prepare_swap then commit_swap in one call, all on the caller's thread (tests, tools; the
        cleaner splits them: the scan and the index writes off the loop). Raises SegmentsChanged
        (nothing done, the cleaned file left to the caller) when `old` no longer matches the
        log, and CorruptMessage (the cleaned files deleted, nothing else done) when the cleaned
        file does not hold sound batches within the range. A storage failure after the commit
        point takes the log offline: its next open completes the swap.
        """
        self._ensure_usable()
        check(bool(old), "log %s: replace_segments of no segment", self._directory)
        matching_run(self._directory, self._segments, self._base_offsets, old)
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
        return prepare_cleaned(self._storage, self._directory, old, config)

    def discard_prepared(self, prepared: PreparedSwap) -> None:
        """Delete a prepared swap's files (it will not be committed) and close what it holds.
        Thread-safe as prepare_swap."""
        discard_cleaned(self._storage, self._directory, prepared)

    def commit_swap(self, prepared: PreparedSwap, now_ms: int) -> None:
        """Steps 3-6 of the swap on the loop: the commit rename, the old segments' deletes, the
        renames, the in-memory update. Raises SegmentsChanged, with the prepared files deleted,
        when the segments prepare_swap saw are no longer the log's (retention, DeleteRecords or
        truncation ran meanwhile). A storage failure after the commit point takes the log
        offline: its next open completes the swap."""
        self._ensure_usable()
        old, base, end = prepared.old, prepared.base_offset, prepared.end_offset
        try:
            first = matching_run(self._directory, self._segments, self._base_offsets, old)
        except SegmentsChanged:
            self.discard_prepared(prepared)
            raise
        replaced = self._segments[first : first + len(old)]
        try:
            segment, tail = commit_files(self._storage, self._directory, replaced, prepared, self._config)
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
