"""The walking skeleton on real processes: etcd, a controller, three brokers, a gateway."""

from __future__ import annotations

import json
import time

import pytest

from protos.highwater.v1 import common_pb2
from tests.integration.conftest import TEST_LEASE_TTL_S
from tests.integration.helpers import (
    create_topic,
    describe_partition,
    etcd_value,
    fetch_all,
    gateway_stub,
    partition_metadata,
    produce,
    wait_for,
)

pytestmark = pytest.mark.integration


def test_records_produced_with_acks_all_are_consumed_back_identical(cluster):
    gw = gateway_stub(cluster.gateway_address)
    assert create_topic(gw, "skeleton-roundtrip", configs={"min.insync.replicas": "2"}).error_code == 0
    values = [f"record-{i}".encode() for i in range(100)]
    res = produce(gw, "skeleton-roundtrip", 1, values[:60])
    assert (res.error_code, res.base_offset) == (common_pb2.NONE, 0)
    res = produce(gw, "skeleton-roundtrip", 1, values[60:])
    assert (res.error_code, res.base_offset) == (common_pb2.NONE, 60)
    records = fetch_all(gw, "skeleton-roundtrip", 1)
    assert [r.value for r in records] == values
    assert [r.offset for r in records] == list(range(100))


def test_describe_shows_the_leader_and_isr_stored_in_etcd(cluster):
    gw = gateway_stub(cluster.gateway_address)
    assert create_topic(gw, "skeleton-describe", partitions=2).error_code == 0
    for p in range(2):
        described = describe_partition(gw, "skeleton-describe", p)
        raw = etcd_value(
            cluster.etcd_endpoint, f"/highwater/brokers/topics/skeleton-describe/partitions/{p}/state"
        )
        assert raw is not None
        stored = json.loads(raw)
        assert described.leader == stored["leader"]
        assert list(described.isr) == stored["isr"]
        assert described.leader_epoch == stored["leader_epoch"]
        assert described.leader in described.replicas
        assert sorted(described.isr) == sorted(described.replicas)


def test_bad_topic_requests_get_named_errors(cluster):
    gw = gateway_stub(cluster.gateway_address)
    bad_name = create_topic(gw, "no spaces/allowed")
    assert bad_name.error_code == common_pb2.INVALID_TOPIC
    assert "may contain only" in bad_name.error_message
    too_many = create_topic(gw, "skeleton-rf5", replication_factor=5)
    assert too_many.error_code == common_pb2.INVALID_REPLICATION_FACTOR
    assert "3 live brokers" in too_many.error_message
    assert create_topic(gw, "skeleton-twice").error_code == common_pb2.NONE
    assert create_topic(gw, "skeleton-twice").error_code == common_pb2.TOPIC_ALREADY_EXISTS
    unknown = produce(gw, "skeleton-no-such-topic", 0, [b"x"])
    assert unknown.error_code == common_pb2.UNKNOWN_TOPIC_OR_PARTITION
    no_partition = produce(gw, "skeleton-twice", 7, [b"x"])
    assert no_partition.error_code == common_pb2.UNKNOWN_TOPIC_OR_PARTITION
    assert "no partition 7" in no_partition.error_message
    impossible_isr = create_topic(
        gw, "skeleton-minisr", replication_factor=2, configs={"min.insync.replicas": "3"}
    )
    assert impossible_isr.error_code == common_pb2.INVALID_REPLICATION_FACTOR


def test_killed_broker_registration_disappears_within_the_lease_ttl(make_cluster):
    c = make_cluster(brokers=2)
    key = "/highwater/brokers/ids/2"
    assert etcd_value(c.etcd_endpoint, key) is not None
    c.kill_broker(2)
    killed_at = time.monotonic()
    wait_for(
        lambda: etcd_value(c.etcd_endpoint, key) is None,
        timeout_s=TEST_LEASE_TTL_S + 3,
        what="the killed broker's /brokers/ids key to expire",
    )
    # etcd checks expiry every 500 ms, so allow a second past the TTL.
    assert time.monotonic() - killed_at <= TEST_LEASE_TTL_S + 1.5


def test_leader_killed_acknowledged_records_survive_at_their_offsets(make_cluster):
    c = make_cluster(brokers=3)
    gw = gateway_stub(c.gateway_address)
    assert create_topic(gw, "failover", partitions=1, configs={"min.insync.replicas": "2"}).error_code == 0
    acked: list[tuple[int, bytes]] = []
    for i in range(20):
        values = [f"v{i}-{j}".encode() for j in range(5)]
        res = produce(gw, "failover", 0, values)
        assert res.error_code == common_pb2.NONE
        acked.extend((res.base_offset + j, v) for j, v in enumerate(values))
    old = partition_metadata(gw, "failover", 0)
    c.kill_broker(old.leader)
    new = wait_for(
        lambda: (m := describe_partition(gw, "failover", 0)).leader not in (-1, old.leader) and m,
        timeout_s=TEST_LEASE_TTL_S + 5,
        what="a new leader",
    )
    assert new.leader in old.isr
    assert new.leader_epoch > old.leader_epoch
    # The new leader accepts acks=all writes (two live ISR members remain).
    res = wait_for(
        lambda: (r := produce(gw, "failover", 0, [b"after"])).error_code == 0 and r,
        timeout_s=10,
        what="acks=all writes on the new leader",
    )
    assert res.base_offset == len(acked)
    records = fetch_all(gw, "failover", 0)
    assert [(r.offset, r.value) for r in records[: len(acked)]] == acked


def test_acks_all_below_min_insync_replicas_is_refused_and_writes_nothing(make_cluster):
    c = make_cluster(brokers=3)
    gw = gateway_stub(c.gateway_address)
    assert create_topic(gw, "minisr", partitions=1, configs={"min.insync.replicas": "2"}).error_code == 0
    assert produce(gw, "minisr", 0, [b"before"]).error_code == 0
    leader = partition_metadata(gw, "minisr", 0).leader
    followers = [b for b in c.broker_ids if b != leader]
    for b in followers:
        c.kill_broker(b)
    wait_for(
        lambda: list(describe_partition(gw, "minisr", 0).isr) == [leader],
        timeout_s=TEST_LEASE_TTL_S + 5,
        what="the ISR to shrink to the leader",
    )
    refused = produce(gw, "minisr", 0, [b"refused"])
    assert refused.error_code == common_pb2.NOT_ENOUGH_REPLICAS
    assert "min.insync.replicas=2" in refused.error_message
    # acks=1 still works, and the refused record is nowhere in the log.
    assert produce(gw, "minisr", 0, [b"acks1"], acks=1).error_code == 0
    values = [r.value for r in fetch_all(gw, "minisr", 0)]
    assert b"refused" not in values
    assert values == [b"before", b"acks1"]
