"""Highwater through Kafka's wire protocol, driven by confluent-kafka (librdkafka), for compare.py.

The same three workloads as our own clients run, against the brokers' Kafka listeners
(docs/KAFKA.md) instead of the gateway:

- produce: a confluent-kafka Producer with librdkafka's defaults (linger.ms 5, batch.size
  1 MB, 1,000,000 queued messages) plus acks=all and idempotence, as Kafka 3's Java producer
  defaults to; as fast as it goes; latency is per record (produce() -> its delivery report);
- consume: a Consumer assigned every partition from offset 0, reading until it has `count`
  records (a catch-up read, no group: records are not decoded beyond what librdkafka does);
- e2e: a Producer with linger.ms 0 (as our e2e path sends at once) at a fixed rate, the send
  time in each payload, and a Consumer in another process (this file with `e2e-consumer`)
  assigned every partition at its end; the latency is receive time - send time.
"""

from __future__ import annotations

import argparse
import struct
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import common

# librdkafka's own defaults otherwise: what a Kafka user runs.
PRODUCER_SETTINGS = {"acks": "all", "enable.idempotence": True}
# A record not acknowledged in this long is failed by librdkafka (its default is 5 minutes).
MESSAGE_TIMEOUT_MS = 60_000
# How long the end of a produce run may take to drain librdkafka's queue.
FLUSH_S_MAX = 60.0
# A full local queue: wait this long for delivery reports before producing again.
QUEUE_FULL_POLL_S = 0.01
CONSUME_TIMEOUT_S = 120.0
# The e2e consumer's first Fetch of every partition must come back in this long.
READY_TIMEOUT_S = 30.0
# The catch-up consumer's settings beside librdkafka's defaults. librdkafka stops fetching a
# partition once its local queue holds queued.min.messages (100,000) and then waits
# fetch.queue.backoff.ms (1,000 ms) before it looks again: a Python application draining
# ~1 M records/s empties the queue in ~0.1 s and then idles the rest of the second, against
# any broker. librdkafka's own documentation says to lower it when the application sees ~1 s
# pauses between messages.
CATCHUP_SETTINGS = {"fetch.queue.backoff.ms": 10}
# The consume runs compare.py offers: the name reported and the settings over the defaults.
CONSUME_SETTINGS = {"tuned": CATCHUP_SETTINGS, "defaults": {}}
_SENT_NS = struct.Struct(">q")


def _producer(bootstrap: str, **settings: Any) -> Any:
    import confluent_kafka

    return confluent_kafka.Producer(
        {
            "bootstrap.servers": bootstrap,
            "message.timeout.ms": MESSAGE_TIMEOUT_MS,
            **PRODUCER_SETTINGS,
            **settings,
        }
    )


def produce(
    bootstrap: str, topic: str, *, record_size: int, duration_s: float, warmup_s: float, window: common.Window
) -> dict[str, object]:
    """As many records as librdkafka takes for duration_s (after warmup_s), then flush."""
    producer = _producer(bootstrap)
    payload = b"x" * record_size
    counts = {"sent": 0, "acked": 0, "failed": 0}
    errors: dict[str, int] = {}
    latencies: list[float] = []
    recording = False

    def on_delivery(err: Any, _msg: Any, sent_at: float) -> None:
        if err is not None:
            counts["failed"] += 1
            errors[err.name()] = errors.get(err.name(), 0) + 1
            return
        counts["acked"] += 1
        if recording:
            latencies.append(time.perf_counter() - sent_at)

    def run(seconds: float) -> float:
        clock = common.SendClock(seconds)
        for _ in clock:
            sent_at = time.perf_counter()
            try:
                producer.produce(
                    topic, payload, on_delivery=lambda err, msg, t=sent_at: on_delivery(err, msg, t)
                )
            except BufferError:  # the local queue is full: let deliveries drain it
                producer.poll(QUEUE_FULL_POLL_S)
                continue
            counts["sent"] += 1
            producer.poll(0)
        left = producer.flush(FLUSH_S_MAX)
        counts["failed"] += left
        if left:
            errors["not delivered in time"] = left
        return time.perf_counter() - clock.start

    if warmup_s > 0:
        run(warmup_s)
    counts.update(sent=0, acked=0, failed=0)
    errors.clear()
    recording = True
    window.open()
    elapsed = run(duration_s)
    window.close()
    return common.produce_summary(
        "confluent-kafka Producer acks=all idempotent",
        counts,
        errors,
        elapsed,
        record_size,
        latencies,
        per_request=1,
    )


def _assign_all(consumer: Any, topic: str, offset: int) -> None:
    import confluent_kafka

    metadata = consumer.list_topics(topic, timeout=30)
    partitions = sorted(metadata.topics[topic].partitions)
    consumer.assign([confluent_kafka.TopicPartition(topic, p, offset) for p in partitions])


def consume(
    bootstrap: str,
    topic: str,
    *,
    count: int,
    record_size: int,
    window: common.Window,
    settings: dict[str, Any] | None = None,
) -> dict[str, object]:
    """Read `count` records from the start of every partition; `settings` over librdkafka's
    defaults (None: CATCHUP_SETTINGS)."""
    import confluent_kafka

    consumer = confluent_kafka.Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "bench-kafka-consume",
            "enable.auto.commit": False,
            **(CATCHUP_SETTINGS if settings is None else settings),
        }
    )
    received = 0
    try:
        window.open()
        start = time.perf_counter()
        _assign_all(consumer, topic, confluent_kafka.OFFSET_BEGINNING)
        deadline = start + CONSUME_TIMEOUT_S
        while received < count and time.perf_counter() < deadline:
            # consume() hands back up to num_messages at once, as librdkafka's batch API does.
            received += sum(1 for m in consumer.consume(num_messages=10_000, timeout=1.0) if not m.error())
        elapsed = time.perf_counter() - start
        window.close()
    finally:
        consumer.close()
    return common.read_summary("confluent-kafka Consumer assign()", received, count, elapsed, record_size)


def e2e_producer(bootstrap: str, linger_ms: int = 0) -> Any:
    """The e2e producer: one for the warm-up and the measured run, so the measured records do
    not wait for its connections and producer id. librdkafka with linger.ms 0 polls its sockets
    without a timeout: its broker thread spins a whole core at any rate, which on a 2-core
    machine takes a core from the brokers (compare.py reports linger.ms 0 and 5)."""
    return _producer(bootstrap, **{"linger.ms": linger_ms})


def e2e_produce(
    producer: Any, topic: str, *, rate: float, duration_s: float, record_size: int
) -> dict[str, object]:
    """Produce at `rate` records/s for duration_s, the send time in each payload."""
    pad = b"x" * max(record_size - _SENT_NS.size, 0)
    sent = 0
    clock = common.SendClock(duration_s)
    for now in clock:
        due = clock.start + sent / rate
        if due > now:
            # A sleep, not poll(timeout): librdkafka rounds a wait under 1 ms to 0 and would spin.
            time.sleep(min(due - now, 0.05))
            producer.poll(0)  # delivery reports
            continue
        producer.produce(topic, _SENT_NS.pack(time.time_ns()) + pad)
        sent += 1
    left = producer.flush(FLUSH_S_MAX)
    return {"sent": sent, "not_delivered": left}


def e2e_consume(bootstrap: str, topic: str, *, expected: int, timeout_s: float) -> dict[str, object]:
    """Every partition from its end; prints 'ready' once fetching there, then times records."""
    import confluent_kafka

    consumer = confluent_kafka.Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "bench-kafka-e2e",
            "enable.auto.commit": False,
            # The end-of-partition event says the first Fetch has come back: ready means fetching.
            "enable.partition.eof": True,
        }
    )
    latencies: list[float] = []
    try:
        # Each partition's end as a number, not OFFSET_END: librdkafka resolves a logical
        # offset later, and records produced before it did would be skipped.
        metadata = consumer.list_topics(topic, timeout=30)
        ends = []
        for p in sorted(metadata.topics[topic].partitions):
            _, high = consumer.get_watermark_offsets(confluent_kafka.TopicPartition(topic, p), timeout=30)
            ends.append(confluent_kafka.TopicPartition(topic, p, high))
        consumer.assign(ends)
        _wait_fetching(consumer, {tp.partition for tp in ends})
        print("ready", flush=True)
        deadline = time.monotonic() + timeout_s
        idle_since = time.monotonic()
        # Done at `expected`, or once records stopped coming (a producer that fell behind sends fewer).
        while len(latencies) < expected and time.monotonic() < deadline:
            m = consumer.poll(0.1)
            if m is None or m.error():  # an end-of-partition event is an "error" too
                if latencies and time.monotonic() - idle_since > common.E2E_IDLE_END_S:
                    break
                continue
            latencies.append((time.time_ns() - _SENT_NS.unpack_from(m.value())[0]) / 1e9)
            idle_since = time.monotonic()
    finally:
        consumer.close()
    return {"received": len(latencies), "latency": common.percentiles_ms(latencies)}


def _wait_fetching(consumer: Any, partitions: set[int]) -> None:
    """Until every partition's first Fetch came back (its end-of-partition event).

    librdkafka connects to each leader and starts fetching after assign() returns: records sent
    meanwhile waited for the consumer's start-up, not for the path measured (seen: the first
    records of a run at 70-140 ms, enough to make the whole run's p99)."""
    import confluent_kafka

    deadline = time.monotonic() + READY_TIMEOUT_S
    waiting = set(partitions)
    while waiting:
        if time.monotonic() > deadline:
            raise TimeoutError(f"partitions {sorted(waiting)} not fetching after {READY_TIMEOUT_S:g} s")
        m = consumer.poll(0.1)
        if m is not None and m.error() and m.error().code() == confluent_kafka.KafkaError._PARTITION_EOF:
            waiting.discard(m.partition())


def main() -> int:
    def add_address(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--bootstrap", required=True)
        parser.add_argument("--topic", required=True)

    return common.e2e_consumer_main(
        __doc__,
        add_address,
        lambda args: e2e_consume(
            args.bootstrap, args.topic, expected=args.expected, timeout_s=args.timeout_s
        ),
    )


if __name__ == "__main__":
    raise SystemExit(main())
