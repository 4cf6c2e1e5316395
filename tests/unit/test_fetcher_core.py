"""The replica fetcher's rules (services/broker/fetcher_core.py).

A follower BrokerCore's FetcherCore fetches from a leader BrokerCore: its requests are
answered by the leader core's Fetch and OffsetsForLeaderEpoch, as over gRPC. Answers
a healthy leader never gives (corrupt batches) are built by hand.
"""

from __future__ import annotations

from typing import Any

import pytest

from clients.common.records import Record, decode_batches, encode_batch
from protos.highwater.v1 import common_pb2
from services.broker.fetch_state import FetchPhase
from services.broker.fetcher_core import FETCHER_EMPTY_WAIT_MS, FetcherCore
from services.broker.steps import AwaitWork, CallLeader, RpcFailed, Sleep
from tests.unit.broker_seams import Broker

T0 = ("t", 0)
T1 = ("t", 1)


def batch(*values: str) -> bytes:
    return encode_batch([Record(None, v.encode(), [], 1_000) for v in values])


def values_in(broker: Broker, tp: tuple[str, int] = T0) -> list[bytes]:
    """Every record value in the replica's log (a read stops at a segment's end: read on)."""
    log = broker.core.partitions[tp].log
    values: list[bytes] = []
    offset = log.log_start_offset
    while offset < log.log_end_offset:
        info = log.read(offset, max_bytes=1 << 20)
        assert info.next_offset > offset, f"no progress reading at {offset}"
        values += [r.value for r in decode_batches(info.records)]
        offset = info.next_offset
    return values


def answer(leader: Broker, call: CallLeader) -> Any:
    """What the leader core answers to one of the fetcher's calls."""
    if call.rpc == "Fetch":
        return leader.fetch_now(call.request)
    return leader.core.offsets_for_leader_epoch(call.request)


def one_round(fetcher: FetcherCore, leader: Broker) -> None:
    """maybe_truncate(); maybe_fetch() once, through the plain methods."""
    now = fetcher.clock.monotonic_ms()
    truncation = fetcher.build_truncation_request(now)
    if truncation is not None:
        fetcher.handle_truncation_answer(
            leader.core.offsets_for_leader_epoch(truncation.request), truncation.asked, now
        )
    request = fetcher.build_fetch_request(now)
    if request is not None:
        session_id = request.session.id if request.HasField("session") else None
        fetcher.handle_fetch_answer(leader.fetch_now(request), now, session_id)


def answer_for_t(*partitions: common_pb2.FetchPartitionResponse) -> common_pb2.FetchResponse:
    """A hand-built leader's FetchResponse with these partitions of topic t."""
    return common_pb2.FetchResponse(topics=[common_pb2.FetchTopicResponse(topic="t", partitions=partitions)])


def pair(partitions: tuple[int, ...] = (0,)) -> tuple[Broker, Broker, FetcherCore]:
    """Broker 1 leads epoch 0 of every partition; broker 2 follows it. Returns (leader, follower, fetcher)."""
    leader, follower = Broker(1), Broker(2)
    leader.register(10)
    follower.register(11)
    for partition in partitions:
        for broker in (leader, follower):
            broker.leader_and_isr(
                leader=1, leader_epoch=0, isr=(1, 2), replicas=(1, 2), partition=partition, live=[leader.node]
            )
    (fetcher,) = follower.io.started
    return leader, follower, fetcher


def test_a_follower_copies_the_leaders_log_and_learns_its_high_watermark() -> None:
    leader, follower, fetcher = pair()
    assert leader.produce(batch("a", "b"), acks=1)[0].topics[0].partitions[0].base_offset == 0
    assert leader.produce(batch("c"), acks=1)
    one_round(fetcher, leader)
    assert values_in(follower) == [b"a", b"b", b"c"]
    assert follower.core.partitions[T0].high_watermark == 0, "the leader's HW had not moved when it answered"
    one_round(fetcher, leader)  # this fetch tells the leader the follower has 3 records
    assert leader.core.partitions[T0].high_watermark == 3
    one_round(fetcher, leader)
    assert follower.core.partitions[T0].high_watermark == 3


def test_a_divergent_follower_truncates_to_the_leaders_end_of_its_epoch_then_fetches_the_new_one() -> None:
    # Broker 2 led epoch 0 and wrote "c" that broker 1 never fetched; broker 1 leads epoch 1 and
    # writes "d" at the same offset. Broker 2 must drop "c" (KIP-101), not keep it under "d".
    old, new = Broker(2), Broker(1)
    old.register(11)
    new.register(10)
    old.leader_and_isr(leader=2, leader_epoch=0, isr=(1, 2), replicas=(1, 2), live=[old.node])
    new.leader_and_isr(leader=2, leader_epoch=0, isr=(1, 2), replicas=(1, 2), live=[old.node])
    old.produce(batch("a", "b"), acks=1)
    (to_old,) = new.io.started
    one_round(to_old, old)
    assert values_in(new) == [b"a", b"b"]
    old.produce(batch("c"), acks=1)
    new.leader_and_isr(
        leader=1, leader_epoch=1, isr=(1,), replicas=(1, 2), partition_epoch=2, live=[new.node]
    )
    new.produce(batch("d"), acks=1)
    old.leader_and_isr(
        leader=1, leader_epoch=1, isr=(1,), replicas=(1, 2), partition_epoch=2, live=[new.node]
    )
    (to_new,) = old.io.started

    truncation = to_new.build_truncation_request(0)
    assert truncation is not None and truncation.asked == {T0: 0}, "asks for its latest epoch"
    to_new.handle_truncation_answer(
        new.core.offsets_for_leader_epoch(truncation.request), truncation.asked, 0
    )
    assert old.core.partitions[T0].log.log_end_offset == 2
    assert to_new.partitions[T0].phase is FetchPhase.FETCHING and to_new.partitions[T0].fetch_offset == 2
    one_round(to_new, new)
    assert values_in(old) == values_in(new) == [b"a", b"b", b"d"]
    assert old.core.partitions[T0].log.leader_epoch_cache.latest_epoch() == 1


def test_a_partition_whose_append_fails_is_isolated_and_the_others_keep_fetching() -> None:
    leader, follower, fetcher = pair(partitions=(0, 1))
    one_round(fetcher, leader)  # both move to FETCHING
    request = fetcher.build_fetch_request(0)
    assert request is not None
    good = batch("x")
    corrupt = bytearray(batch("y"))
    corrupt[-1] ^= 0xFF  # the CRC no longer matches
    response = answer_for_t(
        common_pb2.FetchPartitionResponse(
            partition=0, records=bytes(corrupt), high_watermark=1, log_end_offset=1
        ),
        common_pb2.FetchPartitionResponse(partition=1, records=good, high_watermark=1, log_end_offset=1),
    )
    fetcher.handle_fetch_answer(response, 0)
    assert fetcher.failed == {T0} and T0 not in fetcher.partitions
    assert values_in(follower, T1) == [b"x"]
    assert follower.core.partitions[T0].log.log_end_offset == 0, "nothing of the corrupt batch was written"
    assert "t-0: append of fetched data from leader 1 failed" in follower.lines.text("error")
    # The next LeaderAndIsr for the partition tries it again.
    fetcher.add_partition(T0, 0, 0)
    assert not fetcher.failed and fetcher.partitions[T0].phase is FetchPhase.TRUNCATING


def test_a_partition_level_error_delays_that_partition_only_and_sends_it_to_the_end_of_the_round() -> None:
    leader, _follower, fetcher = pair(partitions=(0, 1))
    one_round(fetcher, leader)
    assert list(fetcher.partitions) == [T0, T1]
    response = answer_for_t(
        common_pb2.FetchPartitionResponse(partition=0, error_code=common_pb2.NOT_LEADER_OR_FOLLOWER),
        common_pb2.FetchPartitionResponse(partition=1, high_watermark=0, log_end_offset=0),
    )
    fetcher.handle_fetch_answer(response, now_ms=100)
    assert list(fetcher.partitions) == [T1, T0]
    assert fetcher.partitions[T0].phase is FetchPhase.DELAYED
    request = fetcher.build_fetch_request(now_ms=100)
    # In the fetch session the leader holds partition 1 as it was: only the delayed one is news.
    assert request is not None and [p.partition for t in request.topics for p in t.partitions] == []
    assert [(f.topic, f.partition) for f in request.session.forgotten] == [T0]
    # After the back-off it starts over by agreeing on where its log ends.
    later = 100 + fetcher.settings.backoff_ms
    truncation = fetcher.build_truncation_request(later)
    assert truncation is None, "an empty log has no epoch to ask about and goes straight to FETCHING"
    assert fetcher.partitions[T0].phase is FetchPhase.FETCHING


def test_a_follower_below_the_leaders_log_start_restarts_its_log_there() -> None:
    leader, follower, fetcher = pair()
    for i in range(5):
        leader.produce(batch(f"v{i}"), acks=1)
    one_round(fetcher, leader)
    leader.core.partitions[T0].high_watermark = 5  # as if the follower's next fetch had reported its LEO
    follower.core.truncate(T0, 2)  # the follower lost its tail (it fetches again from 2)
    fetcher.partitions[T0].fetch_offset = 2
    leader.core.partitions[T0].log.advance_log_start_offset(4)  # DeleteRecords / retention on the leader
    request = fetcher.build_fetch_request(0)
    assert request is not None
    response = leader.fetch_now(request)
    assert response.topics[0].partitions[0].error_code == common_pb2.OFFSET_OUT_OF_RANGE
    fetcher.handle_fetch_answer(response, 0, request.session.id)
    p = follower.core.partitions[T0]
    assert (p.log.log_start_offset, p.log.log_end_offset, p.high_watermark) == (4, 4, 4)
    assert fetcher.partitions[T0].fetch_offset == 4
    one_round(fetcher, leader)
    assert values_in(follower) == [b"v4"]


def test_a_follower_above_the_leaders_end_truncates_to_it() -> None:
    leader, follower, fetcher = pair()
    leader.produce(batch("a", "b"), acks=1)
    leader.produce(batch("c"), acks=1)
    one_round(fetcher, leader)
    assert values_in(follower) == [b"a", b"b", b"c"]
    request = fetcher.build_fetch_request(0)
    assert request is not None
    # A leader whose log ends at 2 (a hand-built answer: our leader would have truncated us first).
    response = answer_for_t(
        common_pb2.FetchPartitionResponse(
            partition=0,
            error_code=common_pb2.OFFSET_OUT_OF_RANGE,
            log_start_offset=0,
            log_end_offset=2,
        )
    )
    fetcher.handle_fetch_answer(response, 0)
    assert values_in(follower) == [b"a", b"b"]
    assert fetcher.partitions[T0].fetch_offset == 2


def test_an_answer_for_a_partition_removed_while_the_fetch_was_in_flight_is_dropped() -> None:
    leader, follower, fetcher = pair()
    one_round(fetcher, leader)
    leader.produce(batch("a"), acks=1)
    request = fetcher.build_fetch_request(0)
    assert request is not None
    fetcher.remove_partition(T0)
    fetcher.handle_fetch_answer(leader.fetch_now(request), 0)
    assert follower.core.partitions[T0].log.log_end_offset == 0


def test_the_fetch_loop_waits_for_work_calls_the_leader_and_backs_off_when_it_is_unreachable() -> None:
    leader, follower, fetcher = pair()
    partitions = dict(fetcher.partitions)
    fetcher.partitions.clear()
    task = fetcher.run()
    assert next(task) == AwaitWork(FETCHER_EMPTY_WAIT_MS)
    fetcher.partitions.update(partitions)
    step = task.send(None)
    assert isinstance(step, CallLeader) and step.rpc == "Fetch", "an empty log skips OffsetsForLeaderEpoch"
    step = task.send(RpcFailed("connection refused"))
    assert step == Sleep(fetcher.settings.backoff_ms)
    assert fetcher.partitions[T0].phase is FetchPhase.DELAYED
    assert "connection refused" in follower.lines.text("warning")
    follower.clock.now_ms += fetcher.settings.backoff_ms
    leader.produce(batch("a"), acks=1)
    step = task.send(None)
    assert isinstance(step, CallLeader) and step.rpc == "Fetch"
    step = task.send(answer(leader, step))
    assert values_in(follower) == [b"a"]
    fetcher.stopped = True
    with pytest.raises(StopIteration):
        task.send(answer(leader, step) if isinstance(step, CallLeader) else None)


def test_the_fetch_request_names_the_follower_its_broker_epoch_and_its_leader_epoch() -> None:
    leader, _follower, fetcher = pair()
    one_round(fetcher, leader)
    fetcher.reset_session()  # a request opening a session names every partition
    request = fetcher.build_fetch_request(0)
    assert request is not None
    assert (request.replica_id, request.replica_epoch) == (2, 11)
    (fp,) = request.topics[0].partitions
    assert (fp.current_leader_epoch, fp.fetch_offset, fp.log_start_offset) == (0, 0, 0)
