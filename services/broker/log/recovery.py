"""Opening a partition log's directory: what is on disk, and what of it survives recovery.

DESIGN.md section 5 and section 8's invariants. Log.open runs, in order: the swap module's
finish_interrupted_swaps (a cleaned segment's swap completed or undone), list_segment_bases
(leftover temp files and orphan indexes removed), read_checkpoints, then recover_segments,
which scans the segments a crash may have torn and cuts at the first unsound batch. The Log
then settles its offsets (log start, recovery point) from what was kept.

Runs on the log's owner (the partition's task, or the broker's start-up) through the
Storage seam: no clock, no threads.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

from . import checkpoints
from .checkpoints import (
    ABORTED_TXN_INDEX,
    CLEAN_SHUTDOWN_MARKER,
    LEADER_EPOCH_CHECKPOINT,
    LOG_START_OFFSET_CHECKPOINT,
    PRODUCER_SNAPSHOT,
    RECOVERY_POINT_CHECKPOINT,
)
from .epoch_cache import LeaderEpochCache
from .segment import INDEX_SUFFIX, LOG_SUFFIX, TIME_INDEX_SUFFIX, LogSegment, parse_segment_file_name
from .storage import TEMP_SUFFIX, Storage
from .txn_index import AbortedTxnIndex, UnreadableTxnIndex

logger = logging.getLogger("highwater.log")


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
class SavedCheckpoints:
    """The log's checkpoint files as the last run left them."""

    # None when the file is missing.
    log_start_offset: int | None
    recovery_point: int
    epoch_entries: list[tuple[int, int]]
    # The leader epoch checkpoint's version line (Log._checkpoint_version says why it matters).
    epoch_file_version: int


@dataclass(frozen=True, slots=True)
class RecoveredSegments:
    """What recover_segments kept (at least one segment) and what it cut."""

    kept: list[LogSegment]
    segments_recovered: int
    bytes_scanned: int
    bytes_dropped: int
    segments_dropped: int
    # Why the log was cut ("" when nothing was).
    reason: str


def list_segment_bases(storage: Storage, directory: str) -> tuple[list[int], bool]:
    """(the base offsets of the segments' .log files in order, whether the clean-shutdown marker
    is there). Deletes what a crash left half made: temp files of atomic writes, and indexes of
    segments deleted before the crash."""
    names = storage.list_dir(directory)
    bases: list[int] = []
    for name in names:
        parsed = parse_segment_file_name(name)
        if name.endswith(TEMP_SUFFIX):
            storage.delete(os.path.join(directory, name))
        elif parsed is not None and parsed[1] == LOG_SUFFIX:
            bases.append(parsed[0])
    bases.sort()
    for name in names:
        parsed = parse_segment_file_name(name)
        if parsed is not None and parsed[1] in (INDEX_SUFFIX, TIME_INDEX_SUFFIX) and parsed[0] not in bases:
            storage.delete(os.path.join(directory, name))  # orphan index of a segment deleted before a crash
    return bases, CLEAN_SHUTDOWN_MARKER in names


def read_checkpoints(storage: Storage, directory: str) -> SavedCheckpoints:
    epoch_path = os.path.join(directory, LEADER_EPOCH_CHECKPOINT)
    entries = checkpoints.read_entries(storage, epoch_path, fields_per_entry=2) or []
    return SavedCheckpoints(
        log_start_offset=checkpoints.read_offset(
            storage, os.path.join(directory, LOG_START_OFFSET_CHECKPOINT)
        ),
        recovery_point=checkpoints.read_offset(storage, os.path.join(directory, RECOVERY_POINT_CHECKPOINT))
        or 0,
        epoch_entries=[(epoch, start) for epoch, start in entries],
        epoch_file_version=checkpoints.read_version(storage, epoch_path) or checkpoints.CHECKPOINT_VERSION,
    )


def recover_segments(
    directory: str,
    segments: list[LogSegment],
    *,
    first_recovered: int,
    epoch_cache: LeaderEpochCache,
    holes_allowed: bool,
) -> RecoveredSegments:
    """Keep the sound prefix of `segments` (in offset order): every one from `first_recovered`
    on, and any whose index is suspect or whose tail does not end where its file does, is
    scanned batch by batch (LogSegment.recover); the first unsound batch and everything after
    it is cut, later segments' files deleted. Epoch starts found by a scan go to `epoch_cache`.

    Segments must not overlap, and without `holes_allowed` (a log never compacted) must be
    contiguous: a gap there is damage and is cut at.
    """
    kept: list[LogSegment] = []
    scanned = dropped = recovered_count = 0
    reason = ""
    latest_epoch: int | None = None
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
                latest_epoch = epoch_cache.epoch_for_offset(segment.base_offset)
            result = segment.recover(latest_epoch=latest_epoch, holes_allowed=holes_allowed)
            recovered_count += 1
            scanned += result.valid_bytes + result.dropped_bytes
            for epoch, start_offset in result.epoch_starts:
                if latest_epoch is None or epoch > latest_epoch:
                    latest_epoch = epoch
                epoch_cache.assign(epoch, start_offset)
            if result.dropped_bytes:
                dropped += result.dropped_bytes
                reason = result.reason
                kept.append(segment)
                logger.warning(
                    "log %s: dropped %d bytes at byte %d of segment %d (%s)",
                    directory,
                    result.dropped_bytes,
                    result.valid_bytes,
                    segment.base_offset,
                    result.reason,
                )
                break
        kept.append(segment)
    for segment in reversed(segments[len(kept) :]):
        dropped += segment.size_bytes
        logger.warning(
            "log %s: dropped segment %d (%d bytes) after the damage (%s)",
            directory,
            segment.base_offset,
            segment.size_bytes,
            reason,
        )
        segment.delete_files()
    return RecoveredSegments(kept, recovered_count, scanned, dropped, len(segments) - len(kept), reason)


def read_aborted_txns(storage: Storage, directory: str) -> AbortedTxnIndex | None:
    """The aborted transaction index as its file holds it; None when there is none, or when it is
    unreadable: then it is deleted, and the producer state snapshot too, so the partition's
    rebuild replays every batch of the log and meets every ABORT marker still in it again."""
    path = os.path.join(directory, ABORTED_TXN_INDEX)
    if not storage.exists(path):
        return None
    try:
        return AbortedTxnIndex.decode(storage.read_file(path))
    except UnreadableTxnIndex as exc:
        logger.warning("log %s: aborted transaction index: %s; rebuilding it from the log", directory, exc)
        storage.delete(path)
        snapshot = os.path.join(directory, PRODUCER_SNAPSHOT)
        if storage.exists(snapshot):
            storage.delete(snapshot)
        return None
