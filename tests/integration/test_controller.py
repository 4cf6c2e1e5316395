"""The controller on real processes and etcd: failover, fencing, deletion, reassignment, rolling restarts."""

from __future__ import annotations

import asyncio
import json
import threading
import time

import grpc
import pytest

from clients import Producer
from coordinator.store import EtcdStore
from protos.highwater.v1 import common_pb2, controller_pb2_grpc
from services.controller.context import ControllerContext
from services.controller.metadata_image import load_image
from tests.integration.conftest import TEST_LEASE_TTL_S
from tests.integration.helpers import (
    create_topic,
    describe_partition,
    etcd_value,
    fetch_all,
    gateway_stub,
    produce,
    wait_for,
)

pytestmark = pytest.mark.integration


def active_controller_id(endpoint: str) -> int | None:
    raw = etcd_value(endpoint, "/highwater/controller")
    return json.loads(raw)["controller_id"] if raw else None


def test_standby_controller_takes_over_after_kill_and_the_cluster_keeps_working(make_cluster):
    c = make_cluster(brokers=3, controllers=2)
    gw = gateway_stub(c.gateway_address)
    first = active_controller_id(c.etcd_endpoint)
    epoch_before = int(etcd_value(c.etcd_endpoint, "/highwater/controller_epoch") or b"0")
    c.kill(f"controller-{first}")
    other = wait_for(
        lambda: (a := active_controller_id(c.etcd_endpoint)) not in (None, first) and a,
        timeout_s=TEST_LEASE_TTL_S + 5,
        what="the standby to take over",
    )
    assert int(etcd_value(c.etcd_endpoint, "/highwater/controller_epoch") or b"0") == epoch_before + 1
    # The new controller creates topics and handles a broker failure.
    result = wait_for(
        lambda: (r := create_topic(gw, "after-failover", partitions=2)).error_code == 0 and r,
        timeout_s=10,
        what="CreateTopics on the new controller",
    )
    assert result.error_code == 0
    assert produce(gw, "after-failover", 0, [b"x"]).error_code == 0
    old_leader = describe_partition(gw, "after-failover", 0).leader
    c.kill_broker(old_leader)
    wait_for(
        lambda: describe_partition(gw, "after-failover", 0).leader not in (-1, old_leader),
        timeout_s=TEST_LEASE_TTL_S + 5,
        what=f"controller {other} to fail over the partition",
    )


def test_paused_controller_resumed_after_its_ttl_is_fenced_and_changes_nothing(make_cluster):
    c = make_cluster(brokers=2, controllers=2)
    first = active_controller_id(c.etcd_endpoint)
    first_address = c.processes[f"controller-{first}"].address
    c.pause(f"controller-{first}")
    try:
        wait_for(
            lambda: active_controller_id(c.etcd_endpoint) not in (None, first),
            timeout_s=TEST_LEASE_TTL_S + 5,
            what="the standby to take over from the paused controller",
        )
        epoch_after_takeover = etcd_value(c.etcd_endpoint, "/highwater/controller_epoch")
    finally:
        c.resume(f"controller-{first}")
    stub = controller_pb2_grpc.ControllerServiceStub(grpc.insecure_channel(first_address))

    def refuses() -> bool:
        resp = stub.CreateTopics(
            common_pb2.CreateTopicsRequest(
                topics=[
                    common_pb2.CreatableTopic(name="from-the-deposed", num_partitions=1, replication_factor=1)
                ]
            ),
            timeout=5,
        )
        return resp.error_code == common_pb2.NOT_CONTROLLER

    wait_for(refuses, timeout_s=10, what="the resumed controller to stand down")
    resp = stub.DescribeCluster(common_pb2.DescribeClusterRequest(), timeout=5)
    assert resp.error_code == common_pb2.NOT_CONTROLLER
    assert resp.active_controller.controller_id != first
    assert etcd_value(c.etcd_endpoint, "/highwater/controller_epoch") == epoch_after_takeover
    assert etcd_value(c.etcd_endpoint, "/highwater/brokers/topics/from-the-deposed") is None


def test_deleted_topic_data_is_removed_from_every_broker_disk(make_cluster):
    c = make_cluster(brokers=3)
    gw = gateway_stub(c.gateway_address)
    assert create_topic(gw, "doomed", partitions=2).error_code == 0
    assert produce(gw, "doomed", 0, [b"a", b"b"]).error_code == 0
    dirs = [c.base_dir / f"broker-{b}" / f"doomed-{p}" for b in c.broker_ids for p in range(2)]
    assert all(d.is_dir() for d in dirs)
    resp = gw.DeleteTopics(common_pb2.DeleteTopicsRequest(names=["doomed"], timeout_ms=10_000))
    assert resp.topics[0].error_code == 0, resp.topics[0].error_message
    assert not any(d.exists() for d in dirs)
    assert etcd_value(c.etcd_endpoint, "/highwater/brokers/topics/doomed") is None
    md = gw.Metadata(common_pb2.MetadataRequest(topics=["doomed"]))
    assert md.topics[0].error_code == common_pb2.UNKNOWN_TOPIC_OR_PARTITION
    # The name can be used again.
    assert create_topic(gw, "doomed", partitions=1).error_code == 0


def _producer_loop(bootstrap: str, topic: str, stop: threading.Event, acked: list, failed: list) -> None:
    """A steady acks=all load through the client library (idempotent, retrying within its timeout)."""
    with Producer(
        bootstrap, acks="all", delivery_timeout_ms=30_000, request_timeout_ms=10_000, retry_backoff_ms=50
    ) as producer:
        i = 0
        while not stop.is_set():
            value = f"r{i}".encode()
            try:
                meta = producer.send(topic, value, partition=0).result(timeout=40)
                acked.append((meta.offset, value))
            except Exception as exc:  # every failure is recorded: the test expects none
                failed.append((value, repr(exc)))
            i += 1


def test_reassignment_under_load_loses_no_acknowledged_record(make_cluster):
    c = make_cluster(brokers=4)
    gw = gateway_stub(c.gateway_address)
    assignments = {0: common_pb2.ReplicaList(replicas=[1, 2, 3])}
    resp = gw.CreateTopics(
        common_pb2.CreateTopicsRequest(
            topics=[
                common_pb2.CreatableTopic(
                    name="moving",
                    num_partitions=-1,
                    replication_factor=-1,
                    assignments=assignments,
                    configs={"min.insync.replicas": "2"},
                )
            ]
        )
    )
    assert resp.topics[0].error_code == 0
    stop, acked, failed = threading.Event(), [], []
    loader = threading.Thread(target=_producer_loop, args=(c.gateway_address, "moving", stop, acked, failed))
    loader.start()
    try:
        wait_for(lambda: len(acked) >= 20, timeout_s=10, what="some acknowledged records")
        resp = gw.AlterPartitionReassignments(
            common_pb2.AlterPartitionReassignmentsRequest(
                topics=[
                    common_pb2.ReassignableTopic(
                        name="moving",
                        partitions=[common_pb2.ReassignablePartition(partition=0, replicas=[4, 3, 2])],
                    )
                ]
            )
        )
        assert resp.partitions[0].error_code == 0, resp.partitions[0].error_message
        wait_for(
            lambda: (
                not gw.ListPartitionReassignments(
                    common_pb2.ListPartitionReassignmentsRequest()
                ).reassignments
            ),
            timeout_s=30,
            what="the reassignment to finish",
        )
        count = len(acked)
        wait_for(lambda: len(acked) >= count + 20, timeout_s=10, what="writes after the move")
    finally:
        stop.set()
        loader.join(timeout=30)
    state = describe_partition(gw, "moving", 0)
    assert list(state.replicas) == [4, 3, 2]
    assert state.leader == 4, "the preferred replica of the new assignment leads"
    assert not (c.base_dir / "broker-1" / "moving-0").exists(), "the removed replica was deleted"
    records = {r.offset: r.value for r in fetch_all(gw, "moving", 0)}
    assert all(records.get(offset) == value for offset, value in acked)
    assert failed == []


def test_rolling_restart_with_controlled_shutdown_fails_no_produce_request(make_cluster):
    c = make_cluster(brokers=3)
    gw = gateway_stub(c.gateway_address)
    assert create_topic(gw, "rolling", partitions=1, configs={"min.insync.replicas": "2"}).error_code == 0
    stop, acked, failed = threading.Event(), [], []
    loader = threading.Thread(target=_producer_loop, args=(c.gateway_address, "rolling", stop, acked, failed))
    loader.start()
    try:
        for b in c.broker_ids:
            wait_for(
                lambda: len(describe_partition(gw, "rolling", 0).isr) == 3,
                timeout_s=30,
                what=f"a full ISR before bouncing broker {b}",
            )
            count = len(acked)
            started = time.monotonic()
            assert c.terminate(f"broker-{b}") == 0
            assert time.monotonic() - started < 10, "a controlled shutdown takes seconds, not a lease expiry"
            c.start_broker(b)
            wait_for(
                lambda n=count: len(acked) > n + 5, timeout_s=15, what=f"writes after bouncing broker {b}"
            )
    finally:
        stop.set()
        loader.join(timeout=30)
    assert failed == []
    records = {r.offset: r.value for r in fetch_all(gw, "rolling", 0)}
    assert all(records.get(offset) == value for offset, value in acked)


def etcd_put(endpoint: str, key: str, value: bytes) -> None:
    async def put() -> None:
        store = await EtcdStore.connect(endpoint)
        try:
            await store.put(key, value)
        finally:
            await store.close()

    asyncio.run(put())


def test_malformed_admin_json_is_refused_and_removed_and_the_controller_keeps_working(cluster):
    gw = gateway_stub(cluster.gateway_address)
    key = "/highwater/admin/reassign_partitions"
    etcd_put(cluster.etcd_endpoint, key, b"{this is not json")
    wait_for(
        lambda: etcd_value(cluster.etcd_endpoint, key) is None,
        timeout_s=10,
        what="the controller to remove the malformed request",
    )
    log_text = (cluster.base_dir / "logs" / "controller-1.log").read_text()
    assert "malformed reassignment JSON" in log_text
    assert create_topic(gw, "after-bad-admin", partitions=1, replication_factor=2).error_code == 0
    # A well-formed request written by hand is carried out, like Kafka's reassignment tool.
    target = [
        b for b in cluster.broker_ids if b not in describe_partition(gw, "after-bad-admin", 0).replicas
    ][:1]
    replicas = [*target, describe_partition(gw, "after-bad-admin", 0).leader]
    etcd_put(
        cluster.etcd_endpoint,
        key,
        json.dumps(
            {"version": 1, "partitions": [{"topic": "after-bad-admin", "partition": 0, "replicas": replicas}]}
        ).encode(),
    )
    wait_for(
        lambda: list(describe_partition(gw, "after-bad-admin", 0).replicas) == replicas,
        timeout_s=30,
        what="the hand-written reassignment to finish",
    )


def test_standby_that_followed_changes_takes_over_with_what_etcd_holds(make_cluster):
    """A standby keeps the metadata from etcd's watch (metadata_image.MetadataFollower); the
    changes made while it stood by — a topic created, one deleted, ISRs shrunk by a broker's
    controlled shutdown — are in what it takes over, which is what a fresh read of etcd gives."""
    c = make_cluster(brokers=3, controllers=2)
    gw = gateway_stub(c.gateway_address)
    assert create_topic(gw, "kept", partitions=3, replication_factor=3).error_code == 0
    assert create_topic(gw, "doomed", partitions=2, replication_factor=2).error_code == 0
    first = active_controller_id(c.etcd_endpoint)
    standby = next(p for p in c.by_kind("controller") if p.name != f"controller-{first}")
    wait_for(
        lambda: "now following" in standby.log_path.read_text(errors="replace"),
        timeout_s=10,
        what="the standby to load the metadata",
    )
    # Changes while it stands by.
    assert create_topic(gw, "fresh", partitions=4, replication_factor=2).error_code == 0
    deleted = gw.DeleteTopics(common_pb2.DeleteTopicsRequest(names=["doomed"], timeout_ms=20_000), timeout=30)
    assert deleted.topics[0].error_code == 0, deleted.topics[0].error_message
    assert c.terminate("broker-3") == 0
    wait_for(
        lambda: all(
            3 not in p.isr for p in gw.DescribeCluster(common_pb2.DescribeClusterRequest()).partitions
        ),
        timeout_s=10,
        what="broker 3 to leave every ISR",
    )
    c.terminate(f"controller-{first}")
    stub = controller_pb2_grpc.ControllerServiceStub(grpc.insecure_channel(standby.address))
    taken = wait_for(
        lambda: (
            (r := stub.DescribeCluster(common_pb2.DescribeClusterRequest(), timeout=5)).error_code == 0 and r
        ),
        timeout_s=10,
        what="the standby to take over",
    )
    assert "standby's metadata at revision" in standby.log_path.read_text(errors="replace")

    async def read_etcd() -> ControllerContext:
        store = await EtcdStore.connect(c.etcd_endpoint)
        try:
            return (await load_image(store)).context(controller_id=0, epoch=0)
        finally:
            await store.close()

    def picture(parts: list[common_pb2.PartitionState]) -> dict[tuple[str, int], tuple[object, ...]]:
        return {
            (p.topic, p.partition): (
                p.leader,
                p.leader_epoch,
                tuple(p.isr),
                tuple(p.replicas),
                p.partition_epoch,
            )
            for p in parts
        }

    etcd_now = asyncio.run(read_etcd())
    assert picture(list(taken.partitions)) == picture(
        [etcd_now.partition_state_proto(tp) for tp in etcd_now.partitions()]
    )
    assert {p.topic for p in taken.partitions} == {"kept", "fresh"}
    assert all(3 not in p.isr for p in taken.partitions)
    assert sorted(b.broker_id for b in taken.brokers) == [1, 2]
    # The new controller acts on what it took: broker 3 comes back and rejoins the ISRs.
    c.start_broker(3)
    wait_for(
        lambda: all(
            3 in p.isr
            for p in stub.DescribeCluster(common_pb2.DescribeClusterRequest(), timeout=5).partitions
            if 3 in p.replicas
        ),
        timeout_s=30,
        what="broker 3 to rejoin the ISRs under the new controller",
    )
    assert produce(gw, "fresh", 0, [b"after the takeover"]).error_code == 0
