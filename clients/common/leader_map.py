"""Where each partition's leader takes Fetch and Produce, read from a Metadata answer.

Kafka's clients send to each partition's leader; ours do too (clients/leaders.py for the
asyncio library, spark_connector/gateway.py for the Spark connector's tasks). Both read the
leaders' addresses out of Metadata here, so which broker entry counts as an address is
decided once: a broker registered without a host or port (none to reach it at) is no leader
address, and the partition goes through a gateway instead.

Pure: no I/O.
"""

from __future__ import annotations

from clients.common.types import TopicPartitionKey
from protos.highwater.v1 import common_pb2


def broker_addresses(response: common_pb2.MetadataResponse) -> dict[int, str]:
    """broker id -> "host:port" of every broker the answer lists with somewhere to reach it."""
    return {b.broker_id: f"{b.host}:{b.port}" for b in response.brokers if b.host and b.port > 0}


def partition_leaders(response: common_pb2.MetadataResponse) -> dict[TopicPartitionKey, str]:
    """(topic, partition) -> its leader's "host:port", for every partition the answer gives a
    reachable leader (no error, a leader among the listed brokers)."""
    brokers = broker_addresses(response)
    return {
        (t.name, p.partition): brokers[p.leader]
        for t in response.topics
        for p in t.partitions
        if p.error_code == common_pb2.NONE and p.leader in brokers
    }


class LeaderMap:
    """Partition -> leader address as the last answers named them, until told otherwise."""

    def __init__(self) -> None:
        self._leaders: dict[TopicPartitionKey, str] = {}

    def remember(self, response: common_pb2.MetadataResponse) -> None:
        """Take the leaders a Metadata answer names (partitions it does not name are kept)."""
        self._leaders.update(partition_leaders(response))

    def get(self, tp: TopicPartitionKey) -> str | None:
        return self._leaders.get(tp)

    def hint(self, tp: TopicPartitionKey, address: str) -> None:
        """Send `tp`'s calls to `address` until it answers otherwise (a leader planned with)."""
        self._leaders[tp] = address

    def forget(self, tp: TopicPartitionKey) -> None:
        """`tp`'s leader answered that it no longer leads, or could not be reached: look again."""
        self._leaders.pop(tp, None)

    def known(self) -> dict[TopicPartitionKey, str]:
        return dict(self._leaders)

    def clear(self) -> None:
        self._leaders.clear()
