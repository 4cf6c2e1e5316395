"""The aborted-transaction index of one partition log (Kafka's .txnindex): pure, no I/O.

Each entry is one aborted transaction of one producer: its first offset, the offset of the
ABORT marker that ended it (last_offset), and the last stable offset once it ended. A
read_committed Fetch answers, beside the records, the aborted transactions that overlap
what it returns; the consumer drops those producers' batches in those ranges (Kafka's
FetchResponse aborted_transactions).

Entries are Kafka's 34-byte .txnindex entries (version int16 = 0, producer id int64, first
offset int64, last offset int64, last stable offset int64), in the order the markers were
written, so by last_offset. One file per partition rather than one per segment, written
whole and atomically at every change: aborts are rare next to data, so a rewrite per abort
costs little, and there is no per-segment index to keep in step with segment rolls,
retention, truncation and the cleaner's swaps (docs/ARCHITECTURE.md, Departures).
Entries below the log start are dropped when the file is next written.
"""

from __future__ import annotations

import bisect
import struct
from dataclasses import dataclass

from clients.common.errors import InvariantViolation, check

TXN_INDEX_ENTRY_VERSION = 0
_ENTRY = struct.Struct(">hqqqq")
TXN_INDEX_ENTRY_BYTES = _ENTRY.size  # 34, as Kafka's


class UnreadableTxnIndex(ValueError):
    """The file is not a whole number of entries, or holds an entry of an unknown version."""


@dataclass(frozen=True, slots=True)
class AbortedTxn:
    producer_id: int
    first_offset: int
    last_offset: int  # the ABORT marker's offset
    last_stable_offset: int


class AbortedTxnIndex:
    def __init__(self, entries: list[AbortedTxn] | None = None) -> None:
        self._entries: list[AbortedTxn] = list(entries or [])
        self._last_offsets = [e.last_offset for e in self._entries]
        check(self._last_offsets == sorted(self._last_offsets), "aborted transactions out of marker order")

    def __len__(self) -> int:
        return len(self._entries)

    def entries(self) -> list[AbortedTxn]:
        return list(self._entries)

    def append(self, entry: AbortedTxn) -> bool:
        """Add the transaction a marker aborted. False when it is there already (the producer
        state replays batches after a restart, and meets the same markers again)."""
        if self._last_offsets and entry.last_offset <= self._last_offsets[-1]:
            # Its marker must be in the index. Only the marker identifies it: a replay that
            # started past the transaction's first batch finds a later first offset.
            i = bisect.bisect_left(self._last_offsets, entry.last_offset)
            check(
                i < len(self._entries)
                and (self._entries[i].producer_id, self._entries[i].last_offset)
                == (entry.producer_id, entry.last_offset),
                "aborted transaction %s is below the index's last marker %d and not in it",
                entry,
                self._last_offsets[-1],
            )
            return False
        self._entries.append(entry)
        self._last_offsets.append(entry.last_offset)
        return True

    def collect(self, fetch_offset: int, upper_bound_offset: int) -> list[AbortedTxn]:
        """The aborted transactions that overlap [fetch_offset, upper_bound_offset): ended at or
        after the first offset read, begun before the end of what is read."""
        i = bisect.bisect_left(self._last_offsets, fetch_offset)
        return [e for e in self._entries[i:] if e.first_offset < upper_bound_offset]

    def truncate_from(self, offset: int) -> bool:
        """Forget transactions whose marker is at or above `offset` (the log was cut there)."""
        i = bisect.bisect_left(self._last_offsets, offset)
        if i == len(self._entries):
            return False
        del self._entries[i:], self._last_offsets[i:]
        return True

    def drop_below(self, log_start_offset: int) -> bool:
        """Forget transactions whose marker is below the log start (no fetch can reach them)."""
        i = bisect.bisect_left(self._last_offsets, log_start_offset)
        if i == 0:
            return False
        del self._entries[:i], self._last_offsets[:i]
        return True

    def encode(self) -> bytes:
        return b"".join(
            _ENTRY.pack(
                TXN_INDEX_ENTRY_VERSION, e.producer_id, e.first_offset, e.last_offset, e.last_stable_offset
            )
            for e in self._entries
        )

    @classmethod
    def decode(cls, data: bytes) -> AbortedTxnIndex:
        if len(data) % TXN_INDEX_ENTRY_BYTES:
            raise UnreadableTxnIndex(
                f"{len(data)} bytes is not a whole number of {TXN_INDEX_ENTRY_BYTES}-byte entries"
            )
        entries = []
        for version, producer_id, first, last, lso in _ENTRY.iter_unpack(data):
            if version != TXN_INDEX_ENTRY_VERSION:
                raise UnreadableTxnIndex(
                    f"entry version {version}; this release reads {TXN_INDEX_ENTRY_VERSION}"
                )
            entries.append(AbortedTxn(producer_id, first, last, lso))
        try:
            return cls(entries)
        except InvariantViolation as exc:  # entries out of marker order: the file is damaged
            raise UnreadableTxnIndex(str(exc)) from exc
