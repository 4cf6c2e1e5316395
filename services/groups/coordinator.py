"""One consumer group's coordinator state and its KIP-848 transitions: pure, no I/O.

The caller (a servicer, one asyncio task per group: STYLE.md practice 3) reads the group's
record from etcd, calls one operation here, writes `new_state.to_record()` back only when
the answer says `changed`, then replies. Time never enters: session expiry is decided by
the caller's lease and arrives here as `expire`; fresh member ids are passed in.

Epochs (KIP-848). The *group epoch* grows on every change that can alter the assignment:
membership, a member's subscription, the partition count of a subscribed topic. When it
passes the *target epoch*, the assignor computes a new *target assignment* (sticky, from
the previous target) and the target epoch catches up. Each member then reconciles toward
its target on its own heartbeats, and its *member epoch* reaches the target epoch only
once it has nothing left to give up:

1. Partitions it has that are not in its target move to `pending_revocation`; it is told
   to stop owning them and keeps its epoch (UNREVOKED_PARTITIONS). They still count as
   its own until a heartbeat's `owned` no longer lists them.
2. With nothing pending, it takes the target epoch and is given its target minus what
   other members still own (assigned or pending); the rest follow on later heartbeats as
   the others release them (UNRELEASED_PARTITIONS), then it is STABLE.

So a partition is never owned by two members, even while clients revoke late.

Invariants, checked after every operation (`check_invariants`): no partition is in
(assigned | pending_revocation) of two members; a member's pending partitions are not in
its target; a member that has reached the target epoch and has nothing pending owns only
target partitions (older assignments came from older targets, made of partitions that then
existed); member epoch <= target epoch <= group epoch; the target covers exactly the
members, disjointly.
"""

from __future__ import annotations

import enum
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from clients.common.errors import check
from clients.common.types import TopicPartitionKey
from services.groups.assignors import ASSIGNORS, DEFAULT_ASSIGNOR
from services.groups.errors import GroupError as GroupError  # also importable from its old home here

TopicPartitions = frozenset[TopicPartitionKey]

# Bounds (STYLE.md practice 6).
# A group's state is one etcd value rewritten on every change and every member's
# heartbeat is handled by the group's one task: a thousand members keeps the record far
# under etcd's 1.5 MiB value limit and the per-heartbeat work (an assignor run) well
# under a millisecond per member.
GROUP_MEMBERS_MAX = 1_000
# How often a member heartbeats. Reconciliation advances one step per heartbeat, so this
# bounds how long a partition waits between its revocation and its new owner's start.
HEARTBEAT_INTERVAL_MS_DEFAULT = 500
# How long a member may stay silent before its lease expires and `expire` removes it:
# twenty heartbeat intervals, so a few lost heartbeats or a GC pause do not cost a
# rebalance, yet a crashed member's partitions move within seconds.
SESSION_TIMEOUT_MS_DEFAULT = 10_000
# How long a member may take to revoke; the caller fences it after this (not enforced here).
REBALANCE_TIMEOUT_MS_DEFAULT = 60_000

# Special member epochs of a heartbeat request (KIP-848).
EPOCH_JOIN = 0
EPOCH_LEAVE = -1
EPOCH_LEAVE_STATIC = -2  # a static member going away for a while, keeping its assignment

RECORD_FORMAT_VERSION = 1


class MemberState(enum.Enum):
    """Where a member is in reconciling toward its target (KIP-848's member states)."""

    STABLE = "stable"
    UNREVOKED_PARTITIONS = "unrevoked_partitions"
    UNRELEASED_PARTITIONS = "unreleased_partitions"


# A member's state is what its last reconciliation step left outstanding, as data:
# (something to revoke, target partitions still owned by others) -> state. Every move
# between the three states is legal (a new target may arrive in any of them), so the table
# says what each state *means* rather than which moves are allowed; `reconcile` sets states
# only through it and `check_invariants` holds every member to it.
STATE_BY_OUTSTANDING: dict[tuple[bool, bool], MemberState] = {
    (True, False): MemberState.UNREVOKED_PARTITIONS,
    (True, True): MemberState.UNREVOKED_PARTITIONS,
    (False, True): MemberState.UNRELEASED_PARTITIONS,
    (False, False): MemberState.STABLE,
}


@dataclass(frozen=True)
class Member:
    member_id: str
    instance_id: str | None
    client_id: str
    client_host: str
    subscribed_topics: frozenset[str]
    rebalance_timeout_ms: int
    member_epoch: int
    # What the coordinator has told the member it may own now.
    assigned: TopicPartitions
    # Told to give these up, not yet confirmed by an `owned` report: still its own.
    pending_revocation: TopicPartitions
    state: MemberState
    # The server assignor the member asked for, if any; the group uses the most asked-for.
    assignor: str | None = None
    # A static member that left with epoch -2: keeps its assignment until rejoin or expiry.
    away: bool = False

    @property
    def owns(self) -> TopicPartitions:
        return self.assigned | self.pending_revocation


@dataclass(frozen=True)
class GroupState:
    group_id: str
    group_epoch: int = 0
    assignor: str = DEFAULT_ASSIGNOR
    target_epoch: int = 0
    target: dict[str, TopicPartitions] = field(default_factory=dict)
    members: dict[str, Member] = field(default_factory=dict)
    # Partition counts of the subscribed topics that the current target was computed from.
    partition_counts: dict[str, int] = field(default_factory=dict)
    static_members: dict[str, str] = field(default_factory=dict)  # instance id -> member id

    def to_record(self) -> dict[str, Any]:
        """A plain JSON-able dict, sorted, so equal states give byte-equal JSON."""
        return {
            "version": RECORD_FORMAT_VERSION,
            "group_id": self.group_id,
            "group_epoch": self.group_epoch,
            "assignor": self.assignor,
            "target_epoch": self.target_epoch,
            "target": {m: _tps_to_record(self.target[m]) for m in sorted(self.target)},
            "members": [_member_to_record(self.members[m]) for m in sorted(self.members)],
            "partition_counts": {t: self.partition_counts[t] for t in sorted(self.partition_counts)},
            "static_members": {i: self.static_members[i] for i in sorted(self.static_members)},
        }

    @staticmethod
    def from_record(record: Mapping[str, Any]) -> GroupState:
        """Rebuild a state from `to_record`'s dict; refuses another format version."""
        check(
            record.get("version") == RECORD_FORMAT_VERSION,
            "group record version %r, this coordinator reads %d",
            record.get("version"),
            RECORD_FORMAT_VERSION,
        )
        members = [_member_from_record(m) for m in record["members"]]
        state = GroupState(
            group_id=str(record["group_id"]),
            group_epoch=int(record["group_epoch"]),
            assignor=str(record["assignor"]),
            target_epoch=int(record["target_epoch"]),
            target={str(m): _tps_from_record(tps) for m, tps in record["target"].items()},
            members={m.member_id: m for m in members},
            partition_counts={str(t): int(n) for t, n in record["partition_counts"].items()},
            static_members={str(i): str(m) for i, m in record["static_members"].items()},
        )
        check_invariants(state)
        return state


@dataclass(frozen=True)
class HeartbeatRequest:
    member_id: str  # "" to join
    member_epoch: int  # EPOCH_JOIN, EPOCH_LEAVE, EPOCH_LEAVE_STATIC, or the member's epoch
    instance_id: str | None = None
    client_id: str = ""
    client_host: str = ""
    subscribed_topics: frozenset[str] | None = None  # None: unchanged
    owned: TopicPartitions | None = None  # what the client owns now; None: unchanged
    rebalance_timeout_ms: int = REBALANCE_TIMEOUT_MS_DEFAULT
    assignor: str | None = None


@dataclass(frozen=True)
class HeartbeatAnswer:
    error: GroupError | None
    member_id: str
    member_epoch: int
    assignment: TopicPartitions  # what the member may own now
    changed: bool  # whether the state must be written
    heartbeat_interval_ms: int = HEARTBEAT_INTERVAL_MS_DEFAULT


@dataclass(frozen=True)
class MemberDescription:
    member_id: str
    instance_id: str | None
    client_id: str
    client_host: str
    member_epoch: int
    subscribed_topics: frozenset[str]
    assignment: TopicPartitions
    pending_revocation: TopicPartitions
    target: TopicPartitions
    state: MemberState
    away: bool


@dataclass(frozen=True)
class GroupDescription:
    group_id: str
    group_epoch: int
    target_epoch: int
    assignor: str
    members: tuple[MemberDescription, ...]


# ---------------------------------------------------------------- operations


def heartbeat(
    state: GroupState,
    request: HeartbeatRequest,
    topic_partitions: Mapping[str, int],
    new_member_id: str,
) -> tuple[GroupState, HeartbeatAnswer]:
    """Handle one ConsumerGroupHeartbeat; `topic_partitions` is the cluster's current counts.

    Routed by the request's epoch through `_HEARTBEAT_BY_EPOCH` (join, leave, static
    leave; any other epoch is a member's regular heartbeat). Operating errors come back in
    the answer with the state unchanged; a broken invariant raises InvariantViolation.
    """
    if request.assignor is not None and request.assignor not in ASSIGNORS:
        return state, _refused(request, GroupError.UNSUPPORTED_ASSIGNOR)
    handler = _HEARTBEAT_BY_EPOCH.get(request.member_epoch, _regular_heartbeat)
    new_state, answer = handler(state, request, topic_partitions, new_member_id)
    check_invariants(new_state)
    return new_state, replace(answer, changed=new_state != state)


def expire(state: GroupState, member_id: str) -> tuple[GroupState, bool]:
    """The member's session ended (the caller's lease expired): remove it and free its partitions."""
    if member_id not in state.members:
        return state, False
    new_state = _settle_target(_without_member(state, member_id), state.partition_counts)
    check_invariants(new_state)
    return new_state, True


def check_commit(
    state: GroupState, member_id: str, member_epoch: int, partitions: TopicPartitions
) -> GroupError | None:
    """Whether an offset commit may be applied; None when it may.

    Only a present member that owns every committed partition may commit. A member whose
    session expired was removed (UNKNOWN_MEMBER_ID): that is how a paused zombie is kept
    from overwriting its successor's progress. An epoch the member was never given is
    FENCED_MEMBER_EPOCH. An older epoch of a present member is accepted for partitions it
    still owns (its heartbeat raised the epoch while the commit was on its way: the same
    process, the same partitions), and is STALE_MEMBER_EPOCH for partitions it no longer
    owns (the member retries with the epoch of its next heartbeat, or drops them). A
    partition it does not own at its current epoch may be another member's now
    (FENCED_MEMBER_EPOCH: it must rejoin). A commit with the empty member id and epoch -1
    comes from outside the group (a standalone consumer, an admin reset) and is allowed only
    while the group has no members, so it cannot overwrite their progress.
    """
    if member_id == "" and member_epoch == EPOCH_LEAVE:
        return None if not state.members else GroupError.UNKNOWN_MEMBER_ID
    member = state.members.get(member_id)
    if member is None or member.away:
        return GroupError.UNKNOWN_MEMBER_ID
    if member_epoch > member.member_epoch:
        return GroupError.FENCED_MEMBER_EPOCH
    if partitions <= member.owns:
        return None
    return (
        GroupError.STALE_MEMBER_EPOCH
        if member_epoch < member.member_epoch
        else GroupError.FENCED_MEMBER_EPOCH
    )


def deletable(state: GroupState) -> bool:
    """Whether DeleteGroups may delete the group (its state and committed offsets): only one
    without members, away static members included (they keep their assignment to come back
    to it). Kafka refuses the others NON_EMPTY_GROUP."""
    return not state.members


def subscribed_topics(state: GroupState) -> frozenset[str]:
    """Every topic some member subscribes to: OffsetDelete refuses the offsets of these topics'
    partitions while the group has members (GROUP_SUBSCRIBED_TO_TOPIC), since a member would
    commit them again or lose its place; offsets of other topics may go."""
    return frozenset(t for m in state.members.values() for t in m.subscribed_topics)


def describe(state: GroupState) -> GroupDescription:
    """What an admin sees of the group, members sorted by id."""
    return GroupDescription(
        group_id=state.group_id,
        group_epoch=state.group_epoch,
        target_epoch=state.target_epoch,
        assignor=state.assignor,
        members=tuple(
            MemberDescription(
                member_id=m.member_id,
                instance_id=m.instance_id,
                client_id=m.client_id,
                client_host=m.client_host,
                member_epoch=m.member_epoch,
                subscribed_topics=m.subscribed_topics,
                assignment=m.assigned,
                pending_revocation=m.pending_revocation,
                target=state.target.get(m.member_id, frozenset()),
                state=m.state,
                away=m.away,
            )
            for m in (state.members[member_id] for member_id in sorted(state.members))
        ),
    )


def state_name(state: GroupState) -> str:
    """Kafka's consumer group states, as kafka-consumer-groups prints them."""
    if not state.members:
        return "Empty"
    if state.target_epoch < state.group_epoch:
        return "Assigning"
    settled = all(
        m.member_epoch == state.target_epoch and m.state is MemberState.STABLE for m in state.members.values()
    )
    return "Stable" if settled else "Reconciling"


def check_invariants(state: GroupState) -> None:
    """Raise InvariantViolation, naming the values, when the group breaks a rule of the module docstring."""
    check(
        0 <= state.target_epoch <= state.group_epoch,
        "group %s: target epoch %d, group epoch %d",
        state.group_id,
        state.target_epoch,
        state.group_epoch,
    )
    check(
        len(state.members) <= GROUP_MEMBERS_MAX,
        "group %s has %d members",
        state.group_id,
        len(state.members),
    )
    check(
        set(state.target) == set(state.members),
        "group %s: target for %s, members %s",
        state.group_id,
        sorted(state.target),
        sorted(state.members),
    )
    in_target: dict[TopicPartitionKey, str] = {}
    for member_id, tps in state.target.items():
        for tp in tps:
            check(tp not in in_target, "%s in the target of %s and %s", tp, in_target.get(tp), member_id)
            in_target[tp] = member_id
            check(
                0 <= tp[1] < state.partition_counts.get(tp[0], 0),
                "target of %s has %s, counts %s",
                member_id,
                tp,
                state.partition_counts,
            )
    owner: dict[TopicPartitionKey, str] = {}
    for member_id, m in state.members.items():
        check(m.member_id == member_id, "member %s stored under %s", m.member_id, member_id)
        check(
            0 <= m.member_epoch <= state.target_epoch,
            "member %s epoch %d, target epoch %d",
            member_id,
            m.member_epoch,
            state.target_epoch,
        )
        check(
            not m.assigned & m.pending_revocation,
            "member %s both assigned and revoking %s",
            member_id,
            sorted(m.assigned & m.pending_revocation),
        )
        for tp in m.owns:
            check(tp not in owner, "%s owned by both %s and %s", tp, owner.get(tp), member_id)
            owner[tp] = member_id
        target = state.target[member_id]
        check(
            not m.pending_revocation & target,
            "member %s revoking %s of its own target",
            member_id,
            sorted(m.pending_revocation & target),
        )
        # The state is the outcome of the member's last reconciliation step: UNREVOKED exactly
        # while something is pending; at the target epoch, UNRELEASED exactly while short of
        # the target. Below it, the member has not yet heard of the current target.
        revoking = m.state is MemberState.UNREVOKED_PARTITIONS
        check(
            revoking == bool(m.pending_revocation),
            "member %s in %s, pending %s",
            member_id,
            m.state,
            sorted(m.pending_revocation),
        )
        if m.member_epoch == state.target_epoch and not m.pending_revocation:
            check(
                m.assigned <= target, "member %s at the target epoch owns %s", member_id, m.assigned - target
            )
            expected = STATE_BY_OUTSTANDING[(False, m.assigned != target)]
            check(m.state is expected, "member %s in %s, should be %s", member_id, m.state, expected)
        if m.instance_id is not None:
            check(
                state.static_members.get(m.instance_id) == member_id,
                "static member %s (instance %s) not in the instance map %s",
                member_id,
                m.instance_id,
                state.static_members,
            )
        check(not m.away or m.instance_id is not None, "member %s away without an instance id", member_id)
    for instance_id, member_id in state.static_members.items():
        holder = state.members.get(member_id)
        check(
            holder is not None and holder.instance_id == instance_id,
            "instance %s maps to %s, which is not that instance",
            instance_id,
            member_id,
        )


# ---------------------------------------------------------------- heartbeat handlers

_Handler = Callable[
    [GroupState, HeartbeatRequest, Mapping[str, int], str], tuple[GroupState, HeartbeatAnswer]
]


def _join(
    state: GroupState, request: HeartbeatRequest, topic_partitions: Mapping[str, int], new_member_id: str
) -> tuple[GroupState, HeartbeatAnswer]:
    """Epoch 0: a new member, a static member coming back, or a fenced member starting over."""
    previous_id = state.static_members.get(request.instance_id) if request.instance_id is not None else None
    if previous_id is not None:
        previous = state.members[previous_id]
        if not previous.away and previous_id != request.member_id:
            return state, _refused(request, GroupError.UNRELEASED_INSTANCE_ID)
        # A static member's restart: a new member id takes over the old one's assignment and
        # epoch, so a bounce within the session timeout moves no partition.
        member_id = previous_id if request.member_id == previous_id else new_member_id
        state = _renamed(state, previous_id, member_id)
        member = replace(state.members[member_id], away=False)
    elif request.member_id in state.members:
        # Told FENCED_MEMBER_EPOCH (or it lost its state), the client has dropped its
        # partitions and starts over under the same id: nothing is owned any more.
        member = replace(
            state.members[request.member_id],
            member_epoch=0,
            assigned=frozenset(),
            pending_revocation=frozenset(),
            state=STATE_BY_OUTSTANDING[(False, False)],
        )
    else:
        if len(state.members) >= GROUP_MEMBERS_MAX:
            return state, _refused(request, GroupError.GROUP_MAX_SIZE_REACHED)
        member_id = request.member_id or new_member_id
        check(member_id != "", "no member id for a joining member of %s", state.group_id)
        member = Member(
            member_id=member_id,
            instance_id=request.instance_id,
            client_id=request.client_id,
            client_host=request.client_host,
            subscribed_topics=request.subscribed_topics or frozenset(),
            rebalance_timeout_ms=request.rebalance_timeout_ms,
            member_epoch=0,
            assigned=frozenset(),
            pending_revocation=frozenset(),
            state=STATE_BY_OUTSTANDING[(False, False)],
            assignor=request.assignor,
        )
        static = dict(state.static_members)
        if request.instance_id is not None:
            static[request.instance_id] = member_id
        state = replace(
            state,
            group_epoch=state.group_epoch + 1,
            members={**state.members, member_id: member},
            target={**state.target, member_id: frozenset()},
            static_members=static,
        )
    return _after_heartbeat(state, member, request, topic_partitions)


def _leave(
    state: GroupState, request: HeartbeatRequest, topic_partitions: Mapping[str, int], new_member_id: str
) -> tuple[GroupState, HeartbeatAnswer]:
    """Epoch -1: the client revoked everything before leaving, so its partitions are free at once."""
    if request.member_id not in state.members:
        return state, _refused(request, GroupError.UNKNOWN_MEMBER_ID)
    new_state = _settle_target(_without_member(state, request.member_id), state.partition_counts)
    return new_state, HeartbeatAnswer(None, request.member_id, EPOCH_LEAVE, frozenset(), changed=True)


def _leave_static(
    state: GroupState, request: HeartbeatRequest, topic_partitions: Mapping[str, int], new_member_id: str
) -> tuple[GroupState, HeartbeatAnswer]:
    """Epoch -2: a static member goes away briefly; it keeps its assignment and the group does not rebalance.

    Without an instance id there is nothing to come back as, so it is a plain leave.
    """
    member = state.members.get(request.member_id)
    if member is None:
        return state, _refused(request, GroupError.UNKNOWN_MEMBER_ID)
    if member.instance_id is None:
        return _leave(state, request, topic_partitions, new_member_id)
    new_state = replace(state, members={**state.members, member.member_id: replace(member, away=True)})
    return new_state, HeartbeatAnswer(None, member.member_id, EPOCH_LEAVE_STATIC, frozenset(), changed=True)


def _regular_heartbeat(
    state: GroupState, request: HeartbeatRequest, topic_partitions: Mapping[str, int], new_member_id: str
) -> tuple[GroupState, HeartbeatAnswer]:
    member = state.members.get(request.member_id)
    if member is None or member.away:
        return state, _refused(request, GroupError.UNKNOWN_MEMBER_ID)
    if request.member_epoch != member.member_epoch:
        return state, _refused(request, GroupError.FENCED_MEMBER_EPOCH)
    return _after_heartbeat(state, member, request, topic_partitions)


_HEARTBEAT_BY_EPOCH: dict[int, _Handler] = {
    EPOCH_JOIN: _join,
    EPOCH_LEAVE: _leave,
    EPOCH_LEAVE_STATIC: _leave_static,
}


# ---------------------------------------------------------------- shared steps


def _after_heartbeat(
    state: GroupState, member: Member, request: HeartbeatRequest, topic_partitions: Mapping[str, int]
) -> tuple[GroupState, HeartbeatAnswer]:
    """Apply the request's member fields, bring the target up to date, reconcile this member."""
    subscribed = member.subscribed_topics if request.subscribed_topics is None else request.subscribed_topics
    updated = replace(
        member,
        client_id=request.client_id or member.client_id,
        client_host=request.client_host or member.client_host,
        subscribed_topics=subscribed,
        rebalance_timeout_ms=request.rebalance_timeout_ms,
        assignor=request.assignor if request.assignor is not None else member.assignor,
    )
    # A new subscription or a new preferred assignor can change the assignment.
    bump = (updated.subscribed_topics, updated.assignor) != (member.subscribed_topics, member.assignor)
    state = replace(
        state,
        group_epoch=state.group_epoch + (1 if bump else 0),
        members={**state.members, member.member_id: updated},
    )
    counts = _subscribed_counts(state, topic_partitions)
    if counts != state.partition_counts:
        state = replace(state, group_epoch=state.group_epoch + 1)
    state = _settle_target(state, counts)
    reconciled = reconcile(
        state.members[member.member_id],
        state.target[member.member_id],
        state.target_epoch,
        request.owned,
        _owned_by_others(state, member.member_id),
    )
    state = replace(state, members={**state.members, member.member_id: reconciled})
    answer = HeartbeatAnswer(None, reconciled.member_id, reconciled.member_epoch, reconciled.assigned, False)
    return state, answer


def reconcile(
    member: Member,
    target: TopicPartitions,
    target_epoch: int,
    owned: TopicPartitions | None,
    owned_by_others: TopicPartitions,
) -> Member:
    """One reconciliation step of a member toward its target (KIP-848's CurrentAssignmentBuilder).

    `owned` is what the client reports owning (None: no news); a pending partition it no
    longer reports is released. While anything is pending the member waits at its epoch;
    a target that drops partitions it has sends them to pending first; only then does it
    take the target epoch and the target partitions nobody else owns.
    """
    pending = member.pending_revocation if owned is None else member.pending_revocation & owned
    if pending:
        return replace(member, pending_revocation=pending, state=STATE_BY_OUTSTANDING[(True, False)])
    to_revoke = member.assigned - target
    if to_revoke:
        return replace(
            member,
            assigned=member.assigned & target,
            pending_revocation=to_revoke,
            state=STATE_BY_OUTSTANDING[(True, False)],
        )
    assigned = member.assigned | (target - owned_by_others)
    return replace(
        member,
        member_epoch=target_epoch,
        assigned=assigned,
        pending_revocation=frozenset(),
        state=STATE_BY_OUTSTANDING[(False, assigned != target)],
    )


def _settle_target(state: GroupState, counts: Mapping[str, int]) -> GroupState:
    """Recompute the target when the group epoch has passed the target epoch.

    The previous target seeds the assignor (stickiness). A member's pending partitions
    that the new target gives back to it are simply its own again: it was never told they
    moved elsewhere, and nobody else could have taken them.
    """
    if state.group_epoch == state.target_epoch:
        return state
    assignor = _preferred_assignor(state.members)
    subscriptions = {m.member_id: m.subscribed_topics for m in state.members.values()}
    sort_keys = {m.member_id: m.instance_id for m in state.members.values() if m.instance_id is not None}
    counts = {topic: n for topic, n in counts.items() if any(topic in s for s in subscriptions.values())}
    target = ASSIGNORS[assignor](subscriptions, counts, state.target, sort_keys)
    members = {}
    for member_id, m in state.members.items():
        back = m.pending_revocation & target[member_id]
        if back:
            pending = m.pending_revocation - back
            m = replace(
                m,
                assigned=m.assigned | back,
                pending_revocation=pending,
                # Nothing left to revoke: nothing outstanding until its next heartbeat.
                state=STATE_BY_OUTSTANDING[(bool(pending), False)],
            )
        members[member_id] = m
    return replace(
        state,
        assignor=assignor,
        target_epoch=state.group_epoch,
        target=target,
        members=members,
        partition_counts=dict(counts),
    )


def _preferred_assignor(members: Mapping[str, Member]) -> str:
    """The assignor most members ask for (ties by name), else the default: as Kafka chooses."""
    votes = Counter(m.assignor for m in members.values() if m.assignor is not None)
    if not votes:
        return DEFAULT_ASSIGNOR
    return min(votes, key=lambda name: (-votes[name], name))


def _subscribed_counts(state: GroupState, topic_partitions: Mapping[str, int]) -> dict[str, int]:
    topics = sorted({t for m in state.members.values() for t in m.subscribed_topics})
    return {t: topic_partitions[t] for t in topics if topic_partitions.get(t, 0) > 0}


def _owned_by_others(state: GroupState, member_id: str) -> TopicPartitions:
    return frozenset(tp for m in state.members.values() if m.member_id != member_id for tp in m.owns)


def _without_member(state: GroupState, member_id: str) -> GroupState:
    """The group without the member: its partitions free at once, the group epoch bumped."""
    member = state.members[member_id]
    static = {i: m for i, m in state.static_members.items() if m != member_id}
    return replace(
        state,
        group_epoch=state.group_epoch + 1,
        members={m: v for m, v in state.members.items() if m != member_id},
        target={m: v for m, v in state.target.items() if m != member_id},
        static_members=static if member.instance_id is not None else state.static_members,
    )


def _renamed(state: GroupState, old_id: str, new_id: str) -> GroupState:
    """The same member under a new id (a static member's restart): assignment, epoch and target kept."""
    if old_id == new_id:
        return state
    check(new_id not in state.members, "member id %s already in group %s", new_id, state.group_id)
    member = replace(state.members[old_id], member_id=new_id)

    def rekey(mapping: Mapping[str, Any]) -> dict[str, Any]:
        return {(new_id if k == old_id else k): v for k, v in mapping.items()}

    members = rekey(state.members)
    members[new_id] = member
    static = {i: (new_id if m == old_id else m) for i, m in state.static_members.items()}
    return replace(state, members=members, target=rekey(state.target), static_members=static)


def _refused(request: HeartbeatRequest, error: GroupError) -> HeartbeatAnswer:
    return HeartbeatAnswer(error, request.member_id, request.member_epoch, frozenset(), changed=False)


# ---------------------------------------------------------------- record helpers


def _tps_to_record(tps: TopicPartitions) -> list[list[str | int]]:
    return [[topic, partition] for topic, partition in sorted(tps)]


def _tps_from_record(rows: list[list[Any]]) -> TopicPartitions:
    return frozenset((str(topic), int(partition)) for topic, partition in rows)


def _member_to_record(m: Member) -> dict[str, Any]:
    return {
        "member_id": m.member_id,
        "instance_id": m.instance_id,
        "client_id": m.client_id,
        "client_host": m.client_host,
        "subscribed_topics": sorted(m.subscribed_topics),
        "rebalance_timeout_ms": m.rebalance_timeout_ms,
        "member_epoch": m.member_epoch,
        "assigned": _tps_to_record(m.assigned),
        "pending_revocation": _tps_to_record(m.pending_revocation),
        "state": m.state.value,
        "assignor": m.assignor,
        "away": m.away,
    }


def _member_from_record(r: Mapping[str, Any]) -> Member:
    return Member(
        member_id=str(r["member_id"]),
        instance_id=None if r["instance_id"] is None else str(r["instance_id"]),
        client_id=str(r["client_id"]),
        client_host=str(r["client_host"]),
        subscribed_topics=frozenset(str(t) for t in r["subscribed_topics"]),
        rebalance_timeout_ms=int(r["rebalance_timeout_ms"]),
        member_epoch=int(r["member_epoch"]),
        assigned=_tps_from_record(r["assigned"]),
        pending_revocation=_tps_from_record(r["pending_revocation"]),
        state=MemberState(r["state"]),
        assignor=None if r["assignor"] is None else str(r["assignor"]),
        away=bool(r["away"]),
    )
