"""What a new user of the Python clients meets first (issue 38), without a cluster.

- A topic the gateway says does not exist is raised at once as UNKNOWN_TOPIC_OR_PARTITION,
  not waited out for max_block_ms; a topic that appears on the next answer is taken.
- A consumer that never reached any gateway raises GatewayUnavailable after
  connect_timeout_ms, as the Producer and Admin do, and no poll waits past its timeout.
- ConsumeRecords' stop_at_end cut (services/gateway/record_level.py).
"""

from __future__ import annotations

import asyncio
import socket
import time
from typing import Any

import pytest

from clients import Consumer, TopicPartition
from clients.common.errors import UnknownTopicOrPartition
from clients.config import UNKNOWN_TOPIC_CONFIRM_MS
from clients.errors import GatewayUnavailable
from clients.metadata import ClusterMetadata, MetadataFetcher
from protos.highwater.v1 import common_pb2, gateway_pb2
from services.gateway import record_level

MAX_BLOCK_MS = 30_000
CONNECT_TIMEOUT_MS = 1_000
POLL_TIMEOUT_MS = 300


class FakeMetadataConnection:
    """Answers Metadata as a gateway does: the topics it knows, UNKNOWN_TOPIC_OR_PARTITION else.
    `known_after` calls: from then on, `topic` exists (CreateTopics ran meanwhile)."""

    ever_answered = True

    def __init__(self, topic: str, known_after: int | None = None) -> None:
        self.topic = topic
        self.known_after = known_after
        self.calls = 0

    async def call(self, method: str, request: Any, **_: Any) -> common_pb2.MetadataResponse:
        assert method == "Metadata"
        self.calls += 1
        known = self.known_after is not None and self.calls > self.known_after
        return common_pb2.MetadataResponse(
            cluster_id="fake",
            topics=[
                common_pb2.TopicMetadata(
                    name=name,
                    partitions=[common_pb2.PartitionMetadata(partition=0, leader=1, replicas=[1], isr=[1])],
                )
                if known and name == self.topic
                else common_pb2.TopicMetadata(
                    name=name,
                    error_code=common_pb2.UNKNOWN_TOPIC_OR_PARTITION,
                    error_message=f"topic {name!r} does not exist",
                )
                for name in request.topics
            ],
        )

    def learn_gateways(self, addresses: list[str]) -> None:
        pass


def _fetcher(connection: FakeMetadataConnection) -> MetadataFetcher:
    return MetadataFetcher(connection, ClusterMetadata(metadata_max_age_ms=300_000))  # type: ignore[arg-type]


def test_a_topic_that_does_not_exist_is_raised_at_once_not_after_max_block_ms() -> None:
    connection = FakeMetadataConnection("nope-topic")
    started = time.monotonic()
    with pytest.raises(UnknownTopicOrPartition) as raised:
        asyncio.run(
            _fetcher(connection).topic(
                "nope-topic", wait_ms=MAX_BLOCK_MS, backoff_ms=100, wait_setting="max_block_ms"
            )
        )
    elapsed_ms = (time.monotonic() - started) * 1000
    assert elapsed_ms < UNKNOWN_TOPIC_CONFIRM_MS + 1_000, f"{elapsed_ms:.0f} ms"
    assert "'nope-topic' does not exist" in str(raised.value)
    assert "create it first" in str(raised.value)
    # Asked again after the first "unknown": a topic just created is not refused.
    assert connection.calls >= 2


def test_a_topic_created_meanwhile_is_found_on_the_next_answer() -> None:
    connection = FakeMetadataConnection("fresh", known_after=1)
    info = asyncio.run(_fetcher(connection).topic("fresh", wait_ms=MAX_BLOCK_MS, backoff_ms=20))
    assert info.partitions == (0,)


def _closed_port() -> int:
    """A 127.0.0.1 port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


@pytest.mark.parametrize("how", ["subscribe", "assign"])
def test_a_consumer_that_never_reached_a_gateway_raises_gateway_unavailable(how: str) -> None:
    consumer = Consumer(
        bootstrap=f"127.0.0.1:{_closed_port()}", group_id="g", connect_timeout_ms=CONNECT_TIMEOUT_MS
    )
    if how == "subscribe":
        consumer.subscribe(["t"])
    else:
        consumer.assign([TopicPartition("t", 0)])
    started = time.monotonic()
    empty_polls = 0
    try:
        with pytest.raises(GatewayUnavailable) as raised:
            # Bounded: 10 polls take 3 s, three times the connect bound.
            for _ in range(10):
                poll_started = time.monotonic()
                assert consumer.poll(timeout_ms=POLL_TIMEOUT_MS) == []
                assert time.monotonic() - poll_started < (POLL_TIMEOUT_MS + 200) / 1000
                empty_polls += 1
    finally:
        consumer.close()
    elapsed_ms = (time.monotonic() - started) * 1000
    assert CONNECT_TIMEOUT_MS <= elapsed_ms < CONNECT_TIMEOUT_MS + 2 * POLL_TIMEOUT_MS + 500, elapsed_ms
    assert empty_polls >= 2, "polls before the bound return [] within their own timeout"
    assert "connect_timeout_ms=1000" in str(raised.value)
    assert "bootstrap" in str(raised.value)


def _records(partition: int, offsets: range) -> list[gateway_pb2.ConsumedRecord]:
    return [gateway_pb2.ConsumedRecord(topic="t", partition=partition, offset=o) for o in offsets]


def test_stop_at_end_cuts_records_at_the_end_offset_and_drops_finished_partitions() -> None:
    assert [r.offset for r in record_level.records_before(_records(0, range(3, 9)), 6)] == [3, 4, 5]
    whole = _records(0, range(3))
    assert record_level.records_before(whole, 6) is whole
    # Partition 1 is at its end, 2 past it (a batch read whole), 3 had no end (reported).
    assert record_level.positions_before_end({0: 4, 1: 6, 2: 9, 3: 0}, {0: 6, 1: 6, 2: 7}) == {0: 4}
