"""The replica state machine (Kafka's ReplicaStateMachine), as the controller tracks topic deletion.

Transitions are data: the table lists every legal move, and
`replica_transition` refuses any other loudly (InvariantViolation) with the
replica and both states, since an illegal move the controller decides means its
bookkeeping is wrong. (A move a broker's answer asks for is checked against the
same table and ignored when illegal: deletion.ReplicaMoves.) The states live in
memory only; a new controller starts every replica of a topic being deleted
from OfflineReplica and sends the deletion again.

Kafka's partition state machine has no table here: a partition's state is its
leader (live, dead or -1) as the state key says, and every change of it is a
fenced write of that key (handlers._change_state).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping

from clients.common.errors import check


class ReplicaState(enum.Enum):
    NEW = "NewReplica"
    ONLINE = "OnlineReplica"
    OFFLINE = "OfflineReplica"
    DELETION_STARTED = "ReplicaDeletionStarted"
    DELETION_SUCCESSFUL = "ReplicaDeletionSuccessful"
    DELETION_INELIGIBLE = "ReplicaDeletionIneligible"
    NON_EXISTENT = "NonExistentReplica"


# Kafka's ReplicaState.validPreviousStates, read as "from -> allowed targets".
REPLICA_TRANSITIONS: Mapping[ReplicaState, frozenset[ReplicaState]] = {
    ReplicaState.NON_EXISTENT: frozenset({ReplicaState.NEW, ReplicaState.ONLINE, ReplicaState.OFFLINE}),
    ReplicaState.NEW: frozenset({ReplicaState.ONLINE, ReplicaState.OFFLINE, ReplicaState.NEW}),
    ReplicaState.ONLINE: frozenset({ReplicaState.ONLINE, ReplicaState.OFFLINE}),
    ReplicaState.OFFLINE: frozenset(
        {
            ReplicaState.ONLINE,
            ReplicaState.OFFLINE,
            ReplicaState.DELETION_STARTED,
            ReplicaState.DELETION_INELIGIBLE,
        }
    ),
    ReplicaState.DELETION_STARTED: frozenset(
        {ReplicaState.DELETION_SUCCESSFUL, ReplicaState.DELETION_INELIGIBLE}
    ),
    ReplicaState.DELETION_SUCCESSFUL: frozenset({ReplicaState.NON_EXISTENT}),
    ReplicaState.DELETION_INELIGIBLE: frozenset(
        {ReplicaState.OFFLINE, ReplicaState.DELETION_STARTED, ReplicaState.ONLINE}
    ),
}


def replica_transition(current: ReplicaState, target: ReplicaState, what: object) -> ReplicaState:
    check(
        target in REPLICA_TRANSITIONS[current],
        "illegal replica transition %s -> %s for %s",
        current.value,
        target.value,
        what,
    )
    return target
