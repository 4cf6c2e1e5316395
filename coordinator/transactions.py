"""The transaction coordinator's durable state in etcd (issue 41; docs/ARCHITECTURE.md,
"Transactions"): one value per transactional id at `Keys.transaction_state`, changed only by
compare-and-swap on its mod revision, so a deposed coordinator's late write fails instead of
overwriting its successor's decision.

Bytes only: the value's format and its types are services/transactions/state.py's (the etcd
layer knows no service's types); a commit's group offsets are written here, in the same etcd
transaction, in coordinator/values.py's consumer offset format.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from coordinator import values
from coordinator.store import Delete, MetadataStore, Put, compare_mod_revision


@dataclass(frozen=True, slots=True)
class PublishedOffset:
    """A consumer group's offset a committing transaction makes visible."""

    group: str
    topic: str
    partition: int
    offset: int
    metadata: str
    leader_epoch: int


async def read_transaction_value(store: MetadataStore, transactional_id: str) -> tuple[bytes | None, int]:
    """The id's stored value (None: none) and its mod revision (0: none), to pass back to a write."""
    kv = await store.get(store.keys.transaction_state(transactional_id))
    return (None, 0) if kv is None else (kv.value, kv.mod_revision)


async def read_transaction_values(store: MetadataStore) -> dict[str, tuple[bytes, int]]:
    """Every stored transactional id's value and mod revision, by transactional id (from the key)."""
    kvs, _ = await store.get_prefix(store.keys.transactions_prefix)
    found: dict[str, tuple[bytes, int]] = {}
    for kv in kvs:
        transactional_id = store.keys.parse_transaction_key(kv.key)
        if transactional_id is not None:
            found[transactional_id] = (kv.value, kv.mod_revision)
    return found


async def write_transaction_value(
    store: MetadataStore,
    transactional_id: str,
    value: bytes,
    mod_revision: int,
    publish: Sequence[PublishedOffset] = (),
    commit_time_ms: int = 0,
) -> int:
    """Write `value` if the key is still at `mod_revision` (0: still absent), with `publish`'s
    group offsets in the same etcd transaction (a commit completing: visible exactly once).
    Returns the key's new mod revision; 0 when another write came first and nothing was
    written (read again)."""
    key = store.keys.transaction_state(transactional_id)
    ops = [Put(key, value)]
    for o in publish:
        ops.append(
            Put(
                store.keys.consumer_offset(o.group, o.topic, o.partition),
                values.encode_consumer_offset(o.offset, o.metadata, o.leader_epoch, commit_time_ms),
            )
        )
    result = await store.txn([compare_mod_revision(key, mod_revision)], ops)
    return result.revision if result.succeeded else 0


async def delete_transaction(store: MetadataStore, transactional_id: str, mod_revision: int) -> bool:
    """Delete the state if the key is still at `mod_revision`. False: it changed; read again."""
    key = store.keys.transaction_state(transactional_id)
    result = await store.txn([compare_mod_revision(key, mod_revision)], [Delete(key)])
    return result.succeeded
