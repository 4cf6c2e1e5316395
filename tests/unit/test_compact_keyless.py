"""A compacted topic refuses records without a key at produce time (issue 39; Kafka's LogValidator).

The cleaner keeps the latest record per key, so a record without a key could never be
cleaned away; Kafka refuses it with INVALID_RECORD ("Compacted topic cannot accept message
without key in topic partition ..."), naming the record (its record_errors), and writes
nothing of the request. The check lives in the leader's record kernel
(clients/common/record_validation.py), which walks every record, compressed ones too.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from clients.common.errors import InvalidRecord
from clients.common.record_batch import validate_batches
from clients.common.record_validation import TimestampRules, validate_records
from clients.common.records import COMPRESSION_CODES, Record, decode_batches, encode_batch, encode_values
from services.broker.log import Log, LogConfig, MemoryStorage
from services.broker.partition import LeaderAndIsrState, Partition
from tests.unit.boundscheck import run_with_numba_boundscheck

NOW_MS = 1_700_000_000_000
CODECS = sorted(COMPRESSION_CODES)
RULES = TimestampRules(log_append_time=False, before_max_ms=2**63 - 1, after_max_ms=2**63 - 1)


def keyed(
    n: int, *, keyless_at: int | None = None, compression: str = "none", headers: bool = False
) -> bytes:
    """A batch of `n` keyed records, the one at `keyless_at` without a key."""
    return encode_batch(
        [
            Record(
                None if i == keyless_at else f"k{i}".encode(),
                f"v{i}".encode(),
                [("h", b"x")] if headers else [],
                NOW_MS,
            )
            for i in range(n)
        ],
        compression=compression,
    )


def check(data: bytes, *, compacted: bool) -> None:
    headers = validate_batches(data, max_batch_bytes=None)
    validate_records(
        data, headers, rules=RULES, now_ms=NOW_MS, compacted_partition="t-0" if compacted else None
    )


def leader(cleanup_policy: str) -> Partition:
    log = Log.open("/p/t-0", LogConfig(cleanup_policy=cleanup_policy), storage=MemoryStorage(), now_ms=0)
    p = Partition("t", 0, 1, log)
    p.become_leader(LeaderAndIsrState(1, 0, (1,), (1,), 1, 1), now_ms=0)
    return p


# --- the kernel ---------------------------------------------------------------------------------


@pytest.mark.parametrize("codec", CODECS)
@pytest.mark.parametrize("headers", [False, True], ids=["fast-path", "with-headers"])
def test_a_keyless_record_is_refused_on_a_compacted_topic_naming_its_index(codec: str, headers: bool) -> None:
    # headers=True takes the kernel's field-by-field walk, False its fast path: both must check.
    data = keyed(3, compression=codec, headers=headers) + keyed(
        5, keyless_at=3, compression=codec, headers=headers
    )
    with pytest.raises(InvalidRecord) as raised:
        check(data, compacted=True)
    message = raised.value.message
    assert message.startswith("Compacted topic cannot accept message without key in topic partition t-0")
    assert "batch 2 of 2" in message and "record 3 has a null key" in message
    assert "nothing of this request was written" in message


@pytest.mark.parametrize("codec", CODECS)
def test_keyless_records_pass_on_a_topic_that_is_not_compacted(codec: str) -> None:
    check(encode_values([b"a", b"b"], timestamp_ms=NOW_MS, compression=codec), compacted=False)
    check(keyed(4, keyless_at=0, compression=codec, headers=True), compacted=False)


@pytest.mark.parametrize("codec", CODECS)
def test_keyed_records_and_an_empty_key_pass_on_a_compacted_topic(codec: str) -> None:
    # An empty key is a key (Kafka checks hasKey, i.e. not null).
    check(keyed(4, compression=codec), compacted=True)
    check(encode_batch([Record(b"", b"v", [], NOW_MS)], compression=codec), compacted=True)


def test_a_tombstone_with_a_key_passes_and_one_without_is_refused() -> None:
    check(encode_batch([Record(b"k", None, [], NOW_MS)]), compacted=True)
    with pytest.raises(InvalidRecord, match="record 0 has a null key"):
        check(encode_batch([Record(None, None, [], NOW_MS)]), compacted=True)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    keys=st.lists(st.none() | st.binary(max_size=12), min_size=1, max_size=20),
    codec=st.sampled_from(CODECS),
    with_headers=st.booleans(),
)
def test_the_first_keyless_record_is_the_one_named(
    keys: list[bytes | None], codec: str, with_headers: bool
) -> None:
    hdrs: list[tuple[str, bytes]] = [("h", b"1")] if with_headers else []
    data = encode_batch([Record(k, b"v", hdrs, NOW_MS) for k in keys], compression=codec)
    first_keyless = next((i for i, k in enumerate(keys) if k is None), None)
    if first_keyless is None:
        check(data, compacted=True)
    else:
        with pytest.raises(InvalidRecord, match=f"record {first_keyless} has a null key"):
            check(data, compacted=True)
    check(data, compacted=False)


# --- the leader -----------------------------------------------------------------------------------


@pytest.mark.parametrize("policy", ["compact", "compact,delete"])
def test_the_leader_of_a_compacted_topic_writes_nothing_of_a_request_with_a_keyless_record(
    policy: str,
) -> None:
    p = leader(policy)
    p.append_as_leader(keyed(2), acks=1, now_ms=NOW_MS)
    leo = p.log.log_end_offset
    with pytest.raises(InvalidRecord, match="without key in topic partition t-0"):
        p.append_as_leader(keyed(3) + keyed(2, keyless_at=1, compression="lz4"), acks=1, now_ms=NOW_MS)
    assert p.log.log_end_offset == leo == 2
    p.append_as_leader(keyed(3, compression="zstd"), acks=1, now_ms=NOW_MS)
    assert p.log.log_end_offset == 5


def test_the_leader_of_a_delete_topic_takes_keyless_records() -> None:
    p = leader("delete")
    p.append_as_leader(encode_values([b"a", b"b"], timestamp_ms=NOW_MS), acks=1, now_ms=NOW_MS)
    assert [r.value for r in decode_batches(bytes(p.log.read(0, max_bytes=1 << 20).records))] == [b"a", b"b"]


# --- the kernel never reads out of bounds on the compacted path ----------------------------------

BOUNDSCHECK_SCRIPT = r"""
import random, struct
from crc32c import crc32c
from clients.common.records import Record, encode_batch
from clients.common.errors import HighwaterError
from clients.common.record_batch import validate_batches
from clients.common.record_validation import TimestampRules, validate_records
rng = random.Random(39)
rules = TimestampRules(False, 2**63 - 1, 2**63 - 1)
ok = refused = 0
for i in range(3000):
    recs = [Record(rng.choice([None, rng.randbytes(rng.randrange(8))]),
                   rng.choice([None, rng.randbytes(rng.randrange(300))]),
                   [("k%d" % j, b"v") for j in range(rng.randrange(3))], rng.randrange(10**12))
            for _ in range(rng.randrange(1, 8))]
    data = bytearray(encode_batch(recs, compression=rng.choice(["none", "zstd"])))
    for _ in range(rng.randrange(0, 4)):
        data[rng.randrange(61, len(data))] = rng.randrange(256)
    struct.pack_into(">I", data, 17, crc32c(memoryview(data)[21:]))
    try:
        validate_records(data, validate_batches(data, max_batch_bytes=None), rules=rules, now_ms=0,
                         compacted_partition="t-0")
        ok += 1
    except HighwaterError:
        refused += 1
print(ok, refused)
"""


@pytest.mark.slow
def test_the_keyless_check_stays_in_bounds_under_numba_boundscheck(tmp_path: Path) -> None:
    """The compacted path (null keys leave the fast path for the field-by-field walk) under
    NUMBA_BOUNDSCHECK=1, compiled afresh in its own cache dir."""
    ok, refused = run_with_numba_boundscheck(BOUNDSCHECK_SCRIPT, tmp_path)
    assert ok > 0 and refused > 0
