"""Replica placement for new topics and partitions: pure, deterministic.

Kafka's rack-aware assignment, simplified: brokers are ordered so that racks
alternate (rack A broker, rack B broker, rack C broker, rack A broker, ...);
partition p's first replica (its preferred leader) is broker (start + p) in
that order, and followers are taken further along the ring, shifted per
"round" so that leaders and followers both spread evenly. With one replica
per rack while racks remain, a topic with replication factor <= racks has
every partition spread over distinct racks.
"""

from __future__ import annotations

from collections.abc import Mapping

from clients.common.errors import InvalidPartitions, InvalidReplicationFactor, check


def rack_alternating_order(broker_racks: Mapping[int, str]) -> list[int]:
    """Broker ids with racks interleaved: [a1, b1, c1, a2, b2, ...]."""
    by_rack: dict[str, list[int]] = {}
    for broker_id in sorted(broker_racks):
        by_rack.setdefault(broker_racks[broker_id], []).append(broker_id)
    racks = sorted(by_rack)
    ordered: list[int] = []
    i = 0
    while len(ordered) < len(broker_racks):
        for rack in racks:
            if i < len(by_rack[rack]):
                ordered.append(by_rack[rack][i])
        i += 1
    return ordered


def assign_replicas(
    broker_racks: Mapping[int, str],
    num_partitions: int,
    replication_factor: int,
    *,
    start_index: int = 0,
    first_partition: int = 0,
) -> dict[int, tuple[int, ...]]:
    """partition -> replicas (preferred leader first) for partitions [first_partition, +num_partitions)."""
    if num_partitions <= 0:
        raise InvalidPartitions(f"number of partitions must be >= 1, got {num_partitions}")
    if replication_factor <= 0:
        raise InvalidReplicationFactor(f"replication factor must be >= 1, got {replication_factor}")
    if replication_factor > len(broker_racks):
        raise InvalidReplicationFactor(
            f"replication factor {replication_factor} is larger than the {len(broker_racks)} live brokers "
            f"{sorted(broker_racks)}; start more brokers or lower the replication factor"
        )
    order = rack_alternating_order(broker_racks)
    n = len(order)
    racks_count = len(set(broker_racks.values()))
    result: dict[int, tuple[int, ...]] = {}
    for i in range(num_partitions):
        p = first_partition + i
        first = (start_index + p) % n
        # Shift followers by one more slot every full round so follower sets vary.
        shift = 1 + (p // n) % max(n - 1, 1)
        replicas = [order[first]]
        used_racks = {broker_racks[order[first]]}
        k = 0
        while len(replicas) < replication_factor:
            candidate = order[(first + shift + k) % n]
            k += 1
            if candidate in replicas:
                continue
            rack = broker_racks[candidate]
            # Prefer a new rack while some rack is still unused by this partition.
            if rack in used_racks and len(used_racks) < racks_count and k <= n:
                continue
            replicas.append(candidate)
            used_racks.add(rack)
        check(
            len(set(replicas)) == replication_factor,
            "assignment of partition %d repeats a broker: %s",
            p,
            replicas,
        )
        result[p] = tuple(replicas)
    return result
