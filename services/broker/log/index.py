"""Sparse per-segment indexes: offset -> byte position, and timestamp -> offset.

Both are append-only files of fixed-size big-endian entries, as Kafka's:

- `.index`: (relative_offset int32, position int32). An entry names the first batch
  written after at least `index_interval_bytes` of log since the previous entry, so a
  lookup is a binary search followed by a scan of at most that many bytes (plus a batch).
  Offsets may have holes (a compacted log, issue 39): keys only strictly increase, and a
  lookup of an offset in a hole finds the entry at or before it, from which the scan
  reaches the first batch after the hole.
- `.timeindex`: (timestamp int64, relative_offset int32). An entry is written next to
  an offset entry when the segment's largest timestamp so far grew: all batches up to
  and including the one at `relative_offset` have max_timestamp <= `timestamp`.

Memory stays bounded: the active segment keeps a copy of its entries in two arrays (at
most `LogConfig.max_index_entries`); an inactive segment's index is searched in the
file through a small summary (the first key of every `_PIECE_ENTRIES` entries) and one
read of the piece that holds the answer. Indexes are a cache of the log: recovery rebuilds
them, so they are fsynced with the log but never trusted over it.
"""

from __future__ import annotations

import bisect
import struct
from array import array

from clients.common.errors import check

from .storage import StorageFile

# An inactive index is searched through a summary holding the first key of every piece of
# this many entries (8 bytes of memory per 256 entries: 8 KiB for a full 1 GiB segment at
# the default interval), then one read of that piece (2-3 KiB).
_PIECE_ENTRIES = 256
# New entries are buffered and written in one piece once this many bytes wait (or on flush,
# roll, truncation, close): one index write per ~500 appends instead of one per append.
# Losing buffered entries in a crash costs nothing: recovery rebuilds indexes after the
# recovery point, and flush() writes them before moving it.
_PENDING_BYTES_MAX = 4096


class _SparseIndex:
    """Shared machinery: (key, value) entries, keys strictly increasing, stored big-endian."""

    _ENTRY: struct.Struct
    _KEY_CODE: str
    _VALUE_CODE: str

    def __init__(self, file: StorageFile, *, max_entries: int, in_memory: bool) -> None:
        self._file = file
        self._max_entries = max_entries
        check(
            file.size % self._ENTRY.size == 0,
            "index file size %d is not a multiple of %d",
            file.size,
            self._ENTRY.size,
        )
        self._count = file.size // self._ENTRY.size
        self._keys: array[int] | None = None
        self._values: array[int] | None = None
        self._pending = bytearray()
        self._summary: array[int] | None = None
        # Bytes written (or a truncation) since the last fsync. A flush syncs the index only then:
        # the active segment's index files are not held open (segment.py), and an fsync of one
        # with nothing new would reopen it every flush. True at first, so a file found on disk or
        # just created is synced once, whatever an earlier process left unsynced in it.
        self._unsynced = True
        self._last: tuple[int, int] | None = self._read_entry(self._count - 1) if self._count else None
        if in_memory:
            self.load()

    @property
    def entry_count(self) -> int:
        return self._count

    @property
    def is_full(self) -> bool:
        return self._count >= self._max_entries

    @property
    def size_bytes(self) -> int:
        return self._count * self._ENTRY.size

    def last_entry(self) -> tuple[int, int] | None:
        return self._last

    def load(self) -> None:
        """Keep a copy of all entries in memory (the active segment's index)."""
        if self._keys is not None:
            return
        keys: array[int] = array(self._KEY_CODE)
        values: array[int] = array(self._VALUE_CODE)
        self._write_pending()
        if self._count:
            flat = struct.unpack(
                ">" + self._ENTRY.format.lstrip(">") * self._count, self._file.read_at(0, self.size_bytes)
            )
            keys.extend(flat[0::2])
            values.extend(flat[1::2])
        self._keys, self._values = keys, values

    def unload(self) -> None:
        """Drop the in-memory copy (the segment became inactive): from now on the file is searched."""
        self._write_pending()
        self._keys = self._values = None
        self._summary = None

    def write_pending(self) -> None:
        """Write the buffered entries to the file, without fsync (a batched close syncs them)."""
        self._write_pending()

    def _write_pending(self) -> None:
        if self._pending:
            self._file.append(self._pending)
            self._pending = bytearray()
            self._unsynced = True

    def append_entries(self, entries: list[tuple[int, int]]) -> None:
        """Append entries in one write. Keys must keep strictly increasing."""
        if not entries:
            return
        previous = self._last[0] if self._last else None
        for key, _ in entries:
            check(previous is None or key > previous, "index key %d does not follow %s", key, previous)
            previous = key
        self._summary = None
        pack = self._ENTRY.pack
        for key, value in entries:
            self._pending += pack(key, value)
        if len(self._pending) >= _PENDING_BYTES_MAX or self._keys is None:
            self._write_pending()
        self._count += len(entries)
        self._last = entries[-1]
        if self._keys is not None and self._values is not None:
            for key, value in entries:
                self._keys.append(key)
                self._values.append(value)

    def count_keys_at_most(self, key: int, *, strict: bool = False) -> int:
        """How many entries have a key <= `key` (< `key` if strict): the bisect point."""
        if self._keys is not None:
            return bisect.bisect_left(self._keys, key) if strict else bisect.bisect_right(self._keys, key)
        if self._summary is None:
            self._summary = self._build_summary()
        pieces = bisect.bisect_left(self._summary, key) if strict else bisect.bisect_right(self._summary, key)
        if pieces == 0:
            return 0
        lo = (pieces - 1) * _PIECE_ENTRIES
        hi = min(self._count, lo + _PIECE_ENTRIES)
        size = self._ENTRY.size
        raw = self._file.read_at(lo * size, (hi - lo) * size)
        # Binary search inside the piece, unpacking only the ~8 entries it probes.
        unpack_from = self._ENTRY.unpack_from
        low, high = 0, hi - lo
        while low < high:
            middle = (low + high) // 2
            middle_key = unpack_from(raw, middle * size)[0]
            if middle_key < key or (not strict and middle_key == key):
                low = middle + 1
            else:
                high = middle
        return lo + low

    def _build_summary(self) -> array[int]:
        """The first key of every piece of _PIECE_ENTRIES entries: count / 256 keys, read once."""
        self._write_pending()
        return array(self._KEY_CODE, (self._read_entry(i)[0] for i in range(0, self._count, _PIECE_ENTRIES)))

    def entry(self, index: int) -> tuple[int, int]:
        if self._keys is not None and self._values is not None:
            return self._keys[index], self._values[index]
        return self._read_entry(index)

    def truncate_entries(self, count: int) -> None:
        """Keep the first `count` entries."""
        if count >= self._count:
            return
        self._write_pending()
        self._summary = None
        self._file.truncate(count * self._ENTRY.size)
        self._unsynced = True
        self._count = count
        if self._keys is not None and self._values is not None:
            del self._keys[count:]
            del self._values[count:]
        self._last = self.entry(count - 1) if count else None

    def fsync(self) -> None:
        self._write_pending()
        if self._unsynced:
            self._file.fsync()
            self._unsynced = False

    def close(self) -> None:
        self._write_pending()
        self._file.close()

    def _read_entry(self, index: int) -> tuple[int, int]:
        self._write_pending()
        size = self._ENTRY.size
        key, value = self._ENTRY.unpack(self._file.read_at(index * size, size))
        return key, value


class OffsetIndex(_SparseIndex):
    """Relative offset -> byte position of the batch starting at that offset."""

    _ENTRY = struct.Struct(">ii")
    _KEY_CODE = "q"
    _VALUE_CODE = "q"

    def lookup(self, relative_offset: int) -> tuple[int, int]:
        """(relative offset, position) of the last entry at or before `relative_offset`; (0, 0) if none."""
        count = self.count_keys_at_most(relative_offset)
        return self.entry(count - 1) if count else (0, 0)

    def truncate_to_offset(self, relative_offset: int) -> None:
        """Drop entries for batches starting at or after `relative_offset`."""
        self.truncate_entries(self.count_keys_at_most(relative_offset, strict=True))

    def sane_for(self, segment_bytes: int) -> bool:
        """Cheap check on open: the last entry points inside the log file."""
        return self._last is None or (self._last[0] >= 0 and 0 <= self._last[1] < segment_bytes)


class TimeIndex(_SparseIndex):
    """Timestamp -> relative offset: batches up to that offset have max_timestamp <= timestamp."""

    _ENTRY = struct.Struct(">qi")
    _KEY_CODE = "q"
    _VALUE_CODE = "q"

    def last_before(self, timestamp_ms: int) -> tuple[int, int] | None:
        """The last entry with a timestamp < `timestamp_ms`: every batch up to its offset is older."""
        count = self.count_keys_at_most(timestamp_ms, strict=True)
        return self.entry(count - 1) if count else None

    def truncate_to_offset(self, relative_offset: int) -> None:
        """Drop entries naming batches at or after `relative_offset` (offsets increase with timestamps)."""
        count = self._count
        while count and self.entry(count - 1)[1] >= relative_offset:
            count -= 1
        self.truncate_entries(count)
