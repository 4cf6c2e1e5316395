"""The leader's check of a produced batch's records (clients/common/record_validation.py, issue 17).

A batch with a valid CRC but contents no consumer can read ("poison batch") used to be
stored, and every consumer of the partition then stopped for good. Each test here builds
such a batch with a correct CRC and shows the leader refuses it, naming the problem, and
writes nothing; valid batches of every codec still pass, and the timestamp rules of the
topic (Kafka's message.timestamp.*) are applied as Kafka applies them.
"""

from __future__ import annotations

import struct
from pathlib import Path

import pytest
from aiokafka.record.default_records import DefaultRecordBatchBuilder
from crc32c import crc32c
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from clients.common import limits
from clients.common.errors import (
    CorruptMessage,
    HighwaterError,
    InvalidRecord,
    InvalidTimestamp,
    MessageTooLarge,
)
from clients.common.record_batch import (
    ATTRIBUTES_POS,
    BATCH_HEADER_SIZE,
    BATCH_LENGTH_POS,
    CRC_POS,
    CRC_START_POS,
    LAST_OFFSET_DELTA_POS,
    LOG_OVERHEAD,
    MAX_TIMESTAMP_POS,
    RECORDS_COUNT_POS,
    apply_batch_fixes,
    parse_header,
    validate_batches,
)
from clients.common.record_validation import TimestampRules, validate_records
from clients.common.records import COMPRESSION_CODES, Record, decode_batches, encode_batch, encode_values
from services.broker.log import Log, LogConfig, MemoryStorage
from services.broker.partition import LeaderAndIsrState, Partition
from spark_connector.columnar import decode_columns
from tests.unit.boundscheck import run_with_numba_boundscheck

NOW_MS = 1_700_000_000_000
HOUR_MS = 3_600_000
CODECS = sorted(COMPRESSION_CODES)
CREATE_TIME = TimestampRules(log_append_time=False, before_max_ms=2**63 - 1, after_max_ms=HOUR_MS)


# --- building batches with a valid CRC and bad contents --------------------------------------


def values_batch(n: int = 3, *, compression: str = "none", timestamp_ms: int = NOW_MS) -> bytes:
    return encode_values(
        [f"value-{i}".encode() for i in range(n)], timestamp_ms=timestamp_ms, compression=compression
    )


def with_fields(batch: bytes, **fields: int) -> bytes:
    """`batch` with header fields overwritten and its CRC recomputed: a valid CRC over whatever results."""
    layout = {
        "attributes": (ATTRIBUTES_POS, ">h"),
        "records_count": (RECORDS_COUNT_POS, ">i"),
        "last_offset_delta": (LAST_OFFSET_DELTA_POS, ">i"),
        "max_timestamp": (MAX_TIMESTAMP_POS, ">q"),
    }
    out = bytearray(batch)
    for name, value in fields.items():
        position, fmt = layout[name]
        struct.pack_into(fmt, out, position, value)
    return with_crc(out)


def with_records(batch: bytes, records: bytes) -> bytes:
    """`batch`'s header over another records section, batch_length and CRC made to match."""
    out = bytearray(batch[:BATCH_HEADER_SIZE]) + records
    struct.pack_into(">i", out, BATCH_LENGTH_POS, len(out) - LOG_OVERHEAD)
    return with_crc(out)


def with_crc(batch: bytes | bytearray) -> bytes:
    out = bytearray(batch)
    struct.pack_into(">I", out, CRC_POS, crc32c(bytes(out[CRC_START_POS:])))
    return bytes(out)


def varint(value: int) -> bytes:
    raw = (value << 1) ^ (value >> 63)
    out = bytearray()
    while True:
        byte = raw & 0x7F
        raw >>= 7
        if raw:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def record(
    offset_delta: int,
    value: bytes | None = b"v",
    *,
    key: bytes | None = None,
    ts_delta: int = 0,
    headers: list[tuple[bytes, bytes]] | None = None,
    attributes: int = 0,
    length_adjust: int = 0,
    header_count: int | None = None,
) -> bytes:
    """One v2 record, hand-encoded so each field can be made wrong on purpose."""
    body = bytes([attributes]) + varint(ts_delta) + varint(offset_delta)
    body += varint(-1) if key is None else varint(len(key)) + key
    body += varint(-1) if value is None else varint(len(value)) + value
    headers = headers or []
    body += varint(len(headers) if header_count is None else header_count)
    for hkey, hvalue in headers:
        body += varint(len(hkey)) + hkey + varint(len(hvalue)) + hvalue
    return varint(len(body) + length_adjust) + body


def hand_batch(records: list[bytes], *, count: int | None = None) -> bytes:
    """A CreateTime batch around hand-encoded records; records_count = len(records) unless given."""
    n = len(records) if count is None else count
    return with_fields(
        with_records(values_batch(1), b"".join(records)), records_count=n, last_offset_delta=n - 1
    )


# --- a leader partition on a log -----------------------------------------------------------


def leader(config: LogConfig | None = None) -> Partition:
    log = Log.open("/p/t-0", config or LogConfig(), storage=MemoryStorage(), now_ms=0)
    p = Partition("t", 0, 1, log)
    p.become_leader(LeaderAndIsrState(1, 0, (1,), (1,), 1, 1), now_ms=0)
    return p


def refused(p: Partition, records: bytes, error: type[HighwaterError], match: str) -> HighwaterError:
    """Append `records` and require `error`, and that nothing was written."""
    leo, segments = p.log.log_end_offset, p.log.segment_base_offsets
    with pytest.raises(error, match=match) as raised:
        p.append_as_leader(records, acks=1, now_ms=NOW_MS)
    assert p.log.log_end_offset == leo and p.log.segment_base_offsets == segments, "nothing may be written"
    assert "nothing of this request was written" in raised.value.message
    return raised.value


def stored(p: Partition) -> bytes:
    return bytes(p.log.read(0, max_bytes=64 * 1024 * 1024).records)


# --- poison batches ---------------------------------------------------------------------------


def test_unknown_codec_7_is_refused_as_corrupt_message():
    poison = with_fields(values_batch(), attributes=7)
    error = refused(leader(), poison, CorruptMessage, "unknown compression codec 7")
    assert "batch 1 of 1" in error.message


def test_a_gzip_flag_on_a_body_that_is_not_gzip_is_refused():
    poison = with_fields(values_batch(), attributes=1)
    refused(leader(), poison, CorruptMessage, "do not decompress as gzip")


@pytest.mark.parametrize(
    "records,says",
    [
        ([record(0, key=b"k"), record(1)[:-3]], "record 1: its length field says 7 bytes, more than remain"),
        (
            [record(0, b"v" * 5, length_adjust=1)],
            "says 10 bytes but its fields end elsewhere|more than remain",
        ),
        ([record(0, header_count=-1)], "header count is -1"),
        ([record(0, headers=[(b"\xff\xfe", b"x")])], "header key is not UTF-8"),
        ([record(0, attributes=0x80)], "attributes byte 0x80"),
        (
            [varint(9) + b"\x00" + varint(0) + varint(0) + varint(-1) + varint(50) + b"vvvv" + varint(0)],
            "record 0: its value of 50 bytes runs past the end of the record",
        ),
    ],
    ids=[
        "truncated-record",
        "length-mismatch",
        "negative-header-count",
        "header-key-not-utf8",
        "attributes-high-bit",
        "value-past-record",
    ],
)
def test_records_that_do_not_decode_are_refused(records: list[bytes], says: str):
    poison = hand_batch(records, count=len(records))
    with pytest.raises(HighwaterError):  # the consumers' decoder cannot read it either
        list(decode_batches(poison))
    refused(leader(), poison, InvalidRecord, says)


def test_a_69_byte_batch_claiming_2_31_minus_1_records_is_refused_and_rolls_no_segment():
    one = encode_values([b"x"], timestamp_ms=NOW_MS)
    poison = with_fields(one, records_count=2**31 - 1, last_offset_delta=2**31 - 2)
    assert len(poison) == 69
    validate_batches(poison, max_batch_bytes=None)  # the header check alone lets it through
    p = leader()
    p.append_as_leader(values_batch(), acks=1, now_ms=NOW_MS)
    for _ in range(3):  # each one used to be stored and to roll a new segment (a file handle each)
        refused(p, poison, InvalidRecord, "the records end after 1 records, short of records_count")
    assert p.log.segment_base_offsets == [0]


def test_offset_deltas_out_of_order_are_refused():
    poison = hand_batch([record(0), record(2), record(1)])
    refused(leader(), poison, InvalidRecord, "record 1: its offset delta is 2")


def test_trailing_bytes_after_the_last_record_are_refused():
    poison = hand_batch([record(0), record(1)], count=1)
    refused(leader(), poison, InvalidRecord, r"\d+ bytes follow the last of records_count records")


def test_control_and_transactional_batches_from_producers_are_refused():
    refused(leader(), with_fields(values_batch(), attributes=0x20), InvalidRecord, "control batch")
    refused(
        leader(), with_fields(values_batch(), attributes=0x10), InvalidRecord, "no transactional producer"
    )


def test_a_verified_transactional_request_may_append_transactional_batches():
    p = leader()
    builder = DefaultRecordBatchBuilder(2, 0, 1, 7, 0, 0, 1 << 20)  # transactional, producer 7/0
    builder.append(0, timestamp=0, key=b"k", value=b"v", headers=[])
    p.append_as_leader(bytes(builder.build()), acks=1, now_ms=0, transactional=True)
    assert p.log.log_end_offset > 0
    assert p.producers.first_unstable_offset() == 0, "the transaction is open until its marker"


@pytest.mark.parametrize("codec", ["gzip", "snappy", "lz4", "zstd"])
def test_a_compressed_batch_that_inflates_past_the_limit_is_refused(
    codec: str, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setattr(limits, "DECOMPRESSED_BATCH_BYTES_MAX", 64 * 1024)
    bomb = encode_values([bytes(1024)] * 100, timestamp_ms=NOW_MS, compression=codec)  # ~100 KiB of zeros
    assert len(bomb) < 64 * 1024
    refused(leader(), bomb, MessageTooLarge, "decompress to more than 65536 bytes")
    leader().append_as_leader(
        encode_values([bytes(1024)] * 50, timestamp_ms=NOW_MS, compression=codec), acks=1, now_ms=NOW_MS
    )


# --- what still passes ------------------------------------------------------------------------


@pytest.mark.parametrize("codec", CODECS)
def test_a_valid_batch_of_every_codec_is_accepted(codec: str):
    records = [
        Record(
            b"k%d" % i if i % 2 else None,
            None if i == 3 else b"v" * i,
            [("h", b"x"), ("\u00e9", b"")] if i % 3 == 0 else [],
            NOW_MS - i,
        )
        for i in range(40)
    ]
    batch = encode_batch(records, compression=codec)
    p = leader()
    append = p.append_as_leader(batch, acks=1, now_ms=NOW_MS)
    assert (append.first_offset, append.next_offset, append.log_append_time_ms) == (0, 40, -1)
    assert stored(p)[MAX_TIMESTAMP_POS:] == batch[MAX_TIMESTAMP_POS:], "stored as sent (offsets aside)"
    assert [(r.key, r.value, r.timestamp_ms) for r in decode_batches(stored(p))] == [
        (r.key, r.value, r.timestamp_ms) for r in records
    ]


def test_a_valid_batch_before_a_poison_one_in_the_same_request_is_not_written_either():
    # Kafka's LogValidator refuses the request's records for the partition as a whole; so do we.
    p = leader()
    poison = hand_batch([record(0), record(0)])
    error = refused(p, values_batch() + poison, InvalidRecord, "offset delta is 0")
    assert error.message.startswith(f"batch 2 of 2 (at byte {len(values_batch())} of the request")
    p.append_as_leader(values_batch(), acks=1, now_ms=NOW_MS)
    assert p.log.log_end_offset == 3


# --- timestamps ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "timestamp_ms,accepted",
    [
        (NOW_MS + HOUR_MS, True),
        (NOW_MS + HOUR_MS + 1, False),
        (NOW_MS - 10_000, True),
        (NOW_MS - 10_001, False),
        (-1, True),
    ],
)
def test_timestamps_outside_the_before_and_after_window_are_refused(timestamp_ms: int, accepted: bool):
    p = leader(LogConfig(message_timestamp_before_max_ms=10_000, message_timestamp_after_max_ms=HOUR_MS))
    batch = encode_batch([Record(None, b"a", [], NOW_MS), Record(None, b"b", [], timestamp_ms)])
    if accepted:
        p.append_as_leader(batch, acks=1, now_ms=NOW_MS)
        return
    error = refused(p, batch, InvalidTimestamp, f"record 1 has timestamp {timestamp_ms}")
    assert f"[{NOW_MS - 10_000}, {NOW_MS + HOUR_MS}]" in error.message


def test_by_default_only_an_hour_into_the_future_is_allowed_as_in_kafka_4():
    p = leader()
    p.append_as_leader(values_batch(timestamp_ms=0), acks=1, now_ms=NOW_MS)  # any past
    refused(
        p, values_batch(timestamp_ms=NOW_MS + HOUR_MS + 1), InvalidTimestamp, "message.timestamp.after.max.ms"
    )


def test_a_producer_may_not_set_the_log_append_time_type():
    poison = with_fields(values_batch(), attributes=0x08)
    refused(leader(), poison, InvalidTimestamp, "LogAppendTime timestamp type set")


def test_log_append_time_rewrites_max_timestamp_with_a_valid_crc_that_clients_decode():
    p = leader(LogConfig(message_timestamp_type="LogAppendTime"))
    for codec in CODECS:
        # Far-off producer timestamps do not matter: the window applies to CreateTime only.
        append = p.append_as_leader(values_batch(compression=codec, timestamp_ms=5), acks=1, now_ms=NOW_MS)
        assert append.log_append_time_ms == NOW_MS
    data = stored(p)
    headers = validate_batches(data, max_batch_bytes=None)  # every CRC holds
    assert [(h.max_timestamp, h.timestamp_type) for h in headers] == [(NOW_MS, 1)] * len(CODECS)
    decoded = list(decode_batches(data))
    assert len(decoded) == 3 * len(CODECS)
    assert {(r.timestamp_ms, r.timestamp_type) for r in decoded} == {(NOW_MS, 1)}


def test_a_wrong_create_time_max_timestamp_is_set_to_the_largest_record_timestamp_as_kafka_does():
    batch = encode_batch([Record(None, b"a", [], NOW_MS - 5), Record(None, b"b", [], NOW_MS - 9)])
    p = leader()
    p.append_as_leader(with_fields(batch, max_timestamp=NOW_MS + 10 * HOUR_MS), acks=1, now_ms=NOW_MS)
    (header,) = validate_batches(stored(p), max_batch_bytes=None)
    assert (header.max_timestamp, header.timestamp_type) == (NOW_MS - 5, 0)


def test_a_ten_byte_timestamp_delta_is_read_as_the_clients_read_it():
    batch = encode_batch([Record(None, b"a", [], 2**62), Record(None, b"b", [], -(2**62))])
    headers = validate_batches(batch, max_batch_bytes=None)
    rules = TimestampRules(log_append_time=False, before_max_ms=2**63 - 1, after_max_ms=2**63 - 1)
    assert validate_records(batch, headers, rules=rules, now_ms=0) == []
    assert [r.timestamp_ms for r in decode_batches(batch)] == [2**62, -(2**62)]


# --- properties ---------------------------------------------------------------------------------

HEADER_KEYS = st.text(max_size=6)
RECORDS = st.lists(
    st.tuples(
        st.none() | st.binary(max_size=20),
        st.none() | st.binary(max_size=300),
        st.lists(st.tuples(HEADER_KEYS, st.binary(max_size=8)), max_size=3),
        st.integers(NOW_MS - 10 * HOUR_MS, NOW_MS + HOUR_MS),
    ),
    min_size=1,
    max_size=30,
)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(records=RECORDS, codec=st.sampled_from(CODECS))
def test_random_valid_batches_of_every_codec_always_pass(records, codec):
    batch = encode_batch([Record(k, v, h, t) for k, v, h, t in records], compression=codec)
    headers = validate_batches(batch, max_batch_bytes=None)
    assert validate_records(batch, headers, rules=CREATE_TIME, now_ms=NOW_MS) == []


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(records=RECORDS, codec=st.sampled_from(CODECS), data=st.data())
def test_a_corrupted_records_section_with_a_valid_crc_is_refused_or_still_decodes(records, codec, data):
    batch = bytearray(encode_batch([Record(k, v, h, t) for k, v, h, t in records], compression=codec))
    position = data.draw(st.integers(BATCH_HEADER_SIZE, len(batch) - 1), label="position")
    batch[position] ^= data.draw(st.integers(1, 255), label="xor")
    poisoned = with_crc(batch)
    headers = validate_batches(poisoned, max_batch_bytes=None)
    try:
        fixes = validate_records(poisoned, headers, rules=CREATE_TIME, now_ms=NOW_MS)
    except (CorruptMessage, InvalidRecord, InvalidTimestamp, MessageTooLarge):
        return  # refused: fine
    accepted, _ = apply_batch_fixes(poisoned, headers, fixes)
    # Accepted: then both client decoders must read it (never accepted-but-undecodable).
    assert len(list(decode_batches(accepted))) == parse_header(accepted).records_count
    assert sum(len(columns) for columns in decode_columns(accepted)) == parse_header(accepted).records_count


# --- the kernel never reads out of bounds -------------------------------------------------------

BOUNDSCHECK_SCRIPT = r"""
import random, struct
from crc32c import crc32c
from clients.common.records import Record, encode_batch
from clients.common.errors import HighwaterError
from clients.common.record_batch import validate_batches
from clients.common.record_validation import TimestampRules, validate_records
rng = random.Random(11)
rules = TimestampRules(False, 2**63 - 1, 2**63 - 1)
ok = refused = 0
for i in range(3000):
    recs = [Record(rng.choice([None, rng.randbytes(rng.randrange(8))]),
                   rng.choice([None, rng.randbytes(rng.randrange(300))]),
                   [("k%d" % j, b"v") for j in range(rng.randrange(3))], rng.randrange(10**12))
            for _ in range(rng.randrange(1, 8))]
    data = bytearray(encode_batch(recs, compression=rng.choice(["none", "zstd"])))
    for _ in range(rng.randrange(1, 5)):
        data[rng.randrange(61, len(data))] = rng.randrange(256)
    struct.pack_into(">I", data, 17, crc32c(memoryview(data)[21:]))
    try:
        validate_records(data, validate_batches(data, max_batch_bytes=None), rules=rules, now_ms=0)
        ok += 1
    except HighwaterError:
        refused += 1
print(ok, refused)
"""


@pytest.mark.slow
def test_the_record_kernel_stays_in_bounds_under_numba_boundscheck(tmp_path: Path) -> None:
    """Numba checks no index by default; with NUMBA_BOUNDSCHECK=1 an out-of-bounds index raises
    IndexError instead. Compiled afresh (own cache dir) so the checked build is what runs."""
    ok, refused = run_with_numba_boundscheck(BOUNDSCHECK_SCRIPT, tmp_path)
    assert ok > 0 and refused > 0
