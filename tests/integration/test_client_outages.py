"""The Python clients through an outage, as a Kafka user expects (issue 21).

Real processes on 127.0.0.1 (one cluster for the module: etcd, a controller, 3 brokers, a
gateway). Each test stops the gateway (and the topic's leader where it matters) for longer
than the timeouts under test, then restores the cluster before it ends, and checks that:
- send() to an uncached topic waits max_block_ms, not connect_timeout_ms, then says so;
- a record fails within delivery_timeout_ms, its callback getting the record that failed;
- commit() retries through the outage within its timeout, then raises a timeout;
- poll(timeout_ms) returns within its timeout whatever the cluster does;
- nothing acknowledged is lost and nothing is written twice (read back and compared);
- flush()/close() refuse a positional timeout (confluent-kafka's seconds).

Every timeout is measured with time.monotonic() and must hold to within 10 %; every wait
is bounded.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from clients import Admin, AsyncConsumer, AsyncProducer, Consumer, FailedRecord, Producer, TopicPartition
from clients.common import errors
from clients.types import RecordMetadata
from tests.integration.conftest import TestCluster
from tests.integration.helpers import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.slow]

# Short client timeouts so that an outage longer than them stays short too.
CONNECT_TIMEOUT_MS = 1_000
REQUEST_TIMEOUT_MS = 2_000
FAST: dict[str, Any] = {
    "request_timeout_ms": REQUEST_TIMEOUT_MS,
    "connect_timeout_ms": CONNECT_TIMEOUT_MS,
    "retry_backoff_ms": 50,
}
# Every timeout must hold to within this fraction of itself.
TOLERANCE = 0.10
# How long a test waits for the cluster to come back (leader elected, ISR full).
RECOVERY_TIMEOUT_S = 30.0
# How long a call that rides out an outage is watched before the cluster is restored: longer
# than connect_timeout_ms, after which the old clients gave up with GatewayUnavailable.
STILL_WAITING_S = 1.5 * CONNECT_TIMEOUT_MS / 1000


def create(cluster: TestCluster, topic: str) -> None:
    with Admin(cluster.gateway_address, request_timeout_ms=10_000) as admin:
        admin.create_topics(topic, 1, 3, {"min.insync.replicas": "2"})


def leader_and_isr(cluster: TestCluster, topic: str) -> tuple[int, tuple[int, ...]]:
    with Admin(cluster.gateway_address, request_timeout_ms=5_000) as admin:
        partition = admin.describe_topics(topic)[0].partitions[0]
    return partition.leader, partition.isr


def stop_gateway_and_leader(cluster: TestCluster, topic: str) -> int:
    """Kill the gateway and the leader of the topic's partition 0; the leader's id."""
    leader, _ = wait_for(
        lambda: (found := leader_and_isr(cluster, topic))[0] >= 0 and found,
        timeout_s=RECOVERY_TIMEOUT_S,
        what=f"a leader for {topic}",
    )
    cluster.kill_gateway()
    cluster.kill_broker(leader)
    return leader


def restore(cluster: TestCluster, topic: str, broker_id: int | None) -> None:
    """Start what was killed and wait until the partition has a leader and a full ISR again."""
    if not cluster.processes["gateway-1"].running:
        cluster.start_gateway()
    if broker_id is not None and not cluster.processes[f"broker-{broker_id}"].running:
        cluster.start_broker(broker_id)
    wait_for(
        lambda: (found := leader_and_isr(cluster, topic))[0] >= 0 and len(found[1]) == 3,
        timeout_s=RECOVERY_TIMEOUT_S,
        what=f"{topic}'s leader and full ISR after the outage",
    )


@contextlib.contextmanager
def outage(cluster: TestCluster, topic: str) -> Iterator[None]:
    """The gateway and the topic's leader stopped for the block; restored after it, even on failure."""
    leader = stop_gateway_and_leader(cluster, topic)
    try:
        yield
    finally:
        restore(cluster, topic, leader)


def read_back(cluster: TestCluster, topic: str) -> list[tuple[int, bytes | None]]:
    """Every record of partition 0 up to its high watermark: (offset, value)."""
    tp = TopicPartition(topic, 0)
    with Consumer(bootstrap=cluster.gateway_address, auto_offset_reset="earliest", **FAST) as consumer:
        consumer.assign([tp])
        end = consumer.end_offsets([tp])[tp]
        got: list[tuple[int, bytes | None]] = []
        deadline = time.monotonic() + RECOVERY_TIMEOUT_S
        while consumer.position(tp) < end:
            assert time.monotonic() < deadline, f"read {len(got)} records of {topic}, end offset {end}"
            got.extend((r.offset, r.value) for r in consumer.poll(timeout_ms=500))
    return got


def within(elapsed_s: float, expected_ms: int, what: str) -> None:
    expected_s = expected_ms / 1000
    print(f"{what}: {elapsed_s * 1000:.0f} ms (expected {expected_ms} ms ± {TOLERANCE:.0%})")  # with -s
    assert expected_s * (1 - TOLERANCE) <= elapsed_s <= expected_s * (1 + TOLERANCE), (
        f"{what} took {elapsed_s * 1000:.0f} ms, expected {expected_ms} ms ± {TOLERANCE:.0%}"
    )


def run_in_thread(call: Callable[[], Any]) -> tuple[threading.Thread, dict[str, Any]]:
    """Run `call` on a thread; the dict gets 'result' or 'error' when it ends."""
    outcome: dict[str, Any] = {}

    def target() -> None:
        try:
            outcome["result"] = call()
        except BaseException as exc:  # handed to the test thread
            outcome["error"] = exc

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread, outcome


# --- 1. send() waits max_block_ms for metadata --------------------------------------


def test_first_send_to_a_topic_waits_max_block_ms_then_names_it(cluster: TestCluster) -> None:
    max_block_ms = 3_000
    create(cluster, "outage-meta")
    with Producer(cluster.gateway_address, max_block_ms=max_block_ms, **FAST) as producer:
        producer.partitions_for("outage-meta")  # the cluster answered once: what follows is an outage
        with outage(cluster, "outage-meta"):
            started = time.monotonic()
            with pytest.raises(errors.RequestTimedOut, match=f"max_block_ms={max_block_ms}") as caught:
                producer.send("outage-meta-uncached", b"v")
            within(time.monotonic() - started, max_block_ms, "send() to an uncached topic")
            assert "outage-meta-uncached" in str(caught.value)


def test_first_send_rides_out_an_outage_shorter_than_max_block_ms(cluster: TestCluster) -> None:
    create(cluster, "outage-meta-ride")
    with Producer(cluster.gateway_address, max_block_ms=30_000, **FAST) as producer:
        producer.partitions_for("outage-meta")  # cached; outage-meta-ride is not
        leader = stop_gateway_and_leader(cluster, "outage-meta-ride")
        try:
            thread, outcome = run_in_thread(
                lambda: producer.send("outage-meta-ride", b"after", partition=0).result(timeout=30)
            )
            thread.join(STILL_WAITING_S)
            assert thread.is_alive(), f"send() gave up during the outage: {outcome}"
        finally:
            restore(cluster, "outage-meta-ride", leader)
        thread.join(30)
        assert not thread.is_alive() and "error" not in outcome, outcome
        assert isinstance(outcome["result"], RecordMetadata)
    assert read_back(cluster, "outage-meta-ride") == [(outcome["result"].offset, b"after")]


# --- a paused leader costs writers its lease, not the request timeout ------------------------


@contextlib.contextmanager
def paused_broker(cluster: TestCluster, broker_id: int) -> Iterator[None]:
    """Broker `broker_id` stopped with SIGSTOP (and seen stopped) for the block, resumed after."""
    from tests.integration.test_replication import wait_stopped

    cluster.pause(f"broker-{broker_id}")
    try:
        pid = cluster.broker_pid(broker_id)
        assert pid is not None
        wait_stopped(pid)
        yield
    finally:
        cluster.resume(f"broker-{broker_id}")


def test_a_paused_leader_costs_an_idempotent_writer_the_lease_not_the_request_timeout(
    cluster: TestCluster,
) -> None:
    """SIGSTOP the leader with a Produce on its way: the request is never answered (the default
    request_timeout_ms is 30 s), but once the controller moves the leadership (after the
    broker's lease, TEST_LEASE_TTL_S) the producer sends the batch to the new leader. Writers
    wait at most the lease + 1 s; the batch is written once."""
    from tests.integration.conftest import TEST_LEASE_TTL_S

    topic = "outage-paused-leader"
    create(cluster, topic)
    with Producer(cluster.gateway_address, delivery_timeout_ms=60_000) as producer:
        assert producer.send(topic, b"before", partition=0).result(timeout=10).offset == 0
        leader, _ = leader_and_isr(cluster, topic)
        with paused_broker(cluster, leader):
            started = time.monotonic()
            metadata = producer.send(topic, b"during", partition=0).result(timeout=30)
            took_s = time.monotonic() - started
        print(f"paused leader: the write took {took_s:.2f} s (lease {TEST_LEASE_TTL_S} s)")  # with -s
        assert took_s <= TEST_LEASE_TTL_S + 1.0, f"{took_s:.2f} s > lease {TEST_LEASE_TTL_S} s + 1 s"
        new_leader, _ = leader_and_isr(cluster, topic)
        assert new_leader != leader
    restore(cluster, topic, None)
    assert read_back(cluster, topic) == [(0, b"before"), (metadata.offset, b"during")]


# --- 2 and 5. delivery_timeout_ms, and the failed record in the callback ----------------


def test_delivery_timeout_fails_every_record_on_time_and_tells_which(cluster: TestCluster) -> None:
    topic = "outage-delivery"
    delivery_timeout_ms = 3_005  # the granularity the issue reported missed by 2 s
    create(cluster, topic)
    lock = threading.Lock()
    sent_at: dict[bytes, float] = {}
    outcomes: dict[bytes, tuple[float, RecordMetadata | FailedRecord, errors.HighwaterError | None]] = {}

    def on_delivery(
        value: bytes,
    ) -> Callable[[RecordMetadata | FailedRecord, errors.HighwaterError | None], None]:
        def callback(metadata: RecordMetadata | FailedRecord, error: errors.HighwaterError | None) -> None:
            with lock:
                outcomes[value] = (time.monotonic(), metadata, error)

        return callback

    def send(producer: Producer, value: bytes) -> None:
        with lock:
            sent_at[value] = time.monotonic()
        producer.send(topic, value, key=value, partition=0, callback=on_delivery(value))

    def settled(values: list[bytes]) -> bool:
        with lock:
            return all(value in outcomes for value in values)

    before = [f"before-{i}".encode() for i in range(20)]
    during = [f"during-{i}".encode() for i in range(20)]
    after = [f"after-{i}".encode() for i in range(20)]
    with Producer(
        cluster.gateway_address, delivery_timeout_ms=delivery_timeout_ms, linger_ms=5, **FAST
    ) as producer:
        for value in before:
            send(producer, value)
        producer.flush(timeout_ms=10_000)
        with outage(cluster, topic):
            # Four bursts: several batches, queued, in flight, retried, at different ages.
            for burst in range(4):
                for value in during[burst * 5 : burst * 5 + 5]:
                    send(producer, value)
                time.sleep(0.2)  # spreads the send times only: the assertions hold for any spacing
            wait_for(
                lambda: settled(during),
                timeout_s=delivery_timeout_ms / 1000 * (1 + TOLERANCE) + 1,
                what="every record sent during the outage to settle",
            )
        for value in after:
            send(producer, value)
        producer.flush(timeout_ms=20_000)
    for value in during:
        failed_at, metadata, error = outcomes[value]
        assert isinstance(error, errors.RequestTimedOut), (value, error)
        assert f"delivery_timeout_ms={delivery_timeout_ms}" in str(error)
        within(failed_at - sent_at[value], delivery_timeout_ms, f"failing {value!r}")
        assert isinstance(metadata, FailedRecord)
        assert (metadata.topic, metadata.partition, metadata.offset) == (topic, 0, -1)
        assert (metadata.key, metadata.value) == (value, value), "the callback can tell which record failed"
    acknowledged: dict[bytes, int] = {}
    for value in before + after:
        _, metadata, error = outcomes[value]
        assert error is None and isinstance(metadata, RecordMetadata), (value, error)
        acknowledged[value] = metadata.offset
    log = read_back(cluster, topic)
    values = [value for _, value in log]
    assert len(values) == len(set(values)), "nothing written twice"
    assert {value: offset for offset, value in log if value in acknowledged} == acknowledged, (
        "every acknowledged record is in the log once, at its acknowledged offset"
    )
    # The gateway was down for the whole outage, so no failed record reached a broker.
    assert not set(values) & set(during)


# --- 3. commit() retries within its timeout -----------------------------------------


def test_commit_retries_through_an_outage_then_times_out_on_time(cluster: TestCluster) -> None:
    topic, group = "outage-commit", "outage-commit-group"
    create(cluster, topic)
    tp = TopicPartition(topic, 0)
    commit_timeout_ms = 3_000
    with Consumer(
        bootstrap=cluster.gateway_address, group_id=group, enable_auto_commit=False, **FAST
    ) as consumer:
        consumer.assign([tp])
        consumer.commit({tp: 1})
        with outage(cluster, topic):
            started = time.monotonic()
            with pytest.raises(errors.RequestTimedOut, match="commit") as caught:
                consumer.commit({tp: 2}, timeout_ms=commit_timeout_ms)
            within(time.monotonic() - started, commit_timeout_ms, "commit(timeout_ms=3000) in an outage")
            assert "attempt" in str(caught.value) and "last error" in str(caught.value)
        assert consumer.committed(tp) == 1, "the timed-out commit changed nothing"
        # A commit that outlives the outage succeeds once the gateway is back.
        leader = stop_gateway_and_leader(cluster, topic)
        try:
            thread, outcome = run_in_thread(lambda: consumer.commit({tp: 3}, timeout_ms=30_000))
            thread.join(STILL_WAITING_S)
            assert thread.is_alive(), f"commit() gave up during the outage: {outcome}"
        finally:
            restore(cluster, topic, leader)
        thread.join(30)
        assert not thread.is_alive() and outcome.get("result") == {tp: 3}, outcome
        assert consumer.committed(tp) == 3


# --- 4. poll() returns within its timeout ------------------------------------------------


def test_poll_returns_within_its_timeout_during_an_outage_and_loses_nothing(cluster: TestCluster) -> None:
    topic, group = "outage-poll", "outage-poll-group"
    poll_timeout_ms = 1_000
    create(cluster, topic)
    tp = TopicPartition(topic, 0)
    produced: dict[int, bytes] = {}
    with Producer(cluster.gateway_address, **FAST) as producer:
        for i in range(50):
            value = f"first-{i}".encode()
            produced[producer.send(topic, value, partition=0).result(timeout=10).offset] = value
    consumed: dict[int, bytes | None] = {}
    with Consumer(
        bootstrap=cluster.gateway_address,
        group_id=group,
        auto_offset_reset="earliest",
        auto_commit_interval_ms=200,  # auto-commits run inside the outage's polls too
        **FAST,
    ) as consumer:
        consumer.assign([tp])
        deadline = time.monotonic() + RECOVERY_TIMEOUT_S
        while len(consumed) < 50:
            assert time.monotonic() < deadline, f"only {len(consumed)} of 50 records before the outage"
            consumed.update((r.offset, r.value) for r in consumer.poll(timeout_ms=500))
        leader = stop_gateway_and_leader(cluster, topic)
        try:
            durations = []
            for _ in range(3):  # the gateway and the leader down
                started = time.monotonic()
                assert consumer.poll(timeout_ms=poll_timeout_ms) == []
                durations.append(time.monotonic() - started)
            cluster.start_gateway()
            for _ in range(3):  # the gateway back, the leader still down (until its lease expires)
                started = time.monotonic()
                consumed.update((r.offset, r.value) for r in consumer.poll(timeout_ms=poll_timeout_ms))
                durations.append(time.monotonic() - started)
            measured_ms = [round(d * 1000) for d in durations]
            print(f"poll(timeout_ms={poll_timeout_ms}) in the outage: {measured_ms} ms")
            for number, elapsed in enumerate(durations):
                assert elapsed <= poll_timeout_ms / 1000 * (1 + TOLERANCE), (
                    f"poll {number} of the outage took {elapsed * 1000:.0f} ms: {durations}"
                )
            for elapsed in durations[:3]:  # nothing to return: it waits its whole timeout
                within(elapsed, poll_timeout_ms, "poll(timeout_ms=1000) with no gateway")
        finally:
            restore(cluster, topic, leader)
        with Producer(cluster.gateway_address, **FAST) as producer:
            for i in range(50):
                value = f"second-{i}".encode()
                produced[producer.send(topic, value, partition=0).result(timeout=10).offset] = value
        deadline = time.monotonic() + RECOVERY_TIMEOUT_S
        while len(consumed) < 100:
            assert time.monotonic() < deadline, f"only {len(consumed)} of 100 records after the outage"
            consumed.update((r.offset, r.value) for r in consumer.poll(timeout_ms=500))
        consumer.commit(timeout_ms=10_000)
        assert consumer.committed(tp) == max(produced) + 1
    assert consumed == produced, "every record read once, at the offset it was acknowledged at"
    assert read_back(cluster, topic) == sorted(produced.items()), "nothing lost or written twice"


# --- 6. timeouts are keyword-only ----------------------------------------------------------


def test_flush_and_close_refuse_a_positional_timeout() -> None:
    producer = Producer("127.0.0.1:1")  # never connects: flush and close have nothing to send
    try:
        for call in (lambda: producer.flush(10.0), lambda: producer.close(5_000)):
            with pytest.raises(TypeError, match=r"timeout_ms=.*milliseconds|milliseconds.*timeout_ms="):
                call()
        producer.flush(timeout_ms=100)
    finally:
        producer.close(timeout_ms=100)
    consumer = Consumer(bootstrap="127.0.0.1:1")
    try:
        with pytest.raises(TypeError, match="timeout_ms="):
            consumer.close(10.0)
    finally:
        consumer.close(timeout_ms=100)

    async def async_clients() -> None:
        async_producer = AsyncProducer("127.0.0.1:1")
        with pytest.raises(TypeError, match="timeout_ms="):
            await async_producer.flush(10.0)
        with pytest.raises(TypeError, match="timeout_ms="):
            await async_producer.close(10.0)
        await async_producer.close(timeout_ms=100)
        async_consumer = AsyncConsumer(bootstrap="127.0.0.1:1")
        with pytest.raises(TypeError, match="timeout_ms="):
            await async_consumer.close(10.0)
        await async_consumer.close(timeout_ms=100)

    asyncio.run(async_clients())


# --- 7. the Consumer fetches straight from the partition leaders --------------------------


def consume_offsets(
    consumer: Consumer, into: dict[TopicPartition, list[int]], counts: dict[TopicPartition, int]
) -> None:
    """poll() until each partition handed out `counts[tp]` records (bounded); offsets kept in order."""
    deadline = time.monotonic() + RECOVERY_TIMEOUT_S
    while any(len(into.get(tp, [])) < count for tp, count in counts.items()):
        assert time.monotonic() < deadline, f"not every record within {RECOVERY_TIMEOUT_S} s: {into}"
        for r in consumer.poll(timeout_ms=500):
            assert r.value == f"{r.partition}:{r.offset}".encode(), r
            into.setdefault(TopicPartition(r.topic, r.partition), []).append(r.offset)


def send_numbered(
    producer: Producer, topic: str, partitions: int, count: int, offsets: dict[int, int]
) -> None:
    """`count` records per partition, each value "partition:offset" (the offset it will get)."""
    for p in range(partitions):
        futures = []
        for _ in range(count):
            futures.append(producer.send(topic, f"{p}:{offsets.get(p, 0)}".encode(), partition=p))
            offsets[p] = offsets.get(p, 0) + 1
        for future in futures:
            future.result(timeout=RECOVERY_TIMEOUT_S)


def test_a_consumer_reads_from_the_leaders_while_the_gateway_is_stopped(cluster: TestCluster) -> None:
    topic = "outage-direct-consumer"
    with Admin(cluster.gateway_address, request_timeout_ms=10_000) as admin:
        admin.create_topics(topic, 3, 3, {"min.insync.replicas": "2"})
    tps = [TopicPartition(topic, p) for p in range(3)]
    offsets: dict[int, int] = {}
    got: dict[TopicPartition, list[int]] = {}
    with (
        Producer(cluster.gateway_address, **FAST) as producer,
        Consumer(bootstrap=cluster.gateway_address, auto_offset_reset="earliest", **FAST) as consumer,
    ):
        send_numbered(producer, topic, 3, 20, offsets)
        consumer.assign(tps)
        consumer.partitions_for_topic(topic)  # Metadata: where the leaders are
        consume_offsets(consumer, got, dict.fromkeys(tps, 20))
        cluster.kill_gateway()
        try:
            send_numbered(producer, topic, 3, 20, offsets)  # the producer goes to the leaders too
            consume_offsets(consumer, got, dict.fromkeys(tps, 40))
        finally:
            cluster.start_gateway()
    assert got == {tp: list(range(40)) for tp in tps}, "every record once, in order"


def test_a_consumer_reads_every_record_once_across_a_leader_change(cluster: TestCluster) -> None:
    topic = "outage-direct-leader-change"
    create(cluster, topic)
    tp = TopicPartition(topic, 0)
    offsets: dict[int, int] = {}
    got: dict[TopicPartition, list[int]] = {}
    with (
        Producer(cluster.gateway_address, **{**FAST, "delivery_timeout_ms": 60_000}) as producer,
        Consumer(bootstrap=cluster.gateway_address, auto_offset_reset="earliest", **FAST) as consumer,
    ):
        send_numbered(producer, topic, 1, 50, offsets)
        consumer.assign([tp])
        consumer.partitions_for_topic(topic)
        consume_offsets(consumer, got, {tp: 50})
        leader, _ = leader_and_isr(cluster, topic)
        assert consumer._async._metadata.leader_address(tp) is not None, "the leader is known"
        cluster.kill_broker(leader)  # its Fetch ahead is out: the consumer must move on
        try:
            send_numbered(producer, topic, 1, 50, offsets)  # to the new leader, once elected
            consume_offsets(consumer, got, {tp: 100})
            new_leader, _ = leader_and_isr(cluster, topic)
            assert new_leader not in (leader, -1)
        finally:
            restore(cluster, topic, leader)
        send_numbered(producer, topic, 1, 10, offsets)
        consume_offsets(consumer, got, {tp: 110})
    assert got == {tp: list(range(110))}, "every record once, in order"


def test_a_paused_leader_costs_a_reader_the_lease_not_the_request_timeout(cluster: TestCluster) -> None:
    """SIGSTOP the leader while the consumer's Fetch is out at it: that Fetch is never
    answered (request_timeout_ms is 30 s by default), but once Metadata names the new leader
    (after the broker's lease, TEST_LEASE_TTL_S) the consumer fetches there. The records
    written meanwhile are read within the lease + 2 s, each once and in order."""
    from tests.integration.conftest import TEST_LEASE_TTL_S

    topic = "outage-paused-leader-reader"
    create(cluster, topic)
    tp = TopicPartition(topic, 0)
    offsets: dict[int, int] = {}
    got: dict[TopicPartition, list[int]] = {}
    with (
        Producer(cluster.gateway_address, delivery_timeout_ms=60_000) as producer,
        Consumer(bootstrap=cluster.gateway_address, auto_offset_reset="earliest") as consumer,
    ):
        send_numbered(producer, topic, 1, 10, offsets)
        consumer.assign([tp])
        consume_offsets(consumer, got, {tp: 10})
        assert consumer.poll(timeout_ms=100) == []  # its next Fetch is out at the leader
        leader, _ = leader_and_isr(cluster, topic)
        assert consumer._async._metadata.leader_address(tp) is not None, "read from the leader"
        with paused_broker(cluster, leader):
            started = time.monotonic()
            send_numbered(producer, topic, 1, 5, offsets)  # at the new leader, after the lease
            consume_offsets(consumer, got, {tp: 15})
            took_s = time.monotonic() - started
        print(f"paused leader: read after {took_s:.2f} s (lease {TEST_LEASE_TTL_S} s)")  # with -s
        assert took_s <= TEST_LEASE_TTL_S + 2.0, f"{took_s:.2f} s > lease {TEST_LEASE_TTL_S} s + 2 s"
        new_leader, _ = leader_and_isr(cluster, topic)
        assert new_leader != leader
    restore(cluster, topic, None)
    assert got == {tp: list(range(15))}, "every record once, in order"
