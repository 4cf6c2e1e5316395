"""One partition's Fetch answer, read from the wire bytes without copying its records.

A read task asks one partition per Fetch and gets ~8 MiB of records back. Through the
generated stub those bytes were copied twice more after gRPC handed them over: once by
the protobuf parse into the message, once more when `.records` made a Python bytes of
the field (~19 ns per 100-byte record together, a tenth of the Python worker's CPU in
bench/spark_read.py). `parse_fetch_response` walks the protobuf wire format of the
three messages involved (FetchResponse > FetchTopicResponse > FetchPartitionResponse,
protos/highwater/v1/common.proto) and hands `records` on as a memoryview of the bytes
gRPC received.

Wire rules followed (protobuf's encoding spec): a field is a varint key (number << 3 |
wire type) and a value; fields may come in any order and a scalar's last occurrence
wins; fields this reader does not know are skipped by wire type, so a newer broker's
additions do not break it. tests/unit/test_fetch_response.py holds it to the protobuf
parser on random messages and to clean errors on truncated ones.

read_committed answers (issue 41) add two fields: `last_stable_offset`, whose presence
matters (a broker from before transactions leaves it out, and then it reads as the high
watermark, as clients/common/fetch_request.last_stable_offset says), and the repeated
`aborted_transactions`, each a small submessage read here as (producer id, first offset).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from clients.common.fetch_request import last_stable_offset
from protos.highwater.v1 import common_pb2

# --- field numbers (protos/highwater/v1/common.proto) -----------------------------------------
_RESPONSE_TOPICS, _RESPONSE_ERROR_CODE = 1, 3
_TOPIC_PARTITIONS = 2
_P_PARTITION, _P_ERROR_CODE, _P_HIGH_WATERMARK, _P_LOG_START_OFFSET = 1, 2, 3, 4
_P_LOG_END_OFFSET, _P_RECORDS, _P_ERROR_MESSAGE, _P_LEADER_EPOCH = 5, 6, 7, 8
_P_RECORDS_LOCATION, _P_LAST_STABLE_OFFSET, _P_ABORTED_TRANSACTIONS = 9, 10, 11
_ABORTED_PRODUCER_ID, _ABORTED_FIRST_OFFSET = 1, 2

_VARINT, _FIXED64, _LEN, _FIXED32 = 0, 1, 2, 5
# A varint carries at most 64 bits in at most this many bytes.
_VARINT_BYTES_MAX = 10
_UINT64 = 1 << 64


class MalformedFetchResponse(ValueError):
    """The bytes are not a FetchResponse this reader can take (truncated, bad wire type)."""


@dataclass(frozen=True, slots=True)
class FetchedPartition:
    """The fields of a FetchPartitionResponse the reader uses; `records` may be a memoryview.

    `location` is set instead of records when the leader answered a short-circuit local read.
    `aborted_transactions` holds (producer id, first offset) pairs, in the answer's order, the
    form clients/common/control_records.drop_aborted takes.
    """

    partition: int = 0
    error_code: int = common_pb2.NONE
    high_watermark: int = 0
    log_start_offset: int = 0
    log_end_offset: int = 0
    records: bytes | memoryview = b""
    error_message: str = ""
    leader_epoch: int = 0
    location: common_pb2.RecordsLocation | None = None
    last_stable_offset: int = 0
    aborted_transactions: tuple[tuple[int, int], ...] = ()

    @classmethod
    def from_proto(cls, response: common_pb2.FetchResponse) -> FetchedPartition:
        """The first partition of a parsed FetchResponse (the gateway path), or its top-level error."""
        if not response.topics or not response.topics[0].partitions:
            return cls._missing(response.error_code)
        p = response.topics[0].partitions[0]
        return cls(
            p.partition,
            p.error_code,
            p.high_watermark,
            p.log_start_offset,
            p.log_end_offset,
            p.records,
            p.error_message,
            p.leader_epoch,
            p.records_location if p.HasField("records_location") else None,
            last_stable_offset(p),
            tuple((a.producer_id, a.first_offset) for a in p.aborted_transactions),
        )

    @classmethod
    def _missing(cls, error_code: int) -> FetchedPartition:
        if error_code == common_pb2.NONE:
            raise MalformedFetchResponse(
                "a Fetch answer without the partition asked for and without an error"
            )
        return cls(error_code=error_code, error_message="the Fetch answer names no partition")


def parse_fetch_response(raw: bytes) -> FetchedPartition:
    """The first partition of the first topic of a serialized FetchResponse.

    Raises MalformedFetchResponse for bytes that are not a well-formed FetchResponse.
    """
    view = memoryview(raw)
    first_topic: tuple[int, int] | None = None
    error_code: int = common_pb2.NONE
    for number, wire, start, end, value in _fields(view, 0, len(view)):
        if number == _RESPONSE_TOPICS and wire == _LEN and first_topic is None:
            first_topic = (start, end)
        elif number == _RESPONSE_ERROR_CODE and wire == _VARINT:
            error_code = _int32(value)
    if first_topic is None:
        return FetchedPartition._missing(error_code)
    first_partition: tuple[int, int] | None = None
    for number, wire, start, end, _ in _fields(view, *first_topic):
        if number == _TOPIC_PARTITIONS and wire == _LEN:
            first_partition = (start, end)
            break
    if first_partition is None:
        return FetchedPartition._missing(error_code)
    return _partition(view, *first_partition)


def _partition(view: memoryview, begin: int, stop: int) -> FetchedPartition:
    ints = {
        _P_PARTITION: 0,
        _P_ERROR_CODE: 0,
        _P_HIGH_WATERMARK: 0,
        _P_LOG_START_OFFSET: 0,
        _P_LOG_END_OFFSET: 0,
        _P_LEADER_EPOCH: 0,
    }
    records: bytes | memoryview = b""
    error_message = ""
    location: common_pb2.RecordsLocation | None = None
    lso: int | None = None  # None: the field is absent (a broker from before transactions)
    aborted: list[tuple[int, int]] = []
    for number, wire, start, end, value in _fields(view, begin, stop):
        if wire == _VARINT and number in ints:
            ints[number] = value
        elif wire == _VARINT and number == _P_LAST_STABLE_OFFSET:
            lso = value
        elif wire == _LEN and number == _P_ABORTED_TRANSACTIONS:
            aborted.append(_aborted_transaction(view, start, end))
        elif wire == _LEN and number == _P_RECORDS:
            records = view[start:end]
        elif wire == _LEN and number == _P_ERROR_MESSAGE:
            try:
                error_message = str(view[start:end], "utf-8")
            except UnicodeDecodeError as error:
                raise MalformedFetchResponse(f"error_message is not UTF-8: {error}") from error
        elif wire == _LEN and number == _P_RECORDS_LOCATION:
            # A few dozen bytes: the generated parser is fine here (and merges repeats as protobuf does).
            if location is None:
                location = common_pb2.RecordsLocation()
            try:
                location.MergeFromString(bytes(view[start:end]))
            except Exception as error:  # protobuf's DecodeError (the package has no type stubs)
                raise MalformedFetchResponse(f"records_location: {error}") from error
    high_watermark = _int64(ints[_P_HIGH_WATERMARK])
    return FetchedPartition(
        partition=_int32(ints[_P_PARTITION]),
        error_code=_int32(ints[_P_ERROR_CODE]),
        high_watermark=high_watermark,
        log_start_offset=_int64(ints[_P_LOG_START_OFFSET]),
        log_end_offset=_int64(ints[_P_LOG_END_OFFSET]),
        records=records,
        error_message=error_message,
        leader_epoch=_int32(ints[_P_LEADER_EPOCH]),
        location=location,
        last_stable_offset=high_watermark if lso is None else _int64(lso),
        aborted_transactions=tuple(aborted),
    )


def _aborted_transaction(view: memoryview, begin: int, stop: int) -> tuple[int, int]:
    """(producer_id, first_offset) of one AbortedTransaction submessage; absent fields are 0."""
    ints = {_ABORTED_PRODUCER_ID: 0, _ABORTED_FIRST_OFFSET: 0}
    for number, wire, _, _, value in _fields(view, begin, stop):
        if wire == _VARINT and number in ints:
            ints[number] = value
    return _int64(ints[_ABORTED_PRODUCER_ID]), _int64(ints[_ABORTED_FIRST_OFFSET])


def _fields(view: memoryview, pos: int, stop: int) -> Iterator[tuple[int, int, int, int, int]]:
    """(number, wire type, value start, value end, varint value) of each field in view[pos:stop]."""
    while pos < stop:
        key, pos = _varint(view, pos, stop)
        number, wire = key >> 3, key & 0x7
        if number == 0:
            raise MalformedFetchResponse(f"field number 0 at byte {pos}")
        if wire == _VARINT:
            value, end = _varint(view, pos, stop)
            yield number, wire, pos, end, value
        elif wire == _LEN:
            length, start = _varint(view, pos, stop)
            end = start + length
            if end > stop:
                raise MalformedFetchResponse(f"field {number} runs past its message ({end} > {stop})")
            yield number, wire, start, end, length
        elif wire in (_FIXED64, _FIXED32):
            end = pos + (8 if wire == _FIXED64 else 4)
            if end > stop:
                raise MalformedFetchResponse(f"field {number} runs past its message ({end} > {stop})")
            yield number, wire, pos, end, 0
        else:
            raise MalformedFetchResponse(f"field {number} has wire type {wire}, which no field here uses")
        pos = end


def _varint(view: memoryview, pos: int, stop: int) -> tuple[int, int]:
    value = 0
    for k in range(_VARINT_BYTES_MAX):
        if pos >= stop:
            raise MalformedFetchResponse(f"a varint runs past its message at byte {pos}")
        byte = view[pos]
        pos += 1
        value |= (byte & 0x7F) << (7 * k)
        if byte < 0x80:
            return value % _UINT64, pos
    raise MalformedFetchResponse(f"a varint is longer than {_VARINT_BYTES_MAX} bytes at byte {pos}")


def _int64(value: int) -> int:
    return value - _UINT64 if value >= 1 << 63 else value


def _int32(value: int) -> int:
    # int32 and enum fields: negative values are sent sign-extended to 64 bits; protobuf
    # parsers keep the low 32 bits.
    value &= 0xFFFFFFFF
    return value - (1 << 32) if value >= 1 << 31 else value
