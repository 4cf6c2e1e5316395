"""`highwater transactions list | describe | abort` (issue 41) against a hanging transaction left by a
client nobody here wrote: confluent-kafka begins a transaction, writes, and never commits. The
CLI lists it Ongoing, describes its partitions, aborts it; the markers release the partition's
last stable offset for read_committed readers, and the old producer finds itself fenced.
"""

from __future__ import annotations

import json
import time
from typing import Any

import confluent_kafka
import pytest
from click.testing import CliRunner

from clients import Admin, Consumer, Producer, TopicPartition
from clients.tools.cli import cli

pytestmark = pytest.mark.integration

CALL_TIMEOUT_S = 30.0
FAST = {"request_timeout_ms": 10_000, "connect_timeout_ms": 5_000, "retry_backoff_ms": 50}


def run(cluster: Any, *args: str) -> Any:
    result = CliRunner().invoke(cli, ["--bootstrap", cluster.gateway_address, *args])
    return result


def read_committed(cluster: Any, topic: str, expected: int) -> list[bytes]:
    """What a read_committed consumer reads from the start, once it has `expected` values or
    CALL_TIMEOUT_S passed."""
    got: list[bytes] = []
    with Consumer(bootstrap=cluster.gateway_address, isolation_level="read_committed", **FAST) as consumer:
        tp = TopicPartition(topic, 0)
        consumer.assign([tp])
        consumer.seek_to_beginning(tp)
        deadline = time.monotonic() + CALL_TIMEOUT_S
        while len(got) < expected and time.monotonic() < deadline:
            got.extend(r.value for r in consumer.poll(timeout_ms=200))
    return got


def test_a_hanging_transaction_is_listed_described_and_aborted(cluster):
    topic = "hanging"
    with Admin(cluster.gateway_address, **FAST) as admin:
        admin.create_topics(topic, 1, 3, {"min.insync.replicas": "2"})
    hanging = confluent_kafka.Producer(
        {
            "bootstrap.servers": cluster.kafka_bootstrap(),
            "transactional.id": "cli-hanging",
            "transaction.timeout.ms": 900_000,  # the coordinator would hold it for 15 minutes
        }
    )
    hanging.init_transactions(CALL_TIMEOUT_S)
    hanging.begin_transaction()
    hanging.produce(topic, b"never-committed", partition=0)
    assert hanging.flush(CALL_TIMEOUT_S) == 0
    # A committed record after the hanging one: read_committed readers are held before it.
    with Producer(cluster.gateway_address, transactional_id="cli-after", **FAST) as after:
        after.init_transactions()
        after.begin_transaction()
        after.send(topic, b"committed-after", partition=0)
        after.commit_transaction()
    assert read_committed(cluster, topic, 1) == [], "the LSO holds at the hanging transaction"

    listed = run(cluster, "-o", "json", "transactions", "list", "--state", "Ongoing")
    assert listed.exit_code == 0, listed.output
    assert "cli-hanging" in [t["transactional_id"] for t in json.loads(listed.output)]
    table = run(cluster, "transactions", "list")
    assert table.exit_code == 0 and "cli-hanging" in table.output and "Ongoing" in table.output, table.output

    described = run(cluster, "-o", "json", "transactions", "describe", "cli-hanging")
    assert described.exit_code == 0, described.output
    (d,) = json.loads(described.output)
    assert d["state"] == "Ongoing" and d["partitions"] == [[topic, 0]], d
    assert d["transaction_timeout_ms"] == 900_000

    aborted = run(cluster, "transactions", "abort", "cli-hanging")
    assert aborted.exit_code == 0, aborted.output
    assert "fenced at epoch" in aborted.output
    deadline = time.monotonic() + CALL_TIMEOUT_S
    while True:
        (d,) = json.loads(run(cluster, "-o", "json", "transactions", "describe", "cli-hanging").output)
        if d["state"] == "CompleteAbort" or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert d["state"] == "CompleteAbort", d
    assert read_committed(cluster, topic, 1) == [b"committed-after"], "the markers released the LSO"

    with pytest.raises(confluent_kafka.KafkaException) as fenced:
        hanging.commit_transaction(CALL_TIMEOUT_S)
    assert fenced.value.args[0].fatal() or "fenced" in str(fenced.value).lower(), fenced.value
    del hanging  # librdkafka's producer closes when dropped, before the cluster stops

    again = run(cluster, "transactions", "abort", "cli-hanging")
    assert again.exit_code != 0 and "INVALID_TXN_STATE" in again.output, again.output
    unknown = run(cluster, "transactions", "describe", "no-such-id")
    assert unknown.exit_code != 0 and "TRANSACTIONAL_ID_NOT_FOUND" in unknown.output, unknown.output
    bad = run(cluster, "transactions", "list", "--state", "Sleeping")
    assert bad.exit_code != 0 and "unknown transaction states" in bad.output, bad.output
