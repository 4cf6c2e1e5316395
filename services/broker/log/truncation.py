"""Cutting a partition's Log: truncation at either end, DeleteRecords and retention.

DESIGN.md section 5. Neither the log start offset nor the LEO goes down except through
truncate_to / truncate_fully_and_start_at, which the replication layer calls deliberately;
the log start moves up through advance_log_start_offset (DeleteRecords) and retention, which
deletes whole inactive segments only, never at or above the high watermark. Every move is
made durable before the data it drops goes (the checkpoint first, then the files).
A part of `Log` (log.py); runs on the partition's task only.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable

from clients.common.errors import OffsetOutOfRange, check

from . import checkpoints
from .checkpoints import RECOVERY_POINT_CHECKPOINT
from .segment import LogSegment
from .state import LogState

# A retention rule: (segment, base offset of the next segment) -> delete it?
_Breach = Callable[[LogSegment, int], bool]


class LogTruncation(LogState):
    """Truncation, DeleteRecords and retention of `Log`."""

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
