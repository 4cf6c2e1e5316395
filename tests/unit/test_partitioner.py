"""Kafka's default partitioner, checked against vectors from Kafka's and kafka-python's own tests.

- murmur2 values: apache/kafka clients/.../common/utils/UtilsTest.java, testMurmur2.
- partitions out of 1000: kafka-python test/test_partitioner.py, "compare with output from
  Kafka's org.apache.kafka.clients.producer.Partitioner".
"""

from __future__ import annotations

import itertools
import random

import pytest

from clients.common.partitioner import StickyPartitioner, murmur2, partition_for_key, to_positive

KAFKA_MURMUR2_VECTORS = [
    (b"21", -973932308),
    (b"foobar", -790332482),
    (b"a-little-bit-long-string", -985981536),
    (b"a-little-bit-longer-string", -1486304829),
    (b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8", -58897971),
    (bytes([ord("a"), ord("b"), ord("c")]), 479470107),
]

KAFKA_PARTITION_OF_1000 = [
    (b"", 681),
    (b"a", 524),
    (b"ab", 434),
    (b"abc", 107),
    (b"123456789", 566),
    (b"\x00 ", 742),
]


@pytest.mark.parametrize(("key", "expected"), KAFKA_MURMUR2_VECTORS)
def test_murmur2_matches_kafka_utils_test(key: bytes, expected: int) -> None:
    assert murmur2(key) == expected


@pytest.mark.parametrize(("key", "expected"), KAFKA_PARTITION_OF_1000)
def test_partition_for_key_matches_java_client(key: bytes, expected: int) -> None:
    assert partition_for_key(key, 1000) == expected


def test_murmur2_accepts_every_byte_value_and_buffer_type() -> None:
    # kafka-python once broke on bytes that do not decode as ASCII.
    murmur2(b"\xa4")
    murmur2(b"\x81" * 1000)
    assert murmur2(bytearray(b"foobar")) == murmur2(memoryview(b"foobar")) == -790332482


def test_to_positive_clears_the_sign_bit_like_java() -> None:
    assert to_positive(-1) == 0x7FFFFFFF
    assert to_positive(-(2**31)) == 0  # abs() would overflow in Java; masking does not
    assert to_positive(5) == 5


def test_same_key_same_partition() -> None:
    assert {partition_for_key(b"customer-7", 12) for _ in range(10)} == {partition_for_key(b"customer-7", 12)}


def test_keyless_records_stick_to_one_partition_until_a_batch_is_full() -> None:
    sticky = StickyPartitioner(batch_size_bytes=1000, rng=random.Random(1))
    available = [0, 1, 2]
    first = [sticky.partition("t", 3, available, 100) for _ in range(10)]
    assert len(set(first)) == 1, "1000 bytes go to one partition"
    following = [sticky.partition("t", 3, available, 100) for _ in range(10)]
    assert len(set(following)) == 1
    assert following[0] == (first[0] + 1) % 3, "then the next partition takes over, round-robin"


def test_keyless_records_round_robin_over_partitions_with_a_leader() -> None:
    sticky = StickyPartitioner(batch_size_bytes=1, rng=random.Random(7))
    chosen = [sticky.partition("t", 4, [1, 3], 10) for _ in range(6)]
    assert set(chosen) == {1, 3}
    assert all(a != b for a, b in itertools.pairwise(chosen)), "each full batch moves on"


def test_keyless_records_use_every_partition_when_none_has_a_leader() -> None:
    sticky = StickyPartitioner(batch_size_bytes=1, rng=random.Random(3))
    chosen = {sticky.partition("t", 3, [], 10) for _ in range(6)}
    assert chosen == {0, 1, 2}


def test_sticky_choice_is_per_topic() -> None:
    sticky = StickyPartitioner(batch_size_bytes=10_000, rng=random.Random(5))
    a = sticky.partition("a", 100, list(range(100)), 10)
    b_choices = {sticky.partition("b", 100, list(range(100)), 10) for _ in range(5)}
    assert len(b_choices) == 1
    assert sticky.partition("a", 100, list(range(100)), 10) == a


def test_a_sticky_partition_that_lost_its_leader_is_left_at_once() -> None:
    sticky = StickyPartitioner(batch_size_bytes=1_000_000, rng=random.Random(3))
    first = sticky.partition("t", 4, [0, 1, 2, 3], 10)
    assert sticky.partition("t", 4, [0, 1, 2, 3], 10) == first
    still_led = [p for p in range(4) if p != first]
    moved = sticky.partition("t", 4, still_led, 10)
    assert moved in still_led, (
        "records must not keep going to a partition with no leader until the batch fills"
    )
    assert sticky.partition("t", 4, still_led, 10) == moved, "and the new choice sticks"
