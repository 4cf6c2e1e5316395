"""The broker's view of a Kafka RecordBatch v2 (magic 2): the 61-byte header, never the records.

DESIGN.md section 4: the broker validates the header and CRC, patches `base_offset`
and `partition_leader_epoch` (both lie before the CRC-covered range, so patching
them never invalidates the CRC) and writes the bytes as they came. All work here is
per batch, never per record: one `struct.unpack_from` and one CRC-32C over a
memoryview (no copy) per batch.

Layout (big-endian), byte positions within a batch:

    0  base_offset            int64   first offset of the batch (assigned by the leader)
    8  batch_length           int32   bytes after this field: size of the batch = batch_length + 12
    12 partition_leader_epoch int32   leader epoch that appended the batch
    16 magic                  int8    always 2
    17 crc                    uint32  CRC-32C of bytes [21, end of batch)
    21 attributes             int16   compression (bits 0-2), timestamp type (3), transactional (4),
                                      control (5)
    23 last_offset_delta      int32   last offset = base_offset + last_offset_delta
    27 first_timestamp        int64
    35 max_timestamp          int64
    43 producer_id            int64
    51 producer_epoch         int16
    53 base_sequence          int32
    57 records_count          int32
    61 records...

The records after the header are checked by the leader only, in
clients/common/record_validation.py (Kafka's LogValidator). The varints below are shared by
whoever frames bytes by hand: protobuf lengths and tags (services/controller/wire.py) and
Kafka's zigzag varints of record fields (the Producer's large-value batches, records.py).

Pure module: no I/O, no clock, no asyncio.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from crc32c import crc32c

from clients.common.errors import CorruptMessage, MessageTooLarge, check

BASE_OFFSET_POS = 0
BATCH_LENGTH_POS = 8
PARTITION_LEADER_EPOCH_POS = 12
MAGIC_POS = 16
CRC_POS = 17
ATTRIBUTES_POS = 21
LAST_OFFSET_DELTA_POS = 23
FIRST_TIMESTAMP_POS = 27
MAX_TIMESTAMP_POS = 35
PRODUCER_ID_POS = 43
PRODUCER_EPOCH_POS = 51
BASE_SEQUENCE_POS = 53
RECORDS_COUNT_POS = 57
BATCH_HEADER_SIZE = 61

# The "log overhead" of Kafka: base_offset + batch_length precede the length-counted bytes.
LOG_OVERHEAD = 12
# Smallest legal batch_length: a header with zero record bytes.
MIN_BATCH_LENGTH = BATCH_HEADER_SIZE - LOG_OVERHEAD
# The CRC covers [CRC_START_POS, end of batch).
CRC_START_POS = ATTRIBUTES_POS
MAGIC_V2 = 2

COMPRESSION_MASK = 0x07
TIMESTAMP_TYPE_MASK = 0x08
TRANSACTIONAL_MASK = 0x10
CONTROL_MASK = 0x20
# Kafka's names of the timestamp types, by the value of the timestamp-type bit (its topic
# config message.timestamp.type takes these).
TIMESTAMP_TYPES = ("CreateTime", "LogAppendTime")

# Offsets are int64 but a batch spans at most 2**31 offsets (last_offset_delta is int32).
MAX_LAST_OFFSET_DELTA = 2**31 - 1


def varint(n: int) -> bytes:
    """Base-128 varint of a non-negative int, low 7 bits first (protobuf's lengths and tags;
    Kafka's record framing after zigzag: record_varint)."""
    if n < 0:
        raise ValueError(f"varint of a negative number {n}: lengths and tags only")
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def record_varint(n: int) -> bytes:
    """Kafka's signed varint of a record's fields (lengths, deltas; -1 for null): zigzag, then varint."""
    return varint((n << 1) ^ (n >> 63))


_HEADER = struct.Struct(">qiibIhiqqqhii")
check(
    _HEADER.size == BATCH_HEADER_SIZE,
    "header struct is %d bytes, expected %d",
    _HEADER.size,
    BATCH_HEADER_SIZE,
)
_INT64 = struct.Struct(">q")
_INT32 = struct.Struct(">i")
_INT16 = struct.Struct(">h")
_UINT32 = struct.Struct(">I")
_LENGTH_PREFIX = struct.Struct(">qi")

Buffer = bytes | bytearray | memoryview
# What _HEADER unpacks to: BatchHeader's fields from base_offset to records_count, in order.
_HeaderFields = tuple[int, int, int, int, int, int, int, int, int, int, int, int, int]


@dataclass(frozen=True, slots=True)
class BatchHeader:
    """One parsed batch header plus where the batch sits in the buffer it was read from.

    `position` is the byte position of the batch in that buffer and `size_bytes`
    its full size (batch_length + 12): the batch is bytes [position, position + size_bytes).
    """

    base_offset: int
    batch_length: int
    partition_leader_epoch: int
    magic: int
    crc: int
    attributes: int
    last_offset_delta: int
    first_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    records_count: int
    position: int
    size_bytes: int

    @property
    def last_offset(self) -> int:
        """Offset of the last record: the batch covers [base_offset, last_offset + 1)."""
        return self.base_offset + self.last_offset_delta

    @property
    def next_offset(self) -> int:
        """First offset after this batch (exclusive end of its offset range)."""
        return self.base_offset + self.last_offset_delta + 1

    @property
    def end_position(self) -> int:
        return self.position + self.size_bytes

    @property
    def compression(self) -> int:
        """0 none, 1 gzip, 2 snappy, 3 lz4, 4 zstd."""
        return self.attributes & COMPRESSION_MASK

    @property
    def timestamp_type(self) -> int:
        """0 CreateTime, 1 LogAppendTime."""
        return 1 if self.attributes & TIMESTAMP_TYPE_MASK else 0

    @property
    def is_transactional(self) -> bool:
        return bool(self.attributes & TRANSACTIONAL_MASK)

    @property
    def is_control(self) -> bool:
        return bool(self.attributes & CONTROL_MASK)


def parse_header(buf: Buffer, position: int = 0, *, position_base: int = 0) -> BatchHeader:
    """The header at `position` of `buf` (at least BATCH_HEADER_SIZE bytes must be there), unchecked.

    The header's `position` is `position_base + position`: callers reading a piece of a
    file pass the piece's file position so headers carry file positions.
    """
    fields: _HeaderFields = _HEADER.unpack_from(buf, position)
    return BatchHeader(*fields, position_base + position, fields[1] + LOG_OVERHEAD)


def with_assigned_offset(header: BatchHeader, base_offset: int, partition_leader_epoch: int) -> BatchHeader:
    """A copy of `header` with the two fields the leader assigns (cheaper than dataclasses.replace)."""
    return BatchHeader(
        base_offset,
        header.batch_length,
        partition_leader_epoch,
        header.magic,
        header.crc,
        header.attributes,
        header.last_offset_delta,
        header.first_timestamp,
        header.max_timestamp,
        header.producer_id,
        header.producer_epoch,
        header.base_sequence,
        header.records_count,
        header.position,
        header.size_bytes,
    )


def batch_crc(buf: Buffer, position: int, size_bytes: int) -> int:
    """CRC-32C of the CRC-covered bytes of the batch at [position, position + size_bytes)."""
    view = memoryview(buf)
    return crc32c(view[position + CRC_START_POS : position + size_bytes])


def check_batch(
    buf: Buffer,
    position: int,
    *,
    max_batch_bytes: int | None,
    position_base: int = 0,
    exact_count: bool = True,
) -> BatchHeader:
    """Parse and check the batch at `position` of `buf`; return its header.

    Positions in messages and in the header are `position_base` + the position in `buf`
    (a caller checking a piece of a file passes the piece's file position).

    Raises CorruptMessage saying what is wrong and at which byte, or MessageTooLarge.
    The order of checks matters: a length is checked before anything trusts it, and
    the size limit before the CRC so an oversized batch costs no CRC work.
    """
    remaining = len(buf) - position
    at = position_base + position
    if remaining < BATCH_HEADER_SIZE:
        raise CorruptMessage(
            f"truncated batch header at byte {at}: {remaining} bytes left, a header is {BATCH_HEADER_SIZE}"
        )
    header = parse_header(buf, position, position_base=position_base)
    if header.batch_length < MIN_BATCH_LENGTH:
        raise CorruptMessage(
            f"batch_length {header.batch_length} at byte {at} is below the minimum {MIN_BATCH_LENGTH}"
        )
    if header.size_bytes > remaining:
        raise CorruptMessage(
            f"batch at byte {at} declares {header.size_bytes} bytes but only {remaining} remain"
        )
    if header.magic != MAGIC_V2:
        raise CorruptMessage(
            f"batch at byte {at} has magic {header.magic}, only magic {MAGIC_V2} is supported"
        )
    if max_batch_bytes is not None and header.size_bytes > max_batch_bytes:
        raise MessageTooLarge(
            f"batch at byte {at} is {header.size_bytes} bytes, the limit is {max_batch_bytes}"
        )
    actual_crc = batch_crc(buf, position, header.size_bytes)
    if actual_crc != header.crc:
        raise CorruptMessage(
            f"CRC mismatch in batch at byte {at}: stored {header.crc:#010x}, computed {actual_crc:#010x}"
        )
    if not 0 <= header.last_offset_delta <= MAX_LAST_OFFSET_DELTA:
        raise CorruptMessage(f"batch at byte {at} has last_offset_delta {header.last_offset_delta}")
    if exact_count and header.records_count != header.last_offset_delta + 1:
        raise CorruptMessage(
            f"batch at byte {at} has records_count {header.records_count} but last_offset_delta "
            f"{header.last_offset_delta} (records_count must be last_offset_delta + 1)"
        )
    if not 0 <= header.records_count <= header.last_offset_delta + 1:
        # A batch the log cleaner filtered keeps its last_offset_delta (Kafka's), so it holds fewer
        # records than its offset range, none at all when it is kept only for its producer state.
        raise CorruptMessage(
            f"batch at byte {at} has records_count {header.records_count} outside 0..last_offset_delta + 1 "
            f"({header.last_offset_delta + 1})"
        )
    return header


def validate_batches(
    buf: Buffer, *, max_batch_bytes: int | None, exact_count: bool = True
) -> list[BatchHeader]:
    """Check every batch in `buf` and return their headers in order.

    Raises CorruptMessage (saying what and at which byte) for an empty or short
    buffer, a batch_length below the header or past the end of the buffer, a magic
    other than 2, a CRC mismatch or inconsistent offset counts; MessageTooLarge for
    a batch bigger than `max_batch_bytes` (its full size, log overhead included,
    as Kafka's max.message.bytes; None: no limit, for batches a leader accepted). Nothing is modified.
    `exact_count` holds records_count to last_offset_delta + 1, as a producer's batch must be;
    False for batches already in a log, which the log cleaner may have filtered.
    """
    if len(buf) == 0:
        raise CorruptMessage("empty record buffer: at least one batch is required")
    headers: list[BatchHeader] = []
    position = 0
    end = len(buf)
    while position < end:
        header = check_batch(buf, position, max_batch_bytes=max_batch_bytes, exact_count=exact_count)
        headers.append(header)
        position += header.size_bytes
    return headers


def valid_prefix(buf: Buffer, *, position_base: int = 0) -> tuple[list[BatchHeader], int, str]:
    """Walk batches from the start of `buf` until the first unsound one (recovery's scan).

    Returns (headers of the sound batches, end of the sound prefix, why the walk stopped:
    "" when it reached the end of `buf` exactly). Positions, in headers, in the end and
    in the reason, are `position_base` + the position in `buf`. Checks lengths, magic,
    CRC and counts; applies no size limit (a batch on disk was accepted once).
    """
    headers: list[BatchHeader] = []
    position = 0
    end = len(buf)
    while position < end:
        try:
            header = check_batch(
                buf, position, max_batch_bytes=None, position_base=position_base, exact_count=False
            )
        except CorruptMessage as error:
            return headers, position_base + position, error.message
        headers.append(header)
        position += header.size_bytes
    return headers, position_base + position, ""


def iter_batch_headers(
    buf: Buffer, start_position: int = 0, *, position_base: int = 0
) -> Iterator[BatchHeader]:
    """Yield headers of complete batches without checking CRCs (data already validated).

    Stops cleanly at a torn tail: a batch whose header or body is incomplete, or whose
    batch_length is impossible, ends the walk without being yielded. Header positions
    are `position_base` + the position in `buf`.
    """
    position = start_position
    end = len(buf)
    while end - position >= BATCH_HEADER_SIZE:
        header = parse_header(buf, position, position_base=position_base)
        if header.batch_length < MIN_BATCH_LENGTH or header.size_bytes > end - position:
            return
        yield header
        position += header.size_bytes


def next_fetch_offset(buf: Buffer, fetch_offset: int) -> int | None:
    """The offset after the last complete batch in fetched `buf` (None: no complete batch).

    Where a reader fetching from `fetch_offset` goes next: the consumer and the Spark reader
    both step over compacted holes and control batches by it, not by counting records.
    """
    last = None
    for header in iter_batch_headers(buf):
        last = header.next_offset
    return None if last is None else max(last, fetch_offset)


def peek_batch_extent(buf: Buffer, position: int = 0) -> tuple[int, int] | None:
    """(base_offset, size_bytes) of the batch at `position` from its first 12 bytes, or None if short."""
    if len(buf) - position < LOG_OVERHEAD:
        return None
    base_offset, batch_length = _LENGTH_PREFIX.unpack_from(buf, position)
    return base_offset, batch_length + LOG_OVERHEAD


def assign_offsets(buf: bytearray, headers: list[BatchHeader], first_offset: int, leader_epoch: int) -> int:
    """Patch base_offset and partition_leader_epoch of every batch in place; return the next offset.

    Offsets become contiguous from `first_offset`: batch i starts right after batch i-1's
    last offset. Both fields lie before the CRC-covered range, so CRCs stay valid.
    `headers` must come from validate_batches on this same buffer (their positions are used);
    they are not updated (they are frozen): re-read with iter_batch_headers if needed.
    """
    check(first_offset >= 0, "assign_offsets: first_offset %d is negative", first_offset)
    next_offset = first_offset
    for header in headers:
        _INT64.pack_into(buf, header.position + BASE_OFFSET_POS, next_offset)
        _INT32.pack_into(buf, header.position + PARTITION_LEADER_EPOCH_POS, leader_epoch)
        next_offset += header.last_offset_delta + 1
    return next_offset


@dataclass(frozen=True, slots=True)
class BatchFix:
    """New attributes and max_timestamp for the batch at byte `position` of a request.

    What the leader's timestamp rules rewrite (clients/common/record_validation.py): the
    LogAppendTime type bit with the leader's clock, or a CreateTime batch's true maximum.
    """

    position: int
    attributes: int
    max_timestamp: int


def apply_batch_fixes(
    buf: Buffer, headers: Sequence[BatchHeader], fixes: Sequence[BatchFix]
) -> tuple[bytearray, list[BatchHeader]]:
    """A copy of `buf` with every fix written and its batch's CRC recomputed, and the headers of the copy.

    Unlike base_offset and partition_leader_epoch, attributes and max_timestamp lie inside
    the CRC-covered range, so the CRC must follow (as Kafka's DefaultRecordBatch.setMaxTimestamp
    does). `headers` come from validate_batches on `buf`; every fix names one of their positions.
    """
    out = bytearray(buf)
    by_position = {header.position: index for index, header in enumerate(headers)}
    fixed = list(headers)
    for fix in fixes:
        index = by_position.get(fix.position, -1)
        check(index >= 0, "apply_batch_fixes: no batch at byte %d", fix.position)
        header = headers[index]
        _INT16.pack_into(out, fix.position + ATTRIBUTES_POS, fix.attributes)
        _INT64.pack_into(out, fix.position + MAX_TIMESTAMP_POS, fix.max_timestamp)
        _UINT32.pack_into(out, fix.position + CRC_POS, batch_crc(out, fix.position, header.size_bytes))
        fixed[index] = parse_header(out, fix.position)
    return out, fixed
