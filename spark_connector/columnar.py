"""Kafka RecordBatch v2 bytes -> Arrow columns, with no Python object per record.

The Spark reader's decoder (spark_connector/reader.py). `clients.common.records.decode_batches`
builds a `Record` per record, ~1.5 µs each, which capped a Spark task at ~0.65 M
records/s (bench/RESULTS.md, "Spark connector"); this module turns the bytes of one
Fetch response straight into the Arrow arrays Spark takes:

    key binary, value binary, offset int64, timestamp timestamp[us, UTC],
    timestampType int32 [, headers list<struct<key string, value binary>>]

How the work is split, and why:

- `_scan_batches` (numba) walks the batch framing once and returns a table of batch
  headers: one Python step per *batch*, none per record.
- Python, per batch: the CRC-32C check in C (the crc32c package, ~20 GB/s), control
  batches skipped, compressed record sections decompressed by the leader's own
  decompressor (clients.common.record_validation.decompress_records: every Kafka codec,
  snappy with or without xerial framing, into at most
  clients.common.limits.DECOMPRESSED_BATCH_BYTES_MAX bytes). One decompressor for what a
  leader accepts and what Spark reads, so neither can take bytes the other refuses, and a
  small batch that inflates to gigabytes (a decompression bomb) costs a Spark task no more
  than it costs the leader: MessageTooLarge naming the batch.
- `_decode_records` (numba, nogil, so the task's in-flight Fetch is received meanwhile)
  parses every record of every batch with clients.common.record_kernels.walk_record (the
  reader the leader's check uses, in aiokafka's grammar), drops those outside [start_offset, end_offset),
  and writes offsets, lengths, validity bits and copies of key/value bytes into
  preallocated numpy buffers that `pyarrow.Array.from_buffers` wraps without a copy.

Strictness is `decode_batches`' (tests/unit/test_columnar.py compares the two on random
batches, every codec, and on corrupted ones): the same framing rules (a truncated
trailing batch is ignored; a length below 14 bytes, a magic other than 2 or a length
below a v2 header is corrupt), the CRC, the record grammar as aiokafka parses it
(every length a zigzag varint of at most 10 bytes, attributes read as a varint, a
record's length must match what it holds, no bytes may follow the last record,
header keys must be UTF-8). Every varint and every length is checked against the end of its
batch's record section before it is used: numba does no bounds checks, so an
unchecked read would read other memory or crash the Spark worker. A failure comes
back as an error code that becomes `CorruptMessage` naming the batch's base offset.

Owned by whoever calls it (a Spark task's thread); no state is shared between calls.
The kernels compile once per machine and are cached next to this file (cache=True),
so a fresh Python worker loads them in ~0.1 s instead of compiling for seconds.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, cast

import numpy as np
import pyarrow as pa
from crc32c import crc32c
from numba import njit, types
from numba.core import cgutils

from clients.common import limits as common_limits
from clients.common.errors import CorruptMessage, MessageTooLarge
from clients.common.numba_types import (
    KernelInt,
    njit_without_refcounts,
    numba_bounds_check,
    void_intrinsic,
)
from clients.common.record_batch import (
    ATTRIBUTES_POS,
    BASE_OFFSET_POS,
    BATCH_HEADER_SIZE,
    BATCH_LENGTH_POS,
    CRC_POS,
    FIRST_TIMESTAMP_POS,
    LAST_OFFSET_DELTA_POS,
    LOG_OVERHEAD,
    MAGIC_POS,
    MAX_TIMESTAMP_POS,
    MIN_BATCH_LENGTH,
    RECORDS_COUNT_POS,
)

# Every record field is read by record_kernels (the leader's check reads them there too).
# numba's cache of this file's kernels is keyed on this file only: after changing
# record_kernels, clear __pycache__/*.nbi|*.nbc here too.
from clients.common.record_kernels import (
    HEADER_BYTES_MIN,
    KEY_LENGTH_MIN_NONE,
    OFFSET_DELTA_UNCHECKED,
    RECORD_BYTES_MIN,
    VARINT_BYTES_MAX,
    WALK_HEADER_COUNT,
    WALK_HEADER_KEY_BOUNDS,
    WALK_HEADER_KEY_LENGTH,
    WALK_HEADER_KEY_UTF8,
    WALK_HEADER_VALUE_BOUNDS,
    WALK_KEY_BOUNDS,
    WALK_OK,
    WALK_RECORD_LENGTH,
    WALK_VALUE_BOUNDS,
    WALK_VARINT_TOO_LONG,
    WALK_VARINT_TRUNCATED,
    read_header,
    walk_record,
)
from clients.common.record_validation import CODEC_NAMES, decompress_records
from spark_connector import limits

# --- the bounds of the formats this decoder reads ------------------------------------------
# The largest offset a range may end at (exclusive): "no end".
OFFSET_END_MAX = 2**63 - 1
# Arrow binary/string arrays address their bytes with int32 offsets, so one array holds
# at most this many bytes; a single batch whose records are bigger cannot be decoded into
# the schema Spark expects (it would need large_binary) and is refused by name.
ARROW_BINARY_BYTES_MAX = 2**31 - 1
# aiokafka's MemoryRecords refuses a batch length below the v0 record overhead before it
# knows the magic; kept so both decoders call the same bytes corrupt at the same point.
RECORD_OVERHEAD_V0 = 14
# A batch claiming more records than its bytes can hold (record_kernels.RECORD_BYTES_MIN
# each) is corrupt, checked before any buffer is sized by the claim.

_MAGIC_V2 = 2
_CODEC_MASK = 0x07
_TIMESTAMP_TYPE_MASK = 0x08
_CONTROL_MASK = 0x20

HEADERS_TYPE = pa.list_(
    pa.field("element", pa.struct([pa.field("key", pa.string()), pa.field("value", pa.binary())]))
)
TIMESTAMP_TYPE = pa.timestamp("us", tz="UTC")

# --- status codes the kernels return (0 = fine): record_kernels' WALK_* for a record, and
# these for the batch framing ----------------------------------------------------------------
_OK = WALK_OK
_ERR_LENGTH_BELOW_V0 = 100
_ERR_MAGIC = 101
_ERR_LENGTH_BELOW_HEADER = 102
_ERR_TRAILING_BYTES = 103
_ERR_RECORD_COUNT = 104

_MESSAGES = {
    _ERR_LENGTH_BELOW_V0: f"its length is below the minimum record overhead ({RECORD_OVERHEAD_V0})",
    _ERR_MAGIC: f"it is not magic {_MAGIC_V2}",
    _ERR_LENGTH_BELOW_HEADER: f"its length is below a v2 batch header ({MIN_BATCH_LENGTH})",
    WALK_VARINT_TRUNCATED: "a varint runs past the end of the batch",
    WALK_VARINT_TOO_LONG: f"a varint is longer than {VARINT_BYTES_MAX} bytes",
    WALK_KEY_BOUNDS: "a record key runs past the end of the batch",
    WALK_VALUE_BOUNDS: "a record value runs past the end of the batch",
    WALK_HEADER_COUNT: "a record has a negative header count",
    WALK_HEADER_KEY_LENGTH: "a header key has a negative length",
    WALK_HEADER_KEY_BOUNDS: "a header key runs past the end of the batch",
    WALK_HEADER_KEY_UTF8: "a header key is not UTF-8",
    WALK_HEADER_VALUE_BOUNDS: "a header value runs past the end of the batch",
    WALK_RECORD_LENGTH: "a record's length does not match its contents",
    _ERR_TRAILING_BYTES: "bytes follow its last record",
    _ERR_RECORD_COUNT: "its record count is negative or more than its bytes can hold",
}

# Columns of the batch table `_scan_batches` fills (int64 each).
_B_POSITION, _B_SIZE, _B_BASE_OFFSET, _B_CRC, _B_ATTRIBUTES = 0, 1, 2, 3, 4
_B_FIRST_TS, _B_MAX_TS, _B_COUNT, _B_LAST_DELTA = 5, 6, 7, 8
_SCAN_COLUMNS = 9
# Columns of the table `_decode_records` reads: one row per data batch to parse.
_R_START, _R_END, _R_COUNT, _R_BASE_OFFSET, _R_FIRST_TS, _R_MAX_TS, _R_LOG_APPEND = 0, 1, 2, 3, 4, 5, 6
_RECORD_TABLE_COLUMNS = 7
# Slots of the `sizes` array `_decode_records` fills.
_S_ROWS, _S_KEY_BYTES, _S_VALUE_BYTES, _S_HEADERS, _S_HKEY_BYTES, _S_HVALUE_BYTES = 0, 1, 2, 3, 4, 5
_S_KEY_NULLS, _S_VALUE_NULLS, _S_HVALUE_NULLS, _S_FAILED_BATCH = 6, 7, 8, 9
_SIZES = 10


# --- kernels ----------------------------------------------------------------------------------


@njit(cache=True, nogil=True, inline="always")
def _be_int(buf: np.ndarray, pos: KernelInt, width: int) -> np.int64:
    """Big-endian signed integer of `width` bytes at buf[pos:]; the caller checked the bounds."""
    value = np.uint64(0)
    for k in range(width):
        value = (value << np.uint64(8)) | np.uint64(buf[pos + k])
    if width < 8:
        sign = np.uint64(1) << np.uint64(8 * width - 1)
        return np.int64(value) - (np.int64(value & sign) << 1)
    return np.int64(value)


@njit_without_refcounts  # no reference counting: see _decode_records below
def _scan_batches(buf: np.ndarray, table: np.ndarray) -> tuple[int, int, KernelInt]:
    """Frame the batches of `buf` into `table` (one row per complete batch).

    Returns (batches found, status, position of the batch that failed or where the walk
    stopped). A trailing batch that does not fit in `buf` ends the walk quietly (a Fetch
    may be cut at its max bytes); the checks and their order are aiokafka's MemoryRecords
    and decode_batches'. `table` has a row for every 61 bytes of `buf` (a batch is at
    least that long), so it cannot overflow.
    """
    size = buf.shape[0]
    pos: KernelInt = 0
    n = 0
    while size - pos >= LOG_OVERHEAD:
        length = _be_int(buf, pos + BATCH_LENGTH_POS, 4)
        if length < RECORD_OVERHEAD_V0:
            return n, _ERR_LENGTH_BELOW_V0, pos
        if length > size - pos - LOG_OVERHEAD:
            break
        # length >= 14, so the batch, which is in buf, reaches past MAGIC_POS.
        if buf[pos + MAGIC_POS] != _MAGIC_V2:
            return n, _ERR_MAGIC, pos
        if length < MIN_BATCH_LENGTH:
            return n, _ERR_LENGTH_BELOW_HEADER, pos
        # length >= 49: the whole 61-byte header is in buf.
        table[n, _B_POSITION] = pos
        table[n, _B_SIZE] = length + LOG_OVERHEAD
        table[n, _B_BASE_OFFSET] = _be_int(buf, pos + BASE_OFFSET_POS, 8)
        table[n, _B_CRC] = _be_int(buf, pos + CRC_POS, 4) & 0xFFFFFFFF
        table[n, _B_ATTRIBUTES] = _be_int(buf, pos + ATTRIBUTES_POS, 2)
        table[n, _B_LAST_DELTA] = _be_int(buf, pos + LAST_OFFSET_DELTA_POS, 4)
        table[n, _B_FIRST_TS] = _be_int(buf, pos + FIRST_TIMESTAMP_POS, 8)
        table[n, _B_MAX_TS] = _be_int(buf, pos + MAX_TIMESTAMP_POS, 8)
        table[n, _B_COUNT] = _be_int(buf, pos + RECORDS_COUNT_POS, 4)
        n += 1
        pos += length + LOG_OVERHEAD
    return n, _OK, pos


@void_intrinsic
def _copy(typingctx: Any, dst: Any, dst_pos: Any, src: Any, src_pos: Any, count: Any) -> Any:
    """dst[dst_pos:dst_pos + count] = src[src_pos:src_pos + count] as one memcpy; the caller
    has checked both ranges (nothing here does).

    Numba's slice assignment goes through generic array views, and a byte loop is not
    vectorised inside the record kernel: for 100-byte values this copy measured 8x (slice)
    and 16x (loop) faster, the difference between ~90 and ~40 ns per record.
    """
    signature = types.void(dst, types.intp, src, types.intp, types.intp)

    def codegen(context: Any, builder: Any, sig: Any, args: Any) -> Any:
        dst_value, dst_at, src_value, src_at, size = args
        dst_array = context.make_array(sig.args[0])(context, builder, dst_value)
        src_array = context.make_array(sig.args[2])(context, builder, src_value)
        raw_memcpy = cast("Callable[..., None]", cgutils.raw_memcpy)  # numba.core.cgutils is unannotated
        raw_memcpy(
            builder, builder.gep(dst_array.data, [dst_at]), builder.gep(src_array.data, [src_at]), size, 1
        )
        return context.get_dummy_value()

    return signature, codegen


@njit(cache=True, nogil=True, inline="always")
def _copy_checked(dst: np.ndarray, dst_pos: int, src: np.ndarray, src_pos: int, count: int) -> None:
    for k in range(count):
        dst[dst_pos + k] = src[src_pos + k]


if numba_bounds_check():
    # NUMBA_BOUNDSCHECK=1 (tests/unit/test_columnar.py's bounds test): copy through indexed
    # reads and writes, which numba then checks, so the test covers every byte copied too.
    _copy = _copy_checked


@njit(cache=True, nogil=True, inline="always")
def _set_bit(bitmap: np.ndarray, index: int) -> None:
    bitmap[index >> 3] |= np.uint8(1 << (index & 7))


# _nrt=False: numba passes an array to every inlined helper call (each field read in walk_record)
# through an atomic reference-count increment and decrement that its pruning pass leaves in
# this loop: perf showed 78% of the kernel's time in NRT_incref/NRT_decref, ~55 of ~72 ns per
# 100-byte record. The kernel allocates nothing and raises nothing (it returns status codes),
# and the caller holds every array it is given for the whole call, so it needs no reference
# counting at all; without the runtime, an allocation added here would fail to compile, not leak.
# (record_validation.py's kernel is compiled the same way, for the same reason.)
@njit_without_refcounts
def _decode_records(
    src: np.ndarray,
    batches: np.ndarray,
    start_offset: int,
    end_offset: int,
    want_headers: bool,
    key_offsets: np.ndarray,
    key_data: np.ndarray,
    key_valid: np.ndarray,
    value_offsets: np.ndarray,
    value_data: np.ndarray,
    value_valid: np.ndarray,
    offsets: np.ndarray,
    timestamps: np.ndarray,
    ts_types: np.ndarray,
    header_offsets: np.ndarray,
    hkey_offsets: np.ndarray,
    hkey_data: np.ndarray,
    hvalue_offsets: np.ndarray,
    hvalue_data: np.ndarray,
    hvalue_valid: np.ndarray,
    sizes: np.ndarray,
) -> int:
    """Parse the records of every batch in `batches` (rows of _R_* columns, sections of `src`).

    Every record is parsed and checked; those with offsets in [start_offset, end_offset)
    become rows. Output buffers are sized by the caller from upper bounds (rows <= the
    batches' record counts, bytes <= their sections' bytes, headers <= bytes / 2), so
    the writes below stay inside them once the reads have been checked. Returns a status;
    `sizes` gets the counts (and, on failure, the index of the batch that failed).
    """
    row = 0
    key_bytes: KernelInt = 0
    value_bytes: KernelInt = 0
    headers = 0
    hkey_bytes: KernelInt = 0
    hvalue_bytes: KernelInt = 0
    key_nulls = 0
    value_nulls = 0
    hvalue_nulls = 0
    key_offsets[0] = 0
    value_offsets[0] = 0
    header_offsets[0] = 0
    hkey_offsets[0] = 0
    hvalue_offsets[0] = 0
    for b in range(batches.shape[0]):
        sizes[_S_FAILED_BATCH] = b
        pos = batches[b, _R_START]
        end = batches[b, _R_END]
        base_offset = batches[b, _R_BASE_OFFSET]
        first_ts = batches[b, _R_FIRST_TS]
        log_append = batches[b, _R_LOG_APPEND] != 0
        for _ in range(batches[b, _R_COUNT]):
            # aiokafka's grammar, as consumers read it; a negative key or value length is null.
            walked = walk_record(src, pos, end, False, KEY_LENGTH_MIN_NONE, OFFSET_DELTA_UNCHECKED)
            status, _detail, pos, _length, ts_delta, offset_delta = walked[:6]
            key_len, key_pos, value_len, value_pos, header_count, headers_pos = walked[6:]
            if status != _OK:
                return status
            offset = base_offset + offset_delta
            if offset < start_offset or offset >= end_offset:
                continue
            # The record is whole and in range: copy it out.
            if key_len >= 0:
                _copy(key_data, key_bytes, src, key_pos, key_len)
                key_bytes += key_len
                _set_bit(key_valid, row)
            else:
                key_nulls += 1
            key_offsets[row + 1] = key_bytes
            if value_len >= 0:
                _copy(value_data, value_bytes, src, value_pos, value_len)
                value_bytes += value_len
                _set_bit(value_valid, row)
            else:
                value_nulls += 1
            value_offsets[row + 1] = value_bytes
            offsets[row] = offset
            timestamp = batches[b, _R_MAX_TS] if log_append else first_ts + ts_delta
            timestamps[row] = timestamp * 1000  # ms -> µs, wrapping as pyarrow's multiply does
            ts_types[row] = 1 if log_append else 0
            if want_headers:
                # Second walk over headers already checked above: no checks needed.
                hpos = headers_pos
                for _h in range(header_count):
                    hkey_pos, hkey_len, hvalue_pos, hvalue_len, hpos = read_header(src, hpos, end)
                    _copy(hkey_data, hkey_bytes, src, hkey_pos, hkey_len)
                    hkey_bytes += hkey_len
                    hkey_offsets[headers + 1] = hkey_bytes
                    if hvalue_len >= 0:
                        _copy(hvalue_data, hvalue_bytes, src, hvalue_pos, hvalue_len)
                        hvalue_bytes += hvalue_len
                        _set_bit(hvalue_valid, headers)
                    else:
                        hvalue_nulls += 1
                    hvalue_offsets[headers + 1] = hvalue_bytes
                    headers += 1
                header_offsets[row + 1] = headers
            row += 1
        if pos != end:
            return _ERR_TRAILING_BYTES
    sizes[_S_ROWS] = row
    sizes[_S_KEY_BYTES] = key_bytes
    sizes[_S_VALUE_BYTES] = value_bytes
    sizes[_S_HEADERS] = headers
    sizes[_S_HKEY_BYTES] = hkey_bytes
    sizes[_S_HVALUE_BYTES] = hvalue_bytes
    sizes[_S_KEY_NULLS] = key_nulls
    sizes[_S_VALUE_NULLS] = value_nulls
    sizes[_S_HVALUE_NULLS] = hvalue_nulls
    return _OK


# --- Python side ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RecordColumns:
    """The records of some batches of one partition, in log order, as Arrow arrays of equal length."""

    key: pa.Array
    value: pa.Array
    offset: pa.Array
    timestamp: pa.Array
    timestamp_type: pa.Array
    headers: pa.Array | None

    def __len__(self) -> int:
        return len(self.offset)


@dataclass(slots=True)
class _Group:
    """Data batches decoded by one kernel call: their rows in the record table, their sections.

    While every section is uncompressed the kernel reads them where they lie in the fetched
    bytes (`sections`, views). From the first compressed one on, every section is copied,
    in order, into `joined`, which the kernel then reads instead (one copy, as a join at the
    end would make): a decompressed section may be a slice of a buffer far larger than
    itself (decompress_records decompresses lz4 and zstd into at least 1 MiB), and copying
    it at once frees that buffer with its batch instead of holding one per batch.
    """

    rows: list[list[int]] = field(default_factory=list)
    sections: list[memoryview] = field(default_factory=list)
    joined: bytearray | None = None
    section_bytes: int = 0

    def add(self, row: list[int], section: memoryview | np.ndarray) -> None:
        if isinstance(section, np.ndarray) and self.joined is None:
            self.joined = bytearray().join(self.sections)
            self.sections = []
        if self.joined is not None:
            # Through a memoryview: `bytearray += ndarray` would be numpy's elementwise add.
            # numpy's stubs declare ndarray.__buffer__ for Python 3.12+ only: an ndarray is a buffer.
            self.joined += memoryview(section)  # type: ignore[arg-type]
        else:
            self.sections.append(cast(memoryview, section))
        self.rows.append(row)
        self.section_bytes += len(section)


def decode_columns(
    buf: bytes | bytearray | memoryview,
    *,
    start_offset: int = 0,
    end_offset: int = OFFSET_END_MAX,
    include_headers: bool = False,
    check_crc: bool = True,
    group_bytes_max: int = limits.COLUMNS_GROUP_BYTES_MAX,
) -> Iterator[RecordColumns]:
    """Yield the records of every data batch in `buf` with offsets in [start_offset, end_offset).

    Usually one `RecordColumns` per call; more when the record sections exceed
    `group_bytes_max` (default limits.COLUMNS_GROUP_BYTES_MAX; a group holds at least one
    batch). Control batches are skipped and a partial trailing batch is
    ignored, as in decode_batches. Raises CorruptMessage (naming the batch's base offset
    and what is wrong) for anything decode_batches calls corrupt, and MessageTooLarge for
    a single batch whose records exceed ARROW_BINARY_BYTES_MAX or, compressed, decompress
    past clients.common.limits.DECOMPRESSED_BATCH_BYTES_MAX (as a leader refuses it).
    """
    data = np.frombuffer(buf, dtype=np.uint8)
    # Read-only whatever `buf` is: the kernels then compile for one array type only (each
    # specialisation costs seconds of compile time on a cold cache).
    data.flags.writeable = False
    table = np.empty((data.shape[0] // BATCH_HEADER_SIZE + 1, _SCAN_COLUMNS), dtype=np.int64)
    found, status, failed_at = _scan_batches(data, table)
    view = memoryview(buf).cast("B")
    group = _Group()
    for position, size, base_offset, crc, attributes, first_ts, max_ts, count, _ in table[:found].tolist():
        end = position + size
        if check_crc and crc32c(view[position + ATTRIBUTES_POS : end]) != crc:
            raise CorruptMessage(f"CRC mismatch in the batch at offset {base_offset}")
        if attributes & _CONTROL_MASK:
            continue
        codec = attributes & _CODEC_MASK
        section: memoryview | np.ndarray = (
            _decompress(codec, data[position + BATCH_HEADER_SIZE : end], base_offset)
            if codec
            else view[position + BATCH_HEADER_SIZE : end]
        )
        if count < 0 or count > len(section) // RECORD_BYTES_MIN:
            raise CorruptMessage(
                f"batch at offset {base_offset}: {_MESSAGES[_ERR_RECORD_COUNT]} "
                f"({count} records in {len(section)} bytes)"
            )
        if len(section) > ARROW_BINARY_BYTES_MAX:
            raise MessageTooLarge(
                f"batch at offset {base_offset}: its records take {len(section)} bytes, more "
                f"than an Arrow binary column holds ({ARROW_BINARY_BYTES_MAX})"
            )
        if group.rows and group.section_bytes + len(section) > group_bytes_max:
            yield _decode_group(data, group, start_offset, end_offset, include_headers)
            group = _Group()
        start = position + BATCH_HEADER_SIZE
        timestamp_type = 1 if attributes & _TIMESTAMP_TYPE_MASK else 0
        row = [start, start + len(section), count, base_offset, first_ts, max_ts, timestamp_type]
        group.add(row, section)
    if status != _OK:
        # Batches before the bad one are still yielded, as decode_batches yields their records.
        if group.rows:
            yield _decode_group(data, group, start_offset, end_offset, include_headers)
        raise CorruptMessage(
            f"batch at byte {failed_at} (offset {_base_offset_at(view, int(failed_at))}): {_MESSAGES[status]}"
        )
    if group.rows:
        yield _decode_group(data, group, start_offset, end_offset, include_headers)


def _base_offset_at(view: memoryview, position: int) -> int:
    return int.from_bytes(view[position : position + 8], "big", signed=True)


def _decompress(codec: int, stored: np.ndarray, base_offset: int) -> np.ndarray:
    """A compressed batch's records section, decompressed by the leader's decompressor.

    decompress_records words its errors for a refused produce ("nothing of this request was
    written"); a reader gets the same refusal in a reader's words, the codec's own error
    kept as the cause.
    """
    where = f"batch at offset {base_offset}"
    if codec not in CODEC_NAMES:
        # decompress_records is only called with codecs the leader has checked are known.
        raise CorruptMessage(f"{where}: unknown compression codec {codec}")
    try:
        return decompress_records(codec, stored, where)
    except MessageTooLarge as error:
        limit = common_limits.DECOMPRESSED_BATCH_BYTES_MAX
        raise MessageTooLarge(
            f"{where}: its records decompress as {CODEC_NAMES[codec]} to more than {limit} bytes "
            "(clients.common.limits.DECOMPRESSED_BATCH_BYTES_MAX, the most a leader accepts), so Spark "
            "does not inflate it: a decompression bomb, or a batch written before leaders checked that "
            "bound. Start the read past this batch (startingOffsets), or read it with a consumer"
        ) from error
    except CorruptMessage as error:
        cause = error.__cause__
        raise CorruptMessage(
            f"{where}: its records do not decompress as {CODEC_NAMES[codec]} "
            f"({type(cause).__name__}: {cause})"
        ) from cause


def _decode_group(
    data: np.ndarray, group: _Group, start_offset: int, end_offset: int, include_headers: bool
) -> RecordColumns:
    """Run the record kernel over one group and wrap its buffers as Arrow arrays."""
    batches = np.array(group.rows, dtype=np.int64).reshape(-1, _RECORD_TABLE_COLUMNS)
    src = data
    if group.joined is not None:
        # Decompressed sections live in their own bytes, joined as they came (_Group.add):
        # renumber their positions within the join (the copy costs little next to decompressing).
        src = np.frombuffer(group.joined, dtype=np.uint8)
        src.flags.writeable = False  # the kernel's one array type, as for the fetched bytes
        lengths = batches[:, _R_END] - batches[:, _R_START]
        batches[:, _R_END] = np.cumsum(lengths)
        batches[:, _R_START] = batches[:, _R_END] - lengths
    rows_max = int(batches[:, _R_COUNT].sum())
    bytes_max = group.section_bytes
    bitmap_bytes = (rows_max + 7) // 8
    key_offsets = np.empty(rows_max + 1, dtype=np.int32)
    key_data = np.empty(bytes_max, dtype=np.uint8)
    key_valid = np.zeros(bitmap_bytes, dtype=np.uint8)
    value_offsets = np.empty(rows_max + 1, dtype=np.int32)
    value_data = np.empty(bytes_max, dtype=np.uint8)
    value_valid = np.zeros(bitmap_bytes, dtype=np.uint8)
    offsets = np.empty(rows_max, dtype=np.int64)
    timestamps = np.empty(rows_max, dtype=np.int64)
    ts_types = np.empty(rows_max, dtype=np.int32)
    headers_max = bytes_max // HEADER_BYTES_MIN if include_headers else 0
    header_offsets = np.empty(rows_max + 1 if include_headers else 1, dtype=np.int32)
    hkey_offsets = np.empty(headers_max + 1, dtype=np.int32)
    hkey_data = np.empty(bytes_max if include_headers else 0, dtype=np.uint8)
    hvalue_offsets = np.empty(headers_max + 1, dtype=np.int32)
    hvalue_data = np.empty(bytes_max if include_headers else 0, dtype=np.uint8)
    hvalue_valid = np.zeros((headers_max + 7) // 8, dtype=np.uint8)
    sizes = np.zeros(_SIZES, dtype=np.int64)
    status = _decode_records(
        src,
        batches,
        start_offset,
        end_offset,
        include_headers,
        key_offsets,
        key_data,
        key_valid,
        value_offsets,
        value_data,
        value_valid,
        offsets,
        timestamps,
        ts_types,
        header_offsets,
        hkey_offsets,
        hkey_data,
        hvalue_offsets,
        hvalue_data,
        hvalue_valid,
        sizes,
    )
    if status != _OK:
        failed = batches[int(sizes[_S_FAILED_BATCH])]
        raise CorruptMessage(f"batch at offset {int(failed[_R_BASE_OFFSET])}: {_MESSAGES[status]}")
    rows = int(sizes[_S_ROWS])
    key = _binary(
        pa.binary(),
        rows,
        key_offsets,
        key_data,
        int(sizes[_S_KEY_BYTES]),
        key_valid,
        int(sizes[_S_KEY_NULLS]),
    )
    value = _binary(
        pa.binary(),
        rows,
        value_offsets,
        value_data,
        int(sizes[_S_VALUE_BYTES]),
        value_valid,
        int(sizes[_S_VALUE_NULLS]),
    )
    timestamp = pa.Array.from_buffers(TIMESTAMP_TYPE, rows, [None, pa.py_buffer(timestamps[:rows])])
    headers = None
    if include_headers:
        count = int(sizes[_S_HEADERS])
        hkey = _binary(pa.string(), count, hkey_offsets, hkey_data, int(sizes[_S_HKEY_BYTES]), None, 0)
        hvalue = _binary(
            pa.binary(),
            count,
            hvalue_offsets,
            hvalue_data,
            int(sizes[_S_HVALUE_BYTES]),
            hvalue_valid,
            int(sizes[_S_HVALUE_NULLS]),
        )
        entries = pa.Array.from_buffers(HEADERS_TYPE.value_type, count, [None], children=[hkey, hvalue])
        headers = pa.Array.from_buffers(
            HEADERS_TYPE, rows, [None, pa.py_buffer(header_offsets[: rows + 1])], children=[entries]
        )
    return RecordColumns(
        key=key,
        value=value,
        offset=pa.Array.from_buffers(pa.int64(), rows, [None, pa.py_buffer(offsets[:rows])]),
        timestamp=timestamp,
        timestamp_type=pa.Array.from_buffers(pa.int32(), rows, [None, pa.py_buffer(ts_types[:rows])]),
        headers=headers,
    )


def _validity(bitmap: np.ndarray | None, nulls: int) -> pa.Buffer | None:
    # No bitmap at all when nothing is null: Arrow's readers then skip the null checks.
    return pa.py_buffer(bitmap) if nulls and bitmap is not None else None


def _binary(
    kind: pa.DataType,
    rows: int,
    offsets: np.ndarray,
    data: np.ndarray,
    used: int,
    bitmap: np.ndarray | None,
    nulls: int,
) -> pa.Array:
    return pa.Array.from_buffers(
        kind,
        rows,
        [_validity(bitmap, nulls), pa.py_buffer(offsets[: rows + 1]), pa.py_buffer(data[:used])],
        null_count=nulls,
    )
