"""Leader epoch -> start offset, the lineage the fetcher uses to truncate safely (KIP-101).

Kept as Kafka's LeaderEpochFileCache: entries sorted by epoch and by start offset, both
strictly increasing. Changes go through `persist` (the Log writes `leader-epoch-checkpoint`
atomically, with an fsync); they happen once per new leader epoch or truncation, not per
append.

When a change must reach the disk:
- a truncation (truncate_from_end / truncate_from_start / clear) is persisted at once: a
  stale file could bring back epochs of data that is gone;
- a new entry (assign) is only marked dirty and persisted by `persist_if_dirty`, which the
  Log calls before it moves its recovery point (flush, close, the end of a load). Until
  then the entry is needed only for offsets past the recovery point, and recovery after a
  crash rebuilds exactly those entries from the batches' partitionLeaderEpoch. An entry of
  an epoch that got no data before a crash may be lost, which is harmless: no replica
  holds data of that epoch. This keeps an fsync per partition off a LeaderAndIsr that
  makes a broker leader of a thousand partitions (about 0.6 ms each on our disks).

Owned by the Log, hence by the task that owns the partition: no locks.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable

from clients.common.errors import check

UNDEFINED_EPOCH = -1
UNDEFINED_EPOCH_OFFSET = -1


class LeaderEpochCache:
    """Epoch entries (epoch, start_offset): the epoch's first offset in this log.

    Invariant: epochs strictly increase and start offsets strictly increase along the list.
    """

    def __init__(
        self,
        entries: list[tuple[int, int]],
        *,
        log_end_offset: Callable[[], int],
        persist: Callable[[list[tuple[int, int]]], None],
    ) -> None:
        self._epochs: list[int] = []
        self._start_offsets: list[int] = []
        self._log_end_offset = log_end_offset
        self._persist = persist
        self._dirty = False
        for epoch, start_offset in entries:
            self._assign_in_memory(epoch, start_offset)

    @property
    def dirty(self) -> bool:
        """An assigned entry is not on disk yet."""
        return self._dirty

    # --- queries ----------------------------------------------------------------------

    def entries(self) -> list[tuple[int, int]]:
        return list(zip(self._epochs, self._start_offsets, strict=True))

    def latest_epoch(self) -> int | None:
        return self._epochs[-1] if self._epochs else None

    def epoch_for_offset(self, offset: int) -> int | None:
        """The epoch whose range holds `offset`, None if it lies before the first entry."""
        index = bisect.bisect_right(self._start_offsets, offset) - 1
        return self._epochs[index] if index >= 0 else None

    def end_offset_for_epoch(self, requested_epoch: int) -> tuple[int, int]:
        """(epoch, end offset) as Kafka's OffsetsForLeaderEpoch answers it.

        - the latest epoch: (latest, LEO);
        - an older epoch: (the largest known epoch <= requested, start offset of the next
          higher epoch), or (requested, start of the first epoch) if none is <= requested;
        - unknown (above every epoch, empty cache, or UNDEFINED_EPOCH): (-1, -1).
        """
        if requested_epoch == UNDEFINED_EPOCH or not self._epochs:
            return UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET
        if requested_epoch == self._epochs[-1]:
            return requested_epoch, self._log_end_offset()
        higher = bisect.bisect_right(self._epochs, requested_epoch)
        if higher == len(self._epochs):
            return UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET
        if higher == 0:
            return requested_epoch, self._start_offsets[0]
        return self._epochs[higher - 1], self._start_offsets[higher]

    # --- changes ----------------------------------------------------------------------

    def assign(self, epoch: int, start_offset: int) -> None:
        """Record that `epoch` starts at `start_offset` (no-op if it is already the latest).

        As Kafka: entries with an epoch >= `epoch` or a start offset >= `start_offset`
        are dropped first, so the list stays strictly increasing in both.
        """
        check(
            epoch >= 0 and start_offset >= 0,
            "assign epoch %d at offset %d: both must be >= 0",
            epoch,
            start_offset,
        )
        if self._epochs and self._epochs[-1] == epoch and self._start_offsets[-1] <= start_offset:
            return
        self._assign_in_memory(epoch, start_offset)
        self._dirty = True

    def persist_if_dirty(self) -> bool:
        """Write the entries if an assign is not on disk yet; True if it wrote."""
        if not self._dirty:
            return False
        self._write()
        return True

    def mark_persisted(self) -> None:
        """The entries were written by the Log itself (a batched clean close, log.close_logs)."""
        self._dirty = False

    def _write(self) -> None:
        self._persist(self.entries())
        self._dirty = False

    def truncate_from_end(self, end_offset: int) -> None:
        """Drop epochs starting at or after `end_offset` (the log was truncated to it)."""
        keep = bisect.bisect_left(self._start_offsets, end_offset)
        if keep < len(self._epochs):
            del self._epochs[keep:]
            del self._start_offsets[keep:]
            self._write()

    def truncate_from_start(self, start_offset: int) -> None:
        """Forget epochs wholly before `start_offset`; the one holding it now starts there."""
        floor = bisect.bisect_right(self._start_offsets, start_offset) - 1
        if floor < 0 or (floor == 0 and self._start_offsets[0] == start_offset):
            return
        del self._epochs[:floor]
        del self._start_offsets[:floor]
        self._start_offsets[0] = start_offset
        self._write()

    def clear(self) -> None:
        if self._epochs:
            self._epochs.clear()
            self._start_offsets.clear()
            self._write()

    def _assign_in_memory(self, epoch: int, start_offset: int) -> None:
        while self._epochs and (self._epochs[-1] >= epoch or self._start_offsets[-1] >= start_offset):
            self._epochs.pop()
            self._start_offsets.pop()
        self._epochs.append(epoch)
        self._start_offsets.append(start_offset)
