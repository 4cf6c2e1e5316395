"""What a new user of the Python clients and the gRPC calls meets first (issue 38).

- A send to a topic that does not exist says so at once (UNKNOWN_TOPIC_OR_PARTITION), not
  after max_block_ms; a topic just created is still waited for.
- A Producer left open at the end of a program, and an AsyncConsumer whose poll was
  cancelled before close(), print nothing on stderr.
- ConsumeRecords with stop_at_end reads what is there as of the call, then ends.
- A non-Python service joins a consumer group over gRPC alone (docs/GRPC.md).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from clients import Producer
from clients.common.errors import UnknownTopicOrPartition
from protos.highwater.v1 import common_pb2, gateway_pb2
from tests.integration.helpers import create_topic, gateway_stub

pytestmark = pytest.mark.integration

RPC_TIMEOUT_S = 30.0
# A program of a few lines against a running cluster: start-up, a few calls, close.
PROGRAM_TIMEOUT_S = 60.0
ROOT = Path(__file__).resolve().parents[2]


def _run_program(source: str, bootstrap: str) -> subprocess.CompletedProcess[str]:
    """Run `source` in a fresh interpreter (BOOTSTRAP set) and return what it printed."""
    env = dict(os.environ, BOOTSTRAP=bootstrap, PYTHONPATH=str(ROOT))
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(source)],
        capture_output=True,
        text=True,
        timeout=PROGRAM_TIMEOUT_S,
        env=env,
        cwd=ROOT,
        check=False,
    )


# ---- a send to a topic that does not exist ------------------------------------------------------


def test_a_send_to_a_topic_that_does_not_exist_fails_at_once_with_unknown_topic(cluster):
    with Producer(cluster.gateway_address, max_block_ms=30_000) as producer:
        started = time.monotonic()
        with pytest.raises(UnknownTopicOrPartition) as raised:
            producer.send("rough-nope-topic", b"v")
        elapsed_s = time.monotonic() - started
    assert elapsed_s < 5.0, f"took {elapsed_s:.1f} s, max_block_ms was 30 s"
    assert "rough-nope-topic" in str(raised.value)
    assert "does not exist" in str(raised.value)


def test_a_send_right_after_create_topics_still_waits_for_the_new_topic(cluster):
    gw = gateway_stub(cluster.gateway_address)
    with Producer(cluster.gateway_address, max_block_ms=30_000) as producer:
        for i in range(5):
            topic = f"rough-fresh-{i}"
            assert create_topic(gw, topic, partitions=3).error_code == 0
            producer.send(topic, b"v").result(timeout=30)


# ---- clean shutdowns ----------------------------------------------------------------------------


def test_a_producer_never_closed_prints_nothing_at_exit(cluster):
    gw = gateway_stub(cluster.gateway_address)
    assert create_topic(gw, "rough-unclosed", partitions=1).error_code == 0
    done = _run_program(
        """
        import os
        from clients import Producer
        producer = Producer(os.environ["BOOTSTRAP"])
        producer.send("rough-unclosed", b"v").result(timeout=30)
        print("sent")
        """,
        cluster.gateway_address,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "sent"
    assert done.stderr == ""


def test_an_async_consumer_whose_poll_is_cancelled_then_closed_prints_nothing(cluster):
    """A poll cancelled while it waits for a Fetch (asyncio.wait_for around it, a task
    cancelled at shutdown), then close(): nothing is left behind for asyncio to report."""
    gw = gateway_stub(cluster.gateway_address)
    assert create_topic(gw, "rough-async-close", partitions=3).error_code == 0
    done = _run_program(
        """
        import asyncio, gc, os
        from clients import AsyncConsumer, Producer

        with Producer(os.environ["BOOTSTRAP"]) as producer:
            for i in range(30):
                producer.send("rough-async-close", str(i).encode())
            producer.flush(timeout_ms=30_000)

        async def main():
            for i in range(3):
                consumer = AsyncConsumer(
                    "rough-async-close",
                    bootstrap=os.environ["BOOTSTRAP"],
                    group_id=f"rough-async-close-{i}",
                    auto_offset_reset="earliest",
                )
                got = 0
                deadline = asyncio.get_running_loop().time() + 30
                while got < 30 and asyncio.get_running_loop().time() < deadline:
                    got += len(await consumer.poll(timeout_ms=1000))
                await consumer.commit()
                # Caught up: this poll waits on a long-polling Fetch until cancelled.
                try:
                    await asyncio.wait_for(consumer.poll(timeout_ms=5_000), 0.2)
                except TimeoutError:
                    pass
                await consumer.close()
                gc.collect()
            print("closed")

        asyncio.run(main())
        """,
        cluster.gateway_address,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "closed"
    assert done.stderr == ""


def test_commits_in_flight_at_close_are_made_and_print_nothing(cluster):
    """An app that polls, commits with commit_async (Kafka's commitAsync: errors go to the
    callback, nobody awaits the task) and closes while those commits and a Fetch are in
    flight: close() completes the pending commits first, as Kafka's consumer does, and
    nothing is left for asyncio to report ("Task exception was never retrieved")."""
    gw = gateway_stub(cluster.gateway_address)
    assert create_topic(gw, "rough-commit-close", partitions=3).error_code == 0
    done = _run_program(
        """
        import asyncio, gc, os
        from clients import AsyncConsumer, Producer, TopicPartition

        with Producer(os.environ["BOOTSTRAP"]) as producer:
            for i in range(30):
                producer.send("rough-commit-close", str(i).encode())
            producer.flush(timeout_ms=30_000)

        async def main():
            for i in range(3):
                group = f"rough-commit-close-{i}"
                consumer = AsyncConsumer(
                    "rough-commit-close",
                    bootstrap=os.environ["BOOTSTRAP"],
                    group_id=group,
                    auto_offset_reset="earliest",
                    enable_auto_commit=False,
                )
                got = 0
                deadline = asyncio.get_running_loop().time() + 30
                while got < 30 and asyncio.get_running_loop().time() < deadline:
                    got += len(await consumer.poll(timeout_ms=1000))
                    consumer.commit_async(callback=lambda offsets, error: None)
                consumer.commit_async()
                poll = asyncio.ensure_future(consumer.poll(timeout_ms=5_000))  # a Fetch in flight
                await asyncio.sleep(0)
                await consumer.close()
                poll.cancel()
                gc.collect()
                async with AsyncConsumer(bootstrap=os.environ["BOOTSTRAP"], group_id=group) as reader:
                    committed = [
                        await reader.committed(TopicPartition("rough-commit-close", p)) for p in range(3)
                    ]
                print(group, got, sum(c or 0 for c in committed))
            print("closed")

        asyncio.run(main())
        """,
        cluster.gateway_address,
    )
    assert done.returncode == 0, done.stderr
    # Every group's last commit_async, still in flight at close(), was made: 30 records read, 30 committed.
    lines = done.stdout.splitlines()
    assert lines == [*(f"rough-commit-close-{i} 30 30" for i in range(3)), "closed"], done.stdout
    assert done.stderr == "", done.stderr


# ---- ConsumeRecords: stop at the end as of the call ---------------------------------------------


def test_consume_records_with_stop_at_end_ends_at_the_high_watermark_of_the_call(cluster):
    gw = gateway_stub(cluster.gateway_address)
    topic = "rough-stop-at-end"
    assert create_topic(gw, topic, partitions=3).error_code == 0
    produced = gw.ProduceRecords(
        gateway_pb2.ProduceRecordsRequest(
            topic=topic,
            records=[gateway_pb2.ProducerRecord(value=f"v{i}".encode(), partition=i % 2) for i in range(10)],
        ),
        timeout=RPC_TIMEOUT_S,
    )
    assert [r.error_code for r in produced.results] == [0] * 10
    request = gateway_pb2.ConsumeRecordsRequest(topic=topic, default_start_offset=-2, stop_at_end=True)
    got: list[gateway_pb2.ConsumedRecord] = []
    stream = gw.ConsumeRecords(request, timeout=RPC_TIMEOUT_S)
    for i, message in enumerate(stream):
        assert not message.errors, message.errors
        got.extend(message.records)
        if i == 0:
            # Written after the call began: past its end, not sent.
            gw.ProduceRecords(
                gateway_pb2.ProduceRecordsRequest(
                    topic=topic,
                    records=[gateway_pb2.ProducerRecord(value=b"late", partition=p) for p in range(3)],
                ),
                timeout=RPC_TIMEOUT_S,
            )
    # The stream ended by itself (no DEADLINE_EXCEEDED), partition 2 (empty) included.
    assert sorted((r.partition, r.offset) for r in got) == [(p, o) for p in (0, 1) for o in range(5)]
    assert b"late" not in {r.value for r in got}


def test_consume_records_with_stop_at_end_from_the_end_sends_nothing_and_ends(cluster):
    gw = gateway_stub(cluster.gateway_address)
    topic = "rough-stop-at-end-latest"
    assert create_topic(gw, topic, partitions=2).error_code == 0
    gw.ProduceRecords(
        gateway_pb2.ProduceRecordsRequest(topic=topic, records=[gateway_pb2.ProducerRecord(value=b"x")]),
        timeout=RPC_TIMEOUT_S,
    )
    request = gateway_pb2.ConsumeRecordsRequest(topic=topic, default_start_offset=-1, stop_at_end=True)
    messages = list(gw.ConsumeRecords(request, timeout=RPC_TIMEOUT_S))
    assert [m for m in messages if m.records or m.errors] == []


# ---- a consumer group over gRPC alone (the loop docs/GRPC.md describes) -------------------------


def test_a_group_member_over_grpc_alone_reads_its_assignment_and_commits(cluster):
    gw = gateway_stub(cluster.gateway_address)
    topic = "rough-grpc-group"
    group = "rough-grpc-group"
    assert create_topic(gw, topic, partitions=2).error_code == 0
    gw.ProduceRecords(
        gateway_pb2.ProduceRecordsRequest(
            topic=topic,
            records=[gateway_pb2.ProducerRecord(value=f"v{i}".encode(), partition=i % 2) for i in range(6)],
        ),
        timeout=RPC_TIMEOUT_S,
    )
    # 1. Join (member_id empty, epoch 0), then heartbeat until the assignment arrives; the
    # assignment is the whole target each time, and `owned` says what the member took.
    member_id, epoch = "", 0
    assigned: list[int] = []
    deadline = time.monotonic() + RPC_TIMEOUT_S
    while not assigned:
        assert time.monotonic() < deadline, "no assignment within 30 s"
        beat = gw.ConsumerGroupHeartbeat(
            gateway_pb2.ConsumerGroupHeartbeatRequest(
                group_id=group,
                member_id=member_id,
                member_epoch=epoch,
                subscribed_topics=[topic],
                rebalance_timeout_ms=30_000,
            ),
            timeout=RPC_TIMEOUT_S,
        )
        assert beat.error_code == common_pb2.NONE, beat.error_message
        member_id, epoch = beat.member_id, beat.member_epoch
        assigned = sorted(tp.partition for tp in beat.assignment if tp.topic == topic)
        if not assigned:
            time.sleep(0.1)
    beat = gw.ConsumerGroupHeartbeat(
        gateway_pb2.ConsumerGroupHeartbeatRequest(
            group_id=group,
            member_id=member_id,
            member_epoch=epoch,
            subscribed_topics=[topic],
            owned=[common_pb2.TopicPartition(topic=topic, partition=p) for p in assigned],
        ),
        timeout=RPC_TIMEOUT_S,
    )
    assert beat.error_code == common_pb2.NONE, beat.error_message
    epoch = beat.member_epoch
    assert assigned == [0, 1]
    # 2. Start from the committed offsets (none yet: -1), else the earliest.
    committed = gw.FetchCommittedOffsets(
        gateway_pb2.FetchCommittedOffsetsRequest(
            group_id=group, partitions=[common_pb2.TopicPartition(topic=topic, partition=p) for p in assigned]
        ),
        timeout=RPC_TIMEOUT_S,
    )
    starts = {c.partition: c.offset if c.offset >= 0 else -2 for c in committed.offsets}
    # 3. Read what is there, per assigned partition.
    got: list[gateway_pb2.ConsumedRecord] = []
    for message in gw.ConsumeRecords(
        gateway_pb2.ConsumeRecordsRequest(
            topic=topic,
            partitions=[gateway_pb2.ConsumePartition(partition=p, start_offset=starts[p]) for p in assigned],
            stop_at_end=True,
        ),
        timeout=RPC_TIMEOUT_S,
    ):
        assert not message.errors, message.errors
        got.extend(message.records)
    assert len(got) == 6
    # 4. Commit with the member's id and epoch.
    nexts: dict[int, int] = {}
    for r in got:
        nexts[r.partition] = max(nexts.get(r.partition, 0), r.offset + 1)
    commit = gw.CommitOffsets(
        gateway_pb2.CommitOffsetsRequest(
            group_id=group,
            member_id=member_id,
            member_epoch=epoch,
            topics=[
                gateway_pb2.OffsetCommitTopic(
                    topic=topic,
                    partitions=[
                        gateway_pb2.OffsetCommitPartition(partition=p, offset=o, leader_epoch=-1)
                        for p, o in nexts.items()
                    ],
                )
            ],
        ),
        timeout=RPC_TIMEOUT_S,
    )
    assert commit.error_code == common_pb2.NONE, commit.error_message
    assert [r.error_code for r in commit.partitions] == [0, 0], commit.partitions
    # 5. Leave: epoch -1.
    gw.ConsumerGroupHeartbeat(
        gateway_pb2.ConsumerGroupHeartbeatRequest(group_id=group, member_id=member_id, member_epoch=-1),
        timeout=RPC_TIMEOUT_S,
    )
    again = gw.FetchCommittedOffsets(
        gateway_pb2.FetchCommittedOffsetsRequest(
            group_id=group, partitions=[common_pb2.TopicPartition(topic=topic, partition=p) for p in assigned]
        ),
        timeout=RPC_TIMEOUT_S,
    )
    assert {c.partition: c.offset for c in again.offsets} == {0: 3, 1: 3}
