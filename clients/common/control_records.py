"""Transaction markers: Kafka's control batches (KIP-98), encoded and read. Pure module.

A transaction ends with one marker per partition it wrote to: a batch of one record with the
control and transactional bits set in its attributes, the producer's id and epoch, no
sequence (-1), and a record whose key and value say what it is:

    key   (4 bytes)  version int16 (0), type int16 (0 ABORT, 1 COMMIT)
    value (6 bytes)  version int16 (0), coordinator epoch int32

Consumers never see control records as records (clients skip control batches); they tell
a read_committed consumer where each transaction ended and whether it counts. Markers are
never compressed, as Kafka writes them, so reading the type needs no codec.
"""

from __future__ import annotations

import enum
import heapq
import struct
from collections.abc import Iterable

from clients.common.errors import CorruptMessage
from clients.common.record_batch import (
    BATCH_HEADER_SIZE,
    CONTROL_MASK,
    LOG_OVERHEAD,
    MAGIC_V2,
    TRANSACTIONAL_MASK,
    BatchHeader,
    Buffer,
    batch_crc,
    iter_batch_headers,
    record_varint,
)

CONTROL_RECORD_KEY_VERSION = 0
CONTROL_RECORD_VALUE_VERSION = 0
NO_SEQUENCE = -1


class ControlType(enum.IntEnum):
    ABORT = 0
    COMMIT = 1


_KEY = struct.Struct(">hh")
_VALUE = struct.Struct(">hi")
_HEADER_AFTER_LENGTH = struct.Struct(">ibIhiqqqhii")  # partition_leader_epoch .. records_count
_BASE = struct.Struct(">qi")  # base_offset, batch_length


def encode_marker(
    control: ControlType,
    *,
    producer_id: int,
    producer_epoch: int,
    coordinator_epoch: int,
    timestamp_ms: int,
    base_offset: int = 0,
) -> bytes:
    """One marker batch (the leader assigns its real offset, as for any batch)."""
    key = _KEY.pack(CONTROL_RECORD_KEY_VERSION, int(control))
    value = _VALUE.pack(CONTROL_RECORD_VALUE_VERSION, coordinator_epoch)
    body = (
        b"\x00"  # record attributes
        + record_varint(0)  # timestamp delta
        + record_varint(0)  # offset delta
        + record_varint(len(key))
        + key
        + record_varint(len(value))
        + value
        + record_varint(0)  # no headers
    )
    record = record_varint(len(body)) + body
    size = BATCH_HEADER_SIZE + len(record)
    buf = bytearray(size)
    _BASE.pack_into(buf, 0, base_offset, size - LOG_OVERHEAD)
    attributes = CONTROL_MASK | TRANSACTIONAL_MASK
    _HEADER_AFTER_LENGTH.pack_into(
        buf,
        12,
        -1,  # partition leader epoch: the leader sets it
        MAGIC_V2,
        0,  # CRC, below
        attributes,
        0,  # last offset delta: one record
        timestamp_ms,
        timestamp_ms,
        producer_id,
        producer_epoch,
        NO_SEQUENCE,
        1,
    )
    buf[BATCH_HEADER_SIZE:] = record
    struct.pack_into(">I", buf, 17, batch_crc(buf, 0, size))
    return bytes(buf)


def _read_varint(buf: Buffer, position: int, end: int) -> tuple[int, int]:
    """A zigzag varint at `position`: (value, position after it)."""
    shift = raw = 0
    while position < end:
        byte = buf[position]
        position += 1
        raw |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return (raw >> 1) ^ -(raw & 1), position
        shift += 7
        if shift > 63:
            break
    raise CorruptMessage("a control record's varint runs past its batch")


def control_type(buf: Buffer, header: BatchHeader) -> ControlType:
    """What the control batch `header` (read from `buf`) marks. Raises CorruptMessage for a
    batch that is not a readable marker (compressed, no record, an unknown key)."""
    where = f"control batch at offset {header.base_offset}"
    if not header.is_control or header.compression or header.records_count < 1:
        raise CorruptMessage(f"{where} is not an uncompressed marker with a record")
    end = header.end_position
    position = header.position + BATCH_HEADER_SIZE
    _, position = _read_varint(buf, position, end)  # record length
    position += 1  # attributes
    _, position = _read_varint(buf, position, end)  # timestamp delta
    _, position = _read_varint(buf, position, end)  # offset delta
    key_length, position = _read_varint(buf, position, end)
    if key_length < _KEY.size or position + key_length > end:
        raise CorruptMessage(f"{where}: its key is {key_length} bytes, a marker's is {_KEY.size}")
    version, kind = _KEY.unpack_from(buf, position)
    if version != CONTROL_RECORD_KEY_VERSION or kind not in (ControlType.ABORT, ControlType.COMMIT):
        raise CorruptMessage(f"{where}: unknown control record (version {version}, type {kind})")
    return ControlType(kind)


def control_types(buf: Buffer, headers: list[BatchHeader]) -> dict[int, ControlType]:
    """Each control batch's type, by base offset (the producer state's input)."""
    return {h.base_offset: control_type(buf, h) for h in headers if h.is_control}


def drop_aborted(buf: Buffer, aborted: Iterable[tuple[int, int]]) -> Buffer:
    """What a read_committed reader keeps of a Fetch answer's records: `buf` without the
    batches of aborted transactions, given as (producer id, first offset) pairs (the answer's
    aborted_transactions). Kafka's consumer rule: a producer's transactional batches are
    dropped from the first offset of one of its aborted transactions up to that
    transaction's ABORT marker. Markers stay (every reader skips control batches). Returns
    `buf` itself when nothing is dropped; a torn last batch is kept as it came."""
    pending = sorted((first, producer) for producer, first in aborted)
    if not pending:
        return buf
    aborting: set[int] = set()
    kept: list[memoryview] = []
    view = memoryview(buf)
    dropped = False
    end = 0
    for h in iter_batch_headers(buf):
        end = h.end_position
        while pending and pending[0][0] <= h.last_offset:
            aborting.add(heapq.heappop(pending)[1])
        if h.is_control:
            if h.producer_id in aborting and control_type(buf, h) is ControlType.ABORT:
                aborting.discard(h.producer_id)
        elif h.is_transactional and h.producer_id in aborting:
            dropped = True
            continue
        kept.append(view[h.position : h.end_position])
    if not dropped:
        return buf
    return b"".join(kept) + bytes(view[end:])
