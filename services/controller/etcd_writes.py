"""A controller result's writes as fenced etcd transactions: the commit step of the event loop
(event_loop.py: decide, commit here, replay, send).

Each results.Write maps to its compares and operations (etcd_ops); the writes of one event go
to etcd in transactions of at most ETCD_TXN_OPS_MAX operations, every one fenced by the
controller epoch (coordinator.election.fenced_txn). Bookkeeping kept in memory only
(ReplicaStatesWrite, ShuttingDownWrite) maps to no operation: it is replayed, not committed.
"""

from __future__ import annotations

import asyncio
from typing import Any

from coordinator import values
from coordinator.election import fenced_txn
from coordinator.keys import Keys
from coordinator.store import Delete as EtcdDelete
from coordinator.store import EtcdStore, Op, Put, compare_missing, compare_version
from services.controller.context import LeaderAndIsr, TopicInfo
from services.controller.results import (
    AdminKeyDelete,
    ConfigWrite,
    DeletionMark,
    ReplicaStatesWrite,
    ShuttingDownWrite,
    StateWrite,
    TopicDelete,
    TopicWrite,
    Write,
)

# etcd refuses transactions with more operations than --max-txn-ops (default 128).
ETCD_TXN_OPS_MAX = 100

# One write's part of a transaction: its compares and its operations.
TxnPart = tuple[list[Any], list[Op]]


# ---- the context's types -> etcd values (reading them: metadata_image.py) --------------------


def encode_topic(topic: TopicInfo) -> bytes:
    return values.encode_topic_assignment(
        topic.topic_id, topic.assignment, topic.adding_replicas, topic.removing_replicas
    )


def encode_partition_state(state: LeaderAndIsr) -> bytes:
    return values.encode_partition_state(state.leader, state.leader_epoch, state.isr, state.controller_epoch)


def etcd_ops(keys: Keys, write: Write) -> TxnPart:
    """The compares and operations that commit one write (none for in-memory bookkeeping)."""
    if isinstance(write, StateWrite):
        key = keys.partition_state(*write.tp)
        return [compare_version(key, write.expected_version)], [Put(key, encode_partition_state(write.state))]
    if isinstance(write, TopicWrite):
        key = keys.topic(write.topic.name)
        compares = [compare_missing(key)] if write.create else []
        return compares, [Put(key, encode_topic(write.topic))]
    if isinstance(write, ConfigWrite):
        return [], [Put(keys.topic_config(write.topic), values.encode_topic_configs(write.configs))]
    if isinstance(write, AdminKeyDelete):
        return [], [EtcdDelete(write.key)]
    if isinstance(write, DeletionMark):
        return [], [Put(keys.delete_topic(write.topic), values.DELETE_TOPIC_MARK)]
    if isinstance(write, (ReplicaStatesWrite, ShuttingDownWrite)):
        return [], []
    if isinstance(write, TopicDelete):
        return [], [
            EtcdDelete(keys.topic(write.topic)),
            EtcdDelete(keys.topic_partitions_prefix(write.topic), prefix=True),
            EtcdDelete(keys.topic_config(write.topic)),
            EtcdDelete(keys.delete_topic(write.topic)),
        ]
    raise TypeError(f"unknown write {write!r}")


def txn_chunks(keys: Keys, writes: list[Write]) -> list[list[TxnPart]]:
    """The writes' operations, in order, cut into transactions of at most ETCD_TXN_OPS_MAX ops
    (a write's operations are never split between two)."""
    chunks: list[list[TxnPart]] = [[]]
    ops_in_chunk = 0
    for write in writes:
        compares, ops = etcd_ops(keys, write)
        if not ops:
            continue  # bookkeeping kept in memory only: replayed, not committed
        if ops_in_chunk + len(ops) > ETCD_TXN_OPS_MAX and chunks[-1]:
            chunks.append([])
            ops_in_chunk = 0
        chunks[-1].append((compares, ops))
        ops_in_chunk += len(ops)
    return [c for c in chunks if c]


def disjoint(chunks: list[list[TxnPart]]) -> bool:
    """No key in two of the transactions and no prefix delete in any: their order does not matter."""
    keys_per_chunk = [{op.key for _, ops in chunk for op in ops} for chunk in chunks]
    prefixed = any(getattr(op, "prefix", False) for chunk in chunks for _, ops in chunk for op in ops)
    return not prefixed and sum(len(keys) for keys in keys_per_chunk) == len(set().union(*keys_per_chunk))


async def commit(store: EtcdStore, epoch: int, writes: list[Write]) -> int:
    """Commit the writes in fenced transactions of at most ETCD_TXN_OPS_MAX ops; returns how many.

    Transactions that touch disjoint keys go to etcd together (one round trip and,
    etcd batching them, about one disk sync instead of one each: a failover of 1,000
    partitions is 10 of them). If a key appears in two of them, or a prefix delete in
    any, they go one by one, in order. Either way a refused one raises (ControllerFenced when
    the epoch moved on, RuntimeError when a compared key changed), and the caller reloads the
    state from etcd.
    """
    chunks = txn_chunks(store.keys, writes)
    if disjoint(chunks) and len(chunks) > 1:
        results = await asyncio.gather(
            *(_commit_chunk(store, epoch, chunk) for chunk in chunks), return_exceptions=True
        )
        for outcome in results:
            if isinstance(outcome, BaseException):
                raise outcome
    else:
        for chunk in chunks:
            await _commit_chunk(store, epoch, chunk)
    return len(chunks)


async def _commit_chunk(store: EtcdStore, epoch: int, chunk: list[TxnPart]) -> None:
    compares = [c for cs, _ in chunk for c in cs]
    ops = [o for _, os in chunk for o in os]
    txn = await fenced_txn(store, epoch, compares, ops)
    if not txn.succeeded:
        raise RuntimeError(f"etcd rejected a controller write ({len(ops)} ops): a key changed under us")
