"""The gateway's transaction views and operator abort (services/gateway/transactions_admin.py) over
the real driver on an in-memory etcd, its markers and producer ids recorded."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from coordinator.memory_store import MemoryStore
from coordinator.store import Compare, Op
from protos.highwater.v1 import common_pb2, gateway_pb2
from services.gateway.transactions_admin import TransactionsAdmin
from services.transactions import coordinator as rules
from services.transactions.driver import TransactionDriver
from services.transactions.state import read_transaction
from tests.unit.test_transaction_driver import Clock, Markers, ProducerIds

TIMEOUT_MS = 60_000


def setup() -> tuple[TransactionsAdmin, TransactionDriver, Markers, MemoryStore, Clock]:
    store, markers, clock = MemoryStore(), Markers(), Clock()
    driver = TransactionDriver(store, markers, ProducerIds(), clock=clock)
    return TransactionsAdmin(store, driver, clock=clock), driver, markers, store, clock


async def open_transaction(
    driver: TransactionDriver, tid: str, partitions: list[tuple[str, int]]
) -> tuple[int, int]:
    init = await driver.handle(rules.InitProducerId(tid, TIMEOUT_MS))
    assert init.error is rules.TxnError.NONE, init
    added = await driver.handle(
        rules.AddPartitionsToTxn(tid, init.producer_id, init.producer_epoch, frozenset(partitions))
    )
    assert added.error is rules.TxnError.NONE, added
    return init.producer_id, init.producer_epoch


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def test_list_filters_and_describe_show_what_etcd_holds() -> None:
    admin, driver, _, _, clock = setup()

    async def scenario() -> tuple[Any, Any, Any, Any, Any]:
        await open_transaction(driver, "open", [("a", 0), ("b", 2)])
        await driver.handle(rules.InitProducerId("idle", TIMEOUT_MS))
        clock.now_ms += 5_000
        everything = await admin.list_transactions(gateway_pb2.ListTransactionsRequest())
        ongoing = await admin.list_transactions(gateway_pb2.ListTransactionsRequest(states=["Ongoing"]))
        old = await admin.list_transactions(gateway_pb2.ListTransactionsRequest(older_than_ms=10_000_000))
        bad = await admin.list_transactions(gateway_pb2.ListTransactionsRequest(states=["Sleeping"]))
        described = await admin.describe_transactions(
            gateway_pb2.DescribeTransactionsRequest(transactional_ids=["open", "nobody", ""])
        )
        return everything, ongoing, old, bad, described

    everything, ongoing, old, bad, described = run(scenario())
    assert [(t.transactional_id, t.state) for t in everything.transactions] == [
        ("idle", "Empty"),
        ("open", "Ongoing"),
    ]
    assert [t.transactional_id for t in ongoing.transactions] == ["open"]
    assert list(old.transactions) == [], "open for 5 s, not 10,000 s"
    assert list(bad.unknown_state_filters) == ["Sleeping"]
    found, missing, invalid = described.transactions
    assert found.error_code == common_pb2.NONE and found.state == "Ongoing"
    assert [(p.topic, p.partition) for p in found.partitions] == [("a", 0), ("b", 2)]
    assert found.transaction_timeout_ms == TIMEOUT_MS and found.transaction_start_time_ms > 0
    assert missing.error_code == common_pb2.TRANSACTIONAL_ID_NOT_FOUND
    assert invalid.error_code == common_pb2.INVALID_REQUEST


def test_abort_fences_the_producer_and_writes_the_abort_markers() -> None:
    admin, driver, markers, store, _ = setup()

    async def scenario() -> tuple[Any, Any, Any]:
        pid, epoch = await open_transaction(driver, "hanging", [("a", 1)])
        aborted = await admin.abort_transaction(
            gateway_pb2.AbortTransactionRequest(transactional_id="hanging")
        )
        await driver.drain()
        meta, _ = await read_transaction(store, "hanging")
        late = await driver.handle(rules.EndTxn("hanging", pid, epoch, commit=True))
        return (pid, epoch, aborted), meta, late

    (pid, epoch, aborted), meta, late = run(scenario())
    assert aborted.error_code == common_pb2.NONE, aborted
    assert (aborted.producer_id, aborted.producer_epoch) == (pid, epoch + 1), "the epoch is bumped: fenced"
    assert markers.marked() == {(pid, epoch + 1, False, ("a", 1))}
    assert meta is not None and meta.state is rules.TxnState.COMPLETE_ABORT
    assert late.error is rules.TxnError.PRODUCER_FENCED, "the old producer's commit is refused"


def test_abort_of_nothing_open_or_of_no_id_is_refused_by_name() -> None:
    admin, driver, markers, _, _ = setup()

    async def scenario() -> tuple[Any, Any, Any]:
        await driver.handle(rules.InitProducerId("idle", TIMEOUT_MS))
        idle = await admin.abort_transaction(gateway_pb2.AbortTransactionRequest(transactional_id="idle"))
        unknown = await admin.abort_transaction(
            gateway_pb2.AbortTransactionRequest(transactional_id="nobody")
        )
        empty = await admin.abort_transaction(gateway_pb2.AbortTransactionRequest(transactional_id=""))
        return idle, unknown, empty

    idle, unknown, empty = run(scenario())
    assert idle.error_code == common_pb2.INVALID_TXN_STATE and "EMPTY" in idle.error_message
    assert unknown.error_code == common_pb2.TRANSACTIONAL_ID_NOT_FOUND
    assert empty.error_code == common_pb2.INVALID_REQUEST
    assert markers.calls == []


class RacedStore(MemoryStore):
    """An etcd where another writer rewrites each key a transaction guards just before the
    transaction runs, `races` times: the abort's compare-and-swap is lost and must read again."""

    def __init__(self) -> None:
        super().__init__()
        self.races = 0

    async def txn(
        self, compares: Sequence[Compare], success: Sequence[Op], failure: Sequence[Op] = ()
    ) -> Any:
        if self.races > 0:
            self.races -= 1
            for compare in compares:
                current = await self.get(compare.key)
                if current is not None:
                    await self.put(compare.key, current.value)  # same value, a newer mod revision
        return await super().txn(compares, success, failure)


def test_abort_after_a_lost_compare_and_swap_reads_again_and_aborts() -> None:
    store, markers, clock = RacedStore(), Markers(), Clock()
    driver = TransactionDriver(store, markers, ProducerIds(), clock=clock)
    admin = TransactionsAdmin(store, driver, clock=clock)

    async def scenario() -> tuple[int, int, Any, Any]:
        pid, epoch = await open_transaction(driver, "raced", [("a", 0)])
        store.races = 1
        aborted = await admin.abort_transaction(gateway_pb2.AbortTransactionRequest(transactional_id="raced"))
        await driver.drain()
        meta, _ = await read_transaction(store, "raced")
        return pid, epoch, aborted, meta

    pid, epoch, aborted, meta = run(scenario())
    assert aborted.error_code == common_pb2.NONE, aborted
    assert store.races == 0, "the race happened"
    assert (aborted.producer_id, aborted.producer_epoch) == (pid, epoch + 1)
    assert meta is not None and meta.state is rules.TxnState.COMPLETE_ABORT


def test_abort_of_a_committed_transaction_is_refused_and_etcd_down_is_named() -> None:
    admin, driver, _, store, _ = setup()

    async def scenario() -> tuple[Any, Any, Any, Any]:
        pid, epoch = await open_transaction(driver, "done", [("a", 0)])
        committed = await driver.handle(rules.EndTxn("done", pid, epoch, commit=True))
        assert committed.error is rules.TxnError.NONE, committed
        await driver.drain()
        after_commit = await admin.abort_transaction(
            gateway_pb2.AbortTransactionRequest(transactional_id="done")
        )
        store.set_available(False)
        down = await admin.abort_transaction(gateway_pb2.AbortTransactionRequest(transactional_id="done"))
        listed = await admin.list_transactions(gateway_pb2.ListTransactionsRequest())
        described = await admin.describe_transactions(
            gateway_pb2.DescribeTransactionsRequest(transactional_ids=["done"])
        )
        return after_commit, down, listed, described

    after_commit, down, listed, described = run(scenario())
    assert after_commit.error_code == common_pb2.INVALID_TXN_STATE
    assert "COMPLETE_COMMIT" in after_commit.error_message, after_commit.error_message
    for answer in (down, listed, described.transactions[0]):
        assert answer.error_code == common_pb2.COORDINATOR_NOT_AVAILABLE, answer
        assert "etcd" in answer.error_message
