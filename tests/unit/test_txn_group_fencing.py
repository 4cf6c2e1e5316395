"""KIP-447's group side of TxnOffsetCommit for KIP-848 groups (services/transactions/group_fencing.py)."""

from __future__ import annotations

from services.groups.coordinator import (
    EPOCH_JOIN,
    EPOCH_LEAVE_STATIC,
    GroupError,
    GroupState,
    HeartbeatRequest,
    check_commit,
    heartbeat,
)
from services.transactions.group_fencing import check_txn_offset_commit

COUNTS = {"in": 2}


def _joined(state: GroupState, member_id: str, instance_id: str | None = None) -> tuple[GroupState, int]:
    request = HeartbeatRequest("", EPOCH_JOIN, instance_id=instance_id, subscribed_topics=frozenset({"in"}))
    state, answer = heartbeat(state, request, COUNTS, member_id)
    assert answer.error is None
    return state, answer.member_epoch


def test_a_member_commits_in_a_transaction_only_at_its_current_epoch() -> None:
    state, epoch = _joined(GroupState("g"), "m1")
    assert check_txn_offset_commit(state, "m1", epoch) is None
    state, _ = _joined(state, "m2")  # the group epoch moves on; m1's epoch catches up on its heartbeat
    owned, new_epoch = state.members["m1"].assigned, epoch
    for _ in range(5):  # m1 gives up a partition for m2, then takes the new epoch
        state, answer = heartbeat(state, HeartbeatRequest("m1", new_epoch, owned=owned), COUNTS, "unused")
        assert answer.error is None
        owned, new_epoch = answer.assignment, answer.member_epoch
    assert new_epoch > epoch
    # A zombie still at the older epoch is refused, though a plain commit would be taken.
    assert check_txn_offset_commit(state, "m1", epoch) is GroupError.STALE_MEMBER_EPOCH
    assert check_commit(state, "m1", epoch, owned) is None
    assert check_txn_offset_commit(state, "m1", new_epoch) is None
    assert check_txn_offset_commit(state, "m1", new_epoch + 1) is GroupError.STALE_MEMBER_EPOCH


def test_an_unknown_or_away_member_is_unknown_member_id() -> None:
    state, epoch = _joined(GroupState("g"), "m1", instance_id="i1")
    assert check_txn_offset_commit(state, "nobody", epoch) is GroupError.UNKNOWN_MEMBER_ID
    state, _ = heartbeat(
        state, HeartbeatRequest("m1", EPOCH_LEAVE_STATIC, instance_id="i1"), COUNTS, "unused"
    )
    assert check_txn_offset_commit(state, "m1", epoch) is GroupError.UNKNOWN_MEMBER_ID


def test_a_commit_from_outside_the_group_needs_a_group_without_members() -> None:
    assert check_txn_offset_commit(None, "", -1) is None
    assert check_txn_offset_commit(GroupState("g"), "", -1) is None
    state, _ = _joined(GroupState("g"), "m1")
    assert check_txn_offset_commit(state, "", -1) is GroupError.UNKNOWN_MEMBER_ID
