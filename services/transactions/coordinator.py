"""The transaction coordinator's rules for one transactional id (KIP-98, KIP-360, KIP-447,
KIP-890 part 1): pure, no I/O, no clock.

The caller (a driver, one asyncio task per transactional id: STYLE.md practice 3) reads the
id's `TxnMetadata` from etcd with its mod revision, calls one operation here with `now_ms`,
then applies the returned `effects` in order and answers with `answer`:

- `WriteState(metadata)`: compare-and-swap the new metadata on the mod revision it read (or
  "absent" for a new id). A lost race discards the remaining effects and starts over from a
  fresh read: the decision is durable before anything else happens, so a coordinator that
  dies after it is replaced by one that finds the decision in etcd and goes on
  (`completion_effects`).
- `DeleteState`: the same compare-and-swap, deleting (an idle id expired: Dead).
- `AllocateProducerId`: nothing was decided; allocate an id (the controller's block) and call
  the same operation again with it.
- `WriteMarkers`: write a COMMIT or ABORT control batch with this producer id and epoch to
  each partition (WriteTxnMarkers on its leader), retrying until every one is written, then
  call `complete`, whose `WriteState` carries the group offsets to publish in the same etcd
  transaction, so offsets sent with TxnOffsetCommit become visible once, with the commit.

The answer goes out once the `WriteState` is applied: markers and the completion go on after
it, as Kafka answers EndTxn once PrepareCommit is in its log.

Answers carry a Kafka error code name (`TxnError`) and the fields of Kafka's responses.

States and their moves are data (`LEGAL_TRANSITIONS`, Kafka's TransactionState); every move
goes through `_move`, which checks the table and the invariants (`check_invariants`).
PrepareEpochFence is never stored: it is the checked step between Ongoing and PrepareAbort
when the coordinator itself aborts (an InitProducerId that finds a transaction ongoing, a
timeout), bumping the epoch so the old producer is fenced before the markers go out, as
Kafka's prepareFenceProducerEpoch. Dead is never stored either: it is the step before the
state is deleted.

Epochs. A producer is (producer id, producer epoch). InitProducerId bumps the epoch (fencing
every older one) or, once the epoch is exhausted (`PRODUCER_EPOCH_MAX`), moves to a new
producer id at epoch 0. For a given producer id the epoch never decreases; a fenced
(id, epoch) never succeeds again at AddPartitionsToTxn, AddOffsetsToTxn, TxnOffsetCommit or
EndTxn, which require the current one exactly. KIP-360: a producer that passes its current
(id, epoch) to InitProducerId after an error gets a bump without losing its id, and a retry
of a bump it never heard back from gets the same answer (`last_producer_id`,
`last_producer_epoch` remember the previous one; a fence by another producer clears it).

KIP-447, group side: TxnOffsetCommit carries the consumer's member id and generation (member
epoch); that check belongs to the group's owner and runs first, on the group's state:
`services.transactions.group_fencing.check_txn_offset_commit` for our KIP-848 groups,
`services.kafka.classic_groups.ClassicGroups.commit_check` for classic ones. Then
`txn_offset_commit` keeps only the transaction's bookkeeping.

Not here yet (issue 41, later sessions): KIP-890 part 2 (an epoch bump at every EndTxn).
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace

from clients.common.errors import check
from clients.common.types import TopicPartitionKey
from services.common import limits

TopicPartitions = frozenset[TopicPartitionKey]

NO_PRODUCER_ID = -1
NO_PRODUCER_EPOCH = -1
# Producer epochs are int16 on the wire. Ordinary bumps stop at PRODUCER_EPOCH_MAX (then the
# producer gets a new id); a coordinator's own fence may take one more step, to the int16
# maximum, since that epoch is only ever written in ABORT markers, never handed to a producer.
PRODUCER_EPOCH_FENCE_MAX = 2**15 - 1


class TxnState(enum.Enum):
    """Kafka's TransactionState, with the names DescribeTransactions and ListTransactions use."""

    EMPTY = "Empty"
    ONGOING = "Ongoing"
    PREPARE_COMMIT = "PrepareCommit"
    PREPARE_ABORT = "PrepareAbort"
    COMPLETE_COMMIT = "CompleteCommit"
    COMPLETE_ABORT = "CompleteAbort"
    PREPARE_EPOCH_FENCE = "PrepareEpochFence"
    DEAD = "Dead"


# Every allowed move (Kafka's TransactionState.validPreviousStates, turned around). Empty ->
# Empty is an InitProducerId epoch bump; Ongoing -> Ongoing adds partitions, groups or offsets.
# The coordinator's abort goes Ongoing -> PrepareEpochFence -> PrepareAbort.
LEGAL_TRANSITIONS: dict[TxnState, frozenset[TxnState]] = {
    TxnState.EMPTY: frozenset({TxnState.EMPTY, TxnState.ONGOING, TxnState.DEAD}),
    TxnState.ONGOING: frozenset(
        {TxnState.ONGOING, TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT, TxnState.PREPARE_EPOCH_FENCE}
    ),
    TxnState.PREPARE_EPOCH_FENCE: frozenset({TxnState.PREPARE_ABORT}),
    TxnState.PREPARE_COMMIT: frozenset({TxnState.COMPLETE_COMMIT}),
    TxnState.PREPARE_ABORT: frozenset({TxnState.COMPLETE_ABORT}),
    TxnState.COMPLETE_COMMIT: frozenset({TxnState.EMPTY, TxnState.ONGOING, TxnState.DEAD}),
    TxnState.COMPLETE_ABORT: frozenset({TxnState.EMPTY, TxnState.ONGOING, TxnState.DEAD}),
    TxnState.DEAD: frozenset(),
}

# States a transaction is open in (partitions or groups are held, start time is set).
IN_TRANSACTION = frozenset(
    {TxnState.ONGOING, TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT, TxnState.PREPARE_EPOCH_FENCE}
)
# States stored in etcd (the other two are steps taken within one operation).
STORED_STATES = frozenset(TxnState) - {TxnState.PREPARE_EPOCH_FENCE, TxnState.DEAD}
# Where the markers of a prepared transaction lead, and what they say.
COMPLETION: dict[TxnState, tuple[TxnState, bool]] = {
    TxnState.PREPARE_COMMIT: (TxnState.COMPLETE_COMMIT, True),
    TxnState.PREPARE_ABORT: (TxnState.COMPLETE_ABORT, False),
}


class TxnError(enum.StrEnum):
    """Answers, named as Kafka's error codes are (the adapter maps a name to its wire code, and
    PRODUCER_FENCED to INVALID_PRODUCER_EPOCH for request versions older than KIP-588's)."""

    NONE = "NONE"
    # The producer's epoch is older than the current one: another producer took over.
    PRODUCER_FENCED = "PRODUCER_FENCED"
    # An epoch newer than the current one: never handed out, so a client bug rather than a
    # zombie (Kafka answers PRODUCER_FENCED for any other epoch; we keep the two apart).
    INVALID_PRODUCER_EPOCH = "INVALID_PRODUCER_EPOCH"
    # The producer id is not this transactional id's (a rotated id's zombie, or no state).
    INVALID_PRODUCER_ID_MAPPING = "INVALID_PRODUCER_ID_MAPPING"
    INVALID_TXN_STATE = "INVALID_TXN_STATE"
    # Retriable: the previous transaction is still being completed.
    CONCURRENT_TRANSACTIONS = "CONCURRENT_TRANSACTIONS"
    INVALID_TRANSACTION_TIMEOUT = "INVALID_TRANSACTION_TIMEOUT"
    TRANSACTIONAL_ID_NOT_FOUND = "TRANSACTIONAL_ID_NOT_FOUND"
    # A request past one of our bounds (limits.TRANSACTION_*), or malformed.
    INVALID_REQUEST = "INVALID_REQUEST"
    # Not the rules' answers but their host's: the broker asked does not coordinate the id,
    # or etcd, where the state is, could not be reached (both retriable for clients).
    NOT_COORDINATOR = "NOT_COORDINATOR"
    COORDINATOR_NOT_AVAILABLE = "COORDINATOR_NOT_AVAILABLE"


@dataclass(frozen=True)
class PendingOffset:
    """An offset sent with TxnOffsetCommit: the group sees it only if the transaction commits."""

    offset: int
    metadata: str = ""
    leader_epoch: int = -1


GroupOffsets = Mapping[TopicPartitionKey, PendingOffset]


@dataclass(frozen=True)
class TxnMetadata:
    """One transactional id's coordinator state: what etcd stores (services/transactions/state.py)."""

    transactional_id: str
    producer_id: int
    producer_epoch: int
    state: TxnState
    timeout_ms: int
    # KIP-360: the producer (id, epoch) before the last InitProducerId, so a retry of that call
    # is answered alike; NO_PRODUCER_EPOCH after a fence (the old producer must not recover).
    last_producer_id: int = NO_PRODUCER_ID
    last_producer_epoch: int = NO_PRODUCER_EPOCH
    partitions: TopicPartitions = frozenset()
    # Groups added with AddOffsetsToTxn, and the offsets TxnOffsetCommit sent for them.
    groups: frozenset[str] = frozenset()
    pending_offsets: Mapping[str, GroupOffsets] = field(default_factory=dict)
    start_time_ms: int = -1  # when the open transaction began; -1 when none is open
    last_update_ms: int = -1

    @property
    def pending_offset_count(self) -> int:
        return sum(len(offsets) for offsets in self.pending_offsets.values())


def check_invariants(meta: TxnMetadata) -> None:
    """Raise InvariantViolation (a bug, never an operating error) when `meta` breaks a rule."""
    tid = meta.transactional_id
    check(meta.producer_id >= 0, "transactional id %r: producer id %d", tid, meta.producer_id)
    check(
        0 <= meta.producer_epoch <= PRODUCER_EPOCH_FENCE_MAX,
        "transactional id %r: producer epoch %d outside [0, %d]",
        tid,
        meta.producer_epoch,
        PRODUCER_EPOCH_FENCE_MAX,
    )
    check(
        0 < meta.timeout_ms <= limits.TRANSACTION_TIMEOUT_MS_MAX,
        "transactional id %r: timeout %d ms",
        tid,
        meta.timeout_ms,
    )
    check(
        set(meta.pending_offsets) <= meta.groups,
        "transactional id %r: offsets pending for groups %s not added (%s)",
        tid,
        sorted(meta.pending_offsets),
        sorted(meta.groups),
    )
    check(
        len(meta.partitions) <= limits.TRANSACTION_PARTITIONS_MAX
        and len(meta.groups) <= limits.TRANSACTION_GROUPS_MAX
        and meta.pending_offset_count <= limits.TRANSACTION_PENDING_OFFSETS_MAX,
        "transactional id %r: %d partitions, %d groups, %d offsets past the bounds",
        tid,
        len(meta.partitions),
        len(meta.groups),
        meta.pending_offset_count,
    )
    if meta.state in IN_TRANSACTION:
        check(
            bool(meta.partitions or meta.groups) and meta.start_time_ms >= 0,
            "transactional id %r in %s holds nothing or has no start time (%d)",
            tid,
            meta.state,
            meta.start_time_ms,
        )
    else:
        check(
            not meta.partitions and not meta.groups and meta.start_time_ms == -1,
            "transactional id %r in %s still holds partitions %s, groups %s or start time %d",
            tid,
            meta.state,
            sorted(meta.partitions),
            sorted(meta.groups),
            meta.start_time_ms,
        )
    if meta.state is not TxnState.PREPARE_ABORT and meta.state is not TxnState.COMPLETE_ABORT:
        # Only a coordinator's fence (always followed by an abort) reaches the int16 maximum.
        check(
            meta.producer_epoch <= limits.PRODUCER_EPOCH_MAX or meta.state is TxnState.PREPARE_EPOCH_FENCE,
            "transactional id %r: epoch %d past %d in %s",
            tid,
            meta.producer_epoch,
            limits.PRODUCER_EPOCH_MAX,
            meta.state,
        )


def _move(meta: TxnMetadata, to: TxnState, now_ms: int, **changes: object) -> TxnMetadata:
    """`meta` moved to `to` with `changes`; raises InvariantViolation for an illegal move."""
    check(
        to in LEGAL_TRANSITIONS[meta.state],
        "illegal transaction transition %s -> %s for transactional id %r",
        meta.state,
        to,
        meta.transactional_id,
    )
    moved = replace(meta, state=to, last_update_ms=now_ms, **changes)  # type: ignore[arg-type]
    check_invariants(moved)
    return moved


# ---- requests, answers, effects -------------------------------------------------------------


@dataclass(frozen=True)
class InitProducerId:
    transactional_id: str
    transaction_timeout_ms: int
    # KIP-360: the producer's current id and epoch when it re-initializes after an error.
    expected_producer_id: int = NO_PRODUCER_ID
    expected_producer_epoch: int = NO_PRODUCER_EPOCH


@dataclass(frozen=True)
class AddPartitionsToTxn:
    transactional_id: str
    producer_id: int
    producer_epoch: int
    partitions: TopicPartitions


@dataclass(frozen=True)
class AddOffsetsToTxn:
    transactional_id: str
    producer_id: int
    producer_epoch: int
    group_id: str


@dataclass(frozen=True)
class TxnOffsetCommit:
    """The coordinator's part of TxnOffsetCommit; the group's member check runs before it."""

    transactional_id: str
    producer_id: int
    producer_epoch: int
    group_id: str
    offsets: GroupOffsets


@dataclass(frozen=True)
class EndTxn:
    transactional_id: str
    producer_id: int
    producer_epoch: int
    commit: bool


TxnRequest = InitProducerId | AddPartitionsToTxn | AddOffsetsToTxn | TxnOffsetCommit | EndTxn


@dataclass(frozen=True)
class TxnAnswer:
    error: TxnError
    message: str = ""
    # InitProducerId's answer; the others leave them as they are.
    producer_id: int = NO_PRODUCER_ID
    producer_epoch: int = NO_PRODUCER_EPOCH


OK = TxnAnswer(TxnError.NONE)


@dataclass(frozen=True)
class AllocateProducerId:
    """Nothing decided: allocate a producer id and call the operation again with it."""


@dataclass(frozen=True)
class WriteState:
    """Compare-and-swap `metadata` on the revision read. `publish`: group offsets to write in the
    same etcd transaction (a commit completing), so they become visible exactly once."""

    metadata: TxnMetadata
    publish: Mapping[str, GroupOffsets] = field(default_factory=dict)


@dataclass(frozen=True)
class DeleteState:
    """Compare-and-swap delete of the id's state (expired while idle)."""

    transactional_id: str


@dataclass(frozen=True)
class WriteMarkers:
    """A COMMIT (commit=True) or ABORT control batch for (producer_id, producer_epoch) on each
    partition; idempotent, retried until all are written, then `complete` is called."""

    producer_id: int
    producer_epoch: int
    commit: bool
    partitions: TopicPartitions


Effect = AllocateProducerId | WriteState | DeleteState | WriteMarkers


@dataclass(frozen=True)
class TxnResult:
    """The metadata after the operation (as before when nothing changed; None: no state), the
    answer to send, and the effects to apply first, in order."""

    metadata: TxnMetadata | None
    answer: TxnAnswer
    effects: tuple[Effect, ...] = ()


def _refuse(meta: TxnMetadata | None, error: TxnError, message: str) -> TxnResult:
    return TxnResult(meta, TxnAnswer(error, message))


def _prepared(meta: TxnMetadata) -> tuple[Effect, ...]:
    """What a prepared transaction's decision costs: store it, then its markers."""
    return (WriteState(meta), *completion_effects(meta))


def completion_effects(meta: TxnMetadata) -> tuple[Effect, ...]:
    """The markers still owed by a prepared transaction (after `WriteState` of it, or on a new
    coordinator finding it in etcd); nothing for any other state. With no partition to mark
    (a transaction of offsets only) the driver calls `complete` at once."""
    if meta.state not in COMPLETION:
        return ()
    _, commit = COMPLETION[meta.state]
    if not meta.partitions:
        return ()
    return (WriteMarkers(meta.producer_id, meta.producer_epoch, commit, meta.partitions),)


# ---- InitProducerId --------------------------------------------------------------------------


def _epoch_exhausted(epoch: int) -> bool:
    return epoch >= limits.PRODUCER_EPOCH_MAX


def init_producer_id(
    meta: TxnMetadata | None, request: InitProducerId, now_ms: int, new_producer_id: int | None = None
) -> TxnResult:
    """InitProducerId with a transactional id (Kafka's handleInitProducerId).

    A new id (or one whose state died) needs a producer id: without `new_producer_id` the answer
    is the effect AllocateProducerId. An ongoing transaction is fenced and aborted first
    (CONCURRENT_TRANSACTIONS: the producer retries once it is complete); a prepared one is
    still completing (CONCURRENT_TRANSACTIONS)."""
    refused = _id_refusal(meta, request.transactional_id)
    if refused is not None:
        return refused
    timeout_ms = request.transaction_timeout_ms
    if not 0 < timeout_ms <= limits.TRANSACTION_TIMEOUT_MS_MAX:
        return _refuse(
            meta,
            TxnError.INVALID_TRANSACTION_TIMEOUT,
            f"transaction timeout {timeout_ms} ms is outside (0, {limits.TRANSACTION_TIMEOUT_MS_MAX}] ms "
            "(transaction.max.timeout.ms): set the producer's transaction.timeout.ms within it",
        )
    if meta is None or meta.state is TxnState.DEAD:
        if new_producer_id is None:
            return TxnResult(meta, OK, (AllocateProducerId(),))
        check(new_producer_id >= 0, "allocated producer id %d", new_producer_id)
        created = TxnMetadata(
            request.transactional_id, new_producer_id, 0, TxnState.EMPTY, timeout_ms, last_update_ms=now_ms
        )
        check_invariants(created)
        return _init_answer(created)
    expected_pid, expected_epoch = request.expected_producer_id, request.expected_producer_epoch
    recovering = expected_pid != NO_PRODUCER_ID
    # KIP-360: the expected id must be the current one, or the previous one whose epoch ran out
    # (a retry of the call that moved to a new id).
    if recovering and not (
        expected_pid == meta.producer_id
        or (expected_pid == meta.last_producer_id and _epoch_exhausted(expected_epoch))
    ):
        return _refuse(
            meta,
            TxnError.PRODUCER_FENCED,
            f"producer id {expected_pid} is not transactional id {meta.transactional_id!r}'s "
            f"(it has {meta.producer_id}): the producer must start afresh without a producer id",
        )
    if meta.state in COMPLETION:
        return _refuse(
            meta, TxnError.CONCURRENT_TRANSACTIONS, "the previous transaction is being completed: retry"
        )
    if meta.state is TxnState.ONGOING:
        return _fence_and_abort(meta, now_ms, TxnError.CONCURRENT_TRANSACTIONS)
    return _bump_or_rotate(meta, request, now_ms, new_producer_id)


def _bump_or_rotate(
    meta: TxnMetadata, request: InitProducerId, now_ms: int, new_producer_id: int | None
) -> TxnResult:
    """InitProducerId with no transaction open (Kafka's prepareIncrementProducerEpoch and
    prepareProducerIdRotation): a new epoch, a new producer id once the epoch is exhausted, the
    same answer for a retry, or PRODUCER_FENCED for a recovering producer another one fenced."""
    check(
        meta.state in (TxnState.EMPTY, TxnState.COMPLETE_COMMIT, TxnState.COMPLETE_ABORT),
        "a producer epoch bump of transactional id %r in %s",
        meta.transactional_id,
        meta.state,
    )
    timeout_ms = request.transaction_timeout_ms
    expected_pid, expected_epoch = request.expected_producer_id, request.expected_producer_epoch
    recovering = expected_pid != NO_PRODUCER_ID
    if _epoch_exhausted(meta.producer_epoch) and (not recovering or expected_epoch == meta.producer_epoch):
        if new_producer_id is None:
            return TxnResult(meta, OK, (AllocateProducerId(),))
        check(new_producer_id != meta.producer_id, "allocated producer id %d is in use", new_producer_id)
        rotated = _move(
            meta,
            TxnState.EMPTY,
            now_ms,
            producer_id=new_producer_id,
            producer_epoch=0,
            last_producer_id=meta.producer_id,
            last_producer_epoch=meta.producer_epoch if recovering else NO_PRODUCER_EPOCH,
            timeout_ms=timeout_ms,
        )
        return _init_answer(rotated)
    if not recovering or expected_epoch == meta.producer_epoch:
        # A fresh producer fences every older one (no recovery for them: last epoch cleared);
        # a recovering one keeps the right to retry this very call.
        bumped = _move(
            meta,
            TxnState.EMPTY,
            now_ms,
            producer_epoch=meta.producer_epoch + 1,
            last_producer_id=meta.producer_id,
            last_producer_epoch=meta.producer_epoch if recovering else NO_PRODUCER_EPOCH,
            timeout_ms=timeout_ms,
        )
        return _init_answer(bumped)
    if expected_pid == meta.last_producer_id and expected_epoch == meta.last_producer_epoch:
        # A retry of a bump the producer never heard back from: the same answer again.
        if timeout_ms == meta.timeout_ms:
            return TxnResult(meta, TxnAnswer(TxnError.NONE, "", meta.producer_id, meta.producer_epoch))
        return _init_answer(_move(meta, TxnState.EMPTY, now_ms, timeout_ms=timeout_ms))
    return _refuse(
        meta,
        TxnError.PRODUCER_FENCED,
        f"producer {expected_pid}/{expected_epoch} was fenced by epoch {meta.producer_epoch}: "
        "another producer uses this transactional id",
    )


def _init_answer(meta: TxnMetadata) -> TxnResult:
    return TxnResult(
        meta, TxnAnswer(TxnError.NONE, "", meta.producer_id, meta.producer_epoch), (WriteState(meta),)
    )


def _fence_and_abort(meta: TxnMetadata, now_ms: int, error: TxnError, message: str = "") -> TxnResult:
    """Bump the epoch (fencing the producer of the ongoing transaction) and abort it (Kafka's
    prepareFenceProducerEpoch, then endTransaction(ABORT, isFromClient = false))."""
    check(
        meta.producer_epoch < PRODUCER_EPOCH_FENCE_MAX,
        "transactional id %r: epoch %d cannot be fenced",
        meta.transactional_id,
        meta.producer_epoch,
    )
    fenced = _move(
        meta,
        TxnState.PREPARE_EPOCH_FENCE,
        now_ms,
        producer_epoch=meta.producer_epoch + 1,
        last_producer_id=meta.producer_id,
        last_producer_epoch=NO_PRODUCER_EPOCH,
    )
    aborting = _move(fenced, TxnState.PREPARE_ABORT, now_ms)
    return TxnResult(
        aborting, TxnAnswer(error, message or "aborting the ongoing transaction: retry"), _prepared(aborting)
    )


# ---- the producer's calls within a transaction ---------------------------------------------------


def transactional_id_problem(transactional_id: str) -> str | None:
    """Why a transactional id cannot be used (None: it can): empty (Kafka refuses it) or over-long."""
    if 0 < len(transactional_id) <= limits.TRANSACTIONAL_ID_MAX_CHARS:
        return None
    return (
        f"a transactional id must have 1 to {limits.TRANSACTIONAL_ID_MAX_CHARS} characters "
        f"(this one has {len(transactional_id)})"
    )


def _id_refusal(meta: TxnMetadata | None, transactional_id: str) -> TxnResult | None:
    """INVALID_REQUEST for an id `transactional_id_problem` refuses."""
    problem = transactional_id_problem(transactional_id)
    return None if problem is None else _refuse(meta, TxnError.INVALID_REQUEST, problem)


def _current(meta: TxnMetadata | None, producer_id: int, producer_epoch: int) -> TxnMetadata | TxnResult:
    """`meta` when (producer_id, producer_epoch) is the id's current producer; else the refusal."""
    if meta is None or meta.state is TxnState.DEAD or producer_id != meta.producer_id:
        return _refuse(
            meta,
            TxnError.INVALID_PRODUCER_ID_MAPPING,
            f"producer id {producer_id} is not this transactional id's: call InitProducerId",
        )
    if producer_epoch < meta.producer_epoch:
        return _refuse(
            meta,
            TxnError.PRODUCER_FENCED,
            f"producer epoch {producer_epoch} was fenced by epoch {meta.producer_epoch}: another "
            "producer uses this transactional id, or the coordinator aborted a timed-out transaction",
        )
    if producer_epoch > meta.producer_epoch or producer_epoch > limits.PRODUCER_EPOCH_MAX:
        # Past PRODUCER_EPOCH_MAX: a coordinator's fence epoch, only ever written in markers.
        return _refuse(
            meta,
            TxnError.INVALID_PRODUCER_EPOCH,
            f"producer epoch {producer_epoch} was never handed out (current {meta.producer_epoch})",
        )
    return meta


def _joinable(meta: TxnMetadata) -> TxnResult | None:
    """None when a transaction may be begun or added to; a refusal while one completes."""
    if meta.state in COMPLETION:
        return _refuse(
            meta, TxnError.CONCURRENT_TRANSACTIONS, "the previous transaction is being completed: retry"
        )
    return None


def _opened(meta: TxnMetadata, now_ms: int, **changes: object) -> TxnMetadata:
    """`meta` Ongoing with `changes`; a transaction begun now starts now."""
    start = meta.start_time_ms if meta.state is TxnState.ONGOING else now_ms
    return _move(meta, TxnState.ONGOING, now_ms, start_time_ms=start, **changes)


def add_partitions(meta: TxnMetadata | None, request: AddPartitionsToTxn, now_ms: int) -> TxnResult:
    """AddPartitionsToTxn (Kafka's handleAddPartitionsToTransaction): begins a transaction or
    adds to the open one. Partitions already in it change nothing."""
    current = _current(meta, request.producer_id, request.producer_epoch)
    if isinstance(current, TxnResult):
        return current
    meta = current
    refused = _joinable(meta)
    if refused is not None:
        return refused
    if not request.partitions:
        return _refuse(meta, TxnError.INVALID_REQUEST, "AddPartitionsToTxn names no partition")
    if meta.state is TxnState.ONGOING and request.partitions <= meta.partitions:
        return TxnResult(meta, OK)
    partitions = meta.partitions | request.partitions
    if len(partitions) > limits.TRANSACTION_PARTITIONS_MAX:
        return _refuse(
            meta,
            TxnError.INVALID_REQUEST,
            f"a transaction may hold at most {limits.TRANSACTION_PARTITIONS_MAX} partitions "
            f"(this one would hold {len(partitions)}): commit more often",
        )
    opened = _opened(meta, now_ms, partitions=partitions)
    return TxnResult(opened, OK, (WriteState(opened),))


def add_offsets(meta: TxnMetadata | None, request: AddOffsetsToTxn, now_ms: int) -> TxnResult:
    """AddOffsetsToTxn: the group's offsets may then be sent with TxnOffsetCommit. (Kafka adds
    the group's __consumer_offsets partition; our groups keep offsets in etcd, so the group.)"""
    current = _current(meta, request.producer_id, request.producer_epoch)
    if isinstance(current, TxnResult):
        return current
    meta = current
    refused = _joinable(meta)
    if refused is not None:
        return refused
    if not request.group_id:
        return _refuse(meta, TxnError.INVALID_REQUEST, "AddOffsetsToTxn names no group")
    if meta.state is TxnState.ONGOING and request.group_id in meta.groups:
        return TxnResult(meta, OK)
    if len(meta.groups) >= limits.TRANSACTION_GROUPS_MAX:
        return _refuse(
            meta,
            TxnError.INVALID_REQUEST,
            f"a transaction may hold offsets of at most {limits.TRANSACTION_GROUPS_MAX} groups",
        )
    opened = _opened(meta, now_ms, groups=meta.groups | {request.group_id})
    return TxnResult(opened, OK, (WriteState(opened),))


def txn_offset_commit(meta: TxnMetadata | None, request: TxnOffsetCommit, now_ms: int) -> TxnResult:
    """TxnOffsetCommit's transaction bookkeeping: the offsets wait in the transaction until it
    completes (published with CompleteCommit, dropped with CompleteAbort). A later offset for a
    partition replaces an earlier one. The group must have been added (AddOffsetsToTxn)."""
    current = _current(meta, request.producer_id, request.producer_epoch)
    if isinstance(current, TxnResult):
        return current
    meta = current
    if meta.state is not TxnState.ONGOING or request.group_id not in meta.groups:
        return _refuse(
            meta,
            TxnError.INVALID_TXN_STATE,
            f"group {request.group_id!r} is not in an ongoing transaction of this producer: call "
            "AddOffsetsToTxn (send_offsets_to_transaction) first",
        )
    merged = {**meta.pending_offsets.get(request.group_id, {}), **request.offsets}
    count = meta.pending_offset_count - len(meta.pending_offsets.get(request.group_id, {})) + len(merged)
    if count > limits.TRANSACTION_PENDING_OFFSETS_MAX:
        return _refuse(
            meta,
            TxnError.INVALID_REQUEST,
            f"a transaction may hold at most {limits.TRANSACTION_PENDING_OFFSETS_MAX} offsets",
        )
    pending = {**meta.pending_offsets, request.group_id: merged}
    if pending == meta.pending_offsets:
        return TxnResult(meta, OK)
    moved = _move(meta, TxnState.ONGOING, now_ms, pending_offsets=pending)
    return TxnResult(moved, OK, (WriteState(moved),))


def end_txn(meta: TxnMetadata | None, request: EndTxn, now_ms: int) -> TxnResult:
    """EndTxn (Kafka's handleEndTransaction): the decision is stored (PrepareCommit or
    PrepareAbort), then the markers are written. A retry of the same outcome is answered NONE
    once complete and CONCURRENT_TRANSACTIONS while completing; the other outcome is
    INVALID_TXN_STATE, as is ending a transaction never begun."""
    current = _current(meta, request.producer_id, request.producer_epoch)
    if isinstance(current, TxnResult):
        return current
    meta = current
    wanted = "commit" if request.commit else "abort"
    if meta.state is TxnState.ONGOING:
        to = TxnState.PREPARE_COMMIT if request.commit else TxnState.PREPARE_ABORT
        prepared = _move(meta, to, now_ms)
        return TxnResult(prepared, OK, _prepared(prepared))
    if meta.state in COMPLETION or meta.state in (TxnState.COMPLETE_COMMIT, TxnState.COMPLETE_ABORT):
        committing = meta.state in (TxnState.PREPARE_COMMIT, TxnState.COMPLETE_COMMIT)
        if committing == request.commit:
            if meta.state in COMPLETION:
                return _refuse(meta, TxnError.CONCURRENT_TRANSACTIONS, f"the {wanted} is being completed")
            return TxnResult(meta, OK)
    return _refuse(
        meta,
        TxnError.INVALID_TXN_STATE,
        f"cannot {wanted}: the transaction is {meta.state.value}",
    )


def handle(meta: TxnMetadata | None, request: TxnRequest, now_ms: int) -> TxnResult:
    """The entry point for every request but InitProducerId's second call (with an allocated
    producer id): it also refuses an empty or over-long transactional id."""
    refused = _id_refusal(meta, request.transactional_id)
    if refused is not None:
        return refused
    if isinstance(request, InitProducerId):
        return init_producer_id(meta, request, now_ms)
    if isinstance(request, AddPartitionsToTxn):
        return add_partitions(meta, request, now_ms)
    if isinstance(request, AddOffsetsToTxn):
        return add_offsets(meta, request, now_ms)
    if isinstance(request, TxnOffsetCommit):
        return txn_offset_commit(meta, request, now_ms)
    return end_txn(meta, request, now_ms)


# ---- the coordinator's own steps -----------------------------------------------------------------


def complete(meta: TxnMetadata, now_ms: int) -> TxnResult:
    """Every marker of a prepared transaction is written: PrepareX -> CompleteX. A commit
    publishes its pending offsets in the same write; an abort drops them."""
    check(
        meta.state in COMPLETION, "complete() of transactional id %r in %s", meta.transactional_id, meta.state
    )
    to, commit = COMPLETION[meta.state]
    publish = dict(meta.pending_offsets) if commit else {}
    done = _move(
        meta, to, now_ms, partitions=frozenset(), groups=frozenset(), pending_offsets={}, start_time_ms=-1
    )
    return TxnResult(done, OK, (WriteState(done, publish),))


def timed_out(metas: Iterable[TxnMetadata], now_ms: int) -> list[str]:
    """The transactional ids whose ongoing transaction ran past its timeout, sorted."""
    return sorted(
        m.transactional_id
        for m in metas
        if m.state is TxnState.ONGOING and m.start_time_ms + m.timeout_ms < now_ms
    )


def abort_timed_out(meta: TxnMetadata, now_ms: int) -> TxnResult:
    """Abort a timed-out transaction, bumping the epoch so its producer's later calls are
    PRODUCER_FENCED (Kafka's abortTimedOutTransactions). Nothing if it is no longer ongoing
    past its timeout (it ended meanwhile)."""
    if meta.transactional_id not in timed_out([meta], now_ms):
        return TxnResult(meta, OK)
    return _fence_and_abort(meta, now_ms, TxnError.NONE, "aborted: transaction timed out")


def abort_by_operator(meta: TxnMetadata, now_ms: int) -> TxnResult:
    """An operator's abort of a hanging transaction (Kafka's kafka-transactions.sh abort): the
    same fence-and-abort as a timeout, but at once. Only an Ongoing transaction can be aborted;
    a prepared one is already completing, and any other state has nothing to abort, so both are
    refused INVALID_TXN_STATE naming the state."""
    if meta.state is not TxnState.ONGOING:
        return _refuse(
            meta,
            TxnError.INVALID_TXN_STATE,
            f"transactional id {meta.transactional_id!r} is {meta.state.name}, not ONGOING: "
            "there is no open transaction to abort",
        )
    return _fence_and_abort(meta, now_ms, TxnError.NONE, "aborted by an operator")


def expire_if_idle(meta: TxnMetadata, now_ms: int) -> TxnResult:
    """Delete the state of an id idle past TRANSACTIONAL_ID_EXPIRATION_MS (Kafka's
    transactional.id.expiration.ms): Empty or Complete* -> Dead, then deleted."""
    idle = meta.state not in IN_TRANSACTION
    if not idle or now_ms - meta.last_update_ms <= limits.TRANSACTIONAL_ID_EXPIRATION_MS:
        return TxnResult(meta, OK)
    dead = _move(meta, TxnState.DEAD, now_ms)
    return TxnResult(None, OK, (DeleteState(dead.transactional_id),))


def verify_partitions(
    meta: TxnMetadata | None, producer_id: int, producer_epoch: int, partitions: TopicPartitions
) -> dict[TopicPartitionKey, TxnError]:
    """KIP-890 part 1: a partition leader asks, before appending a transactional batch, whether
    each partition is in this producer's ongoing transaction (AddPartitionsToTxn verify_only).
    A partition not added is INVALID_TXN_STATE, so a late batch cannot open a hanging one."""
    current = _current(meta, producer_id, producer_epoch)
    if isinstance(current, TxnResult):
        return dict.fromkeys(partitions, current.answer.error)
    in_txn = current.partitions if current.state is TxnState.ONGOING else frozenset()
    return {tp: TxnError.NONE if tp in in_txn else TxnError.INVALID_TXN_STATE for tp in partitions}


# ---- views: DescribeTransactions, ListTransactions ------------------------------------------------


@dataclass(frozen=True)
class TransactionDescription:
    """DescribeTransactions' fields for one id."""

    transactional_id: str
    state: str
    transaction_timeout_ms: int
    transaction_start_time_ms: int
    producer_id: int
    producer_epoch: int
    partitions: tuple[TopicPartitionKey, ...]


@dataclass(frozen=True)
class DescribedTransaction:
    """DescribeTransactions' answer for one id: its description, or why there is none
    (TRANSACTIONAL_ID_NOT_FOUND, NOT_COORDINATOR)."""

    transactional_id: str
    error: TxnError
    description: TransactionDescription | None = None


@dataclass(frozen=True)
class TransactionListing:
    transactional_id: str
    producer_id: int
    state: str


def describe(meta: TxnMetadata) -> TransactionDescription:
    return TransactionDescription(
        meta.transactional_id,
        meta.state.value,
        meta.timeout_ms,
        meta.start_time_ms,
        meta.producer_id,
        meta.producer_epoch,
        tuple(sorted(meta.partitions)),
    )


def list_transactions(
    metas: Iterable[TxnMetadata],
    state_filters: Iterable[str] = (),
    producer_id_filters: Iterable[int] = (),
    duration_filter_ms: int = -1,
    now_ms: int = 0,
) -> tuple[list[TransactionListing], list[str]]:
    """ListTransactions: the ids matching every filter given (an empty filter matches all; the
    duration filter, KIP-994, keeps open transactions older than it), sorted by id, and the
    state filters that name no state (Kafka's unknown_state_filters)."""
    names = {s.value for s in TxnState}
    states = set(state_filters)
    unknown = sorted(states - names)
    pids = set(producer_id_filters)
    listed = [
        TransactionListing(m.transactional_id, m.producer_id, m.state.value)
        for m in metas
        if (not states or m.state.value in states)
        and (not pids or m.producer_id in pids)
        and (
            duration_filter_ms < 0 or (m.start_time_ms >= 0 and now_ms - m.start_time_ms > duration_filter_ms)
        )
    ]
    return sorted(listed, key=lambda listing: listing.transactional_id), unknown
