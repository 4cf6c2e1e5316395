"""The rules of offset commits (services/groups/offset_commits.py), one home for the gateway's
CommitOffsets and the Kafka listener's OffsetCommit: which partitions are stored, when the
group refuses the committer, which writes a commit makes and the bounded fenced retry."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence

import pytest

from services.common import limits
from services.groups import coordinator
from services.groups.coordinator import EPOCH_JOIN, EPOCH_LEAVE, GroupState, HeartbeatRequest
from services.groups.offset_commits import (
    Commit,
    CommitRefusal,
    PartitionProblem,
    batches,
    changed_commits,
    commit_fenced,
    group_refusal,
    partition_problem,
    too_many_offsets,
)

GROUP = "billing"


def _commit(offset: int = 7, metadata: str = "", partition: int = 0) -> Commit:
    return Commit("orders", partition, offset, metadata, 3)


def _group_with_member() -> tuple[GroupState, str, int, frozenset[tuple[str, int]]]:
    """A group whose one member owns both partitions of "orders": (state, id, epoch, owned)."""
    state, answer = coordinator.heartbeat(
        GroupState(group_id=GROUP),
        HeartbeatRequest("", EPOCH_JOIN, subscribed_topics=frozenset({"orders"})),
        {"orders": 2},
        "member-1",
    )
    assert answer.error is None and answer.assignment
    return state, answer.member_id, answer.member_epoch, answer.assignment


# ---- partition_problem ----------------------------------------------------------------------


def test_a_valid_commit_has_no_problem() -> None:
    assert partition_problem(_commit(), True, negative_offset_allowed=False) is None


def test_an_unknown_partition_is_reported_first() -> None:
    # Kafka's order: the partition must exist before its offset or metadata are looked at.
    bad = _commit(offset=-1, metadata="x" * (limits.OFFSET_METADATA_MAX_CHARS + 1))
    assert (
        partition_problem(bad, False, negative_offset_allowed=False)
        == PartitionProblem.UNKNOWN_TOPIC_OR_PARTITION
    )


def test_a_negative_offset_is_refused_only_where_the_protocol_has_no_use_for_it() -> None:
    # The gateway refuses it; Kafka stores it (kafkajs' resetOffsets commits -2 / -1).
    assert (
        partition_problem(_commit(offset=-2), True, negative_offset_allowed=False)
        == PartitionProblem.INVALID_COMMIT_OFFSET
    )
    assert partition_problem(_commit(offset=-2), True, negative_offset_allowed=True) is None


@pytest.mark.parametrize("negative_offset_allowed", [False, True])
def test_metadata_over_the_limit_is_refused_and_at_the_limit_is_stored(negative_offset_allowed: bool) -> None:
    at_limit = _commit(metadata="m" * limits.OFFSET_METADATA_MAX_CHARS)
    over = _commit(metadata="m" * (limits.OFFSET_METADATA_MAX_CHARS + 1))
    assert partition_problem(at_limit, True, negative_offset_allowed=negative_offset_allowed) is None
    assert (
        partition_problem(over, True, negative_offset_allowed=negative_offset_allowed)
        == PartitionProblem.OFFSET_METADATA_TOO_LARGE
    )


def test_the_offset_count_bound_is_one_transaction() -> None:
    assert not too_many_offsets(limits.COMMIT_OFFSETS_PER_REQUEST_MAX)
    assert too_many_offsets(limits.COMMIT_OFFSETS_PER_REQUEST_MAX + 1)


def test_batches_cover_every_commit_in_order_within_the_bound() -> None:
    commits = [_commit(partition=p) for p in range(2 * limits.COMMIT_OFFSETS_PER_REQUEST_MAX + 1)]
    pieces = batches(commits)
    assert [len(b) for b in pieces] == [
        limits.COMMIT_OFFSETS_PER_REQUEST_MAX,
        limits.COMMIT_OFFSETS_PER_REQUEST_MAX,
        1,
    ]
    assert [c for b in pieces for c in b] == commits
    assert batches([]) == []


# ---- group_refusal --------------------------------------------------------------------------


def test_an_outsider_commits_to_a_group_without_members_whatever_epoch_it_carries() -> None:
    empty = GroupState(group_id=GROUP)
    assert group_refusal(empty, "", EPOCH_LEAVE, frozenset({("orders", 0)})) is None
    assert group_refusal(empty, "", 5, frozenset({("orders", 0)})) is None


def test_an_outsider_is_refused_non_empty_group_while_the_group_has_members() -> None:
    state, _, _, owned = _group_with_member()
    assert group_refusal(state, "", EPOCH_LEAVE, owned) == CommitRefusal.NON_EMPTY_GROUP
    assert group_refusal(state, "", 0, owned) == CommitRefusal.NON_EMPTY_GROUP


def test_a_member_is_fenced_by_its_member_epoch() -> None:
    state, member, epoch, owned = _group_with_member()
    assert group_refusal(state, member, epoch, owned) is None
    assert group_refusal(state, member, epoch + 1, owned) == CommitRefusal.FENCED_MEMBER_EPOCH
    assert group_refusal(state, "someone-else", epoch, owned) == CommitRefusal.UNKNOWN_MEMBER_ID
    not_owned = frozenset({("orders", 99)})
    assert group_refusal(state, member, epoch, not_owned) == CommitRefusal.FENCED_MEMBER_EPOCH


# ---- changed_commits ------------------------------------------------------------------------


def test_only_commits_that_change_the_stored_value_are_written() -> None:
    same, moved, new = _commit(partition=0), _commit(offset=9, partition=1), _commit(partition=2)
    stored: Mapping[tuple[str, int], Mapping[str, object]] = {
        ("orders", 0): {"offset": 7, "metadata": "", "leader_epoch": 3, "commit_time_ms": 1},
        ("orders", 1): {"offset": 7, "metadata": "", "leader_epoch": 3, "commit_time_ms": 1},
    }
    assert changed_commits(stored, [same, moved, new]) == [moved, new]


def test_a_value_stored_before_metadata_or_leader_epoch_were_kept_is_rewritten() -> None:
    stored: Mapping[tuple[str, int], Mapping[str, object]] = {("orders", 0): {"offset": 7}}
    assert changed_commits(stored, [_commit()]) == [_commit()]
    other_epoch: Mapping[tuple[str, int], Mapping[str, object]] = {
        ("orders", 0): {"offset": 7, "metadata": "", "leader_epoch": 2}
    }
    assert changed_commits(other_epoch, [_commit()]) == [_commit()]


# ---- commit_fenced --------------------------------------------------------------------------


class _Store:
    """The two steps commit_fenced takes, recorded: states to read in turn, and whether each
    guarded write finds the state it read (the guard is the index of that read)."""

    def __init__(self, states: Sequence[GroupState], guard_holds: Sequence[bool]) -> None:
        self.states, self.guard_holds = list(states), list(guard_holds)
        self.reads = 0
        self.writes: list[tuple[int, list[Commit]]] = []

    async def read_state(self) -> tuple[GroupState, int]:
        state = self.states[min(self.reads, len(self.states) - 1)]
        self.reads += 1
        return state, self.reads - 1

    async def write_changed(self, guard: int, commits: Sequence[Commit]) -> bool:
        self.writes.append((guard, list(commits)))
        return self.guard_holds[min(len(self.writes) - 1, len(self.guard_holds) - 1)]


def _run(store: _Store, member_id: str, member_epoch: int, commits: Sequence[Commit]) -> CommitRefusal | None:
    return asyncio.run(commit_fenced(member_id, member_epoch, commits, store.read_state, store.write_changed))


def test_a_commit_is_one_guarded_write_of_the_whole_commit() -> None:
    store = _Store([GroupState(group_id=GROUP)], [True])
    commits = [_commit(partition=0), _commit(partition=1)]
    assert _run(store, "", EPOCH_LEAVE, commits) is None
    assert store.writes == [(0, commits)]


def test_a_refused_commit_writes_nothing() -> None:
    state, _, _, _ = _group_with_member()
    store = _Store([state], [True])
    assert _run(store, "", EPOCH_LEAVE, [_commit()]) == CommitRefusal.NON_EMPTY_GROUP
    assert store.writes == []


def test_a_state_that_moved_on_is_checked_again_before_writing() -> None:
    # A member joined between the check and the write: the guard fails, the retry reads the
    # new state and refuses the outsider's commit.
    joined, _, _, _ = _group_with_member()
    store = _Store([GroupState(group_id=GROUP), joined], [False])
    assert _run(store, "", EPOCH_LEAVE, [_commit()]) == CommitRefusal.NON_EMPTY_GROUP
    assert store.reads == 2 and [guard for guard, _ in store.writes] == [0]


def test_a_member_expired_before_the_write_does_not_get_its_commit_applied() -> None:
    state, member, epoch, owned = _group_with_member()
    expired, _ = coordinator.expire(state, member)
    store = _Store([state, expired], [False])
    commits = [Commit(t, p, 7, "", 3) for t, p in sorted(owned)]
    assert _run(store, member, epoch, commits) == CommitRefusal.UNKNOWN_MEMBER_ID
    assert len(store.writes) == 1


def test_a_group_that_keeps_changing_gives_up_after_the_bound() -> None:
    store = _Store([GroupState(group_id=GROUP)], [False])
    assert _run(store, "", EPOCH_LEAVE, [_commit()]) == CommitRefusal.GROUP_KEPT_CHANGING
    assert store.reads == len(store.writes) == limits.GROUP_STATE_CAS_ATTEMPTS_MAX
