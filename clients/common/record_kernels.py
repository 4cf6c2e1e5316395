"""The one reader of Kafka's v2 record format, as numba kernels both record walkers call.

Two kernels walk the records of a batch: the leader's check before a produce is written
(clients/common/record_validation.py) and the Spark reader's decoder into Arrow columns
(spark_connector/columnar.py). If each read the fields its own way, a format change made in
one and not the other would let a leader accept what Spark cannot read (issue 40). So every
field of a record is read here, once, by `walk_record`; the two callers keep only their own
decisions: what the leader refuses and how it says so, and which columns Spark fills.

A record (Kafka's DefaultRecord): varint length, attributes, varint timestamp delta, varint
offset delta, key and value (varint length, -1 = null, then the bytes), varint header count,
and headers (key: varint length and UTF-8 bytes; value: varint length, -1 = null, bytes).

The walk has two grammars, chosen by the caller with `strict` (a literal, folded away once
the walk is inlined into the caller's kernel):

- lenient, aiokafka's (what consumers and Spark decode): every varint up to 10 bytes,
  attributes read as a varint, a negative key or value length is null, fields are bounded
  by the end of the records section and the record's length must match what it holds;
- strict, the leader's, the narrower of Kafka's and aiokafka's so that what passes it both
  decode: int32 fields are varints of at most 5 bytes within int32, the attributes byte is
  below 0x80 (an int8 reader and a varint reader then read the same byte), a length below
  -1 is refused, the record's length is checked first and bounds every field.

Every strict record is a lenient one with the same spans (tests/unit/test_record_kernels.py
checks it on generated batches), which is what lets a leader's acceptance promise Spark a
decode.

Every read is checked against its bound before it is made: numba checks no bounds. Callers
compile without numba's reference counting (numba_types.njit_without_refcounts): an array
passed to an inlined helper otherwise costs two atomic operations per call, more than the
read (spark_connector/columnar.py measured 55 of 72 ns per record).

Nothing here is compiled on its own: the walk is inlined into each caller's kernel, which is
compiled (eagerly, for the leader) and cached beside the caller's file. numba keys that cache
on the caller's file alone, so after a change here clear the callers' __pycache__/*.nb[ic]
(`./dev setup` then compiles them again; the container image compiles them at build).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from clients.common.numba_types import KernelInt

# --- the grammar's bounds ------------------------------------------------------------------
# Kafka reads int32 fields as varints of at most 5 bytes and int64 ones of at most 10
# (aiokafka reads every varint as an int64 one).
VARINT32_BYTES_MAX = 5
VARINT_BYTES_MAX = 10
INT32_MIN = -(2**31)
INT32_MAX = 2**31 - 1
# The attribute byte is read by Kafka as an int8 and by aiokafka as a varint: they agree
# only below 0x80.
RECORD_ATTRIBUTES_MAX = 0x7F
# A key (or value) length meaning "null".
NULL_LENGTH = -1
# The smallest record: length, attributes, timestamp delta, offset delta, key length,
# value length, header count, each a one-byte varint.
RECORD_BYTES_MIN = 7
# The smallest header: key length and value length, one byte each.
HEADER_BYTES_MIN = 2
# `walk_record`'s key_min when any key length is taken (a negative one as null).
KEY_LENGTH_MIN_NONE = -(2**63)
# `walk_record`'s offset_delta_expected when the offset delta is not checked.
OFFSET_DELTA_UNCHECKED = -1

# --- what `walk_record` found (0 = a whole record); the callers word them ---------------------
WALK_OK = 0
WALK_VARINT_TRUNCATED = 1
WALK_VARINT_TOO_LONG = 2
WALK_RECORD_LENGTH_FIELD = 3  # strict: negative record length
WALK_RECORD_BOUNDS = 4  # strict: record length past the section's end
WALK_ATTRIBUTES = 5  # strict: attributes byte above RECORD_ATTRIBUTES_MAX
WALK_OFFSET_DELTA = 6  # not offset_delta_expected
WALK_KEY_LENGTH = 7  # strict: below -1
WALK_NULL_KEY = 8  # below key_min
WALK_KEY_BOUNDS = 9
WALK_VALUE_LENGTH = 10  # strict: below -1
WALK_VALUE_BOUNDS = 11
WALK_HEADER_COUNT = 12
WALK_HEADER_KEY_LENGTH = 13
WALK_HEADER_KEY_BOUNDS = 14
WALK_HEADER_KEY_UTF8 = 15
WALK_HEADER_VALUE_LENGTH = 16  # strict: below -1
WALK_HEADER_VALUE_BOUNDS = 17
WALK_RECORD_LENGTH = 18  # the fields end elsewhere than the record's length says

# Slots of `walk_record`'s result tuple, for Python callers (the kernels unpack it).
(
    W_STATUS,
    W_DETAIL,
    W_NEXT,
    W_LENGTH,
    W_TS_DELTA,
    W_OFFSET_DELTA,
    W_KEY_LENGTH,
    W_KEY_POS,
    W_VALUE_LENGTH,
    W_VALUE_POS,
    W_HEADER_COUNT,
    W_HEADERS_POS,
) = range(12)


@njit(cache=True, nogil=True, inline="always")
def read_varint(buf: np.ndarray, pos: KernelInt, end: KernelInt) -> tuple[KernelInt, KernelInt]:
    """(value, next position) of the zigzag varint at buf[pos:end]; next position < 0 on error.

    As aiokafka's decode_varint64: at most 10 bytes, bits past 64 dropped, then zigzag.
    -1: it runs past `end`; -2: it is longer than 10 bytes. Nothing is read at or past `end`.
    """
    if pos >= end:
        return 0, -1
    first = np.uint64(buf[pos])
    if first < np.uint64(0x80):
        # Most varints in a batch (attributes, deltas, small lengths) are one byte.
        return np.int64(first >> np.uint64(1)) ^ -np.int64(first & np.uint64(1)), pos + 1
    value = np.uint64(0)
    shift = np.uint64(0)
    while True:
        if pos >= end:
            return 0, -1
        byte = np.uint64(buf[pos])
        pos += 1
        if byte & np.uint64(0x80):
            value |= (byte & np.uint64(0x7F)) << shift
            shift += np.uint64(7)
            if shift > np.uint64(63):
                return 0, -2
        else:
            value |= byte << shift
            break
    return np.int64(value >> np.uint64(1)) ^ -np.int64(value & np.uint64(1)), pos


@njit(cache=True, nogil=True)
def utf8_valid(buf: np.ndarray, pos: KernelInt, end: KernelInt) -> bool:
    """Whether buf[pos:end] is well-formed UTF-8 as Python's strict decoder has it
    (no overlong forms, no surrogates, nothing above U+10FFFF). Reads nothing past `end`."""
    while pos < end:
        c = buf[pos]
        if c < 0x80:
            pos += 1
            continue
        if c < 0xC2:
            return False
        if c < 0xE0:
            need, low, high = 1, 0x80, 0xBF
        elif c < 0xF0:
            need = 2
            low = 0xA0 if c == 0xE0 else 0x80
            high = 0x9F if c == 0xED else 0xBF
        elif c < 0xF5:
            need = 3
            low = 0x90 if c == 0xF0 else 0x80
            high = 0x8F if c == 0xF4 else 0xBF
        else:
            return False
        if end - pos <= need:
            return False
        second = buf[pos + 1]
        if second < low or second > high:
            return False
        for k in range(2, need + 1):
            cont = buf[pos + k]
            if cont < 0x80 or cont > 0xBF:
                return False
        pos += need + 1
    return True


@njit(cache=True, nogil=True, inline="always")
def _field(buf: np.ndarray, pos: KernelInt, end: KernelInt, strict: bool) -> tuple[KernelInt, KernelInt, int]:
    """(value, next position, status) of an int32 field's varint: WALK_OK, or why not."""
    value, after = read_varint(buf, pos, end)
    if after < 0:
        return 0, after, WALK_VARINT_TRUNCATED if after == -1 else WALK_VARINT_TOO_LONG
    if strict and (after - pos > VARINT32_BYTES_MAX or value < INT32_MIN or value > INT32_MAX):
        return 0, after, WALK_VARINT_TOO_LONG
    return value, after, WALK_OK


# The result of walk_record: see W_* above.
WalkResult = tuple[
    int,
    KernelInt,
    KernelInt,
    KernelInt,
    KernelInt,
    KernelInt,
    KernelInt,
    KernelInt,
    KernelInt,
    KernelInt,
    KernelInt,
    KernelInt,
]


@njit(cache=True, nogil=True, inline="always")
def _failed(status: int, detail: KernelInt, pos: KernelInt) -> WalkResult:
    """walk_record's result for a record it stopped in: only status and detail mean anything."""
    zero: KernelInt = 0
    return status, detail, pos, zero, zero, zero, zero, zero, zero, zero, zero, zero


@njit(cache=True, nogil=True, inline="always")
def walk_record(
    src: np.ndarray,
    pos: KernelInt,
    end: KernelInt,
    strict: bool,
    key_min: KernelInt,
    offset_delta_expected: KernelInt,
) -> WalkResult:
    """Read the record at src[pos:end] (end: the end of its records section).

    Returns (status, detail, next position, length, timestamp delta, offset delta, key
    length, key position, value length, value position, header count, headers position):
    the W_* slots. `status` is WALK_OK for a whole record, else the first thing wrong in field
    order, with `detail` the offending value where there is one; then only the status and
    detail mean anything. A null key or value has a negative length (-1 in strict mode).

    `strict` picks the leader's grammar over aiokafka's (module docstring). `key_min` is the
    smallest key length taken (WALK_NULL_KEY below it): KEY_LENGTH_MIN_NONE, or 0 to refuse
    null keys. `offset_delta_expected` is the record's index in its batch when the deltas
    must run 0, 1, 2, ... (WALK_OFFSET_DELTA otherwise), OFFSET_DELTA_UNCHECKED if not.

    A record takes at least RECORD_BYTES_MIN bytes and a header HEADER_BYTES_MIN, or the walk
    fails, so no loop runs longer than the bytes allow whatever the counts claim.
    """
    length, pos, status = _field(src, pos, end, strict)
    if status != WALK_OK:
        return _failed(status, 0, pos)
    record_start = pos
    limit = end
    if strict:
        # The record's length bounds every field that follows.
        if length < 0:
            return _failed(WALK_RECORD_LENGTH_FIELD, length, pos)
        if length > end - pos:
            return _failed(WALK_RECORD_BOUNDS, length, pos)
        limit = pos + length
        if pos < limit and src[pos] > RECORD_ATTRIBUTES_MAX:
            return _failed(WALK_ATTRIBUTES, np.int64(src[pos]), pos)
    _attributes, pos, status = _field(src, pos, limit, strict)
    if status != WALK_OK:
        return _failed(status, 0, pos)
    # The timestamp delta is an int64 field: up to 10 bytes in either grammar.
    ts_delta, pos = read_varint(src, pos, limit)
    if pos < 0:
        status = WALK_VARINT_TRUNCATED if pos == -1 else WALK_VARINT_TOO_LONG
        return _failed(status, 0, pos)
    offset_delta, pos, status = _field(src, pos, limit, strict)
    if status != WALK_OK:
        return _failed(status, 0, pos)
    if offset_delta_expected != OFFSET_DELTA_UNCHECKED and offset_delta != offset_delta_expected:
        return _failed(WALK_OFFSET_DELTA, offset_delta, pos)
    key_len, pos, status = _field(src, pos, limit, strict)
    if status != WALK_OK:
        return _failed(status, 0, pos)
    if strict and key_len < NULL_LENGTH:
        return _failed(WALK_KEY_LENGTH, key_len, pos)
    if key_len < key_min:
        return _failed(WALK_NULL_KEY, key_len, pos)
    key_pos = pos
    if key_len > 0:
        if key_len > limit - pos:
            return _failed(WALK_KEY_BOUNDS, key_len, pos)
        pos += key_len
    value_len, pos, status = _field(src, pos, limit, strict)
    if status != WALK_OK:
        return _failed(status, 0, pos)
    if strict and value_len < NULL_LENGTH:
        return _failed(WALK_VALUE_LENGTH, value_len, pos)
    value_pos = pos
    if value_len > 0:
        if value_len > limit - pos:
            return _failed(WALK_VALUE_BOUNDS, value_len, pos)
        pos += value_len
    header_count, pos, status = _field(src, pos, limit, strict)
    if status != WALK_OK:
        return _failed(status, 0, pos)
    if header_count < 0:
        return _failed(WALK_HEADER_COUNT, header_count, pos)
    headers_pos = pos
    for _ in range(header_count):
        hkey_len, pos, status = _field(src, pos, limit, strict)
        if status != WALK_OK:
            return _failed(status, 0, pos)
        if hkey_len < 0:
            return _failed(WALK_HEADER_KEY_LENGTH, hkey_len, pos)
        if hkey_len > limit - pos:
            return _failed(WALK_HEADER_KEY_BOUNDS, hkey_len, pos)
        if not utf8_valid(src, pos, pos + hkey_len):
            return _failed(WALK_HEADER_KEY_UTF8, 0, pos)
        pos += hkey_len
        hvalue_len, pos, status = _field(src, pos, limit, strict)
        if status != WALK_OK:
            return _failed(status, 0, pos)
        if strict and hvalue_len < NULL_LENGTH:
            return _failed(WALK_HEADER_VALUE_LENGTH, hvalue_len, pos)
        if hvalue_len > 0:
            if hvalue_len > limit - pos:
                return _failed(WALK_HEADER_VALUE_BOUNDS, hvalue_len, pos)
            pos += hvalue_len
    if pos - record_start != length:
        return _failed(WALK_RECORD_LENGTH, length, pos)
    return (
        WALK_OK,
        0,
        pos,
        length,
        ts_delta,
        offset_delta,
        key_len,
        key_pos,
        value_len,
        value_pos,
        header_count,
        headers_pos,
    )


@njit(cache=True, nogil=True, inline="always")
def read_header(
    src: np.ndarray, pos: KernelInt, end: KernelInt
) -> tuple[KernelInt, KernelInt, KernelInt, KernelInt, KernelInt]:
    """(key position, key length, value position, value length, next position) of the header
    at src[pos:end], one walk_record has checked: for copying headers out after the walk,
    with the reader the walk used and no check repeated. A null value has a negative length."""
    hkey_len, pos = read_varint(src, pos, end)
    hkey_pos = pos
    hvalue_len, pos = read_varint(src, pos + hkey_len, end)
    return hkey_pos, hkey_len, pos, hvalue_len, pos + max(hvalue_len, 0)
