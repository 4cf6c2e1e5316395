"""One partition's replication state on one broker: pure logic, no I/O, no clock.

Owned by the broker's event loop (one asyncio task touches it at a time); time
comes in as `now_ms`, effects go out as return values (an ISR change to ask the
controller for, whether the high watermark moved).

Invariants kept here (docs/ARCHITECTURE.md, "Invariants"):
- HW <= LEO on every replica; a leader's HW never decreases.
- leader_epoch never decreases for the partition on this broker.
- An acks=all append is refused up front when |ISR| < min.insync.replicas.
- The leader's HW is the minimum LEO over the ISR, counting members that an
  in-flight AlterPartition is adding (Kafka's "maximal ISR"), so a shrink is
  never assumed before the controller commits it.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from clients.common.control_records import ControlType, control_types, encode_marker
from clients.common.errors import (
    FencedLeaderEpoch,
    HighwaterError,
    InvalidProducerEpoch,
    NotEnoughReplicas,
    NotEnoughReplicasAfterAppend,
    NotLeaderOrFollower,
    UnknownLeaderEpoch,
    check,
)
from clients.common.record_batch import BatchHeader, apply_batch_fixes, iter_batch_headers, validate_batches
from clients.common.record_validation import TimestampRules, validate_records
from clients.common.types import TopicPartitionKey
from services.broker.log import Log
from services.broker.log.txn_index import AbortedTxn
from services.broker.producer_state import (
    ProducerStateManager,
    UnreadableSnapshot,
    decode_snapshot,
    encode_snapshot,
)


class Role(enum.Enum):
    LEADER = "leader"
    FOLLOWER = "follower"
    # Hosted, neither leading nor following: not yet told (a new replica), or stopped by a
    # StopReplica that keeps the log.
    NONE = "none"
    # Its log is closed for good: deleted (StopReplica with delete, topic deletion) or the
    # broker is stopping. A replica hosted again is a new Partition with a new log.
    CLOSED = "closed"


# Where each role may go. Leading and following change with every LeaderAndIsr (the same role
# again at a newer epoch: a new leader to follow, a new epoch to lead), and a StopReplica may
# come again (the controller resends it). The one move that must never happen is out of
# CLOSED: its log is closed or deleted, and a replica that led or followed on it would
# serve reads from, or append to, a log that is gone.
ROLE_TRANSITIONS: dict[Role, frozenset[Role]] = {
    Role.NONE: frozenset({Role.LEADER, Role.FOLLOWER, Role.NONE, Role.CLOSED}),
    Role.LEADER: frozenset({Role.LEADER, Role.FOLLOWER, Role.NONE, Role.CLOSED}),
    Role.FOLLOWER: frozenset({Role.LEADER, Role.FOLLOWER, Role.NONE, Role.CLOSED}),
    Role.CLOSED: frozenset(),
}


@dataclass(frozen=True)
class LeaderAndIsrState:
    """What the controller decided for the partition (one LeaderAndIsr entry)."""

    leader: int
    leader_epoch: int
    isr: tuple[int, ...]
    replicas: tuple[int, ...]
    partition_epoch: int
    controller_epoch: int


@dataclass
class FollowerState:
    """The leader's view of one follower (Kafka's Replica on the leader)."""

    log_end_offset: int = -1
    last_fetch_ms: int = 0
    leader_leo_at_last_fetch: int = -1
    last_caught_up_ms: int = 0
    # The log start offset the follower reported in its last Fetch (-1: none yet), for
    # DeleteRecords' low watermark.
    log_start_offset: int = -1


@dataclass(frozen=True)
class LeaderAppend:
    """Where a produced request's batches are: [first_offset, next_offset).

    duplicate: the batches were written before (an idempotent retry) and not again.
    log_append_time_ms: the leader's clock written into the batches (LogAppendTime topics), else -1.
    """

    first_offset: int
    next_offset: int
    duplicate: bool = False
    log_append_time_ms: int = -1


# Producer state is rebuilt by reading the log in pieces of this size (bounded memory).
PRODUCER_STATE_REBUILD_READ_BYTES = 1024 * 1024

logger = logging.getLogger("highwater.partition")


@dataclass(frozen=True)
class IsrChange:
    """An ISR the leader wants the controller to commit through AlterPartition."""

    new_isr: tuple[int, ...]
    leader_epoch: int
    partition_epoch: int


def _no_session_fetch(replica_id: int, tp: TopicPartitionKey) -> int:
    return -1


@dataclass
class Partition:
    topic: str
    partition: int
    local_broker_id: int
    log: Log
    min_insync_replicas: int = 1
    role: Role = Role.NONE
    leader_id: int = -1
    leader_epoch: int = -1
    partition_epoch: int = -1
    isr: tuple[int, ...] = ()
    replicas: tuple[int, ...] = ()
    high_watermark: int = 0
    followers: dict[int, FollowerState] = field(default_factory=dict)
    # ISR sent to the controller and not yet answered; while set, no other change is proposed.
    pending_isr: tuple[int, ...] | None = None
    producers: ProducerStateManager = field(default_factory=ProducerStateManager)
    # When a follower last fetched this partition through its fetch session (-1: it has none
    # holding it; services/broker/replica_sessions.py): a session names a partition only when its
    # fetch offset moves, so an idle partition's followers are not recorded at each fetch.
    session_fetch_ms: Callable[[int, TopicPartitionKey], int] = field(default=_no_session_fetch, repr=False)

    def __post_init__(self) -> None:
        self.log.producer_snapshot = self._producer_snapshot

    def _producer_snapshot(self) -> bytes | None:
        """The producer state as it is at the log end, for the log to write when it must
        (services/broker/producer_state.py says why); None when no producer ever wrote here."""
        if not self.producers.producers and self.log.read_producer_snapshot() is None:
            return None
        return encode_snapshot(self.producers, self.log.log_end_offset)

    def rebuild_producer_state(self) -> None:
        """After a restart or a truncation: the snapshot, then every batch header after it.

        A snapshot taken below the log start is stale (the log restarted past it, a follower far
        behind: what happened between is unknown) and is not used. One taken above the log end
        (the log was truncated since) keeps only the batches below the log end, and is written
        again at once, so batches appended later are never mistaken for the truncated ones.
        """
        start, end = self.log.log_start_offset, self.log.log_end_offset
        snapshot = None
        data = self.log.read_producer_snapshot()
        if data is not None:
            try:
                snapshot = decode_snapshot(data)
            except UnreadableSnapshot as exc:
                logger.warning("%s-%d: %s; rebuilding it from the log alone", self.topic, self.partition, exc)
        offset = start
        if snapshot is not None and start <= snapshot.offset <= end:
            offset = snapshot.offset
            self.producers.restore(snapshot, below_offset=offset)
        elif snapshot is not None and snapshot.offset > end:
            # Truncated below the snapshot: its sequences below the log end hold, but which
            # transactions are open again (their markers cut) only the log says: replay it all.
            self.producers.restore(snapshot, below_offset=end, with_transactions=False)
        else:
            self.producers.rebuild(())
        self._replay_producer_state(offset)
        # Markers the replay met below the HW are replicated: they end their transactions.
        self.producers.high_watermark_moved(self.high_watermark)
        if snapshot is not None and snapshot.offset > end:
            self.log.write_producer_snapshot(encode_snapshot(self.producers, end))

    def _replay_producer_state(self, offset: int) -> None:
        """Every batch from `offset` to the log end into the producer state, read in pieces."""
        while offset < self.log.log_end_offset:
            info = self.log.read(offset, max_bytes=PRODUCER_STATE_REBUILD_READ_BYTES)
            if info.next_offset <= offset:
                break
            headers = list(iter_batch_headers(info.records))
            self._take_batches(headers, control_types(info.records, headers))
            offset = info.next_offset

    def _take_batches(self, headers: list[BatchHeader], markers: dict[int, ControlType]) -> None:
        """Written batches into the producer state; the transactions their ABORT markers ended
        into the log's aborted-transaction index (each with the LSO right after it, as Kafka's)."""
        for txn in self.producers.update(headers, markers):
            if txn.aborted:
                first_unstable = self.producers.first_unstable_offset()
                lso = (
                    txn.last_offset + 1
                    if first_unstable is None
                    else min(first_unstable, txn.last_offset + 1)
                )
                self.log.append_aborted_txn(
                    AbortedTxn(txn.producer_id, txn.first_offset, txn.last_offset, lso)
                )

    # ---- state changes from the controller --------------------------------

    def change_role(self, role: Role) -> None:
        """The one way the role changes. Raises InvariantViolation for a move not in
        ROLE_TRANSITIONS (a closed replica told to lead or follow)."""
        check(
            role in ROLE_TRANSITIONS[self.role],
            "illegal role transition %s -> %s for %s-%d at leader epoch %d",
            self.role,
            role,
            self.topic,
            self.partition,
            self.leader_epoch,
        )
        self.role = role

    def is_newer_epoch(self, leader_epoch: int) -> bool:
        return leader_epoch > self.leader_epoch

    def become_leader(self, state: LeaderAndIsrState, now_ms: int) -> None:
        """make-leader: the new epoch starts at our LEO; followers start unknown.

        Replicas already in the ISR count as caught up now, so they are not
        shrunk away before their first fetch reaches us.
        """
        check(
            state.leader == self.local_broker_id,
            "become_leader for %s-%d but leader is %d, we are %d",
            self.topic,
            self.partition,
            state.leader,
            self.local_broker_id,
        )
        self.change_role(Role.LEADER)
        self._take_epoch(state)
        self.log.leader_epoch_cache.assign(state.leader_epoch, self.log.log_end_offset)
        self.followers = {
            r: FollowerState(last_caught_up_ms=now_ms if r in state.isr else 0)
            for r in state.replicas
            if r != self.local_broker_id
        }
        self.pending_isr = None
        # A new leader's HW may lag the old leader's; it only moves forward from here.
        self.high_watermark = min(self.high_watermark, self.log.log_end_offset)

    def become_follower(self, state: LeaderAndIsrState) -> None:
        self.change_role(Role.FOLLOWER)
        self._take_epoch(state)
        self.followers = {}
        self.pending_isr = None

    def update_isr(self, isr: tuple[int, ...], partition_epoch: int, leader_epoch: int) -> None:
        """The controller committed an ISR (our AlterPartition, or its own change).

        Only a strictly newer partition epoch counts: an equal one is a stale copy
        (an UpdateMetadata sent before our AlterPartition committed) and must not
        clear an expansion in flight, or the HW would stop waiting for a member the
        committed ISR already counts (sim seed KI-4).
        """
        if leader_epoch != self.leader_epoch or partition_epoch <= self.partition_epoch:
            return  # an answer for an older or the same state
        self.isr = isr
        self.partition_epoch = partition_epoch
        self.pending_isr = None

    def _take_epoch(self, state: LeaderAndIsrState) -> None:
        check(
            state.leader_epoch >= self.leader_epoch,
            "leader_epoch of %s-%d would go back from %d to %d",
            self.topic,
            self.partition,
            self.leader_epoch,
            state.leader_epoch,
        )
        self.leader_id = state.leader
        self.leader_epoch = state.leader_epoch
        self.partition_epoch = state.partition_epoch
        self.isr = state.isr
        self.replicas = state.replicas

    # ---- leader: produce ----------------------------------------------------

    def append_as_leader(
        self, records: bytes, *, acks: int, now_ms: int, transactional: bool = False
    ) -> LeaderAppend:
        """Validate a produce request's batches for this partition and append them.

        Checks the headers and CRCs (validate_batches), then the records themselves and the
        topic's timestamp rules (validate_records: Kafka's LogValidator), before anything is
        written: a batch consumers could not read is refused with CorruptMessage,
        InvalidRecord or InvalidTimestamp, and then nothing of `records` is written, the
        valid batches before the bad one included (Kafka refuses the request's records for
        the partition as a whole too). `now_ms` is the leader's wall clock: the timestamp
        window and LogAppendTime use it. `transactional`: a transactional producer's request,
        its partitions verified by the coordinator (validate_records).
        """
        if acks == -1:
            self._check_leader_for_acks_all()
        elif self.role is not Role.LEADER:
            raise self._not_leader()
        config = self.log.config
        headers = validate_batches(records, max_batch_bytes=config.max_message_bytes)
        rules = TimestampRules(
            config.message_timestamp_type == "LogAppendTime",
            config.message_timestamp_before_max_ms,
            config.message_timestamp_after_max_ms,
        )
        # A compacted topic refuses keyless records (Kafka's LogValidator): the cleaner keeps the
        # latest record per key, and a record without one could never be cleaned.
        compacted_partition = f"{self.topic}-{self.partition}" if config.compact else None
        fixes = validate_records(
            records,
            headers,
            rules=rules,
            now_ms=now_ms,
            compacted_partition=compacted_partition,
            transactional=transactional,
        )
        data: bytes | bytearray = records
        if fixes:
            # LogAppendTime, or a CreateTime max_timestamp that was wrong: CRC-covered bytes change.
            data, headers = apply_batch_fixes(records, headers, fixes)
        duplicate = self.producers.check(headers)
        if duplicate is not None:
            return LeaderAppend(duplicate.first_offset, duplicate.last_offset + 1, duplicate=True)
        self._followers_caught_up_until_now()
        info = self.log.append_as_leader(
            data, leader_epoch=self.leader_epoch, now_ms=now_ms, validated=headers
        )
        self._take_batches(info.headers, control_types(data, info.headers))
        self.maybe_advance_high_watermark()
        return LeaderAppend(
            info.first_offset, info.next_offset, log_append_time_ms=now_ms if rules.log_append_time else -1
        )

    def _not_leader(self) -> HighwaterError:
        return NotLeaderOrFollower(
            f"broker {self.local_broker_id} is not the leader of {self.topic}-{self.partition} "
            f"(leader is {self.leader_id}); refresh metadata and retry"
        )

    def _check_leader_for_acks_all(self) -> None:
        if self.role is not Role.LEADER:
            raise self._not_leader()
        if len(self.isr) < self.min_insync_replicas:
            raise NotEnoughReplicas(
                f"{self.topic}-{self.partition} has {len(self.isr)} in-sync replicas {list(self.isr)}, "
                f"below min.insync.replicas={self.min_insync_replicas}; nothing was written"
            )

    def append_marker(
        self,
        control: ControlType,
        *,
        producer_id: int,
        producer_epoch: int,
        coordinator_epoch: int,
        now_ms: int,
    ) -> LeaderAppend:
        """Append a transaction marker (WriteTxnMarkers from the transaction coordinator): ends the
        producer's open transaction here, as acks=all (the coordinator waits for the ISR).

        Raises NotLeaderOrFollower, NotEnoughReplicas, and InvalidProducerEpoch for an epoch older
        than the producer's here (a marker from before the epoch that fenced it). A marker for a
        producer with no open transaction here is written too (an empty transaction, or one
        whose batches never reached this partition): it harms nothing and the coordinator's retry
        after a lost answer must succeed."""
        self._check_leader_for_acks_all()
        entry = self.producers.producers.get(producer_id)
        if entry is not None and producer_epoch < entry.producer_epoch:
            raise InvalidProducerEpoch(
                f"marker for producer {producer_id} at epoch {producer_epoch} on "
                f"{self.topic}-{self.partition}, which has seen epoch {entry.producer_epoch}: the "
                "transaction coordinator is behind"
            )
        data = encode_marker(
            control,
            producer_id=producer_id,
            producer_epoch=producer_epoch,
            coordinator_epoch=coordinator_epoch,
            timestamp_ms=now_ms,
        )
        self._followers_caught_up_until_now()
        info = self.log.append_as_leader(data, leader_epoch=self.leader_epoch, now_ms=now_ms)
        self._take_batches(info.headers, {info.first_offset: control})
        self.maybe_advance_high_watermark()
        return LeaderAppend(info.first_offset, info.next_offset)

    def append_as_follower(self, records: bytes, *, now_ms: int) -> None:
        """Replicated batches (offsets assigned by the leader); producer state follows along."""
        # Markers are read before the append: one that cannot be read is refused with nothing
        # written, rather than written with the producer state left behind it.
        markers = control_types(records, list(iter_batch_headers(records)))
        info = self.log.append_as_follower(records, now_ms=now_ms)
        self._take_batches(info.headers, markers)

    def check_enough_replicas_reach_offset(
        self, required_offset: int, leader_epoch: int
    ) -> tuple[bool, HighwaterError | None]:
        """The acks=all completion rule (Kafka's Partition.checkEnoughReplicasReachOffset).

        An append made at leader_epoch and ending before required_offset is acknowledged
        once the HW reaches required_offset, that is once every member of the (maximal)
        ISR has it. Returns (done, error): not done while the HW is below; done with
        NotLeaderOrFollower when this replica no longer leads in the epoch of the append
        (the record may yet be truncated away, so it must not be acknowledged); done with
        NotEnoughReplicasAfterAppend when the ISR shrank below min.insync.replicas.
        """
        if self.role is not Role.LEADER or self.leader_epoch != leader_epoch:
            return True, NotLeaderOrFollower(
                f"leadership of {self.topic}-{self.partition} moved before the write was "
                "replicated to the ISR"
            )
        if self.high_watermark < required_offset:
            return False, None
        if len(self.isr) < self.min_insync_replicas:
            return True, NotEnoughReplicasAfterAppend(
                f"written, but the ISR {list(self.isr)} shrank below "
                f"min.insync.replicas={self.min_insync_replicas}"
            )
        return True, None

    def check_current_leader_epoch(self, current_leader_epoch: int) -> None:
        """A client's or follower's idea of the leader epoch against ours (-1: not checked).

        Older: the caller is behind (FENCED_LEADER_EPOCH, refresh metadata). Newer: we
        have not yet applied the LeaderAndIsr the caller already knows of
        (UNKNOWN_LEADER_EPOCH, retry soon).
        """
        if current_leader_epoch < 0:
            return
        if current_leader_epoch < self.leader_epoch:
            raise FencedLeaderEpoch(f"leader epoch {current_leader_epoch} is older than {self.leader_epoch}")
        if current_leader_epoch > self.leader_epoch:
            raise UnknownLeaderEpoch(f"leader epoch {current_leader_epoch} is newer than {self.leader_epoch}")

    def last_offset_for_leader_epoch(self, leader_epoch: int) -> tuple[int, int]:
        """The OffsetsForLeaderEpoch answer (KIP-101/279): (largest epoch <= asked, its end offset).

        The current epoch, and an epoch with no recorded end, end at our LEO. (-1, -1)
        when no epoch at or below the asked one is known.
        """
        epoch, end = self.log.leader_epoch_cache.end_offset_for_epoch(leader_epoch)
        if epoch == self.leader_epoch or (epoch >= 0 and end < 0):
            end = self.log.log_end_offset
        return epoch, end

    # ---- leader: followers' fetches -----------------------------------------

    def record_follower_fetch(self, replica_id: int, fetch_offset: int, now_ms: int) -> IsrChange | None:
        """A follower fetched from fetch_offset: that is its LEO (Kafka's updateFollowerFetchState).

        Returns an ISR expansion to propose when the follower has reached the HW.
        """
        follower = self.followers.get(replica_id)
        if follower is None:
            return None
        leo = self.log.log_end_offset
        if fetch_offset >= leo:
            follower.last_caught_up_ms = now_ms
        elif fetch_offset >= follower.leader_leo_at_last_fetch >= 0:
            follower.last_caught_up_ms = max(follower.last_caught_up_ms, follower.last_fetch_ms)
        follower.log_end_offset = fetch_offset
        follower.last_fetch_ms = now_ms
        follower.leader_leo_at_last_fetch = leo
        self.maybe_advance_high_watermark()
        if self.pending_isr is None and replica_id not in self.isr and replica_id in self.replicas:
            epoch_start = self.log.leader_epoch_cache.end_offset_for_epoch(self.leader_epoch - 1)[1]
            if fetch_offset >= self.high_watermark and fetch_offset >= max(epoch_start, 0):
                return self._propose(tuple(sorted({*self.isr, replica_id})))
        return None

    def _followers_caught_up_until_now(self) -> None:
        """The log end is about to move: a follower at it was caught up until now, as far as its
        session's last fetch shows (Kafka's rule, fetch offset >= the leader's LEO at that fetch,
        for followers whose session did not name this partition since)."""
        leo = self.log.log_end_offset
        tp = (self.topic, self.partition)
        for r, f in self.followers.items():
            if f.log_end_offset >= leo:
                f.last_caught_up_ms = max(f.last_caught_up_ms, self.session_fetch_ms(r, tp))

    def _last_caught_up_ms(self, replica_id: int, f: FollowerState) -> int:
        if f.log_end_offset >= self.log.log_end_offset:
            # At the log end: caught up at every fetch since, its session's included.
            return max(f.last_caught_up_ms, self.session_fetch_ms(replica_id, (self.topic, self.partition)))
        return f.last_caught_up_ms

    def check_isr_shrink(self, now_ms: int, replica_lag_time_max_ms: int) -> IsrChange | None:
        """Followers not caught up for replica_lag_time_max_ms leave the ISR."""
        if self.role is not Role.LEADER or self.pending_isr is not None:
            return None
        lagging: set[int] = set()
        for r in self.isr:
            f = self.followers.get(r)
            if r == self.local_broker_id or f is None:
                continue
            if now_ms - f.last_caught_up_ms <= replica_lag_time_max_ms:
                continue
            # Kept, as an append does: the checks of the next replica.lag.time.max.ms need not
            # ask the follower's session again (every second, for every partition of an idle broker).
            f.last_caught_up_ms = self._last_caught_up_ms(r, f)
            if now_ms - f.last_caught_up_ms > replica_lag_time_max_ms:
                lagging.add(r)
        if not lagging:
            return None
        return self._propose(tuple(r for r in self.isr if r not in lagging))

    def _propose(self, new_isr: tuple[int, ...]) -> IsrChange:
        check(
            self.local_broker_id in new_isr,
            "leader %d would drop itself from the ISR of %s-%d",
            self.local_broker_id,
            self.topic,
            self.partition,
        )
        self.pending_isr = new_isr
        return IsrChange(new_isr, self.leader_epoch, self.partition_epoch)

    def isr_change_failed(self) -> None:
        """AlterPartition was refused or lost: allow a fresh proposal later."""
        self.pending_isr = None

    def maybe_advance_high_watermark(self) -> bool:
        """HW := min LEO over the maximal ISR; never backwards. Returns whether it moved."""
        if self.role is not Role.LEADER:
            return False
        members = set(self.isr) | set(self.pending_isr or ())
        new_hw = self.log.log_end_offset
        for r in members:
            if r == self.local_broker_id:
                continue
            f = self.followers.get(r)
            new_hw = min(new_hw, f.log_end_offset if f is not None else -1)
        if new_hw > self.high_watermark:
            self.high_watermark = new_hw
            self.producers.high_watermark_moved(new_hw)
            check(
                self.high_watermark <= self.log.log_end_offset,
                "HW %d above LEO %d on %s-%d",
                self.high_watermark,
                self.log.log_end_offset,
                self.topic,
                self.partition,
            )
            return True
        return False

    # ---- follower -----------------------------------------------------------

    def update_follower_high_watermark(self, leader_high_watermark: int) -> bool:
        """A follower takes HW from the leader's answer, bounded by its own LEO."""
        new_hw = min(leader_high_watermark, self.log.log_end_offset)
        if new_hw != self.high_watermark:
            self.high_watermark = new_hw
            self.producers.high_watermark_moved(new_hw)
            return True
        return False

    def truncate_to(self, offset: int) -> None:
        leo_before = self.log.log_end_offset
        self.log.truncate_to(offset)
        self.high_watermark = min(self.high_watermark, self.log.log_end_offset)
        if self.log.log_end_offset < leo_before:
            self.rebuild_producer_state()

    @property
    def last_stable_offset(self) -> int:
        """Where a read_committed consumer stops: the first offset of the oldest open
        transaction (or one whose marker is not replicated yet), or the high watermark when
        that is lower (Kafka's LSO)."""
        return self.producers.last_stable_offset(self.high_watermark)

    @property
    def low_watermark(self) -> int:
        """The smallest log start offset over this leader and the followers in its ISR (Kafka's
        lowWatermarkIfLeader, over the ISR rather than every live replica: a replica outside the
        ISR takes the log start when it catches up, or restarts its log there). -1 while an ISR
        member has not reported its log start since this replica became leader."""
        low = self.log.log_start_offset
        for r in self.isr:
            if r != self.local_broker_id:
                f = self.followers.get(r)
                low = min(low, f.log_start_offset if f is not None else -1)
        return low

    @property
    def under_replicated(self) -> bool:
        return self.role is Role.LEADER and len(self.isr) < len(self.replicas)


class LeaderAndIsrAction(enum.Enum):
    """What one LeaderAndIsr entry asks of this broker (becomeLeaderOrFollower's split)."""

    NOT_A_REPLICA = "not a replica"
    ISR_UPDATED = "ISR updated"
    BECOME_LEADER = "become leader"
    BECOME_FOLLOWER = "become follower"


def decide_leader_and_isr(
    local_broker_id: int, existing: Partition | None, state: LeaderAndIsrState
) -> LeaderAndIsrAction:
    """The per-partition rule of LeaderAndIsr, shared by the broker and the simulation.

    A leader epoch that is not newer is refused (FencedLeaderEpoch), except that the same
    epoch with a newer partition epoch updates the ISR in place (an ISR the controller
    changed without moving leadership).
    """
    if local_broker_id not in state.replicas:
        return LeaderAndIsrAction.NOT_A_REPLICA
    if existing is not None and not existing.is_newer_epoch(state.leader_epoch):
        if state.leader_epoch == existing.leader_epoch and state.partition_epoch > existing.partition_epoch:
            existing.update_isr(state.isr, state.partition_epoch, state.leader_epoch)
            return LeaderAndIsrAction.ISR_UPDATED
        raise FencedLeaderEpoch(
            f"leader epoch {state.leader_epoch} is not newer than {existing.leader_epoch}"
        )
    return (
        LeaderAndIsrAction.BECOME_LEADER
        if state.leader == local_broker_id
        else LeaderAndIsrAction.BECOME_FOLLOWER
    )
