"""Transitions as data (STYLE.md 7), checked at every move: the fetch phase table
(fetch_state.py), the classic group state table (classic_groups.py), the partition role
table (partition.py), and protocol.build() refusing a field no version of a message has.

Each table is tested both ways: the moves the code makes are legal, the ones it must never make
raise InvariantViolation; and every assignment of the state goes through the one checking
function (a table nothing routes through cannot fire).
"""

from __future__ import annotations

import ast
import dataclasses
import itertools
import pathlib

import pytest

from clients.common.errors import InvariantViolation
from services.broker import fetch_state, partition
from services.broker.fetch_state import FetchPhase, PartitionFetchState
from services.broker.partition import LeaderAndIsrState, Partition, Role
from services.kafka import classic_groups
from services.kafka.classic_groups import ClassicGroups, Group, JoinAnswer, State
from services.kafka.protocol import build, nested, request_class, response_class
from tests.python_source import parse_python

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _assignments_outside(path: str, attribute: str, allowed_function: str) -> list[str]:
    """`x.<attribute> = ...` statements of a module outside the function allowed to make them."""
    tree = parse_python((ROOT / path).read_text())
    found: list[str] = []

    def visit(node: ast.AST, function: str) -> None:
        for child in ast.iter_child_nodes(node):
            inner = child.name if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) else function
            targets: list[ast.AST] = []
            if isinstance(child, ast.Assign):
                targets = [t for target in child.targets for t in ast.walk(target)]
            elif isinstance(child, (ast.AugAssign, ast.AnnAssign)):
                targets = [child.target]
            for t in targets:
                if isinstance(t, ast.Attribute) and t.attr == attribute and inner != allowed_function:
                    found.append(f"{path}:{getattr(child, 'lineno', '?')} in {inner}")
            visit(child, inner)

    visit(tree, "<module>")
    return found


# ---- the fetch phase (Kafka's PartitionFetchState) -------------------------------------------


def _fetch_state(phase: FetchPhase) -> PartitionFetchState:
    st = PartitionFetchState("t", 0, fetch_offset=0, current_leader_epoch=1)
    if phase is FetchPhase.FETCHING:
        st.move(FetchPhase.FETCHING)
    elif phase is FetchPhase.DELAYED:
        st.delay(now_ms=0, backoff_ms=10, resume=FetchPhase.TRUNCATING)
    assert st.phase is phase
    return st


FETCH_ILLEGAL = [
    # Nothing moves to itself: re-adding makes a new state, an append only advances the offset.
    (FetchPhase.TRUNCATING, FetchPhase.TRUNCATING),
    (FetchPhase.FETCHING, FetchPhase.FETCHING),
    # Delaying a delayed partition would lose the phase it must resume in.
    (FetchPhase.DELAYED, FetchPhase.DELAYED),
]


@pytest.mark.parametrize(("start", "target"), FETCH_ILLEGAL, ids=lambda p: p.name)
def test_fetch_moves_the_fetcher_never_makes_raise(start: FetchPhase, target: FetchPhase) -> None:
    st = _fetch_state(start)
    with pytest.raises(InvariantViolation, match=f"illegal fetch transition {start} -> {target} for t-0"):
        st.move(target)


def test_fetch_table_is_exactly_the_moves_the_fetcher_makes() -> None:
    legal = {(a, b) for a, bs in fetch_state.LEGAL_TRANSITIONS.items() for b in bs}
    every = set(itertools.product(FetchPhase, FetchPhase))
    assert every - legal == set(FETCH_ILLEGAL)
    for start, target in sorted(legal, key=str):
        st = _fetch_state(start)
        if start is FetchPhase.DELAYED:
            st.resume_phase = target  # only the end of a delay leaves DELAYED (ready())
            assert st.ready(now_ms=10) and st.phase is target
        elif target is FetchPhase.DELAYED:
            st.delay(now_ms=0, backoff_ms=10, resume=start)
            assert not st.ready(now_ms=9) and st.ready(now_ms=10) and st.phase is start
        else:
            st.move(target)
            assert st.phase is target


def test_a_partition_delayed_before_truncating_may_not_resume_fetching() -> None:
    """KIP-101: a follower fetches only after its log agrees with the leader's; skipping the
    truncation through a delay would append the leader's records after divergent ones."""
    assert fetch_state.LEGAL_RESUMES[FetchPhase.TRUNCATING] == {FetchPhase.TRUNCATING}
    st = _fetch_state(FetchPhase.TRUNCATING)
    with pytest.raises(InvariantViolation, match=r"delayed from FetchPhase\.TRUNCATING, it may not resume"):
        st.delay(now_ms=0, backoff_ms=10, resume=FetchPhase.FETCHING)
    # A fetching one resumes where it was (a whole RPC failed) or truncates again.
    for resume in (FetchPhase.FETCHING, FetchPhase.TRUNCATING):
        st = _fetch_state(FetchPhase.FETCHING)
        st.delay(now_ms=0, backoff_ms=10, resume=resume)
        assert st.ready(now_ms=10) and st.phase is resume


def test_fetch_phase_changes_only_in_move() -> None:
    assert _assignments_outside("services/broker/fetch_state.py", "phase", "move") == []
    assert _assignments_outside("services/broker/fetcher_core.py", "phase", "move") == []


# ---- classic group states (Kafka's GroupMetadata) -------------------------------------------


def _join(groups: ClassicGroups, now_ms: int, ticket: int) -> None:
    groups.join(
        now_ms,
        ticket,
        group_id="g",
        member_id="",
        group_instance_id=None,
        client_id="c",
        client_host="h",
        protocol_type="consumer",
        protocols=[("range", b"")],
        session_timeout_ms=10_000,
        rebalance_timeout_ms=5_000,
        require_known_member_id=False,
    )


def _group_state(groups: ClassicGroups) -> State:
    return groups.groups["g"].state


def test_a_groups_life_walks_kafkas_states_through_the_table(monkeypatch: pytest.MonkeyPatch) -> None:
    groups = ClassicGroups(broker_id=1)
    seen: list[tuple[State, State]] = []
    real = Group.transition

    def spy(group: Group, state: State) -> None:
        seen.append((group.state, state))
        real(group, state)

    monkeypatch.setattr(Group, "transition", spy)
    _join(groups, 0, ticket=1)  # Empty -> PreparingRebalance (a forming group waits for more)
    (_, answer), *_ = groups.expire(classic_groups.INITIAL_REBALANCE_DELAY_MS)
    assert isinstance(answer, JoinAnswer)
    out = groups.sync(
        2, group_id="g", member_id=answer.member_id, generation=answer.generation, assignments={}
    )
    assert _group_state(groups) is State.STABLE and out
    errors, _ = groups.leave(10, group_id="g", member_ids=[answer.member_id])
    assert errors == [classic_groups.Error.NONE]
    assert _group_state(groups) is State.EMPTY
    assert groups.delete("g") == classic_groups.Error.NONE and "g" not in groups.groups
    assert seen == [
        (State.EMPTY, State.PREPARING_REBALANCE),
        (State.PREPARING_REBALANCE, State.COMPLETING_REBALANCE),
        (State.COMPLETING_REBALANCE, State.STABLE),
        # The last member's leave: as in Kafka, a rebalance nobody joins leaves the group Empty.
        (State.STABLE, State.PREPARING_REBALANCE),
        (State.PREPARING_REBALANCE, State.EMPTY),
        (State.EMPTY, State["DEAD"]),
    ]


# By name, so that the module still loads (and these tests fail one by one) without DEAD.
GROUP_STATES = ["EMPTY", "PREPARING_REBALANCE", "COMPLETING_REBALANCE", "STABLE", "DEAD"]
GROUP_LEGAL = {
    ("EMPTY", "PREPARING_REBALANCE"),
    ("EMPTY", "DEAD"),
    ("PREPARING_REBALANCE", "COMPLETING_REBALANCE"),
    ("PREPARING_REBALANCE", "EMPTY"),
    ("COMPLETING_REBALANCE", "STABLE"),
    ("COMPLETING_REBALANCE", "PREPARING_REBALANCE"),
    ("STABLE", "PREPARING_REBALANCE"),
}


def test_group_table_is_kafkas_valid_previous_states() -> None:
    assert [s.name for s in State] == GROUP_STATES
    legal = {(a.name, b.name) for a, bs in classic_groups.LEGAL_TRANSITIONS.items() for b in bs}
    assert legal == GROUP_LEGAL


@pytest.mark.parametrize(
    ("start", "target"), sorted(set(itertools.product(GROUP_STATES, GROUP_STATES)) - GROUP_LEGAL)
)
def test_every_other_group_move_raises(start: str, target: str) -> None:
    group = Group("g", state=State[start])
    with pytest.raises(
        InvariantViolation, match=f"illegal group transition State.{start} -> State.{target} for group g"
    ):
        group.transition(State[target])
    assert group.state is State[start]


@pytest.mark.parametrize(("start", "target"), sorted(GROUP_LEGAL))
def test_every_legal_group_move_is_taken(start: str, target: str) -> None:
    group = Group("g", state=State[start])
    group.transition(State[target])
    assert group.state is State[target]


def test_group_state_changes_only_in_transition() -> None:
    assert _assignments_outside("services/kafka/classic_groups.py", "state", "transition") == []


# ---- partition roles -----------------------------------------------------------------------


class _NoLog:
    """The part of a Log that become_leader touches."""

    log_end_offset = 0

    class leader_epoch_cache:
        @staticmethod
        def assign(epoch: int, offset: int) -> None:
            pass


def _partition(role: Role) -> Partition:
    p = Partition("t", 0, local_broker_id=1, log=_NoLog())  # type: ignore[arg-type]
    p.role = role
    return p


def _state(leader: int, epoch: int) -> LeaderAndIsrState:
    return LeaderAndIsrState(leader, epoch, (1, 2), (1, 2), partition_epoch=epoch, controller_epoch=1)


def test_a_closed_replica_never_leads_or_follows_again() -> None:
    """Its log is closed or deleted (StopReplica with delete, topic deletion, the broker stopping)."""
    for target in Role:
        p = _partition(Role.CLOSED)
        with pytest.raises(InvariantViolation, match=f"illegal role transition {Role.CLOSED} -> {target}"):
            p.change_role(target)
    with pytest.raises(InvariantViolation, match="illegal role transition"):
        _partition(Role.CLOSED).become_leader(_state(1, 5), now_ms=0)
    with pytest.raises(InvariantViolation, match="illegal role transition"):
        _partition(Role.CLOSED).become_follower(_state(2, 5))


def test_leading_and_following_change_with_every_leader_and_isr() -> None:
    assert {(a, b) for a, bs in partition.ROLE_TRANSITIONS.items() for b in bs} == {
        (a, b) for a in Role for b in Role if a is not Role.CLOSED
    }
    p = _partition(Role.NONE)
    p.become_follower(_state(2, 1))
    p.become_follower(_state(2, 2))  # the same role at a newer epoch
    p.become_leader(_state(1, 3), now_ms=0)
    p.become_leader(_state(1, 4), now_ms=0)
    p.change_role(Role.NONE)  # StopReplica without delete, and again: the controller resends it
    p.change_role(Role.NONE)
    p.become_leader(_state(1, 5), now_ms=0)
    p.change_role(Role.CLOSED)
    assert p.role is Role.CLOSED


def test_partition_role_changes_only_in_change_role() -> None:
    for path in sorted((ROOT / "services").rglob("*.py")):
        assert _assignments_outside(str(path.relative_to(ROOT)), "role", "change_role") == [], path


# ---- protocol.build() ----------------------------------------------------------------------


def test_build_refuses_a_field_no_version_of_the_message_has() -> None:
    cls = response_class(0, 9)  # ProduceResponse v9
    with pytest.raises(InvariantViolation, match=r"ProduceResponse.*\['throtle_time'\]"):
        build(cls, throtle_time=0, responses=())
    partition_cls = nested(cls, "PartitionProduceResponse")
    with pytest.raises(InvariantViolation, match=r"PartitionProduceResponse.*\['eror_code'\]"):
        build(partition_cls, index=0, eror_code=0)


def test_build_drops_a_field_that_only_other_versions_have() -> None:
    """One mapping serves every version: Metadata v12 has no include_cluster_authorized_operations
    (v8-v10 have it), ProduceResponse v3 no log_start_offset (v5+)."""
    request = build(
        request_class(3, 12),
        topics=None,
        allow_auto_topic_creation=True,
        include_cluster_authorized_operations=False,
        include_topic_authorized_operations=False,
    )
    assert not hasattr(request, "include_cluster_authorized_operations")
    partition_cls = nested(response_class(0, 3), "PartitionProduceResponse")
    built = build(
        partition_cls, index=0, error_code=0, base_offset=5, log_append_time=None, log_start_offset=0
    )
    assert built.base_offset == 5
    assert "log_start_offset" not in {f.name for f in dataclasses.fields(partition_cls)}
