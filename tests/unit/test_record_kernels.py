"""One reader of the record format for the leader's check and Spark's decoder (issue 40).

clients/common/record_kernels.walk_record reads every field of a v2 record; the leader's check
(clients/common/record_validation.py) walks in its strict grammar and Spark's decoder
(spark_connector/columnar.py) in aiokafka's lenient one. These tests hold the promise that
makes a leader's acceptance mean Spark can read the batch: a record the strict walk takes,
the lenient walk takes with the same spans; the spans are the encoded key, value and headers;
and neither module reads record bytes of its own.
"""

from __future__ import annotations

import ast
import random
from pathlib import Path
from typing import cast

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from clients.common.record_batch import BATCH_HEADER_SIZE, validate_batches
from clients.common.record_kernels import (
    KEY_LENGTH_MIN_NONE,
    OFFSET_DELTA_UNCHECKED,
    W_HEADER_COUNT,
    W_HEADERS_POS,
    W_KEY_LENGTH,
    W_KEY_POS,
    W_NEXT,
    W_STATUS,
    W_TS_DELTA,
    W_VALUE_LENGTH,
    W_VALUE_POS,
    WALK_OK,
    read_header,
    walk_record,
)
from clients.common.record_validation import KEY_LENGTH_MIN_ANY, TimestampRules, validate_records
from clients.common.records import RecordTuple, decode_batches, encode_batch
from spark_connector.columnar import decode_columns
from tests.python_source import parse_python

ROOT = Path(__file__).resolve().parents[2]
NOW_MS = 1_700_000_000_000
RULES = TimestampRules(log_append_time=False, before_max_ms=2**63 - 1, after_max_ms=2**63 - 1)

# Lengths on each side of a varint's width changing (zigzag: 63 is one byte, 64 two, ...).
EDGE_LENGTHS = [0, 1, 63, 64, 8191, 8192]
blobs = st.one_of(
    st.none(),
    st.sampled_from(EDGE_LENGTHS).map(lambda n: b"b" * n),
    st.binary(max_size=40),
)
header = st.tuples(st.text(max_size=8), st.one_of(st.none(), st.binary(max_size=70)))
# Timestamp deltas from 0 to 10-byte varints, both signs.
timestamps = st.one_of(
    st.just(NOW_MS), st.integers(min_value=0, max_value=2**62), st.sampled_from([NOW_MS - 1, NOW_MS + 2**31])
)
records = st.lists(st.tuples(blobs, blobs, st.lists(header, max_size=3), timestamps), min_size=1, max_size=12)


def walk_section(section: np.ndarray, count: int, *, strict: bool) -> list[tuple[int, ...]]:
    """Every record's walk_record result over a records section, as the two kernels walk it."""
    walked = []
    pos = 0
    for index in range(count):
        if strict:
            result = walk_record(section, pos, len(section), True, KEY_LENGTH_MIN_ANY, index)
        else:
            result = walk_record(
                section, pos, len(section), False, KEY_LENGTH_MIN_NONE, OFFSET_DELTA_UNCHECKED
            )
        walked.append(tuple(int(field) for field in result))
        if result[W_STATUS] != WALK_OK:
            break
        pos = int(result[W_NEXT])
    return walked


def spans(section: np.ndarray, walked: tuple[int, ...]) -> tuple[object, ...]:
    """The bytes a walk found: key, value, and each header's key and value (None for null)."""

    def span(at: int, length: int) -> bytes | None:
        return None if length < 0 else bytes(section[at : at + length])

    headers = []
    pos = walked[W_HEADERS_POS]
    for _ in range(walked[W_HEADER_COUNT]):
        key_at, key_len, value_at, value_len, pos = (
            int(field) for field in read_header(section, pos, len(section))
        )
        headers.append((bytes(section[key_at : key_at + key_len]).decode(), span(value_at, value_len)))
    return (
        span(walked[W_KEY_POS], walked[W_KEY_LENGTH]),
        span(walked[W_VALUE_POS], walked[W_VALUE_LENGTH]),
        headers,
    )


Generated = list[tuple[bytes | None, bytes | None, list[tuple[str, bytes | None]], int]]


def encode(batch_records: Generated) -> bytes:
    """encode_batch on records whose header values may be null, as the wire allows (aiokafka
    writes -1); encode_batch's type has header values as bytes only."""
    return encode_batch(cast("list[RecordTuple]", batch_records))


def records_section(batch: bytes) -> np.ndarray:
    section = np.frombuffer(batch, dtype=np.uint8)[BATCH_HEADER_SIZE:]
    section.flags.writeable = False
    return section


@settings(max_examples=150, deadline=None)
@given(records)
def test_validation_and_spark_walk_every_generated_batch_to_the_same_spans(
    batch_records: Generated,
) -> None:
    batch = encode(batch_records)
    section = records_section(batch)
    strict = walk_section(section, len(batch_records), strict=True)
    lenient = walk_section(section, len(batch_records), strict=False)
    assert strict == lenient
    assert [walked[W_STATUS] for walked in strict] == [WALK_OK] * len(batch_records)
    assert strict[-1][W_NEXT] == len(section)
    expected = [(key, value, [(k, v) for k, v in headers]) for key, value, headers, _ in batch_records]
    assert [spans(section, walked) for walked in strict] == expected
    assert [walked[W_TS_DELTA] for walked in strict] == [ts - batch_records[0][3] for *_, ts in batch_records]
    # And through the two modules: the leader accepts it, Spark decodes the same records.
    validate_records(batch, validate_batches(batch, max_batch_bytes=None), rules=RULES, now_ms=NOW_MS)
    columns = list(decode_columns(batch, include_headers=True))
    assert [row for part in columns for row in part.key.to_pylist()] == [key for key, *_ in batch_records]
    assert [row for part in columns for row in part.value.to_pylist()] == [
        value for _, value, *_ in batch_records
    ]
    decoded_headers = [row for part in columns for row in part.headers.to_pylist()]  # type: ignore[union-attr]
    assert [[(h["key"], h["value"]) for h in row] for row in decoded_headers] == [h for *_, h in expected]


def test_a_record_the_strict_walk_takes_the_lenient_walk_takes_with_the_same_spans() -> None:
    """Damage generated batches a byte at a time: wherever the leader's walk still takes a
    record, Spark's walk takes it too and reads the same fields (the other way round need not
    hold: the leader's grammar is the narrower one)."""
    rng = random.Random(40)
    strict_taken = 0
    for _ in range(300):
        batch_records: Generated = [
            (
                rng.choice([None, b"", b"k" * rng.randrange(1, 70)]),
                rng.choice([None, b"", b"v" * rng.randrange(1, 200)]),
                [("h", rng.choice([None, b"x"]))] * rng.randrange(3),
                NOW_MS + rng.randrange(-(2**40), 2**40),
            )
            for _ in range(rng.randrange(1, 6))
        ]
        data = bytearray(encode(batch_records))
        for _ in range(rng.randrange(1, 3)):
            data[rng.randrange(BATCH_HEADER_SIZE, len(data))] = rng.randrange(256)
        section = records_section(bytes(data))
        strict = walk_section(section, len(batch_records), strict=True)
        lenient = walk_section(section, len(batch_records), strict=False)
        for strict_walk, lenient_walk in zip(strict, lenient, strict=False):
            if strict_walk[W_STATUS] != WALK_OK:
                break
            strict_taken += 1
            assert lenient_walk == strict_walk
    assert strict_taken > 0


def test_a_leader_accepted_batch_decodes_in_spark_as_in_the_consumer() -> None:
    """Header values, null keys and values, 2- and 3-byte length varints, through both modules."""
    batch_records: Generated = [
        (None, b"v" * 8192, [("a", None), ("é", b"x" * 64)], NOW_MS),
        (b"k" * 64, None, [], NOW_MS - 1),
        (b"", b"", [("", b"")], NOW_MS + 2**31),
    ]
    batch = encode(batch_records)
    validate_records(batch, validate_batches(batch, max_batch_bytes=None), rules=RULES, now_ms=NOW_MS)
    consumer = [(record.key, record.value, record.headers) for record in decode_batches(batch)]
    (columns,) = decode_columns(batch, include_headers=True)
    assert columns.headers is not None
    spark = [
        (key, value, [(h["key"], h["value"]) for h in headers])
        for key, value, headers in zip(
            columns.key.to_pylist(), columns.value.to_pylist(), columns.headers.to_pylist(), strict=True
        )
    ]
    assert spark == consumer


# The two walkers' own modules: what they may not do with record bytes themselves.
WALKER_MODULES = ["clients/common/record_validation.py", "spark_connector/columnar.py"]
# Reading a varint, or decoding UTF-8, in either module means a second reader of a field.
FIELD_READERS = {"read_varint", "_varint", "_short_varint", "utf8_valid", "_utf8_valid"}


@pytest.mark.parametrize("path", WALKER_MODULES)
def test_neither_walker_reads_a_record_field_itself(path: str) -> None:
    tree = parse_python((ROOT / path).read_text())
    names = {node.id for node in ast.walk(tree) if isinstance(node, ast.Name)}
    names |= {
        alias.asname or alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
    }
    assert "walk_record" in names, f"{path} walks records without record_kernels.walk_record"
    assert not names & FIELD_READERS, f"{path} reads record fields itself: {sorted(names & FIELD_READERS)}"
    # A varint's continuation bit, tested in the module, is a varint being read there.
    constants = {node.value for node in ast.walk(tree) if isinstance(node, ast.Constant)}
    assert 0x80 not in constants, f"{path} tests a varint continuation bit (0x80) itself"
