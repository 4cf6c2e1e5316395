"""The transaction coordinator's durable state (services/transactions/state.py over
coordinator/transactions.py, Keys.transaction_state):
the versioned value format, its keys, and compare-and-swap writes on the in-memory etcd."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest

from clients.common.errors import InvariantViolation
from coordinator import values
from coordinator.keys import Keys
from coordinator.memory_store import MemoryStore
from services.transactions.coordinator import PendingOffset, TxnMetadata, TxnState
from services.transactions.state import (
    decode_transaction_state,
    delete_transaction,
    encode_transaction_state,
    read_transaction,
    read_transactions,
    write_transaction,
)

ONGOING = TxnMetadata(
    transactional_id="app/task-0",
    producer_id=1000,
    producer_epoch=3,
    state=TxnState.ONGOING,
    timeout_ms=60_000,
    last_producer_id=1000,
    last_producer_epoch=2,
    partitions=frozenset({("b", 0), ("a", 1)}),
    groups=frozenset({"g"}),
    pending_offsets={"g": {("a", 0): PendingOffset(42, "meta", 7)}},
    start_time_ms=100,
    last_update_ms=120,
)
# The bytes of version 1, pinned: etcd holds them across releases (docs/UPGRADING.md).
ONGOING_V1 = (
    b'{"groups":["g"],"last_producer_epoch":2,"last_producer_id":1000,"last_update_ms":120,'
    b'"partitions":[["a",1],["b",0]],"pending_offsets":{"g":[["a",0,42,"meta",7]]},'
    b'"producer_epoch":3,"producer_id":1000,"start_time_ms":100,"state":"Ongoing",'
    b'"timeout_ms":60000,"transactional_id":"app/task-0","version":1}'
)
EMPTY = TxnMetadata("t", 5, 0, TxnState.EMPTY, 1_000, last_update_ms=1)


def test_version_1_bytes_are_pinned_and_read_back() -> None:
    assert encode_transaction_state(ONGOING) == ONGOING_V1
    assert decode_transaction_state(ONGOING_V1) == ONGOING


@pytest.mark.parametrize("state", [TxnState.EMPTY, TxnState.COMPLETE_COMMIT, TxnState.COMPLETE_ABORT])
def test_idle_states_round_trip(state: TxnState) -> None:
    meta = TxnMetadata("t", 5, 0, state, 1_000, last_update_ms=1)
    assert decode_transaction_state(encode_transaction_state(meta)) == meta


@pytest.mark.parametrize("state", [TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT])
def test_prepared_states_round_trip(state: TxnState) -> None:
    meta = TxnMetadata("t", 5, 0, state, 1_000, partitions=frozenset({("a", 0)}), start_time_ms=0)
    assert decode_transaction_state(encode_transaction_state(meta)) == meta


def test_a_newer_version_is_refused_by_name() -> None:
    raw = ONGOING_V1.replace(b'"version":1', b'"version":2')
    with pytest.raises(values.UnknownFormatVersion, match="transaction state has format version 2"):
        decode_transaction_state(raw)


def test_a_value_without_a_version_is_damage() -> None:
    with pytest.raises(KeyError, match="version"):
        decode_transaction_state(ONGOING_V1.replace(b',"version":1', b""))


@pytest.mark.parametrize("state", [TxnState.PREPARE_EPOCH_FENCE, TxnState.DEAD])
def test_steps_within_one_operation_are_never_stored(state: TxnState) -> None:
    with pytest.raises((ValueError, InvariantViolation)):
        encode_transaction_state(
            TxnMetadata("t", 5, 0, state, 1_000, partitions=frozenset({("a", 0)}), start_time_ms=0)
        )
    raw = encode_transaction_state(EMPTY).replace(b'"Empty"', f'"{state.value}"'.encode())
    with pytest.raises(ValueError, match="never stored"):
        decode_transaction_state(raw)


def test_a_stored_value_breaking_an_invariant_is_loud() -> None:
    raw = encode_transaction_state(EMPTY).replace(b'"partitions":[]', b'"partitions":[["a",0]]')
    with pytest.raises(InvariantViolation, match="still holds"):
        decode_transaction_state(raw)


def test_transaction_keys_take_any_id_and_read_back() -> None:
    keys = Keys("/hw")
    for tid in ("app/task-0", "a b%c", "ünï", "x"):
        key = keys.transaction_state(tid)
        assert key.startswith("/hw/transactions/") and "/" not in key[len("/hw/transactions/") :]
        assert keys.parse_transaction_key(key) == tid
    assert keys.parse_transaction_key("/hw/transactions/") is None
    assert keys.parse_transaction_key(keys.consumer_group_state("g")) is None
    with pytest.raises(ValueError, match="non-empty"):
        keys.transaction_state("")


def test_compare_and_swap_writes_reads_publishes_and_deletes() -> None:
    async def scenario() -> None:
        store = MemoryStore()
        assert await read_transaction(store, "app/task-0") == (None, 0)
        assert await write_transaction(store, ONGOING, 0)
        meta, revision = await read_transaction(store, "app/task-0")
        assert meta == ONGOING and revision > 0
        # A deposed coordinator's write on the old revision (absent) fails and changes nothing.
        assert not await write_transaction(store, replace(EMPTY, transactional_id="app/task-0"), 0)
        assert (await read_transaction(store, "app/task-0"))[0] == ONGOING
        # Completing a commit publishes its offsets in the same transaction.
        done = TxnMetadata("app/task-0", 1000, 3, TxnState.COMPLETE_COMMIT, 60_000, last_update_ms=130)
        assert await write_transaction(
            store, done, revision, {"g": {("a", 0): PendingOffset(42, "meta", 7)}}, 130
        )
        offset = await store.get(store.keys.consumer_offset("g", "a", 0))
        assert offset is not None
        assert values.decode_consumer_offset(offset.value) == {
            "offset": 42,
            "metadata": "meta",
            "leader_epoch": 7,
            "commit_time_ms": 130,
        }
        everything = await read_transactions(store)
        assert list(everything) == ["app/task-0"] and everything["app/task-0"][0] == done
        assert not await delete_transaction(store, "app/task-0", revision)
        assert await delete_transaction(store, "app/task-0", everything["app/task-0"][1])
        assert await read_transactions(store) == {}

    asyncio.run(scenario())
