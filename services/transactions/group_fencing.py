"""KIP-447's group side of TxnOffsetCommit for our KIP-848 groups: pure.

A consume-transform-produce loop sends its consumer's member id and member epoch (the
"generation") with TxnOffsetCommit, so a zombie that lost its partitions in a rebalance cannot
commit offsets for them inside its still-open transaction. The caller (the group's owner task,
reading the group's state as a CommitOffsets does) runs this before the transaction
coordinator's `txn_offset_commit` and answers the group error without touching the transaction.
Classic groups have the same rule in `services.kafka.classic_groups.ClassicGroups.commit_check`.

Stricter than a plain commit (`services.groups.coordinator.check_commit`, which takes an older
epoch of a present member for partitions it still owns): a transactional commit must carry the
member's current epoch exactly (Kafka's ConsumerGroup.validateOffsetCommit with isTransactional).
"""

from __future__ import annotations

from services.groups.coordinator import EPOCH_LEAVE, GroupState
from services.groups.errors import GroupError


def check_txn_offset_commit(group: GroupState | None, member_id: str, member_epoch: int) -> GroupError | None:
    """None when the transactional commit may go on; else the group error to answer.

    A commit without a member (empty id, epoch -1: a producer that does not pass its consumer's
    group metadata, TxnOffsetCommit before version 3) is allowed only while the group has no
    members, as for a plain commit. A member not in the group (or away: a static member that
    left) is UNKNOWN_MEMBER_ID; any epoch but its current one is STALE_MEMBER_EPOCH."""
    members = {} if group is None else group.members
    if member_id == "" and member_epoch == EPOCH_LEAVE:
        return None if not members else GroupError.UNKNOWN_MEMBER_ID
    member = members.get(member_id)
    if member is None or member.away:
        return GroupError.UNKNOWN_MEMBER_ID
    if member_epoch != member.member_epoch:
        return GroupError.STALE_MEMBER_EPOCH
    return None
