"""Simple (non-member) offset commits and committed-offset reads, for the brokers' Kafka
listener (services/kafka/backend.py). Stored where the gateway's CommitOffsets stores them
(`/consumers/{group}/offsets/{topic}/{p}`, values.encode_consumer_offset), so a group's
offsets are one set whichever protocol wrote them."""

from __future__ import annotations

from collections.abc import Sequence

from clients.common.types import TopicPartitionKey
from coordinator import values
from coordinator.store import MetadataStore, Put, compare_mod_revision


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
    absent), so a group that gained members meanwhile does not get them. False: it changed."""
    ops = [
        Put(
            store.keys.consumer_offset(group, topic, partition),
            values.encode_consumer_offset(offset, metadata, leader_epoch, commit_time_ms),
        )
        for topic, partition, offset, metadata, leader_epoch in offsets
    ]
    result = await store.txn(
        [compare_mod_revision(store.keys.consumer_group_state(group), state_mod_revision)], ops
    )
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
