"""The transaction coordinator's rules (services/transactions/coordinator.py; issue 41).

Kafka's behaviour as TransactionCoordinator.scala and TransactionMetadata.scala spell it:
every transition, every error, zombie fencing, KIP-360 recovery, timeouts, idempotent EndTxn;
then a deterministic property test of random request sequences from three producers sharing
one transactional id, with the seed printed on failure.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import pytest

from clients.common.errors import InvariantViolation
from services.common import limits
from services.transactions import coordinator as txn
from services.transactions.coordinator import (
    LEGAL_TRANSITIONS,
    AddOffsetsToTxn,
    AddPartitionsToTxn,
    AllocateProducerId,
    DeleteState,
    EndTxn,
    InitProducerId,
    PendingOffset,
    TxnError,
    TxnMetadata,
    TxnOffsetCommit,
    TxnResult,
    TxnState,
    WriteMarkers,
    WriteState,
)
from services.transactions.state import decode_transaction_state, encode_transaction_state

TID = "payments-1"
TIMEOUT_MS = 60_000
A0, A1, B0 = ("a", 0), ("a", 1), ("b", 0)


def init(
    meta: TxnMetadata | None,
    now_ms: int = 0,
    new_pid: int = 1000,
    expected: tuple[int, int] = (-1, -1),
    timeout_ms: int = TIMEOUT_MS,
) -> TxnResult:
    """InitProducerId as a driver runs it: a second call when a producer id must be allocated."""
    request = InitProducerId(TID, timeout_ms, *expected)
    result = txn.init_producer_id(meta, request, now_ms)
    if result.effects == (AllocateProducerId(),):
        result = txn.init_producer_id(meta, request, now_ms, new_pid)
    return result


def fresh(now_ms: int = 0) -> TxnMetadata:
    meta = init(None, now_ms).metadata
    assert meta is not None
    return meta


def ongoing(partitions: frozenset[tuple[str, int]] = frozenset({A0, A1}), now_ms: int = 10) -> TxnMetadata:
    meta = fresh()
    result = txn.add_partitions(
        meta, AddPartitionsToTxn(TID, meta.producer_id, meta.producer_epoch, partitions), now_ms
    )
    assert result.metadata is not None
    return result.metadata


def end(meta: TxnMetadata, commit: bool, epoch: int | None = None) -> TxnResult:
    epoch = meta.producer_epoch if epoch is None else epoch
    return txn.end_txn(meta, EndTxn(TID, meta.producer_id, epoch, commit), 20)


def stored(result: TxnResult) -> TxnMetadata:
    """The metadata a result writes (its WriteState), checked to be the result's metadata."""
    writes = [e for e in result.effects if isinstance(e, WriteState)]
    assert len(writes) == 1, result
    assert writes[0].metadata == result.metadata
    return writes[0].metadata


# ---- InitProducerId ----------------------------------------------------------------------------


def test_a_new_transactional_id_first_asks_for_a_producer_id_then_starts_empty_at_epoch_0() -> None:
    first = txn.init_producer_id(None, InitProducerId(TID, TIMEOUT_MS), 5)
    assert first.effects == (AllocateProducerId(),) and first.metadata is None
    result = txn.init_producer_id(None, InitProducerId(TID, TIMEOUT_MS), 5, 1000)
    meta = stored(result)
    assert (meta.state, meta.producer_id, meta.producer_epoch, meta.timeout_ms) == (
        TxnState.EMPTY,
        1000,
        0,
        TIMEOUT_MS,
    )
    assert (result.answer.error, result.answer.producer_id, result.answer.producer_epoch) == (
        TxnError.NONE,
        1000,
        0,
    )


@pytest.mark.parametrize("timeout_ms", [0, -1, limits.TRANSACTION_TIMEOUT_MS_MAX + 1])
def test_a_transaction_timeout_outside_the_bounds_is_refused(timeout_ms: int) -> None:
    result = txn.init_producer_id(fresh(), InitProducerId(TID, timeout_ms), 5)
    assert result.answer.error is TxnError.INVALID_TRANSACTION_TIMEOUT and not result.effects
    assert "transaction.max.timeout.ms" in result.answer.message


def test_a_new_producer_bumps_the_epoch_and_fences_the_zombie() -> None:
    old = ongoing()
    # The zombie's transaction is aborted first: the new producer is told to retry.
    fencing = init(old, now_ms=30)
    assert fencing.answer.error is TxnError.CONCURRENT_TRANSACTIONS
    aborting = stored(fencing)
    assert (aborting.state, aborting.producer_epoch, aborting.last_producer_epoch) == (
        TxnState.PREPARE_ABORT,
        1,
        -1,
    )
    assert fencing.effects[1] == WriteMarkers(1000, 1, False, frozenset({A0, A1}))
    # The zombie is fenced at once, though the new producer has no epoch yet.
    for late in (
        txn.add_partitions(aborting, AddPartitionsToTxn(TID, 1000, 0, frozenset({B0})), 31),
        txn.end_txn(aborting, EndTxn(TID, 1000, 0, True), 31),
    ):
        assert late.answer.error is TxnError.PRODUCER_FENCED and not late.effects
    assert init(aborting, now_ms=31).answer.error is TxnError.CONCURRENT_TRANSACTIONS
    done = stored(txn.complete(aborting, 40))
    assert done.state is TxnState.COMPLETE_ABORT
    retried = init(done, now_ms=50)
    assert (retried.answer.error, retried.answer.producer_epoch) == (TxnError.NONE, 2)
    assert stored(retried).state is TxnState.EMPTY
    late = txn.add_partitions(stored(retried), AddPartitionsToTxn(TID, 1000, 1, frozenset({B0})), 51)
    assert late.answer.error is TxnError.PRODUCER_FENCED


def test_init_while_a_transaction_completes_is_concurrent_transactions() -> None:
    for commit in (True, False):
        prepared = stored(end(ongoing(), commit))
        result = init(prepared)
        assert result.answer.error is TxnError.CONCURRENT_TRANSACTIONS and not result.effects


def test_an_exhausted_epoch_moves_to_a_new_producer_id() -> None:
    meta = replace(fresh(), producer_epoch=limits.PRODUCER_EPOCH_MAX - 1)
    last_bump = stored(init(meta))
    assert last_bump.producer_epoch == limits.PRODUCER_EPOCH_MAX
    rotated = init(last_bump, new_pid=2000)
    assert (rotated.answer.producer_id, rotated.answer.producer_epoch) == (2000, 0)
    meta = stored(rotated)
    assert (meta.last_producer_id, meta.last_producer_epoch) == (1000, -1)
    late = txn.add_partitions(
        meta, AddPartitionsToTxn(TID, 1000, limits.PRODUCER_EPOCH_MAX, frozenset({A0})), 1
    )
    assert late.answer.error is TxnError.INVALID_PRODUCER_ID_MAPPING


def test_kip_360_a_producer_recovers_with_its_own_id_and_epoch_and_retries_are_answered_alike() -> None:
    meta = fresh()
    recovered = init(meta, expected=(1000, 0))
    assert (recovered.answer.error, recovered.answer.producer_epoch) == (TxnError.NONE, 1)
    after = stored(recovered)
    assert (after.last_producer_id, after.last_producer_epoch) == (1000, 0)
    # The answer was lost: the same call again gets the same epoch, and nothing is written.
    retry = init(after, expected=(1000, 0))
    assert (retry.answer.error, retry.answer.producer_epoch, retry.effects) == (TxnError.NONE, 1, ())
    # An epoch older than both is a zombie's.
    assert (
        init(stored(init(after, expected=(1000, 1))), expected=(1000, 0)).answer.error
        is TxnError.PRODUCER_FENCED
    )


def test_kip_360_recovery_is_refused_after_another_producer_fenced_it() -> None:
    meta = stored(init(fresh()))  # a second producer took over: epoch 1, no last epoch
    assert init(meta, expected=(1000, 0)).answer.error is TxnError.PRODUCER_FENCED


def test_kip_360_recovery_with_an_unknown_producer_id_is_fenced() -> None:
    result = init(fresh(), expected=(777, 0))
    assert result.answer.error is TxnError.PRODUCER_FENCED and not result.effects


@pytest.mark.parametrize("tid", ["", "x" * (limits.TRANSACTIONAL_ID_MAX_CHARS + 1)])
def test_an_empty_or_over_long_transactional_id_is_invalid_request(tid: str) -> None:
    requests: list[txn.TxnRequest] = [
        InitProducerId(tid, TIMEOUT_MS),
        AddPartitionsToTxn(tid, 1000, 0, frozenset({A0})),
        AddOffsetsToTxn(tid, 1000, 0, "g"),
        TxnOffsetCommit(tid, 1000, 0, "g", {}),
        EndTxn(tid, 1000, 0, True),
    ]
    for request in requests:
        result = txn.handle(None, request, 1)
        assert (result.answer.error, result.effects) == (TxnError.INVALID_REQUEST, ()), request


def test_kip_360_recovery_at_an_exhausted_epoch_moves_to_a_new_id_and_a_retry_gets_it_again() -> None:
    meta = replace(fresh(), producer_epoch=limits.PRODUCER_EPOCH_MAX)
    rotated = init(meta, new_pid=2000, expected=(1000, limits.PRODUCER_EPOCH_MAX))
    after = stored(rotated)
    assert (after.producer_id, after.producer_epoch) == (2000, 0)
    assert (after.last_producer_id, after.last_producer_epoch) == (1000, limits.PRODUCER_EPOCH_MAX)
    retry = init(after, new_pid=3000, expected=(1000, limits.PRODUCER_EPOCH_MAX))
    assert (retry.answer.producer_id, retry.answer.producer_epoch, retry.effects) == (2000, 0, ())


def test_a_retried_init_with_a_new_timeout_keeps_the_epoch_and_stores_the_timeout() -> None:
    after = stored(init(fresh(), expected=(1000, 0)))
    retry = init(after, expected=(1000, 0), timeout_ms=5_000)
    assert (retry.answer.producer_epoch, stored(retry).timeout_ms) == (1, 5_000)


# ---- AddPartitionsToTxn, AddOffsetsToTxn, TxnOffsetCommit ------------------------------------------


def test_add_partitions_begins_a_transaction_and_adds_to_it() -> None:
    meta = fresh()
    begun = stored(txn.add_partitions(meta, AddPartitionsToTxn(TID, 1000, 0, frozenset({A0})), 10))
    assert (begun.state, begun.partitions, begun.start_time_ms) == (TxnState.ONGOING, frozenset({A0}), 10)
    again = txn.add_partitions(begun, AddPartitionsToTxn(TID, 1000, 0, frozenset({A0})), 11)
    assert again.answer.error is TxnError.NONE and not again.effects
    more = stored(txn.add_partitions(begun, AddPartitionsToTxn(TID, 1000, 0, frozenset({B0})), 12))
    assert (more.partitions, more.start_time_ms, more.last_update_ms) == (frozenset({A0, B0}), 10, 12)


@pytest.mark.parametrize(
    ("meta", "pid", "epoch", "error"),
    [
        (None, 1000, 0, TxnError.INVALID_PRODUCER_ID_MAPPING),
        ("fresh", 999, 0, TxnError.INVALID_PRODUCER_ID_MAPPING),
        ("bumped", 1000, 0, TxnError.PRODUCER_FENCED),
        ("fresh", 1000, 1, TxnError.INVALID_PRODUCER_EPOCH),
        ("fresh", 1000, limits.PRODUCER_EPOCH_MAX + 1, TxnError.INVALID_PRODUCER_EPOCH),
    ],
)
def test_only_the_current_producer_may_add_offsets_or_end(
    meta: str | None, pid: int, epoch: int, error: TxnError
) -> None:
    state = {None: None, "fresh": fresh(), "bumped": stored(init(fresh()))}[meta]
    results = [
        txn.add_partitions(state, AddPartitionsToTxn(TID, pid, epoch, frozenset({A0})), 1),
        txn.add_offsets(state, AddOffsetsToTxn(TID, pid, epoch, "g"), 1),
        txn.txn_offset_commit(state, TxnOffsetCommit(TID, pid, epoch, "g", {A0: PendingOffset(5)}), 1),
        txn.end_txn(state, EndTxn(TID, pid, epoch, True), 1),
    ]
    assert [(r.answer.error, r.effects) for r in results] == [(error, ())] * 4
    assert txn.verify_partitions(state, pid, epoch, frozenset({A0})) == {A0: error}


def test_the_coordinator_fence_epoch_past_the_max_is_never_accepted_from_a_producer() -> None:
    meta = replace(ongoing(), producer_epoch=limits.PRODUCER_EPOCH_MAX)
    fenced = stored(txn.complete(stored(init(meta)), 5))
    assert (fenced.state, fenced.producer_epoch) == (TxnState.COMPLETE_ABORT, txn.PRODUCER_EPOCH_FENCE_MAX)
    sneaky = txn.add_partitions(
        fenced, AddPartitionsToTxn(TID, 1000, txn.PRODUCER_EPOCH_FENCE_MAX, frozenset({A0})), 6
    )
    assert sneaky.answer.error is TxnError.INVALID_PRODUCER_EPOCH
    assert init(fenced, new_pid=2000).answer.producer_id == 2000


def test_adding_while_the_previous_transaction_completes_is_concurrent_transactions() -> None:
    for commit in (True, False):
        prepared = stored(end(ongoing(), commit))
        for result in (
            txn.add_partitions(prepared, AddPartitionsToTxn(TID, 1000, 0, frozenset({B0})), 30),
            txn.add_offsets(prepared, AddOffsetsToTxn(TID, 1000, 0, "g"), 30),
        ):
            assert result.answer.error is TxnError.CONCURRENT_TRANSACTIONS and not result.effects


def test_a_transaction_begins_again_after_a_completed_one_with_a_new_start_time() -> None:
    done = stored(txn.complete(stored(end(ongoing(now_ms=10), True)), 30))
    again = stored(txn.add_partitions(done, AddPartitionsToTxn(TID, 1000, 0, frozenset({B0})), 40))
    assert (again.state, again.partitions, again.start_time_ms) == (TxnState.ONGOING, frozenset({B0}), 40)


def test_requests_past_the_bounds_or_empty_are_invalid_request(monkeypatch: pytest.MonkeyPatch) -> None:
    meta = fresh()
    empty = txn.add_partitions(meta, AddPartitionsToTxn(TID, 1000, 0, frozenset()), 1)
    assert empty.answer.error is TxnError.INVALID_REQUEST
    assert (
        txn.add_offsets(meta, AddOffsetsToTxn(TID, 1000, 0, ""), 1).answer.error is TxnError.INVALID_REQUEST
    )
    monkeypatch.setattr(limits, "TRANSACTION_PARTITIONS_MAX", 2)
    monkeypatch.setattr(limits, "TRANSACTION_GROUPS_MAX", 1)
    monkeypatch.setattr(limits, "TRANSACTION_PENDING_OFFSETS_MAX", 1)
    big = txn.add_partitions(meta, AddPartitionsToTxn(TID, 1000, 0, frozenset({A0, A1, B0})), 1)
    assert big.answer.error is TxnError.INVALID_REQUEST and "at most 2 partitions" in big.answer.message
    with_group = stored(txn.add_offsets(meta, AddOffsetsToTxn(TID, 1000, 0, "g"), 1))
    assert (
        txn.add_offsets(with_group, AddOffsetsToTxn(TID, 1000, 0, "h"), 1).answer.error
        is TxnError.INVALID_REQUEST
    )
    two = {A0: PendingOffset(1), A1: PendingOffset(2)}
    assert (
        txn.txn_offset_commit(with_group, TxnOffsetCommit(TID, 1000, 0, "g", two), 1).answer.error
        is TxnError.INVALID_REQUEST
    )


def test_offsets_wait_in_the_transaction_for_an_added_group_only() -> None:
    meta = fresh()
    refused = txn.txn_offset_commit(meta, TxnOffsetCommit(TID, 1000, 0, "g", {A0: PendingOffset(5)}), 1)
    assert refused.answer.error is TxnError.INVALID_TXN_STATE and "AddOffsetsToTxn" in refused.answer.message
    added = stored(txn.add_offsets(meta, AddOffsetsToTxn(TID, 1000, 0, "g"), 2))
    assert (added.state, added.groups, added.start_time_ms) == (TxnState.ONGOING, frozenset({"g"}), 2)
    other = txn.txn_offset_commit(added, TxnOffsetCommit(TID, 1000, 0, "h", {A0: PendingOffset(5)}), 3)
    assert other.answer.error is TxnError.INVALID_TXN_STATE
    first = stored(
        txn.txn_offset_commit(added, TxnOffsetCommit(TID, 1000, 0, "g", {A0: PendingOffset(5)}), 3)
    )
    later = txn.txn_offset_commit(
        first, TxnOffsetCommit(TID, 1000, 0, "g", {A0: PendingOffset(9, "m", 2)}), 4
    )
    assert stored(later).pending_offsets == {"g": {A0: PendingOffset(9, "m", 2)}}
    same = txn.txn_offset_commit(
        stored(later), TxnOffsetCommit(TID, 1000, 0, "g", {A0: PendingOffset(9, "m", 2)}), 5
    )
    assert same.answer.error is TxnError.NONE and not same.effects
    prepared = stored(end(stored(later), True))
    late = txn.txn_offset_commit(prepared, TxnOffsetCommit(TID, 1000, 0, "g", {A0: PendingOffset(10)}), 6)
    assert late.answer.error is TxnError.INVALID_TXN_STATE


# ---- EndTxn and completion ----------------------------------------------------------------------------


@pytest.mark.parametrize("commit", [True, False])
def test_end_txn_prepares_writes_markers_completes_and_answers_retries(commit: bool) -> None:
    meta = stored(txn.add_offsets(ongoing(), AddOffsetsToTxn(TID, 1000, 0, "g"), 11))
    meta = stored(txn.txn_offset_commit(meta, TxnOffsetCommit(TID, 1000, 0, "g", {B0: PendingOffset(7)}), 12))
    result = end(meta, commit)
    prepared = stored(result)
    want = TxnState.PREPARE_COMMIT if commit else TxnState.PREPARE_ABORT
    assert (result.answer.error, prepared.state, prepared.partitions) == (
        TxnError.NONE,
        want,
        frozenset({A0, A1}),
    )
    assert result.effects == (WriteState(prepared), WriteMarkers(1000, 0, commit, frozenset({A0, A1})))
    assert txn.completion_effects(prepared) == result.effects[1:]  # a new coordinator resumes them
    same = end(prepared, commit)
    assert (same.answer.error, same.effects) == (TxnError.CONCURRENT_TRANSACTIONS, ())
    other = end(prepared, not commit)
    assert (other.answer.error, other.effects) == (TxnError.INVALID_TXN_STATE, ())
    completed = txn.complete(prepared, 30)
    done = stored(completed)
    assert done.state is (TxnState.COMPLETE_COMMIT if commit else TxnState.COMPLETE_ABORT)
    assert (done.partitions, done.groups, done.pending_offsets, done.start_time_ms) == (
        frozenset(),
        frozenset(),
        {},
        -1,
    )
    publish = completed.effects[0].publish if isinstance(completed.effects[0], WriteState) else None
    assert publish == ({"g": {B0: PendingOffset(7)}} if commit else {})
    assert txn.completion_effects(done) == ()
    retry = end(done, commit)
    assert (retry.answer.error, retry.effects) == (TxnError.NONE, ())
    wrong = end(done, not commit)
    assert (wrong.answer.error, wrong.effects) == (TxnError.INVALID_TXN_STATE, ())


def test_ending_a_transaction_never_begun_is_invalid_txn_state() -> None:
    for commit in (True, False):
        assert end(fresh(), commit).answer.error is TxnError.INVALID_TXN_STATE


def test_a_transaction_of_offsets_only_has_no_markers_to_write() -> None:
    meta = stored(txn.add_offsets(fresh(), AddOffsetsToTxn(TID, 1000, 0, "g"), 1))
    result = end(meta, True)
    assert result.effects == (WriteState(stored(result)),)


def test_complete_of_a_transaction_not_prepared_is_a_bug() -> None:
    with pytest.raises(InvariantViolation, match="complete"):
        txn.complete(ongoing(), 5)


# ---- timeouts, expiry, KIP-890 verification, views ---------------------------------------------------------


def test_an_operator_aborts_an_ongoing_transaction_at_once_fencing_its_producer() -> None:
    result = txn.abort_by_operator(ongoing(now_ms=100), 101)
    aborting = stored(result)
    assert (aborting.state, aborting.producer_epoch) == (TxnState.PREPARE_ABORT, 1)
    assert result.effects[1] == WriteMarkers(1000, 1, False, frozenset({A0, A1}))
    refused = txn.abort_by_operator(fresh(), 101)
    assert refused.answer.error is TxnError.INVALID_TXN_STATE
    assert "EMPTY" in refused.answer.message and refused.effects == ()
    assert txn.abort_by_operator(aborting, 102).answer.error is TxnError.INVALID_TXN_STATE


def test_a_timed_out_transaction_is_aborted_with_an_epoch_bump_and_its_producer_fenced() -> None:
    meta = ongoing(now_ms=100)
    other = replace(ongoing(now_ms=100), transactional_id="other", timeout_ms=TIMEOUT_MS * 2)
    assert txn.timed_out([meta, other, fresh()], 100 + TIMEOUT_MS) == []
    assert txn.timed_out([meta, other, fresh()], 101 + TIMEOUT_MS) == [TID]
    not_yet = txn.abort_timed_out(meta, 100 + TIMEOUT_MS)
    assert (not_yet.metadata, not_yet.effects) == (meta, ())
    result = txn.abort_timed_out(meta, 101 + TIMEOUT_MS)
    aborting = stored(result)
    assert (aborting.state, aborting.producer_epoch, aborting.last_producer_epoch) == (
        TxnState.PREPARE_ABORT,
        1,
        -1,
    )
    assert result.effects[1] == WriteMarkers(1000, 1, False, frozenset({A0, A1}))
    done = stored(txn.complete(aborting, 200 + TIMEOUT_MS))
    for late in (end(done, True, epoch=0), end(done, False, epoch=0)):
        assert late.answer.error is TxnError.PRODUCER_FENCED
    assert init(done, expected=(1000, 0)).answer.error is TxnError.PRODUCER_FENCED
    assert init(done).answer.producer_epoch == 2


def test_an_idle_transactional_id_expires_and_an_open_one_never_does() -> None:
    meta = fresh(now_ms=0)
    assert txn.expire_if_idle(meta, limits.TRANSACTIONAL_ID_EXPIRATION_MS).effects == ()
    expired = txn.expire_if_idle(meta, limits.TRANSACTIONAL_ID_EXPIRATION_MS + 1)
    assert (expired.metadata, expired.effects) == (None, (DeleteState(TID),))
    assert txn.expire_if_idle(ongoing(), limits.TRANSACTIONAL_ID_EXPIRATION_MS * 2).effects == ()


def test_verify_partitions_accepts_only_partitions_of_the_ongoing_transaction() -> None:
    meta = ongoing(frozenset({A0}))
    assert txn.verify_partitions(meta, 1000, 0, frozenset({A0, B0})) == {
        A0: TxnError.NONE,
        B0: TxnError.INVALID_TXN_STATE,
    }
    prepared = stored(end(meta, True))
    assert txn.verify_partitions(prepared, 1000, 0, frozenset({A0})) == {A0: TxnError.INVALID_TXN_STATE}


def test_describe_and_list_transactions() -> None:
    meta = ongoing(frozenset({B0, A0}), now_ms=10)
    other = replace(fresh(), transactional_id="other", producer_id=5)
    description = txn.describe(meta)
    assert description == txn.TransactionDescription(TID, "Ongoing", TIMEOUT_MS, 10, 1000, 0, (A0, B0))
    everything, unknown = txn.list_transactions([meta, other])
    assert [t.transactional_id for t in everything] == ["other", TID] and unknown == []
    listed, unknown = txn.list_transactions([meta, other], state_filters=["Ongoing", "Bogus"])
    assert listed == [txn.TransactionListing(TID, 1000, "Ongoing")] and unknown == ["Bogus"]
    assert [t.producer_id for t in txn.list_transactions([meta, other], producer_id_filters=[5])[0]] == [5]
    assert txn.list_transactions([meta, other], duration_filter_ms=100, now_ms=111)[0] == listed
    assert txn.list_transactions([meta, other], duration_filter_ms=100, now_ms=110)[0] == []


# ---- the transition table and the invariants -------------------------------------------------------------


@pytest.mark.parametrize("state", list(TxnState))
def test_every_move_outside_the_table_raises(state: TxnState) -> None:
    meta = replace(ongoing(), state=state)
    for to in set(TxnState) - LEGAL_TRANSITIONS[state]:
        with pytest.raises(InvariantViolation, match="illegal transaction transition"):
            txn._move(meta, to, 1)


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        ({"state": TxnState.ONGOING}, "holds nothing"),
        ({"partitions": frozenset({A0})}, "still holds"),
        ({"groups": frozenset({"g"}), "state": TxnState.ONGOING, "start_time_ms": 1}, "offsets pending"),
        ({"producer_epoch": -1}, "producer epoch"),
        ({"timeout_ms": limits.TRANSACTION_TIMEOUT_MS_MAX + 1}, "timeout"),
        ({"producer_epoch": txn.PRODUCER_EPOCH_FENCE_MAX}, "past"),
    ],
)
def test_invariants_are_loud(changes: dict[str, object], match: str) -> None:
    meta = replace(fresh(), **changes)  # type: ignore[arg-type]
    if "offsets pending" in match:
        meta = replace(meta, pending_offsets={"h": {A0: PendingOffset(1)}})
    with pytest.raises(InvariantViolation, match=match):
        txn.check_invariants(meta)


# ---- property: random requests from three producers sharing one transactional id ---------------

PARTITIONS = (A0, A1, B0)
STEPS = 80
SEEDS = range(300)


@dataclass
class Producer:
    producer_id: int = -1
    epoch: int = -1


@dataclass
class World:
    """The driver's side: the stored state, ids handed out, markers written, and what it saw."""

    rng: random.Random
    now_ms: int = 0
    meta: TxnMetadata | None = None
    next_pid: int = 1000
    producers: list[Producer] = field(default_factory=lambda: [Producer() for _ in range(3)])
    fenced: set[tuple[int, int]] = field(default_factory=set)
    highest_epoch: dict[int, int] = field(default_factory=dict)
    markers: list[WriteMarkers] = field(default_factory=list)
    prepared: TxnMetadata | None = None
    transitions: set[tuple[TxnState, TxnState]] = field(default_factory=set)

    def apply(self, result: TxnResult, seed: int) -> bool:
        """Apply the effects as a driver does; a write may fail (another coordinator, a lost
        etcd answer), and then nothing of the result happens. False: it did not."""
        for effect in result.effects:
            if isinstance(effect, WriteState | DeleteState) and self.rng.random() < 0.05:
                return False
            if isinstance(effect, WriteMarkers):
                self.markers.append(effect)
        if any(isinstance(e, WriteState | DeleteState) for e in result.effects):
            self.store(result.metadata, seed)
        return True

    def store(self, meta: TxnMetadata | None, seed: int) -> None:
        before = self.meta
        if meta is not None:
            assert decode_transaction_state(encode_transaction_state(meta)) == meta, f"seed {seed}"
            pid, epoch = meta.producer_id, meta.producer_epoch
            assert epoch >= self.highest_epoch.get(pid, 0), (
                f"seed {seed}: epoch of {pid} went down to {epoch}"
            )
            assert pid >= max(self.highest_epoch, default=pid), f"seed {seed}: producer id went back to {pid}"
            self.highest_epoch[pid] = epoch
            if meta.state in txn.COMPLETION:
                self.prepared = meta
            if meta.state in (TxnState.COMPLETE_COMMIT, TxnState.COMPLETE_ABORT):
                # A completion follows its own Prepare, whose markers were all written.
                p = self.prepared
                assert p is not None and before == p, f"seed {seed}: {meta.state} without its Prepare"
                assert txn.COMPLETION[p.state][0] is meta.state, f"seed {seed}"
                if p.partitions:
                    want = WriteMarkers(
                        p.producer_id, p.producer_epoch, meta.state is TxnState.COMPLETE_COMMIT, p.partitions
                    )
                    assert self.markers[-1] == want, f"seed {seed}: {self.markers[-1]} != {want}"
        if before is not None and (
            meta is None
            or (meta.producer_id, meta.producer_epoch) != (before.producer_id, before.producer_epoch)
        ):
            self.fenced.add((before.producer_id, before.producer_epoch))
        self.meta = meta


def _check_coordinator_abort_fences(world: World, before: TxnMetadata | None, seed: int) -> None:
    """An abort the coordinator decides (a new producer's InitProducerId, a timeout) fences the
    producer of the aborted transaction: its epoch is never current again."""
    after = world.meta
    if before is not None and before.state is TxnState.ONGOING and after is not None and after != before:
        assert (before.producer_id, before.producer_epoch) in world.fenced, (
            f"seed {seed}: abort without fence"
        )


def _step(world: World, seed: int) -> None:
    rng, meta = world.rng, world.meta
    world.now_ms += rng.choice((1, 10, 1_000, TIMEOUT_MS // 2))
    now = world.now_ms
    who = rng.randrange(len(world.producers))
    producer = world.producers[who]
    action = rng.choice(
        ("init", "recover", "add", "offsets", "commit_offsets", "end", "end", "complete", "tick", "expire")
    )
    if action in ("init", "recover"):
        expected = (producer.producer_id, producer.epoch) if action == "recover" else (-1, -1)
        init_request = InitProducerId(TID, TIMEOUT_MS, *expected)
        result = txn.init_producer_id(meta, init_request, now)
        if result.effects == (AllocateProducerId(),):
            world.next_pid += 1
            result = txn.init_producer_id(meta, init_request, now, world.next_pid)
        if world.apply(result, seed) and result.answer.error is TxnError.NONE:
            producer.producer_id, producer.epoch = result.answer.producer_id, result.answer.producer_epoch
        _check_coordinator_abort_fences(world, meta, seed)
        return
    if action == "complete":
        if meta is not None and meta.state in txn.COMPLETION:
            world.apply(txn.complete(meta, now), seed)
        return
    if action == "tick":
        if meta is not None:
            world.apply(txn.abort_timed_out(meta, now), seed)
        _check_coordinator_abort_fences(world, meta, seed)
        return
    if action == "expire":
        if meta is not None:
            world.apply(
                txn.expire_if_idle(meta, now + rng.choice((0, limits.TRANSACTIONAL_ID_EXPIRATION_MS))), seed
            )
        return
    pid, epoch = producer.producer_id, producer.epoch
    request: txn.TxnRequest
    if action == "add":
        request = AddPartitionsToTxn(TID, pid, epoch, frozenset(rng.sample(PARTITIONS, rng.randint(1, 2))))
    elif action == "offsets":
        request = AddOffsetsToTxn(TID, pid, epoch, rng.choice(("g", "h")))
    elif action == "commit_offsets":
        request = TxnOffsetCommit(
            TID, pid, epoch, rng.choice(("g", "h")), {A0: PendingOffset(rng.randrange(100))}
        )
    else:
        request = EndTxn(TID, pid, epoch, rng.random() < 0.5)
    result = txn.handle(meta, request, now)
    if result.answer.error is TxnError.NONE:
        # Only the current producer succeeds, and never a fenced one.
        assert meta is not None and (pid, epoch) == (meta.producer_id, meta.producer_epoch), f"seed {seed}"
        assert (pid, epoch) not in world.fenced, f"seed {seed}: fenced {(pid, epoch)} succeeded"
    world.apply(result, seed)


def test_property_one_producer_epoch_at_a_time_completions_follow_prepares_epochs_rise() -> None:
    seen: set[tuple[TxnState, TxnState]] = set()
    real_move: Callable[..., TxnMetadata] = txn._move

    def recording_move(meta: TxnMetadata, to: TxnState, now_ms: int, **changes: object) -> TxnMetadata:
        seen.add((meta.state, to))
        return real_move(meta, to, now_ms, **changes)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(txn, "_move", recording_move)
        for seed in SEEDS:
            world = World(random.Random(seed))
            for _ in range(STEPS):
                _step(world, seed)
    # The random walks took every legal move of the table.
    legal = {(a, b) for a, targets in LEGAL_TRANSITIONS.items() for b in targets}
    assert seen == legal, f"moves never taken: {legal - seen}"
