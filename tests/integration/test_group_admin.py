"""Group admin over Kafka's protocol, driven by Kafka clients nobody here wrote (issue 38).

kafkajs: resetOffsets to earliest / latest commits -2 / -1 (kafkajs' EARLIEST_OFFSET and
LATEST_OFFSET) through a member's OffsetCommit, and a consumer of the group then starts where
the reset said (the first record; only records written after it joined); deleteGroups deletes an
empty group and is refused for a live one. kafka-python: describe_groups and list_groups agree
that a group with committed offsets and no members is Empty; delete_group_offsets (OffsetDelete)
and delete_groups, and their refusals while a consumer of the group runs.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from kafka import KafkaAdminClient, KafkaConsumer
from kafka import errors as kafka_errors
from kafka.structs import OffsetAndMetadata, TopicPartition

from tests.integration.kafkajs_client import run_kafkajs
from tests.integration.test_kafka_protocol import create

pytestmark = pytest.mark.integration

# Every wait is bounded: a consumer's join takes the forming group's 1 s delay plus a rebalance.
CONSUMER_WAIT_S = 60.0
KAFKA_PYTHON = {"request_timeout_ms": 15_000}

_KAFKAJS_FIRST_RECORD = """
const topic = %(topic)r;
const admin = kafka.admin();
await admin.connect();
const producer = kafka.producer();
await producer.connect();
await producer.send({ topic, messages: [0, 1, 2, 3, 4].map((i) => ({ value: `old-${i}` })) });

const committed = async (groupId) =>
  (await admin.fetchOffsets({ groupId, topics: [topic] }))[0].partitions[0].offset;

// The first record a new consumer of the group gets; with produceNew, records are written
// while it waits, so one written after it took its position reaches it.
const firstRecord = async (groupId, fromBeginning, produceNew) => {
  const consumer = kafka.consumer({ groupId, sessionTimeout: 10000, heartbeatInterval: 500 });
  await consumer.connect();
  await consumer.subscribe({ topic, fromBeginning });
  let first = null;
  await consumer.run({
    eachMessage: async ({ message }) => {
      if (first === null) first = { offset: message.offset, value: message.value.toString() };
    },
  });
  const deadline = Date.now() + %(wait_ms)d;
  for (let n = 0; first === null && Date.now() < deadline; n++) {
    if (produceNew) await producer.send({ topic, messages: [{ value: `new-${n}` }] });
    await new Promise((r) => setTimeout(r, 300));
  }
  await consumer.disconnect();
  return first;
};

// earliest: the group had read everything (committed 5), then is reset.
await admin.setOffsets({ groupId: 'js-earliest', topic, partitions: [{ partition: 0, offset: '5' }] });
const beforeEarliest = await committed('js-earliest');
await admin.resetOffsets({ groupId: 'js-earliest', topic, earliest: true });
const earliestCommitted = await committed('js-earliest');
const earliestFirst = await firstRecord('js-earliest', true, false);

// latest: the group had read nothing (committed 0), then is reset.
await admin.setOffsets({ groupId: 'js-latest', topic, partitions: [{ partition: 0, offset: '0' }] });
await admin.resetOffsets({ groupId: 'js-latest', topic });
const latestCommitted = await committed('js-latest');
const latestFirst = await firstRecord('js-latest', false, true);

await producer.disconnect();
await admin.disconnect();
return { beforeEarliest, earliestCommitted, earliestFirst, latestCommitted, latestFirst };
"""

_KAFKAJS_DELETE_GROUPS = """
const topic = %(topic)r;
const admin = kafka.admin();
await admin.connect();
await admin.setOffsets({ groupId: 'js-idle', topic, partitions: [{ partition: 0, offset: '1' }] });
await admin.setOffsets({ groupId: 'js-live', topic, partitions: [{ partition: 0, offset: '1' }] });
const refusal = async (groupIds) => {
  try {
    await admin.deleteGroups(groupIds);
    return null;
  } catch (e) {
    return { name: e.name, groups: (e.groups || []).map((g) => [g.groupId, g.errorCode]) };
  }
};

const consumer = kafka.consumer({ groupId: 'js-live', sessionTimeout: 10000, heartbeatInterval: 500 });
let joined = false;
consumer.on(consumer.events.GROUP_JOIN, () => { joined = true; });
await consumer.connect();
await consumer.subscribe({ topic, fromBeginning: true });
await consumer.run({ eachMessage: async () => {} });
const deadline = Date.now() + %(wait_ms)d;
while (!joined && Date.now() < deadline) await new Promise((r) => setTimeout(r, 100));
const live = await refusal(['js-live']);
await consumer.disconnect();
const afterLeaving = await refusal(['js-live']);

const idle = await refusal(['js-idle']);
const idleOffsets = (await admin.fetchOffsets({ groupId: 'js-idle', topics: [topic] }))[0].partitions;
const again = await refusal(['js-idle']);
await admin.disconnect();
return { joined, live, afterLeaving, idle, idleOffsets, again };
"""


def kafkajs_brokers(cluster: Any) -> list[str]:
    return str(cluster.kafka_bootstrap()).split(",")


def test_kafkajs_reset_offsets_to_earliest_and_latest_then_a_consumer_starts_there(cluster):
    create(cluster, "admin-js-reset", partitions=1)
    out = run_kafkajs(
        kafkajs_brokers(cluster),
        _KAFKAJS_FIRST_RECORD % {"topic": "admin-js-reset", "wait_ms": int(CONSUMER_WAIT_S * 1000)},
    )
    assert out["beforeEarliest"] == "5"
    assert out["earliestCommitted"] == "-2", "kafkajs' EARLIEST_OFFSET, stored as Kafka stores it"
    assert out["earliestFirst"] == {"offset": "0", "value": "old-0"}, "from the first record"
    assert out["latestCommitted"] == "-1", "kafkajs' LATEST_OFFSET"
    assert out["latestFirst"] is not None and out["latestFirst"]["value"].startswith("new-"), (
        f"only records written after the reset: {out['latestFirst']}"
    )


def test_kafkajs_delete_groups_deletes_an_empty_group_and_refuses_a_live_one(cluster):
    create(cluster, "admin-js-delete", partitions=1)
    out = run_kafkajs(
        kafkajs_brokers(cluster),
        _KAFKAJS_DELETE_GROUPS % {"topic": "admin-js-delete", "wait_ms": int(CONSUMER_WAIT_S * 1000)},
    )
    assert out["joined"]
    assert out["live"] == {"name": "KafkaJSDeleteGroupsError", "groups": [["js-live", 68]]}, "NON_EMPTY_GROUP"
    assert out["afterLeaving"] is None, "its consumer left: deleted"
    assert out["idle"] is None
    assert [p["offset"] for p in out["idleOffsets"]] == ["-1"], "its committed offset is gone"
    assert out["again"] == {"name": "KafkaJSDeleteGroupsError", "groups": [["js-idle", 69]]}, (
        "GROUP_ID_NOT_FOUND"
    )


def _wait_for_assignment(consumer: KafkaConsumer) -> None:
    deadline = time.monotonic() + CONSUMER_WAIT_S
    while not consumer.assignment():
        assert time.monotonic() < deadline, "the kafka-python consumer never got its partitions"
        consumer.poll(timeout_ms=200)


def test_kafka_python_describe_list_and_delete_groups_and_their_offsets(cluster):
    topic = "admin-py"
    create(cluster, topic, partitions=2)
    tp0, tp1 = TopicPartition(topic, 0), TopicPartition(topic, 1)
    admin = KafkaAdminClient(bootstrap_servers=cluster.kafka_bootstrap(), **KAFKA_PYTHON)
    try:
        committed = admin.alter_group_offsets(
            "py-idle", {tp0: OffsetAndMetadata(0, "", -1), tp1: OffsetAndMetadata(0, "", -1)}
        )
        assert set(committed.values()) == {kafka_errors.NoError}

        # A group with committed offsets and no members: Empty, wherever it is looked at.
        described = admin.describe_groups(["py-idle"])["py-idle"]
        assert (described["error"], described["group_state"], described["members"]) == (None, "Empty", [])
        listed = [g for g in admin.list_groups() if g["group_id"] == "py-idle"]
        assert [g["group_state"] for g in listed] == ["Empty"], "listed once, by its coordinator"
        assert [g["group_id"] for g in admin.list_groups(states_filter=["Empty"])].count("py-idle") == 1

        assert admin.delete_group_offsets("py-idle", [tp0]) == {tp0: kafka_errors.NoError}
        offsets = admin.list_group_offsets("py-idle")["py-idle"]
        assert offsets[tp1].offset == 0 and (tp0 not in offsets or offsets[tp0].offset == -1)

        # A live consumer of the group: neither the group nor its subscribed topic's offsets go.
        consumer = KafkaConsumer(
            topic,
            group_id="py-idle",
            bootstrap_servers=cluster.kafka_bootstrap(),
            enable_auto_commit=False,
            session_timeout_ms=10_000,
            **KAFKA_PYTHON,
        )
        try:
            _wait_for_assignment(consumer)
            assert admin.describe_groups(["py-idle"])["py-idle"]["group_state"] == "Stable"
            assert admin.delete_groups(["py-idle"]) == {"py-idle": "NonEmptyGroupError"}
            assert admin.delete_group_offsets("py-idle", [tp1]) == {
                tp1: kafka_errors.GroupSubscribedToTopicError
            }
        finally:
            consumer.close()

        assert admin.delete_groups(["py-idle"]) == {"py-idle": "OK"}
        assert admin.delete_groups(["py-idle"]) == {"py-idle": "GroupIdNotFoundError"}
        assert admin.describe_groups(["py-idle"])["py-idle"]["group_state"] == "Dead"
        with pytest.raises(kafka_errors.GroupIdNotFoundError):
            admin.delete_group_offsets("py-idle", [tp1])
    finally:
        admin.close()
