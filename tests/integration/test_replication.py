"""Replication on real processes: failover, log identity, ISR shrink and expand, truncation, idempotence.

DESIGN.md section 6 and the invariants of section 8 this file checks:
4 (acks=all waits for the ISR), 5 (a clean election picks from the ISR),
6 (after truncation a follower's log is a prefix of its leader's: here, byte for
byte identical below the HW, since followers copy the leader's batches with the
partitionLeaderEpoch already patched in), 7 (an acknowledged record keeps its
offset) and 8 (the idempotent producer writes nothing twice).

Logs are compared as files: each replica's segment bytes are cut where the HW
offset starts (found by walking batch headers), so a follower that kept a
divergent suffix, or holds different bytes anywhere below the HW, fails.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from clients.common.record_batch import iter_batch_headers
from clients.common.records import Record, encode_batch
from coordinator.store import EtcdStore, KeyValue
from protos.highwater.v1 import common_pb2
from tests.integration.conftest import TEST_LEASE_TTL_S
from tests.integration.helpers import (
    create_topic,
    describe_partition,
    fetch_all,
    gateway_stub,
    produce,
    wait_for,
)

pytestmark = pytest.mark.integration

# A failover: the dead leader's lease expires, the controller elects, the gateway re-routes.
FAILOVER_TIMEOUT_S = TEST_LEASE_TTL_S + 10
# A restarted broker: process start, registration, LeaderAndIsr, truncation, catching up.
CATCH_UP_TIMEOUT_S = 30.0


# ---- helpers -----------------------------------------------------------------------------------


def etcd_kv(endpoint: str, key: str) -> KeyValue | None:
    async def get() -> KeyValue | None:
        store = await EtcdStore.connect(endpoint)
        try:
            return await store.get(key)
        finally:
            await store.close()

    return asyncio.run(get())


def high_watermark(gw, topic: str, partition: int) -> int:
    """The leader's HW (ListOffsets with the latest timestamp answers it), -1 while unavailable."""
    resp = gw.ListOffsets(
        common_pb2.ListOffsetsRequest(
            replica_id=-1,
            topics=[
                common_pb2.ListOffsetsTopic(
                    topic=topic,
                    partitions=[
                        common_pb2.ListOffsetsPartition(
                            partition=partition, timestamp=-1, current_leader_epoch=-1
                        )
                    ],
                )
            ],
        )
    )
    pr = resp.topics[0].partitions[0]
    return pr.offset if pr.error_code == common_pb2.NONE else -1


def log_bytes_below(partition_dir: Path, offset: int) -> bytes | None:
    """The replica's segment bytes holding offsets [log start, offset), cut at the batch where
    `offset` starts; None while the replica does not hold them all yet."""
    data = b"".join(path.read_bytes() for path in sorted(partition_dir.glob("*.log")))
    end_offset = None
    for header in iter_batch_headers(data):
        if header.base_offset >= offset:
            return data[: header.position] if header.base_offset == offset else None
        end_offset = header.next_offset
        if end_offset == offset:
            return data[: header.end_position]
    return b"" if offset == 0 and end_offset is None else None


def wait_logs_identical_below_hw(c, gw, topic: str, brokers: list[int], expected_hw: int) -> bytes:
    """Wait until the HW reaches expected_hw and every listed replica holds the same bytes below it."""
    dirs = {b: c.base_dir / f"broker-{b}" / f"{topic}-0" for b in brokers}
    last: dict[int, int | None] = {}

    def identical() -> bytes | None:
        hw = high_watermark(gw, topic, 0)
        if hw != expected_hw:
            return None
        prefixes = {b: log_bytes_below(d, hw) for b, d in dirs.items()}
        last.clear()
        last.update({b: None if p is None else len(p) for b, p in prefixes.items()})
        first = prefixes[brokers[0]]
        if first is None or any(p != first for p in prefixes.values()):
            return None
        return first

    try:
        return wait_for(
            identical, timeout_s=CATCH_UP_TIMEOUT_S, what=f"{topic}-0 identical on brokers {brokers}"
        )
    except AssertionError as exc:
        raise AssertionError(
            f"{exc}; HW {high_watermark(gw, topic, 0)} (want {expected_hw}), bytes below it "
            f"per broker: {last}"
        ) from None


def wait_stopped(pid: int) -> None:
    """SIGSTOP takes effect when each thread next enters the kernel: wait until every thread is stopped."""

    def stopped() -> bool:
        states = []
        for task in Path(f"/proc/{pid}/task").iterdir():
            with contextlib.suppress(FileNotFoundError):
                stat = (task / "stat").read_text()
                states.append(stat[stat.rindex(")") + 2])
        return bool(states) and all(s in "tT" for s in states)

    wait_for(stopped, timeout_s=5, what=f"every thread of pid {pid} to stop")


@contextlib.contextmanager
def paused(c, brokers: list[int]) -> Iterator[None]:
    """SIGSTOP the brokers for the block (SIGCONT on the way out, also on failure)."""
    try:
        for b in brokers:
            c.pause(f"broker-{b}")
        for b in brokers:
            wait_stopped(c.broker_pid(b))
        yield
    finally:
        for b in brokers:
            c.resume(f"broker-{b}")


def append_only_on_leader(gw, topic: str, values: list[bytes]) -> int:
    """With every follower paused: write a batch (acks=1) that no follower can receive;
    return its base offset.

    A follower's long-poll Fetch may be waiting on the leader when it was paused, and
    the leader answers it with the next append. A first, draining batch completes those
    waiting fetches; a paused follower sends no new one, so the second batch stays on
    the leader alone.
    """
    drain = produce(gw, topic, 0, [b"drains the waiting follower fetches"], acks=1)
    assert drain.error_code == common_pb2.NONE, drain.error_message
    res = produce(gw, topic, 0, values, acks=1)
    assert res.error_code == common_pb2.NONE, res.error_message
    return res.base_offset


def produce_acked(gw, topic: str, values: list[bytes], *, acks: int = -1) -> int:
    res = wait_for(
        lambda: (r := produce(gw, topic, 0, values, acks=acks)).error_code == common_pb2.NONE and r,
        timeout_s=FAILOVER_TIMEOUT_S,
        what=f"an acks={acks} write to {topic}-0",
    )
    return res.base_offset


def new_leader(gw, topic: str, old: common_pb2.PartitionState) -> common_pb2.PartitionState:
    return wait_for(
        lambda: (s := describe_partition(gw, topic, 0)).leader not in (-1, old.leader) and s,
        timeout_s=FAILOVER_TIMEOUT_S,
        what=f"a leader of {topic}-0 other than {old.leader}",
    )


def broker_log(c, broker_id: int) -> str:
    return c.processes[f"broker-{broker_id}"].log_path.read_text(errors="replace")


# ---- leader failover: committed data kept, replicas byte-identical -----------------------------


def test_leader_killed_new_leader_from_isr_and_every_replica_byte_identical_below_hw(make_cluster):
    c = make_cluster(brokers=3)
    gw = gateway_stub(c.gateway_address)
    topic = "identical"
    assert create_topic(gw, topic, partitions=1, configs={"min.insync.replicas": "2"}).error_code == 0
    acked: dict[int, bytes] = {}
    for i in range(40):
        values = [f"before-{i}-{j}-".encode() + bytes(range(i, i + 50)) for j in range(i % 7 + 1)]
        acked.update((produce_acked(gw, topic, values) + j, v) for j, v in enumerate(values))
    old = describe_partition(gw, topic, 0)
    assert sorted(old.isr) == [1, 2, 3]
    followers = [b for b in old.replicas if b != old.leader]

    # Leave an uncommitted suffix on the leader alone, then crash it: the new leader never had
    # that suffix, so the old leader must truncate it away when it comes back (KIP-101).
    with paused(c, followers):
        divergent_offset = append_only_on_leader(gw, topic, [b"only-on-the-old-leader"] * 3)
        c.kill_broker(old.leader)

    elected = new_leader(gw, topic, old)
    assert elected.leader in old.isr, "a clean election picks a leader from the ISR"
    assert elected.leader_epoch > old.leader_epoch
    assert sorted(elected.isr) == sorted(followers)
    for i in range(10):
        values = [f"after-{i}-{j}".encode() for j in range(5)]
        acked.update((produce_acked(gw, topic, values) + j, v) for j, v in enumerate(values))
    records = fetch_all(gw, topic, 0)
    by_offset = {r.offset: r.value for r in records}
    assert all(by_offset.get(offset) == value for offset, value in acked.items()), (
        "every acks=all record is readable at its original offset after the failover"
    )
    assert b"only-on-the-old-leader" not in by_offset.values(), (
        "set-up: the suffix written while the followers were paused must not have reached them"
    )
    end = records[-1].offset + 1
    assert end > divergent_offset, "the new leader has written over the old leader's divergent offsets"

    wait_logs_identical_below_hw(c, gw, topic, followers, end)
    c.start_broker(old.leader)
    wait_for(
        lambda: sorted(describe_partition(gw, topic, 0).isr) == [1, 2, 3],
        timeout_s=CATCH_UP_TIMEOUT_S,
        what=f"broker {old.leader} back in the ISR",
    )
    identical = wait_logs_identical_below_hw(c, gw, topic, [1, 2, 3], end)
    assert len(identical) > 0
    assert f"truncating {topic}-0 from" in broker_log(c, old.leader), (
        "the old leader truncated its divergent suffix after OffsetsForLeaderEpoch"
    )
    final = {r.offset: r.value for r in fetch_all(gw, topic, 0)}
    assert all(final.get(offset) == value for offset, value in acked.items())


# ---- ISR shrink on replica.lag.time.max.ms, expand on catching up ------------------------------

REPLICA_LAG_TIME_MAX_MS = 2_000
# Longer than the pause, so the follower keeps its registration: the shrink must come from the
# leader's lag rule (AlterPartition), not from the controller reacting to a lease expiry.
PAUSE_TEST_LEASE_TTL_S = 10


def _produce_loop(
    gw,
    topic: str,
    stop: threading.Event,
    acked: list[tuple[int, bytes]],
    failed: list[tuple[bytes, str, str]],
) -> None:
    i = 0
    while not stop.is_set():
        value = f"r{i}".encode()
        res = produce(gw, topic, 0, [value], timeout_ms=15_000)
        if res.error_code == common_pb2.NONE:
            acked.append((res.base_offset, value))
        else:
            failed.append((value, common_pb2.ErrorCode.Name(res.error_code), res.error_message))
        i += 1


def test_paused_follower_leaves_the_isr_by_lag_and_rejoins_after_resume_while_acks_all_writes_go_on(
    make_cluster,
):
    c = make_cluster(
        brokers=3, replica_lag_time_max_ms=REPLICA_LAG_TIME_MAX_MS, lease_ttl_s=PAUSE_TEST_LEASE_TTL_S
    )
    gw = gateway_stub(c.gateway_address)
    topic = "lagging"
    assert create_topic(gw, topic, partitions=1, configs={"min.insync.replicas": "2"}).error_code == 0
    before = describe_partition(gw, topic, 0)
    follower = next(b for b in before.replicas if b != before.leader)
    registration = etcd_kv(c.etcd_endpoint, f"/highwater/brokers/ids/{follower}")
    assert registration is not None
    stop, acked, failed = threading.Event(), [], []
    loader = threading.Thread(target=_produce_loop, args=(gw, topic, stop, acked, failed), daemon=True)
    loader.start()
    try:
        wait_for(lambda: len(acked) >= 20, timeout_s=15, what="acks=all writes with the full ISR")
        with paused(c, [follower]):
            paused_at = time.monotonic()
            shrunk = wait_for(
                lambda: follower not in (s := describe_partition(gw, topic, 0)).isr and s,
                timeout_s=PAUSE_TEST_LEASE_TTL_S - 3,
                what=f"paused broker {follower} to leave the ISR",
            )
            shrink_after_s = time.monotonic() - paused_at
            count = len(acked)
            wait_for(
                lambda: len(acked) >= count + 20,
                timeout_s=10,
                what="acks=all writes with the follower still paused and out of the ISR",
            )
        assert shrunk.leader == before.leader
        assert shrunk.leader_epoch == before.leader_epoch, "an AlterPartition shrink keeps the leader epoch"
        assert sorted(shrunk.isr) == sorted(b for b in before.replicas if b != follower)
        assert shrink_after_s >= REPLICA_LAG_TIME_MAX_MS / 1000 / 2, (
            f"the ISR shrank {shrink_after_s:.1f} s after the pause, before "
            "replica.lag.time.max.ms could pass"
        )
        still = etcd_kv(c.etcd_endpoint, f"/highwater/brokers/ids/{follower}")
        assert still is not None and still.create_revision == registration.create_revision, (
            "the paused follower kept its lease and broker epoch: the shrink came from the lag rule"
        )

        rejoined = wait_for(
            lambda: follower in (s := describe_partition(gw, topic, 0)).isr and s,
            timeout_s=CATCH_UP_TIMEOUT_S,
            what=f"broker {follower} to rejoin the ISR",
        )
        assert rejoined.leader_epoch == before.leader_epoch
        count = len(acked)
        wait_for(lambda: len(acked) >= count + 20, timeout_s=10, what="acks=all writes after the rejoin")
    finally:
        stop.set()
        loader.join(timeout=20)
    assert failed == [], "acks=all writes failed although two ISR members were always live"
    leader_log = broker_log(c, before.leader)
    assert f"shrinking ISR of {topic}-0" in leader_log and f"expanding ISR of {topic}-0" in leader_log
    records = {r.offset: r.value for r in fetch_all(gw, topic, 0)}
    assert all(records.get(offset) == value for offset, value in acked)


# ---- double failover: a follower whose latest epoch the new leader never had (KIP-279) ---------


def test_follower_truncates_an_epoch_the_new_leader_never_saw_after_a_double_failover(make_cluster):
    """Two replicas A, B (unclean election enabled so A may lead again after both died).

    Epoch 0, A leads: m1 on both, m2 on A only. A dies; B leads epoch 1 and writes m3 at
    m2's offsets. B dies; A leads again (unclean) at a newer epoch and writes m4. B
    returns and asks A for the end of its epoch 1, which A never had: A answers epoch 0
    and where it ends. B must truncate to its own end of epoch 0, so m3 goes, and
    fetch m2 and m4: both logs end up byte-identical. Truncating only to A's answer
    (pre-KIP-279) would keep m3 where A holds m2.
    """
    c = make_cluster(brokers=2)
    gw = gateway_stub(c.gateway_address)
    topic = "double-failover"
    assert (
        create_topic(
            gw, topic, partitions=1, replication_factor=2, configs={"unclean.leader.election.enable": "true"}
        ).error_code
        == 0
    )
    start = describe_partition(gw, topic, 0)
    a, b = start.leader, next(r for r in start.replicas if r != start.leader)
    m1 = [f"m1-{i}".encode() for i in range(5)]
    assert produce_acked(gw, topic, m1) == 0
    with paused(c, [b]):
        m2_offset = append_only_on_leader(gw, topic, [b"m2-a", b"m2-b", b"m2-c"])
        c.kill_broker(a)

    epoch_b = new_leader(gw, topic, start)
    assert epoch_b.leader == b
    m3_offset = produce_acked(gw, topic, [b"m3-a", b"m3-b", b"m3-c"], acks=1)
    assert m3_offset <= m2_offset, "m3 is written over offsets that hold m2 on A"
    c.kill_broker(b)
    wait_for(
        lambda: etcd_kv(c.etcd_endpoint, f"/highwater/brokers/ids/{b}") is None,
        timeout_s=FAILOVER_TIMEOUT_S,
        what=f"broker {b}'s registration to expire",
    )

    c.start_broker(a)
    epoch_a = wait_for(
        lambda: (s := describe_partition(gw, topic, 0)).leader == a and s,
        timeout_s=FAILOVER_TIMEOUT_S,
        what=f"broker {a} to lead again (unclean election)",
    )
    assert epoch_a.leader_epoch > epoch_b.leader_epoch
    m4_offset = produce_acked(gw, topic, [b"m4"], acks=1)
    assert m4_offset == m2_offset + 3, "A's log goes on after m2: it never had epoch 1"

    c.start_broker(b)
    identical = wait_logs_identical_below_hw(c, gw, topic, [a, b], m4_offset + 1)
    assert identical
    values = [r.value for r in fetch_all(gw, topic, 0)]
    assert values[:5] == m1
    assert values[m2_offset:] == [b"m2-a", b"m2-b", b"m2-c", b"m4"]
    assert not any(v.startswith(b"m3") for v in values)
    assert f"truncating {topic}-0 from {m3_offset + 3} to {m3_offset}" in broker_log(c, b), (
        "B cut m3: its own end of epoch 0, not A's end offset for it"
    )


# ---- idempotent producer through the gateway ---------------------------------------------------


def produce_batch(gw, topic: str, batch: bytes, *, acks: int = -1) -> common_pb2.ProducePartitionResponse:
    resp = gw.Produce(
        common_pb2.ProduceRequest(
            acks=acks,
            timeout_ms=10_000,
            topics=[
                common_pb2.ProduceTopicData(
                    topic=topic, partitions=[common_pb2.ProducePartitionData(partition=0, records=batch)]
                )
            ],
        )
    )
    return resp.topics[0].partitions[0]


def idempotent_batch(
    producer: common_pb2.InitProducerIdResponse, base_sequence: int, values: list[bytes]
) -> bytes:
    now = int(time.time() * 1000)
    return encode_batch(
        [Record(None, v, [], now) for v in values],
        producer_id=producer.producer_id,
        producer_epoch=producer.producer_epoch,
        base_sequence=base_sequence,
    )


def test_idempotent_retry_is_written_once_also_after_failover_and_a_sequence_gap_is_refused(make_cluster):
    c = make_cluster(brokers=3)
    gw = gateway_stub(c.gateway_address)
    topic = "idempotent"
    assert create_topic(gw, topic, partitions=1, configs={"min.insync.replicas": "2"}).error_code == 0
    producer = gw.InitProducerId(common_pb2.InitProducerIdRequest(producer_id=-1, producer_epoch=-1))
    assert producer.error_code == common_pb2.NONE and producer.producer_id >= 0

    first = idempotent_batch(producer, 0, [f"first-{i}".encode() for i in range(5)])
    sent = produce_batch(gw, topic, first)
    assert (sent.error_code, sent.base_offset) == (common_pb2.NONE, 0)
    retried = produce_batch(gw, topic, first)
    assert (retried.error_code, retried.base_offset) == (common_pb2.NONE, 0), (
        "a retry answers the original offset"
    )

    gap = produce_batch(gw, topic, idempotent_batch(producer, 7, [b"after-a-gap"]))
    assert gap.error_code == common_pb2.OUT_OF_ORDER_SEQUENCE_NUMBER, gap.error_message
    assert "expected 5" in gap.error_message

    second = idempotent_batch(producer, 5, [f"second-{i}".encode() for i in range(5)])
    assert produce_batch(gw, topic, second).base_offset == 5
    assert [r.value for r in fetch_all(gw, topic, 0)] == [f"first-{i}".encode() for i in range(5)] + [
        f"second-{i}".encode() for i in range(5)
    ]

    # The followers replicated the producer state with the batches: the new leader
    # recognises a retry of a batch the old leader wrote.
    old = describe_partition(gw, topic, 0)
    c.kill_broker(old.leader)
    new_leader(gw, topic, old)
    retried = wait_for(
        lambda: (r := produce_batch(gw, topic, second)).error_code == common_pb2.NONE and r,
        timeout_s=FAILOVER_TIMEOUT_S,
        what="the retry to be answered by the new leader",
    )
    assert retried.base_offset == 5
    third = idempotent_batch(producer, 10, [b"third"])
    assert produce_batch(gw, topic, third).base_offset == 10
    values = [r.value for r in fetch_all(gw, topic, 0)]
    assert len(values) == len(set(values)) == 11, "no record written twice"
