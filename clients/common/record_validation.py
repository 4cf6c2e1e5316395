"""What a leader checks inside a produced batch before appending it: Kafka's LogValidator.

clients/common/record_batch.py checks a batch's 61-byte header and CRC. A batch can pass
both and still stop every consumer for good ("poison batch", issue 17): an unknown
compression codec, a gzip flag on a body that is not gzip, records that do not parse, a
records_count that the bytes do not hold. So the leader, before anything of a produce
request is written, checks what Kafka's LogValidator checks (Partition.append_as_leader
calls `validate_records` right after `validate_batches`; followers append what a leader
accepted and do not check again):

- the codec is known (0 none, 1 gzip, 2 snappy, 3 lz4, 4 zstd), and a compressed records
  section decompresses, with the codec functions the clients use, to at most
  limits.DECOMPRESSED_BATCH_BYTES_MAX bytes (a zip bomb is refused, not inflated);
- the (decompressed) records section is exactly records_count Kafka v2 records: varint
  length, attributes int8, varint timestamp delta, varint offset delta (0..n-1 in order),
  key and value with varint lengths (-1 = null), varint header count and headers, and no
  bytes left over (last_offset_delta = n - 1 is the header check's);
- no control batch and no transactional batch: Highwater has no transactions, and nothing
  in clients/ writes either (Kafka refuses control batches from clients too);
- timestamps follow the topic: with CreateTime every record's timestamp (except -1, "none")
  lies within [now - message.timestamp.before.max.ms, now + message.timestamp.after.max.ms]
  and max_timestamp is set to the largest record timestamp, as Kafka sets it; with
  LogAppendTime the leader's clock becomes max_timestamp and the timestamp-type bit is set.
  A producer may not set that bit itself (Kafka: "Producer should not set timestamp type
  to LogAppendTime"). Both rewrites lie inside the CRC-covered bytes: they come back as
  `BatchFix`es and record_batch.apply_batch_fixes recomputes the CRC, as Kafka does.

The grammar is the union of Kafka's and of our two decoders' (aiokafka's, behind
clients/records.decode_batches, and spark_connector/columnar.py's): whatever passes here, both
decode. Where they differ we take the stricter: int32 fields (lengths, counts, offset
delta) are varints of at most 5 bytes within int32, as Kafka reads them; the attributes
byte must be below 0x80, so a reader of one int8 (Kafka) and a varint reader (aiokafka)
read the same byte; a length below -1 is refused rather than read as null; header keys
must be UTF-8 (aiokafka decodes them strictly).

Cost: the record walk is a numba kernel (one call per request for the uncompressed
batches, one per compressed batch) over the request's bytes, without a Python step per
record; bench/validate_bench.py measures it next to the rest of the leader's append. The
kernel is compiled for one signature when this module is imported (at broker start-up,
loaded from the cache numba keeps next to this file), not on the first produce.

Errors: CorruptMessage (the bytes are damaged: unknown codec, do not decompress),
InvalidRecord (the records break the format), InvalidTimestamp, MessageTooLarge (the
records decompress past the limit); each says which batch,
what is wrong and what to do. The first problem found refuses the whole request for the
partition (Kafka's LogValidator throws for the request too): nothing of it is written.

Pure: no I/O, no clock (the leader's time comes in as `now_ms`).
"""

from __future__ import annotations

import gzip
import io
import struct
from collections.abc import Sequence
from dataclasses import dataclass

import cramjam
import numpy as np
from numba import njit, types

from clients.common import limits
from clients.common.errors import (
    CorruptMessage,
    HighwaterError,
    InvalidRecord,
    InvalidTimestamp,
    MessageTooLarge,
)
from clients.common.numba_types import KernelInt
from clients.common.record_batch import (
    BATCH_HEADER_SIZE,
    CONTROL_MASK,
    TIMESTAMP_TYPE_MASK,
    TRANSACTIONAL_MASK,
    BatchFix,
    BatchHeader,
    Buffer,
)

# --- the record grammar's bounds ---------------------------------------------------------
# Kafka reads int32 fields as varints of at most 5 bytes and int64 ones of at most 10.
VARINT32_BYTES_MAX = 5
VARINT_BYTES_MAX = 10
INT32_MIN = -(2**31)
INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1
# Kafka's RecordBatch.NO_TIMESTAMP: a record without a timestamp; the window does not apply.
NO_TIMESTAMP = -1
# The attribute byte is read by Kafka as an int8 and by aiokafka as a varint: they agree
# only below 0x80.
RECORD_ATTRIBUTES_MAX = 0x7F

# Decompression tries a buffer of this many times the compressed size (at least the
# minimum) before one of limits.DECOMPRESSED_BATCH_BYTES_MAX: see _decompress.
DECOMPRESSION_FIRST_RATIO = 8
DECOMPRESSION_FIRST_BYTES_MIN = 1024 * 1024

CODEC_NONE, CODEC_GZIP, CODEC_SNAPPY, CODEC_LZ4, CODEC_ZSTD = 0, 1, 2, 3, 4
CODEC_NAMES = {
    CODEC_NONE: "none",
    CODEC_GZIP: "gzip",
    CODEC_SNAPPY: "snappy",
    CODEC_LZ4: "lz4",
    CODEC_ZSTD: "zstd",
}
_CODEC_MASK = 0x07
# Attribute bits that need a look beyond the records: codec, timestamp type, transactional, control.
_ATTRIBUTES_TO_CHECK = _CODEC_MASK | TIMESTAMP_TYPE_MASK | TRANSACTIONAL_MASK | CONTROL_MASK

# --- kernel status codes (0 = fine) --------------------------------------------------------
_OK = 0
_ERR_VARINT_TRUNCATED = 1
_ERR_VARINT_TOO_LONG = 2
_ERR_FEWER_RECORDS = 3
_ERR_RECORD_LENGTH_FIELD = 4
_ERR_RECORD_BOUNDS = 5
_ERR_ATTRIBUTES = 6
_ERR_OFFSET_DELTA = 7
_ERR_KEY_LENGTH = 8
_ERR_KEY_BOUNDS = 9
_ERR_VALUE_LENGTH = 10
_ERR_VALUE_BOUNDS = 11
_ERR_HEADER_COUNT = 12
_ERR_HEADER_KEY_LENGTH = 13
_ERR_HEADER_KEY_BOUNDS = 14
_ERR_HEADER_KEY_UTF8 = 15
_ERR_HEADER_VALUE_LENGTH = 16
_ERR_HEADER_VALUE_BOUNDS = 17
_ERR_RECORD_LENGTH = 18
_ERR_TRAILING_BYTES = 19
_ERR_NULL_KEY = 20

# What each status means; `{detail}` is the kernel's DETAIL column.
_MESSAGES = {
    _ERR_VARINT_TRUNCATED: "a field runs past the end of the record",
    _ERR_VARINT_TOO_LONG: (
        f"a varint is longer than its field allows ({VARINT32_BYTES_MAX} bytes for int32 fields, "
        f"{VARINT_BYTES_MAX} for the timestamp delta) or outside int32"
    ),
    _ERR_FEWER_RECORDS: "the records end after {detail} records, short of records_count",
    _ERR_RECORD_LENGTH_FIELD: "its length field is {detail}",
    _ERR_RECORD_BOUNDS: "its length field says {detail} bytes, more than remain in the batch",
    _ERR_ATTRIBUTES: f"its attributes byte {{detail:#04x}} is above {RECORD_ATTRIBUTES_MAX:#04x}",
    _ERR_OFFSET_DELTA: "its offset delta is {detail}; the deltas must run 0, 1, 2, ... in order",
    _ERR_KEY_LENGTH: "its key length is {detail} (-1 means null; nothing lower is allowed)",
    _ERR_KEY_BOUNDS: "its key of {detail} bytes runs past the end of the record",
    _ERR_VALUE_LENGTH: "its value length is {detail} (-1 means null; nothing lower is allowed)",
    _ERR_VALUE_BOUNDS: "its value of {detail} bytes runs past the end of the record",
    _ERR_HEADER_COUNT: "its header count is {detail}",
    _ERR_HEADER_KEY_LENGTH: "a header key length is {detail}",
    _ERR_HEADER_KEY_BOUNDS: "a header key of {detail} bytes runs past the end of the record",
    _ERR_HEADER_KEY_UTF8: "a header key is not UTF-8",
    _ERR_HEADER_VALUE_LENGTH: "a header value length is {detail} (-1 means null; nothing lower is allowed)",
    _ERR_HEADER_VALUE_BOUNDS: "a header value of {detail} bytes runs past the end of the record",
    _ERR_RECORD_LENGTH: "its length field says {detail} bytes but its fields end elsewhere",
    _ERR_TRAILING_BYTES: "{detail} bytes follow the last of records_count records",
    _ERR_NULL_KEY: "it has no key (null)",
}

# Slots of the array the kernel fills.
_O_STATUS, _O_RECORD, _O_DETAIL, _O_MIN_TS, _O_MIN_TS_RECORD, _O_MAX_TS, _O_MAX_TS_RECORD = (
    0,
    1,
    2,
    3,
    4,
    5,
    6,
)
_OUT_COLUMNS = 7

# The varint fields of a record, in order: the kernel's states.
_F_LENGTH, _F_TS_DELTA, _F_OFFSET_DELTA, _F_KEY, _F_VALUE, _F_HEADER_COUNT, _F_HEADER_KEY, _F_HEADER_VALUE = (
    range(8)
)


# --- kernels (read_varint and utf8_valid are shared with spark_connector/columnar.py) ------------------


@njit(cache=True, nogil=True, inline="always")
def read_varint(buf: np.ndarray, pos: KernelInt, end: KernelInt) -> tuple[KernelInt, KernelInt]:
    """(value, next position) of the zigzag varint at buf[pos:end]; next position < 0 on error.

    As aiokafka's decode_varint64: at most 10 bytes, bits past 64 dropped, then zigzag.
    -1: it runs past `end`; -2: it is longer than 10 bytes. Nothing is read at or past `end`.
    """
    if pos >= end:
        return 0, -1
    first = np.uint64(buf[pos])
    if first < np.uint64(0x80):
        # Most varints in a batch (attributes, deltas, small lengths) are one byte.
        return np.int64(first >> np.uint64(1)) ^ -np.int64(first & np.uint64(1)), pos + 1
    value = np.uint64(0)
    shift = np.uint64(0)
    while True:
        if pos >= end:
            return 0, -1
        byte = np.uint64(buf[pos])
        pos += 1
        if byte & np.uint64(0x80):
            value |= (byte & np.uint64(0x7F)) << shift
            shift += np.uint64(7)
            if shift > np.uint64(63):
                return 0, -2
        else:
            value |= byte << shift
            break
    return np.int64(value >> np.uint64(1)) ^ -np.int64(value & np.uint64(1)), pos


@njit(cache=True, nogil=True)
def utf8_valid(buf: np.ndarray, pos: KernelInt, end: KernelInt) -> bool:
    """Whether buf[pos:end] is well-formed UTF-8 as Python's strict decoder has it
    (no overlong forms, no surrogates, nothing above U+10FFFF). Reads nothing past `end`."""
    while pos < end:
        c = buf[pos]
        if c < 0x80:
            pos += 1
            continue
        if c < 0xC2:
            return False
        if c < 0xE0:
            need, low, high = 1, 0x80, 0xBF
        elif c < 0xF0:
            need = 2
            low = 0xA0 if c == 0xE0 else 0x80
            high = 0x9F if c == 0xED else 0xBF
        elif c < 0xF5:
            need = 3
            low = 0x90 if c == 0xF0 else 0x80
            high = 0x8F if c == 0xF4 else 0xBF
        else:
            return False
        if end - pos <= need:
            return False
        second = buf[pos + 1]
        if second < low or second > high:
            return False
        for k in range(2, need + 1):
            cont = buf[pos + k]
            if cont < 0x80 or cont > 0xBF:
                return False
        pos += need + 1
    return True


@njit(cache=True, nogil=True, inline="always")
def _short_varint(b0: KernelInt, b1: KernelInt, b2: KernelInt) -> tuple[KernelInt, int]:
    """(value, size) of a zigzag varint of 1 to 3 bytes from its first three bytes; size 0 if longer.

    Takes bytes, not the array: numba passes scalars to an inlined function for free (see
    _check_section on arrays).
    """
    if b0 < 0x80:
        raw, size = b0, 1
    elif b1 < 0x80:
        raw, size = (b0 & 0x7F) | (b1 << 7), 2
    elif b2 < 0x80:
        raw, size = (b0 & 0x7F) | ((b1 & 0x7F) << 7) | (b2 << 14), 3
    else:
        return 0, 0
    return (raw >> 1) ^ -(raw & 1), size


_SECTION_SIGNATURE = types.int64(
    types.Array(types.uint8, 1, "C", readonly=True),
    types.int64,
    types.int64,
    types.int64,
    types.int64,
    types.int64,
    types.Array(types.int64, 1, "C"),
)

# The smallest key length a record may have: -1 (null) anywhere, 0 on a compacted topic,
# where a record without a key could never be cleaned away (Kafka refuses it the same way).
KEY_LENGTH_MIN_ANY = -1
KEY_LENGTH_MIN_COMPACTED = 0


@njit(_SECTION_SIGNATURE, cache=True, nogil=True)
def _check_section(
    src: np.ndarray, pos: KernelInt, end: int, count: int, first_ts: int, key_min: int, out: np.ndarray
) -> int:
    """Check the records section src[pos:end] of a batch of `count` records; return its status (0: fine).

    The caller checked 0 <= pos <= end <= len(src). `out` gets (status, record index,
    detail, min timestamp, its record, max timestamp, its record): the _O_* slots.
    `key_min` is the smallest key length allowed: KEY_LENGTH_MIN_ANY, or
    KEY_LENGTH_MIN_COMPACTED to refuse null keys (_ERR_NULL_KEY). The fast path's key
    bound is `key_min` itself, so the check adds no work per record: a null key on a
    compacted topic only leaves the fast path for the field-by-field walk, which names it.

    Every read is checked against the end of its record (or, for a record's length, of
    its section) before it is made: numba checks no bounds. A record takes at least 7
    bytes and a header 2, or the walk fails, so no loop runs longer than the bytes allow
    whatever the counts claim.

    Why a state machine over the record's varint fields with one varint decoder in it,
    rather than a decoder function called per field: numba passes the array to an inlined
    function through a reference count it cannot prune here, two atomic calls per varint;
    that tripled the cost per record (~60 against ~20 ns for 100-byte records).
    """
    min_ts: KernelInt = INT64_MAX
    min_record = -1
    max_ts: KernelInt = NO_TIMESTAMP
    max_record = -1
    status = _OK
    detail: KernelInt = 0
    i = 0
    field = _F_LENGTH
    record_end: KernelInt = end
    record_length: KernelInt = 0
    ts_delta: KernelInt = 0
    headers_left: KernelInt = 0
    while i < count:
        if field == _F_LENGTH and pos < end:
            # Fast path for the usual record: no headers, every varint of 1-3 bytes. Reads are
            # clamped into the record (or section), so they stay in bounds whatever the bytes
            # say, and the record is taken only if its fields end exactly at its end, which
            # means no read was clamped. Anything else is read again below, field by field,
            # which also names what is wrong.
            last = end - 1
            length, size = _short_varint(
                np.int64(src[pos]), np.int64(src[min(pos + 1, last)]), np.int64(src[min(pos + 2, last)])
            )
            q = pos + size
            if size > 0 and 0 < length <= end - q:
                rend = q + length
                rlast = rend - 1
                attributes = np.int64(src[q])
                q += 1
                delta, size1 = _short_varint(
                    np.int64(src[min(q, rlast)]),
                    np.int64(src[min(q + 1, rlast)]),
                    np.int64(src[min(q + 2, rlast)]),
                )
                q += size1
                offset_delta, size2 = _short_varint(
                    np.int64(src[min(q, rlast)]),
                    np.int64(src[min(q + 1, rlast)]),
                    np.int64(src[min(q + 2, rlast)]),
                )
                q += size2
                key_len, size3 = _short_varint(
                    np.int64(src[min(q, rlast)]),
                    np.int64(src[min(q + 1, rlast)]),
                    np.int64(src[min(q + 2, rlast)]),
                )
                q += size3
                if (
                    size1 > 0
                    and size2 > 0
                    and size3 > 0
                    and attributes <= RECORD_ATTRIBUTES_MAX
                    and offset_delta == i
                    and key_min <= key_len <= rend - q
                ):
                    if key_len > 0:
                        q += key_len
                    value_len, size4 = _short_varint(
                        np.int64(src[min(q, rlast)]),
                        np.int64(src[min(q + 1, rlast)]),
                        np.int64(src[min(q + 2, rlast)]),
                    )
                    q += size4
                    if size4 > 0 and -1 <= value_len < rend - q:
                        if value_len > 0:
                            q += value_len
                        if q + 1 == rend and src[q] == 0:  # header count 0, and the record ends here
                            timestamp = first_ts + delta
                            if timestamp != NO_TIMESTAMP and timestamp < min_ts:
                                min_ts, min_record = timestamp, i
                            if timestamp > max_ts:
                                max_ts, max_record = timestamp, i
                            i += 1
                            pos = rend
                            continue
        if field == _F_LENGTH:
            if pos >= end:
                status, detail = _ERR_FEWER_RECORDS, i
                break
            limit: KernelInt = end
        else:
            limit = record_end
        # One zigzag varint at src[pos:limit], as aiokafka's decode_varint64 reads it.
        start = pos
        if pos >= limit:
            status = _ERR_VARINT_TRUNCATED
            break
        byte = np.int64(src[pos])
        pos += 1
        if byte < 0x80:
            raw = byte  # most fields of a record are one byte
        else:
            raw = byte & 0x7F
            shift = 7
            while True:
                if pos >= limit:
                    status = _ERR_VARINT_TRUNCATED
                    break
                byte = np.int64(src[pos])
                pos += 1
                raw |= (byte & 0x7F) << shift  # shift <= 63 here: bits past 64 drop, as in aiokafka
                if byte < 0x80:
                    break
                shift += 7
                if shift > 63:
                    status = _ERR_VARINT_TOO_LONG
                    break
            if status != _OK:
                break
        value = np.int64(np.uint64(raw) >> np.uint64(1)) ^ -(raw & 1)
        if field != _F_TS_DELTA and (
            pos - start > VARINT32_BYTES_MAX or value < INT32_MIN or value > INT32_MAX
        ):
            status = _ERR_VARINT_TOO_LONG
            break
        # What the value means depends on the field.
        if field == _F_LENGTH:
            if value < 0:
                status, detail = _ERR_RECORD_LENGTH_FIELD, value
                break
            if value > end - pos:
                status, detail = _ERR_RECORD_BOUNDS, value
                break
            record_length = value
            record_end = pos + value
            if pos >= record_end:
                status = _ERR_VARINT_TRUNCATED
                break
            attributes = np.int64(src[pos])
            if attributes > RECORD_ATTRIBUTES_MAX:
                status, detail = _ERR_ATTRIBUTES, attributes
                break
            pos += 1
            field = _F_TS_DELTA
            continue
        if field == _F_TS_DELTA:
            ts_delta = value
            field = _F_OFFSET_DELTA
            continue
        if field == _F_OFFSET_DELTA:
            if value != i:
                status, detail = _ERR_OFFSET_DELTA, value
                break
            field = _F_KEY
            continue
        if field == _F_KEY:
            if value < -1:
                status, detail = _ERR_KEY_LENGTH, value
                break
            if value < key_min:
                status = _ERR_NULL_KEY
                break
            if value > record_end - pos:
                status, detail = _ERR_KEY_BOUNDS, value
                break
            if value > 0:
                pos += value
            field = _F_VALUE
            continue
        if field == _F_VALUE:
            if value < -1:
                status, detail = _ERR_VALUE_LENGTH, value
                break
            if value > record_end - pos:
                status, detail = _ERR_VALUE_BOUNDS, value
                break
            if value > 0:
                pos += value
            field = _F_HEADER_COUNT
            continue
        if field == _F_HEADER_COUNT:
            if value < 0:
                status, detail = _ERR_HEADER_COUNT, value
                break
            headers_left = value
            field = _F_HEADER_KEY
        elif field == _F_HEADER_KEY:
            if value < 0:
                status, detail = _ERR_HEADER_KEY_LENGTH, value
                break
            if value > record_end - pos:
                status, detail = _ERR_HEADER_KEY_BOUNDS, value
                break
            if not utf8_valid(src, pos, pos + value):
                status = _ERR_HEADER_KEY_UTF8
                break
            pos += value
            field = _F_HEADER_VALUE
            continue
        else:  # _F_HEADER_VALUE
            if value < -1:
                status, detail = _ERR_HEADER_VALUE_LENGTH, value
                break
            if value > record_end - pos:
                status, detail = _ERR_HEADER_VALUE_BOUNDS, value
                break
            if value > 0:
                pos += value
            headers_left -= 1
            field = _F_HEADER_KEY
        if headers_left > 0:
            continue
        # The record's last field is read: it must end where its length said.
        if pos != record_end:
            status, detail = _ERR_RECORD_LENGTH, record_length
            break
        timestamp = first_ts + ts_delta  # wraps on overflow, as Java's long and aiokafka's int64_t
        if timestamp != NO_TIMESTAMP and timestamp < min_ts:
            min_ts, min_record = timestamp, i
        if timestamp > max_ts:
            max_ts, max_record = timestamp, i
        i += 1
        field = _F_LENGTH
    if status == _OK and pos != end:
        status, detail = _ERR_TRAILING_BYTES, end - pos
    out[_O_STATUS] = status
    out[_O_RECORD] = i
    out[_O_DETAIL] = detail
    out[_O_MIN_TS] = min_ts
    out[_O_MIN_TS_RECORD] = min_record
    out[_O_MAX_TS] = max_ts
    out[_O_MAX_TS_RECORD] = max_record
    return status


# --- Python side ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TimestampRules:
    """A topic's timestamp configs (Kafka's message.timestamp.*), as the leader applies them."""

    log_append_time: bool
    before_max_ms: int
    after_max_ms: int


_XERIAL_HEADER = b"\x82SNAPPY\x00\x00\x00\x00\x01\x00\x00\x00\x01"
_XERIAL_HEADER_BYTES = 16
_INT32 = struct.Struct(">i")


def validate_records(
    buf: Buffer,
    headers: Sequence[BatchHeader],
    *,
    rules: TimestampRules,
    now_ms: int,
    compacted_partition: str | None = None,
) -> list[BatchFix]:
    """Check the records of every batch in `buf` (`headers` from validate_batches on `buf`).

    Returns the rewrites the topic's timestamp rules ask for (empty for a CreateTime batch
    whose max_timestamp is right, the usual case). Raises CorruptMessage, InvalidRecord or
    InvalidTimestamp naming the first bad batch; then nothing of `buf` may be written.
    One kernel call per batch; the Python work per batch is a few attribute reads.

    `compacted_partition` names the partition ("topic-0") when its topic is compacted
    (cleanup.policy has "compact"): then a record without a key is refused with
    InvalidRecord naming the record, as Kafka's LogValidator refuses it, since the cleaner
    keeps the latest record per key and a keyless one has none.
    """
    count = len(headers)
    key_min = KEY_LENGTH_MIN_ANY if compacted_partition is None else KEY_LENGTH_MIN_COMPACTED
    data = np.frombuffer(buf, dtype=np.uint8)
    data.flags.writeable = False  # one array type for the kernel's one signature
    out = np.empty(_OUT_COLUMNS, dtype=np.int64)
    fixes: list[BatchFix] = []
    for index, header in enumerate(headers):
        if header.attributes & _ATTRIBUTES_TO_CHECK:
            _check_attributes(header, index, count)
        if header.attributes & _CODEC_MASK:
            section = decompress_records(
                header.compression,
                data[header.position + BATCH_HEADER_SIZE : header.end_position],
                _where(header, index, count),
            )
            section.flags.writeable = False
            status = _check_section(
                section, 0, len(section), header.records_count, header.first_timestamp, key_min, out
            )
        else:
            status = _check_section(
                data,
                header.position + BATCH_HEADER_SIZE,
                header.end_position,
                header.records_count,
                header.first_timestamp,
                key_min,
                out,
            )
        row = out.tolist()
        if status == _ERR_NULL_KEY:
            raise _keyless_error(header, index, count, row[_O_RECORD], compacted_partition or "")
        if status != _OK:
            raise _record_error(header, index, count, row)
        fix = _check_timestamps(header, index, count, row, rules, now_ms)
        if fix is not None:
            fixes.append(fix)
    return fixes


def _where(header: BatchHeader, index: int, count: int) -> str:
    return (
        f"batch {index + 1} of {count} (at byte {header.position} of the request, "
        f"{CODEC_NAMES.get(header.compression, 'unknown codec')}, records_count {header.records_count})"
    )


_NOTHING_WRITTEN = "nothing of this request was written to the partition"


def _check_attributes(header: BatchHeader, index: int, count: int) -> None:
    """The per-batch checks that need no record: codec, control, transactional, timestamp type."""
    codec = header.compression
    if codec not in CODEC_NAMES:
        raise CorruptMessage(
            f"{_where(header, index, count)}: unknown compression codec {codec} (known: 0 none, 1 gzip, 2 "
            "snappy, "
            f"3 lz4, 4 zstd); {_NOTHING_WRITTEN}. The producer's batch encoder is broken or the bytes were "
            "damaged before the CRC was computed: send the records again from a correct encoder"
        )
    if header.is_control:
        raise InvalidRecord(
            f"{_where(header, index, count)} is a control batch; producers may not write control batches "
            f"(Highwater has no transactions); {_NOTHING_WRITTEN}. Send data batches only"
        )
    if header.is_transactional:
        raise InvalidRecord(
            f"{_where(header, index, count)} is transactional; Highwater has no transactions, so it cannot "
            "commit "
            f"or abort it and consumers would wait for a marker forever; {_NOTHING_WRITTEN}. Send it without "
            "the transactional flag"
        )
    if header.attributes & TIMESTAMP_TYPE_MASK:
        raise InvalidTimestamp(
            f"{_where(header, index, count)} has the LogAppendTime timestamp type set; only the leader sets "
            f"it (for topics with message.timestamp.type=LogAppendTime); {_NOTHING_WRITTEN}. Send it as "
            "CreateTime"
        )


def _record_error(header: BatchHeader, index: int, count: int, row: list[int]) -> HighwaterError:
    status, record, detail = row[_O_STATUS], row[_O_RECORD], row[_O_DETAIL]
    what = _MESSAGES[status].format(detail=detail)
    subject = "" if status in (_ERR_FEWER_RECORDS, _ERR_TRAILING_BYTES) else f"record {record}: "
    return InvalidRecord(
        f"{_where(header, index, count)}: {subject}{what}; {_NOTHING_WRITTEN}. The records do not follow "
        "Kafka's v2 record format (a broken encoder): send them again from a correct one"
    )


def _keyless_error(
    header: BatchHeader, index: int, count: int, record: int, partition: str
) -> HighwaterError:
    """Kafka's words first (clients match on them), then which record, as Kafka's record_errors
    (RecordError.batchIndex: the record's index within its batch) would say."""
    return InvalidRecord(
        f"Compacted topic cannot accept message without key in topic partition {partition}: "
        f"{_where(header, index, count)}: record {record} has a null key; {_NOTHING_WRITTEN}. A compacted "
        "topic (cleanup.policy=compact) keeps the latest record per key, so every record needs a key: "
        "send the records with keys, or use a topic with cleanup.policy=delete"
    )


def decompress_records(codec: int, section: np.ndarray, where: str) -> np.ndarray:
    """The decompressed records section; CorruptMessage if it does not decompress, MessageTooLarge
    if it would take more than DECOMPRESSED_BATCH_BYTES_MAX.

    The formats are the clients' (aiokafka.codec: gzip through Python's gzip module, the
    others through cramjam, snappy with or without xerial framing), so what passes here
    the clients decompress; but output goes into a bounded buffer or is read in a bounded
    amount, so a small batch that inflates to gigabytes costs at most the limit.
    """
    limit = limits.DECOMPRESSED_BATCH_BYTES_MAX
    too_big = MessageTooLarge(
        f"{where}: its records decompress to more than {limit} bytes (limits.DECOMPRESSED_BATCH_BYTES_MAX); "
        f"{_NOTHING_WRITTEN}. Send smaller batches"
    )
    try:
        if codec == CODEC_GZIP:
            # numpy's stubs declare ndarray.__buffer__ for Python 3.12+ only: an ndarray is a buffer.
            with gzip.GzipFile(fileobj=io.BytesIO(section), mode="rb") as reader:  # type: ignore[arg-type]
                plain = reader.read(limit + 1)
            if len(plain) > limit:
                raise too_big
            return np.frombuffer(plain, dtype=np.uint8)
        if codec == CODEC_SNAPPY:
            return _snappy_decompress(section, limit, too_big)
        decompress_into = cramjam.lz4.decompress_into if codec == CODEC_LZ4 else cramjam.zstd.decompress_into
        # A first buffer for usual compression ratios, then one of the whole limit: a 64 MiB
        # buffer per batch is a fresh mmap each time (past glibc's mmap threshold), which
        # cost a 16 KiB batch more than decompressing it.
        first_bytes = min(limit, max(len(section) * DECOMPRESSION_FIRST_RATIO, DECOMPRESSION_FIRST_BYTES_MIN))
        for size_max in (first_bytes, limit):
            out = np.empty(size_max + 1, dtype=np.uint8)
            try:
                # numpy's stubs declare ndarray.__buffer__ for Python 3.12+ only: an ndarray is a buffer.
                size = decompress_into(section, out)  # type: ignore[arg-type]
            except cramjam.DecompressionError as error:
                # cramjam stops writing when the buffer is full and says so; any other error is damage.
                if "whole buffer" in str(error):
                    continue
                raise
            if size <= size_max:
                return out[:size]
        raise too_big
    except MessageTooLarge:
        raise
    except MemoryError:
        raise
    except Exception as error:  # every codec has its own error types: zlib.error, EOFError, cramjam's...
        raise CorruptMessage(
            f"{where}: its records do not decompress as {CODEC_NAMES[codec]} ({type(error).__name__}: "
            f"{error}); "
            f"{_NOTHING_WRITTEN}. The compression flag does not match the bytes, or they were damaged before "
            "the CRC was computed: send the records again"
        ) from error


def _snappy_decompress(section: np.ndarray, limit: int, too_big: HighwaterError) -> np.ndarray:
    """aiokafka's snappy_decode (raw snappy, or xerial blocks of raw snappy) with every block's
    declared size checked against `limit` before it is decompressed."""
    if len(section) > _XERIAL_HEADER_BYTES and bytes(section[:_XERIAL_HEADER_BYTES]) == _XERIAL_HEADER:
        blocks: list[np.ndarray] = []
        cursor = _XERIAL_HEADER_BYTES
        while cursor < len(section):
            if len(section) - cursor < _INT32.size:
                raise ValueError(f"xerial block length truncated at byte {cursor}")
            # numpy's stubs declare ndarray.__buffer__ for Python 3.12+ only: an ndarray is a buffer.
            (size,) = _INT32.unpack_from(section, cursor)  # type: ignore[arg-type]
            cursor += _INT32.size
            if size < 0 or size > len(section) - cursor:
                raise ValueError(f"xerial block of {size} bytes at byte {cursor} runs past the end")
            blocks.append(section[cursor : cursor + size])
            cursor += size
    else:
        blocks = [section]
    total = 0
    for block in blocks:
        # numpy's stubs declare ndarray.__buffer__ for Python 3.12+ only: an ndarray is a buffer.
        total += cramjam.snappy.decompress_raw_len(block)  # type: ignore[arg-type]
        if total > limit:
            raise too_big
    # numpy's stubs declare ndarray.__buffer__ for Python 3.12+ only: an ndarray is a buffer.
    return np.frombuffer(
        b"".join(bytes(cramjam.snappy.decompress_raw(block)) for block in blocks),  # type: ignore[arg-type]
        dtype=np.uint8,
    )


def _check_timestamps(
    header: BatchHeader, index: int, count: int, row: list[int], rules: TimestampRules, now_ms: int
) -> BatchFix | None:
    """The topic's timestamp rules for one checked batch: refuse, rewrite, or leave it as it is."""
    if rules.log_append_time:
        return BatchFix(header.position, header.attributes | TIMESTAMP_TYPE_MASK, now_ms)
    min_ts, min_record = row[_O_MIN_TS], row[_O_MIN_TS_RECORD]
    max_ts, max_record = row[_O_MAX_TS], row[_O_MAX_TS_RECORD]
    if min_record >= 0 and now_ms - min_ts > rules.before_max_ms:
        raise InvalidTimestamp(
            f"{_where(header, index, count)}: record {min_record} has timestamp {min_ts}, {now_ms - min_ts} "
            f"ms before the leader's clock ({now_ms}); the topic's message.timestamp.before.max.ms is "
            f"{rules.before_max_ms}, so timestamps must lie in [{now_ms - rules.before_max_ms}, "
            f"{now_ms + rules.after_max_ms}]; {_NOTHING_WRITTEN}. Fix the producer's timestamps or clock, or "
            "raise the topic's limit"
        )
    if max_record >= 0 and max_ts != NO_TIMESTAMP and max_ts - now_ms > rules.after_max_ms:
        raise InvalidTimestamp(
            f"{_where(header, index, count)}: record {max_record} has timestamp {max_ts}, {max_ts - now_ms} "
            f"ms after the leader's clock ({now_ms}); the topic's message.timestamp.after.max.ms is "
            f"{rules.after_max_ms}, so timestamps must lie in [{now_ms - rules.before_max_ms}, "
            f"{now_ms + rules.after_max_ms}]; {_NOTHING_WRITTEN}. Fix the producer's timestamps or clock, or "
            "raise the topic's limit"
        )
    if header.max_timestamp != max_ts:
        # Kafka sets a CreateTime batch's max_timestamp to its largest record timestamp: the
        # time index and time-based retention trust it, so a wrong one must not be stored.
        return BatchFix(header.position, header.attributes, max_ts)
    return None
