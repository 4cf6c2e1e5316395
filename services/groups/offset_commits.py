"""Offset commits: the one home of their rules, for the gateway's CommitOffsets and the Kafka
listener's OffsetCommit (services/gateway/server.py, services/kafka/group_calls.py and backend.py).

Which partitions of a commit may be stored (`partition_problem`), whether the group lets the
committer commit them (`group_refusal`), which of them are writes at all (`changed_commits`:
an offset stored as given is not written again, each write stays in etcd's history until
compacted) and the fenced write with its bounded compare-and-swap retries (`commit_fenced`).
No I/O here: the state read and the transaction arrive through `read_state` and
`write_changed` (the etcd calls are coordinator/consumer_offsets.py's), and each adapter maps
the answers to its own wire codes.
"""

from __future__ import annotations

import enum
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

from clients.common.types import TopicPartitionKey
from services.common import limits
from services.groups.coordinator import EPOCH_LEAVE, GroupState, check_commit

Guard = TypeVar("Guard")
# A stored commit as coordinator/values.py decodes it (its CommittedOffsetValue; this pure
# module may not import coordinator/): "offset", "metadata", "leader_epoch", "commit_time_ms".
StoredCommit = Mapping[str, object]


@dataclass(frozen=True)
class Commit:
    """One partition's commit as the committer gave it."""

    topic: str
    partition: int
    offset: int
    metadata: str
    leader_epoch: int

    @property
    def key(self) -> TopicPartitionKey:
        return (self.topic, self.partition)


class PartitionProblem(enum.StrEnum):
    """Why one partition of a commit is not stored (the rest of the commit still is)."""

    UNKNOWN_TOPIC_OR_PARTITION = "UNKNOWN_TOPIC_OR_PARTITION"
    INVALID_COMMIT_OFFSET = "INVALID_COMMIT_OFFSET"
    OFFSET_METADATA_TOO_LARGE = "OFFSET_METADATA_TOO_LARGE"


class CommitRefusal(enum.StrEnum):
    """Why a whole commit is refused (nothing of it is written), named as the wire codes are."""

    # A commit from outside the group (no member id) while the group has members: their
    # offsets are theirs to commit.
    NON_EMPTY_GROUP = "NON_EMPTY_GROUP"
    UNKNOWN_MEMBER_ID = "UNKNOWN_MEMBER_ID"
    FENCED_MEMBER_EPOCH = "FENCED_MEMBER_EPOCH"
    STALE_MEMBER_EPOCH = "STALE_MEMBER_EPOCH"
    # The group's state changed under every one of GROUP_STATE_CAS_ATTEMPTS_MAX attempts (a
    # rebalance): retriable, the wire's REQUEST_TIMED_OUT.
    GROUP_KEPT_CHANGING = "GROUP_KEPT_CHANGING"


def partition_problem(
    commit: Commit, exists: bool, *, negative_offset_allowed: bool
) -> PartitionProblem | None:
    """Whether this partition's commit may be stored; None when it may.

    Checked in Kafka's order: the partition must exist (KafkaApis), then the offset, then the
    metadata's size (the coordinator's offset.metadata.max.bytes). A negative offset is
    stored as given only where the protocol asks for it (`negative_offset_allowed`: Kafka's
    coordinator takes any value and kafkajs' resetOffsets commits -2 / -1 for earliest /
    latest; readers take a negative one as no position, coordinator/consumer_offsets.py);
    the gateway's API has no such use and refuses it."""
    if not exists:
        return PartitionProblem.UNKNOWN_TOPIC_OR_PARTITION
    if commit.offset < 0 and not negative_offset_allowed:
        return PartitionProblem.INVALID_COMMIT_OFFSET
    if len(commit.metadata) > limits.OFFSET_METADATA_MAX_CHARS:
        return PartitionProblem.OFFSET_METADATA_TOO_LARGE
    return None


def too_many_offsets(count: int) -> bool:
    """More offsets than one etcd transaction may write (COMMIT_OFFSETS_PER_REQUEST_MAX)."""
    return count > limits.COMMIT_OFFSETS_PER_REQUEST_MAX


def batches(commits: Sequence[Commit]) -> list[Sequence[Commit]]:
    """The commit in pieces one etcd transaction each may write. Only the Kafka listener
    splits: Kafka's clients commit every assigned partition in one request and have no way
    to split it, while the gateway refuses a larger commit (`too_many_offsets`)."""
    step = limits.COMMIT_OFFSETS_PER_REQUEST_MAX
    return [commits[start : start + step] for start in range(0, len(commits), step)]


def group_refusal(
    state: GroupState, member_id: str, member_epoch: int, partitions: frozenset[TopicPartitionKey]
) -> CommitRefusal | None:
    """Whether the group's KIP-848 state lets this committer commit these partitions; None
    when it does. A member is fenced by its member epoch (coordinator.check_commit); a commit
    with no member id comes from outside the group and is taken at epoch -1 whatever epoch it
    carries, allowed only while the group has no members (NON_EMPTY_GROUP otherwise)."""
    if not member_id:
        return (
            None
            if check_commit(state, "", EPOCH_LEAVE, partitions) is None
            else CommitRefusal.NON_EMPTY_GROUP
        )
    error = check_commit(state, member_id, member_epoch, partitions)
    return None if error is None else CommitRefusal(error.value)


def same_commit(stored: StoredCommit | None, commit: Commit) -> bool:
    """The stored commit already says this (offset, metadata, leader epoch): writing it again
    would only add a revision to etcd's history. A value written before metadata or the
    leader epoch were stored differs."""
    return (
        stored is not None
        and stored.get("offset") == commit.offset
        and stored.get("metadata") == commit.metadata
        and stored.get("leader_epoch") == commit.leader_epoch
    )


def changed_commits(
    stored: Mapping[TopicPartitionKey, StoredCommit], commits: Sequence[Commit]
) -> list[Commit]:
    """The commits that change the group's committed offsets: the writes its transaction
    makes. An unchanged one keeps the commit time of its first commit; when none changed,
    nothing is written and the commit takes effect at the read of `stored`."""
    return [c for c in commits if not same_commit(stored.get(c.key), c)]


async def commit_fenced(
    member_id: str,
    member_epoch: int,
    commits: Sequence[Commit],
    read_state: Callable[[], Awaitable[tuple[GroupState, Guard]]],
    write_changed: Callable[[Guard, Sequence[Commit]], Awaitable[bool]],
) -> CommitRefusal | None:
    """Apply one commit fenced by the group's state: None when applied, else why not.

    `read_state` gives the group's state and the guard that holds the transaction to it
    (unchanged since the read); `write_changed` writes the commits that differ from the stored
    ones in one transaction under that guard, False when the guard failed. So a member
    expired meanwhile (a zombie waking up) does not get its commit applied, and a state that
    moved on (a rebalance) is checked again, at most GROUP_STATE_CAS_ATTEMPTS_MAX times."""
    partitions = frozenset(c.key for c in commits)
    for _ in range(limits.GROUP_STATE_CAS_ATTEMPTS_MAX):
        state, guard = await read_state()
        refusal = group_refusal(state, member_id, member_epoch, partitions)
        if refusal is not None:
            return refusal
        if await write_changed(guard, commits):
            return None
    return CommitRefusal.GROUP_KEPT_CHANGING
