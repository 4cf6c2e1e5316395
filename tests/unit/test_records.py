"""The client codec: round trips for every compression, and agreement with the broker's batch view."""

from __future__ import annotations

import random
import struct

import pytest
from aiokafka.record.default_records import DefaultRecordBatchBuilder
from crc32c import crc32c

from clients.common.errors import CorruptMessage, InvalidRequest
from clients.common.record_batch import ATTRIBUTES_POS, CRC_POS, assign_offsets, validate_batches
from clients.common.records import (
    LARGE_VALUE_BYTES_MIN,
    Record,
    _large_values,
    codec_is_accelerated,
    decode_batches,
    encode_batch,
    encode_runs,
    encode_values,
)

CODECS = ["none", "gzip", "snappy", "lz4", "zstd"]
LIMIT = 1024 * 1024


def sample_records() -> list[tuple[bytes | None, bytes | None, list[tuple[str, bytes]], int]]:
    return [
        (b"key-0", b"value-0", [("trace", b"abc"), ("n", b"")], 1_700_000_000_000),
        (None, b"value-1" * 20, [], 1_700_000_000_005),
        (b"key-2", None, [("h", b"\x00\xff")], 1_700_000_000_001),
        (b"", b"", [], 1_700_000_000_009),
    ]


def test_compiled_codec_is_in_use() -> None:
    assert codec_is_accelerated()


@pytest.mark.parametrize("compression", CODECS)
def test_round_trip_keeps_keys_values_headers_timestamps(compression: str) -> None:
    data = encode_batch(sample_records(), compression=compression)
    decoded = list(decode_batches(data))
    assert [(r.key, r.value, r.headers, r.timestamp_ms) for r in decoded] == sample_records()
    assert [r.offset for r in decoded] == [0, 1, 2, 3]
    assert all(r.timestamp_type == 0 for r in decoded)


@pytest.mark.parametrize("compression", CODECS)
def test_broker_accepts_what_the_codec_makes(compression: str) -> None:
    data = encode_batch(
        sample_records(), compression=compression, producer_id=5, producer_epoch=1, base_sequence=9
    )
    (header,) = validate_batches(data, max_batch_bytes=LIMIT)
    assert header.records_count == 4
    assert header.max_timestamp == 1_700_000_000_009
    assert header.first_timestamp == 1_700_000_000_000
    assert header.compression == CODECS.index(compression)
    assert (header.producer_id, header.producer_epoch, header.base_sequence) == (5, 1, 9)


def test_record_objects_encode_like_tuples() -> None:
    records = [Record(k, v, h, ts) for k, v, h, ts in sample_records()]
    assert encode_batch(records) == encode_batch(sample_records())


def test_encode_values_fast_path_round_trips() -> None:
    values = [b"v%d" % i for i in range(100)]
    data = encode_values(values, timestamp_ms=42, compression="zstd", base_offset=10)
    decoded = list(decode_batches(data))
    assert [r.value for r in decoded] == values
    assert [r.offset for r in decoded] == list(range(10, 110))
    assert {r.timestamp_ms for r in decoded} == {42}
    assert all(r.key is None and r.headers == [] for r in decoded)


def test_assign_offsets_then_decode_gives_the_patched_offsets() -> None:
    buf = bytearray(
        encode_values([b"a", b"b"], timestamp_ms=1) + encode_batch(sample_records(), compression="lz4")
    )
    headers = validate_batches(buf, max_batch_bytes=LIMIT)
    assert assign_offsets(buf, headers, 1_000, leader_epoch=3) == 1_006
    assert [r.offset for r in decode_batches(buf)] == list(range(1_000, 1_006))


def test_aiokafka_builder_batch_passes_our_crc_check() -> None:
    builder = DefaultRecordBatchBuilder(2, 0, 0, -1, -1, -1, 1 << 20)
    for i in range(10):
        builder.append(i, 1_000 + i, None, b"x" * i, [])
    data = bytes(builder.build())
    (header,) = validate_batches(data, max_batch_bytes=LIMIT)
    assert header.crc == crc32c(data[ATTRIBUTES_POS:])
    assert header.records_count == 10


@pytest.mark.parametrize("cut", [1, 11, 12, 30, 61, 65, -1])
def test_decode_tolerates_a_partial_trailing_batch(cut: int) -> None:
    first = encode_values([b"a", b"b"], timestamp_ms=1)
    second = encode_values([b"c"], timestamp_ms=2, base_offset=2)
    decoded = list(decode_batches(first + second[:cut]))
    assert [r.value for r in decoded] == [b"a", b"b"]


def test_decode_skips_control_batches() -> None:
    control = bytearray(encode_values([b"marker"], timestamp_ms=1))
    attributes = struct.unpack_from(">h", control, ATTRIBUTES_POS)[0] | 0x20
    struct.pack_into(">h", control, ATTRIBUTES_POS, attributes)
    struct.pack_into(">I", control, CRC_POS, crc32c(memoryview(control)[ATTRIBUTES_POS:]))
    data = bytes(control) + encode_values([b"data"], timestamp_ms=2, base_offset=1)
    assert [r.value for r in decode_batches(data)] == [b"data"]


def test_decode_rejects_a_crc_mismatch() -> None:
    data = bytearray(encode_values([b"payload"], timestamp_ms=1))
    data[-2] ^= 0x01
    with pytest.raises(CorruptMessage, match="CRC"):
        list(decode_batches(data))
    assert len(list(decode_batches(data, check_crc=False))) == 1


def test_empty_batch_and_unknown_codec_are_refused() -> None:
    with pytest.raises(InvalidRequest):
        encode_batch([])
    with pytest.raises(InvalidRequest, match="brotli"):
        encode_values([b"x"], timestamp_ms=0, compression="brotli")


def builder_runs(
    runs: list[tuple[bytes | None, list[bytes], int]],
    producer_id: int,
    producer_epoch: int,
    base_sequence: int,
) -> bytes:
    """What aiokafka's builder makes of the same runs (the reference for the large-value encoder)."""
    builder = DefaultRecordBatchBuilder(2, 0, 0, producer_id, producer_epoch, base_sequence, 2**31 - 1)
    offset = 0
    for key, values, timestamp_ms in runs:
        for value in values:
            builder.append(offset, timestamp_ms, key, value, [])
            offset += 1
    return bytes(builder.build())


@pytest.mark.parametrize("seed", range(40))
def test_large_value_runs_encode_to_the_builders_exact_bytes(seed: int) -> None:
    """encode_runs frames uncompressed large values itself (a hardware CRC): byte for byte what
    aiokafka's builder makes, with null and empty keys, multi-byte lengths and earlier timestamps."""
    rnd = random.Random(seed)
    runs = [
        (
            rnd.choice([None, b"", rnd.randbytes(rnd.randint(1, 300))]),
            [
                rnd.randbytes(rnd.choice([0, 1, 127, 128, 1500, 16_384, 70_000]))
                for _ in range(rnd.randint(1, 5))
            ],
            1_700_000_000_000 + rnd.randint(-5_000, 5_000),
        )
        for _ in range(rnd.randint(1, 4))
    ]
    while not _large_values(runs):  # small draws are the builder's (the next test)
        runs[-1][1].append(rnd.randbytes(70_000))
    ids = rnd.choice([(-1, -1, -1), (123_456_789_012, 3, 2**31 - 10)])
    ours = encode_runs(runs, producer_id=ids[0], producer_epoch=ids[1], base_sequence=ids[2])
    assert ours == builder_runs(runs, *ids)
    assert validate_batches(ours, max_batch_bytes=len(ours))
    decoded = list(decode_batches(ours))
    assert [(r.key, r.value, r.timestamp_ms) for r in decoded] == [
        (key, value, ts) for key, values, ts in runs for value in values
    ]


def test_small_values_and_compressed_runs_stay_with_the_builder() -> None:
    small = [(None, [b"x" * (LARGE_VALUE_BYTES_MIN - 1)] * 3, 1_000)]
    assert not _large_values(small)
    large = [(None, [b"x" * LARGE_VALUE_BYTES_MIN] * 3, 1_000)]
    assert _large_values(large)
    assert encode_runs(large) == builder_runs(large, -1, -1, -1)
    zstd = encode_runs(large, compression="zstd")
    assert [r.value for r in decode_batches(zstd)] == large[0][1]


def test_large_value_runs_without_values_add_nothing_as_in_the_builder() -> None:
    """A run with no values (its timestamp earlier than the rest) neither sets the batch's first
    timestamp nor adds a record; runs with no values at all make no batch, as with the builder."""
    runs: list[tuple[bytes | None, list[bytes], int]] = [
        (None, [], 500),
        (b"k", [b"v" * 4_000, b"w" * 3_000], 1_000),
        (None, [], 2_000),
    ]
    assert encode_runs(runs, large_values=True) == builder_runs(runs, -1, -1, -1)
    for large in (True, False):
        with pytest.raises(InvalidRequest, match="at least one record"):
            encode_runs([(None, [], 500)], large_values=large)
        with pytest.raises(InvalidRequest, match="at least one record"):
            encode_runs([], large_values=large)
