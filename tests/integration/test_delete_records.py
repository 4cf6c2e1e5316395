"""DeleteRecords end to end (issue 38): Kafka's API 21 from two Kafka clients nobody here wrote,
our Admin and CLI through the gateway, and the new log start offset on the followers (their
files), across a leader failover and across a restart.

kafkajs: admin.deleteTopicRecords, then admin.fetchTopicOffsets shows the new low watermark and
a consumer from the beginning starts there. kafka-python: delete_records answers the low
watermark, and refuses an offset above the high watermark. Our Admin.delete_records and
`highwater topic delete-records`; a consumer below the new start resets (auto_offset_reset).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from kafka import KafkaAdminClient
from kafka import errors as kafka_errors
from kafka.structs import TopicPartition as KafkaTopicPartition

from clients import Admin, Consumer, Producer
from clients.common.errors import OffsetOutOfRange
from clients.tools.cli import cli
from clients.types import TopicPartition
from tests.integration.helpers import wait_for
from tests.integration.kafkajs_client import run_kafkajs
from tests.integration.test_kafka_protocol import FAST, create

pytestmark = pytest.mark.integration

KAFKA_PYTHON = {"request_timeout_ms": 10_000}
# Bounds of the waits below: a leader election after a kill takes the lease TTL (3 s) and more.
FAILOVER_WAIT_S = 60.0
CONSUME_WAIT_S = 30.0
EARLIEST = -2
LATEST = -1

_KAFKAJS_DELETE = """
const topic = %(topic)r;
const admin = kafka.admin();
await admin.connect();
const producer = kafka.producer();
await producer.connect();
await producer.send({ topic, messages: [...Array(10).keys()].map((i) => ({ value: `v-${i}` })) });
await producer.disconnect();

// kafkajs' deleteTopicRecords routes by the admin's cached metadata, which it does not load itself.
await admin.fetchTopicMetadata({ topics: [topic] });
await admin.deleteTopicRecords({ topic, partitions: [{ partition: 0, offset: '4' }] });
const offsets = (await admin.fetchTopicOffsets(topic))
  .map(({ partition, low, high }) => ({ partition, low, high }));

let refusal = null;
try {
  await admin.deleteTopicRecords({ topic, partitions: [{ partition: 0, offset: '99' }] });
} catch (e) {
  refusal = e.message;  // kafkajs' retrier wraps the per-partition error, keeping its message
}

const consumer = kafka.consumer(
  { groupId: 'js-delete-records', sessionTimeout: 10000, heartbeatInterval: 500 });
await consumer.connect();
await consumer.subscribe({ topic, fromBeginning: true });
let first = null;
await consumer.run({
  eachMessage: async ({ message }) => {
    if (first === null) first = { offset: message.offset, value: message.value.toString() };
  },
});
const deadline = Date.now() + %(wait_ms)d;
while (first === null && Date.now() < deadline) await new Promise((r) => setTimeout(r, 100));
await consumer.disconnect();
await admin.disconnect();
return { offsets, refusal, first };
"""


def produce_values(bootstrap: str, topic: str, count: int, *, size: int = 10, partition: int = 0) -> None:
    with Producer(bootstrap, acks="all", **FAST) as producer:
        for i in range(count):
            producer.send(topic, value=f"{i:0{size}d}".encode(), partition=partition)
            producer.flush()  # a batch each: small segments fill one batch at a time


def offsets(admin: Admin, tp: TopicPartition) -> tuple[int, int]:
    """(earliest, latest) of tp, as ListOffsets answers through the gateway."""
    return admin.list_offsets({tp: EARLIEST})[tp], admin.list_offsets({tp: LATEST})[tp]


def segment_bases(data_dir: Path) -> list[int]:
    return sorted(int(p.name.split(".")[0]) for p in data_dir.glob("*.log"))


def test_kafkajs_delete_topic_records_then_fetch_topic_offsets_and_a_consumer_from_the_beginning(cluster):
    create(cluster, "dr-js", partitions=1)
    out = run_kafkajs(
        str(cluster.kafka_bootstrap()).split(","),
        _KAFKAJS_DELETE % {"topic": "dr-js", "wait_ms": int(CONSUME_WAIT_S * 1000)},
    )
    assert out["offsets"] == [{"partition": 0, "low": "4", "high": "10"}]
    assert out["refusal"] == "Error while deleting records", "99 is above the high watermark"
    assert out["first"] == {"offset": "4", "value": "v-4"}, "a consumer from the beginning starts at 4"


def test_kafka_python_delete_records_answers_the_low_watermark(cluster):
    create(cluster, "dr-py", partitions=2)
    produce_values(cluster.gateway_address, "dr-py", 6, partition=1)
    tp = KafkaTopicPartition("dr-py", 1)
    admin = KafkaAdminClient(bootstrap_servers=cluster.kafka_bootstrap(), **KAFKA_PYTHON)
    try:
        result = admin.delete_records({tp: 5}, timeout_ms=10_000)
        assert (result[tp]["error_code"], result[tp]["low_watermark"]) == (0, 5)
        again = admin.delete_records({tp: 2}, timeout_ms=10_000)
        assert again[tp]["low_watermark"] == 5, "below the log start: nothing changes"
        with pytest.raises(kafka_errors.OffsetOutOfRangeError):
            admin.delete_records({tp: 7}, timeout_ms=10_000)
    finally:
        admin.close()
    with Admin(cluster.gateway_address, **FAST) as ours:
        assert offsets(ours, TopicPartition("dr-py", 1)) == (5, 6)


def test_admin_and_cli_delete_records_and_a_consumer_below_the_new_start_resets(cluster):
    topic = "dr-ours"
    tp = TopicPartition(topic, 0)
    with Admin(cluster.gateway_address, **FAST) as admin:
        admin.create_topics(topic, 1, 3, {"min.insync.replicas": "2"})
        produce_values(cluster.gateway_address, topic, 10)
        assert admin.delete_records({tp: 3}) == {tp: 3}
        assert offsets(admin, tp) == (3, 10)
        with pytest.raises(OffsetOutOfRange):
            admin.delete_records({tp: 11})

        runner = CliRunner()
        base = ["--bootstrap", cluster.gateway_address]
        result = runner.invoke(cli, [*base, "topic", "delete-records", "--help"])
        assert result.exit_code == 0 and "--before-offset" in result.output
        result = runner.invoke(
            cli,
            [
                *base,
                "-o",
                "json",
                "topic",
                "delete-records",
                topic,
                "--partition",
                "0",
                "--before-offset",
                "6",
            ],
        )
        assert result.exit_code == 0, result.output
        assert json.loads(result.output) == [{"topic": topic, "partition": 0, "low_watermark": 6}]
        result = runner.invoke(cli, [*base, "topic", "delete-records", topic, "--before-offset", "-1"])
        assert result.exit_code == 0, result.output
        assert "10" in result.output, "-1: below the high watermark"
        assert offsets(admin, tp) == (10, 10)

    # A consumer placed below the new log start is told OFFSET_OUT_OF_RANGE and resets.
    produce_values(cluster.gateway_address, topic, 2)
    with Consumer(bootstrap=cluster.gateway_address, auto_offset_reset="earliest", **FAST) as consumer:
        consumer.assign([tp])
        consumer.seek(tp, 1)
        got: list[int] = []
        deadline = time.monotonic() + CONSUME_WAIT_S
        while len(got) < 2 and time.monotonic() < deadline:
            got += [r.offset for r in consumer.poll(timeout_ms=500)]
        assert got == [10, 11]


def test_followers_take_the_new_log_start_a_new_leader_keeps_it_and_so_does_a_restart(make_cluster):
    c = make_cluster(brokers=3)
    topic = "dr-failover"
    tp = TopicPartition(topic, 0)
    with Admin(c.gateway_address, **FAST) as admin:
        admin.create_topics(topic, 1, 3, {"min.insync.replicas": "2", "segment.bytes": "1024"})
        produce_values(c.gateway_address, topic, 60, size=100)
        (described,) = admin.describe_topics([topic])
        leader = described.partitions[0].leader
        assert admin.delete_records({tp: 40}) == {tp: 40}, "answered once the ISR has it"

        # Every replica, followers included, deleted its whole segments below 40.
        for broker_id in (1, 2, 3):
            bases = segment_bases(c.base_dir / f"broker-{broker_id}" / f"{topic}-0")
            assert bases and bases[0] <= 40 and (len(bases) == 1 or bases[1] > 40), (broker_id, bases)
            assert bases[0] > 0, f"broker {broker_id} kept segments below the log start: {bases}"

        c.kill_broker(leader)
        new_leader = wait_for(
            lambda: next(
                (
                    p.leader
                    for p in admin.describe_topics([topic])[0].partitions
                    if p.leader not in (-1, leader)
                ),
                None,
            ),
            timeout_s=FAILOVER_WAIT_S,
            what="a new leader",
        )
        assert new_leader != leader
        assert wait_for(lambda: _offsets_or_none(admin, tp), timeout_s=FAILOVER_WAIT_S, what="offsets") == (
            40,
            60,
        )

    # A restart (killed: no clean close) keeps it: the log start offset's checkpoint.
    restarted = "dr-restart"
    rtp = TopicPartition(restarted, 0)
    with Admin(c.gateway_address, **FAST) as admin:
        admin.create_topics(restarted, 1, 1)
        produce_values(c.gateway_address, restarted, 8)
        assert admin.delete_records({rtp: 5}) == {rtp: 5}
        (only,) = admin.describe_topics([restarted])[0].partitions
        c.kill_broker(only.leader)
        c.start_broker(only.leader)
        assert wait_for(lambda: _offsets_or_none(admin, rtp), timeout_s=FAILOVER_WAIT_S, what="offsets") == (
            5,
            8,
        )


def _offsets_or_none(admin: Admin, tp: TopicPartition) -> Any:
    try:
        return offsets(admin, tp)
    except Exception:
        return None
