"""Spark's reader decompresses with the leader's decompressor (issue 40: one decompressor).

spark_connector/columnar.py hands every compressed records section to
clients.common.record_validation.decompress_records, the function the leader checks a
produced batch with (and the log cleaner reads one with). So every codec Spark reads goes
through it, xerial framing included, and a decompression bomb is refused by Spark at the
same bound at which the leader refuses it: clients.common.limits.DECOMPRESSED_BATCH_BYTES_MAX,
read when called, so the tests below lower it rather than build a 64 MiB bomb.
"""

from __future__ import annotations

import struct

import pytest

pytest.importorskip("numba", reason="spark_connector.columnar needs numba (pip install -e '.[dev]')")

import cramjam
import numpy as np
from crc32c import crc32c

import spark_connector.columnar as columnar
from clients.common import limits, record_validation
from clients.common.errors import MessageTooLarge
from clients.common.record_batch import ATTRIBUTES_POS, BATCH_HEADER_SIZE, validate_batches
from clients.common.record_validation import TimestampRules, validate_records
from clients.common.records import decode_batches, encode_batch, encode_values

NOW_MS = 1_700_000_000_000
RULES = TimestampRules(log_append_time=False, before_max_ms=2**62, after_max_ms=2**62)
BOMB_LIMIT = 64 * 1024
CODECS = ["gzip", "snappy", "lz4", "zstd"]
SNAPPY = 2
XERIAL_HEADER = b"\x82SNAPPY\x00\x00\x00\x00\x01\x00\x00\x00\x01"


def records_batch(compression: str) -> bytes:
    return encode_batch(
        [(b"k", b"v" * 100, [("h", b"x")], NOW_MS), (None, b"w" * 3000, [], NOW_MS + 1)] * 20,
        compression=compression,
        base_offset=7,
    )


def raw_snappy_batch() -> bytes:
    """A snappy batch without xerial framing (aiokafka writes xerial; other producers may not)."""
    plain = records_batch("none")
    body = bytes(cramjam.snappy.compress_raw(plain[BATCH_HEADER_SIZE:]))
    head = bytearray(plain[:BATCH_HEADER_SIZE])
    struct.pack_into(">i", head, 8, BATCH_HEADER_SIZE - 12 + len(body))
    struct.pack_into(">h", head, ATTRIBUTES_POS, SNAPPY)
    data = head + body
    struct.pack_into(">I", data, ATTRIBUTES_POS - 4, crc32c(bytes(data[ATTRIBUTES_POS:])))
    return bytes(data)


def spark_rows(data: bytes) -> list[tuple[object, ...]]:
    rows: list[tuple[object, ...]] = []
    for cols in columnar.decode_columns(data, include_headers=True):
        headers = cols.headers.to_pylist() if cols.headers is not None else []
        rows += zip(
            cols.key.to_pylist(),
            cols.value.to_pylist(),
            cols.offset.to_pylist(),
            [[(h["key"], h["value"]) for h in hs] for hs in headers],
            strict=True,
        )
    return rows


def consumer_rows(data: bytes) -> list[tuple[object, ...]]:
    return [(r.key, r.value, r.offset, list(r.headers)) for r in decode_batches(data)]


def leader_check(data: bytes) -> None:
    validate_records(data, validate_batches(data, max_batch_bytes=None), rules=RULES, now_ms=NOW_MS)


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The codecs Spark's reader hands to the shared decompressor, call by call."""
    seen: list[int] = []
    shared = record_validation.decompress_records

    def counted(codec: int, section: np.ndarray, where: str) -> np.ndarray:
        seen.append(codec)
        return shared(codec, section, where)

    monkeypatch.setattr(columnar, "decompress_records", counted)
    return seen


@pytest.mark.parametrize("compression", CODECS)
def test_every_codec_is_read_through_the_shared_decompressor(compression: str, calls: list[int]) -> None:
    data = records_batch(compression) + records_batch(compression)
    assert spark_rows(data) == consumer_rows(data)
    assert len(calls) == 2 and calls[0] == data[ATTRIBUTES_POS + 1] & 0x07


def test_snappy_with_and_without_xerial_framing(calls: list[int]) -> None:
    xerial, raw = records_batch("snappy"), raw_snappy_batch()
    assert xerial[BATCH_HEADER_SIZE:].startswith(XERIAL_HEADER)
    assert not raw[BATCH_HEADER_SIZE:].startswith(XERIAL_HEADER)
    for data in (xerial, raw):
        leader_check(data)
        assert spark_rows(data) == consumer_rows(data) != []
    assert calls == [SNAPPY, SNAPPY]


@pytest.mark.parametrize("compression", CODECS)
def test_a_decompression_bomb_is_refused_by_spark_at_the_leaders_bound(
    compression: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(limits, "DECOMPRESSED_BATCH_BYTES_MAX", BOMB_LIMIT)
    bomb = encode_values([bytes(1024)] * 100, timestamp_ms=NOW_MS, compression=compression, base_offset=40)
    assert len(bomb) < BOMB_LIMIT  # ~100 KiB of zeros, compressed
    with pytest.raises(MessageTooLarge, match=f"decompress to more than {BOMB_LIMIT} bytes"):
        leader_check(bomb)
    with pytest.raises(
        MessageTooLarge,
        match=f"batch at offset 40: its records decompress as {compression} to more than {BOMB_LIMIT}",
    ):
        spark_rows(bomb)
    # Under the bound both take it.
    fits = encode_values([bytes(1024)] * 50, timestamp_ms=NOW_MS, compression=compression)
    leader_check(fits)
    assert len(spark_rows(fits)) == 50
