"""The log cleaner's per-record work as numba kernels: hash keys, fill the offset map, filter.

Why kernels: the cleaner walked every record through aiokafka's record objects and a Python
dict, 5-6 µs a record, all of it holding the GIL, so a busy cleaner took the broker's event
loop a share of the interpreter (issue 39 measured produce throughput 23-31% lower with the
cleaner busy). Here a batch's records section is walked in one call that holds no GIL
(nogil=True): the event loop's thread runs meanwhile, and a record costs tens of nanoseconds.

What they read is a records section (a batch's bytes after its 61-byte header, decompressed):
`count` Kafka v2 records, each a zigzag varint length, an attributes byte, varint timestamp
delta and offset delta, key and value with varint lengths (-1 = null), then headers. The leader
validated every batch at produce time (clients/common/record_validation.py); these kernels still
bound every read and answer a status instead of reading past the section.

The offset map is Kafka's SkimpyOffsetMap as one array: an open-addressing table (linear
probing) whose slot is a row of three uint64s, the 128-bit key hash (MurmurHash3 x64-128, two
halves) and the key's latest offset plus one, 0 marking an empty slot (so a fresh table is
zeroed memory the kernel touches only where it writes). One row is one cache line's third: a
probe costs one miss, not one per array. The table has more slots than the keys it may hold, so
a probe always ends at an empty slot.
"""

from __future__ import annotations

import numpy as np
from numba import njit, types

from clients.common.numba_types import KernelInt
from clients.common.record_kernels import read_varint

# Kernel statuses. Negative: the section does not hold `count` well-formed records.
STATUS_OK = 0
STATUS_REACHED_END = 1  # map: a record at or past end_offset; the map ends there
STATUS_FULL = 2  # map: a new key would overfill the map; it ends at that record
STATUS_OFFSET_NOT_INCREASING = -1  # map: an offset at or below the latest put (a pass reads forward)
STATUS_TRUNCATED = -2  # a varint or field runs past the record or the section
STATUS_BAD_LENGTH = -3  # a negative record length, or a key/value length below -1
STATUS_FEWER_RECORDS = -4  # the section ends before `count` records

STATUS_MESSAGES = {
    STATUS_OFFSET_NOT_INCREASING: "an offset at or below one already in the offset map",
    STATUS_TRUNCATED: "a record field runs past its record or the batch",
    STATUS_BAD_LENGTH: "a record, key or value length is out of range",
    STATUS_FEWER_RECORDS: "the batch holds fewer records than its header says",
}

# The kernels a pass calls are compiled for these types when this module is imported (at broker
# start, from the cache numba keeps beside this file), as record_validation's are: compiled on
# first use they would compile on the cleaner's thread, holding the GIL for seconds in the middle
# of the broker's work and charging the CPU share with it. A records section is read-only when
# it is a stored batch's bytes, writable when decompressed.
_I64 = types.int64
# numba's stubs leave UniTuple's constructor untyped: a tuple type of n int64s.
_INT64_PAIR = types.UniTuple(_I64, 2)  # type: ignore[no-untyped-call]
_INT64_SEVEN = types.UniTuple(_I64, 7)  # type: ignore[no-untyped-call]
_SECTIONS = (types.Array(types.uint8, 1, "C", readonly=True), types.Array(types.uint8, 1, "C"))
_TABLE = types.Array(types.uint64, 2, "C")
_STATE = types.Array(types.int64, 1, "C")
_SCRATCH = types.Array(types.int64, 2, "C")
_MAP_RECORDS = [
    _INT64_PAIR(section, _I64, _I64, _I64, _I64, _TABLE, _STATE, _I64, types.uint64) for section in _SECTIONS
]
_FILTER_RECORDS = [
    _INT64_SEVEN(section, _I64, _I64, _I64, _I64, _TABLE, types.uint64, _I64, _I64, _SCRATCH)
    for section in _SECTIONS
]
_ENCODE_KEPT = [
    _I64(section, _I64, _SCRATCH, _I64, types.Array(types.uint8, 1, "C")) for section in _SECTIONS
]
_MAP_COPY = [types.void(_TABLE, _TABLE)]

# MurmurHash3 x64-128's constants (Austin Appleby's reference, public domain).
_C1 = np.uint64(0x87C37B91114253D5)
_C2 = np.uint64(0x4CF5AD432745937F)
_FMIX1 = np.uint64(0xFF51AFD7ED558CCD)
_FMIX2 = np.uint64(0xC4CEB9FE1A85EC53)
_M5 = np.uint64(5)
_N1 = np.uint64(0x52DCE729)
_N2 = np.uint64(0x38495AB5)
_EMPTY = np.uint64(0)
# A table row: hash low half, hash high half, offset + 1 (0: empty).
_H1, _H2, _OFFSET = 0, 1, 2
TABLE_COLUMNS = 3

# Scratch columns of filter_records / encode_kept, one row per record.
COL_KEEP = 0  # 1 if the record stays
COL_START = 1  # where the record's length varint begins
COL_REST = 2  # where its fields after the timestamp delta begin (offset delta onward)
COL_END = 3  # the position after the record
COL_TIMESTAMP_DELTA = 4
SCRATCH_COLUMNS = 5


@njit(cache=True, nogil=True, inline="always")
def _rotl(x: np.uint64, r: int) -> np.uint64:
    return (x << np.uint64(r)) | (x >> np.uint64(64 - r))


@njit(cache=True, nogil=True, inline="always")
def _fmix(k: np.uint64) -> np.uint64:
    k ^= k >> np.uint64(33)
    k *= _FMIX1
    k ^= k >> np.uint64(33)
    k *= _FMIX2
    k ^= k >> np.uint64(33)
    return k


@njit(cache=True, nogil=True, inline="always")
def _load64(buf: np.ndarray, pos: KernelInt, n: KernelInt) -> np.uint64:
    """The little-endian integer of the n (<= 8) bytes at buf[pos:pos+n]."""
    k = np.uint64(0)
    for j in range(n - 1, -1, -1):
        k = (k << np.uint64(8)) | np.uint64(buf[pos + j])
    return k


@njit(cache=True, nogil=True)
def murmur3_128(
    buf: np.ndarray, pos: KernelInt, n: KernelInt, seed: np.uint64
) -> tuple[np.uint64, np.uint64]:
    """MurmurHash3 x64-128 of buf[pos:pos+n] (as mmh3.hash128(..., x64arch=True): h1 low, h2 high)."""
    h1 = seed
    h2 = seed
    blocks = n // 16
    for i in range(blocks):
        k1 = _load64(buf, pos + i * 16, 8)
        k2 = _load64(buf, pos + i * 16 + 8, 8)
        k1 *= _C1
        k1 = _rotl(k1, 31)
        k1 *= _C2
        h1 ^= k1
        h1 = _rotl(h1, 27)
        h1 += h2
        h1 = h1 * _M5 + _N1
        k2 *= _C2
        k2 = _rotl(k2, 33)
        k2 *= _C1
        h2 ^= k2
        h2 = _rotl(h2, 31)
        h2 += h1
        h2 = h2 * _M5 + _N2
    tail = pos + blocks * 16
    rest = n - blocks * 16
    if rest > 8:
        k2 = _load64(buf, tail + 8, rest - 8)
        k2 *= _C2
        k2 = _rotl(k2, 33)
        k2 *= _C1
        h2 ^= k2
    if rest > 0:
        k1 = _load64(buf, tail, min(rest, 8))
        k1 *= _C1
        k1 = _rotl(k1, 31)
        k1 *= _C2
        h1 ^= k1
    length = np.uint64(n)
    h1 ^= length
    h2 ^= length
    h1 += h2
    h2 += h1
    h1 = _fmix(h1)
    h2 = _fmix(h2)
    h1 += h2
    h2 += h1
    return h1, h2


@njit(cache=True, nogil=True, inline="always")
def _slot(table: np.ndarray, h1: np.uint64, h2: np.uint64) -> KernelInt:
    """The slot holding the key hash (h1, h2), or the empty slot where it would go."""
    slots = table.shape[0]
    index: KernelInt = np.int64(h1 % np.uint64(slots))
    while True:
        if table[index, _OFFSET] == _EMPTY:
            return index
        if table[index, _H1] == h1 and table[index, _H2] == h2:
            return index
        index += 1
        if index == slots:
            index = 0


@njit(cache=True, nogil=True)
def map_put(
    table: np.ndarray, state: np.ndarray, capacity: KernelInt, h1: np.uint64, h2: np.uint64, offset: KernelInt
) -> KernelInt:
    """Record `offset` as the key's latest: STATUS_OK, STATUS_FULL (nothing recorded: a new key
    and the map holds `capacity` keys) or STATUS_OFFSET_NOT_INCREASING.

    `state` is [keys held, latest offset put, records put]."""
    if offset <= state[1]:
        return STATUS_OFFSET_NOT_INCREASING
    index = _slot(table, h1, h2)
    if table[index, _OFFSET] == _EMPTY:
        if state[0] >= capacity:
            return STATUS_FULL
        table[index, _H1] = h1
        table[index, _H2] = h2
        state[0] += 1
    table[index, _OFFSET] = np.uint64(offset + 1)
    state[1] = offset
    state[2] += 1
    return STATUS_OK


@njit(cache=True, nogil=True)
def map_get(table: np.ndarray, h1: np.uint64, h2: np.uint64) -> KernelInt:
    """The key's latest offset in the map, -1 if it holds none."""
    return np.int64(table[_slot(table, h1, h2), _OFFSET]) - 1


@njit(cache=True, nogil=True, inline="always")
def _field(section: np.ndarray, pos: KernelInt, end: KernelInt) -> tuple[KernelInt, KernelInt, KernelInt]:
    """(length, start, next position) of a length-prefixed field (key, value) at pos; a status < 0
    as next position when it is malformed. Length -1 (null) has no bytes."""
    length, pos = read_varint(section, pos, end)
    if pos < 0:
        return 0, 0, STATUS_TRUNCATED
    if length < -1:
        return 0, 0, STATUS_BAD_LENGTH
    start = pos
    if length > 0:
        pos += length
        if pos > end:
            return 0, 0, STATUS_TRUNCATED
    return length, start, pos


@njit(_MAP_RECORDS, cache=True, nogil=True)
def map_records(
    section: np.ndarray,
    count: KernelInt,
    base_offset: KernelInt,
    start_offset: KernelInt,
    end_offset: KernelInt,
    table: np.ndarray,
    state: np.ndarray,
    capacity: KernelInt,
    seed: np.uint64,
) -> tuple[KernelInt, KernelInt]:
    """Put each keyed record's offset in [start_offset, end_offset) into the map, in order.

    (STATUS_OK, 0), (STATUS_REACHED_END, end_offset), (STATUS_FULL, the offset of the record it
    could not take) or (a status < 0, 0). Keyless records are skipped. state[2] counts the puts.
    """
    size = section.shape[0]
    pos: KernelInt = 0
    for _ in range(count):
        if pos >= size:
            return STATUS_FEWER_RECORDS, 0
        length, pos = read_varint(section, pos, size)
        if pos < 0:
            return STATUS_TRUNCATED, 0
        if length < 0:
            return STATUS_BAD_LENGTH, 0
        end = pos + length
        if end > size:
            return STATUS_TRUNCATED, 0
        pos += 1  # attributes
        _timestamp_delta, pos = read_varint(section, pos, end)
        if pos < 0:
            return STATUS_TRUNCATED, 0
        offset_delta, pos = read_varint(section, pos, end)
        if pos < 0:
            return STATUS_TRUNCATED, 0
        key_length, key_start, pos = _field(section, pos, end)
        if pos < 0:
            return pos, 0
        pos = end
        offset = base_offset + offset_delta
        if offset < start_offset or key_length < 0:
            continue
        if offset >= end_offset:
            return STATUS_REACHED_END, end_offset
        h1, h2 = murmur3_128(section, key_start, key_length, seed)
        status = map_put(table, state, capacity, h1, h2, offset)
        if status == STATUS_FULL:
            return STATUS_FULL, offset
        if status != STATUS_OK:
            return status, 0
    return STATUS_OK, 0


@njit(_FILTER_RECORDS, cache=True, nogil=True)
def filter_records(
    section: np.ndarray,
    count: KernelInt,
    base_offset: KernelInt,
    first_timestamp: KernelInt,
    map_end_offset: KernelInt,
    table: np.ndarray,
    seed: np.uint64,
    now_ms: KernelInt,
    horizon_ms: KernelInt,
    scratch: np.ndarray,
) -> tuple[KernelInt, KernelInt, KernelInt, KernelInt, KernelInt, KernelInt, KernelInt]:
    """Decide each record's fate; fill `scratch` (a row per record, the COL_* columns).

    (status, removed, tombstones removed, kept tombstones, kept, first kept timestamp, max kept
    timestamp). A record goes when its key has a later offset in the map, or when it is a
    tombstone whose batch's delete horizon (`horizon_ms`, -1: none yet) has passed; only
    records below `map_end_offset` can go (the map knows nothing past it).
    """
    size = section.shape[0]
    pos: KernelInt = 0
    removed = tombstones_removed = kept_tombstones = kept = 0
    start: KernelInt
    end: KernelInt
    rest: KernelInt
    first_kept_timestamp: KernelInt = -1
    max_kept_timestamp: KernelInt = -1
    for i in range(count):
        if pos >= size:
            return STATUS_FEWER_RECORDS, 0, 0, 0, 0, 0, 0
        start = pos
        length, pos = read_varint(section, pos, size)
        if pos < 0:
            return STATUS_TRUNCATED, 0, 0, 0, 0, 0, 0
        if length < 0:
            return STATUS_BAD_LENGTH, 0, 0, 0, 0, 0, 0
        end = pos + length
        if end > size:
            return STATUS_TRUNCATED, 0, 0, 0, 0, 0, 0
        pos += 1  # attributes
        timestamp_delta, pos = read_varint(section, pos, end)
        if pos < 0:
            return STATUS_TRUNCATED, 0, 0, 0, 0, 0, 0
        rest = pos
        offset_delta, pos = read_varint(section, pos, end)
        if pos < 0:
            return STATUS_TRUNCATED, 0, 0, 0, 0, 0, 0
        key_length, key_start, pos = _field(section, pos, end)
        if pos < 0:
            return pos, 0, 0, 0, 0, 0, 0
        value_length, _value_start, pos = _field(section, pos, end)
        if pos < 0:
            return pos, 0, 0, 0, 0, 0, 0
        pos = end
        offset = base_offset + offset_delta
        keep = 1
        if key_length >= 0 and offset < map_end_offset:
            h1, h2 = murmur3_128(section, key_start, key_length, seed)
            if map_get(table, h1, h2) > offset:
                keep = 0
                removed += 1
            elif value_length < 0 and horizon_ms >= 0 and now_ms >= horizon_ms:
                keep = 0
                removed += 1
                tombstones_removed += 1
        scratch[i, COL_KEEP] = keep
        scratch[i, COL_START] = start
        scratch[i, COL_REST] = rest
        scratch[i, COL_END] = end
        scratch[i, COL_TIMESTAMP_DELTA] = timestamp_delta
        if keep:
            timestamp = first_timestamp + timestamp_delta
            if kept == 0:
                first_kept_timestamp = timestamp
            if timestamp > max_kept_timestamp or kept == 0:
                max_kept_timestamp = timestamp
            kept += 1
            if value_length < 0 and key_length >= 0:
                kept_tombstones += 1
    return (
        STATUS_OK,
        removed,
        tombstones_removed,
        kept_tombstones,
        kept,
        first_kept_timestamp,
        max_kept_timestamp,
    )


@njit(cache=True, nogil=True, inline="always")
def _write_varint(out: np.ndarray, pos: KernelInt, value: KernelInt) -> KernelInt:
    """Write Kafka's zigzag varint of `value` at out[pos:]; the position after it."""
    zigzag = np.uint64((np.int64(value) << np.int64(1)) ^ (np.int64(value) >> np.int64(63)))
    while zigzag >= np.uint64(0x80):
        out[pos] = np.uint8((zigzag & np.uint64(0x7F)) | np.uint64(0x80))
        zigzag >>= np.uint64(7)
        pos += 1
    out[pos] = np.uint8(zigzag)
    return pos + 1


@njit(cache=True, nogil=True, inline="always")
def _varint_size(value: KernelInt) -> KernelInt:
    zigzag = np.uint64((np.int64(value) << np.int64(1)) ^ (np.int64(value) >> np.int64(63)))
    size = 1
    while zigzag >= np.uint64(0x80):
        zigzag >>= np.uint64(7)
        size += 1
    return size


@njit(_ENCODE_KEPT, cache=True, nogil=True)
def encode_kept(
    section: np.ndarray,
    count: KernelInt,
    scratch: np.ndarray,
    timestamp_shift: KernelInt,
    out: np.ndarray,
) -> KernelInt:
    """Write the kept records (scratch from filter_records) to `out`; the bytes written.

    Each keeps its bytes but for its timestamp delta, which moves by `timestamp_shift` (the old
    base timestamp minus the new: the base becomes the first kept record's timestamp or the
    delete horizon), and its length, which follows. Offset deltas stay: the base offset does.
    `out` must hold len(section) + 15 bytes a record (a varint grows by at most 10 + 5).
    """
    pos: KernelInt = 0
    for i in range(count):
        if scratch[i, COL_KEEP] == 0:
            continue
        rest = scratch[i, COL_REST]
        end = scratch[i, COL_END]
        delta = scratch[i, COL_TIMESTAMP_DELTA] + timestamp_shift
        # The attributes byte sits just before the timestamp delta: the record's length varint
        # ends there; find it by re-reading the length from the record's start.
        _length, attributes_at = read_varint(section, scratch[i, COL_START], end)
        length = 1 + _varint_size(delta) + (end - rest)
        pos = _write_varint(out, pos, length)
        out[pos] = section[attributes_at]
        pos = _write_varint(out, pos + 1, delta)
        for j in range(rest, end):
            out[pos] = section[j]
            pos += 1
    return pos


@njit(_MAP_COPY, cache=True, nogil=True)
def map_copy(table: np.ndarray, into: np.ndarray) -> None:
    """Put every entry of one table into another, larger and empty (growing a map)."""
    for index in range(table.shape[0]):
        if table[index, _OFFSET] != _EMPTY:
            slot = _slot(into, table[index, _H1], table[index, _H2])
            into[slot, _H1] = table[index, _H1]
            into[slot, _H2] = table[index, _H2]
            into[slot, _OFFSET] = table[index, _OFFSET]
