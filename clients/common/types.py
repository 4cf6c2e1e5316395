"""How both sides name a partition.

`TopicPartitionKey` is the one key type of a partition everywhere (dicts of partition state
in the broker, controller, gateway, clients and the Spark connector): a plain
`(topic, partition)` tuple, the cheapest hashable pair, built on every hot path.
`TopicPartition` is the same pair with field names, what the client library hands its
callers; being a tuple of the same values it hashes and compares equal to the plain key,
so either indexes the same entry.
"""

from __future__ import annotations

from typing import NamedTuple, TypeAlias

TopicPartitionKey: TypeAlias = tuple[str, int]


class TopicPartition(NamedTuple):
    topic: str
    partition: int

    def __str__(self) -> str:
        return f"{self.topic}-{self.partition}"
