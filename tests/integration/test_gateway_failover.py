"""Gateways and clients through failures: leader killed mid-stream, gateway restart, two gateways."""

from __future__ import annotations

import threading
import time

import pytest

from clients import Admin, Consumer, Producer, TopicPartition
from tests.integration.conftest import TEST_LEASE_TTL_S
from tests.integration.helpers import describe_partition, gateway_stub, wait_for

pytestmark = pytest.mark.integration

FAST = {"request_timeout_ms": 10_000, "connect_timeout_ms": 3_000, "retry_backoff_ms": 50}


def read_all(bootstrap: str, topic: str, partitions: int, expected: int, timeout_s: float = 30) -> list:
    with Consumer(bootstrap=bootstrap, auto_offset_reset="earliest", **FAST) as consumer:
        consumer.assign([TopicPartition(topic, p) for p in range(partitions)])
        got: list = []
        deadline = time.monotonic() + timeout_s
        while len(got) < expected and time.monotonic() < deadline:
            got.extend(consumer.poll(timeout_ms=500))
        return got


def test_leader_killed_mid_stream_idempotent_producer_leaves_no_duplicates_and_no_gaps(make_cluster):
    c = make_cluster(brokers=3)
    with Admin(c.gateway_address, **FAST) as admin:
        admin.create_topics("idem", 1, 3, {"min.insync.replicas": "2"})
    leader = describe_partition(gateway_stub(c.gateway_address), "idem", 0).leader
    sent: list[bytes] = []
    futures = []
    with Producer(c.gateway_address, delivery_timeout_ms=60_000, linger_ms=2, **FAST) as producer:
        for i in range(3000):
            value = f"{i:06d}".encode()
            futures.append(producer.send("idem", value, partition=0))
            sent.append(value)
            if i == 1000:
                c.kill_broker(leader)
            if i % 200 == 0:
                time.sleep(0.01)  # spread the stream over the failover
        producer.flush(timeout_ms=60_000)
        offsets = [f.result(timeout=60).offset for f in futures]
    assert sorted(offsets) == list(range(3000)), "every record acknowledged once, no gaps"
    values = [r.value for r in read_all(c.gateway_address, "idem", 1, 3000)]
    assert values == sent, "the consumer reads every record once, in order"


def test_committed_offsets_survive_a_gateway_restart(make_cluster):
    c = make_cluster(brokers=1)
    with Admin(c.gateway_address, **FAST) as admin:
        admin.create_topics("offsets", 2, 1)
    tp = TopicPartition("offsets", 1)
    with Consumer(bootstrap=c.gateway_address, **FAST) as consumer:
        consumer.subscribe(["offsets"], group_id="g1")
        consumer.commit({tp: 42})
    c.kill_gateway()
    c.start_gateway()
    with Consumer(bootstrap=c.gateway_address, **FAST) as consumer:
        consumer.subscribe(["offsets"], group_id="g1")
        assert consumer.committed(tp) == 42


def test_two_gateways_one_killed_and_the_client_carries_on(make_cluster):
    c = make_cluster(brokers=3, gateways=2)
    bootstrap = c.gateway_address  # both addresses
    assert "," in bootstrap
    with Admin(bootstrap, **FAST) as admin:
        admin.create_topics("two-gateways", 1, 3)
    acked: list[int] = []
    errors: list[BaseException] = []
    stop = threading.Event()

    def produce() -> None:
        with Producer(bootstrap, delivery_timeout_ms=30_000, **FAST) as producer:
            i = 0
            while not stop.is_set():
                try:
                    acked.append(producer.send("two-gateways", f"{i}".encode()).result(timeout=30).offset)
                except BaseException as exc:
                    errors.append(exc)
                i += 1

    loader = threading.Thread(target=produce)
    loader.start()
    try:
        wait_for(lambda: len(acked) >= 20, timeout_s=15, what="writes through either gateway")
        c.kill_gateway(1)
        count = len(acked)
        wait_for(
            lambda: len(acked) >= count + 20,
            timeout_s=TEST_LEASE_TTL_S + 15,
            what="writes carrying on through the second gateway",
        )
    finally:
        stop.set()
        loader.join(timeout=60)
    assert errors == []
    assert sorted(acked) == list(range(len(acked)))
