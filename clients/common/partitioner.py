"""Which partition a record goes to: Kafka's default partitioner, byte for byte.

- A record with a key goes to `to_positive(murmur2(key)) % num_partitions`, the
  formula of Kafka's `BuiltInPartitioner.partitionForKey`, so a key lands on the
  same partition as it would with a Java, librdkafka ("murmur2_random") or
  kafka-python producer, and records with one key stay in order.
- A record without a key goes to a "sticky" partition (KIP-480 / KIP-794): every
  keyless record of a topic goes to one partition until about `batch_size_bytes`
  have gone there, then the next partition with a leader takes over, round-robin.
  Full batches to one partition beat one record to each (per-RPC cost dominates,
  FACTS.md).

Pure module: no I/O, no clock; randomness only from the injected `random.Random`.
"""

from __future__ import annotations

import bisect
import random
import struct
from collections.abc import Sequence

_MASK_32 = 0xFFFFFFFF
_MURMUR2_SEED = 0x9747B28C
_MURMUR2_M = 0x5BD1E995
_MURMUR2_R = 24


def murmur2(data: bytes | bytearray | memoryview) -> int:
    """Kafka's `Utils.murmur2`: the 32-bit MurmurHash2 with Kafka's seed, as a signed Java int."""
    length = len(data)
    m = _MURMUR2_M
    h = (_MURMUR2_SEED ^ length) & _MASK_32
    whole_words = length >> 2
    # Java reads each 4-byte word little-endian; unpack them all in one C call.
    for k in struct.unpack_from(f"<{whole_words}I", data):
        k = (k * m) & _MASK_32
        k ^= k >> _MURMUR2_R
        k = (k * m) & _MASK_32
        h = ((h * m) & _MASK_32) ^ k
    tail = length & ~3
    extra = length & 3
    if extra == 3:
        h ^= data[tail + 2] << 16
    if extra >= 2:
        h ^= data[tail + 1] << 8
    if extra >= 1:
        h ^= data[tail]
        h = (h * m) & _MASK_32
    h ^= h >> 13
    h = (h * m) & _MASK_32
    h ^= h >> 15
    return h - (1 << 32) if h & 0x80000000 else h


def to_positive(number: int) -> int:
    """Kafka's `Utils.toPositive`: clear the sign bit (not abs(): abs(MIN_INT) overflows in Java)."""
    return number & 0x7FFFFFFF


def partition_for_key(key: bytes, num_partitions: int) -> int:
    """Kafka's default partition for a keyed record."""
    return to_positive(murmur2(key)) % num_partitions


class StickyPartitioner:
    """Chooses partitions for keyless records: sticky until batch_size_bytes, then the next one.

    Owned by one producer; its caller serialises calls (the producer's lock).
    """

    __slots__ = ("_batch_size_bytes", "_rng", "_sticky")

    def __init__(self, batch_size_bytes: int, rng: random.Random | None = None) -> None:
        self._batch_size_bytes = batch_size_bytes
        self._rng = rng or random.Random()
        # topic -> [sticky partition, bytes sent to it since it became sticky]
        self._sticky: dict[str, list[int]] = {}

    def partition(self, topic: str, num_partitions: int, available: Sequence[int], size_bytes: int) -> int:
        """The partition for a keyless record of `size_bytes` on `topic`.

        `available` are the partitions with a leader (sorted); when none has one,
        every partition is a candidate and the send waits for a leader downstream. A
        sticky partition that lost its leader (metadata changed) is left at once.
        """
        state = self._sticky.get(topic)
        if (
            state is None
            or state[1] >= self._batch_size_bytes
            or state[0] >= num_partitions
            or (available and not _holds(available, state[0]))
        ):
            state = self._switch(topic, num_partitions, available, None if state is None else state[0])
        state[1] += size_bytes
        return state[0]

    def _switch(
        self, topic: str, num_partitions: int, available: Sequence[int], previous: int | None
    ) -> list[int]:
        candidates: Sequence[int] = available or range(num_partitions)
        if previous is None:
            chosen = candidates[self._rng.randrange(len(candidates))]
        else:
            chosen = next((p for p in candidates if p > previous), candidates[0])
        state = [chosen, 0]
        self._sticky[topic] = state
        return state


def _holds(sorted_partitions: Sequence[int], partition: int) -> bool:
    """Whether `partition` is in the sorted sequence (bisect: a topic may have thousands)."""
    i = bisect.bisect_left(sorted_partitions, partition)
    return i < len(sorted_partitions) and sorted_partitions[i] == partition
