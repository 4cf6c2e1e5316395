"""The purgatory's completion rules (services/broker/purgatory.py), on real partitions."""

from __future__ import annotations

from clients.common.records import Record, encode_batch
from protos.highwater.v1 import common_pb2
from services.broker.log import Log, LogConfig, MemoryStorage
from services.broker.partition import LeaderAndIsrState, Partition
from services.broker.purgatory import (
    AwaitedAppend,
    DelayedFetch,
    DelayedProduce,
    Purgatory,
    TopicPartitionKey,
    fetch_answers_now,
)
from services.common import limits

TP: TopicPartitionKey = ("t", 0)


def batch(n: int = 1) -> bytes:
    return encode_batch([Record(None, f"v{i}".encode(), [], 1_000) for i in range(n)])


def leader(isr: tuple[int, ...] = (1, 2), min_isr: int = 1, epoch: int = 0) -> Partition:
    log = Log.open("/p/t-0", LogConfig(), storage=MemoryStorage(), now_ms=0)
    p = Partition("t", 0, 1, log, min_insync_replicas=min_isr)
    p.become_leader(LeaderAndIsrState(1, epoch, isr, (1, 2, 3), 1, 1), now_ms=0)
    return p


class Answers:
    """Collects what on_complete was called with."""

    def __init__(self) -> None:
        self.produce: list[common_pb2.ProduceResponse] = []
        self.fetch: list[common_pb2.FetchResponse] = []


def delayed_produce(
    partitions: dict[TopicPartitionKey, Partition | None],
    awaited: dict[TopicPartitionKey, int],
    answers: Answers,
    *,
    deadline_ms: int = 1_000,
    epoch: int = 0,
) -> DelayedProduce:
    return DelayedProduce(
        results={tp: common_pb2.ProducePartitionResponse(partition=tp[1]) for tp in awaited},
        awaited={tp: AwaitedAppend(required_offset=end, leader_epoch=epoch) for tp, end in awaited.items()},
        deadline_ms=deadline_ms,
        timeout_ms=deadline_ms,
        partition=partitions.get,
        on_complete=answers.produce.append,
    )


def only_partition(response: common_pb2.ProduceResponse) -> common_pb2.ProducePartitionResponse:
    assert len(response.topics) == 1 and len(response.topics[0].partitions) == 1
    return response.topics[0].partitions[0]


# ---- fetch_answers_now --------------------------------------------------------------------------


def answers_now(**changes: int | bool) -> bool:
    """fetch_answers_now for a fetch that may wait (500 ms, to its deadline at 500), asked one partition
    and read 10 of its min_bytes 100 with no error, at 0 ms: but for the changes."""
    waiting: dict[str, int | bool] = dict(
        max_wait_ms=500,
        partitions_asked=1,
        bytes_read=10,
        min_bytes=100,
        has_error=False,
        now_ms=0,
        deadline_ms=500,
    )
    return fetch_answers_now(**{**waiting, **changes})  # type: ignore[arg-type]


def test_fetch_waits_only_while_it_may_wait_and_has_neither_enough_bytes_nor_an_error() -> None:
    assert not answers_now()
    assert answers_now(max_wait_ms=0)
    assert answers_now(partitions_asked=0)
    assert answers_now(bytes_read=100)
    assert answers_now(has_error=True)
    assert answers_now(now_ms=500)


def test_min_bytes_zero_still_waits_for_one_byte() -> None:
    # Kafka answers a min_bytes=0 fetch at once only when it may not wait; with nothing read it waits.
    assert not answers_now(bytes_read=0, min_bytes=0)
    assert answers_now(bytes_read=1, min_bytes=0)


# ---- DelayedProduce ------------------------------------------------------------------------------


def test_acks_all_produce_completes_once_the_high_watermark_reaches_its_end() -> None:
    p = leader(isr=(1, 2))
    end = p.append_as_leader(batch(3), acks=-1, now_ms=0).next_offset
    answers = Answers()
    op = delayed_produce({TP: p}, {TP: end}, answers)
    purgatory = Purgatory()
    assert not purgatory.try_complete_else_watch(op, now_ms=0)
    assert len(purgatory) == 1
    p.record_follower_fetch(2, 2, now_ms=1)  # the follower has two of the three records
    assert purgatory.check_and_complete(TP, now_ms=1) == 0 and not answers.produce
    p.record_follower_fetch(2, end, now_ms=2)
    assert purgatory.check_and_complete(TP, now_ms=2) == 1
    assert [only_partition(r).error_code for r in answers.produce] == [common_pb2.NONE]
    assert len(purgatory) == 0


def test_acks_all_produce_times_out_at_its_deadline_and_says_a_retry_may_duplicate() -> None:
    p = leader(isr=(1, 2))
    end = p.append_as_leader(batch(), acks=-1, now_ms=0).next_offset
    answers = Answers()
    op = delayed_produce({TP: p}, {TP: end}, answers, deadline_ms=30_000)
    assert not op.try_complete(now_ms=29_999)
    assert op.try_complete(now_ms=30_000)
    res = only_partition(answers.produce[0])
    assert res.error_code == common_pb2.REQUEST_TIMED_OUT
    assert "30000 ms" in res.error_message and "idempotent" in res.error_message


def test_acks_all_produce_is_not_acknowledged_when_leadership_moved_even_if_the_hw_got_there() -> None:
    # Written in epoch 0; the broker then leads in epoch 1 (a new LeaderAndIsr): the record may be
    # truncated away by whoever led in between, so it must not be acknowledged.
    p = leader(isr=(1, 2), epoch=0)
    end = p.append_as_leader(batch(), acks=-1, now_ms=0).next_offset
    p.become_leader(LeaderAndIsrState(1, 1, (1,), (1, 2, 3), 2, 1), now_ms=5)
    assert p.maybe_advance_high_watermark() and p.high_watermark >= end
    answers = Answers()
    assert delayed_produce({TP: p}, {TP: end}, answers, epoch=0).try_complete(now_ms=6)
    assert only_partition(answers.produce[0]).error_code == common_pb2.NOT_LEADER_OR_FOLLOWER


def test_acks_all_produce_on_a_stopped_replica_answers_not_leader() -> None:
    answers = Answers()
    assert delayed_produce({TP: None}, {TP: 1}, answers).try_complete(now_ms=0)
    res = only_partition(answers.produce[0])
    assert res.error_code == common_pb2.NOT_LEADER_OR_FOLLOWER and "stopped" in res.error_message


def test_acks_all_produce_answers_not_enough_replicas_after_append_when_the_isr_shrank() -> None:
    p = leader(isr=(1, 2), min_isr=2)
    end = p.append_as_leader(batch(), acks=-1, now_ms=0).next_offset
    p.update_isr((1,), partition_epoch=2, leader_epoch=0)  # the controller committed a shrink
    assert p.maybe_advance_high_watermark()
    answers = Answers()
    assert delayed_produce({TP: p}, {TP: end}, answers).try_complete(now_ms=1)
    res = only_partition(answers.produce[0])
    assert (
        res.error_code == common_pb2.NOT_ENOUGH_REPLICAS_AFTER_APPEND
        and "min.insync.replicas=2" in res.error_message
    )


def test_a_produce_over_two_partitions_answers_once_when_both_are_done() -> None:
    p0, p1 = leader(isr=(1, 2)), leader(isr=(1, 2))
    other: TopicPartitionKey = ("t", 1)
    end0 = p0.append_as_leader(batch(), acks=-1, now_ms=0).next_offset
    end1 = p1.append_as_leader(batch(), acks=-1, now_ms=0).next_offset
    answers = Answers()
    op = delayed_produce({TP: p0, other: p1}, {TP: end0, other: end1}, answers)
    purgatory = Purgatory()
    assert not purgatory.try_complete_else_watch(op, now_ms=0)
    p0.record_follower_fetch(2, end0, now_ms=1)
    assert purgatory.check_and_complete(TP, now_ms=1) == 0, "partition 1 still waits"
    assert not answers.produce
    p1.record_follower_fetch(2, end1, now_ms=2)
    assert purgatory.check_and_complete(other, now_ms=2) == 1
    assert len(answers.produce) == 1
    codes = sorted((r.partition, r.error_code) for t in answers.produce[0].topics for r in t.partitions)
    assert codes == [(0, common_pb2.NONE), (1, common_pb2.NONE)]
    # The completed operation, still listed under partition 0, is dropped without a second answer.
    assert purgatory.check_and_complete(TP, now_ms=3) == 0 and len(answers.produce) == 1
    assert len(purgatory) == 0


# ---- DelayedFetch ---------------------------------------------------------------------------------


class FetchReads:
    """A fetch's read: how many bytes each read finds (the test moves it forward)."""

    def __init__(self) -> None:
        self.bytes_available = 0
        self.error = False
        self.reads = 0

    def __call__(self, request: common_pb2.FetchRequest) -> tuple[common_pb2.FetchResponse, int, bool]:
        self.reads += 1
        return common_pb2.FetchResponse(), self.bytes_available, self.error


def delayed_fetch(
    reads: FetchReads, answers: Answers, *, min_bytes: int = 100, deadline_ms: int = 500
) -> DelayedFetch:
    request = common_pb2.FetchRequest(replica_id=-1, max_wait_ms=deadline_ms, min_bytes=min_bytes)
    return DelayedFetch(request, [TP], deadline_ms, reads, answers.fetch.append)


def test_fetch_waits_in_the_purgatory_until_min_bytes_arrive() -> None:
    reads, answers, purgatory = FetchReads(), Answers(), Purgatory()
    op = delayed_fetch(reads, answers, min_bytes=100)
    reads.bytes_available = 40
    assert not purgatory.try_complete_else_watch(op, now_ms=0)
    assert purgatory.check_and_complete(TP, now_ms=10) == 0
    reads.bytes_available = 100
    assert purgatory.check_and_complete(TP, now_ms=20) == 1
    assert len(answers.fetch) == 1 and op.completed


def test_fetch_answers_at_its_deadline_with_what_it_has() -> None:
    reads, answers = FetchReads(), Answers()
    op = delayed_fetch(reads, answers, deadline_ms=500)
    assert not op.try_complete(now_ms=499)
    assert op.try_complete(now_ms=500) and len(answers.fetch) == 1


def test_fetch_answers_at_once_when_a_partition_has_an_error() -> None:
    reads, answers = FetchReads(), Answers()
    reads.error = True
    assert Purgatory().try_complete_else_watch(delayed_fetch(reads, answers), now_ms=0)
    assert len(answers.fetch) == 1


def test_completing_twice_answers_once() -> None:
    reads, answers = FetchReads(), Answers()
    op = delayed_fetch(reads, answers)
    assert op.try_complete(now_ms=500) and op.try_complete(now_ms=600)
    assert len(answers.fetch) == 1 and reads.reads == 1


# ---- closing ------------------------------------------------------------------------------------


def test_complete_all_answers_every_waiting_operation_by_its_own_rules() -> None:
    p = leader(isr=(1, 2))
    end = p.append_as_leader(batch(), acks=-1, now_ms=0).next_offset
    answers, reads, purgatory = Answers(), FetchReads(), Purgatory()
    assert not purgatory.try_complete_else_watch(
        delayed_produce({TP: p}, {TP: end}, answers, deadline_ms=30_000), now_ms=0
    )
    assert not purgatory.try_complete_else_watch(delayed_fetch(reads, answers, deadline_ms=500), now_ms=0)
    assert len(purgatory) == 2
    purgatory.complete_all(now_ms=10)
    assert only_partition(answers.produce[0]).error_code == common_pb2.REQUEST_TIMED_OUT
    assert len(answers.fetch) == 1
    assert len(purgatory) == 0 and not purgatory.watchers


def test_purge_completed_drops_answered_operations_only() -> None:
    reads, answers, purgatory = FetchReads(), Answers(), Purgatory()
    first, second = delayed_fetch(reads, answers), delayed_fetch(reads, answers)
    assert not purgatory.try_complete_else_watch(first, now_ms=0)
    assert not purgatory.try_complete_else_watch(second, now_ms=0)
    assert first.try_complete(now_ms=500)  # answered at its deadline by the driver, not through the purgatory
    purgatory.purge_completed(TP)
    assert purgatory.watchers[TP] == [second]
    assert second.try_complete(now_ms=500)
    purgatory.purge_completed(TP)
    assert TP not in purgatory.watchers


def test_a_fetch_whose_readable_state_did_not_change_is_not_read_again_until_its_deadline() -> None:
    reads, answers = FetchReads(), Answers()
    state = {"hw": 0}
    op = delayed_fetch(reads, answers, min_bytes=100, deadline_ms=500)
    op.partition_state = lambda tp: state["hw"]
    assert not op.try_complete(now_ms=0) and reads.reads == 1
    assert not op.try_complete(now_ms=10) and reads.reads == 1, "same state: the same answer, not read"
    assert not op.try_complete(now_ms=11, changed=TP) and reads.reads == 1, "woken for TP, unchanged"
    state["hw"] = 1
    reads.bytes_available = 100
    assert op.try_complete(now_ms=20, changed=TP) and reads.reads == 2


def test_a_fetch_is_read_at_its_deadline_even_when_nothing_changed() -> None:
    reads, answers = FetchReads(), Answers()
    op = delayed_fetch(reads, answers, min_bytes=100, deadline_ms=500)
    op.partition_state = lambda tp: "unchanged"
    assert not op.try_complete(now_ms=0)
    assert op.try_complete(now_ms=500) and reads.reads == 2 and len(answers.fetch) == 1


def test_a_fetch_woken_for_one_partition_compares_only_that_partitions_state() -> None:
    """Each wake-up costs one partition's state, not every partition's (1,000 partitions woken
    once each cost a million comparisons); a change seen on the woken partition reads again."""
    reads, answers = FetchReads(), Answers()
    keys: list[TopicPartitionKey] = [("t", i) for i in range(1_000)]
    state = dict.fromkeys(keys, 0)
    asked: list[TopicPartitionKey] = []

    def partition_state(tp: TopicPartitionKey) -> int:
        asked.append(tp)
        return state[tp]

    request = common_pb2.FetchRequest(replica_id=-1, max_wait_ms=500, min_bytes=100)
    op = DelayedFetch(request, keys, 500, reads, answers.fetch.append, partition_state=partition_state)
    purgatory = Purgatory()
    assert not purgatory.try_complete_else_watch(op, now_ms=0)
    asked.clear()
    for tp in keys:
        assert purgatory.check_and_complete(tp, now_ms=1) == 0
    assert len(asked) == len(keys) and reads.reads == 1, "one state per wake-up, nothing read again"
    state[("t", 7)] = 1
    reads.bytes_available = 100
    assert purgatory.check_and_complete(("t", 7), now_ms=2) == 1 and reads.reads == 2


def test_a_produce_woken_for_one_partition_checks_only_that_partition() -> None:
    """A 1,000-partition acks=all Produce woken once per partition looks each up once, and is
    answered when the last one is acknowledged."""
    keys: list[TopicPartitionKey] = [("t", i) for i in range(1_000)]
    partitions = {tp: leader(isr=(1, 2)) for tp in keys}
    ends = {tp: p.append_as_leader(batch(), acks=-1, now_ms=0).next_offset for tp, p in partitions.items()}
    looked_up: list[TopicPartitionKey] = []

    def partition(tp: TopicPartitionKey) -> Partition | None:
        looked_up.append(tp)
        return partitions[tp]

    answers = Answers()
    op = delayed_produce(partitions, ends, answers)
    op.partition = partition
    purgatory = Purgatory()
    assert not purgatory.try_complete_else_watch(op, now_ms=0)
    looked_up.clear()
    for i, tp in enumerate(keys):
        partitions[tp].record_follower_fetch(2, ends[tp], now_ms=1)
        assert purgatory.check_and_complete(tp, now_ms=1) == (1 if i == len(keys) - 1 else 0)
    assert looked_up == keys, "each partition checked once, when it was woken"
    (response,) = answers.produce
    assert all(r.error_code == common_pb2.NONE for t in response.topics for r in t.partitions)
    assert sum(len(t.partitions) for t in response.topics) == 1_000


def test_answered_fetches_do_not_pile_up_in_the_lists_of_partitions_that_never_change() -> None:
    """A follower's fetch watches every partition it follows and is answered through the one
    that got data: its entries under the idle ones are purged once the lists double (Kafka's
    purgeInterval), never an operation still waiting."""
    hot, cold = ("t", 0), [("t", i) for i in range(1, 101)]
    purgatory, answers = Purgatory(), Answers()
    waiting_reads = FetchReads()  # never has bytes: waits on the cold partitions throughout
    still_waiting = DelayedFetch(
        common_pb2.FetchRequest(replica_id=-1, max_wait_ms=10**9, min_bytes=1),
        cold,
        10**9,
        waiting_reads,
        answers.fetch.append,
    )
    assert not purgatory.try_complete_else_watch(still_waiting, now_ms=0)
    largest = 0
    for round_ in range(2_000):
        reads = FetchReads()
        op = DelayedFetch(
            common_pb2.FetchRequest(replica_id=2, max_wait_ms=500, min_bytes=1),
            [hot, *cold],
            round_ + 500,
            reads,
            answers.fetch.append,
        )
        assert not purgatory.try_complete_else_watch(op, now_ms=round_)
        reads.bytes_available = 10
        assert purgatory.check_and_complete(hot, now_ms=round_) == 1
        largest = max(largest, purgatory.entries)
    assert purgatory.entries == sum(len(ops) for ops in purgatory.watchers.values())
    # Without the purge: 2,000 answered fetches under 100 idle partitions, 200,000 entries.
    assert largest <= 2 * len(cold) + limits.PURGATORY_PURGE_ENTRIES_MIN + len(cold) + 1
    assert all(still_waiting in purgatory.watchers[tp] for tp in cold), "a waiting fetch stays watched"
    waiting_reads.bytes_available = 1
    assert purgatory.check_and_complete(cold[0], now_ms=3_000) == 1 and still_waiting.completed
