"""The state every part of a partition's Log shares, and the small files that hold it.

DESIGN.md section 5. `Log` (log.py) is this state with its parts layered on it, one module
each, as BrokerCore is CoreState with its parts (services/broker/core_state.py):
appends.py (appends, rolls, flushes), truncation.py (truncation, DeleteRecords, retention),
swap.py (the cleaner's swap), reads.py (reads and offset lookups), and log.py itself (open,
recovery's settling, close). Each part reads and changes only the fields declared here.

Kept here: the fields (segments and their base offsets, the log start offset, the recovery
point, the epoch cache, the offline state), the checks every public method starts with, and
the small files beside the segments: the leader epoch checkpoint's version, the producer
state snapshot, the aborted transaction index, the log start offset checkpoint. Owned by the
partition's task (log.py's docstring has the ownership and thread rules).
"""

from __future__ import annotations

import os
from collections.abc import Callable

from clients.common.errors import StorageError, check

from . import checkpoints, recovery
from .checkpoints import (
    ABORTED_TXN_INDEX,
    LEADER_EPOCH_CHECKPOINT,
    LOG_START_OFFSET_CHECKPOINT,
    PRODUCER_SNAPSHOT,
)
from .config import LogConfig
from .epoch_cache import LeaderEpochCache
from .recovery import RecoveryReport
from .segment import LogSegment
from .storage import Storage
from .txn_index import AbortedTxn, AbortedTxnIndex


class LogState:
    """The fields of one partition's log and what every part of it shares; see `Log`."""

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

    def _path(self, name: str) -> str:
        return os.path.join(self._directory, name)

    @property
    def directory(self) -> str:
        return self._directory

    @property
    def config(self) -> LogConfig:
        return self._config

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

    @property
    def storage(self) -> Storage:
        """The storage the log lives on: the cleaner reads old segments and writes cleaned ones there."""
        return self._storage

    @property
    def is_closed(self) -> bool:
        return self._closed

    @property
    def is_offline(self) -> bool:
        return self._offline_reason is not None

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

    # --- the leader epoch checkpoint ----------------------------------------------------

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
        """Read the index, without what recovery cut off or retention passed (an unreadable one
        is rebuilt: recovery.read_aborted_txns says how)."""
        aborted = recovery.read_aborted_txns(self._storage, self._directory)
        if aborted is None:
            return
        self._aborted = aborted
        cut = aborted.truncate_from(self.log_end_offset)
        if aborted.drop_below(self._log_start_offset) or cut:
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

    # --- the log start offset -----------------------------------------------------------

    def _set_log_start_offset(self, offset: int) -> None:
        """Move the log start and write its checkpoint at once, before the caller deletes what
        lies below it (a crash then leaves those offsets unreadable, never readable again).
        Moving forward, the producer state snapshot is written first: the batches it replaces
        may be deleted next."""
        if offset > self._log_start_offset:
            self._write_producer_snapshot()
            if self._aborted.drop_below(offset):
                self._write_aborted_txns()
        self._log_start_offset = offset
        checkpoints.write_offset(self._storage, self._path(LOG_START_OFFSET_CHECKPOINT), offset)
        self._log_start_offset_on_disk = offset
