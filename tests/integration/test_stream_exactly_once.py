"""quixstreams with processing_guarantee="exactly-once" on Highwater's Kafka listeners (issue 41),
SIGKILLed midway and restarted.

The application (stream_framework_apps.py `quix-eos`) keeps a running sum per key with no guard
against replays: every event it is given is added. Its consumer, state changelog and producer run
in Kafka transactions, so after a crash what it had processed but not committed is aborted and
processed again. Checked with a read_committed consumer of the output: exactly one output per
input event (none missing, none twice), and every output's sum is the sum of its key's amounts up
to that event, in input order per key (a state restored wrong, or an event counted twice, breaks
it for the rest of that key). Also checked: the kill left records of an unfinished transaction in
the output's log, which read_committed never returned (the first run holds, inside its open
transaction, once the output of an event of B is sent: HOLD_AT_EVENT_ENV, so this is certain).
"""

from __future__ import annotations

import shutil
import time
from collections import Counter
from pathlib import Path
from typing import Any

import confluent_kafka
import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from tests.integration.stream_framework_apps import HOLD_AT_EVENT_ENV
from tests.integration.test_stream_frameworks import (
    CALL_TIMEOUT_S,
    PROCESS_TIMEOUT_S,
    App,
    Output,
    event,
    prefix_sums,
    produce,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]

PARTITIONS = 3
PHASE = 300  # events A (committed before the kill), B (in flight at the kill), C (after it)


def records_in_log(bootstrap: str, topic: str) -> int:
    """Every data record of `topic` a read_uncommitted reader gets, aborted ones included."""
    consumer = confluent_kafka.Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"{topic}-uncommitted-reader",
            "isolation.level": "read_uncommitted",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
        }
    )
    try:
        consumer.assign([confluent_kafka.TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
        records = 0
        at_end: set[int] = set()
        deadline = time.monotonic() + CALL_TIMEOUT_S
        while len(at_end) < PARTITIONS and time.monotonic() < deadline:
            for msg in consumer.consume(num_messages=1000, timeout=0.5):
                if msg.error() is None:
                    records += 1
                elif msg.error().code() == confluent_kafka.KafkaError._PARTITION_EOF:
                    at_end.add(msg.partition())
        return records
    finally:
        consumer.close()


def uncommitted_reader(bootstrap: str, topic: str) -> Output:
    """An Output reading at read_uncommitted: records of open transactions too."""
    reader = Output(bootstrap, topic, PARTITIONS)
    reader.consumer.close()
    reader.consumer = confluent_kafka.Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"{topic}-in-flight-reader",
            "isolation.level": "read_uncommitted",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
        }
    )
    reader.consumer.assign([confluent_kafka.TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
    return reader


def test_quixstreams_exactly_once_survives_sigkill_with_exact_output(
    cluster: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bootstrap = cluster.kafka_bootstrap()
    input_topic, output_topic, group = "eos-quix-in", "eos-quix-out", "eos-quix-app"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for f in admin.create_topics(
        [NewTopic(input_topic, PARTITIONS, 3), NewTopic(output_topic, PARTITIONS, 3)],
        operation_timeout=CALL_TIMEOUT_S,
    ).values():
        f.result(timeout=CALL_TIMEOUT_S)
    seq_of: dict[str, int] = {}
    events = [event(i, seq_of) for i in range(3 * PHASE)]
    hold_at = PHASE + PHASE // 2  # an event of B
    state_dir = tmp_path / "state"
    app = App(
        "quix-eos", [bootstrap, input_topic, output_topic, group, str(state_dir)], tmp_path / "quix.log"
    )
    output = Output(bootstrap, output_topic, PARTITIONS)  # librdkafka reads committed by default
    in_flight = uncommitted_reader(bootstrap, output_topic)
    try:
        # A: processed and committed.
        produce(bootstrap, input_topic, events[:PHASE])
        monkeypatch.setenv(HOLD_AT_EVENT_ENV, str(hold_at))
        app.start()
        output.wait(app, output.processed_at_least(PHASE), "A's committed output")
        # B: the application holds once the output of event hold_at is in the log, inside the
        # transaction quixstreams would commit at its next checkpoint (every 5 s by default),
        # and is killed there: that transaction is cut short.
        produce(bootstrap, input_topic, events[PHASE : 2 * PHASE])
        in_flight.wait(
            app, lambda: any(v["i"] == hold_at for _, _, v in in_flight.records), f"event {hold_at}'s output"
        )
        app.kill()
        shutil.rmtree(state_dir, ignore_errors=True)  # restored from the changelog, not from disk
        # C, then the restarted application (not held) finishes B and C.
        produce(bootstrap, input_topic, events[2 * PHASE :])
        monkeypatch.delenv(HOLD_AT_EVENT_ENV)
        app.start()
        output.wait(
            app,
            output.processed_at_least(len(events)),
            "every event's output after the restart",
            timeout_s=PROCESS_TIMEOUT_S + 60,  # the killed member's session (45 s) expires first
        )
        # A further quiet second: a duplicate committed late would show here.
        until = time.monotonic() + 1.0
        while time.monotonic() < until:
            output.poll(0.2)
    finally:
        app.stop()
        output.close()
        in_flight.close()

    per_event = Counter(v["i"] for _, _, v in output.records)
    assert [i for i, n in per_event.items() if n > 1] == [], "an event's output committed twice"
    assert set(per_event) == set(range(len(events)))
    sums = prefix_sums(events)
    wrong = [v for _, _, v in output.records if v["sum"] != sums[v["key"]][v["seq"]]]
    assert wrong == [], f"{len(wrong)} outputs with a wrong running sum, first {wrong[:3]}"
    # What the kill cut short: records in the log (event hold_at's output at least) that no
    # read_committed reader returned.
    aborted = records_in_log(bootstrap, output_topic) - len(output.records)
    print(f"output records in the log but never committed (the killed transaction's): {aborted}")
    assert aborted >= 1, "the kill left no unfinished transaction's records in the output's log"
