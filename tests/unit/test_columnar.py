"""spark_connector.columnar against clients.common.records.decode_batches: same rows, same refusals.

decode_batches (aiokafka's compiled codec, one object per record) is the reference: on
random batches — every codec, null keys and values, headers, LogAppendTime, control
batches, range cuts, truncated tails — the columnar decoder must give the same rows; on
corrupted bytes both must refuse with CorruptMessage, or both give the same rows (a flip
in a field no check covers). The corruption that matters most for a decoder without
bounds checks is inside a batch whose CRC is still right (a buggy producer, or a CRC
recomputed over bad bytes): `test_corrupt_records_with_a_valid_crc_*` makes exactly that.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("numba", reason="spark_connector.columnar needs numba (pip install -e '.[dev]')")

import numpy as np
import pyarrow as pa
from crc32c import crc32c
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from clients.common.errors import CorruptMessage, MessageTooLarge
from clients.common.record_batch import (
    ATTRIBUTES_POS,
    BATCH_HEADER_SIZE,
    CRC_POS,
    MAX_TIMESTAMP_POS,
    RECORDS_COUNT_POS,
)
from clients.common.record_validation import CODEC_NAMES, decompress_records
from clients.common.records import COMPRESSION_CODES, Record, decode_batches, encode_batch
from spark_connector.columnar import ARROW_BINARY_BYTES_MAX, HEADERS_TYPE, RecordColumns, decode_columns
from tests.unit.boundscheck import run_with_numba_boundscheck

CODECS = list(COMPRESSION_CODES)
LOG_APPEND_TIME = 0x08
CONTROL = 0x20
INT64_MAX = 2**63 - 1

Row = tuple[bytes | None, bytes | None, int, int, int, list[tuple[str, bytes | None]] | None]

# --- building batches -------------------------------------------------------------------------

header_keys = st.text(st.characters(blacklist_categories=("Cs",)), max_size=6)
records = st.tuples(
    st.none() | st.binary(max_size=24),
    st.none() | st.binary(max_size=64),
    st.lists(st.tuples(header_keys, st.none() | st.binary(max_size=8)), max_size=3),
    st.integers(-1, 2**41),
)


@st.composite
def batches(draw: st.DrawFn, base_offset: int, codecs: Sequence[str]) -> bytes:
    """One batch: random records and codec, maybe LogAppendTime, maybe a control batch."""
    recs = draw(st.lists(records, min_size=1, max_size=12))
    data = bytearray(encode_batch(recs, compression=draw(st.sampled_from(codecs)), base_offset=base_offset))
    attributes = struct.unpack_from(">h", data, ATTRIBUTES_POS)[0]
    if draw(st.booleans()):
        attributes |= LOG_APPEND_TIME
        struct.pack_into(">q", data, MAX_TIMESTAMP_POS, draw(st.integers(0, 2**41)))
    if draw(st.integers(0, 5)) == 0:
        attributes |= CONTROL
    struct.pack_into(">h", data, ATTRIBUTES_POS, attributes)
    return fix_crc(data, 0)


def fix_crc(data: bytearray, position: int) -> bytes:
    """Recompute the CRC of the batch at `position` (after patching CRC-covered bytes)."""
    size = struct.unpack_from(">i", data, position + 8)[0] + 12
    struct.pack_into(
        ">I", data, position + CRC_POS, crc32c(memoryview(data)[position + ATTRIBUTES_POS : position + size])
    )
    return bytes(data)


@st.composite
def fetch_responses(
    draw: st.DrawFn, cut: bool = True, codecs: Sequence[str] = CODECS
) -> tuple[bytes, list[int]]:
    """Batches back to back (offsets contiguous), maybe (`cut`) cut mid-way through the last one."""
    out: list[bytes] = []
    starts: list[int] = []
    offset = draw(st.integers(0, 1_000))
    for _ in range(draw(st.integers(1, 4))):
        batch = draw(batches(offset, codecs))
        starts.append(sum(map(len, out)))
        out.append(batch)
        offset += struct.unpack_from(">i", batch, RECORDS_COUNT_POS)[0]
    data = b"".join(out)
    if cut and draw(st.booleans()):
        data = data[: draw(st.integers(starts[-1], len(data)))]
    return data, starts


# --- comparing the two decoders ---------------------------------------------------------------


def reference_rows(
    data: bytes, start: int, end: int, include_headers: bool, check_crc: bool = True
) -> list[Row]:
    # decode_batches keeps every record; the reader used to cut [start, end) after it.
    return [
        _row(r, include_headers) for r in decode_batches(data, check_crc=check_crc) if start <= r.offset < end
    ]


def _row(r: Record, include_headers: bool) -> Row:
    # Spark's timestamps are µs: the old reader multiplied with pyarrow's wrapping multiply.
    ts_us = (r.timestamp_ms * 1000 + 2**63) % 2**64 - 2**63
    return r.key, r.value, r.offset, ts_us, r.timestamp_type, list(r.headers) if include_headers else None


def columnar_rows(
    data: bytes, start: int, end: int, include_headers: bool, check_crc: bool = True
) -> list[Row]:
    rows: list[Row] = []
    for cols in decode_columns(
        data, start_offset=start, end_offset=end, include_headers=include_headers, check_crc=check_crc
    ):
        _check_arrays(cols, include_headers)
        headers: list[Any] = cols.headers.to_pylist() if cols.headers is not None else [None] * len(cols)
        rows.extend(
            zip(
                cols.key.to_pylist(),
                cols.value.to_pylist(),
                cols.offset.to_pylist(),
                cols.timestamp.cast(pa.int64()).to_pylist(),
                cols.timestamp_type.to_pylist(),
                [None if h is None else [(e["key"], e["value"]) for e in h] for h in headers],
                strict=True,
            )
        )
    return rows


def _check_arrays(cols: RecordColumns, include_headers: bool) -> None:
    """Every array is well formed (offsets, bitmaps, UTF-8) and of the types Spark takes."""
    arrays = [cols.key, cols.value, cols.offset, cols.timestamp, cols.timestamp_type]
    assert [a.type for a in arrays] == [
        pa.binary(),
        pa.binary(),
        pa.int64(),
        pa.timestamp("us", tz="UTC"),
        pa.int32(),
    ]
    assert len({len(a) for a in arrays}) == 1
    assert (cols.headers is not None) == include_headers
    if cols.headers is not None:
        assert cols.headers.type.equals(HEADERS_TYPE) and len(cols.headers) == len(cols)
        arrays.append(cols.headers)
    for a in arrays:
        a.validate(full=True)


def leader_refuses_records(buf: bytes, position: int) -> bool:
    """Whether the leader's decompressor, which Spark's reader shares, refuses the records of
    the data batch at `position`. It is stricter than aiokafka's in two places: aiokafka reads a
    xerial snappy block whose length runs past the section as the bytes that remain, and it
    inflates a block that declares more than DECOMPRESSED_BATCH_BYTES_MAX."""
    (attributes,) = struct.unpack_from(">h", buf, position + ATTRIBUTES_POS)
    codec = attributes & 0x07
    if attributes & CONTROL or codec == 0 or codec not in CODEC_NAMES:
        return False
    end = position + 12 + struct.unpack_from(">i", buf, position + 8)[0]
    try:
        decompress_records(codec, np.frombuffer(buf, dtype=np.uint8)[position + BATCH_HEADER_SIZE : end], "")
    except (CorruptMessage, MessageTooLarge):
        return True
    return False


def outcome(decode: Any, *args: Any, **kwargs: Any) -> list[Row] | str:
    """The rows, or "corrupt" for a refused batch: CorruptMessage, or MessageTooLarge for one
    whose compressed blocks declare more than the leader ever inflates (a flipped snappy block
    length can say so: Spark refuses it as the leader would); anything else fails the test."""
    try:
        return decode(*args, **kwargs)  # type: ignore[no-any-return]
    except (CorruptMessage, MessageTooLarge):
        return "corrupt"


# --- properties -------------------------------------------------------------------------------


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(fetch_responses(), st.integers(0, 1_100), st.integers(0, 1_200), st.booleans())
def test_same_rows_as_decode_batches(
    response: tuple[bytes, list[int]], start: int, length: int, include_headers: bool
) -> None:
    data, _ = response
    end = start + length
    assert columnar_rows(data, start, end, include_headers) == reference_rows(
        data, start, end, include_headers
    )


@settings(max_examples=50, deadline=None)
@given(fetch_responses(), st.booleans())
def test_no_range_means_every_record(response: tuple[bytes, list[int]], include_headers: bool) -> None:
    data, _ = response
    rows = [
        r for cols in decode_columns(data, include_headers=include_headers) for r in cols.offset.to_pylist()
    ]
    assert rows == [r.offset for r in decode_batches(data)]


@settings(max_examples=50, deadline=None)
@given(fetch_responses(), st.integers(min_value=1, max_value=4096))
def test_groups_of_a_bounded_size_hold_the_same_rows_in_order(
    response: tuple[bytes, list[int]], group_bytes_max: int
) -> None:
    """A located read is decoded in fetch.max.bytes groups: smaller Arrow batches, same rows."""
    data, _ = response
    groups = list(decode_columns(data, group_bytes_max=group_bytes_max))
    assert [o for cols in groups for o in cols.offset.to_pylist()] == [r.offset for r in decode_batches(data)]


def test_a_group_bound_below_one_batch_gives_a_group_per_batch() -> None:
    one_batch = encode_batch([Record(None, b"v", [], 1_000)] * 10)
    three = one_batch + one_batch + one_batch  # offsets 0-9 three times: the kernel keeps each
    assert [len(cols) for cols in decode_columns(three, group_bytes_max=1)] == [10, 10, 10]
    assert [len(cols) for cols in decode_columns(three)] == [30]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(fetch_responses(cut=False), st.data())
def test_byte_flips_are_refused_like_decode_batches(
    response: tuple[bytes, list[int]], data: st.DataObject
) -> None:
    """Flips anywhere, CRC checked: a flip inside the CRC's bytes is a CRC error in both; one
    outside (base offset, length, leader epoch, magic, the CRC itself) is judged by framing."""
    raw, _ = response
    corrupted = bytearray(raw)
    for _ in range(data.draw(st.integers(1, 3))):
        corrupted[data.draw(st.integers(0, len(raw) - 1))] ^= data.draw(st.integers(1, 255))
    buf = bytes(corrupted)
    expected = outcome(reference_rows, buf, 0, INT64_MAX, True)
    assert outcome(columnar_rows, buf, 0, INT64_MAX, True) == expected


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(fetch_responses(cut=False), st.data(), st.booleans())
def test_corrupt_records_with_a_valid_crc_are_refused_like_decode_batches(
    response: tuple[bytes, list[int]], data: st.DataObject, include_headers: bool
) -> None:
    """Flips in a batch's CRC-covered bytes, then its CRC recomputed: only the record grammar
    can catch them. The kernel must never read past the batch, and must refuse exactly what
    aiokafka refuses (varints, lengths, header counts, UTF-8 keys, trailing bytes, codecs)."""
    raw, starts = response
    corrupted = bytearray(raw)
    position = data.draw(st.sampled_from(starts))
    size = struct.unpack_from(">i", raw, position + 8)[0] + 12
    for _ in range(data.draw(st.integers(1, 4))):
        at = data.draw(st.integers(position + ATTRIBUTES_POS, position + size - 1))
        corrupted[at] = data.draw(st.integers(0, 255))
    buf = fix_crc(corrupted, position)
    expected = outcome(reference_rows, buf, 0, INT64_MAX, include_headers)
    if leader_refuses_records(buf, position):
        expected = "corrupt"  # Spark decompresses with the leader's decompressor, aiokafka does not
    assert outcome(columnar_rows, buf, 0, INT64_MAX, include_headers) == expected


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(fetch_responses(cut=False, codecs=["none"]), st.data())
def test_flips_without_crc_check_never_crash(response: tuple[bytes, list[int]], data: st.DataObject) -> None:
    """check_crc=False lets every flip reach the parser. Uncompressed only: aiokafka's snappy
    framing can loop on a negative block size, which is the codec's problem, not the parser's."""
    raw, _ = response
    corrupted = bytearray(raw)
    for _ in range(data.draw(st.integers(1, 6))):
        corrupted[data.draw(st.integers(0, len(raw) - 1))] = data.draw(st.integers(0, 255))
    buf = bytes(corrupted)
    expected = outcome(reference_rows, buf, 0, INT64_MAX, True, check_crc=False)
    assert outcome(columnar_rows, buf, 0, INT64_MAX, True, check_crc=False) == expected


@settings(max_examples=60, deadline=None)
@given(fetch_responses(), st.integers(0, 10_000))
def test_truncation_anywhere_drops_only_the_partial_batch(
    response: tuple[bytes, list[int]], cut: int
) -> None:
    raw, _ = response
    buf = raw[: cut % (len(raw) + 1)]
    assert columnar_rows(buf, 0, INT64_MAX, True) == reference_rows(buf, 0, INT64_MAX, True)


# --- cases by name ------------------------------------------------------------------------------


def sample(compression: str = "none", base_offset: int = 0) -> bytes:
    return encode_batch(
        [
            (b"k", b"v", [("h", b"x"), ("n", None)], 1_700_000_000_000),  # type: ignore[list-item]
            (None, None, [], 1_700_000_000_005),
            (b"", b"", [], -1),
        ],
        compression=compression,
        base_offset=base_offset,
    )


@pytest.mark.parametrize("compression", CODECS)
def test_every_codec_decodes_through_the_same_kernel(compression: str) -> None:
    data = sample(compression, base_offset=40)
    assert columnar_rows(data, 0, INT64_MAX, True) == reference_rows(data, 0, INT64_MAX, True)
    (cols,) = decode_columns(data, include_headers=True)
    assert cols.key.to_pylist() == [b"k", None, b""]
    assert cols.value.null_count == 1
    assert cols.offset.to_pylist() == [40, 41, 42]
    assert cols.headers is not None and cols.headers.to_pylist()[0] == [
        {"key": "h", "value": b"x"},
        {"key": "n", "value": None},
    ]


def test_log_append_time_takes_the_batch_max_timestamp() -> None:
    data = bytearray(sample())
    struct.pack_into(">h", data, ATTRIBUTES_POS, LOG_APPEND_TIME)
    struct.pack_into(">q", data, MAX_TIMESTAMP_POS, 1_234)
    (cols,) = decode_columns(fix_crc(data, 0))
    assert cols.timestamp.cast(pa.int64()).to_pylist() == [1_234_000] * 3
    assert cols.timestamp_type.to_pylist() == [1] * 3


def test_control_batches_are_skipped_and_empty_input_yields_nothing() -> None:
    control = bytearray(sample())
    struct.pack_into(">h", control, ATTRIBUTES_POS, CONTROL)
    data = fix_crc(control, 0) + sample(base_offset=3)
    assert [c.offset.to_pylist() for c in decode_columns(data)] == [[3, 4, 5]]
    assert list(decode_columns(b"")) == []


def test_a_crc_mismatch_names_the_batch() -> None:
    data = bytearray(sample(base_offset=77))
    data[bytes(data).index(b"\x02v") + 1] ^= 0x40  # the first value, b"v" -> b"6"
    with pytest.raises(CorruptMessage, match="CRC mismatch in the batch at offset 77"):
        list(decode_columns(bytes(data)))
    assert len(list(decode_columns(bytes(data), check_crc=False))) == 1


@pytest.mark.parametrize(
    ("patch", "message"),
    [
        (lambda d: struct.pack_into(">i", d, 8, 10), "below the minimum record overhead"),
        (lambda d: d.__setitem__(16, 1), "not magic 2"),
        (lambda d: struct.pack_into(">i", d, 8, 30), "below a v2 batch header"),
    ],
)
def test_impossible_framing_is_corrupt_in_both(patch: Any, message: str) -> None:
    data = bytearray(sample()) + bytearray(64)
    patch(data)
    with pytest.raises(CorruptMessage, match=message):
        list(decode_columns(bytes(data)))
    with pytest.raises(CorruptMessage):
        list(decode_batches(bytes(data), check_crc=False))


def test_negative_or_impossible_record_counts_are_corrupt() -> None:
    for count in (-1, 10_000):
        data = bytearray(sample(base_offset=5))
        struct.pack_into(">i", data, RECORDS_COUNT_POS, count)
        buf = fix_crc(data, 0)
        with pytest.raises(CorruptMessage, match="offset 5"):
            list(decode_columns(buf))
        with pytest.raises(CorruptMessage):
            list(decode_batches(buf))


def test_a_header_key_that_is_not_utf8_is_corrupt() -> None:
    data = bytearray(sample())
    at = bytes(data).index(b"\x02h")  # key length 1 (zigzag 2), key "h"
    data[at + 1] = 0xFF
    buf = fix_crc(data, 0)
    with pytest.raises(CorruptMessage, match="not UTF-8"):
        list(decode_columns(buf))
    with pytest.raises(CorruptMessage):
        list(decode_batches(buf))


def test_memoryview_and_bytearray_inputs() -> None:
    data = sample() + sample(base_offset=3)
    for buf in (bytearray(data), memoryview(data)):
        assert [c.offset.to_pylist() for c in decode_columns(buf)] == [[0, 1, 2, 3, 4, 5]]


def test_limits_are_consistent() -> None:
    assert ARROW_BINARY_BYTES_MAX == 2**31 - 1  # Arrow's int32 offsets


# --- the kernel never reads or writes out of bounds --------------------------------------------

BOUNDSCHECK_SCRIPT = r"""
import random, struct
from crc32c import crc32c
from spark_connector.columnar import decode_columns
from clients.common.records import encode_batch
from clients.common.errors import CorruptMessage
rng = random.Random(7)
ok = corrupt = 0
for i in range(3000):
    recs = [(rng.choice([None, rng.randbytes(rng.randrange(8))]),
             rng.choice([None, rng.randbytes(rng.randrange(40))]),
             [("k%d" % j, rng.choice([None, b"v"])) for j in range(rng.randrange(3))], rng.randrange(10**12))
            for _ in range(rng.randrange(1, 8))]
    data = bytearray(encode_batch(recs, compression=rng.choice(["none", "zstd"])))
    for _ in range(rng.randrange(1, 5)):
        data[rng.randrange(21, len(data))] = rng.randrange(256)
    struct.pack_into(">I", data, 17, crc32c(memoryview(data)[21:]))
    try:
        for cols in decode_columns(bytes(data), include_headers=True):
            ok += 1
    except CorruptMessage:
        corrupt += 1
print(ok, corrupt)
"""


@pytest.mark.slow
def test_kernel_stays_in_bounds_under_numba_boundscheck(tmp_path: Path) -> None:
    """Numba checks no index by default; with NUMBA_BOUNDSCHECK=1 an out-of-bounds index raises
    IndexError instead. Compiled afresh (own cache dir) so the checked build is what runs."""
    ok, corrupt = run_with_numba_boundscheck(BOUNDSCHECK_SCRIPT, tmp_path)
    assert ok > 0 and corrupt > 0
