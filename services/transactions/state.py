"""A transactional id's durable state as stored in etcd (issue 41; docs/ARCHITECTURE.md,
"Transactions"): its format, and the typed reads and compare-and-swap writes the driver makes
through coordinator/transactions.py, which moves the bytes (every etcd call stays in
coordinator/, and the etcd layer knows nothing of the coordinator's types).

The value is a versioned JSON object, as coordinator/values.py spells the others; the rules that
produce it are services/transactions/coordinator.py. Decoders raise ValueError, KeyError or
TypeError on a malformed value, UnknownFormatVersion on a newer format, and InvariantViolation
on a value no coordinator could have written.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from coordinator import consumer_offsets, values
from coordinator import transactions as stored
from coordinator.store import MetadataStore
from services.groups.coordinator import GroupState
from services.groups.errors import GroupError
from services.transactions.coordinator import (
    STORED_STATES,
    GroupOffsets,
    PendingOffset,
    TxnMetadata,
    TxnState,
    check_invariants,
)
from services.transactions.group_fencing import check_txn_offset_commit

# The format versions of a transactional id's state this release reads; it writes the last.
TRANSACTION_STATE_VERSIONS = (1,)


# ---- /transactions/{transactional id} --------------------------------------------------------


def encode_transaction_state(meta: TxnMetadata) -> bytes:
    """{"version": 1, "transactional_id", "producer_id", "producer_epoch", "last_producer_id",
    "last_producer_epoch", "state" (Kafka's name), "timeout_ms", "partitions": [[topic, p]],
    "groups", "pending_offsets": {group: [[topic, p, offset, metadata, leader_epoch]]},
    "start_time_ms", "last_update_ms"}: sorted, compact (values.json_bytes), lists sorted, so
    equal states are equal bytes. Raises InvariantViolation for a state that is never stored."""
    check_invariants(meta)
    if meta.state not in STORED_STATES:
        raise ValueError(f"transaction state {meta.state.value} is a step within one operation, never stored")
    return values.json_bytes(
        {
            "version": TRANSACTION_STATE_VERSIONS[-1],
            "transactional_id": meta.transactional_id,
            "producer_id": meta.producer_id,
            "producer_epoch": meta.producer_epoch,
            "last_producer_id": meta.last_producer_id,
            "last_producer_epoch": meta.last_producer_epoch,
            "state": meta.state.value,
            "timeout_ms": meta.timeout_ms,
            "partitions": [[t, p] for t, p in sorted(meta.partitions)],
            "groups": sorted(meta.groups),
            "pending_offsets": {
                g: _offsets_to_json(meta.pending_offsets[g]) for g in sorted(meta.pending_offsets)
            },
            "start_time_ms": meta.start_time_ms,
            "last_update_ms": meta.last_update_ms,
        }
    )


def decode_transaction_state(raw: bytes) -> TxnMetadata:
    d = json.loads(raw)
    if isinstance(d, dict) and "version" not in d:
        # Every version writes the field (unlike values.py's older formats): none means damage.
        raise KeyError("transaction state has no version field")
    values.checked_version("transaction state", d, TRANSACTION_STATE_VERSIONS)
    state = TxnState(d["state"])
    if state not in STORED_STATES:
        raise ValueError(f"transaction state {state.value} is never stored")
    meta = TxnMetadata(
        transactional_id=str(d["transactional_id"]),
        producer_id=int(d["producer_id"]),
        producer_epoch=int(d["producer_epoch"]),
        state=state,
        timeout_ms=int(d["timeout_ms"]),
        last_producer_id=int(d["last_producer_id"]),
        last_producer_epoch=int(d["last_producer_epoch"]),
        partitions=frozenset((str(t), int(p)) for t, p in d["partitions"]),
        groups=frozenset(str(g) for g in d["groups"]),
        pending_offsets={str(g): _offsets_from_json(o) for g, o in d["pending_offsets"].items()},
        start_time_ms=int(d["start_time_ms"]),
        last_update_ms=int(d["last_update_ms"]),
    )
    check_invariants(meta)
    return meta


def _offsets_to_json(offsets: GroupOffsets) -> list[list[Any]]:
    return [[t, p, o.offset, o.metadata, o.leader_epoch] for (t, p), o in sorted(offsets.items())]


def _offsets_from_json(rows: list[list[Any]]) -> dict[tuple[str, int], PendingOffset]:
    return {(str(t), int(p)): PendingOffset(int(o), str(m), int(e)) for t, p, o, m, e in rows}


# ---- typed reads and compare-and-swap writes ----------------------------------------------------


async def read_transaction(store: MetadataStore, transactional_id: str) -> tuple[TxnMetadata | None, int]:
    """The id's state (None: none) and its mod revision (0: none), to pass back to a write."""
    raw, revision = await stored.read_transaction_value(store, transactional_id)
    return (None, 0) if raw is None else (decode_transaction_state(raw), revision)


async def read_transactions(store: MetadataStore) -> dict[str, tuple[TxnMetadata, int]]:
    """Every stored transactional id's state and mod revision: what a new coordinator resumes
    (prepared transactions' markers, timeouts) and ListTransactions shows."""
    return {
        tid: (decode_transaction_state(raw), revision)
        for tid, (raw, revision) in (await stored.read_transaction_values(store)).items()
    }


async def write_transaction(
    store: MetadataStore,
    meta: TxnMetadata,
    mod_revision: int,
    publish: Mapping[str, GroupOffsets] | None = None,
    commit_time_ms: int = 0,
) -> int:
    """Write the state if the key is still at `mod_revision` (0: still absent), with `publish`'s
    group offsets in the same etcd transaction (a commit completing: visible exactly once).
    Returns the key's new mod revision; 0 when another write came first and nothing was
    written (read again)."""
    offsets = [
        stored.PublishedOffset(group, topic, partition, o.offset, o.metadata, o.leader_epoch)
        for group in sorted(publish or {})
        for (topic, partition), o in sorted((publish or {})[group].items())
    ]
    return await stored.write_transaction_value(
        store, meta.transactional_id, encode_transaction_state(meta), mod_revision, offsets, commit_time_ms
    )


delete_transaction = stored.delete_transaction


# ---- the group a TxnOffsetCommit names ------------------------------------------------------------


async def txn_offset_commit_member_check(
    store: MetadataStore, group: str, member_id: str, member_epoch: int
) -> GroupError:
    """KIP-447's check of a TxnOffsetCommit against the group's stored coordinator state
    (group_fencing.py's rule): GroupError.NONE when it may go on."""
    raw, _ = await consumer_offsets.read_group_state(store, group)
    state = None if raw is None else GroupState.from_record(json.loads(raw))
    refusal = check_txn_offset_commit(state, member_id, member_epoch)
    return GroupError.NONE if refusal is None else refusal
