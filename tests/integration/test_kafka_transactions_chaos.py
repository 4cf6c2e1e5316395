"""Exactly-once through failures (issue 41): a confluent-kafka consume-transform-produce loop
(read_committed, send_offsets_to_transaction) while the leader of an output partition is
SIGKILLed and restarted, then the broker hosting the transaction coordinator. Every input
record's output must appear exactly once for a read_committed consumer, and none from an
aborted transaction.

The loop is what Kafka's documentation asks of an exactly-once application: an error that
requires an abort aborts and rewinds the consumer to its committed offsets; a retriable error
of commit is retried; a fatal one (the producer fenced) starts a new producer, whose
init_transactions fences the old one and aborts what it left open.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import confluent_kafka
import pytest

from services.kafka import protocol
from tests.integration.test_kafka_protocol import create, kafka_address, leader_of, raw_call, read_answer
from tests.integration.test_kafka_transactions import read_all

pytestmark = [pytest.mark.integration, pytest.mark.slow]

INPUTS = 300
BATCH = 10
TID = "chaos-eos-0"
CALL_TIMEOUT_S = 60.0
LOOP_WAIT_S = 240.0  # the whole loop, through two broker deaths (each a few seconds of failover)


def coordinator_of_transaction(cluster: Any, live: list[int]) -> int:
    """The broker FindCoordinator (key_type 1) names for TID, asked of a live broker."""
    body = protocol.build(
        protocol.request_class(protocol.FIND_COORDINATOR, 4), key_type=1, coordinator_keys=(TID,)
    )
    answer = read_answer(
        protocol.FIND_COORDINATOR,
        4,
        raw_call(kafka_address(cluster, live[0]), protocol.FIND_COORDINATOR, 4, body),
    )
    node_id: int = answer.coordinators[0].node_id
    return node_id


class Transformer:
    """One exactly-once application instance: a group consumer and a transactional producer."""

    def __init__(self, cluster: Any) -> None:
        self.cluster = cluster
        self.consumer = confluent_kafka.Consumer(
            {
                "bootstrap.servers": cluster.kafka_bootstrap(),
                "group.id": "chaos-eos",
                "isolation.level": "read_committed",
                "auto.offset.reset": "earliest",
                "enable.auto.commit": False,
                "session.timeout.ms": 10_000,
            }
        )
        self.consumer.subscribe(["cx-in"])
        self.producer = self._new_producer()
        self.aborts = 0
        self.restarts = 0

    def _new_producer(self) -> confluent_kafka.Producer:
        producer = confluent_kafka.Producer(
            {
                "bootstrap.servers": self.cluster.kafka_bootstrap(),
                "transactional.id": TID,
                "transaction.timeout.ms": 30_000,
                "message.timeout.ms": 30_000,
                "socket.timeout.ms": 10_000,
            }
        )
        producer.init_transactions(CALL_TIMEOUT_S)
        return producer

    def step(self, mid_transaction: Callable[[], None] | None = None) -> int:
        """Transform one batch in one transaction; the number of inputs it committed.
        `mid_transaction` runs once the outputs are sent, before the offsets and the commit."""
        msgs = [m for m in self.consumer.consume(BATCH, 0.5) if not m.error()]
        if not msgs:
            return 0
        try:
            self.producer.begin_transaction()
            for m in msgs:
                self.producer.produce("cx-out", m.value().replace(b"in-", b"out-"), key=m.key())
            if mid_transaction is not None:
                self.producer.flush(CALL_TIMEOUT_S)
                mid_transaction()
            self.producer.send_offsets_to_transaction(
                self.consumer.position(self.consumer.assignment()),
                self.consumer.consumer_group_metadata(),
                CALL_TIMEOUT_S,
            )
            self._commit()
            return len(msgs)
        except confluent_kafka.KafkaException as exc:
            self._recover(exc.args[0])
            return 0

    def _commit(self) -> None:
        for _ in range(5):
            try:
                self.producer.commit_transaction(CALL_TIMEOUT_S)
                return
            except confluent_kafka.KafkaException as exc:
                if not exc.args[0].retriable():
                    raise
        self.producer.commit_transaction(CALL_TIMEOUT_S)

    def _recover(self, error: Any) -> None:
        if error.txn_requires_abort():
            self.aborts += 1
            self.producer.abort_transaction(CALL_TIMEOUT_S)
        else:
            self.restarts += 1
            self.producer = self._new_producer()
        # Start again from what the group committed (the aborted transaction's outputs are void).
        assignment = self.consumer.assignment()
        for tp in self.consumer.committed(assignment, timeout=CALL_TIMEOUT_S):
            offset = tp.offset if tp.offset >= 0 else confluent_kafka.OFFSET_BEGINNING
            self.consumer.seek(confluent_kafka.TopicPartition(tp.topic, tp.partition, offset))

    def done(self) -> bool:
        assignment = self.consumer.assignment()
        if len(assignment) < 2:
            return False
        committed = self.consumer.committed(assignment, timeout=CALL_TIMEOUT_S)
        return sum(max(tp.offset, 0) for tp in committed) >= INPUTS

    def close(self) -> None:
        self.consumer.close()


def test_exactly_once_through_an_output_leader_kill_and_a_coordinator_kill(make_cluster):
    c = make_cluster(brokers=3)
    create(c, "cx-in", partitions=2)
    create(c, "cx-out", partitions=2)
    plain = confluent_kafka.Producer({"bootstrap.servers": c.kafka_bootstrap(), "enable.idempotence": True})
    for i in range(INPUTS):
        plain.produce("cx-in", f"in-{i}".encode(), key=str(i).encode())
    assert plain.flush(CALL_TIMEOUT_S) == 0

    out_leader = leader_of(c, "cx-out", 0)
    faults: dict[int, Callable[[], None]] = {
        5: lambda: c.kill_broker(out_leader),
        12: lambda: c.start_broker(out_leader),
    }
    killed_coordinator: list[int] = []

    def kill_coordinator() -> None:
        host = coordinator_of_transaction(c, [b for b in (1, 2, 3)])
        killed_coordinator.append(host)
        c.kill_broker(host)

    faults[18] = kill_coordinator
    faults[25] = lambda: c.start_broker(killed_coordinator[0])

    app = Transformer(c)
    try:
        batches = 0
        deadline = time.monotonic() + LOOP_WAIT_S
        while not app.done():
            assert time.monotonic() < deadline, f"transformed {batches} batches; not done"
            # A fault strikes inside the next transaction: its outputs sent, nothing committed.
            fault = faults.pop(batches + 1, None)
            if app.step(fault):
                batches += 1
            elif fault is not None:
                faults[batches + 1] = fault  # no input this time: the next transaction
        assert not faults, f"faults not reached: batches {sorted(faults)}"
    finally:
        app.close()
    assert killed_coordinator, "the coordinator's host was killed during the loop"

    out = read_all(c, ["cx-out"], "read_committed", INPUTS, "chaos-eos-check")
    values = [v for _, v in out]
    assert len(values) == len(set(values)), (
        f"duplicates for a read_committed reader: {len(values) - len(set(values))}"
    )
    assert sorted(values) == sorted(f"out-{i}".encode() for i in range(INPUTS)), "every input's output once"
