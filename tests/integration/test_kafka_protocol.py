"""Kafka's wire protocol on the brokers, driven by clients nobody here wrote (issue 23).

confluent-kafka (librdkafka) produces idempotently with acks=all and consumes back; kcat lists
metadata, produces and consumes; records written over gRPC are read back over Kafka's protocol
byte for byte and the reverse; a consumer group of three confluent-kafka processes loses one
to SIGKILL and the other two take its partitions from the committed offsets. A few raw
requests (built with kio, the library the broker uses) check what clients rarely send: an
unknown version, a Produce to a follower.
"""

from __future__ import annotations

import collections
import io
import json
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import confluent_kafka
import pytest

from clients import Admin, Consumer, Producer, TopicPartition
from services.kafka import protocol
from tests.integration.helpers import consumer_fetch, gateway_stub, wait_for

pytestmark = pytest.mark.integration

FAST = {"request_timeout_ms": 10_000, "connect_timeout_ms": 5_000, "retry_backoff_ms": 50}
CALL_TIMEOUT_S = 30.0  # generous: CI machines are shared; every wait stays bounded


def create(cluster: Any, name: str, partitions: int = 3) -> None:
    """Create the topic and wait until every broker's Kafka Metadata lists each partition's leader.

    CreateTopics returns once the controller has written the topic; each broker learns it from
    the controller's UpdateMetadata a moment later (as in Kafka, a client asking a broker in
    between sees UNKNOWN_TOPIC_OR_PARTITION). A one-shot listing such as `kcat -L` must not race it.
    """
    with Admin(cluster.gateway_address, **FAST) as admin:
        admin.create_topics(name, partitions, 3, {"min.insync.replicas": "2"})
    metadata = protocol.request_class(protocol.METADATA, 12)
    topic_cls = __import__(metadata.__module__, fromlist=["x"]).MetadataRequestTopic

    def known_everywhere() -> bool:
        for broker_id in (1, 2, 3):
            body = metadata(
                topics=(topic_cls(name=name, topic_id=None),),
                allow_auto_topic_creation=False,
                include_topic_authorized_operations=False,
            )
            answer = read_answer(
                protocol.METADATA,
                12,
                raw_call(kafka_address(cluster, broker_id), protocol.METADATA, 12, body),
            )
            (topic,) = answer.topics
            if topic.error_code != 0 or sorted(p.partition_index for p in topic.partitions) != list(
                range(partitions)
            ):
                return False
            if any(p.leader_id < 0 for p in topic.partitions):
                return False
        return True

    wait_for(known_everywhere, timeout_s=CALL_TIMEOUT_S, what=f"every broker's Kafka Metadata to list {name}")


def kafka_address(cluster: Any, broker_id: int) -> tuple[str, int]:
    return "127.0.0.1", int(cluster.processes[f"broker-{broker_id}"].info["kafka_port"])


def raw_call(
    address: tuple[str, int], api_key: int, version: int, body: Any, correlation_id: int = 7
) -> bytes:
    """One request over a fresh connection; the answer's frame after its size (b"" if closed)."""
    from kio.schema.request_header.v1.header import RequestHeader as V1
    from kio.schema.request_header.v2.header import RequestHeader as V2
    from kio.serial import entity_writer

    buf = io.BytesIO()
    header_cls = V2 if body is not None and body.__flexible__ else V1
    entity_writer(header_cls)(
        buf,
        header_cls(
            request_api_key=api_key, request_api_version=version, correlation_id=correlation_id, client_id="t"
        ),
    )
    if body is not None:
        entity_writer(type(body))(buf, body)
    frame = buf.getvalue()
    with socket.create_connection(address, timeout=CALL_TIMEOUT_S) as s:
        s.sendall(struct.pack(">i", len(frame)) + frame)
        size_bytes = s.recv(4, socket.MSG_WAITALL)
        if len(size_bytes) < 4:
            return b""
        (size,) = struct.unpack(">i", size_bytes)
        return s.recv(size, socket.MSG_WAITALL)


def read_answer(api_key: int, version: int, answer: bytes) -> Any:
    from kio.serial import entity_reader

    cls = protocol.response_class(api_key, version)
    (correlation_id,) = struct.unpack_from(">i", answer)
    offset = 4 + (1 if cls.__flexible__ and api_key != protocol.API_VERSIONS else 0)
    body, _ = entity_reader(cls)(answer, offset)
    assert correlation_id == 7
    return body


def test_confluent_kafka_idempotent_producer_and_consumer_round_trip(cluster):
    create(cluster, "kafka-confluent")
    bootstrap = cluster.kafka_bootstrap()
    producer = confluent_kafka.Producer(
        {
            "bootstrap.servers": bootstrap,
            "enable.idempotence": True,
            "acks": "all",
            "message.timeout.ms": 20_000,
        }
    )
    delivered: list[Any] = []
    errors: list[Any] = []

    def on_delivery(err: Any, msg: Any) -> None:
        (errors if err else delivered).append(err or msg)

    sent = [(f"k{i % 11}".encode(), f"value-{i}".encode()) for i in range(500)]
    for key, value in sent:
        producer.produce(
            "kafka-confluent", key=key, value=value, headers=[("h", b"x")], on_delivery=on_delivery
        )
    assert producer.flush(CALL_TIMEOUT_S) == 0, "every record delivered in time"
    assert not errors
    assert len(delivered) == 500
    per_partition: dict[int, list[int]] = {}
    for m in delivered:
        per_partition.setdefault(m.partition(), []).append(m.offset())
    for offsets in per_partition.values():
        assert sorted(offsets) == list(range(len(offsets))), "no record written twice, no gap"

    consumer = confluent_kafka.Consumer(
        {"bootstrap.servers": bootstrap, "group.id": "kafka-confluent", "enable.auto.commit": False}
    )
    try:
        consumer.assign([confluent_kafka.TopicPartition("kafka-confluent", p, 0) for p in range(3)])
        got = []
        deadline = time.monotonic() + CALL_TIMEOUT_S
        while len(got) < 500 and time.monotonic() < deadline:
            m = consumer.poll(0.5)
            if m is not None and not m.error():
                got.append(m)
    finally:
        consumer.close()
    assert sorted((m.key(), m.value()) for m in got) == sorted(sent)
    assert all(m.headers() == [("h", b"x")] for m in got)

    # The same records through the gRPC gateway and our own Consumer.
    with Consumer(bootstrap=cluster.gateway_address, auto_offset_reset="earliest", **FAST) as ours:
        ours.assign([TopicPartition("kafka-confluent", p) for p in range(3)])
        records: list[Any] = []
        deadline = time.monotonic() + CALL_TIMEOUT_S
        while len(records) < 500 and time.monotonic() < deadline:
            records.extend(ours.poll(timeout_ms=500))
    assert sorted((r.key, r.value) for r in records) == sorted(sent)
    by_place = {(m.partition(), m.offset()): (m.key(), m.value(), m.timestamp()[1]) for m in got}
    assert all(by_place[(r.partition, r.offset)] == (r.key, r.value, r.timestamp_ms) for r in records)


def test_grpc_written_batches_read_over_kafka_byte_for_byte(cluster):
    create(cluster, "kafka-bytes", partitions=1)
    with Producer(cluster.gateway_address, **FAST) as producer:
        for i in range(50):
            producer.send("kafka-bytes", f"r{i}".encode(), key=b"k", partition=0)
        producer.flush(timeout_ms=20_000)
    grpc_answer = gateway_stub(cluster.gateway_address).Fetch(
        consumer_fetch("kafka-bytes", 0, max_bytes=1 << 20, partition_max_bytes=1 << 20),
        timeout=CALL_TIMEOUT_S,
    )
    grpc_bytes = grpc_answer.topics[0].partitions[0].records
    assert grpc_bytes

    fetch = protocol.request_class(protocol.FETCH, 12)
    mod = __import__(fetch.__module__, fromlist=["x"])
    body = fetch(
        max_wait=__import__("datetime").timedelta(milliseconds=0),
        min_bytes=0,
        topics=(
            mod.FetchTopic(
                topic="kafka-bytes",
                partitions=(mod.FetchPartition(partition=0, fetch_offset=0, partition_max_bytes=1 << 20),),
            ),
        ),
        forgotten_topics_data=(),
    )
    leader = leader_of(cluster, "kafka-bytes", 0)
    answer = read_answer(
        protocol.FETCH, 12, raw_call(kafka_address(cluster, leader), protocol.FETCH, 12, body)
    )
    part = answer.responses[0].partitions[0]
    assert part.error_code == 0
    assert part.high_watermark == 50
    assert bytes(part.records) == grpc_bytes, "the leader's stored batches, unchanged"

    # The reverse: a batch produced over Kafka's protocol is what a gRPC Fetch returns, byte for
    # byte but for the two fields the leader patches outside the CRC (baseOffset, bytes 0-8, and
    # partitionLeaderEpoch, bytes 12-16).
    from clients.common.records import encode_batch

    sent = encode_batch(
        [(b"k", f"kafka-{i}".encode(), [("h", b"v")], 1_700_000_000_000 + i) for i in range(20)]
    )
    produce = protocol.request_class(protocol.PRODUCE, 9)
    mod = __import__(produce.__module__, fromlist=["x"])
    body = produce(
        acks=-1,
        timeout=__import__("datetime").timedelta(seconds=10),
        topic_data=(
            mod.TopicProduceData(
                name="kafka-bytes", partition_data=(mod.PartitionProduceData(index=0, records=sent),)
            ),
        ),
    )
    answer = read_answer(
        protocol.PRODUCE, 9, raw_call(kafka_address(cluster, leader), protocol.PRODUCE, 9, body)
    )
    (written,) = answer.responses[0].partition_responses
    assert (written.error_code, written.base_offset) == (0, 50)
    grpc_answer = gateway_stub(cluster.gateway_address).Fetch(
        consumer_fetch("kafka-bytes", 0, 50, max_bytes=1 << 20, partition_max_bytes=1 << 20),
        timeout=CALL_TIMEOUT_S,
    )
    stored = grpc_answer.topics[0].partitions[0].records
    assert len(stored) == len(sent)
    assert int.from_bytes(stored[0:8], "big") == 50
    assert stored[8:12] == sent[8:12] and stored[16:] == sent[16:]


def leader_of(cluster: Any, topic: str, partition: int) -> int:
    with Admin(cluster.gateway_address, **FAST) as admin:
        for t in admin.describe_topics([topic]):
            for p in t.partitions:
                if p.partition == partition:
                    return int(p.leader)
    raise AssertionError(f"{topic}-{partition} has no leader")


def test_produce_to_a_follower_is_not_leader_or_follower(cluster):
    create(cluster, "kafka-follower", partitions=1)
    leader = leader_of(cluster, "kafka-follower", 0)
    follower = next(b for b in (1, 2, 3) if b != leader)
    from clients.common.records import encode_batch  # our own encoder, as a client would send

    produce = protocol.request_class(protocol.PRODUCE, 9)
    mod = __import__(produce.__module__, fromlist=["x"])
    body = produce(
        acks=-1,
        timeout=__import__("datetime").timedelta(seconds=5),
        topic_data=(
            mod.TopicProduceData(
                name="kafka-follower",
                partition_data=(
                    mod.PartitionProduceData(index=0, records=encode_batch([(None, b"v", [], 1_000)])),
                ),
            ),
        ),
    )
    answer = read_answer(
        protocol.PRODUCE, 9, raw_call(kafka_address(cluster, follower), protocol.PRODUCE, 9, body)
    )
    assert answer.responses[0].partition_responses[0].error_code == 6, "NOT_LEADER_OR_FOLLOWER"


def test_unsupported_versions(cluster):
    address = kafka_address(cluster, 1)
    # ApiVersions at a version not served: answered in v0 with UNSUPPORTED_VERSION and the list.
    answer = read_answer(protocol.API_VERSIONS, 0, raw_call(address, protocol.API_VERSIONS, 99, None))
    assert answer.error_code == 35
    assert {k.api_key: (k.min_version, k.max_version) for k in answer.api_keys} == protocol.SUPPORTED_VERSIONS
    # Any other API at an unserved version: the connection is closed, as Kafka does.
    assert raw_call(address, protocol.FETCH, 99, None) == b""
    assert raw_call(address, 57, 0, None) == b"", "an API not served at all (UpdateFeatures)"


def test_kcat_lists_metadata_produces_and_consumes(cluster):
    kcat = shutil.which("kcat")
    if kcat is None:
        pytest.skip("kcat is not installed (Debian package kcat; ./dev test installs it)")
    create(cluster, "kafka-kcat")
    bootstrap = cluster.kafka_bootstrap().split(",")[0]
    listing = json.loads(
        subprocess.run(
            [kcat, "-b", bootstrap, "-L", "-J", "-t", "kafka-kcat"],
            capture_output=True,
            timeout=CALL_TIMEOUT_S,
            check=True,
        ).stdout
    )
    brokers = {b["id"]: b["name"] for b in listing["brokers"]}
    assert brokers == {
        i: f"127.0.0.1:{cluster.processes[f'broker-{i}'].info['kafka_port']}" for i in (1, 2, 3)
    }, "every broker's Kafka address, from its registration"
    (topic,) = listing["topics"]
    assert topic["topic"] == "kafka-kcat"
    assert sorted(p["partition"] for p in topic["partitions"]) == [0, 1, 2]
    assert all(p["leader"] in brokers and len(p["isrs"]) == 3 for p in topic["partitions"])

    lines = [f"key{i}:value{i}" for i in range(30)]
    subprocess.run(
        [kcat, "-b", bootstrap, "-P", "-t", "kafka-kcat", "-K:", "-X", "acks=all"],
        input="\n".join(lines).encode(),
        timeout=CALL_TIMEOUT_S,
        check=True,
    )
    consumed = subprocess.run(
        [kcat, "-b", bootstrap, "-C", "-t", "kafka-kcat", "-e", "-f", "%k:%s\\n"],
        capture_output=True,
        timeout=CALL_TIMEOUT_S,
        check=True,
    ).stdout.decode()
    assert sorted(consumed.split()) == sorted(lines)

    # Written over Kafka's protocol, read over gRPC.
    with Consumer(bootstrap=cluster.gateway_address, auto_offset_reset="earliest", **FAST) as ours:
        ours.assign([TopicPartition("kafka-kcat", p) for p in range(3)])
        records: list[Any] = []
        deadline = time.monotonic() + CALL_TIMEOUT_S
        while len(records) < 30 and time.monotonic() < deadline:
            records.extend(ours.poll(timeout_ms=500))
    assert sorted(f"{r.key.decode()}:{r.value.decode()}" for r in records) == sorted(lines)


def test_list_offsets_and_offsets_for_leader_epoch(cluster):
    create(cluster, "kafka-offsets", partitions=1)
    with Producer(cluster.gateway_address, **FAST) as producer:
        for _ in range(10):
            producer.send("kafka-offsets", b"v", partition=0)
        producer.flush(timeout_ms=20_000)
    consumer = confluent_kafka.Consumer(
        {"bootstrap.servers": cluster.kafka_bootstrap(), "group.id": "kafka-offsets"}
    )
    try:
        low, high = consumer.get_watermark_offsets(
            confluent_kafka.TopicPartition("kafka-offsets", 0), timeout=CALL_TIMEOUT_S
        )
        assert (low, high) == (0, 10)
        found = consumer.offsets_for_times(
            [confluent_kafka.TopicPartition("kafka-offsets", 0, 0)], timeout=CALL_TIMEOUT_S
        )
        assert found[0].offset == 0, "the first record with a timestamp >= 0"
    finally:
        consumer.close()


def test_aiokafka_admin_creates_grows_describes_and_deletes_topics(cluster):
    import asyncio

    from aiokafka.admin import AIOKafkaAdminClient, NewPartitions, NewTopic
    from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

    async def main() -> None:
        admin = AIOKafkaAdminClient(bootstrap_servers=cluster.kafka_bootstrap(), request_timeout_ms=10_000)
        await asyncio.wait_for(admin.start(), CALL_TIMEOUT_S)
        try:
            await asyncio.wait_for(
                admin.create_topics(
                    [NewTopic("kafka-admin", 2, 3, topic_configs={"retention.ms": "3600000"})]
                ),
                CALL_TIMEOUT_S,
            )
            with Admin(cluster.gateway_address, **FAST) as ours:
                (described,) = ours.describe_topics(["kafka-admin"])
            assert len(described.partitions) == 2
            assert all(len(p.replicas) == 3 for p in described.partitions)

            await asyncio.wait_for(
                admin.create_partitions({"kafka-admin": NewPartitions(total_count=4)}), CALL_TIMEOUT_S
            )
            deadline = time.monotonic() + CALL_TIMEOUT_S
            while time.monotonic() < deadline:
                with Admin(cluster.gateway_address, **FAST) as ours:
                    (described,) = ours.describe_topics(["kafka-admin"])
                if len(described.partitions) == 4:
                    break
                await asyncio.sleep(0.1)
            assert len(described.partitions) == 4

            configs = None
            deadline = time.monotonic() + CALL_TIMEOUT_S
            while time.monotonic() < deadline:  # the broker learns the topic from UpdateMetadata
                (answer,) = await asyncio.wait_for(
                    admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, "kafka-admin")]),
                    CALL_TIMEOUT_S,
                )
                (resource,) = answer.resources
                if resource[0] == 0:
                    configs = {entry[0]: entry[1] for entry in resource[4]}
                    break
                await asyncio.sleep(0.1)
            assert configs is not None and configs["retention.ms"] == "3600000"

            await asyncio.wait_for(admin.delete_topics(["kafka-admin"]), CALL_TIMEOUT_S)
            deadline = time.monotonic() + CALL_TIMEOUT_S
            while time.monotonic() < deadline:
                with Admin(cluster.gateway_address, **FAST) as ours:
                    names = {t.name for t in ours.describe_topics()}
                if "kafka-admin" not in names:
                    break
                await asyncio.sleep(0.1)
            assert "kafka-admin" not in names
        finally:
            await asyncio.wait_for(admin.close(), CALL_TIMEOUT_S)

    asyncio.run(main())


def test_confluent_admin_errors_and_cluster_description(cluster):
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": cluster.kafka_bootstrap()})
    created = admin.create_topics([NewTopic("kafka-admin-c", 1, 3)], operation_timeout=10)
    created["kafka-admin-c"].result(timeout=CALL_TIMEOUT_S)
    again = admin.create_topics([NewTopic("kafka-admin-c", 1, 3)], operation_timeout=10)
    with pytest.raises(confluent_kafka.KafkaException) as info:
        again["kafka-admin-c"].result(timeout=CALL_TIMEOUT_S)
    assert info.value.args[0].code() == confluent_kafka.KafkaError.TOPIC_ALREADY_EXISTS
    bad = admin.create_topics([NewTopic("kafka-admin-bad", 1, 7)], operation_timeout=10)
    with pytest.raises(confluent_kafka.KafkaException) as info:
        bad["kafka-admin-bad"].result(timeout=CALL_TIMEOUT_S)
    assert info.value.args[0].code() == confluent_kafka.KafkaError.INVALID_REPLICATION_FACTOR
    description = admin.describe_cluster(request_timeout=10).result(timeout=CALL_TIMEOUT_S)
    assert sorted(n.id for n in description.nodes) == [1, 2, 3]
    assert description.cluster_id


def test_offsets_committed_over_kafka_are_the_groups_offsets_and_the_reverse(cluster):
    create(cluster, "kafka-commits", partitions=2)
    group = "kafka-commits-group"
    tp = confluent_kafka.TopicPartition
    consumer = confluent_kafka.Consumer(
        {"bootstrap.servers": cluster.kafka_bootstrap(), "group.id": group, "enable.auto.commit": False}
    )
    try:
        consumer.assign([tp("kafka-commits", 0), tp("kafka-commits", 1)])
        committed = consumer.commit(
            offsets=[tp("kafka-commits", 0, 7), tp("kafka-commits", 1, 3)], asynchronous=False
        )
        assert all(c.error is None for c in committed)
        got = consumer.committed([tp("kafka-commits", 0), tp("kafka-commits", 1)], timeout=CALL_TIMEOUT_S)
        assert [(c.partition, c.offset) for c in got] == [(0, 7), (1, 3)]
    finally:
        consumer.close()

    # The same group through the gateway: our Consumer sees the commit and commits over it.
    with Consumer(
        bootstrap=cluster.gateway_address, group_id=group, enable_auto_commit=False, **FAST
    ) as ours:
        assert ours.committed(TopicPartition("kafka-commits", 0)) == 7
        ours.commit({TopicPartition("kafka-commits", 1): 11})

    consumer = confluent_kafka.Consumer({"bootstrap.servers": cluster.kafka_bootstrap(), "group.id": group})
    try:
        (c,) = consumer.committed([tp("kafka-commits", 1)], timeout=CALL_TIMEOUT_S)
        assert c.offset == 11
    finally:
        consumer.close()
    consumer = confluent_kafka.Consumer(
        {"bootstrap.servers": cluster.kafka_bootstrap(), "group.id": "kafka-none"}
    )
    try:
        (missing,) = consumer.committed([tp("kafka-commits", 0)], timeout=CALL_TIMEOUT_S)
        assert missing.offset < 0, "nothing committed: Kafka's -1001 (OFFSET_INVALID)"
    finally:
        consumer.close()


@pytest.mark.slow
def test_kafka_producer_rides_through_a_leader_kill_with_every_acknowledged_record_kept(make_cluster):
    c = make_cluster(brokers=3)
    create(c, "kafka-failover", partitions=1)
    leader = leader_of(c, "kafka-failover", 0)
    bootstrap = ",".join(
        f"127.0.0.1:{c.processes[f'broker-{b}'].info['kafka_port']}" for b in (1, 2, 3) if b != leader
    )
    producer = confluent_kafka.Producer(
        {
            "bootstrap.servers": bootstrap,
            "enable.idempotence": True,
            "acks": "all",
            "message.timeout.ms": 30_000,
            "linger.ms": 5,
        }
    )
    acknowledged: list[bytes] = []
    failed: list[Any] = []

    def on_delivery(err: Any, msg: Any) -> None:
        if err:
            failed.append(err)
        else:
            acknowledged.append(msg.value())

    for i in range(2_000):
        if i == 500:
            producer.flush(CALL_TIMEOUT_S)
            c.kill_broker(leader)  # SIGKILL: the controller moves leadership once its lease expires
        producer.produce("kafka-failover", value=f"r{i}".encode(), partition=0, on_delivery=on_delivery)
        producer.poll(0)
        if i % 100 == 0:
            time.sleep(0.05)
    assert producer.flush(45) == 0, "every record delivered or failed within its timeout"
    assert not failed and len(acknowledged) == 2_000, "librdkafka retried through the failover"
    assert leader_of(c, "kafka-failover", 0) != leader

    consumer = confluent_kafka.Consumer({"bootstrap.servers": bootstrap, "group.id": "kafka-failover"})
    try:
        consumer.assign([confluent_kafka.TopicPartition("kafka-failover", 0, 0)])
        got: list[bytes] = []
        deadline = time.monotonic() + 30
        while len(got) < len(acknowledged) and time.monotonic() < deadline:
            m = consumer.poll(0.5)
            if m is not None and not m.error():
                got.append(m.value())
    finally:
        consumer.close()
    assert set(acknowledged) <= set(got), "no acknowledged record lost"
    assert len(got) == len(set(got)), "idempotence: no record written twice"


def test_confluent_consumers_share_a_topic_through_the_classic_group_protocol(cluster):
    create(cluster, "kafka-group", partitions=4)
    group = "kafka-classic"
    assigned: dict[str, set[int]] = {"a": set(), "b": set()}

    def consumer(name: str) -> Any:
        c = confluent_kafka.Consumer(
            {
                "bootstrap.servers": cluster.kafka_bootstrap(),
                "group.id": group,
                "auto.offset.reset": "earliest",
                "enable.auto.commit": False,
                "session.timeout.ms": 10_000,
                "heartbeat.interval.ms": 500,
            }
        )

        def on_assign(_: Any, partitions: list[Any]) -> None:
            assigned[name] = {p.partition for p in partitions}

        def on_revoke(_: Any, partitions: list[Any]) -> None:
            assigned[name] = set()

        c.subscribe(["kafka-group"], on_assign=on_assign, on_revoke=on_revoke)
        return c

    a, b = consumer("a"), consumer("b")
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not (assigned["a"] and assigned["b"]):
            a.poll(0.2)
            b.poll(0.2)
        assert assigned["a"] and assigned["b"], f"both members got partitions: {assigned}"
        assert assigned["a"].isdisjoint(assigned["b"]) and assigned["a"] | assigned["b"] == {0, 1, 2, 3}

        with Producer(cluster.gateway_address, **FAST) as producer:
            for i in range(200):
                producer.send("kafka-group", f"v{i}".encode(), partition=i % 4)
            producer.flush(timeout_ms=20_000)
        got: dict[str, list[Any]] = {"a": [], "b": []}
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and len(got["a"]) + len(got["b"]) < 200:
            for name, c in (("a", a), ("b", b)):
                m = c.poll(0.2)
                if m is not None and not m.error():
                    got[name].append(m)
        assert sorted(m.value() for m in got["a"] + got["b"]) == sorted(f"v{i}".encode() for i in range(200))
        assert {m.partition() for m in got["a"]} <= assigned["a"]
        a.commit(asynchronous=False)  # a member's commit, for its generation

        b.close()  # LeaveGroup: a takes every partition
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and assigned["a"] != {0, 1, 2, 3}:
            a.poll(0.2)
        assert assigned["a"] == {0, 1, 2, 3}
    finally:
        a.close()
    committed = {p: None for p in range(4)}
    with Consumer(
        bootstrap=cluster.gateway_address, group_id=group, enable_auto_commit=False, **FAST
    ) as ours:
        for p in range(4):
            committed[p] = ours.committed(TopicPartition("kafka-group", p))
    assert any(v for v in committed.values()), f"a's commit is the group's: {committed}"


@pytest.mark.slow
def test_a_classic_group_survives_its_coordinators_death(make_cluster):
    from services.kafka.classic_groups import coordinator_of

    c = make_cluster(brokers=3)
    create(c, "kafka-group-failover", partitions=2)
    group = "kafka-classic-failover"
    doomed = coordinator_of(group, [1, 2, 3])
    bootstrap = ",".join(
        f"127.0.0.1:{c.processes[f'broker-{b}'].info['kafka_port']}" for b in (1, 2, 3) if b != doomed
    )
    consumer = confluent_kafka.Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "auto.offset.reset": "earliest",
            "session.timeout.ms": 6_000,
            "heartbeat.interval.ms": 500,
        }
    )
    seen: set[bytes] = set()

    def produce(values: list[bytes]) -> None:
        with Producer(c.gateway_address, **FAST) as producer:
            for i, v in enumerate(values):
                producer.send("kafka-group-failover", v, partition=i % 2)
            producer.flush(timeout_ms=30_000)

    def consume_until(values: set[bytes], timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and not values <= seen:
            m = consumer.poll(0.2)
            if m is not None and not m.error():
                seen.add(m.value())

    try:
        consumer.subscribe(["kafka-group-failover"])
        before = [f"before-{i}".encode() for i in range(50)]
        produce(before)
        consume_until(set(before), 30)
        assert set(before) <= seen
        c.kill_broker(doomed)  # the group's coordinator, and leader of some partitions
        after = [f"after-{i}".encode() for i in range(50)]
        produce(after)
        consume_until(set(after), 60)
        assert set(after) <= seen, "the consumer found the new coordinator, rejoined and read on"
    finally:
        consumer.close()


def test_aiokafka_idempotent_producer_and_group_consumer(cluster):
    import asyncio

    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

    create(cluster, "kafka-aiokafka", partitions=2)
    sent = [f"a{i}".encode() for i in range(100)]

    async def main() -> list[bytes]:
        producer = AIOKafkaProducer(
            bootstrap_servers=cluster.kafka_bootstrap(),
            acks="all",
            enable_idempotence=True,
            request_timeout_ms=10_000,
        )
        await asyncio.wait_for(producer.start(), CALL_TIMEOUT_S)
        try:
            for value in sent:
                await asyncio.wait_for(producer.send_and_wait("kafka-aiokafka", value), CALL_TIMEOUT_S)
        finally:
            await asyncio.wait_for(producer.stop(), CALL_TIMEOUT_S)
        consumer = AIOKafkaConsumer(
            "kafka-aiokafka",
            bootstrap_servers=cluster.kafka_bootstrap(),
            group_id="kafka-aiokafka",
            auto_offset_reset="earliest",
            enable_auto_commit=False,
            request_timeout_ms=10_000,
        )
        await asyncio.wait_for(consumer.start(), CALL_TIMEOUT_S)
        got: list[bytes] = []
        try:
            deadline = time.monotonic() + 30
            while len(got) < len(sent) and time.monotonic() < deadline:
                batches = await asyncio.wait_for(consumer.getmany(timeout_ms=500), CALL_TIMEOUT_S)
                got.extend(m.value for ms in batches.values() for m in ms)
            await asyncio.wait_for(consumer.commit(), CALL_TIMEOUT_S)
        finally:
            await asyncio.wait_for(consumer.stop(), CALL_TIMEOUT_S)
        return got

    assert sorted(asyncio.run(main())) == sorted(sent)
    with Consumer(
        bootstrap=cluster.gateway_address, group_id="kafka-aiokafka", enable_auto_commit=False, **FAST
    ) as ours:
        committed = [ours.committed(TopicPartition("kafka-aiokafka", p)) for p in range(2)]
    assert sum(c or 0 for c in committed) == 100, "aiokafka's group commit is the group's offsets"


class KafkaMember:
    """A confluent-kafka group member in its own process (kafka_group_member_process.py)."""

    def __init__(self, name: str, bootstrap: str, topic: str, group: str, directory: Path) -> None:
        self.name = name
        self.history = directory / f"{name}.jsonl"
        self.history.touch()
        with open(directory / f"{name}.log", "w") as log:  # the child keeps its own descriptor
            self.process = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "tests.integration.kafka_group_member_process",
                    bootstrap,
                    topic,
                    group,
                    str(self.history),
                    str(GROUP_SESSION_MS),
                ],
                cwd=ROOT,
                stdout=subprocess.DEVNULL,
                stderr=log,
            )

    def events(self) -> list[dict[str, Any]]:
        # A line being written may be partial; it is read whole on the next call.
        lines = self.history.read_text().splitlines(keepends=True)
        return [json.loads(line) for line in lines if line.endswith("\n")]

    def assigned(self) -> set[int]:
        owned: set[int] = set()
        for ev in self.events():
            if ev["ev"] == "assigned":
                owned = set(ev["partitions"])
            elif ev["ev"] == "revoked":
                owned = set()
        return owned

    def read(self) -> list[tuple[int, int, int]]:
        """(time ms, partition, offset) of every record processed."""
        return [(ev["t"], ev["partition"], ev["offset"]) for ev in self.events() if ev["ev"] == "record"]

    def idle(self) -> bool:
        events = [ev for ev in self.events() if ev["ev"] in ("record", "idle")]
        return not events or events[-1]["ev"] == "idle"

    def stop(self) -> None:
        """By pid: SIGTERM (commit, leave), SIGKILL if it does not end in time."""
        if self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=CALL_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                os.kill(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=CALL_TIMEOUT_S)


GROUP_SESSION_MS = 6_000  # the smallest session the coordinator takes, so the test stays short
# How long after the session ends the partitions may take to reach the survivors: the expiry
# check, a rebalance with the survivors' revocation commits and the leader's assignment, on a
# loaded shared machine.
GROUP_MOVE_AFTER_SESSION_S_MAX = 25.0
ROOT = Path(__file__).resolve().parents[2]
# Forming the group (three joins, each a rebalance) and reading the records, on a loaded machine.
GROUP_STEP_TIMEOUT_S = 60.0


@pytest.mark.slow
def test_a_killed_confluent_group_members_partitions_move_and_committed_offsets_are_honoured(
    cluster, tmp_path
):
    topic, group, partitions = "kafka-group-kill", "kafka-classic-kill", 6
    create(cluster, topic, partitions=partitions)
    members: list[KafkaMember] = []  # every one started is stopped by pid in `finally`
    sent: set[tuple[int, str]] = set()

    def produce(prefix: str, count: int) -> None:
        with Producer(cluster.gateway_address, **FAST) as producer:
            for i in range(count):
                producer.send(topic, f"{prefix}-{i}".encode(), partition=i % partitions)
                sent.add((i % partitions, f"{prefix}-{i}"))
            producer.flush(timeout_ms=int(CALL_TIMEOUT_S * 1000))

    def consumed(among: list[KafkaMember]) -> set[tuple[int, str]]:
        return {(ev["partition"], ev["value"]) for m in among for ev in m.events() if ev["ev"] == "record"}

    try:
        for name in ("a", "b", "c"):
            members.append(KafkaMember(name, cluster.kafka_bootstrap(), topic, group, tmp_path))

        # A stable group of three before any record exists, so every record is read in one generation.
        def stable() -> bool:
            owned = [m.assigned() for m in members]
            return (
                all(owned)
                and sum(map(len, owned)) == partitions
                and set().union(*owned) == set(range(partitions))
            )

        wait_for(
            stable, timeout_s=GROUP_STEP_TIMEOUT_S, interval_s=0.1, what="three members sharing the topic"
        )
        produce("before", 47 * partitions)  # 94 a member: commits at 25, 50, 75; 19 uncommitted
        wait_for(
            lambda: consumed(members) >= sent and all(m.idle() for m in members),
            timeout_s=GROUP_STEP_TIMEOUT_S,
            interval_s=0.1,
            what="every record read, every member idle",
        )

        dead, survivors = members[0], members[1:]
        held = dead.assigned()
        committed: dict[int, int] = {}  # the group's committed offsets: the last commit per partition
        for m in members:
            for ev in m.events():
                if ev["ev"] == "commit":
                    committed.update({p: o for p, o in ev["offsets"]})
        dead_read_end = {p: max(o for _, q, o in dead.read() if q == p) + 1 for p in held}
        window = {(p, o) for p in held for o in range(committed.get(p, 0), dead_read_end[p])}
        killed_at_ms = int(time.time() * 1000)
        os.kill(dead.process.pid, signal.SIGKILL)  # no commit, no LeaveGroup: only its session ends
        dead.process.wait(timeout=CALL_TIMEOUT_S)

        produce("after", 20 * partitions)
        wait_for(
            lambda: set().union(*(m.assigned() for m in survivors)) == set(range(partitions)),
            timeout_s=GROUP_SESSION_MS / 1000 + GROUP_MOVE_AFTER_SESSION_S_MAX,
            interval_s=0.1,
            what="the killed member's partitions moved to the other two",
        )
        moved_after_s = (int(time.time() * 1000) - killed_at_ms) / 1000
        wait_for(
            lambda: consumed(members) >= sent,
            timeout_s=GROUP_STEP_TIMEOUT_S,
            interval_s=0.1,
            what="every produced record consumed",
        )
    finally:
        for m in members:
            m.stop()

    # Its partitions reached the survivors only when its session ended (no LeaveGroup was sent).
    assert moved_after_s >= (GROUP_SESSION_MS - 1_000) / 1000, f"moved after {moved_after_s} s"
    survivors_read = [(p, o) for m in survivors for t, p, o in m.read() if t >= killed_at_ms]
    for p in held:
        first = min(o for q, o in survivors_read if q == p)
        assert first == committed.get(p, 0), f"partition {p} resumed at the group's committed offset"
    reads = collections.Counter((p, o) for m in members for _, p, o in m.read())
    again = {place for place, times in reads.items() if times > 1}
    assert again == window, "read twice: exactly what the killed member read and did not commit"
    assert consumed(members) == sent, "every produced record consumed"
