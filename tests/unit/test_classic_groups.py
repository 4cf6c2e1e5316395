"""Kafka's classic group protocol, pure (services/kafka/classic_groups.py): joins, the forming
wait, the leader's assignment, rebalances on a join or a leave, session expiry, a leader that
never syncs, and which commits a group takes."""

from __future__ import annotations

from typing import Any

from services.groups.errors import GroupError
from services.kafka.classic_groups import (
    INITIAL_REBALANCE_DELAY_MS,
    ClassicGroups,
    JoinAnswer,
    State,
    SyncAnswer,
    coordinator_of,
)

SESSION_MS = 10_000
REBALANCE_MS = 30_000


class Tickets:
    def __init__(self) -> None:
        self.n = 0

    def __call__(self) -> int:
        self.n += 1
        return self.n


def join(groups: ClassicGroups, now: int, ticket: int, member_id: str = "", **kw: Any) -> list[Any]:
    args: dict[str, Any] = {
        "group_id": "g",
        "member_id": member_id,
        "group_instance_id": None,
        "client_id": "c",
        "client_host": "/127.0.0.1",
        "protocol_type": "consumer",
        "protocols": [("range", member_id.encode() or b"new")],
        "session_timeout_ms": SESSION_MS,
        "rebalance_timeout_ms": REBALANCE_MS,
        "require_known_member_id": True,
    }
    args.update(kw)
    return groups.join(now, ticket, **args)


def joined_member(groups: ClassicGroups, now: int, tickets: Tickets) -> tuple[str, int]:
    """A member id from MEMBER_ID_REQUIRED, then its real join's ticket (answered later)."""
    ((_, first),) = join(groups, now, tickets())
    assert isinstance(first, JoinAnswer) and first.error == GroupError.MEMBER_ID_REQUIRED
    ticket = tickets()
    assert join(groups, now, ticket, first.member_id) == []
    return first.member_id, ticket


def stable_pair(groups: ClassicGroups, tickets: Tickets) -> tuple[str, str, int]:
    a, ta = joined_member(groups, 0, tickets)
    b, tb = joined_member(groups, 100, tickets)
    assert groups.expire(100 + INITIAL_REBALANCE_DELAY_MS - 1) == [], "a forming group waits for more"
    answers = dict(groups.expire(100 + INITIAL_REBALANCE_DELAY_MS))
    ja, jb = answers[ta], answers[tb]
    assert isinstance(ja, JoinAnswer) and isinstance(jb, JoinAnswer)
    assert ja.generation == jb.generation == 1 and ja.leader == jb.leader == a
    assert [m[0] for m in ja.members] == [a, b] and jb.members == (), "only the leader gets the members"
    assert ja.protocol_name == "range"
    follower_ticket = tickets()
    assert groups.sync(follower_ticket, group_id="g", member_id=b, generation=1, assignments={}) == []
    leader_ticket = tickets()
    done = dict(
        groups.sync(leader_ticket, group_id="g", member_id=a, generation=1, assignments={a: b"A", b: b"B"})
    )
    assert done == {
        leader_ticket: SyncAnswer(GroupError.NONE, "consumer", "range", b"A"),
        follower_ticket: SyncAnswer(GroupError.NONE, "consumer", "range", b"B"),
    }
    assert groups.groups["g"].state == State.STABLE
    return a, b, 100 + INITIAL_REBALANCE_DELAY_MS


def test_two_members_form_a_group_and_get_the_leaders_assignment():
    stable_pair(ClassicGroups(1), Tickets())


def test_a_new_member_rebalances_the_group_and_everyone_rejoins():
    groups, tickets = ClassicGroups(1), Tickets()
    a, b, now = stable_pair(groups, tickets)
    _, tc = joined_member(groups, now, tickets)
    assert groups.heartbeat(now, group_id="g", member_id=a, generation=1) == GroupError.REBALANCE_IN_PROGRESS
    ta = tickets()
    assert join(groups, now, ta, a) == []
    tb = tickets()
    answers = dict(join(groups, now, tb, b))  # the last one back completes the join at once
    assert set(answers) == {ta, tb, tc}
    assert all(isinstance(x, JoinAnswer) and x.generation == 2 and x.leader == a for x in answers.values())
    assert groups.commit_check("g", a, 1) == GroupError.ILLEGAL_GENERATION
    assert groups.commit_check("g", a, 2) == GroupError.REBALANCE_IN_PROGRESS, "before the assignment"


def test_a_member_that_does_not_rejoin_is_dropped_at_the_rebalance_deadline():
    groups, tickets = ClassicGroups(1), Tickets()
    a, b, now = stable_pair(groups, tickets)
    ta = tickets()
    join(groups, now, ta, a)
    answers = dict(groups.expire(now + REBALANCE_MS))
    (answer,) = answers.values()
    assert isinstance(answer, JoinAnswer) and answer.generation == 2 and [m[0] for m in answer.members] == [a]
    assert groups.heartbeat(now, group_id="g", member_id=b, generation=1) == GroupError.UNKNOWN_MEMBER_ID


def test_leave_and_session_expiry_rebalance_and_an_empty_group_takes_outside_commits():
    groups, tickets = ClassicGroups(1), Tickets()
    a, b, now = stable_pair(groups, tickets)
    assert groups.commit_check("g", "", -1) == GroupError.UNKNOWN_MEMBER_ID, "members own the offsets"
    assert groups.commit_check("g", a, 1) == GroupError.NONE
    errors, _ = groups.leave(now, group_id="g", member_ids=[b, "nobody"])
    assert errors == [GroupError.NONE, GroupError.UNKNOWN_MEMBER_ID]
    assert groups.groups["g"].state == State.PREPARING_REBALANCE
    # a never rejoins and stops heartbeating: its session ends, the group empties.
    groups.expire(now + SESSION_MS + 1)
    assert "g" not in groups.groups
    assert groups.commit_check("g", "", -1) == GroupError.NONE


def test_a_leader_that_never_syncs_starts_another_rebalance():
    groups, tickets = ClassicGroups(1), Tickets()
    a, _ = joined_member(groups, 0, tickets)
    groups.expire(INITIAL_REBALANCE_DELAY_MS)
    assert groups.groups["g"].state == State.COMPLETING_REBALANCE
    for now in range(INITIAL_REBALANCE_DELAY_MS, INITIAL_REBALANCE_DELAY_MS + REBALANCE_MS, 5_000):
        assert groups.heartbeat(now, group_id="g", member_id=a, generation=1) == GroupError.NONE
        groups.expire(now)
    groups.expire(INITIAL_REBALANCE_DELAY_MS + REBALANCE_MS)
    assert groups.groups["g"].state == State.PREPARING_REBALANCE


def test_joins_that_cannot_be_served():
    groups, tickets = ClassicGroups(1), Tickets()
    ((_, answer),) = join(groups, 0, tickets(), session_timeout_ms=10)
    assert answer.error == GroupError.INVALID_SESSION_TIMEOUT
    ((_, answer),) = join(groups, 0, tickets(), "never-given")
    assert answer.error == GroupError.UNKNOWN_MEMBER_ID
    joined_member(groups, 0, tickets)
    ((_, answer),) = join(groups, 0, tickets(), protocols=[("other", b"")], require_known_member_id=False)
    assert answer.error == GroupError.INCONSISTENT_GROUP_PROTOCOL


def test_every_broker_names_the_same_coordinator():
    assert coordinator_of("g", [3, 1, 2]) == coordinator_of("g", [1, 2, 3])
    assert coordinator_of("g", []) is None
    assert {coordinator_of(f"group-{i}", [1, 2, 3]) for i in range(50)} == {1, 2, 3}, "spread"
