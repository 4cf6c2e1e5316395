"""Helpers for the Spark connector tests: topics, loading records, reading topics back."""

from __future__ import annotations

import time
from typing import Any

from clients.admin import Admin
from clients.consumer import Consumer
from clients.producer import Producer
from clients.types import ConsumerRecord, TopicPartition

CONSUME_TIMEOUT_S = 30
# How often wait_until_written looks at the topic again.
WRITTEN_POLL_S = 0.2


def create_topic(bootstrap: str, name: str, partitions: int) -> None:
    with Admin(bootstrap) as admin:
        admin.create_topics(name, partitions, 3)


def produce(
    bootstrap: str, topic: str, records: list[tuple[int, bytes | None, bytes, list[tuple[str, bytes]]]]
) -> None:
    """(partition, key, value, headers) records, acks=all, idempotent."""
    with Producer(bootstrap, linger_ms=0) as producer:
        futures = [
            producer.send(topic, value, key, headers=headers or None, partition=partition)
            for partition, key, value, headers in records
        ]
        producer.flush()
        for future in futures:
            future.result()


def consume_all(
    bootstrap: str, topic: str, isolation_level: str = "read_uncommitted"
) -> list[ConsumerRecord]:
    """Every record of every partition below the high watermark (the last stable offset at
    read_committed, where aborted transactions' records are left out), through the client Consumer."""
    out: list[ConsumerRecord] = []
    with Consumer(
        bootstrap=bootstrap,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        isolation_level=isolation_level,
    ) as consumer:
        tps = [TopicPartition(topic, p) for p in consumer.partitions_for_topic(topic)]
        consumer.assign(tps)
        ends = consumer.end_offsets(tps)
        deadline = time.monotonic() + CONSUME_TIMEOUT_S
        while any(consumer.position(tp) < ends[tp] for tp in tps):
            if time.monotonic() > deadline:
                raise AssertionError(f"could not consume {topic} to its end within {CONSUME_TIMEOUT_S} s")
            out.extend(consumer.poll(timeout_ms=500, max_records=10_000))
    return out


def read_options(bootstrap: str, **options: Any) -> dict[str, str]:
    return {"bootstrap": bootstrap, **{k: str(v) for k, v in options.items()}}


def wait_until_written(bootstrap: str, topic: str, values: set[bytes], timeout_s: float) -> None:
    """Wait (bounded) until every one of `values` is in `topic`; AssertionError after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        if values <= {r.value for r in consume_all(bootstrap, topic)}:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"{len(values)} values did not reach {topic} within {timeout_s} s")
        time.sleep(WRITTEN_POLL_S)
