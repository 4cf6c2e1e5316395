"""The group protocols' one error vocabulary: classic (JoinGroup, SyncGroup, Heartbeat, LeaveGroup,
group admin) and KIP-848 (ConsumerGroupHeartbeat, offset commits), named as Kafka names its wire
codes, and their one mapping to those codes.

services/groups/coordinator.py (KIP-848) and services/kafka/classic_groups.py (classic) decide
with these; services/kafka/group_calls.py answers the Kafka wire through `KAFKA_CODES`, and the
gateway's group calls answer gRPC through services/gateway/groups.py's `GROUP_ERROR_CODES`. The
two sides used to keep an enum each; one enum keeps a name from meaning two things.
"""

from __future__ import annotations

import enum
from types import MappingProxyType

from kio.schema.errors import ErrorCode

__all__ = ["KAFKA_CODES", "GroupError", "kafka_code"]


class GroupError(enum.StrEnum):
    """Operating errors of the group protocols, named as their Kafka wire codes are (Errors.java).

    NONE is the classic side's "no error" answer (a JoinGroup, a Heartbeat, one member of a
    LeaveGroup); the KIP-848 side answers `None` instead."""

    NONE = "NONE"
    # Both sides.
    UNKNOWN_MEMBER_ID = "UNKNOWN_MEMBER_ID"
    GROUP_MAX_SIZE_REACHED = "GROUP_MAX_SIZE_REACHED"
    # Classic: generations and the join/sync rounds.
    ILLEGAL_GENERATION = "ILLEGAL_GENERATION"
    REBALANCE_IN_PROGRESS = "REBALANCE_IN_PROGRESS"
    INCONSISTENT_GROUP_PROTOCOL = "INCONSISTENT_GROUP_PROTOCOL"
    INVALID_SESSION_TIMEOUT = "INVALID_SESSION_TIMEOUT"
    MEMBER_ID_REQUIRED = "MEMBER_ID_REQUIRED"
    COORDINATOR_NOT_AVAILABLE = "COORDINATOR_NOT_AVAILABLE"
    # Group admin (DeleteGroups, OffsetDelete).
    NON_EMPTY_GROUP = "NON_EMPTY_GROUP"
    GROUP_ID_NOT_FOUND = "GROUP_ID_NOT_FOUND"
    GROUP_SUBSCRIBED_TO_TOPIC = "GROUP_SUBSCRIBED_TO_TOPIC"
    # KIP-848: member epochs, static members, server assignors.
    FENCED_MEMBER_EPOCH = "FENCED_MEMBER_EPOCH"
    STALE_MEMBER_EPOCH = "STALE_MEMBER_EPOCH"
    UNRELEASED_INSTANCE_ID = "UNRELEASED_INSTANCE_ID"
    UNSUPPORTED_ASSIGNOR = "UNSUPPORTED_ASSIGNOR"


# Each error's Kafka wire code, the one table the Kafka listener answers through. Written out
# rather than derived from the names, so a misspelt or renamed member fails the unit test that
# walks the enum (tests/unit/test_group_errors.py) instead of a client's request.
KAFKA_CODES: MappingProxyType[GroupError, ErrorCode] = MappingProxyType(
    {
        GroupError.NONE: ErrorCode.none,
        GroupError.UNKNOWN_MEMBER_ID: ErrorCode.unknown_member_id,
        GroupError.GROUP_MAX_SIZE_REACHED: ErrorCode.group_max_size_reached,
        GroupError.ILLEGAL_GENERATION: ErrorCode.illegal_generation,
        GroupError.REBALANCE_IN_PROGRESS: ErrorCode.rebalance_in_progress,
        GroupError.INCONSISTENT_GROUP_PROTOCOL: ErrorCode.inconsistent_group_protocol,
        GroupError.INVALID_SESSION_TIMEOUT: ErrorCode.invalid_session_timeout,
        GroupError.MEMBER_ID_REQUIRED: ErrorCode.member_id_required,
        GroupError.COORDINATOR_NOT_AVAILABLE: ErrorCode.coordinator_not_available,
        GroupError.NON_EMPTY_GROUP: ErrorCode.non_empty_group,
        GroupError.GROUP_ID_NOT_FOUND: ErrorCode.group_id_not_found,
        GroupError.GROUP_SUBSCRIBED_TO_TOPIC: ErrorCode.group_subscribed_to_topic,
        GroupError.FENCED_MEMBER_EPOCH: ErrorCode.fenced_member_epoch,
        GroupError.STALE_MEMBER_EPOCH: ErrorCode.stale_member_epoch,
        GroupError.UNRELEASED_INSTANCE_ID: ErrorCode.unreleased_instance_id,
        GroupError.UNSUPPORTED_ASSIGNOR: ErrorCode.unsupported_assignor,
    }
)


def kafka_code(error: GroupError) -> ErrorCode:
    """The Kafka wire code of a group error (KAFKA_CODES)."""
    return KAFKA_CODES[error]
