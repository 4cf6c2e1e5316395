"""Appending to a partition's Log: leader and follower appends, segment rolls, flushes.

DESIGN.md section 5 and section 8's invariants: offsets strictly increase (a leader's appends
are contiguous from the LEO; a follower copies its leader's holes), leader epochs never
decrease, and nothing invalid reaches a segment (a batch is written only after its CRC and
header checks pass). A write that fails takes the log offline (LogState._ensure_usable).
A part of `Log` (log.py); runs on the partition's task only.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from clients.common.errors import StorageError, check
from clients.common.record_batch import (
    BatchHeader,
    Buffer,
    assign_offsets,
    validate_batches,
    with_assigned_offset,
)

from . import checkpoints
from .checkpoints import RECOVERY_POINT_CHECKPOINT
from .segment import RELATIVE_OFFSET_MAX, LogSegment
from .state import LogState

logger = logging.getLogger("highwater.log")


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


class LogAppends(LogState):
    """Appends, rolls and flushes of `Log`."""

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

    # --- segments -----------------------------------------------------------------------

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
        active = self._segments[-1]
        if active.is_empty:
            return False  # never rolled (should_roll says so too): most of an idle broker's replicas
        if active.should_roll(0, max(active.base_offset, active.next_offset - 1), now_ms):
            self.roll(now_ms)
            return True
        return False

    # --- durability ---------------------------------------------------------------------

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
