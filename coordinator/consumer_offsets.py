"""Simple (non-member) offset commits, committed-offset reads and group deletion, for the
brokers' Kafka listener (services/kafka/backend.py) and the gateway's DeleteGroups
(services/gateway/groups.py). Stored where the gateway's CommitOffsets stores them
(`/consumers/{group}/offsets/{topic}/{p}`, values.encode_consumer_offset), so a group's
offsets are one set whichever protocol wrote them.

A committed offset is stored as the committer gave it, negative ones included (Kafka's
coordinator does not check the value: kafkajs' resetOffsets commits -2 for "earliest", -1 for
"latest"); every reader takes a negative one as no usable position and resets per its
auto.offset.reset."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from clients.common.types import TopicPartitionKey
from coordinator import values
from coordinator.store import Compare, Delete, KeyValue, MetadataStore, Put, compare_mod_revision
from services.groups.offset_commits import Commit, changed_commits


@dataclass
class StoredGroup:
    """What etcd holds of one group: its KIP-848 coordinator state (None: none) with that
    key's mod revision (0: absent), and its committed offsets. A group with neither does not
    exist in etcd."""

    state: bytes | None = None
    state_mod_revision: int = 0
    offsets: dict[TopicPartitionKey, values.CommittedOffsetValue] = field(default_factory=dict)
    other_keys: int = 0  # member liveness keys


def _stored_groups(store: MetadataStore, kvs: Iterable[KeyValue]) -> dict[str, StoredGroup]:
    groups: dict[str, StoredGroup] = {}
    for kv in kvs:
        parsed = store.keys.parse_consumer_group_key(kv.key)
        if parsed is None:
            continue
        group, kind, _ = parsed
        stored = groups.setdefault(group, StoredGroup())
        offset = store.keys.parse_consumer_offset(kv.key)
        if kind == "state":
            stored.state, stored.state_mod_revision = kv.value, kv.mod_revision
        elif offset is not None:
            stored.offsets[(offset[1], offset[2])] = values.decode_consumer_offset(kv.value)
        else:
            stored.other_keys += 1
    return groups


async def read_group(store: MetadataStore, group: str) -> StoredGroup | None:
    """The group as etcd holds it; None when etcd holds nothing of it."""
    kvs, _ = await store.get_prefix(store.keys.consumer_group_prefix(group))
    return _stored_groups(store, kvs).get(group)


async def stored_groups(store: MetadataStore) -> dict[str, StoredGroup]:
    """Every group etcd holds something of (state, members or committed offsets)."""
    kvs, _ = await store.get_prefix(store.keys.consumers_prefix)
    return _stored_groups(store, kvs)


async def delete_group_if_state_unchanged(store: MetadataStore, group: str, state_mod_revision: int) -> bool:
    """Delete every key of the group (state, committed offsets) in one transaction that
    requires its state to be the one the caller found without members (mod revision 0: still
    absent), so a member that joined meanwhile keeps its group. False: it changed."""
    result = await store.txn(
        [compare_mod_revision(store.keys.consumer_group_state(group), state_mod_revision)],
        [Delete(store.keys.consumer_group_prefix(group), prefix=True)],
    )
    return result.succeeded


async def delete_offsets_if_state_unchanged(
    store: MetadataStore, group: str, state_mod_revision: int, partitions: Sequence[TopicPartitionKey]
) -> bool:
    """Delete these committed offsets in one transaction that requires the group's state to
    be the one the caller checked the partitions against. False: it changed."""
    result = await store.txn(
        [compare_mod_revision(store.keys.consumer_group_state(group), state_mod_revision)],
        [Delete(store.keys.consumer_offset(group, topic, partition)) for topic, partition in partitions],
    )
    return result.succeeded


async def read_group_state(store: MetadataStore, group: str) -> tuple[bytes | None, int]:
    """The group's coordinator state value (None: no state) and its mod revision (0: none)."""
    kv = await store.get(store.keys.consumer_group_state(group))
    return (None, 0) if kv is None else (kv.value, kv.mod_revision)


async def commit_if_state_unchanged(
    store: MetadataStore,
    group: str,
    state_mod_revision: int,
    offsets: Sequence[tuple[str, int, int, str, int]],
    commit_time_ms: int,
) -> bool:
    """Write (topic, partition, offset, metadata, leader_epoch) commits in one transaction that
    also requires the group's state to be the one the caller checked (mod revision 0: still
    absent), so a group that gained members meanwhile does not get them. False: it changed.
    Offsets already stored as given are not written again (commit_changed)."""
    guard = compare_mod_revision(store.keys.consumer_group_state(group), state_mod_revision)
    return await commit_changed(store, group, guard, [Commit(*o) for o in offsets], commit_time_ms)


async def commit_changed(
    store: MetadataStore,
    group: str,
    guard: Compare,
    commits: Sequence[Commit],
    commit_time_ms: int,
) -> bool:
    """Write the commits that differ from the stored ones, all in one transaction (one etcd
    revision) guarded by `guard`. False: the guard failed and nothing was written.

    Every commit is an etcd write that stays in etcd's history until compacted, and consumers
    commit the same positions again and again while idle; so the group's offsets are read
    first (a read costs etcd no space) and an unchanged one is skipped, keeping the commit
    time of its first commit (the rule: services/groups/offset_commits.py). When nothing
    changed nothing is written and the guard is not checked: the commit then takes effect at
    the read, where the stored offsets already were the committed ones."""
    stored = await committed_offsets(store, group)
    ops = [
        Put(
            store.keys.consumer_offset(group, c.topic, c.partition),
            values.encode_consumer_offset(c.offset, c.metadata, c.leader_epoch, commit_time_ms),
        )
        for c in changed_commits(stored, commits)
    ]
    if not ops:
        return True
    result = await store.txn([guard], ops)
    return result.succeeded


async def committed_offsets(
    store: MetadataStore, group: str
) -> dict[TopicPartitionKey, values.CommittedOffsetValue]:
    """Every committed offset of the group."""
    kvs, _ = await store.get_prefix(store.keys.consumer_group_prefix(group))
    stored: dict[TopicPartitionKey, values.CommittedOffsetValue] = {}
    for kv in kvs:
        parsed = store.keys.parse_consumer_offset(kv.key)
        if parsed is not None:
            stored[(parsed[1], parsed[2])] = values.decode_consumer_offset(kv.value)
    return stored
