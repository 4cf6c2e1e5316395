"""The transaction coordinator's driver (services/transactions/driver.py; issue 41) against a
real etcd: a commit completes once its markers are written; a driver dropped after storing
PrepareCommit is replaced by one whose recover() writes the markers and completes; two drivers
on separate etcd connections racing on one id get one outcome; a timeout aborts through tick().

Markers go to a recording MarkerWriter (the brokers' WriteTxnMarkers is tested on its own);
every wait is bounded by asyncio.wait_for.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from typing import Any, cast

import pytest
import pytest_asyncio

from coordinator.etcd_server import EtcdServer
from coordinator.store import EtcdStore, KeyValue, MetadataStore
from services.transactions.coordinator import (
    AddPartitionsToTxn,
    EndTxn,
    InitProducerId,
    TopicPartitions,
    TxnAnswer,
    TxnError,
    TxnState,
)
from services.transactions.driver import MARKER_WRITTEN, TransactionDriver
from services.transactions.state import read_transaction

TID = "orders/task-7"
TIMEOUT_MS = 2_000
A0, B3 = ("orders", 0), ("audit", 3)
# Generous for one etcd round trip on a loaded 2-core machine.
STEP_WAIT_S_MAX = 20.0


class Clock:
    def __init__(self, now_ms: int) -> None:
        self.now_ms = now_ms

    def __call__(self) -> int:
        return self.now_ms


class Markers:
    """Records every marker; `gate`, when set, holds each call until opened (a coordinator that
    dies before any marker leaves)."""

    def __init__(self) -> None:
        self.written: set[tuple[int, int, bool, tuple[str, int]]] = set()
        self.gate: asyncio.Event | None = None

    async def write_markers(
        self, producer_id: int, producer_epoch: int, commit: bool, partitions: TopicPartitions
    ) -> Mapping[tuple[str, int], str]:
        if self.gate is not None:
            await self.gate.wait()
        self.written |= {(producer_id, producer_epoch, commit, tp) for tp in partitions}
        return dict.fromkeys(partitions, MARKER_WRITTEN)


class ProducerIds:
    def __init__(self, first: int) -> None:
        self.next = first

    async def allocate_producer_id(self) -> int:
        self.next += 1
        return self.next - 1


class MeetingStore:
    """An EtcdStore whose first read of the id's state waits for the other driver's first read,
    so both decide on the same revision and one compare-and-swap must lose."""

    def __init__(self, store: EtcdStore, met: asyncio.Event, arrived: list[int]) -> None:
        self._store = store
        self._met = met
        self._arrived = arrived
        self._waited = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    async def get(self, key: str) -> KeyValue | None:
        kv = await self._store.get(key)
        if not self._waited and key == self._store.keys.transaction_state(TID):
            self._waited = True
            self._arrived.append(1)
            if len(self._arrived) == 2:
                self._met.set()
            await asyncio.wait_for(self._met.wait(), STEP_WAIT_S_MAX)
        return kv


@pytest_asyncio.fixture
async def second_store(etcd_server: EtcdServer, etcd_store: EtcdStore) -> AsyncIterator[EtcdStore]:
    """Another connection to the same etcd and key prefix: a second coordinator process's."""
    store = await EtcdStore.connect(etcd_server.endpoint, prefix=etcd_store.keys.prefix)
    try:
        yield store
    finally:
        await store.close()


async def step(call: Any) -> Any:
    return await asyncio.wait_for(call, STEP_WAIT_S_MAX)


async def begin(driver: TransactionDriver, *partitions: tuple[str, int]) -> TxnAnswer:
    init = await step(driver.handle(InitProducerId(TID, TIMEOUT_MS)))
    assert init.error is TxnError.NONE, init
    added = await step(
        driver.handle(AddPartitionsToTxn(TID, init.producer_id, init.producer_epoch, frozenset(partitions)))
    )
    assert added.error is TxnError.NONE, added
    return cast(TxnAnswer, init)


async def stored_state(store: MetadataStore) -> TxnState | None:
    meta, _ = await step(read_transaction(store, TID))
    return None if meta is None else meta.state


@pytest.mark.asyncio
async def test_commit_completes_once_markers_are_written(etcd_store: EtcdStore) -> None:
    markers = Markers()
    driver = TransactionDriver(etcd_store, markers, ProducerIds(500), clock=Clock(10_000))
    try:
        init = await begin(driver, A0, B3)
        answer = await step(driver.handle(EndTxn(TID, init.producer_id, init.producer_epoch, commit=True)))
        assert answer.error is TxnError.NONE
        await step(driver.drain())
        assert markers.written == {(500, 0, True, A0), (500, 0, True, B3)}
        assert await stored_state(etcd_store) is TxnState.COMPLETE_COMMIT
    finally:
        await driver.close()


@pytest.mark.asyncio
async def test_a_dropped_driver_s_commit_is_completed_by_the_next_one(
    etcd_store: EtcdStore, second_store: EtcdStore
) -> None:
    clock = Clock(10_000)
    dying_markers = Markers()
    dying_markers.gate = asyncio.Event()  # never opened: it dies before any marker
    dying = TransactionDriver(etcd_store, dying_markers, ProducerIds(500), clock=clock)
    try:
        init = await begin(dying, A0, B3)
        answer = await step(dying.handle(EndTxn(TID, init.producer_id, init.producer_epoch, commit=True)))
        assert answer.error is TxnError.NONE
    finally:
        await dying.close()
    assert dying_markers.written == set()
    assert await stored_state(etcd_store) is TxnState.PREPARE_COMMIT

    markers = Markers()
    successor = TransactionDriver(second_store, markers, ProducerIds(900), clock=clock)
    try:
        assert await step(successor.recover()) == [TID]
        assert markers.written == {(500, 0, True, A0), (500, 0, True, B3)}
        assert await stored_state(etcd_store) is TxnState.COMPLETE_COMMIT
    finally:
        await successor.close()


@pytest.mark.asyncio
async def test_two_drivers_racing_on_one_id_keep_one_answer(
    etcd_store: EtcdStore, second_store: EtcdStore
) -> None:
    clock = Clock(10_000)
    met: asyncio.Event = asyncio.Event()
    arrived: list[int] = []
    first = TransactionDriver(
        cast(MetadataStore, MeetingStore(etcd_store, met, arrived)), Markers(), ProducerIds(500), clock=clock
    )
    second = TransactionDriver(
        cast(MetadataStore, MeetingStore(second_store, met, arrived)),
        Markers(),
        ProducerIds(900),
        clock=clock,
    )
    try:
        # Both find no state and allocate an id; one creation wins, the other re-reads and
        # fences the winner with an epoch bump of the winner's id (never its own id).
        one, other = await step(
            asyncio.gather(
                first.handle(InitProducerId(TID, TIMEOUT_MS)), second.handle(InitProducerId(TID, TIMEOUT_MS))
            )
        )
        assert one.error is TxnError.NONE and other.error is TxnError.NONE
        assert one.producer_id == other.producer_id, (one, other)
        assert sorted([one.producer_epoch, other.producer_epoch]) == [0, 1]
        meta, _ = await step(read_transaction(etcd_store, TID))
        assert meta is not None and (meta.producer_id, meta.producer_epoch) == (one.producer_id, 1)
    finally:
        await first.close()
        await second.close()


@pytest.mark.asyncio
async def test_a_timed_out_transaction_is_aborted_by_tick(etcd_store: EtcdStore) -> None:
    clock = Clock(10_000)
    markers = Markers()
    driver = TransactionDriver(etcd_store, markers, ProducerIds(500), clock=clock)
    try:
        init = await begin(driver, A0)
        assert (await step(driver.tick(10_000 + TIMEOUT_MS))).aborted == ()
        clock.now_ms = 10_001 + TIMEOUT_MS
        assert (await step(driver.tick(clock.now_ms))).aborted == (TID,)
        await step(driver.drain())
        assert markers.written == {(500, 1, False, A0)}
        assert await stored_state(etcd_store) is TxnState.COMPLETE_ABORT
        late = await step(driver.handle(EndTxn(TID, init.producer_id, init.producer_epoch, commit=True)))
        assert late.error is TxnError.PRODUCER_FENCED
    finally:
        await driver.close()
