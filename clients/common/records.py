"""The client's record codec: Kafka RecordBatch v2 encode/decode behind our own names.

The work is done by aiokafka's Cython `aiokafka.record` (an internal API, which is
why pyproject pins aiokafka==0.14.0 and why nothing else in Highwater imports it).
FACTS.md measured the compiled `_crecords` at ~3 M records/s encode and ~2 M decode,
and the pure-Python fallback it silently drops to (NO_EXTENSIONS, musl, a failed
build) about 60x slower; `codec_is_accelerated()` says which one is loaded and a
warning is logged once when it is the slow one.

Producers build one batch per partition per send (`encode_batch` / `encode_values`);
uncompressed bulk runs of large values are framed here instead (`_encode_large_runs`: the
same bytes, with a hardware CRC-32C where aiokafka's is software);
readers turn fetched bytes back into `Record`s (`decode_batches`). The Consumer decodes
straight into the objects it hands out, a batch at a time as it hands them out
(`iter_records_as`, one list comprehension per batch over the compiled records:
tests/unit/test_consumer_decode.py holds it to decode_batches' answers). The Spark reader
decodes the same bytes into Arrow columns instead (spark_connector/columnar.py, numba),
with the same rules: tests/unit/test_columnar.py holds the two to the same answers.
The broker never uses this module: it sees batches only through
clients/common/record_batch.py.
"""

from __future__ import annotations

import functools
import logging
import struct
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

from aiokafka.errors import CorruptRecordException
from aiokafka.record.default_records import DefaultRecord, DefaultRecordBatch, DefaultRecordBatchBuilder
from crc32c import crc32c

from clients.common.errors import CorruptMessage, InvalidRequest, check
from clients.common.record_batch import (
    BATCH_HEADER_SIZE,
    BATCH_LENGTH_POS,
    CRC_START_POS,
    LOG_OVERHEAD,
    MAGIC_POS,
    MIN_BATCH_LENGTH,
    RECORDS_COUNT_POS,
    record_varint,
)

if TYPE_CHECKING:
    from typing_extensions import TypeIs

logger = logging.getLogger("highwater.records")

COMPRESSION_CODES: dict[str, int] = {"none": 0, "gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}

# The builder refuses a record that would take the batch past this size (unless it is the
# first). We size batches ourselves, so the builder's own cut-off is set out of the way;
# the broker's max_message_bytes is the real limit.
_BUILDER_BATCH_BYTES_MAX = 2**31 - 1
_MAGIC_V2 = 2
_CONTROL_MASK = 0x20
_CODEC_MASK = 0x07
_KNOWN_CODECS = frozenset(COMPRESSION_CODES.values())
# aiokafka's MemoryRecords calls a batch length below the v0 record overhead corrupt
# before it looks at the magic; Kafka's ByteBufferLogInputStream does the same.
_RECORD_OVERHEAD_V0 = 14
_INT64 = struct.Struct(">q")
_INT32 = struct.Struct(">i")
# A batch header before its CRC (base_offset, batch_length, partition_leader_epoch, magic) and the
# CRC-covered rest of it (attributes .. records_count): clients/common/record_batch.py's layout.
_HEAD_BEFORE_CRC = struct.Struct(">qiib")
_HEAD_CRC = struct.Struct(">I")
_HEAD_AFTER_CRC = struct.Struct(">hiqqqhii")
check(
    _HEAD_BEFORE_CRC.size + _HEAD_CRC.size == CRC_START_POS
    and CRC_START_POS + _HEAD_AFTER_CRC.size == BATCH_HEADER_SIZE,
    "the encoder's batch header does not match record_batch.py's layout",
)
# Uncompressed bulk runs whose values average at least this many bytes are encoded by
# _encode_large_runs rather than by aiokafka's builder, whose CRC-32C is software (~2 GB/s):
# at 10 KB values it was a fifth of the Producer's CPU, where the crc32c package's hardware
# CRC runs at ~27 GB/s. Below it the compiled builder's speed per record wins (Python spends
# about a microsecond on each record's framing).
LARGE_VALUE_BYTES_MIN = 1024

Headers = list[tuple[str, bytes]]
RecordTuple = tuple[bytes | None, bytes | None, Headers, int]
# What decode_records_as builds: a tuple class of (topic, partition, offset, key, value,
# headers, timestamp_ms), clients.types.ConsumerRecord for the Consumer.
RecordT = TypeVar("RecordT", bound=tuple[Any, ...])


class _NoHeaders(list[tuple[str, bytes]]):
    """The headers of every record the Consumer decodes without any: one shared empty list.

    A list of its own per record was a second object per record for the garbage collector
    to count and walk; with it, a catch-up read spent about a third of its CPU in the
    collector (bench/RESULTS.md, "Consume is the client's core"). This is still a list and
    equals [], as a record's headers always were; anything that would change it raises
    TypeError, since a change would show in every header-less record.
    """

    __slots__ = ()

    def _refuse(self, *_args: object, **_kwargs: object) -> NoReturn:
        raise TypeError(
            "a consumed record without headers shares one read-only empty list; "
            "build a new list (list(record.headers)) to change it"
        )

    append = extend = insert = remove = pop = clear = sort = reverse = _refuse
    __setitem__ = __delitem__ = __iadd__ = __imul__ = _refuse

    def __repr__(self) -> str:
        return "[]"

    def __reduce__(self) -> tuple[type[list[Any]], tuple[()]]:
        # A copy or an unpickled record gets a plain empty list of its own, free to change.
        return (list, ())


NO_HEADERS: Headers = _NoHeaders()


@dataclass(slots=True)
class Record:
    """One record as a client sees it. `offset` is -1 until the broker has assigned one."""

    key: bytes | None
    value: bytes | None
    headers: Headers = field(default_factory=list)
    timestamp_ms: int = 0
    offset: int = -1
    timestamp_type: int = 0


def codec_is_accelerated() -> bool:
    """True when the compiled `_crecords` extension backs the codec (FACTS.md: ~60x faster)."""
    return "_crecords" in (getattr(DefaultRecordBatchBuilder, "__module__", "") or "")


_warned_slow_codec = False


def _warn_if_slow() -> None:
    global _warned_slow_codec
    if not _warned_slow_codec and not codec_is_accelerated():
        _warned_slow_codec = True
        logger.warning(
            "aiokafka's compiled record codec (_crecords) is not in use; encoding and decoding "
            "fall back to pure Python, about 60x slower (check AIOKAFKA_NO_EXTENSIONS and the wheel)"
        )


_warn_if_slow()


def _compression_code(compression: str) -> int:
    try:
        return COMPRESSION_CODES[compression]
    except KeyError:
        raise InvalidRequest(
            f"unknown compression {compression!r}; expected one of {sorted(COMPRESSION_CODES)}"
        ) from None


# A batch's attributes bit for a transactional producer's data (Kafka's isTransactional).
TRANSACTIONAL_ATTRIBUTE = 0x10


def _new_builder(
    compression: str, producer_id: int, producer_epoch: int, base_sequence: int, transactional: bool = False
) -> DefaultRecordBatchBuilder:
    return DefaultRecordBatchBuilder(
        _MAGIC_V2,
        _compression_code(compression),
        1 if transactional else 0,  # is_transactional
        producer_id,
        producer_epoch,
        base_sequence,
        _BUILDER_BATCH_BYTES_MAX,
    )


def _finish(builder: DefaultRecordBatchBuilder, base_offset: int) -> bytes:
    buf = builder.build()
    if base_offset:
        # base_offset lies before the CRC-covered bytes: patching it keeps the CRC valid.
        _INT64.pack_into(buf, 0, base_offset)
    return bytes(buf)


def encode_batch(
    records: Sequence[RecordTuple] | Sequence[Record],
    *,
    compression: str = "none",
    producer_id: int = -1,
    producer_epoch: int = -1,
    base_sequence: int = -1,
    base_offset: int = 0,
    transactional: bool = False,
) -> bytes:
    """Encode records into one RecordBatch v2. Offsets inside the batch are 0..n-1 relative.

    `records` holds (key, value, headers, timestamp_ms) tuples or `Record`s. The broker
    assigns the real base offset; `base_offset` is for tests and tools. `transactional`: a
    transactional producer's batch (its records count only once its transaction commits).
    Raises InvalidRequest for an empty list or an unknown compression name.
    """
    if not records:
        raise InvalidRequest("a record batch needs at least one record")
    builder = _new_builder(compression, producer_id, producer_epoch, base_sequence, transactional)
    append = builder.append
    if _are_records(records):
        for relative_offset, record in enumerate(records):
            append(relative_offset, record.timestamp_ms, record.key, record.value, record.headers)
    else:
        for relative_offset, (key, value, headers, timestamp_ms) in enumerate(records):
            append(relative_offset, timestamp_ms, key, value, headers)
    return _finish(builder, base_offset)


def _are_records(records: Sequence[RecordTuple] | Sequence[Record]) -> TypeIs[Sequence[Record]]:
    """Whether `records` (not empty, all of one kind) holds `Record`s rather than tuples."""
    return isinstance(records[0], Record)


def encode_values(
    values: Sequence[bytes],
    *,
    timestamp_ms: int,
    compression: str = "none",
    producer_id: int = -1,
    producer_epoch: int = -1,
    base_sequence: int = -1,
    base_offset: int = 0,
) -> bytes:
    """Fast path: key-less, header-less records sharing one timestamp (the common producer case)."""
    if not values:
        raise InvalidRequest("a record batch needs at least one record")
    builder = _new_builder(compression, producer_id, producer_epoch, base_sequence)
    append = builder.append
    no_headers: Headers = []
    for relative_offset, value in enumerate(values):
        append(relative_offset, timestamp_ms, None, value, no_headers)
    return _finish(builder, base_offset)


def encode_runs(
    runs: Sequence[tuple[bytes | None, Sequence[bytes], int]],
    *,
    compression: str = "none",
    producer_id: int = -1,
    producer_epoch: int = -1,
    base_sequence: int = -1,
    large_values: bool | None = None,
    transactional: bool = False,
) -> bytes:
    """One batch of header-less runs, each (key, values, timestamp_ms): a producer's bulk sends.

    Both encoders make the same bytes; `large_values` only picks the faster one when the caller
    knows the sizes already (None: measured here). `transactional` as encode_batch's.
    """
    if large_values is None:
        large_values = _large_values(runs)
    if compression == "none" and large_values:
        return _encode_large_runs(runs, producer_id, producer_epoch, base_sequence, transactional)
    builder = _new_builder(compression, producer_id, producer_epoch, base_sequence, transactional)
    append = builder.append
    no_headers: Headers = []
    relative_offset = 0
    for key, values, timestamp_ms in runs:
        for value in values:
            append(relative_offset, timestamp_ms, key, value, no_headers)
            relative_offset += 1
    if relative_offset == 0:
        raise InvalidRequest("a record batch needs at least one record")
    return _finish(builder, 0)


def _large_values(runs: Sequence[tuple[bytes | None, Sequence[bytes], int]]) -> bool:
    """The values average LARGE_VALUE_BYTES_MIN bytes or more."""
    count = size = 0
    for _key, values, _timestamp_ms in runs:
        count += len(values)
        size += sum(map(len, values))
    return count > 0 and size >= count * LARGE_VALUE_BYTES_MIN


# Lengths and offset deltas repeat from record to record: each is framed once.
_varint = functools.lru_cache(maxsize=4096)(record_varint)


def _encode_large_runs(
    runs: Sequence[tuple[bytes | None, Sequence[bytes], int]],
    producer_id: int,
    producer_epoch: int,
    base_sequence: int,
    transactional: bool = False,
) -> bytes:
    """encode_runs for uncompressed large values: the same bytes aiokafka's builder makes
    (tests/unit/test_records.py holds the two to equal output), with a hardware CRC-32C."""
    # The batch's first timestamp is its first record's (a run without values adds none).
    first_timestamp = next((timestamp_ms for _key, values, timestamp_ms in runs if values), None)
    if first_timestamp is None:
        raise InvalidRequest("a record batch needs at least one record")
    max_timestamp = first_timestamp
    pieces: list[bytes] = []
    offset = 0
    for key, values, timestamp_ms in runs:
        if not values:
            continue
        max_timestamp = max(max_timestamp, timestamp_ms)
        # attributes (0), timestampDelta; then per record offsetDelta; then key; then value.
        timestamp_part = b"\x00" + _varint(timestamp_ms - first_timestamp)
        key_part = _varint(-1) if key is None else _varint(len(key)) + key
        for value in values:
            framing = timestamp_part + _varint(offset) + key_part + _varint(len(value))
            length = len(framing) + len(value) + 1  # + the headers count
            pieces.append(_varint(length) + framing)
            pieces.append(value)
            pieces.append(b"\x00")  # no headers
            offset += 1
    body = b"".join(pieces)
    after_crc = _HEAD_AFTER_CRC.pack(
        # attributes: no compression, CreateTime, not control; transactional as asked.
        TRANSACTIONAL_ATTRIBUTE if transactional else 0,
        offset - 1,
        first_timestamp,
        max_timestamp,
        producer_id,
        producer_epoch,
        base_sequence,
        offset,
    )
    crc = crc32c(body, crc32c(after_crc))
    batch_length = BATCH_HEADER_SIZE - LOG_OVERHEAD + len(body)
    before_crc = _HEAD_BEFORE_CRC.pack(0, batch_length, -1, _MAGIC_V2)
    return b"".join((before_crc, _HEAD_CRC.pack(crc), after_crc, body))


def decode_batches(buf: bytes | bytearray | memoryview, *, check_crc: bool = True) -> Iterator[Record]:
    """Yield every record of every data batch in `buf`, decompressing as needed.

    Control batches are skipped. A partial trailing batch (a broker may cut a fetch
    at its max_bytes) is ignored. Raises CorruptMessage for a batch whose CRC does
    not match (as Kafka consumers do with check.crcs), whose framing is impossible
    (a length below 14 bytes or below a v2 header, a magic other than 2), whose
    compression codec is unknown or whose records do not parse (aiokafka's
    CorruptRecordException, a header key that is not UTF-8, bytes that do not
    decompress). spark_connector/columnar.py decodes the same bytes into Arrow columns and
    must agree with this function on every input (tests/unit/test_columnar.py).
    """
    for batch in _data_batches(buf, check_crc):
        timestamp_type = batch.timestamp_type
        records = _records_of(batch)
        try:
            for record in records:
                yield Record(
                    record.key,
                    record.value,
                    record.headers,
                    record.timestamp,
                    record.offset,
                    timestamp_type,
                )
        except (CorruptRecordException, UnicodeDecodeError) as error:
            raise CorruptMessage(f"batch at offset {batch.base_offset}: {error}") from error


def decode_records_as(
    record_type: type[RecordT],
    buf: bytes | bytearray | memoryview,
    topic: str,
    partition: int,
    *,
    start_offset: int = 0,
    check_crc: bool = True,
) -> list[RecordT]:
    """The records of `buf` at or after `start_offset`, each built in one step as
    `record_type(topic, partition, offset, key, value, headers, timestamp_ms)`.

    The same records, checks and errors as `decode_batches` followed by that constructor,
    without a generator step and a `Record` per record in between (bench/RESULTS.md
    measured that path at ~2 µs a record, this one at under half). `record_type` must be a
    tuple class with those seven fields in that order (a NamedTuple): it is filled with
    `tuple.__new__`, skipping the Python-level `__new__` of a NamedTuple. A corrupt batch
    raises CorruptMessage and nothing of `buf` is returned.
    """
    decoded: list[RecordT] = []
    for batch in iter_records_as(
        record_type, buf, topic, partition, start_offset=start_offset, check_crc=check_crc
    ):
        decoded += batch
    return decoded


def iter_records_as(
    record_type: type[RecordT],
    buf: bytes | bytearray | memoryview,
    topic: str,
    partition: int,
    *,
    start_offset: int = 0,
    check_crc: bool = True,
) -> Iterator[list[RecordT]]:
    """decode_records_as a batch at a time: one list per data batch (empty when none of its
    records is at or after `start_offset`), each batch checked and decoded only when asked
    for. The Consumer decodes this way as it hands records out (Kafka's CompletedFetch), so
    a fetched answer waits as bytes rather than as objects the garbage collector walks.
    Raises CorruptMessage when it reaches a corrupt batch, after yielding those before it."""
    make = tuple.__new__
    for batch in _data_batches(buf, check_crc):
        records = _records_of(batch)
        try:
            # Filtered per record, not per batch: records before start_offset can sit anywhere
            # in the first batch, and a batch's offset deltas are only as sound as its producer.
            decoded = [
                make(
                    record_type,
                    (topic, partition, r.offset, r.key, r.value, r.headers or NO_HEADERS, r.timestamp),
                )
                for r in records
                if r.offset >= start_offset
            ]
        except (CorruptRecordException, UnicodeDecodeError) as error:
            raise CorruptMessage(f"batch at offset {batch.base_offset}: {error}") from error
        yield decoded


def _data_batches(buf: bytes | bytearray | memoryview, check_crc: bool) -> Iterator[DefaultRecordBatch]:
    """Each complete data batch of `buf`, checked (CRC when asked, codec, record count) and
    not yet iterated; control batches are skipped. Raises CorruptMessage (decode_batches)."""
    data = bytes(buf) if not isinstance(buf, bytes) else buf
    view = memoryview(data)
    for position, size in _batch_extents(data):
        batch = DefaultRecordBatch(view[position : position + size])
        if check_crc and not batch.validate_crc():
            raise CorruptMessage(f"CRC mismatch in the batch at offset {batch.base_offset}")
        if batch.attributes & _CONTROL_MASK:
            continue
        codec = batch.attributes & _CODEC_MASK
        if codec not in _KNOWN_CODECS:
            # aiokafka's compiled batch fails with a NameError on codecs 5-7.
            raise CorruptMessage(f"batch at offset {batch.base_offset}: unknown compression codec {codec}")
        (count,) = _INT32.unpack_from(data, position + RECORDS_COUNT_POS)
        if count < 0:
            # aiokafka reads no record and accepts it; Kafka's DefaultRecordBatch refuses it.
            raise CorruptMessage(f"batch at offset {batch.base_offset}: its record count {count} is negative")
        yield batch


def _records_of(batch: DefaultRecordBatch) -> Iterator[DefaultRecord]:
    """The iterator over `batch`'s records: the batch decompressed (CorruptMessage if it does not)."""
    try:
        return iter(batch)
    except MemoryError:
        raise
    except Exception as error:  # each codec has its own error types: zlib.error, EOFError, cramjam's...
        raise CorruptMessage(
            f"batch at offset {batch.base_offset}: its records do not decompress "
            f"({type(error).__name__}: {error})"
        ) from error


def _batch_extents(data: bytes) -> Iterator[tuple[int, int]]:
    """(position, size) of each complete batch in `data`; raises CorruptMessage for impossible framing.

    The rules of aiokafka's MemoryRecords, checked per batch (its compiled version reads
    the magic of the first batch only): fewer than 12 bytes left, or a batch running
    past the end, ends the walk quietly (a Fetch may be cut mid-batch); a length below
    the v0 record overhead is corrupt before anything else is read; then the magic must
    be 2 and the length must hold a v2 header. spark_connector/columnar.py's `_scan_batches`
    applies the same rules in the same order.
    """
    position = 0
    end = len(data)
    while end - position >= LOG_OVERHEAD:
        (length,) = _INT32.unpack_from(data, position + BATCH_LENGTH_POS)
        if length < _RECORD_OVERHEAD_V0:
            raise CorruptMessage(
                f"batch at byte {position}: its length {length} is below the minimum record "
                f"overhead ({_RECORD_OVERHEAD_V0})"
            )
        if length > end - position - LOG_OVERHEAD:
            return
        if data[position + MAGIC_POS] != _MAGIC_V2:
            raise CorruptMessage(
                f"batch at byte {position} is not magic {_MAGIC_V2} (magic {data[position + MAGIC_POS]})"
            )
        if length < MIN_BATCH_LENGTH:
            raise CorruptMessage(
                f"batch at byte {position}: its length {length} is below a v2 batch header "
                f"({MIN_BATCH_LENGTH})"
            )
        yield position, length + LOG_OVERHEAD
        position += length + LOG_OVERHEAD
