"""Replica fetch sessions (services/broker/replica_sessions.py): a follower names only what
changed, a leader reads and answers only what changed, and the ISR still sees idle followers.

Driven through the shipped BrokerCore (as leader and follower) and FetcherCore, as
test_fetcher_core.py does.
"""

from __future__ import annotations

import pytest

from protos.highwater.v1 import common_pb2
from services.broker.fetcher_core import FetcherCore
from services.broker.partition import Partition
from services.common import limits
from tests.unit.broker_seams import Broker
from tests.unit.test_fetcher_core import T0, answer_for_t, batch, one_round, pair, values_in

T1 = ("t", 1)
T2 = ("t", 2)


def named(request: common_pb2.FetchRequest) -> list[tuple[str, int]]:
    return [(t.topic, p.partition) for t in request.topics for p in t.partitions]


def answered(response: common_pb2.FetchResponse) -> list[tuple[str, int]]:
    return [(t.topic, p.partition) for t in response.topics for p in t.partitions]


def incremental(fetcher: FetcherCore, max_wait_ms: int) -> common_pb2.FetchRequest:
    """The fetcher's next request, made to wait as a real follower's does."""
    request = fetcher.build_fetch_request(fetcher.clock.monotonic_ms())
    assert request is not None and request.session.id != 0
    request.max_wait_ms = max_wait_ms
    return request


def tick(*brokers: Broker, ms: int) -> None:
    for b in brokers:
        b.clock.now_ms += ms
        b.io.fire_due()


def idle_rounds(
    leader: Broker, follower: Broker, fetcher: FetcherCore, rounds: int, check_isr: Partition | None = None
) -> None:
    """A follower's fetch every 500 ms with nothing written: each names nothing (and, given the
    leader's partition, the follower stays in its ISR)."""
    for _ in range(rounds):
        tick(leader, follower, ms=500)
        request = incremental(fetcher, max_wait_ms=0)
        assert named(request) == []
        fetcher.handle_fetch_answer(leader.fetch_now(request), 0, request.session.id)
        if check_isr is not None:
            assert check_isr.check_isr_shrink(leader.clock.now_ms, limits.REPLICA_LAG_TIME_MAX_MS) is None


def test_a_follower_opens_a_session_then_names_and_hears_only_what_changed() -> None:
    leader, follower, fetcher = pair(partitions=(0, 1, 2))
    assert fetcher.build_truncation_request(0) is None, "empty logs go straight to FETCHING"
    first = fetcher.build_fetch_request(0)
    assert first is not None and first.session.id == 0 and named(first) == [T0, T1, T2]
    fetcher.handle_fetch_answer(leader.fetch_now(first), 0, first.session.id)
    assert fetcher.session_id != 0 and fetcher.session_epoch == 1

    leader.produce(batch("a"), acks=1, partition=1)
    request = fetcher.build_fetch_request(0)
    assert request is not None and named(request) == [], "nothing moved on the follower"
    assert (request.session.id, request.session.epoch) == (fetcher.session_id, 1)
    response = leader.fetch_now(request)
    assert answered(response) == [T1], "only the partition with records is in the answer"
    fetcher.handle_fetch_answer(response, 0, request.session.id)
    assert values_in(follower, T1) == [b"a"]

    request = fetcher.build_fetch_request(0)
    assert request is not None and named(request) == [T1], "its fetch offset moved"
    assert request.topics[0].partitions[0].fetch_offset == 1


def test_an_idle_session_fetch_waits_until_a_partition_it_holds_changes() -> None:
    leader, _follower, fetcher = pair(partitions=(0, 1))
    one_round(fetcher, leader)
    answers: list[common_pb2.FetchResponse] = []
    leader.core.fetch(incremental(fetcher, max_wait_ms=500), answers.append)
    assert not answers, "nothing to say: the fetch waits"
    leader.produce(batch("x"), acks=1, partition=0)
    assert len(answers) == 1 and answered(answers[0]) == [T0]
    assert answers[0].session_id == fetcher.session_id
    fetcher.handle_fetch_answer(answers[0], 0, fetcher.session_id)

    answers.clear()
    leader.core.fetch(incremental(fetcher, max_wait_ms=500), answers.append)
    tick(leader, ms=499)
    assert not answers
    tick(leader, ms=1)
    # At its deadline it answers what the follower has not heard: partition 0's new HW (the
    # follower's fetch at offset 1 moved it), nothing of the idle partition 1.
    assert len(answers) == 1 and answered(answers[0]) == [T0]
    assert answers[0].topics[0].partitions[0].high_watermark == 1


def test_a_session_fetch_waiting_when_the_leader_closes_is_answered() -> None:
    leader, _follower, fetcher = pair()
    one_round(fetcher, leader)
    answers: list[common_pb2.FetchResponse] = []
    leader.core.fetch(incremental(fetcher, max_wait_ms=500), answers.append)
    leader.core.begin_close()
    assert len(answers) == 1
    assert not leader.core.replica_sessions.by_id


def test_a_stale_epoch_or_unknown_session_is_refused_and_the_follower_opens_a_new_one() -> None:
    leader, _follower, fetcher = pair(partitions=(0, 1))
    one_round(fetcher, leader)
    request = fetcher.build_fetch_request(0)
    assert request is not None
    request.session.epoch += 1
    refused = leader.fetch_now(request)
    assert refused.error_code == common_pb2.INVALID_FETCH_SESSION_EPOCH and not refused.topics
    request.session.id += 1000
    assert leader.fetch_now(request).error_code == common_pb2.FETCH_SESSION_ID_NOT_FOUND

    fetcher.handle_fetch_answer(refused, 0, fetcher.session_id)
    assert fetcher.session_id == 0
    again = fetcher.build_fetch_request(0)
    assert again is not None and again.session.id == 0 and named(again) == [T0, T1]


def test_a_failed_call_ends_the_session() -> None:
    leader, _follower, fetcher = pair()
    one_round(fetcher, leader)
    assert fetcher.session_id != 0
    fetcher.leader_unreachable(0, "UNAVAILABLE: connection refused")
    assert fetcher.session_id == 0
    assert fetcher.partitions[T0].ready(fetcher.settings.backoff_ms)
    request = fetcher.build_fetch_request(fetcher.settings.backoff_ms)
    assert request is not None and request.session.id == 0 and named(request) == [T0]


def test_a_leader_without_sessions_is_fetched_from_in_full_and_asked_again_later() -> None:
    leader, _follower, fetcher = pair(partitions=(0, 1))
    one_round(fetcher, leader)  # truncation; this round's fetch opens a session
    fetcher.reset_session()
    request = fetcher.build_fetch_request(0)
    assert request is not None and request.session.id == 0
    # An older broker ignores the session and answers every partition, with no session id.
    older = answer_for_t(
        common_pb2.FetchPartitionResponse(partition=0, high_watermark=0, log_end_offset=0),
        common_pb2.FetchPartitionResponse(partition=1, high_watermark=0, log_end_offset=0),
    )
    fetcher.handle_fetch_answer(older, 0, request.session.id)
    full = fetcher.build_fetch_request(1)
    assert full is not None and not full.HasField("session") and named(full) == [T0, T1]
    later = fetcher.build_fetch_request(limits.REPLICA_FETCH_SESSION_RETRY_MS)
    assert later is not None and later.HasField("session") and later.session.id == 0


def test_forgotten_partitions_leave_the_leaders_session() -> None:
    leader, _follower, fetcher = pair(partitions=(0, 1))
    one_round(fetcher, leader)
    fetcher.remove_partition(T1)
    request = fetcher.build_fetch_request(0)
    assert request is not None
    assert [(f.topic, f.partition) for f in request.session.forgotten] == [T1]
    leader.core.fetch(request, lambda r: None)
    session = leader.core.replica_sessions.by_replica[2]
    assert list(session.partitions) == [T0]
    assert T1 not in leader.core.replica_sessions.by_partition


def test_an_idle_follower_in_a_session_stays_in_the_isr_and_a_silent_one_leaves_it() -> None:
    leader, follower, fetcher = pair()
    one_round(fetcher, leader)
    p = leader.core.partitions[T0]
    lag_ms = limits.REPLICA_LAG_TIME_MAX_MS
    # Idle: the follower fetches every 500 ms and names nothing; it stays in sync.
    idle_rounds(leader, follower, fetcher, 3 * lag_ms // 500, check_isr=p)
    # A write it fetches at once (its session's fetch wakes for it) keeps it in sync too.
    tick(leader, follower, ms=500)
    leader.produce(batch("busy"), acks=1)
    one_round(fetcher, leader)
    one_round(fetcher, leader)
    assert p.check_isr_shrink(leader.clock.now_ms, lag_ms) is None
    # Silent: no fetch any more. Even at the log end of an idle partition, it leaves the ISR once
    # its session's last fetch is more than the lag ago, as it did when it named every partition.
    tick(leader, ms=lag_ms)
    assert p.check_isr_shrink(leader.clock.now_ms, lag_ms) is None
    tick(leader, ms=1)
    change = p.check_isr_shrink(leader.clock.now_ms, lag_ms)
    assert change is not None and change.new_isr == (1,)


def test_a_write_after_a_long_idle_spell_does_not_push_a_fetching_follower_out() -> None:
    # The follower named the partition last long ago (it never moved since); its session kept
    # fetching. A write moves the log end past it: it was caught up until its session's last fetch.
    leader, follower, fetcher = pair()
    one_round(fetcher, leader)
    p = leader.core.partitions[T0]
    lag_ms = limits.REPLICA_LAG_TIME_MAX_MS
    idle_rounds(leader, follower, fetcher, 2 * lag_ms // 500)
    leader.produce(batch("after a quiet spell"), acks=1)
    tick(leader, follower, ms=400)
    assert p.check_isr_shrink(leader.clock.now_ms, lag_ms) is None


def test_a_follower_kept_out_by_an_isr_change_in_flight_is_taken_in_once_it_ends() -> None:
    # Without a session the follower's next Fetch would propose the expansion again; in a session
    # an idle partition is not named again, so the leader replays the session's position.
    leader, follower = Broker(1), Broker(2)
    leader.register(10)
    follower.register(11)
    leader.leader_and_isr(leader=1, leader_epoch=0, isr=(1,), replicas=(1, 2), live=[leader.node])
    follower.leader_and_isr(leader=1, leader_epoch=0, isr=(1,), replicas=(1, 2), live=[leader.node])
    (fetcher,) = follower.io.started
    p = leader.core.partitions[T0]
    p.pending_isr = (1,)  # an ISR change of the leader's own is waiting for the controller
    one_round(fetcher, leader)
    one_round(fetcher, leader)
    assert not leader.io.spawned, "no expansion while another change is in flight"
    p.isr_change_failed()
    leader.core.replay_session_fetches(p)
    assert [name for name, _ in leader.io.spawned] == ["alter-partition"]
    assert p.pending_isr == (1, 2)


def test_a_change_nobody_notified_reaches_the_follower_at_the_next_sweep() -> None:
    leader, follower, fetcher = pair()
    for v in ("a", "b", "c"):
        leader.produce(batch(v), acks=1)
    one_round(fetcher, leader)
    one_round(fetcher, leader)
    # Retention moves the log start without waking anyone.
    leader.core.partitions[T0].log.advance_log_start_offset(2)
    request = incremental(fetcher, max_wait_ms=0)
    assert answered(leader.fetch_now(request)) == []
    fetcher.handle_fetch_answer(
        common_pb2.FetchResponse(session_id=fetcher.session_id), 0, fetcher.session_id
    )
    tick(leader, follower, ms=limits.REPLICA_FETCH_SESSION_SWEEP_MS)
    request = incremental(fetcher, max_wait_ms=0)
    response = leader.fetch_now(request)
    assert answered(response) == [T0] and response.topics[0].partitions[0].log_start_offset == 2
    fetcher.handle_fetch_answer(response, 0, request.session.id)
    assert follower.core.partitions[T0].log.log_start_offset == 2


def test_a_sweep_of_a_large_session_is_spread_over_several_fetches(monkeypatch: pytest.MonkeyPatch) -> None:
    """No fetch reads more than REPLICA_FETCH_SESSION_SWEEP_PARTITIONS partitions for a sweep:
    in one piece it held the leader's loop for ~100 ms with 3,333 partitions in a session."""
    piece = 5
    monkeypatch.setattr(limits, "REPLICA_FETCH_SESSION_SWEEP_PARTITIONS", piece)
    count = 2 * piece + 3
    leader, _follower, fetcher = pair(partitions=tuple(range(count)))
    one_round(fetcher, leader)
    session = leader.core.replica_sessions.by_replica[2]
    tick(leader, ms=limits.REPLICA_FETCH_SESSION_SWEEP_MS)
    swept: set[int] = set()
    for expected in (piece, piece, 3):
        request = incremental(fetcher, max_wait_ms=0)
        leader.core.replica_sessions.update(session, request, leader.clock.now_ms)
        assert len(session.dirty) == expected
        swept.update(p for _, p in session.dirty)
        session.dirty.clear()  # as an answer that had nothing to tell would
    assert swept == set(range(count)) and not session.sweep_left


def test_a_partition_delayed_by_an_error_is_forgotten_then_named_again_when_its_delay_ends() -> None:
    leader, _follower, fetcher = pair(partitions=(0, 1))
    one_round(fetcher, leader)
    request = incremental(fetcher, max_wait_ms=0)
    leader.fetch_now(request)
    # The answer (as a leader that lost partition 1 would give it) delays partition 1.
    lost = answer_for_t(
        common_pb2.FetchPartitionResponse(partition=1, error_code=common_pb2.NOT_LEADER_OR_FOLLOWER)
    )
    lost.session_id = fetcher.session_id
    fetcher.handle_fetch_answer(lost, 0, request.session.id)
    forgetting = fetcher.build_fetch_request(0)
    assert forgetting is not None and named(forgetting) == []
    assert [(f.topic, f.partition) for f in forgetting.session.forgotten] == [T1]
    fetcher.handle_fetch_answer(leader.fetch_now(forgetting), 0, forgetting.session.id)
    assert list(leader.core.replica_sessions.by_replica[2].partitions) == [T0]
    # After the back-off it agrees on its log end with the leader again, then is named.
    later = fetcher.settings.backoff_ms
    assert fetcher.build_truncation_request(later) is None  # an empty log: straight to FETCHING
    again = fetcher.build_fetch_request(later)
    assert again is not None and named(again) == [T1] and again.session.id == fetcher.session_id
    fetcher.handle_fetch_answer(leader.fetch_now(again), later, again.session.id)
    assert list(leader.core.replica_sessions.by_replica[2].partitions) == [T0, T1]


def follower_fetch(
    topic_id: str, fetch_offset: int, *, session_id: int | None = None
) -> common_pb2.FetchRequest:
    request = common_pb2.FetchRequest(replica_id=2, max_wait_ms=0, max_bytes=1 << 20)
    topic = request.topics.add(topic="t", topic_id=topic_id)
    topic.partitions.add(
        partition=0, fetch_offset=fetch_offset, current_leader_epoch=0, partition_max_bytes=1 << 20
    )
    if session_id is not None:
        request.session.id = session_id
    return request


def test_a_follower_of_a_deleted_topic_of_the_same_name_moves_neither_the_hw_nor_the_isr() -> None:
    """Topic t was deleted and created again: broker 2 still follows the old t-0 (it missed the
    StopReplica), at an offset far past the new log's end and at the same leader epoch 0. Its
    fetch, with or without a session, must not count for the new t-0: counted, it put broker 2's
    LEO at the old offset and the HW over records broker 2 does not have (the simulation found it)."""
    leader = Broker(1)
    leader.register(10)
    leader.leader_and_isr(
        leader=1, leader_epoch=0, isr=(1, 2), replicas=(1, 2), live=[leader.node], topic_id="new-id"
    )
    leader.produce(batch("a", "b"), acks=1)
    p = leader.core.partitions[T0]
    for request in (follower_fetch("old-id", 63), follower_fetch("old-id", 63, session_id=0)):
        answer = leader.fetch_now(request)
        (pr,) = answer.topics[0].partitions
        assert pr.error_code == common_pb2.INCONSISTENT_TOPIC_ID, answer
        assert "deleted and created again" in pr.error_message
        assert p.followers[2].log_end_offset == -1 and p.high_watermark == 0
    # The periodic pass replays what sessions hold for followers outside the ISR (or unknown):
    # the old topic's position is not this partition's.
    leader.core.replay_session_fetches(p)
    assert p.followers[2].log_end_offset == -1 and p.high_watermark == 0

    # The same follower once it heard of the new topic: its fetch counts.
    answer = leader.fetch_now(follower_fetch("new-id", 2))
    assert answer.topics[0].partitions[0].error_code == common_pb2.NONE
    assert p.followers[2].log_end_offset == 2 and p.high_watermark == 2
    # A fetch naming no topic id (a consumer, a follower from before ids were sent) is not checked.
    assert leader.fetch_now(follower_fetch("", 2)).topics[0].partitions[0].error_code == common_pb2.NONE


def test_a_follower_sends_the_topic_id_it_was_given() -> None:
    leader, follower = Broker(1), Broker(2)
    leader.register(10)
    follower.register(11)
    for broker in (leader, follower):
        broker.leader_and_isr(
            leader=1, leader_epoch=0, isr=(1, 2), replicas=(1, 2), live=[leader.node], topic_id="the-id"
        )
    (fetcher,) = follower.io.started
    assert fetcher.build_truncation_request(0) is None, "an empty log goes straight to FETCHING"
    request = fetcher.build_fetch_request(0)
    assert request is not None and [t.topic_id for t in request.topics] == ["the-id"]
