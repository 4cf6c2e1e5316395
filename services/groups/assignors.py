"""Server-side partition assignors of a consumer group (KIP-848): pure and deterministic.

An assignor maps each member to the partitions it should own (the group's *target
assignment*). Both assignors here are deterministic functions of their arguments: every
tie is broken by a sort key (member id, or instance id for static members), never by hash
or set iteration order, so two coordinators given the same inputs compute the same target
and a restarted coordinator rebuilds it exactly.

- `range_assign` is Kafka's RangeAssignor: per topic, contiguous ranges over the sorted
  subscribers, the first `partitions % subscribers` of them one partition longer.
- `uniform_assign` is Kafka's UniformAssignor: sticky (a member keeps what it has in the
  current target while that is still valid and within its share) and balanced (with
  identical subscriptions the counts differ by at most one; otherwise every partition of a
  subscribed topic is assigned and balance is best effort).

Every partition of a subscribed, existing topic is assigned to exactly one subscriber of
that topic; a topic nobody subscribes to is not assigned.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Mapping

from clients.common.errors import check
from clients.common.types import TopicPartitionKey

Assignment = dict[str, frozenset[TopicPartitionKey]]
# member id -> what sorts it among subscribers; a static member sorts by its instance id so
# that a restart (new member id, same instance id) keeps its place, hence its range.
SortKeys = Mapping[str, str]
# (subscriptions, topic partition counts, current target, sort keys) -> new target.
Assignor = Callable[
    [Mapping[str, frozenset[str]], Mapping[str, int], Mapping[str, frozenset[TopicPartitionKey]], SortKeys],
    Assignment,
]


def _member_order(members: list[str] | set[str] | frozenset[str], sort_keys: SortKeys) -> list[str]:
    return sorted(members, key=lambda member_id: (sort_keys.get(member_id, member_id), member_id))


def _partitions_of(topic: str, topic_partitions: Mapping[str, int]) -> list[TopicPartitionKey]:
    return [(topic, p) for p in range(topic_partitions.get(topic, 0))]


def _subscribed_partitions(
    subscriptions: Mapping[str, frozenset[str]], topic_partitions: Mapping[str, int]
) -> list[TopicPartitionKey]:
    topics = sorted({topic for topics in subscriptions.values() for topic in topics})
    return [tp for topic in topics for tp in _partitions_of(topic, topic_partitions)]


def range_assign(
    subscriptions: Mapping[str, frozenset[str]],
    topic_partitions: Mapping[str, int],
    sort_keys: SortKeys | None = None,
) -> Assignment:
    """Kafka's RangeAssignor: per topic, contiguous ranges over the subscribers in sort order.

    With P partitions and n subscribers of a topic, each gets P // n and the first P % n
    one more, so two co-partitioned topics land partition-for-partition on the same member.
    """
    keys = sort_keys or {}
    result: dict[str, set[TopicPartitionKey]] = {member_id: set() for member_id in subscriptions}
    for topic in sorted({topic for topics in subscriptions.values() for topic in topics}):
        count = topic_partitions.get(topic, 0)
        subscribers = _member_order([m for m, topics in subscriptions.items() if topic in topics], keys)
        per_member, extra = divmod(count, len(subscribers))
        start = 0
        for index, member_id in enumerate(subscribers):
            length = per_member + (1 if index < extra else 0)
            result[member_id].update((topic, p) for p in range(start, start + length))
            start += length
        check(start == count, "range over %s covered %d of %d partitions", topic, start, count)
    assignment = {member_id: frozenset(tps) for member_id, tps in result.items()}
    _check_complete(assignment, subscriptions, topic_partitions)
    return assignment


def uniform_assign(
    subscriptions: Mapping[str, frozenset[str]],
    topic_partitions: Mapping[str, int],
    current: Mapping[str, frozenset[TopicPartitionKey]],
    sort_keys: SortKeys | None = None,
) -> Assignment:
    """Kafka's UniformAssignor: sticky first, then balanced.

    A current pair is *valid* while its member is still subscribed to the topic and the
    partition still exists. Valid pairs are kept; with identical subscriptions each member
    keeps at most its quota (P // n, or one more for the P % n members that already own
    the most), which makes counts differ by at most one while moving the fewest
    partitions. Unassigned partitions go to the least-loaded eligible member.
    """
    keys = sort_keys or {}
    members = _member_order(set(subscriptions), keys)
    if not members:
        return {}
    kept = _valid_current(members, subscriptions, topic_partitions, current)
    if len({subscriptions[m] for m in members}) == 1:
        assignment = _assign_homogeneous(members, subscriptions, topic_partitions, kept)
    else:
        assignment = _assign_heterogeneous(members, subscriptions, topic_partitions, kept)
    _check_complete(assignment, subscriptions, topic_partitions)
    return assignment


def _valid_current(
    members: list[str],
    subscriptions: Mapping[str, frozenset[str]],
    topic_partitions: Mapping[str, int],
    current: Mapping[str, frozenset[TopicPartitionKey]],
) -> dict[str, list[TopicPartitionKey]]:
    """Each member's still-valid current partitions, sorted; a partition claimed twice goes to the first."""
    claimed: set[TopicPartitionKey] = set()
    kept: dict[str, list[TopicPartitionKey]] = {}
    for member_id in members:
        valid = []
        for topic, partition in sorted(current.get(member_id, frozenset())):
            still_exists = 0 <= partition < topic_partitions.get(topic, 0)
            if topic in subscriptions[member_id] and still_exists and (topic, partition) not in claimed:
                valid.append((topic, partition))
                claimed.add((topic, partition))
        kept[member_id] = valid
    return kept


def _assign_homogeneous(
    members: list[str],
    subscriptions: Mapping[str, frozenset[str]],
    topic_partitions: Mapping[str, int],
    kept: dict[str, list[TopicPartitionKey]],
) -> Assignment:
    all_partitions = _subscribed_partitions(subscriptions, topic_partitions)
    base, extra = divmod(len(all_partitions), len(members))
    order = {m: i for i, m in enumerate(members)}
    # The members that already own the most get the `extra` longer quotas: fewest moves.
    by_current_load = sorted(members, key=lambda m: (-len(kept[m]), order[m]))
    quota = {m: base + (1 if i < extra else 0) for i, m in enumerate(by_current_load)}
    owned = {m: kept[m][: quota[m]] for m in members}
    taken = {tp for tps in owned.values() for tp in tps}
    # Least loaded first, ties by member order; a member at its quota leaves the heap.
    heap = [(len(owned[m]), order[m], m) for m in members if len(owned[m]) < quota[m]]
    heapq.heapify(heap)
    for tp in all_partitions:
        if tp in taken:
            continue
        check(bool(heap), "no member below quota for %s (quotas %s)", tp, quota)
        load, rank, member_id = heapq.heappop(heap)
        owned[member_id].append(tp)
        if load + 1 < quota[member_id]:
            heapq.heappush(heap, (load + 1, rank, member_id))
    return {m: frozenset(tps) for m, tps in owned.items()}


def _assign_heterogeneous(
    members: list[str],
    subscriptions: Mapping[str, frozenset[str]],
    topic_partitions: Mapping[str, int],
    kept: dict[str, list[TopicPartitionKey]],
) -> Assignment:
    """Keep every valid pair, place the rest on the least loaded subscriber, then even out.

    Topics with the fewest subscribers are placed first: they have the least freedom. The
    balancing pass moves one partition at a time from a member to an eligible one at least
    two lighter; each move lowers the sum of squared loads, so it ends.
    """
    order = {m: i for i, m in enumerate(members)}
    owned: dict[str, set[TopicPartitionKey]] = {m: set(kept[m]) for m in members}
    taken = {tp for tps in owned.values() for tp in tps}
    subscribers_of: dict[str, list[str]] = {}
    for member_id in members:
        for topic in subscriptions[member_id]:
            subscribers_of.setdefault(topic, []).append(member_id)
    for topic in sorted(subscribers_of, key=lambda t: (len(subscribers_of[t]), t)):
        for tp in _partitions_of(topic, topic_partitions):
            if tp not in taken:
                receiver = min(subscribers_of[topic], key=lambda m: (len(owned[m]), order[m]))
                owned[receiver].add(tp)
                taken.add(tp)
    moves_max = len(taken) ** 2 + 1  # the sum of squared loads, an upper bound on the moves
    for _ in range(moves_max):
        move = _balancing_move(members, subscriptions, owned, order)
        if move is None:
            break
        donor, receiver, tp = move
        owned[donor].remove(tp)
        owned[receiver].add(tp)
    else:
        check(False, "balancing did not settle within %d moves", moves_max)
    return {m: frozenset(tps) for m, tps in owned.items()}


def _balancing_move(
    members: list[str],
    subscriptions: Mapping[str, frozenset[str]],
    owned: dict[str, set[TopicPartitionKey]],
    order: dict[str, int],
) -> tuple[str, str, TopicPartitionKey] | None:
    """The first (heaviest donor, lightest receiver) pair that can move a partition, if any."""
    donors = sorted(members, key=lambda m: (-len(owned[m]), order[m]))
    receivers = sorted(members, key=lambda m: (len(owned[m]), order[m]))
    for donor in donors:
        for receiver in receivers:
            if len(owned[donor]) - len(owned[receiver]) < 2:
                break
            movable = [tp for tp in owned[donor] if tp[0] in subscriptions[receiver]]
            if movable:
                return donor, receiver, max(movable)
    return None


def _check_complete(
    assignment: Assignment, subscriptions: Mapping[str, frozenset[str]], topic_partitions: Mapping[str, int]
) -> None:
    """Every partition of a subscribed topic is assigned once, to a subscriber of its topic."""
    seen: set[TopicPartitionKey] = set()
    for member_id, tps in assignment.items():
        for tp in tps:
            check(tp not in seen, "%s assigned twice (again to %s)", tp, member_id)
            check(tp[0] in subscriptions[member_id], "%s given to %s, not subscribed", tp, member_id)
            seen.add(tp)
    expected = set(_subscribed_partitions(subscriptions, topic_partitions))
    check(seen == expected, "assignment covers %d partitions, subscriptions %d", len(seen), len(expected))


def _range(
    subscriptions: Mapping[str, frozenset[str]],
    topic_partitions: Mapping[str, int],
    current: Mapping[str, frozenset[TopicPartitionKey]],
    sort_keys: SortKeys,
) -> Assignment:
    del current  # the range layout depends on membership only, never on history
    return range_assign(subscriptions, topic_partitions, sort_keys)


ASSIGNORS: dict[str, Assignor] = {"uniform": uniform_assign, "range": _range}
DEFAULT_ASSIGNOR = "uniform"
