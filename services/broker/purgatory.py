"""The purgatory: produce, fetch and delete-records requests that wait, and the rules that complete them.

Kafka's DelayedOperationPurgatory with DelayedProduce, DelayedFetch and DelayedDeleteRecords, pure: no
clock, no event loop. An operation is watched under the partitions it waits on;
whoever changes a partition (an append, a HW move, a leadership change, a stopped
replica) calls `check_and_complete(tp, now_ms)`, and the driver calls
`try_complete(now_ms)` once more at the operation's deadline, where it completes
whatever its state (expiry). Completing calls the operation's `on_complete` with
the response, exactly once.

Owned by the broker's one event loop (or the simulation's); no locks.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from clients.common.errors import check
from clients.common.types import TopicPartitionKey
from protos.highwater.v1 import common_pb2
from services.broker.partition import Partition, Role
from services.common import limits


def fetch_answers_now(
    *,
    max_wait_ms: int,
    partitions_asked: int,
    bytes_read: int,
    min_bytes: int,
    has_error: bool,
    now_ms: int,
    deadline_ms: int,
) -> bool:
    """Whether a Fetch is answered now rather than kept waiting (DelayedFetch's conditions).

    At once when it may not wait (max_wait_ms <= 0), asks for nothing, already has
    min_bytes (at least one byte), or met an error on some partition (the leader moved,
    the partition is gone, the offset is out of range, the epoch is fenced); otherwise
    when new data brings it to min_bytes, or at its deadline with whatever it has.
    """
    return (
        max_wait_ms <= 0
        or partitions_asked == 0
        or bytes_read >= max(min_bytes, 1)
        or has_error
        or now_ms >= deadline_ms
    )


@dataclass(frozen=True, slots=True)
class AwaitedAppend:
    """One partition of an acks=all produce: where its batches end, and in which leader epoch."""

    required_offset: int
    leader_epoch: int
    # Whatever the broker's observer noted at append time (the simulation's checker).
    note: object = None


@dataclass(eq=False)
class DelayedProduce:
    """An acks=all Produce waiting for the ISR (Kafka's DelayedProduce).

    `results` holds every partition's answer, already filled for the partitions that
    failed or did not wait; `awaited` the partitions still waiting.
    """

    results: dict[TopicPartitionKey, common_pb2.ProducePartitionResponse]
    awaited: dict[TopicPartitionKey, AwaitedAppend]
    deadline_ms: int
    timeout_ms: int
    partition: Callable[[TopicPartitionKey], Partition | None]
    on_complete: Callable[[common_pb2.ProduceResponse], None]
    # Called for each partition acknowledged without error (the simulation's checker).
    on_acknowledged: Callable[[Partition, AwaitedAppend], None] = lambda p, append: None
    completed: bool = False
    # Cancels the expiry timer the driver set for this operation (see `_mark_completed`).
    cancel_expiry: Callable[[], None] | None = field(default=None, repr=False)

    @property
    def keys(self) -> list[TopicPartitionKey]:
        return list(self.awaited)

    def try_complete(self, now_ms: int, changed: TopicPartitionKey | None = None) -> bool:
        """Answer every partition that is done; complete when none waits or the deadline passed.

        With `changed` (the purgatory's wake-up for one partition) only that partition is
        checked: another's answer can change only when it is itself notified, and checking
        all of them at every wake-up made a 1,000-partition acks=all Produce cost a million
        checks (each follower fetch moves the HW of each partition in turn).
        """
        if self.completed:
            return True
        if changed is not None and now_ms < self.deadline_ms:
            append = self.awaited.get(changed)
            if append is not None:
                self._settle(changed, append)
        else:
            for tp, append in list(self.awaited.items()):
                self._settle(tp, append)
        if self.awaited and now_ms >= self.deadline_ms:
            for tp in self.awaited:
                self.results[tp].error_code = common_pb2.REQUEST_TIMED_OUT
                self.results[tp].error_message = (
                    f"the ISR did not acknowledge within {self.timeout_ms} ms; the write may still be "
                    "replicated, retry with the idempotent producer to avoid a duplicate"
                )
            self.awaited.clear()
        if self.awaited:
            return False
        _mark_completed(self)
        self.on_complete(produce_response(self.results))
        return True

    def _settle(self, tp: TopicPartitionKey, append: AwaitedAppend) -> None:
        """Fill tp's answer and stop awaiting it if its write is acknowledged or failed."""
        p = self.partition(tp)
        res = self.results[tp]
        if p is None:
            res.error_code = common_pb2.NOT_LEADER_OR_FOLLOWER
            res.error_message = f"the replica of {tp[0]}-{tp[1]} was stopped before the write was replicated"
            del self.awaited[tp]
            return
        done, error = p.check_enough_replicas_reach_offset(append.required_offset, append.leader_epoch)
        if not done:
            return
        if error is not None:
            res.error_code, res.error_message = error.code, error.message
        else:
            self.on_acknowledged(p, append)
        del self.awaited[tp]


def produce_response(
    results: dict[TopicPartitionKey, common_pb2.ProducePartitionResponse],
) -> common_pb2.ProduceResponse:
    by_topic: dict[str, list[common_pb2.ProducePartitionResponse]] = {}
    for (topic, _), res in results.items():
        by_topic.setdefault(topic, []).append(res)
    return common_pb2.ProduceResponse(
        topics=[common_pb2.ProduceTopicResponse(topic=t, partitions=ps) for t, ps in by_topic.items()]
    )


@dataclass(eq=False)
class DelayedFetch:
    """A Fetch waiting for min_bytes (Kafka's DelayedFetch).

    `read` reads every asked partition now and returns (response, bytes read, whether
    some partition answered an error); the read that completes the fetch is its answer.
    `partition_state`, when given, sums up everything a read of one partition depends on
    (which replica object, role, leader epoch, log start, the end the reader may read
    to): a try before the deadline woken for a partition whose state is what the last
    read saw would read the same answer, so it is skipped (a leader's follower fetches
    are woken by every append and HW move of their partitions, most of them not changing
    what this fetch may read). Only the woken partition's state is compared: comparing
    every partition's at every wake-up cost a million comparisons per 1,000-partition
    write.
    """

    request: common_pb2.FetchRequest
    keys: list[TopicPartitionKey]
    deadline_ms: int
    read: Callable[[common_pb2.FetchRequest], tuple[common_pb2.FetchResponse, int, bool]]
    on_complete: Callable[[common_pb2.FetchResponse], None]
    partition_state: Callable[[TopicPartitionKey], object] | None = None
    completed: bool = False
    cancel_expiry: Callable[[], None] | None = field(default=None, repr=False)
    # Each partition's state when it was last read (None: never read).
    _read_at: dict[TopicPartitionKey, object] | None = field(default=None, repr=False)

    def try_complete(self, now_ms: int, changed: TopicPartitionKey | None = None) -> bool:
        if self.completed:
            return True
        state_of = self.partition_state
        if state_of is not None and now_ms < self.deadline_ms:
            last = self._read_at
            if last is not None:
                if changed is not None:
                    if changed in last and state_of(changed) == last[changed]:
                        return False
                elif all(state_of(tp) == seen for tp, seen in last.items()):
                    return False
            self._read_at = {tp: state_of(tp) for tp in self.keys}
        response, bytes_read, has_error = self.read(self.request)
        if not fetch_answers_now(
            max_wait_ms=self.request.max_wait_ms,
            partitions_asked=len(self.keys),
            bytes_read=bytes_read,
            min_bytes=self.request.min_bytes,
            has_error=has_error,
            now_ms=now_ms,
            deadline_ms=self.deadline_ms,
        ):
            return False
        _mark_completed(self)
        self.on_complete(response)
        return True


@dataclass(frozen=True, slots=True)
class AwaitedLogStart:
    """One partition of a DeleteRecords: the log start offset asked, in which leader epoch."""

    required_offset: int
    leader_epoch: int


@dataclass(eq=False)
class DelayedDeleteRecords:
    """A DeleteRecords waiting for the ISR to take the new log start offset (Kafka's
    DelayedDeleteRecords).

    The leader moved its own log start before this was made; each follower takes it from its
    next Fetch answer and reports it in its following Fetch. A partition is answered with its
    low watermark (Partition.low_watermark) once that reaches the asked offset;
    NOT_LEADER_OR_FOLLOWER once this replica no longer leads in the epoch it was asked in;
    REQUEST_TIMED_OUT at the deadline. `results` holds every partition's answer, already filled
    for those that failed at once.
    """

    results: dict[TopicPartitionKey, common_pb2.DeleteRecordsPartitionResponse]
    awaited: dict[TopicPartitionKey, AwaitedLogStart]
    deadline_ms: int
    timeout_ms: int
    partition: Callable[[TopicPartitionKey], Partition | None]
    on_complete: Callable[[common_pb2.DeleteRecordsResponse], None]
    completed: bool = False
    cancel_expiry: Callable[[], None] | None = field(default=None, repr=False)

    @property
    def keys(self) -> list[TopicPartitionKey]:
        return list(self.awaited)

    def try_complete(self, now_ms: int, changed: TopicPartitionKey | None = None) -> bool:
        if self.completed:
            return True
        for tp, awaited in list(self.awaited.items()):
            if changed is None or tp == changed:
                self._settle(tp, awaited)
        if self.awaited and now_ms >= self.deadline_ms:
            for tp in self.awaited:
                res = self.results[tp]
                res.error_code = common_pb2.REQUEST_TIMED_OUT
                res.error_message = (
                    f"the leader of {tp[0]}-{tp[1]} moved its log start offset, but not every ISR "
                    f"member took it within {self.timeout_ms} ms (low watermark "
                    f"{res.low_watermark}); it follows on its next fetches"
                )
                res.low_watermark = -1
            self.awaited.clear()
        if self.awaited:
            return False
        _mark_completed(self)
        by_topic: dict[str, list[common_pb2.DeleteRecordsPartitionResponse]] = {}
        for (topic, _), res in self.results.items():
            by_topic.setdefault(topic, []).append(res)
        self.on_complete(
            common_pb2.DeleteRecordsResponse(
                topics=[
                    common_pb2.DeleteRecordsTopicResponse(topic=t, partitions=ps)
                    for t, ps in by_topic.items()
                ]
            )
        )
        return True

    def _settle(self, tp: TopicPartitionKey, awaited: AwaitedLogStart) -> None:
        """Fill tp's answer and stop awaiting it if the ISR has the log start or leadership moved."""
        p = self.partition(tp)
        res = self.results[tp]
        if p is None or p.role is not Role.LEADER or p.leader_epoch != awaited.leader_epoch:
            res.error_code = common_pb2.NOT_LEADER_OR_FOLLOWER
            res.error_message = (
                f"leadership of {tp[0]}-{tp[1]} moved before every ISR member took the new log start "
                "offset; ask the new leader again (the same offset is a no-op where it was taken)"
            )
            res.low_watermark = -1
            del self.awaited[tp]
            return
        low = p.low_watermark
        res.low_watermark = low
        if low >= awaited.required_offset:
            del self.awaited[tp]


DelayedOperation = DelayedProduce | DelayedFetch | DelayedDeleteRecords


def _mark_completed(op: DelayedOperation) -> None:
    """Mark op completed and drop its expiry timer (Kafka's forceComplete), before it answers.

    The timer must go: left set, it holds the operation (request, response, callbacks) until
    the deadline, a request timeout after the answer went out.
    """
    op.completed = True
    if op.cancel_expiry is not None:
        op.cancel_expiry()
        op.cancel_expiry = None


@dataclass
class Purgatory:
    """Waiting operations by the partition they wait on.

    An operation answered through one of its partitions (or by its expiry timer) stays in the
    lists of its other partitions until they change or it is purged. A follower's fetch watches
    every partition it follows and is answered as soon as one of them has data: under load on
    a few partitions, the lists of the idle ones kept every answered fetch (its request, its
    read state) for as long as the load lasted (seen at 10,000 partitions). As Kafka's
    purgatory (purgeInterval), once the entries over all lists pass twice what the last purge
    left (and at least PURGATORY_PURGE_ENTRIES_MIN), every list drops its answered
    operations: each purge walks at most as many entries as were added since the last one.
    """

    watchers: dict[TopicPartitionKey, list[DelayedOperation]] = field(default_factory=dict)
    # Entries over all watcher lists (an operation counts once per partition it watches).
    entries: int = 0
    _purge_at: int = limits.PURGATORY_PURGE_ENTRIES_MIN

    def try_complete_else_watch(self, op: DelayedOperation, now_ms: int) -> bool:
        """Complete op now if it can; otherwise watch it under its partitions. Returns whether completed."""
        if op.try_complete(now_ms):
            return True
        keys = dict.fromkeys(op.keys)
        for tp in keys:
            self.watchers.setdefault(tp, []).append(op)
        self.entries += len(keys)
        if self.entries > self._purge_at:
            self.purge_all_completed()
        return False

    def check_and_complete(self, tp: TopicPartitionKey, now_ms: int) -> int:
        """tp changed: try every operation watching it; returns how many completed."""
        ops = self.watchers.pop(tp, None)
        if not ops:
            return 0
        self.entries -= len(ops)
        completed = 0
        still: list[DelayedOperation] = []
        for op in ops:
            if op.completed:
                continue
            if op.try_complete(now_ms, tp):
                completed += 1
            else:
                still.append(op)
        if still:
            # An operation completed from here may have added watchers for tp meanwhile.
            self.watchers.setdefault(tp, []).extend(still)
            self.entries += len(still)
        return completed

    def purge_completed(self, tp: TopicPartitionKey) -> None:
        ops = self.watchers.get(tp)
        if ops is not None:
            kept = [op for op in ops if not op.completed]
            self.entries -= len(ops) - len(kept)
            if kept:
                self.watchers[tp] = kept
            else:
                del self.watchers[tp]

    def purge_all_completed(self) -> None:
        """Drop every answered operation from every list; the next purge comes once the entries
        double (and grow by at least PURGATORY_PURGE_ENTRIES_MIN)."""
        for tp in list(self.watchers):
            self.purge_completed(tp)
        check(
            self.entries == sum(len(ops) for ops in self.watchers.values()),
            "the purgatory's entry count drifted from its lists",
        )
        self._purge_at = max(2 * self.entries, self.entries + limits.PURGATORY_PURGE_ENTRIES_MIN)

    def complete_all(self, now_ms: int) -> None:
        """Answer everything now (the broker is closing): each op completes by its own rules
        at a deadline of now, so waiting produces answer NOT_LEADER_OR_FOLLOWER or
        REQUEST_TIMED_OUT and fetches answer what they have."""
        for ops in list(self.watchers.values()):
            for op in ops:
                if not op.completed:
                    op.deadline_ms = min(op.deadline_ms, now_ms)
                    op.try_complete(now_ms)
                    check(op.completed, "a delayed operation did not complete at its deadline")
        self.watchers.clear()
        self.entries = 0

    def __len__(self) -> int:
        return sum(1 for ops in self.watchers.values() for op in ops if not op.completed)
