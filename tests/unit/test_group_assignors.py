"""The server-side assignors (services/groups/assignors.py): completeness, balance, stickiness, determinism.

Properties are stated as KIP-848 and Kafka's UniformAssignor state them: every partition of
a subscribed topic is assigned exactly once to a subscriber; with identical subscriptions
counts differ by at most one; a member that stays keeps what it had except what balance
requires it to give up.
"""

from __future__ import annotations

import random
import timeit
from collections.abc import Mapping

from hypothesis import given, settings
from hypothesis import strategies as st

from clients.common.types import TopicPartitionKey
from services.groups.assignors import ASSIGNORS, range_assign, uniform_assign

Assignment = Mapping[str, frozenset[TopicPartitionKey]]


def _all_partitions(
    subscriptions: Mapping[str, frozenset[str]], counts: Mapping[str, int]
) -> set[TopicPartitionKey]:
    topics = {t for s in subscriptions.values() for t in s}
    return {(t, p) for t in topics for p in range(counts.get(t, 0))}


def _assert_complete(
    assignment: Assignment, subscriptions: Mapping[str, frozenset[str]], counts: Mapping[str, int]
) -> None:
    seen: list[TopicPartitionKey] = [tp for tps in assignment.values() for tp in tps]
    assert len(seen) == len(set(seen)), "a partition assigned twice"
    assert set(seen) == _all_partitions(subscriptions, counts)
    for member_id, tps in assignment.items():
        assert all(t in subscriptions[member_id] for t, _ in tps)


def _spread(assignment: Assignment) -> int:
    loads = [len(tps) for tps in assignment.values()]
    return max(loads) - min(loads)


members_st = st.lists(st.text("abcdefgh", min_size=1, max_size=3), min_size=1, max_size=12, unique=True)
counts_st = st.dictionaries(st.sampled_from(["t0", "t1", "t2", "t3"]), st.integers(0, 17), min_size=1)


@settings(max_examples=150, deadline=None)
@given(members=members_st, counts=counts_st, seed=st.integers(0, 2**32))
def test_uniform_homogeneous_is_complete_and_balanced_from_any_current(
    members: list[str], counts: dict[str, int], seed: int
) -> None:
    rng = random.Random(seed)
    topics = frozenset(counts)
    subscriptions = {m: topics for m in members}
    # Any current, even a skewed or overlapping one, must give a complete, balanced result.
    current = {
        m: frozenset(tp for tp in _all_partitions(subscriptions, counts) if rng.random() < 0.3)
        for m in members
    }
    assignment = uniform_assign(subscriptions, counts, current)
    _assert_complete(assignment, subscriptions, counts)
    assert _spread(assignment) <= 1


@settings(max_examples=150, deadline=None)
@given(members=members_st, counts=counts_st, seed=st.integers(0, 2**32))
def test_uniform_heterogeneous_is_complete(members: list[str], counts: dict[str, int], seed: int) -> None:
    rng = random.Random(seed)
    topics = sorted(counts)
    subscriptions = {m: frozenset(rng.sample(topics, rng.randint(1, len(topics)))) for m in members}
    assignment = uniform_assign(subscriptions, counts, {})
    _assert_complete(assignment, subscriptions, counts)
    # Balance is best effort, but no member may sit two below another that owns a
    # partition it could take.
    for a in members:
        for b in members:
            if len(assignment[a]) - len(assignment[b]) >= 2:
                assert not any(t in subscriptions[b] for t, _ in assignment[a])


@settings(max_examples=100, deadline=None)
@given(members=members_st, counts=counts_st, newcomer=st.text("xyz", min_size=4, max_size=4))
def test_uniform_join_takes_only_what_balance_requires(
    members: list[str], counts: dict[str, int], newcomer: str
) -> None:
    topics = frozenset(counts)
    before = uniform_assign({m: topics for m in members}, counts, {})
    grown = {m: topics for m in [*members, newcomer]}
    after = uniform_assign(grown, counts, before)
    _assert_complete(after, grown, counts)
    floor_quota = len(_all_partitions(grown, counts)) // len(grown)
    for m in members:
        assert after[m] <= before[m], "a staying member gained partitions when one joined"
        assert len(before[m] - after[m]) <= max(0, len(before[m]) - floor_quota)


@settings(max_examples=100, deadline=None)
@given(members=members_st.filter(lambda ms: len(ms) >= 2), counts=counts_st, leaver_index=st.integers(0, 100))
def test_uniform_leave_keeps_everything_of_staying_members(
    members: list[str], counts: dict[str, int], leaver_index: int
) -> None:
    topics = frozenset(counts)
    before = uniform_assign({m: topics for m in members}, counts, {})
    leaver = members[leaver_index % len(members)]
    staying = {m: topics for m in members if m != leaver}
    after = uniform_assign(staying, counts, before)
    _assert_complete(after, staying, counts)
    assert _spread(after) <= 1
    for m in staying:
        assert before[m] <= after[m]


@settings(max_examples=50, deadline=None)
@given(members=members_st, counts=counts_st, seed=st.integers(0, 2**32))
def test_assignors_are_deterministic_whatever_the_input_order(
    members: list[str], counts: dict[str, int], seed: int
) -> None:
    rng = random.Random(seed)
    topics = sorted(counts)
    subscriptions = {m: frozenset(rng.sample(topics, rng.randint(1, len(topics)))) for m in members}
    shuffled_members = list(subscriptions.items())
    rng.shuffle(shuffled_members)
    shuffled = dict(shuffled_members)
    for name, assignor in ASSIGNORS.items():
        first = assignor(subscriptions, counts, {}, {})
        assert assignor(shuffled, dict(reversed(list(counts.items()))), {}, {}) == first, name
        _assert_complete(first, subscriptions, counts)


def test_range_layout_matches_kafka_range_assignor() -> None:
    # Kafka's RangeAssignor javadoc: C0, C1 over t0, t1 with three partitions each.
    both = frozenset({"t0", "t1"})
    assert range_assign({"C1": both, "C0": both}, {"t0": 3, "t1": 3}) == {
        "C0": frozenset({("t0", 0), ("t0", 1), ("t1", 0), ("t1", 1)}),
        "C1": frozenset({("t0", 2), ("t1", 2)}),
    }
    # Seven partitions over three: the first 7 % 3 members get one more.
    layout = range_assign({m: frozenset({"t"}) for m in ["c", "a", "b"]}, {"t": 7})
    assert layout == {
        "a": frozenset({("t", 0), ("t", 1), ("t", 2)}),
        "b": frozenset({("t", 3), ("t", 4)}),
        "c": frozenset({("t", 5), ("t", 6)}),
    }


def test_range_sorts_static_members_by_instance_id_so_a_restart_keeps_its_range() -> None:
    subs = {"m-old": frozenset({"t"}), "z": frozenset({"t"})}
    before = range_assign(subs, {"t": 4}, {"m-old": "instance-a"})
    # The same instance restarts under a member id that sorts after "z".
    after = range_assign(
        {"zz-new": frozenset({"t"}), "z": frozenset({"t"})}, {"t": 4}, {"zz-new": "instance-a"}
    )
    assert after["zz-new"] == before["m-old"] == frozenset({("t", 0), ("t", 1)})


def test_uniform_thousand_partitions_over_hundred_members_is_fast() -> None:
    members = [f"member-{i:03d}" for i in range(100)]
    topics = frozenset(f"topic-{i}" for i in range(10))
    counts = dict.fromkeys(topics, 100)
    subscriptions = {m: topics for m in members}
    # Worst case for stickiness: the current target has everything on one member.
    skewed = {members[0]: frozenset(_all_partitions(subscriptions, counts))}
    seconds = min(timeit.repeat(lambda: uniform_assign(subscriptions, counts, skewed), number=1, repeat=3))
    assert seconds < 0.25
    heterogeneous = {m: frozenset(sorted(topics)[: 1 + i % 10]) for i, m in enumerate(members)}
    seconds = min(timeit.repeat(lambda: uniform_assign(heterogeneous, counts, {}), number=1, repeat=3))
    assert seconds < 0.5
    assert _spread(uniform_assign(subscriptions, counts, skewed)) == 0
