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

The Log is one state with parts layered on it, one module each (as BrokerCore is
CoreState with its parts): state.py (the fields every part shares, the checks each public
method starts with, and the small files beside the segments: leader epoch checkpoint,
producer state snapshot, aborted transaction index, log start offset checkpoint);
appends.py (leader and follower appends, rolls, flushes); truncation.py (truncation,
DeleteRecords, retention); swap.py (swapping a cleaned segment in: the cleaner's
.cleaned -> .swap protocol, its commit point, its completion on open, and how zero-copy
readers stay right across it); reads.py (fetches, zero-copy locations, offset lookups,
ListOffsets by timestamp); and this module: opening (recovery.py holds the directory scan
and the segment recovery as functions) and closing, one log or many (close_logs).
Where a part's work is plain logic over segments it is a function beside its class, which
only checks the log's state and passes its fields in.
"""

from __future__ import annotations

import bisect
import logging
import os
from collections.abc import Callable
from pathlib import Path

from clients.common.errors import StorageError

from . import checkpoints, recovery, swap
from .appends import AppendInfo as AppendInfo
from .appends import LogAppends
from .checkpoints import (
    CLEAN_SHUTDOWN_MARKER,
    LEADER_EPOCH_CHECKPOINT,
    LOG_START_OFFSET_CHECKPOINT,
    PRODUCER_SNAPSHOT,
    RECOVERY_POINT_CHECKPOINT,
)
from .config import LogConfig
from .epoch_cache import LeaderEpochCache
from .reads import EARLIEST_TIMESTAMP as EARLIEST_TIMESTAMP
from .reads import LATEST_TIMESTAMP as LATEST_TIMESTAMP
from .reads import MAX_TIMESTAMP as MAX_TIMESTAMP
from .reads import FetchInfo as FetchInfo
from .reads import LocatedRecords as LocatedRecords
from .reads import LogReads
from .recovery import RecoveryReport as RecoveryReport
from .segment import LogSegment
from .storage import Storage
from .swap import LogSwaps
from .swap import PreparedSwap as PreparedSwap
from .swap import SegmentsChanged as SegmentsChanged
from .swap import SegmentView as SegmentView
from .truncation import LogTruncation

logger = logging.getLogger("highwater.log")

# close_logs writes the new files of a batched close here, under the sync root (the broker's
# data directory), and renames them into the logs' directories. Not a partition directory:
# those are "{topic}-{partition number}".
CLOSE_STAGING_DIR = ".close-staging"


class Log(LogAppends, LogTruncation, LogSwaps, LogReads):
    """One partition's log. Create with `Log.open`.

    Its state is LogState's (state.py); each part is a module of its own (this module's
    docstring lists them). This class opens the directory (recovery.py does the scan) and
    closes the log.
    """

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

    def _load(self, *, now_ms: int, recover: bool) -> None:
        """Open's work (recovery.py has the steps): complete or undo an interrupted swap, find the
        segments, recover what a crash may have torn, then settle the log start, the epoch
        cache, the recovery point and the aborted transactions on what was kept."""
        storage = self._storage
        storage.mkdir(self._directory)
        swap.finish_interrupted_swaps(storage, self._directory)
        bases, clean = recovery.list_segment_bases(storage, self._directory)
        saved = recovery.read_checkpoints(storage, self._directory)
        self._epoch_file_version = saved.epoch_file_version
        self._epoch_cache = LeaderEpochCache(
            saved.epoch_entries, log_end_offset=lambda: self.log_end_offset, persist=self._persist_epochs
        )
        if not bases:
            bases = [saved.log_start_offset or 0]
        segments = [
            LogSegment(storage, self._directory, base, self._config, active=(i == len(bases) - 1))
            for i, base in enumerate(bases)
        ]
        first_recovered = len(segments)
        if recover and not clean:
            first_recovered = max(0, bisect.bisect_right(bases, saved.recovery_point) - 1)
        found = recovery.recover_segments(
            self._directory,
            segments,
            first_recovered=first_recovered,
            epoch_cache=self._epoch_cache,
            # Holes are legal only in a log that is or was compacted (_checkpoint_version); in
            # any other a gap is damage, cut at as before compaction existed.
            holes_allowed=self._checkpoint_version == checkpoints.CHECKPOINT_VERSION_HOLES,
        )
        kept = found.kept
        self._segments = kept
        self._base_offsets = [segment.base_offset for segment in kept]
        for segment in kept[:-1]:
            segment.make_inactive()
        kept[-1].make_active()
        if not found.bytes_dropped and saved.recovery_point > self.log_end_offset:
            # A cleaned segment may end in a hole (its last records removed); when the segments
            # after it were lost unflushed, the log would end in that hole, below offsets that
            # were durable (the recovery point), and the next append would reuse committed
            # offsets (tests/sim/test_cleaner_sim.py, seed 2343). The log ends there at least.
            if self._segments[-1].is_empty:
                self._restart_empty_active_at(saved.recovery_point)
            else:
                self.roll(now_ms, base_offset=saved.recovery_point)
        self._settle_log_start(saved.log_start_offset)
        if found.segments_recovered or found.bytes_dropped:
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
            clean,
            found.segments_recovered,
            found.bytes_scanned,
            found.bytes_dropped,
            found.segments_dropped,
            found.reason,
        )
        if found.bytes_scanned and not clean:
            logger.info(
                "log %s: recovered %d segment(s), scanned %d bytes, dropped %d bytes; offsets [%d, %d)",
                self._directory,
                found.segments_recovered,
                found.bytes_scanned,
                found.bytes_dropped,
                self._log_start_offset,
                self.log_end_offset,
            )

    def _settle_log_start(self, log_start_checkpoint: int | None) -> None:
        """On open: the log start is the checkpoint's, or the first kept segment's base if
        higher; past the LEO (recovery cut below it) the log starts empty there."""
        leo = self.log_end_offset
        self._epoch_cache.truncate_from_end(leo)
        self._log_start_offset = max(log_start_checkpoint or 0, self._segments[0].base_offset)
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
            checkpoints.write_offset(
                self._storage, self._path(LOG_START_OFFSET_CHECKPOINT), self._log_start_offset
            )
        self._log_start_offset_on_disk = self._log_start_offset

    def set_config(self, config: LogConfig) -> None:
        """Take a topic's changed config (AlterConfigs): the next append, roll and retention pass
        use it. Segments keep a reference to the config, so each is given the new one; records
        already written stay as they are (a lower max.message.bytes refuses only new batches)."""
        self._config = config
        for segment in self._segments:
            segment.config = config
        self._mark_holes_possible()

    # --- closing ------------------------------------------------------------------------

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
