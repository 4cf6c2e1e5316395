"""Replica and partition state machines (Kafka's ReplicaStateMachine / PartitionStateMachine).

Transitions are data: each table lists every legal move, and `transition`
refuses any other loudly (InvariantViolation) with the replica or partition
and both states, since an illegal move means the controller's bookkeeping is
wrong. The states are derived bookkeeping of the controller's context, rebuilt
from etcd on failover (`derive_*`), not stored.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping

from services.common.errors import check


class ReplicaState(enum.Enum):
    NEW = "NewReplica"
    ONLINE = "OnlineReplica"
    OFFLINE = "OfflineReplica"
    DELETION_STARTED = "ReplicaDeletionStarted"
    DELETION_SUCCESSFUL = "ReplicaDeletionSuccessful"
    DELETION_INELIGIBLE = "ReplicaDeletionIneligible"
    NON_EXISTENT = "NonExistentReplica"


class PartitionState(enum.Enum):
    NON_EXISTENT = "NonExistentPartition"
    NEW = "NewPartition"
    ONLINE = "OnlinePartition"
    OFFLINE = "OfflinePartition"


# Kafka's ReplicaState.validPreviousStates, read as "from -> allowed targets".
REPLICA_TRANSITIONS: Mapping[ReplicaState, frozenset[ReplicaState]] = {
    ReplicaState.NON_EXISTENT: frozenset({ReplicaState.NEW, ReplicaState.ONLINE, ReplicaState.OFFLINE}),
    ReplicaState.NEW: frozenset({ReplicaState.ONLINE, ReplicaState.OFFLINE, ReplicaState.NEW}),
    ReplicaState.ONLINE: frozenset({ReplicaState.ONLINE, ReplicaState.OFFLINE}),
    ReplicaState.OFFLINE: frozenset({ReplicaState.ONLINE, ReplicaState.OFFLINE, ReplicaState.DELETION_STARTED}),
    ReplicaState.DELETION_STARTED: frozenset({ReplicaState.DELETION_SUCCESSFUL,
                                              ReplicaState.DELETION_INELIGIBLE}),
    ReplicaState.DELETION_SUCCESSFUL: frozenset({ReplicaState.NON_EXISTENT}),
    ReplicaState.DELETION_INELIGIBLE: frozenset({ReplicaState.OFFLINE, ReplicaState.DELETION_STARTED,
                                                 ReplicaState.ONLINE}),
}

PARTITION_TRANSITIONS: Mapping[PartitionState, frozenset[PartitionState]] = {
    PartitionState.NON_EXISTENT: frozenset({PartitionState.NEW}),
    PartitionState.NEW: frozenset({PartitionState.ONLINE, PartitionState.OFFLINE, PartitionState.NON_EXISTENT}),
    PartitionState.ONLINE: frozenset({PartitionState.ONLINE, PartitionState.OFFLINE,
                                      PartitionState.NON_EXISTENT}),
    PartitionState.OFFLINE: frozenset({PartitionState.ONLINE, PartitionState.OFFLINE,
                                       PartitionState.NON_EXISTENT}),
}


def replica_transition(current: ReplicaState, target: ReplicaState, what: object) -> ReplicaState:
    check(target in REPLICA_TRANSITIONS[current], "illegal replica transition %s -> %s for %s",
          current.value, target.value, what)
    return target


def partition_transition(current: PartitionState, target: PartitionState, what: object) -> PartitionState:
    check(target in PARTITION_TRANSITIONS[current], "illegal partition transition %s -> %s for %s",
          current.value, target.value, what)
    return target


def derive_partition_state(leader: int | None, live: bool) -> PartitionState:
    """A partition with a state key is Online when its leader is live, else Offline."""
    if leader is None:
        return PartitionState.NEW
    return PartitionState.ONLINE if live else PartitionState.OFFLINE


def derive_replica_state(broker_live: bool, being_deleted: bool) -> ReplicaState:
    if being_deleted:
        return ReplicaState.DELETION_STARTED if broker_live else ReplicaState.DELETION_INELIGIBLE
    return ReplicaState.ONLINE if broker_live else ReplicaState.OFFLINE
