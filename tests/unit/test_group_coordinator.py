"""The KIP-848 group coordinator (services/groups/coordinator.py), driven as a client would drive it.

`test_simulation_*` is deterministic from a printed seed: members join, leave, time out,
leave and come back as static members, change subscriptions; topics grow; clients revoke
late; zombies send old epochs. After every step it checks what KIP-848 promises: no
partition is owned by two members, a live client owns only what the coordinator counts as
its own, commits from removed members or old epochs are refused, and the state survives a
trip through its etcd record. Once membership stops changing, every member converges to
its target within a bounded number of heartbeats.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from clients.common.types import TopicPartitionKey
from services.groups.coordinator import (
    EPOCH_JOIN,
    EPOCH_LEAVE,
    EPOCH_LEAVE_STATIC,
    GROUP_MEMBERS_MAX,
    HEARTBEAT_INTERVAL_MS_DEFAULT,
    GroupState,
    HeartbeatAnswer,
    HeartbeatRequest,
    Member,
    MemberState,
    check_commit,
    describe,
    expire,
    heartbeat,
    state_name,
)
from services.groups.errors import GroupError
from tests.unit.test_pure_imports import ROOT, _io_in, _reached

TPs = frozenset[TopicPartitionKey]
# Rounds of heartbeats (every member once per round) in which a quiet group must settle:
# revoke (1), release seen (2), the new owner takes it (3), plus slack for chains of moves.
CONVERGENCE_ROUNDS_MAX = 6


@dataclass
class Client:
    """A consumer as the protocol expects it to behave, revoking late when told to lag."""

    name: str
    subscription: frozenset[str]
    instance_id: str | None = None
    member_id: str = ""
    epoch: int = EPOCH_JOIN
    owned: set[TopicPartitionKey] = field(default_factory=set)
    old_epochs: list[int] = field(default_factory=list)


class Group:
    """The coordinator's state as its one owning task keeps it, with a client-side view."""

    def __init__(self, counts: dict[str, int]) -> None:
        self.state = GroupState(group_id="g")
        self.counts = counts
        self.next_id = 0
        self.writes = 0

    def fresh_id(self) -> str:
        self.next_id += 1
        return f"m{self.next_id:04d}"

    def send(self, request: HeartbeatRequest) -> HeartbeatAnswer:
        before = self.state
        self.state, answer = heartbeat(self.state, request, self.counts, self.fresh_id())
        assert answer.changed == (self.state != before)
        assert answer.heartbeat_interval_ms == HEARTBEAT_INTERVAL_MS_DEFAULT
        if answer.error is not None:
            assert self.state is before, "a refused heartbeat changed the group"
        self.writes += answer.changed
        return answer

    def beat(self, client: Client, rng: random.Random | None = None, lag: float = 0.0) -> HeartbeatAnswer:
        """One heartbeat; afterwards the client takes what it got and gives up what it lost (maybe late)."""
        answer = self.send(
            HeartbeatRequest(
                member_id=client.member_id,
                member_epoch=client.epoch,
                instance_id=client.instance_id,
                client_id=client.name,
                client_host="10.0.0.1",
                subscribed_topics=client.subscription,
                owned=frozenset(client.owned),
            )
        )
        if answer.error in (GroupError.FENCED_MEMBER_EPOCH, GroupError.UNKNOWN_MEMBER_ID):
            # The protocol's answer to both: drop every partition and join again.
            client.owned.clear()
            client.epoch = EPOCH_JOIN
            if answer.error is GroupError.UNKNOWN_MEMBER_ID:
                client.member_id = ""
            return answer
        assert answer.error is None, answer
        if client.epoch not in (EPOCH_JOIN, answer.member_epoch):
            client.old_epochs.append(client.epoch)
        client.member_id, client.epoch = answer.member_id, answer.member_epoch
        client.owned |= answer.assignment
        for tp in sorted(client.owned - answer.assignment):
            if rng is None or rng.random() >= lag:
                client.owned.discard(tp)
        return answer


def check_group(group: Group, live: list[Client]) -> None:
    state = group.state
    owners: dict[TopicPartitionKey, str] = {}
    for member in state.members.values():
        for tp in member.assigned | member.pending_revocation:
            assert tp not in owners, f"{tp} owned by {owners[tp]} and {member.member_id}"
            owners[tp] = member.member_id
        assert member.member_epoch <= state.group_epoch
    seen: set[TopicPartitionKey] = set()
    for client in live:
        if not client.member_id or client.member_id not in state.members:
            assert not client.owned, f"{client.name} owns {client.owned} outside the group"
            continue
        member = state.members[client.member_id]
        assert client.owned <= member.assigned | member.pending_revocation, client.name
        assert not client.owned & seen, f"{client.name} owns what another client owns"
        seen |= client.owned
        if client.epoch > 0:
            assert check_commit(state, client.member_id, client.epoch, frozenset(client.owned)) is None
            others = frozenset().union(
                *(m.owns for m_id, m in state.members.items() if m_id != client.member_id)
            )
            for old in client.old_epochs:
                # An older epoch of a present member: accepted for what it still owns, refused
                # as stale for partitions it no longer owns.
                assert check_commit(state, client.member_id, old, frozenset(client.owned)) is None
                if others:
                    refusal = check_commit(state, client.member_id, old, others)
                    assert refusal == GroupError.STALE_MEMBER_EPOCH
    assert GroupState.from_record(json.loads(json.dumps(state.to_record()))) == state


def converge(group: Group, clients: list[Client]) -> None:
    """Heartbeat every client, revoking promptly, until all members are STABLE at the target epoch."""
    for _ in range(CONVERGENCE_ROUNDS_MAX):
        for client in clients:
            group.beat(client)
            check_group(group, clients)
        if all(settled(group.state, c) for c in clients):
            return
    unsettled = [describe(group.state).members]
    pytest.fail(f"not converged in {CONVERGENCE_ROUNDS_MAX} rounds: {unsettled}")


def settled(state: GroupState, client: Client) -> bool:
    member = state.members.get(client.member_id)
    return (
        member is not None
        and member.state is MemberState.STABLE
        and member.member_epoch == state.target_epoch
        and member.assigned == state.target[client.member_id] == frozenset(client.owned)
    )


SEEDS = range(12)


@pytest.mark.parametrize("seed", SEEDS)
def test_simulation_keeps_ownership_exclusive_and_converges(seed: int) -> None:
    print(f"simulation seed {seed}")
    rng = random.Random(seed)
    topics = ["a", "b", "c"]
    group = Group({"a": 6, "b": 4, "c": 3})
    live: list[Client] = []
    away: list[Client] = []
    zombies: list[tuple[str, int]] = []
    names = 0
    for _step in range(250):
        roll = rng.random()
        if roll < 0.12 or not live:
            names += 1
            static = rng.random() < 0.4
            subs = frozenset(rng.sample(topics, rng.randint(1, 3)))
            live.append(Client(f"c{names}", subs, instance_id=f"i{names}" if static else None))
            group.beat(live[-1], rng, lag=0.5)
        elif roll < 0.17:
            client = live.pop(rng.randrange(len(live)))
            if client.member_id:
                client.owned.clear()  # a leaving client revokes everything first
                group.send(HeartbeatRequest(client.member_id, EPOCH_LEAVE))
        elif roll < 0.22:
            client = live.pop(rng.randrange(len(live)))
            if client.member_id:
                zombies.append((client.member_id, client.epoch))
                assert expire(group.state, client.member_id)[1]
                group.state = expire(group.state, client.member_id)[0]
        elif roll < 0.27:
            client = live[rng.randrange(len(live))]
            if client.instance_id is not None and client.member_id and client.epoch > 0:
                live.remove(client)
                answer = group.send(HeartbeatRequest(client.member_id, EPOCH_LEAVE_STATIC))
                assert answer.error is None and answer.assignment == frozenset()
                client.owned.clear()  # the process is down
                client.member_id, client.epoch = "", EPOCH_JOIN
                away.append(client)
        elif roll < 0.32 and away:
            client = away.pop(rng.randrange(len(away)))
            live.append(client)
            group.beat(client, rng, lag=0.5)
        elif roll < 0.36:
            client = live[rng.randrange(len(live))]
            client.subscription = frozenset(rng.sample(topics, rng.randint(1, 3)))
            group.beat(client, rng, lag=0.5)
        elif roll < 0.39:
            topic = rng.choice(topics)
            group.counts = {**group.counts, topic: group.counts[topic] + rng.randint(1, 3)}
        elif roll < 0.45 and zombies:
            member_id, epoch = rng.choice(zombies)
            if member_id not in group.state.members:
                answer = group.send(HeartbeatRequest(member_id, epoch, owned=frozenset()))
                assert answer.error is GroupError.UNKNOWN_MEMBER_ID
                assert (
                    check_commit(group.state, member_id, epoch, frozenset()) == GroupError.UNKNOWN_MEMBER_ID
                )
        elif roll < 0.5:
            client = live[rng.randrange(len(live))]
            if client.old_epochs and client.member_id:
                # A zombie of this member from an older generation.
                answer = group.send(HeartbeatRequest(client.member_id, client.old_epochs[-1]))
                assert answer.error is GroupError.FENCED_MEMBER_EPOCH
        else:
            group.beat(live[rng.randrange(len(live))], rng, lag=0.6)
        check_group(group, live)
    # Membership stops changing: away members come back, everyone heartbeats and revokes promptly.
    live.extend(away)
    converge(group, live)
    # Then a quiet group writes nothing.
    writes = group.writes
    for client in live:
        group.beat(client)
    assert group.writes == writes


def _homogeneous_group(n: int) -> tuple[Group, list[Client]]:
    group = Group({"a": 10, "b": 7})
    clients = [Client(f"c{i}", frozenset({"a", "b"})) for i in range(n)]
    converge(group, clients)
    return group, clients


def test_staying_members_keep_their_partitions_across_a_join_and_a_leave() -> None:
    group, clients = _homogeneous_group(4)
    before = {c.name: frozenset(c.owned) for c in clients}
    newcomer = Client("new", frozenset({"a", "b"}))
    converge(group, [*clients, newcomer])
    floor_quota = 17 // 5
    for c in clients:
        assert c.owned <= before[c.name]
        assert len(before[c.name]) - len(c.owned) <= len(before[c.name]) - floor_quota
    assert (
        max(len(c.owned) for c in [*clients, newcomer]) - min(len(c.owned) for c in [*clients, newcomer]) <= 1
    )

    before = {c.name: frozenset(c.owned) for c in clients}
    newcomer.owned.clear()
    group.send(HeartbeatRequest(newcomer.member_id, EPOCH_LEAVE))
    converge(group, clients)
    for c in clients:
        assert before[c.name] <= c.owned


def test_a_partition_moves_only_after_its_owner_confirms_the_revocation() -> None:
    group, (first,) = _homogeneous_group(1)
    second = Client("second", frozenset({"a", "b"}))
    group.beat(second)  # joins; everything still belongs to `first`
    assert (
        second.owned == set()
        and group.state.members[second.member_id].state is MemberState.UNRELEASED_PARTITIONS
    )
    lagging = first.owned.copy()
    answer = group.beat(first, random.Random(0), lag=1.0)  # told to revoke, keeps everything
    first_member = group.state.members[first.member_id]
    assert first_member.state is MemberState.UNREVOKED_PARTITIONS
    assert answer.member_epoch < group.state.target_epoch, "no new epoch before revoking"
    assert first.owned == lagging
    group.beat(second)
    assert second.owned == set(), "partitions given before the old owner released them"
    group.beat(first)  # now revokes...
    assert group.state.members[first.member_id].pending_revocation, "released before it said so"
    group.beat(first)  # ...and says so on its next heartbeat
    assert group.state.members[first.member_id].state is MemberState.STABLE
    group.beat(second)
    assert second.owned == group.state.target[second.member_id]
    assert group.state.members[second.member_id].state is MemberState.STABLE


def test_static_member_restart_keeps_assignment_and_epoch_without_rebalance() -> None:
    group = Group({"a": 4})
    one = Client("one", frozenset({"a"}), instance_id="host-1")
    two = Client("two", frozenset({"a"}), instance_id="host-2")
    converge(group, [one, two])
    epoch, owned, group_epoch = one.epoch, frozenset(one.owned), group.state.group_epoch
    old_id = one.member_id
    group.send(HeartbeatRequest(one.member_id, EPOCH_LEAVE_STATIC))
    assert group.state.group_epoch == group_epoch, "a static member's bounce must not rebalance"
    # While it is away, another process claiming its instance id is refused only if it is still present.
    one.member_id, one.epoch, one.owned = "", EPOCH_JOIN, set()
    answer = group.beat(one)
    assert answer.member_id != old_id and old_id not in group.state.members
    assert (answer.member_epoch, answer.assignment) == (epoch, owned)
    assert group.state.group_epoch == group_epoch
    impostor = HeartbeatRequest("", EPOCH_JOIN, instance_id="host-1", subscribed_topics=frozenset({"a"}))
    assert group.send(impostor).error is GroupError.UNRELEASED_INSTANCE_ID


def test_commit_rules() -> None:
    group, (first, second) = _homogeneous_group(2)
    state = group.state
    mine = frozenset(first.owned)
    assert check_commit(state, first.member_id, first.epoch, mine) is None
    # An older epoch (the heartbeat moved it while the commit was on its way): fine for what
    # it owns, stale for what it does not.
    assert check_commit(state, first.member_id, first.epoch - 1, mine) is None
    theirs = frozenset(second.owned)
    assert check_commit(state, first.member_id, first.epoch - 1, theirs) is GroupError.STALE_MEMBER_EPOCH
    assert check_commit(state, first.member_id, first.epoch + 1, mine) is GroupError.FENCED_MEMBER_EPOCH
    assert check_commit(state, first.member_id, first.epoch, theirs) is GroupError.FENCED_MEMBER_EPOCH
    assert check_commit(state, "nobody", 1, frozenset()) is GroupError.UNKNOWN_MEMBER_ID
    # A standalone consumer may commit only into an empty group.
    assert check_commit(state, "", EPOCH_LEAVE, mine) is GroupError.UNKNOWN_MEMBER_ID
    for client in (first, second):
        group.state = expire(group.state, client.member_id)[0]
    assert check_commit(group.state, "", EPOCH_LEAVE, mine) is None
    assert check_commit(group.state, first.member_id, first.epoch, mine) is GroupError.UNKNOWN_MEMBER_ID


def test_refusals_leave_the_group_unchanged() -> None:
    group, _ = _homogeneous_group(1)
    answer = group.send(
        HeartbeatRequest("", EPOCH_JOIN, subscribed_topics=frozenset({"a"}), assignor="magic")
    )
    assert answer.error is GroupError.UNSUPPORTED_ASSIGNOR and not answer.changed
    assert group.send(HeartbeatRequest("ghost", 3)).error is GroupError.UNKNOWN_MEMBER_ID
    assert expire(group.state, "ghost") == (group.state, False)


def test_group_size_is_bounded() -> None:
    # Built directly: a thousand joins through heartbeat would spend seconds on assignor runs.
    members = {
        f"m{i}": Member(
            f"m{i}", None, "", "", frozenset(), 1, 0, frozenset(), frozenset(), MemberState.STABLE
        )
        for i in range(GROUP_MEMBERS_MAX)
    }
    full = GroupState(
        group_id="big",
        group_epoch=1,
        target_epoch=1,
        members=members,
        target=dict.fromkeys(members, frozenset()),
    )
    state, answer = heartbeat(
        full, HeartbeatRequest("", EPOCH_JOIN, subscribed_topics=frozenset()), {}, "one-more"
    )
    assert answer.error is GroupError.GROUP_MAX_SIZE_REACHED and state is full


def test_range_assignor_is_chosen_by_the_members() -> None:
    group = Group({"t": 7})
    clients = [Client(f"c{i}", frozenset({"t"})) for i in range(3)]
    for c in clients:
        group.send(HeartbeatRequest("", EPOCH_JOIN, subscribed_topics=c.subscription, assignor="range"))
    assert group.state.assignor == "range"
    ranges = sorted(sorted(p for _, p in tps) for tps in group.state.target.values())
    assert ranges == [[0, 1, 2], [3, 4], [5, 6]]


def test_describe_shows_members_for_admins() -> None:
    group, clients = _homogeneous_group(2)
    description = describe(group.state)
    assert [m.member_id for m in description.members] == sorted(c.member_id for c in clients)
    assert all(m.client_host == "10.0.0.1" and m.state is MemberState.STABLE for m in description.members)
    assert {m.client_id for m in description.members} == {"c0", "c1"}


@pytest.mark.parametrize("path", sorted((ROOT / "services" / "groups").glob("*.py")), ids=lambda p: p.name)
def test_group_logic_reaches_no_io(path: Path) -> None:
    problems = [
        f"{' -> '.join(chain)}: {bad}" for reached, chain in _reached(path).items() for bad in _io_in(reached)
    ]
    assert not problems


def test_state_names_follow_kafkas_consumer_group_states() -> None:
    assert state_name(GroupState(group_id="g")) == "Empty"
    group, clients = _homogeneous_group(2)
    assert state_name(group.state) == "Stable"
    newcomer = Client("c-new", frozenset({"a", "b"}))
    group.beat(newcomer)
    # The join bumped the group epoch and set a new target the others have not reached yet.
    assert state_name(group.state) in ("Assigning", "Reconciling")
    converge(group, [*clients, newcomer])
    assert state_name(group.state) == "Stable"
