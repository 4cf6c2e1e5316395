"""Kafka's classic consumer-group protocol (JoinGroup, SyncGroup, Heartbeat, LeaveGroup), pure.

The groups one broker coordinates, as Kafka's GroupCoordinator keeps them: members join, the
coordinator picks a protocol every member supports and a leader, the leader computes the
assignment on the client and hands it over in SyncGroup, members heartbeat within their
session. Requests that must wait (a JoinGroup until every member rejoined or the rebalance
timeout passed, a follower's SyncGroup until the leader's) get a ticket; every call returns
the answers it completes as (ticket, answer) pairs, which the driver (group_driver.py) hands to the
waiting requests. Time is an argument; `expire(now_ms)` is called by the driver's timer.

Membership lives in this broker's memory only, as in Kafka (where it is rebuilt from the
offsets topic; here, by members rejoining): a group's coordinator is the broker
`coordinator_of` names among the live ones, and a coordinator that moves or restarts answers
members UNKNOWN_MEMBER_ID or NOT_COORDINATOR, so they join again. Committed offsets are in
etcd and survive. Static membership (group.instance.id) is kept as an attribute only.
"""

from __future__ import annotations

import enum
import itertools
import struct
import zlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from clients.common.errors import check
from services.groups.errors import GroupError

# Kafka's group.min/max.session.timeout.ms defaults (6 s, 30 min).
SESSION_TIMEOUT_MS_MIN = 6_000
SESSION_TIMEOUT_MS_MAX = 1_800_000
# Kafka's group.initial.rebalance.delay.ms is 3 s: an empty group waits that long for more
# members before its first generation. Shorter here: a second member's join restarts the wait.
INITIAL_REBALANCE_DELAY_MS = 1_000
# Members of one group, pending (told MEMBER_ID_REQUIRED) ones included (Kafka's
# group.max.size is unbounded by default; a bound keeps one group from filling memory).
GROUP_MEMBERS_MAX = 1_000
# Groups one broker coordinates at once.
GROUPS_MAX = 10_000


class State(enum.Enum):
    EMPTY = "Empty"
    PREPARING_REBALANCE = "PreparingRebalance"
    COMPLETING_REBALANCE = "CompletingRebalance"
    STABLE = "Stable"
    # Forgotten: an empty group is dropped from the broker's memory (DeleteGroups, or nobody
    # left and nobody pending). Nothing moves a dead group again.
    DEAD = "Dead"


# Where each state may go: Kafka's GroupMetadata.validPreviousStates turned around. One
# difference: Kafka lets any state go Dead (a coordinator that loses the group's offsets
# partition unloads all its groups); here membership is only ever forgotten when the group is
# Empty, so a group with members is never dropped with them.
LEGAL_TRANSITIONS: dict[State, frozenset[State]] = {
    # A first member joins; an empty group is forgotten.
    State.EMPTY: frozenset({State.PREPARING_REBALANCE, State.DEAD}),
    # The join completes: with members, they wait for the leader's assignment; with none
    # (every one left or missed the rebalance timeout), the group is Empty.
    State.PREPARING_REBALANCE: frozenset({State.COMPLETING_REBALANCE, State.EMPTY}),
    # The leader's SyncGroup; or a member joins, leaves, dies, or the leader never syncs.
    State.COMPLETING_REBALANCE: frozenset({State.STABLE, State.PREPARING_REBALANCE}),
    # A member joins, leaves or dies.
    State.STABLE: frozenset({State.PREPARING_REBALANCE}),
    State.DEAD: frozenset(),
}


# The classic answers' errors are the groups' one vocabulary (services/groups/errors.py);
# `Error` is its old name here, kept for importers.
Error = GroupError

# The protocol type of Kafka's consumers: their member metadata is a ConsumerProtocolSubscription.
CONSUMER_PROTOCOL_TYPE = "consumer"


def coordinator_of(group_id: str, broker_ids: Sequence[int]) -> int | None:
    """The broker that coordinates a group: a stable hash over the live brokers, so every broker
    that reads the same registrations names the same one (None: no broker)."""
    ids = sorted(broker_ids)
    return ids[zlib.crc32(group_id.encode()) % len(ids)] if ids else None


def subscribed_topics(group: Group) -> frozenset[str] | None:
    """The topics a classic group's members subscribe to, read from their metadata for the
    chosen protocol (Kafka's ConsumerProtocolSubscription: version, then the topic names).
    None when they cannot be known: a group of another protocol type, no protocol chosen yet,
    or metadata that does not parse; OffsetDelete then treats every topic as subscribed, as
    Kafka's GroupMetadata.isSubscribedToTopic does."""
    if group.protocol_type != CONSUMER_PROTOCOL_TYPE or not group.protocol_name:
        return None
    topics: set[str] = set()
    for member in group.members.values():
        parsed = _subscription_topics(member.metadata(group.protocol_name))
        if parsed is None:
            return None
        topics |= parsed
    return frozenset(topics)


def _subscription_topics(metadata: bytes) -> set[str] | None:
    """The topic names of a ConsumerProtocolSubscription (every version starts with int16
    version, int32 count, then int16-length strings), or None if it does not parse."""
    try:
        (count,) = struct.unpack_from(">i", metadata, 2)
        at, topics = 6, set()
        for _ in range(count):
            (size,) = struct.unpack_from(">h", metadata, at)
            if size < 0 or at + 2 + size > len(metadata):
                return None
            topics.add(metadata[at + 2 : at + 2 + size].decode())
            at += 2 + size
    except (struct.error, UnicodeDecodeError):
        return None
    return topics


def _common_protocols(members: Iterable[Member]) -> set[str]:
    """The protocol names every member supports."""
    common: set[str] | None = None
    for m in members:
        names = {n for n, _ in m.protocols}
        common = names if common is None else common & names
    return common or set()


@dataclass
class Member:
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    session_timeout_ms: int
    rebalance_timeout_ms: int
    protocols: list[tuple[str, bytes]]
    last_heard_ms: int
    assignment: bytes = b""
    join_ticket: int | None = None
    sync_ticket: int | None = None

    def metadata(self, protocol: str) -> bytes:
        """This member's metadata for a protocol (b"": it no longer lists it, having rejoined
        with others while the group's choice is not yet redone)."""
        return next((m for name, m in self.protocols if name == protocol), b"")


@dataclass(frozen=True)
class JoinAnswer:
    error: GroupError
    generation: int = -1
    protocol_type: str | None = None
    protocol_name: str | None = None
    leader: str = ""
    member_id: str = ""
    # Only the leader gets the members: (member id, group instance id, metadata).
    members: tuple[tuple[str, str | None, bytes], ...] = ()


@dataclass(frozen=True)
class SyncAnswer:
    error: GroupError
    protocol_type: str | None = None
    protocol_name: str | None = None
    assignment: bytes = b""


Completion = tuple[int, JoinAnswer | SyncAnswer]


@dataclass
class Group:
    group_id: str
    state: State = State.EMPTY
    generation: int = 0
    protocol_type: str | None = None
    protocol_name: str | None = None
    leader: str | None = None
    members: dict[str, Member] = field(default_factory=dict)
    # Member ids given out with MEMBER_ID_REQUIRED, not yet joined: id -> deadline (ms).
    pending: dict[str, int] = field(default_factory=dict)
    rebalance_deadline_ms: int = 0
    # This rebalance began from an empty group: it waits INITIAL_REBALANCE_DELAY_MS after the
    # latest joiner (up to the rebalance timeout) instead of completing when all have joined.
    forming: bool = False

    def transition(self, state: State) -> None:
        """The one way the state changes. Raises InvariantViolation for a move not in
        LEGAL_TRANSITIONS: a bug in the rules below, never a client's doing."""
        check(
            state in LEGAL_TRANSITIONS[self.state],
            "illegal group transition %s -> %s for group %s (generation %d, %d members)",
            self.state,
            state,
            self.group_id,
            self.generation,
            len(self.members),
        )
        self.state = state

    def check(self) -> None:
        check(
            (self.state == State.EMPTY) == (not self.members),
            "group %s is %s with %d members",
            self.group_id,
            self.state,
            len(self.members),
        )
        check(
            self.leader is None or self.leader in self.members,
            "group %s: leader %s is not a member",
            self.group_id,
            self.leader,
        )


class ClassicGroups:
    """Every classic group this broker coordinates. Owned by the broker's event loop."""

    def __init__(self, broker_id: int) -> None:
        self.groups: dict[str, Group] = {}
        self._ids = itertools.count(1)
        self._broker_id = broker_id

    def _new_member_id(self, client_id: str) -> str:
        return f"{client_id or 'member'}-{self._broker_id}-{next(self._ids)}"

    # ---- requests -------------------------------------------------------------------------

    def join(
        self,
        now_ms: int,
        ticket: int,
        *,
        group_id: str,
        member_id: str,
        group_instance_id: str | None,
        client_id: str,
        client_host: str,
        protocol_type: str,
        protocols: list[tuple[str, bytes]],
        session_timeout_ms: int,
        rebalance_timeout_ms: int,
        require_known_member_id: bool,
    ) -> list[Completion]:
        """A JoinGroup; its answer comes back under `ticket`, now or later."""
        if not SESSION_TIMEOUT_MS_MIN <= session_timeout_ms <= SESSION_TIMEOUT_MS_MAX:
            return [(ticket, JoinAnswer(GroupError.INVALID_SESSION_TIMEOUT, member_id=member_id))]
        group = self.groups.get(group_id)
        if group is None:
            if len(self.groups) >= GROUPS_MAX:
                return [(ticket, JoinAnswer(GroupError.COORDINATOR_NOT_AVAILABLE, member_id=member_id))]
            group = self.groups[group_id] = Group(group_id)
        names = {name for name, _ in protocols}
        others = [m for m in group.members.values() if m.member_id != member_id]
        if not protocols or (
            others and (protocol_type != group.protocol_type or not names & _common_protocols(others))
        ):
            return [(ticket, JoinAnswer(GroupError.INCONSISTENT_GROUP_PROTOCOL, member_id=member_id))]
        if member_id == "":
            if len(group.members) + len(group.pending) >= GROUP_MEMBERS_MAX:
                return [(ticket, JoinAnswer(GroupError.GROUP_MAX_SIZE_REACHED))]
            member_id = self._new_member_id(client_id)
            if require_known_member_id:
                # KIP-394: the member asks again with this id, so an id is never given to a
                # client that did not receive it.
                group.pending[member_id] = now_ms + session_timeout_ms
                return [(ticket, JoinAnswer(GroupError.MEMBER_ID_REQUIRED, member_id=member_id))]
        elif member_id not in group.members and member_id not in group.pending:
            return [(ticket, JoinAnswer(GroupError.UNKNOWN_MEMBER_ID, member_id=member_id))]
        out: list[Completion] = []
        group.pending.pop(member_id, None)
        member = group.members.get(member_id)
        if member is None:
            member = group.members[member_id] = Member(
                member_id,
                group_instance_id,
                client_id,
                client_host,
                session_timeout_ms,
                rebalance_timeout_ms,
                protocols,
                now_ms,
            )
            group.protocol_type = protocol_type
        else:
            member.protocols, member.last_heard_ms = protocols, now_ms
            member.session_timeout_ms, member.rebalance_timeout_ms = session_timeout_ms, rebalance_timeout_ms
            if member.join_ticket is not None:  # a retried join replaces the one waiting
                out.append(
                    (member.join_ticket, JoinAnswer(GroupError.UNKNOWN_MEMBER_ID, member_id=member_id))
                )
        member.join_ticket = ticket
        if group.state != State.PREPARING_REBALANCE:
            out += self._prepare_rebalance(group, now_ms)
        elif group.forming:
            group.rebalance_deadline_ms = max(
                group.rebalance_deadline_ms, now_ms + INITIAL_REBALANCE_DELAY_MS
            )
        out += self._maybe_complete_join(group, now_ms)
        group.check()
        return out

    def sync(
        self, ticket: int, *, group_id: str, member_id: str, generation: int, assignments: dict[str, bytes]
    ) -> list[Completion]:
        group = self.groups.get(group_id)
        member = group.members.get(member_id) if group is not None else None
        if group is None or member is None:
            return [(ticket, SyncAnswer(GroupError.UNKNOWN_MEMBER_ID))]
        if generation != group.generation:
            return [(ticket, SyncAnswer(GroupError.ILLEGAL_GENERATION))]
        if group.state == State.PREPARING_REBALANCE:
            return [(ticket, SyncAnswer(GroupError.REBALANCE_IN_PROGRESS))]
        if group.state == State.STABLE:
            return [(ticket, self._sync_answer(group, member))]
        member.sync_ticket = ticket
        out: list[Completion] = []
        if member_id == group.leader:
            for m in group.members.values():
                m.assignment = assignments.get(m.member_id, b"")
            group.transition(State.STABLE)
            for m in group.members.values():
                if m.sync_ticket is not None:
                    out.append((m.sync_ticket, self._sync_answer(group, m)))
                    m.sync_ticket = None
        group.check()
        return out

    def heartbeat(self, now_ms: int, *, group_id: str, member_id: str, generation: int) -> GroupError:
        group = self.groups.get(group_id)
        member = group.members.get(member_id) if group is not None else None
        if group is None or member is None:
            return GroupError.UNKNOWN_MEMBER_ID
        if generation != group.generation:
            return GroupError.ILLEGAL_GENERATION
        member.last_heard_ms = now_ms
        return (
            GroupError.REBALANCE_IN_PROGRESS if group.state == State.PREPARING_REBALANCE else GroupError.NONE
        )

    def leave(
        self, now_ms: int, *, group_id: str, member_ids: Sequence[str]
    ) -> tuple[list[GroupError], list[Completion]]:
        """Each member's answer, and the waiting requests the leaves complete."""
        group = self.groups.get(group_id)
        errors: list[GroupError] = []
        out: list[Completion] = []
        for member_id in member_ids:
            if group is None or member_id not in group.members:
                errors.append(GroupError.UNKNOWN_MEMBER_ID)
                continue
            errors.append(GroupError.NONE)
            out += self._remove(group, member_id)
        if group is not None and any(e == GroupError.NONE for e in errors):
            out += self._after_removal(group, now_ms)
        return errors, out

    def commit_check(self, group_id: str, member_id: str, generation: int) -> GroupError:
        """Whether an OffsetCommit may be applied: a member of the current generation, or a
        commit from outside (generation -1, no member id) to a group without members."""
        group = self.groups.get(group_id)
        if generation < 0 and not member_id:
            return GroupError.NONE if group is None or not group.members else GroupError.UNKNOWN_MEMBER_ID
        if group is None or member_id not in group.members:
            return GroupError.UNKNOWN_MEMBER_ID
        if generation != group.generation:
            return GroupError.ILLEGAL_GENERATION
        if group.state == State.COMPLETING_REBALANCE:
            return GroupError.REBALANCE_IN_PROGRESS
        return GroupError.NONE

    def delete(self, group_id: str) -> GroupError:
        """DeleteGroups' rule for the classic side of a group: refused while it has members
        (NON_EMPTY_GROUP, as Kafka refuses any state but Empty and Dead); an empty group is
        forgotten (NONE); GROUP_ID_NOT_FOUND when this broker holds no such group (its
        committed offsets, in etcd, may still make it exist: the caller decides)."""
        group = self.groups.get(group_id)
        if group is None:
            return GroupError.GROUP_ID_NOT_FOUND
        if group.members:
            return GroupError.NON_EMPTY_GROUP
        self._forget(group)  # pending member ids given out are void: they join anew
        return GroupError.NONE

    # ---- time -----------------------------------------------------------------------------

    def expire(self, now_ms: int) -> list[Completion]:
        """Members past their session, rebalances past their deadline, a leader that never synced."""
        out: list[Completion] = []
        for group in list(self.groups.values()):
            group.pending = {m: d for m, d in group.pending.items() if d > now_ms}
            gone = [
                m.member_id
                for m in group.members.values()
                if m.join_ticket is None and now_ms - m.last_heard_ms > m.session_timeout_ms
            ]
            for member_id in gone:
                out += self._remove(group, member_id)
            if gone:
                out += self._after_removal(group, now_ms)
            if group.state == State.PREPARING_REBALANCE and now_ms >= group.rebalance_deadline_ms:
                out += self._complete_join(group, now_ms)
            elif group.state == State.COMPLETING_REBALANCE and now_ms >= group.rebalance_deadline_ms:
                # The leader never sent the assignment: everyone joins again.
                out += self._prepare_rebalance(group, now_ms)
            if group.state == State.EMPTY and not group.pending:
                self._forget(group)
            else:
                group.check()
        return out

    # ---- transitions ----------------------------------------------------------------------

    def _prepare_rebalance(self, group: Group, now_ms: int) -> list[Completion]:
        out: list[Completion] = []
        for m in group.members.values():
            if m.sync_ticket is not None:
                out.append((m.sync_ticket, SyncAnswer(GroupError.REBALANCE_IN_PROGRESS)))
                m.sync_ticket = None
        group.forming = group.state == State.EMPTY
        group.transition(State.PREPARING_REBALANCE)
        group.rebalance_deadline_ms = now_ms + (
            INITIAL_REBALANCE_DELAY_MS
            if group.forming
            else max((m.rebalance_timeout_ms for m in group.members.values()), default=0)
        )
        return out

    def _maybe_complete_join(self, group: Group, now_ms: int) -> list[Completion]:
        """Complete at once when every member rejoined, unless the group is forming (then the
        deadline completes it, in expire)."""
        everyone = all(m.join_ticket is not None for m in group.members.values()) and not group.pending
        if everyone and not group.forming:
            return self._complete_join(group, now_ms)
        return []

    def _complete_join(self, group: Group, now_ms: int) -> list[Completion]:
        for member_id in [m.member_id for m in group.members.values() if m.join_ticket is None]:
            del group.members[member_id]  # did not rejoin within the rebalance timeout
        group.generation += 1
        if not group.members:
            group.transition(State.EMPTY)
            group.leader, group.protocol_type, group.protocol_name = None, None, None
            return []
        if group.leader not in group.members:
            group.leader = next(iter(group.members))
        group.protocol_name = self._vote(group)
        group.transition(State.COMPLETING_REBALANCE)
        group.forming = False
        group.rebalance_deadline_ms = now_ms + max(m.rebalance_timeout_ms for m in group.members.values())
        out: list[Completion] = []
        everyone = tuple(
            (m.member_id, m.group_instance_id, m.metadata(group.protocol_name))
            for m in group.members.values()
        )
        for m in group.members.values():
            ticket, m.join_ticket = m.join_ticket, None
            m.assignment = b""
            m.last_heard_ms = now_ms  # the session runs from the answer, as in Kafka
            if ticket is None:
                raise RuntimeError(f"group {group.group_id}: member {m.member_id} completed without a join")
            out.append(
                (
                    ticket,
                    JoinAnswer(
                        GroupError.NONE,
                        generation=group.generation,
                        protocol_type=group.protocol_type,
                        protocol_name=group.protocol_name,
                        leader=group.leader,
                        member_id=m.member_id,
                        members=everyone if m.member_id == group.leader else (),
                    ),
                )
            )
        return out

    @staticmethod
    def _vote(group: Group) -> str:
        """Kafka's rule: the protocol every member supports that most members list first among
        those (ties: the leader's order)."""
        common = _common_protocols(group.members.values())
        votes: dict[str, int] = {}
        for m in group.members.values():
            first = next(n for n, _ in m.protocols if n in common)
            votes[first] = votes.get(first, 0) + 1
        leader = group.members[group.leader] if group.leader else next(iter(group.members.values()))
        order = [n for n, _ in leader.protocols if n in common]
        return max(order, key=lambda n: (votes.get(n, 0), -order.index(n)))

    def _remove(self, group: Group, member_id: str) -> list[Completion]:
        member = group.members.pop(member_id)
        out: list[Completion] = []
        if member.join_ticket is not None:
            out.append((member.join_ticket, JoinAnswer(GroupError.UNKNOWN_MEMBER_ID, member_id=member_id)))
        if member.sync_ticket is not None:
            out.append((member.sync_ticket, SyncAnswer(GroupError.UNKNOWN_MEMBER_ID)))
        if group.leader == member_id:
            group.leader = None
        return out

    def _forget(self, group: Group) -> None:
        group.transition(State.DEAD)
        del self.groups[group.group_id]

    def _after_removal(self, group: Group, now_ms: int) -> list[Completion]:
        if not group.members:
            # As in Kafka, the last member's going starts a rebalance that nobody joins, which
            # completes the group Empty (a new generation, no leader, no protocol).
            out = self._prepare_rebalance(group, now_ms) if group.state != State.PREPARING_REBALANCE else []
            return out + self._complete_join(group, now_ms)
        if group.leader is None:
            group.leader = next(iter(group.members))
        if group.state == State.PREPARING_REBALANCE:
            return self._maybe_complete_join(group, now_ms)
        return self._prepare_rebalance(group, now_ms)

    @staticmethod
    def _sync_answer(group: Group, member: Member) -> SyncAnswer:
        return SyncAnswer(
            GroupError.NONE,
            protocol_type=group.protocol_type,
            protocol_name=group.protocol_name,
            assignment=member.assignment,
        )
