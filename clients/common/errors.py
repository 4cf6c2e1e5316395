"""Operating errors: typed, carrying policy flags, mapped to one wire code each.

Two kinds of error live in Highwater (docs/ARCHITECTURE.md, "Errors"):

- Operating errors are expected: a stale epoch, an unknown topic, a full ISR
  shrink. They are instances of `HighwaterError`, carry the protobuf
  `ErrorCode` they travel as, and say whether a client may retry
  (`retriable`) and whether it should refresh metadata first
  (`refresh_metadata`). `error_for_code` turns a wire code back into a class.
- Broken invariants are programmer errors. They raise `InvariantViolation`
  at once with the values that broke it, and nobody catches it to carry on.

This module imports nothing but the generated enum so that pure code can use it.
"""

from __future__ import annotations

from typing import ClassVar

from protos.highwater.v1 import common_pb2

ErrorCode = common_pb2.ErrorCode


class InvariantViolation(RuntimeError):
    """A rule of docs/ARCHITECTURE.md ("Invariants") was broken: a bug, never an operating error."""


def check(condition: bool, message: str, *args: object) -> None:
    """Raise InvariantViolation with a formatted message when condition is false.

    Used instead of `assert`, which `python -O` strips.
    """
    if not condition:
        raise InvariantViolation(message % args if args else message)


class HighwaterError(Exception):
    """An operating error with the wire code it travels as."""

    code: ClassVar[common_pb2.ErrorCode] = common_pb2.UNKNOWN_SERVER_ERROR
    retriable: ClassVar[bool] = False
    refresh_metadata: ClassVar[bool] = False

    def __init__(self, message: str = "") -> None:
        super().__init__(message or self.default_message())
        self.message = message or self.default_message()

    @classmethod
    def code_name(cls) -> str:
        name: str = ErrorCode.Name(cls.code)  # the enum wrapper's Name() is typed Any
        return name

    @classmethod
    def default_message(cls) -> str:
        return cls.code_name().lower().replace("_", " ")

    def __str__(self) -> str:
        return f"{self.code_name()}: {self.message}"


_BY_CODE: dict[int, type[HighwaterError]] = {}


def _error(
    name: str, code: common_pb2.ErrorCode, *, retriable: bool = False, refresh_metadata: bool = False
) -> type[HighwaterError]:
    cls = type(
        name, (HighwaterError,), {"code": code, "retriable": retriable, "refresh_metadata": refresh_metadata}
    )
    _BY_CODE[code] = cls
    return cls


# One class per wire code. Retriable: a later attempt may succeed without any
# change by the caller. Refresh metadata: the caller's idea of who leads is stale.
NotLeaderOrFollower = _error(
    "NotLeaderOrFollower", common_pb2.NOT_LEADER_OR_FOLLOWER, retriable=True, refresh_metadata=True
)
UnknownTopicOrPartition = _error(
    "UnknownTopicOrPartition", common_pb2.UNKNOWN_TOPIC_OR_PARTITION, retriable=True, refresh_metadata=True
)
OffsetOutOfRange = _error("OffsetOutOfRange", common_pb2.OFFSET_OUT_OF_RANGE)
FencedLeaderEpoch = _error(
    "FencedLeaderEpoch", common_pb2.FENCED_LEADER_EPOCH, retriable=True, refresh_metadata=True
)
UnknownLeaderEpoch = _error(
    "UnknownLeaderEpoch", common_pb2.UNKNOWN_LEADER_EPOCH, retriable=True, refresh_metadata=True
)
InconsistentTopicId = _error(
    "InconsistentTopicId", common_pb2.INCONSISTENT_TOPIC_ID, retriable=True, refresh_metadata=True
)
StaleControllerEpoch = _error("StaleControllerEpoch", common_pb2.STALE_CONTROLLER_EPOCH)
StaleBrokerEpoch = _error("StaleBrokerEpoch", common_pb2.STALE_BROKER_EPOCH)
NotEnoughReplicas = _error("NotEnoughReplicas", common_pb2.NOT_ENOUGH_REPLICAS, retriable=True)
NotEnoughReplicasAfterAppend = _error(
    "NotEnoughReplicasAfterAppend", common_pb2.NOT_ENOUGH_REPLICAS_AFTER_APPEND, retriable=True
)
RequestTimedOut = _error("RequestTimedOut", common_pb2.REQUEST_TIMED_OUT, retriable=True)
CorruptMessage = _error("CorruptMessage", common_pb2.CORRUPT_MESSAGE)
MessageTooLarge = _error("MessageTooLarge", common_pb2.MESSAGE_TOO_LARGE)
InvalidTopic = _error("InvalidTopic", common_pb2.INVALID_TOPIC)
TopicAlreadyExists = _error("TopicAlreadyExists", common_pb2.TOPIC_ALREADY_EXISTS)
InvalidReplicationFactor = _error("InvalidReplicationFactor", common_pb2.INVALID_REPLICATION_FACTOR)
InvalidPartitions = _error("InvalidPartitions", common_pb2.INVALID_PARTITIONS)
NotController = _error("NotController", common_pb2.NOT_CONTROLLER, retriable=True, refresh_metadata=True)
TopicAuthorizationFailed = _error("TopicAuthorizationFailed", common_pb2.TOPIC_AUTHORIZATION_FAILED)
ClusterAuthorizationFailed = _error("ClusterAuthorizationFailed", common_pb2.CLUSTER_AUTHORIZATION_FAILED)
OutOfOrderSequenceNumber = _error("OutOfOrderSequenceNumber", common_pb2.OUT_OF_ORDER_SEQUENCE_NUMBER)
DuplicateSequenceNumber = _error("DuplicateSequenceNumber", common_pb2.DUPLICATE_SEQUENCE_NUMBER)
InvalidProducerEpoch = _error("InvalidProducerEpoch", common_pb2.INVALID_PRODUCER_EPOCH)
StorageError = _error("StorageError", common_pb2.STORAGE_ERROR, retriable=True, refresh_metadata=True)
InvalidRequest = _error("InvalidRequest", common_pb2.INVALID_REQUEST)
InvalidReplicaAssignment = _error("InvalidReplicaAssignment", common_pb2.INVALID_REPLICA_ASSIGNMENT)
NoReassignmentInProgress = _error("NoReassignmentInProgress", common_pb2.NO_REASSIGNMENT_IN_PROGRESS)
ElectionNotNeeded = _error("ElectionNotNeeded", common_pb2.ELECTION_NOT_NEEDED)
PreferredLeaderNotAvailable = _error(
    "PreferredLeaderNotAvailable", common_pb2.PREFERRED_LEADER_NOT_AVAILABLE, retriable=True
)
EligibleLeadersNotAvailable = _error(
    "EligibleLeadersNotAvailable", common_pb2.ELIGIBLE_LEADERS_NOT_AVAILABLE, retriable=True
)
LeaderNotAvailable = _error(
    "LeaderNotAvailable", common_pb2.LEADER_NOT_AVAILABLE, retriable=True, refresh_metadata=True
)
InvalidConfig = _error("InvalidConfig", common_pb2.INVALID_CONFIG)
TopicDeletionDisabled = _error("TopicDeletionDisabled", common_pb2.TOPIC_DELETION_DISABLED)
BrokerNotAvailable = _error(
    "BrokerNotAvailable", common_pb2.BROKER_NOT_AVAILABLE, retriable=True, refresh_metadata=True
)
UnknownServerError = _error("UnknownServerError", common_pb2.UNKNOWN_SERVER_ERROR)
InvalidUpdateVersion = _error("InvalidUpdateVersion", common_pb2.INVALID_UPDATE_VERSION, retriable=True)
InvalidCommitOffset = _error("InvalidCommitOffset", common_pb2.INVALID_COMMIT_OFFSET)
# A produced batch whose records break the v2 format, or whose timestamps the topic refuses
# (clients/common/record_validation.py); sending the same bytes again cannot succeed.
InvalidRecord = _error("InvalidRecord", common_pb2.INVALID_RECORD)
PolicyViolation = _error("PolicyViolation", common_pb2.POLICY_VIOLATION)
InvalidTimestamp = _error("InvalidTimestamp", common_pb2.INVALID_TIMESTAMP)


# Consumer groups (services/groups). A fenced member must rejoin (epoch 0) and drop its
# partitions without committing; a stale epoch is a zombie's commit.
UnknownMemberId = _error("UnknownMemberId", common_pb2.UNKNOWN_MEMBER_ID)
FencedMemberEpoch = _error("FencedMemberEpoch", common_pb2.FENCED_MEMBER_EPOCH)
# Retriable: the member's next heartbeat brings its current epoch.
StaleMemberEpoch = _error("StaleMemberEpoch", common_pb2.STALE_MEMBER_EPOCH, retriable=True)
UnreleasedInstanceId = _error("UnreleasedInstanceId", common_pb2.UNRELEASED_INSTANCE_ID)
UnsupportedAssignor = _error("UnsupportedAssignor", common_pb2.UNSUPPORTED_ASSIGNOR)
GroupMaxSizeReached = _error("GroupMaxSizeReached", common_pb2.GROUP_MAX_SIZE_REACHED)
NonEmptyGroup = _error("NonEmptyGroup", common_pb2.NON_EMPTY_GROUP)
GroupIdNotFound = _error("GroupIdNotFound", common_pb2.GROUP_ID_NOT_FOUND)


# Transactions (issue 41; docs/CLIENTS.md, Transactions). A fenced producer is done: another
# producer with its transactional id took over, so it must be closed. INVALID_TXN_STATE and the
# mapping and timeout errors are the caller's to fix; the other two pass with time.
ProducerFenced = _error("ProducerFenced", common_pb2.PRODUCER_FENCED)
InvalidTxnState = _error("InvalidTxnState", common_pb2.INVALID_TXN_STATE)
InvalidProducerIdMapping = _error("InvalidProducerIdMapping", common_pb2.INVALID_PRODUCER_ID_MAPPING)
InvalidTransactionTimeout = _error("InvalidTransactionTimeout", common_pb2.INVALID_TRANSACTION_TIMEOUT)
TransactionalIdNotFound = _error("TransactionalIdNotFound", common_pb2.TRANSACTIONAL_ID_NOT_FOUND)
ConcurrentTransactions = _error("ConcurrentTransactions", common_pb2.CONCURRENT_TRANSACTIONS, retriable=True)
CoordinatorNotAvailable = _error(
    "CoordinatorNotAvailable", common_pb2.COORDINATOR_NOT_AVAILABLE, retriable=True
)


# The retry policy, read from the flags above so a new code joins it where it is defined.
# Every code a later attempt of the same request may fix:
RETRIABLE_CODES = frozenset(code for code, cls in _BY_CODE.items() if cls.retriable)
# ... of which those that first need fresh metadata (the partition's leader moved, is coming,
# or the topic is not known yet where the request landed):
RETRIABLE_AFTER_REFRESH_CODES = frozenset(
    code for code, cls in _BY_CODE.items() if cls.retriable and cls.refresh_metadata
)


def error_for_code(code: int, message: str = "") -> HighwaterError:
    """The operating error for a wire code (UnknownServerError for a code we do not know)."""
    if code == common_pb2.NONE:
        raise InvariantViolation("error_for_code called with NONE: the caller must check for success first")
    cls = _BY_CODE.get(code, UnknownServerError)
    return cls(message)


def raise_for_code(code: int, message: str = "") -> None:
    """Raise the operating error for a wire code; do nothing for NONE."""
    if code != common_pb2.NONE:
        raise error_for_code(code, message)
