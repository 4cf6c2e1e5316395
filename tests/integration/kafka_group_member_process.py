"""One confluent-kafka consumer-group member as its own process, for test_kafka_protocol.py.

    python -m tests.integration.kafka_group_member_process BOOTSTRAP TOPIC GROUP HISTORY SESSION_MS

Reads TOPIC as a member of GROUP through Kafka's classic group protocol (librdkafka, subscribe)
and writes what it does to HISTORY, one JSON line per event, flushed at once: partitions
assigned and revoked, every record processed, every commit (after the broker accepted it) and
every refused commit, and `idle` when a poll finds nothing after records were processed.
Offsets are committed by hand every COMMIT_EVERY_RECORDS records and on revocation, so a
member killed between commits leaves an uncommitted window that the group's next owner of
those partitions must read again, and nothing before it. SIGTERM closes the consumer cleanly
(commit, LeaveGroup); SIGKILL is what the test uses to kill a member.
"""

from __future__ import annotations

import json
import signal
import sys
import time
from typing import Any, TextIO

import confluent_kafka

POLL_S = 0.2
# Not a divisor of what one member reads in the test, so a killed member leaves records it
# processed but did not commit.
COMMIT_EVERY_RECORDS = 25
# librdkafka's rebalance timeout is max.poll.interval.ms; a bound well under Kafka's 5 minutes
# keeps a rebalance that waits for a dead member short.
MAX_POLL_INTERVAL_MS = 20_000
HEARTBEAT_INTERVAL_MS = 500


def write(history: TextIO, **event: Any) -> None:
    history.write(json.dumps({"t": int(time.time() * 1000), **event}) + "\n")


def main() -> None:
    bootstrap, topic, group, history_path, session_ms = sys.argv[1:6]
    stopping = False

    def stop(*_: Any) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, stop)
    consumer = confluent_kafka.Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "session.timeout.ms": int(session_ms),
            "heartbeat.interval.ms": HEARTBEAT_INTERVAL_MS,
            "max.poll.interval.ms": MAX_POLL_INTERVAL_MS,
        }
    )
    # Next offset to read per assigned partition, from the records processed: what a commit stores.
    processed: dict[int, int] = {}
    with open(history_path, "a", buffering=1) as history:

        def commit(partitions: list[int]) -> None:
            wanted = {p: processed[p] for p in partitions if p in processed}
            if not wanted:
                return
            offsets = [confluent_kafka.TopicPartition(topic, p, o) for p, o in sorted(wanted.items())]
            try:
                answered = consumer.commit(offsets=offsets, asynchronous=False) or []
            except confluent_kafka.KafkaException as error:
                write(history, ev="commit_refused", error=str(error), offsets=sorted(wanted.items()))
                return
            failed = [tp for tp in answered if tp.error is not None]
            if failed:
                write(
                    history, ev="commit_refused", error=str(failed[0].error), offsets=sorted(wanted.items())
                )
                return
            write(history, ev="commit", offsets=sorted(wanted.items()))

        def on_assign(_: Any, partitions: list[Any]) -> None:
            write(history, ev="assigned", partitions=sorted(p.partition for p in partitions))

        def on_revoke(_: Any, partitions: list[Any]) -> None:
            commit([p.partition for p in partitions])
            for p in partitions:
                processed.pop(p.partition, None)
            write(history, ev="revoked", partitions=sorted(p.partition for p in partitions))

        consumer.subscribe([topic], on_assign=on_assign, on_revoke=on_revoke)
        uncommitted_records = 0
        busy = False
        try:
            while not stopping:
                m = consumer.poll(POLL_S)
                if m is None:
                    if busy:
                        write(history, ev="idle")
                        busy = False
                    continue
                if m.error():
                    write(history, ev="error", error=str(m.error()))
                    continue
                busy = True
                write(
                    history, ev="record", partition=m.partition(), offset=m.offset(), value=m.value().decode()
                )
                processed[m.partition()] = m.offset() + 1
                uncommitted_records += 1
                if uncommitted_records >= COMMIT_EVERY_RECORDS:
                    commit(list(processed))
                    uncommitted_records = 0
        finally:
            commit(list(processed))
            consumer.close()
            write(history, ev="closed")


if __name__ == "__main__":
    main()
