"""The broker's batch header view: layout, validation errors, offset assignment, torn tails."""

from __future__ import annotations

import struct

import pytest
from crc32c import crc32c

from clients.common.errors import CorruptMessage, InvariantViolation, MessageTooLarge
from clients.common.record_batch import (
    ATTRIBUTES_POS,
    BASE_OFFSET_POS,
    BATCH_HEADER_SIZE,
    BATCH_LENGTH_POS,
    CRC_POS,
    LAST_OFFSET_DELTA_POS,
    MAGIC_POS,
    PARTITION_LEADER_EPOCH_POS,
    RECORDS_COUNT_POS,
    assign_offsets,
    iter_batch_headers,
    valid_prefix,
    validate_batches,
)
from clients.common.records import encode_batch, encode_values

LIMIT = 1024 * 1024


def batch(count: int = 3, timestamp_ms: int = 1_000) -> bytes:
    return encode_values([b"value-%d" % i for i in range(count)], timestamp_ms=timestamp_ms)


def with_fixed_crc(buf: bytearray, position: int = 0) -> bytearray:
    """Recompute the CRC of the batch at `position` (to build batches that fail later checks)."""
    length = struct.unpack_from(">i", buf, position + BATCH_LENGTH_POS)[0]
    end = position + length + 12
    struct.pack_into(">I", buf, position + CRC_POS, crc32c(memoryview(buf)[position + ATTRIBUTES_POS : end]))
    return buf


def test_header_fields_match_what_the_codec_wrote() -> None:
    data = encode_batch(
        [(b"k", b"v", [("h", b"x")], 1_000), (None, b"w", [], 1_005)],
        producer_id=7,
        producer_epoch=2,
        base_sequence=40,
        compression="zstd",
    )
    (header,) = validate_batches(data, max_batch_bytes=LIMIT)
    assert header.base_offset == 0
    assert header.magic == 2
    assert header.records_count == 2 and header.last_offset_delta == 1
    assert header.first_timestamp == 1_000 and header.max_timestamp == 1_005
    assert (header.producer_id, header.producer_epoch, header.base_sequence) == (7, 2, 40)
    assert header.compression == 4 and header.timestamp_type == 0
    assert not header.is_transactional and not header.is_control
    assert header.position == 0 and header.size_bytes == len(data) == header.batch_length + 12
    assert header.last_offset == 1 and header.next_offset == 2


def test_validate_walks_every_batch_with_positions() -> None:
    first, second = batch(2), batch(5)
    headers = validate_batches(first + second, max_batch_bytes=LIMIT)
    assert [h.position for h in headers] == [0, len(first)]
    assert [h.records_count for h in headers] == [2, 5]


def test_validate_accepts_memoryview_and_bytearray() -> None:
    data = batch()
    assert validate_batches(memoryview(data), max_batch_bytes=LIMIT) == validate_batches(
        bytearray(data), max_batch_bytes=LIMIT
    )


def test_empty_buffer_is_corrupt() -> None:
    with pytest.raises(CorruptMessage, match="empty"):
        validate_batches(b"", max_batch_bytes=LIMIT)


def test_buffer_shorter_than_a_header_is_corrupt() -> None:
    with pytest.raises(CorruptMessage, match="truncated batch header at byte 0"):
        validate_batches(batch()[:40], max_batch_bytes=LIMIT)


def test_second_batch_cut_short_names_its_position() -> None:
    first = batch()
    with pytest.raises(CorruptMessage, match=f"at byte {len(first)}"):
        validate_batches(first + batch()[:-5], max_batch_bytes=LIMIT)


def test_batch_length_below_header_is_corrupt() -> None:
    data = bytearray(batch())
    struct.pack_into(">i", data, BATCH_LENGTH_POS, 10)
    with pytest.raises(CorruptMessage, match="below the minimum"):
        validate_batches(data, max_batch_bytes=LIMIT)


def test_batch_length_overrunning_the_buffer_is_corrupt() -> None:
    data = bytearray(batch())
    struct.pack_into(">i", data, BATCH_LENGTH_POS, len(data))
    with pytest.raises(CorruptMessage, match="declares"):
        validate_batches(data, max_batch_bytes=LIMIT)


def test_magic_other_than_2_is_corrupt() -> None:
    data = bytearray(batch())
    data[MAGIC_POS] = 1
    with pytest.raises(CorruptMessage, match="magic 1"):
        validate_batches(data, max_batch_bytes=LIMIT)


@pytest.mark.parametrize("position", [ATTRIBUTES_POS, RECORDS_COUNT_POS, BATCH_HEADER_SIZE + 2, -1])
def test_flipped_byte_under_the_crc_is_corrupt(position: int) -> None:
    data = bytearray(batch())
    data[position] ^= 0x40
    with pytest.raises(CorruptMessage, match="CRC mismatch in batch at byte 0"):
        validate_batches(data, max_batch_bytes=LIMIT)


def test_flipped_stored_crc_is_corrupt() -> None:
    data = bytearray(batch())
    data[CRC_POS] ^= 0x01
    with pytest.raises(CorruptMessage, match="CRC mismatch"):
        validate_batches(data, max_batch_bytes=LIMIT)


def test_negative_last_offset_delta_is_corrupt() -> None:
    data = bytearray(batch())
    struct.pack_into(">i", data, LAST_OFFSET_DELTA_POS, -1)
    with pytest.raises(CorruptMessage, match="last_offset_delta -1"):
        validate_batches(with_fixed_crc(data), max_batch_bytes=LIMIT)


def test_records_count_inconsistent_with_last_offset_delta_is_corrupt() -> None:
    data = bytearray(batch(3))
    struct.pack_into(">i", data, RECORDS_COUNT_POS, 5)
    with pytest.raises(CorruptMessage, match="records_count 5"):
        validate_batches(with_fixed_crc(data), max_batch_bytes=LIMIT)


def test_zero_records_is_corrupt() -> None:
    data = bytearray(batch(1))
    struct.pack_into(">i", data, RECORDS_COUNT_POS, 0)
    with pytest.raises(CorruptMessage, match="records_count 0"):
        validate_batches(with_fixed_crc(data), max_batch_bytes=LIMIT)


def test_batch_over_the_size_limit_is_too_large() -> None:
    data = batch(50)
    with pytest.raises(MessageTooLarge, match=f"is {len(data)} bytes, the limit is 100"):
        validate_batches(data, max_batch_bytes=100)
    assert validate_batches(data, max_batch_bytes=len(data))  # the limit is inclusive


def test_size_limit_is_ignored_when_none() -> None:
    assert validate_batches(batch(50), max_batch_bytes=None)


def test_assign_offsets_patches_outside_the_crc_and_returns_next_offset() -> None:
    buf = bytearray(batch(3) + batch(4))
    headers = validate_batches(buf, max_batch_bytes=LIMIT)
    assert assign_offsets(buf, headers, 100, leader_epoch=9) == 107
    patched = validate_batches(buf, max_batch_bytes=LIMIT)  # CRCs still valid
    assert [(h.base_offset, h.partition_leader_epoch) for h in patched] == [(100, 9), (103, 9)]
    assert struct.unpack_from(">q", buf, BASE_OFFSET_POS)[0] == 100
    assert struct.unpack_from(">i", buf, PARTITION_LEADER_EPOCH_POS)[0] == 9


def test_assign_offsets_rejects_negative_start() -> None:
    buf = bytearray(batch())
    with pytest.raises(InvariantViolation):
        assign_offsets(buf, validate_batches(buf, max_batch_bytes=LIMIT), -1, 0)


def test_iter_batch_headers_stops_cleanly_at_a_torn_tail() -> None:
    whole = batch(2) + batch(3)
    for cut in range(len(batch(2)), len(whole)):
        assert [h.records_count for h in iter_batch_headers(whole[:cut])] == [2]
    assert [h.records_count for h in iter_batch_headers(whole)] == [2, 3]
    assert list(iter_batch_headers(b"")) == []


def test_iter_batch_headers_offsets_positions_by_base() -> None:
    data = batch(2) + batch(3)
    positions = [h.position for h in iter_batch_headers(data, position_base=1_000)]
    assert positions == [1_000, 1_000 + len(batch(2))]


def test_valid_prefix_reports_where_and_why_it_stopped() -> None:
    good = batch(2) + batch(3)
    bad = bytearray(batch(4))
    bad[-1] ^= 0xFF
    headers, end, reason = valid_prefix(good + bad, position_base=500)
    assert len(headers) == 2
    assert end == 500 + len(good)
    assert f"CRC mismatch in batch at byte {500 + len(good)}" in reason
    assert valid_prefix(good) == (validate_batches(good, max_batch_bytes=None), len(good), "")
