"""The Consumer's one-pass decode (records.decode_records_as) against decode_batches.

decode_batches (a Record per record) is the reference: on random fetch answers — every
codec, null keys and values, headers, LogAppendTime, control batches, a start offset
inside a batch, a truncated tail, corrupted bytes — decode_records_as must give exactly
the ConsumerRecords the Consumer used to build from decode_batches, or refuse the same
input with CorruptMessage.
"""

from __future__ import annotations

import copy
import pickle
import struct

import pytest
from crc32c import crc32c
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from clients.common.errors import CorruptMessage
from clients.common.record_batch import ATTRIBUTES_POS, CRC_POS, MAX_TIMESTAMP_POS, RECORDS_COUNT_POS
from clients.common.records import (
    COMPRESSION_CODES,
    decode_batches,
    decode_records_as,
    encode_batch,
    iter_records_as,
)
from clients.types import ConsumerRecord

LOG_APPEND_TIME = 0x08
CONTROL = 0x20
TOPIC = "orders"
PARTITION = 3

header_keys = st.text(st.characters(blacklist_categories=("Cs",)), max_size=6)
records = st.tuples(
    st.none() | st.binary(max_size=24),
    st.none() | st.binary(max_size=64),
    st.lists(st.tuples(header_keys, st.none() | st.binary(max_size=8)), max_size=3),
    st.integers(0, 2**41),
)


def fix_crc(data: bytearray, position: int) -> None:
    """Recompute the CRC of the batch at `position` after patching bytes it covers."""
    size = struct.unpack_from(">i", data, position + 8)[0] + 12
    crc = crc32c(memoryview(data)[position + ATTRIBUTES_POS : position + size])
    struct.pack_into(">I", data, position + CRC_POS, crc)


@st.composite
def batch(draw: st.DrawFn, base_offset: int) -> bytes:
    """One batch: random records and codec, maybe LogAppendTime, maybe a control batch."""
    recs = draw(st.lists(records, min_size=1, max_size=12))
    codec = draw(st.sampled_from(list(COMPRESSION_CODES)))
    data = bytearray(encode_batch(recs, compression=codec, base_offset=base_offset))
    attributes = struct.unpack_from(">h", data, ATTRIBUTES_POS)[0]
    if draw(st.booleans()):
        attributes |= LOG_APPEND_TIME
        struct.pack_into(">q", data, MAX_TIMESTAMP_POS, draw(st.integers(0, 2**41)))
    if draw(st.integers(0, 5)) == 0:
        attributes |= CONTROL
    struct.pack_into(">h", data, ATTRIBUTES_POS, attributes)
    fix_crc(data, 0)
    return bytes(data)


@st.composite
def fetch_answers(draw: st.DrawFn, cut: bool = True) -> bytes:
    """Batches back to back (offsets contiguous), maybe (`cut`) cut mid-way through the last one."""
    out: list[bytes] = []
    offset = draw(st.integers(0, 1_000))
    for _ in range(draw(st.integers(1, 4))):
        one = draw(batch(offset))
        out.append(one)
        offset += struct.unpack_from(">i", one, RECORDS_COUNT_POS)[0]
    data = b"".join(out)
    if cut and draw(st.booleans()):
        data = data[: draw(st.integers(len(data) - len(out[-1]), len(data)))]
    return data


def reference(data: bytes, start_offset: int, check_crc: bool) -> list[ConsumerRecord] | str:
    """What the Consumer built before: decode_batches, then a ConsumerRecord per Record."""
    try:
        return [
            ConsumerRecord(TOPIC, PARTITION, r.offset, r.key, r.value, r.headers, r.timestamp_ms)
            for r in decode_batches(data, check_crc=check_crc)
            if r.offset >= start_offset
        ]
    except CorruptMessage:
        return "corrupt"


def one_pass(data: bytes, start_offset: int, check_crc: bool) -> list[ConsumerRecord] | str:
    try:
        decoded = decode_records_as(
            ConsumerRecord, data, TOPIC, PARTITION, start_offset=start_offset, check_crc=check_crc
        )
    except CorruptMessage:
        return "corrupt"
    assert all(type(r) is ConsumerRecord for r in decoded)
    return decoded


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(fetch_answers(), st.integers(0, 1_100), st.booleans())
def test_same_records_as_decode_batches(data: bytes, start_offset: int, check_crc: bool) -> None:
    assert one_pass(data, start_offset, check_crc) == reference(data, start_offset, check_crc)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(fetch_answers(cut=False), st.data())
def test_corrupted_answers_are_refused_like_decode_batches(data: bytes, draw: st.DataObject) -> None:
    """Flips anywhere with the CRC checked, and flips in a batch's records with its CRC
    recomputed (only the record grammar can catch those): refused or decoded alike."""
    corrupted = bytearray(data)
    for _ in range(draw.draw(st.integers(1, 3))):
        corrupted[draw.draw(st.integers(0, len(data) - 1))] ^= draw.draw(st.integers(1, 255))
    flipped = bytes(corrupted)
    assert one_pass(flipped, 0, True) == reference(flipped, 0, True)
    (length,) = struct.unpack_from(">i", data, 8)
    recomputed = bytearray(data)
    for _ in range(draw.draw(st.integers(1, 3))):
        recomputed[draw.draw(st.integers(ATTRIBUTES_POS, length + 11))] = draw.draw(st.integers(0, 255))
    fix_crc(recomputed, 0)
    assert one_pass(bytes(recomputed), 0, True) == reference(bytes(recomputed), 0, True)


def test_records_keep_the_public_type_and_fields() -> None:
    data = encode_batch([(b"k", b"v", [("h", b"x")], 1_700_000_000_000)], base_offset=41)
    (record,) = decode_records_as(ConsumerRecord, data, TOPIC, PARTITION)
    assert isinstance(record, ConsumerRecord)
    assert record == ConsumerRecord(TOPIC, PARTITION, 41, b"k", b"v", [("h", b"x")], 1_700_000_000_000)
    assert (record.topic, record.offset, record.timestamp_ms) == (TOPIC, 41, 1_700_000_000_000)
    assert record._asdict()["headers"] == [("h", b"x")]


def test_records_without_headers_share_one_read_only_empty_list() -> None:
    data = encode_batch([(b"k", b"a", [], 1), (b"k", b"b", [], 2), (None, b"c", [("h", b"x")], 3)])
    plain_a, plain_b, with_header = decode_records_as(ConsumerRecord, data, TOPIC, PARTITION)
    assert plain_a.headers is plain_b.headers  # one object, not one per record
    assert plain_a.headers == [] and isinstance(plain_a.headers, list)
    assert with_header.headers == [("h", b"x")] and with_header.headers is not plain_a.headers
    changes = [
        lambda h: h.append(("h", b"x")),
        lambda h: h.extend([("h", b"x")]),
        lambda h: h.insert(0, ("h", b"x")),
        lambda h: h.__setitem__(slice(0, 0), [("h", b"x")]),
        lambda h: h.__iadd__([("h", b"x")]),
    ]
    for change in changes:
        with pytest.raises(TypeError, match="read-only"):
            change(plain_a.headers)
    assert plain_b.headers == [] and repr(plain_b).endswith("headers=[], timestamp_ms=2)")
    for copied in (
        copy.copy(plain_a.headers),
        copy.deepcopy(plain_a).headers,
        pickle.loads(pickle.dumps(plain_a)).headers,
    ):
        assert type(copied) is list and copied == []
        copied.append(("h", b"x"))  # a copy is the caller's own list
    assert plain_b.headers == []


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(fetch_answers(cut=False), st.integers(0, 1_100), st.data())
def test_batch_at_a_time_gives_the_same_records_and_everything_before_a_corrupt_batch(
    data: bytes, start_offset: int, draw: st.DataObject
) -> None:
    """iter_records_as (what the Consumer hands out from) yields decode_records_as' records
    batch by batch; on a corrupt answer, every record before the batch it refuses."""
    corrupted = bytearray(data)
    if draw.draw(st.booleans()):
        corrupted[draw.draw(st.integers(0, len(data) - 1))] ^= draw.draw(st.integers(1, 255))
    buf = bytes(corrupted)
    yielded: list[ConsumerRecord] = []
    refused = False
    try:
        for batch_records in iter_records_as(
            ConsumerRecord, buf, TOPIC, PARTITION, start_offset=start_offset
        ):
            yielded += batch_records
    except CorruptMessage:
        refused = True
    expected = one_pass(buf, start_offset, True)
    if refused:
        assert expected == "corrupt"
        everything_before: list[ConsumerRecord] = []
        try:
            for r in decode_batches(buf):
                if r.offset >= start_offset:
                    everything_before.append(
                        ConsumerRecord(TOPIC, PARTITION, r.offset, r.key, r.value, r.headers, r.timestamp_ms)
                    )
        except CorruptMessage:
            pass
        # decode_batches yields a refused batch's records up to the bad one; a batch at a
        # time holds the whole batch back.
        assert everything_before[: len(yielded)] == yielded
    else:
        assert yielded == expected
