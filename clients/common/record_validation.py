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
- no control batch (only the transaction coordinator writes markers; Kafka refuses control
  batches from clients too), and a transactional batch only in a transactional producer's
  request whose partitions the coordinator verified (`transactional`, KIP-890);
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

The fields are read by clients/common/record_kernels.walk_record in its strict grammar, the
one reader Spark's decoder walks in aiokafka's grammar too; this module keeps the decisions:
offset deltas 0..n-1, null keys on compacted topics, exactly records_count records, the
timestamps, and the words of every refusal.

Cost: the record walk is a numba kernel (one call per batch) over the request's bytes,
without a Python step per record; bench/validate_bench.py measures it next to the rest of
the leader's append. The kernel is compiled for one signature when this module is imported
(at broker start-up, loaded from the cache numba keeps next to this file), not on the first
produce. numba keys that cache on this file alone: after changing record_kernels.py, clear
__pycache__/record_validation.*.nb[ic] too (`./dev setup` recompiles).

Errors: CorruptMessage (the bytes are damaged: unknown codec, do not decompress),
InvalidRecord (the records break the format), InvalidTimestamp, MessageTooLarge (the
records decompress past the limit); each says which batch,
what is wrong and what to do. The first problem found refuses the whole request for the
partition (Kafka's LogValidator throws for the request too): nothing of it is written.

Pure: no I/O, no clock (the leader's time comes in as `now_ms`).
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Sequence
from dataclasses import dataclass

import cramjam
import numpy as np
from numba import types

from clients.common import limits
from clients.common.errors import (
    CorruptMessage,
    HighwaterError,
    InvalidRecord,
    InvalidTimestamp,
    MessageTooLarge,
)
from clients.common.numba_types import KernelInt, njit_without_refcounts_for
from clients.common.record_batch import (
    BATCH_HEADER_SIZE,
    CONTROL_MASK,
    TIMESTAMP_TYPE_MASK,
    TRANSACTIONAL_MASK,
    BatchFix,
    BatchHeader,
    Buffer,
)
from clients.common.record_kernels import (
    RECORD_ATTRIBUTES_MAX,
    VARINT32_BYTES_MAX,
    VARINT_BYTES_MAX,
    WALK_ATTRIBUTES,
    WALK_HEADER_COUNT,
    WALK_HEADER_KEY_BOUNDS,
    WALK_HEADER_KEY_LENGTH,
    WALK_HEADER_KEY_UTF8,
    WALK_HEADER_VALUE_BOUNDS,
    WALK_HEADER_VALUE_LENGTH,
    WALK_KEY_BOUNDS,
    WALK_KEY_LENGTH,
    WALK_NULL_KEY,
    WALK_OFFSET_DELTA,
    WALK_OK,
    WALK_RECORD_BOUNDS,
    WALK_RECORD_LENGTH,
    WALK_RECORD_LENGTH_FIELD,
    WALK_VALUE_BOUNDS,
    WALK_VALUE_LENGTH,
    WALK_VARINT_TOO_LONG,
    WALK_VARINT_TRUNCATED,
    walk_record,
)

# --- the record grammar's bounds ---------------------------------------------------------
# The grammar itself (varint widths, int32 range, the attributes byte) is record_kernels'.
INT64_MAX = 2**63 - 1
# Kafka's RecordBatch.NO_TIMESTAMP: a record without a timestamp; the window does not apply.
NO_TIMESTAMP = -1

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


# --- kernel status codes (0 = fine): record_kernels' WALK_* for a record, and these for a section ---
_OK = WALK_OK
_ERR_FEWER_RECORDS = 100
_ERR_TRAILING_BYTES = 101

# What each status means; `{detail}` is the kernel's DETAIL column.
_MESSAGES = {
    WALK_VARINT_TRUNCATED: "a field runs past the end of the record",
    WALK_VARINT_TOO_LONG: (
        f"a varint is longer than its field allows ({VARINT32_BYTES_MAX} bytes for int32 fields, "
        f"{VARINT_BYTES_MAX} for the timestamp delta) or outside int32"
    ),
    _ERR_FEWER_RECORDS: "the records end after {detail} records, short of records_count",
    WALK_RECORD_LENGTH_FIELD: "its length field is {detail}",
    WALK_RECORD_BOUNDS: "its length field says {detail} bytes, more than remain in the batch",
    WALK_ATTRIBUTES: f"its attributes byte {{detail:#04x}} is above {RECORD_ATTRIBUTES_MAX:#04x}",
    WALK_OFFSET_DELTA: "its offset delta is {detail}; the deltas must run 0, 1, 2, ... in order",
    WALK_KEY_LENGTH: "its key length is {detail} (-1 means null; nothing lower is allowed)",
    WALK_KEY_BOUNDS: "its key of {detail} bytes runs past the end of the record",
    WALK_VALUE_LENGTH: "its value length is {detail} (-1 means null; nothing lower is allowed)",
    WALK_VALUE_BOUNDS: "its value of {detail} bytes runs past the end of the record",
    WALK_HEADER_COUNT: "its header count is {detail}",
    WALK_HEADER_KEY_LENGTH: "a header key length is {detail}",
    WALK_HEADER_KEY_BOUNDS: "a header key of {detail} bytes runs past the end of the record",
    WALK_HEADER_KEY_UTF8: "a header key is not UTF-8",
    WALK_HEADER_VALUE_LENGTH: "a header value length is {detail} (-1 means null; nothing lower is allowed)",
    WALK_HEADER_VALUE_BOUNDS: "a header value of {detail} bytes runs past the end of the record",
    WALK_RECORD_LENGTH: "its length field says {detail} bytes but its fields end elsewhere",
    _ERR_TRAILING_BYTES: "{detail} bytes follow the last of records_count records",
    WALK_NULL_KEY: "it has no key (null)",
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


# --- the kernel: record_kernels.walk_record reads, this decides -------------------------------

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


@njit_without_refcounts_for(_SECTION_SIGNATURE)
def _check_section(
    src: np.ndarray, pos: KernelInt, end: int, count: int, first_ts: int, key_min: int, out: np.ndarray
) -> int:
    """Check the records section src[pos:end] of a batch of `count` records; return its status (0: fine).

    The caller checked 0 <= pos <= end <= len(src). `out` gets (status, record index,
    detail, min timestamp, its record, max timestamp, its record): the _O_* slots.
    `key_min` is the smallest key length allowed: KEY_LENGTH_MIN_ANY, or
    KEY_LENGTH_MIN_COMPACTED to refuse null keys (WALK_NULL_KEY).

    Each record is read by record_kernels.walk_record in its strict grammar, with the offset
    deltas held to 0, 1, 2, ...; what is left here is the batch's part: exactly `count`
    records and no byte after them, and the timestamps' range.
    """
    min_ts: KernelInt = INT64_MAX
    min_record = -1
    max_ts: KernelInt = NO_TIMESTAMP
    max_record = -1
    status = _OK
    detail: KernelInt = 0
    i = 0
    while i < count:
        if pos >= end:
            status, detail = _ERR_FEWER_RECORDS, i
            break
        (status, detail, pos, _length, ts_delta, _delta, _key, _key_at, _value, _value_at, _headers, _at) = (
            walk_record(src, pos, end, True, key_min, i)
        )
        if status != _OK:
            break
        timestamp = first_ts + ts_delta  # wraps on overflow, as Java's long and aiokafka's int64_t
        if timestamp != NO_TIMESTAMP and timestamp < min_ts:
            min_ts, min_record = timestamp, i
        if timestamp > max_ts:
            max_ts, max_record = timestamp, i
        i += 1
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
    transactional: bool = False,
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

    `transactional`: the request comes from a transactional producer whose partitions the
    coordinator verified (services/kafka/txn_calls.py); only then may batches carry the
    transactional flag (a stray one would open a transaction no coordinator ends).
    """
    count = len(headers)
    key_min = KEY_LENGTH_MIN_ANY if compacted_partition is None else KEY_LENGTH_MIN_COMPACTED
    data = np.frombuffer(buf, dtype=np.uint8)
    data.flags.writeable = False  # one array type for the kernel's one signature
    out = np.empty(_OUT_COLUMNS, dtype=np.int64)
    fixes: list[BatchFix] = []
    for index, header in enumerate(headers):
        if header.attributes & _ATTRIBUTES_TO_CHECK:
            _check_attributes(header, index, count, transactional)
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
        if status == WALK_NULL_KEY:
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


def _check_attributes(header: BatchHeader, index: int, count: int, transactional: bool) -> None:
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
            f"(only the transaction coordinator writes markers); {_NOTHING_WRITTEN}. Send data batches only"
        )
    if header.is_transactional and not transactional:
        raise InvalidRecord(
            f"{_where(header, index, count)} is transactional, but the request comes from no transactional "
            "producer (transactional batches go through the Kafka listener with a transactional id, "
            "their partitions added to the transaction); no coordinator would commit or abort it and "
            f"read_committed consumers would wait for a marker forever; {_NOTHING_WRITTEN}. Send it "
            "without the transactional flag, or from a transactional producer"
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

    The formats are the clients' (aiokafka.codec: gzip as Python's gzip module reads it, the
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
            return _gzip_decompress(section, limit, too_big)
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


# zlib's window bits for a gzip stream (header and CRC-32 trailer checked), as GzipFile reads it.
_GZIP_WBITS = 31


def _gzip_decompress(section: np.ndarray, limit: int, too_big: HighwaterError) -> np.ndarray:
    """What gzip.GzipFile reads from `section` (aiokafka's gzip_decode), at most `limit` bytes.

    zlib directly rather than through GzipFile: GzipFile's reader decompresses in 8 KiB
    steps through a buffered stream, which made Spark's gzip reads ~1.8x slower. As GzipFile:
    one member after another (each one's CRC checked), zero padding after a member skipped,
    anything else after one is corrupt (zlib.error), and a stream that stops before its end
    is EOFError. `max_length` stops zlib one byte past what is left of `limit`, so a bomb
    costs at most the limit.
    """
    plain = bytearray()
    # numpy's stubs declare ndarray.__buffer__ for Python 3.12+ only: an ndarray is a buffer.
    rest: bytes | memoryview = memoryview(section)  # type: ignore[arg-type]
    while rest:
        member = zlib.decompressobj(wbits=_GZIP_WBITS)
        plain += member.decompress(rest, limit + 1 - len(plain))
        if len(plain) > limit:
            raise too_big
        # Under the bound, zlib stopped for want of input: the member must have ended.
        if not member.eof:
            raise EOFError("Compressed file ended before the end-of-stream marker was reached")
        rest = member.unused_data.lstrip(b"\x00")
    return np.frombuffer(plain, dtype=np.uint8)


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
