"""The transaction coordinator's driver (services/transactions/driver.py; issue 41) on the
in-memory etcd: the pure rules applied by compare-and-swap, markers through a test double,
completion, recovery by a new driver, timeouts and expiry through tick(), and placement."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any

import pytest

from coordinator import values
from coordinator.memory_store import MemoryStore
from coordinator.store import Compare, KeyValue, Op, TxnResult
from protos.highwater.v1 import common_pb2
from services.common import limits
from services.kafka.classic_groups import coordinator_of
from services.kafka.handler_common import BackendUnavailable
from services.transactions import metrics
from services.transactions.coordinator import (
    AddOffsetsToTxn,
    AddPartitionsToTxn,
    EndTxn,
    InitProducerId,
    PendingOffset,
    TopicPartitions,
    TxnAnswer,
    TxnError,
    TxnOffsetCommit,
    TxnState,
)
from services.transactions.driver import (
    MARKER_WRITTEN,
    ProducerIdUnavailable,
    TransactionDriver,
)
from services.transactions.hosting import ControllerProducerIds, transaction_coordinator_of
from services.transactions.state import read_transaction

TID = "app/task-0"
TIMEOUT_MS = 5_000
A0, B1 = ("a", 0), ("b", 1)


class Clock:
    def __init__(self, now_ms: int = 1_000) -> None:
        self.now_ms = now_ms

    def __call__(self) -> int:
        return self.now_ms


class Markers:
    """MarkerWriter double: records each call; `failing` partitions answer an error for as many
    calls as their count says; `gate` (when set) holds every call until opened."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, int, bool, TopicPartitions]] = []
        self.failing: dict[tuple[str, int], int] = {}
        self.gate: asyncio.Event | None = None

    async def write_markers(
        self, producer_id: int, producer_epoch: int, commit: bool, partitions: TopicPartitions
    ) -> Mapping[tuple[str, int], str]:
        if self.gate is not None:
            await self.gate.wait()
        self.calls.append((producer_id, producer_epoch, commit, partitions))
        answer = {}
        for tp in partitions:
            if self.failing.get(tp, 0) > 0:
                self.failing[tp] -= 1
                answer[tp] = "NOT_LEADER_OR_FOLLOWER"
            else:
                answer[tp] = MARKER_WRITTEN
        return answer

    def marked(self) -> set[tuple[int, int, bool, tuple[str, int]]]:
        return {(pid, epoch, commit, tp) for pid, epoch, commit, tps in self.calls for tp in tps}


class ProducerIds:
    def __init__(self, first: int = 1000) -> None:
        self.next = first
        self.allocated: list[int] = []

    async def allocate_producer_id(self) -> int:
        self.allocated.append(self.next)
        self.next += 1
        return self.allocated[-1]


class YieldingStore(MemoryStore):
    """MemoryStore that lets other tasks run before each read and write, so two drivers'
    read-decide-write steps interleave as they do against a real etcd."""

    async def get(self, key: str) -> KeyValue | None:
        await asyncio.sleep(0)
        return await super().get(key)

    async def txn(
        self, compares: Sequence[Compare], success: Sequence[Op], failure: Sequence[Op] = ()
    ) -> TxnResult:
        await asyncio.sleep(0)
        return await super().txn(compares, success, failure)


class AlwaysRacedStore(MemoryStore):
    """Another writer touches every transaction key just before each of our transactions."""

    def __init__(self) -> None:
        super().__init__()
        self.lost = 0

    async def txn(
        self, compares: Sequence[Compare], success: Sequence[Op], failure: Sequence[Op] = ()
    ) -> TxnResult:
        for c in compares:
            kv = await self.get(c.key)
            if kv is not None:
                await self.put(c.key, kv.value)
        result = await super().txn(compares, success, failure)
        self.lost += not result.succeeded
        return result


def make_driver(
    store: MemoryStore, clock: Clock, markers: Markers | None = None, pids: ProducerIds | None = None
) -> tuple[TransactionDriver, Markers, ProducerIds]:
    markers = markers or Markers()
    pids = pids or ProducerIds()
    return TransactionDriver(store, markers, pids, clock=clock), markers, pids


async def begin(driver: TransactionDriver, *partitions: tuple[str, int]) -> TxnAnswer:
    init = await driver.handle(InitProducerId(TID, TIMEOUT_MS))
    assert init.error is TxnError.NONE, init
    added = await driver.handle(
        AddPartitionsToTxn(TID, init.producer_id, init.producer_epoch, frozenset(partitions))
    )
    assert added.error is TxnError.NONE, added
    return init


async def state(store: MemoryStore) -> TxnState | None:
    meta, _ = await read_transaction(store, TID)
    return None if meta is None else meta.state


@pytest.mark.asyncio
async def test_init_allocates_from_the_source_once_then_bumps_the_epoch() -> None:
    store = MemoryStore()
    driver, _, pids = make_driver(store, Clock())
    first = await driver.handle(InitProducerId(TID, TIMEOUT_MS))
    second = await driver.handle(InitProducerId(TID, TIMEOUT_MS))
    assert (first.error, first.producer_id, first.producer_epoch) == (TxnError.NONE, 1000, 0)
    assert (second.error, second.producer_id, second.producer_epoch) == (TxnError.NONE, 1000, 1)
    assert pids.allocated == [1000]
    assert await state(store) is TxnState.EMPTY


@pytest.mark.asyncio
async def test_commit_writes_every_marker_then_completes() -> None:
    store = MemoryStore()
    driver, markers, _ = make_driver(store, Clock())
    committed_before = metrics.TRANSACTIONS_COMPLETED.labels("commit")._value.get()
    init = await begin(driver, A0, B1)
    assert await state(store) is TxnState.ONGOING
    answer = await driver.handle(EndTxn(TID, init.producer_id, init.producer_epoch, commit=True))
    assert answer.error is TxnError.NONE
    await driver.drain()
    assert markers.marked() == {(1000, 0, True, A0), (1000, 0, True, B1)}
    assert await state(store) is TxnState.COMPLETE_COMMIT
    assert metrics.TRANSACTIONS_COMPLETED.labels("commit")._value.get() == committed_before + 1
    # The next transaction may begin at once.
    again = await driver.handle(AddPartitionsToTxn(TID, 1000, 0, frozenset({A0})))
    assert again.error is TxnError.NONE


@pytest.mark.asyncio
async def test_offsets_of_a_commit_become_visible_only_with_its_completion() -> None:
    store = MemoryStore()
    driver, markers, _ = make_driver(store, Clock())
    init = await begin(driver, A0)
    pid, epoch = init.producer_id, init.producer_epoch
    assert (await driver.handle(AddOffsetsToTxn(TID, pid, epoch, "g"))).error is TxnError.NONE
    offsets = {("in", 0): PendingOffset(42)}
    assert (await driver.handle(TxnOffsetCommit(TID, pid, epoch, "g", offsets))).error is TxnError.NONE
    markers.gate = asyncio.Event()
    assert (await driver.handle(EndTxn(TID, pid, epoch, commit=True))).error is TxnError.NONE
    await asyncio.sleep(0)
    assert await state(store) is TxnState.PREPARE_COMMIT
    assert await store.get(store.keys.consumer_offset("g", "in", 0)) is None
    markers.gate.set()
    await driver.drain()
    kv = await store.get(store.keys.consumer_offset("g", "in", 0))
    assert kv is not None and values.decode_consumer_offset(kv.value)["offset"] == 42
    assert await state(store) is TxnState.COMPLETE_COMMIT


@pytest.mark.asyncio
async def test_a_new_driver_recovers_a_commit_its_predecessor_prepared() -> None:
    store = MemoryStore()
    clock = Clock()
    old, old_markers, _ = make_driver(store, clock)
    old_markers.gate = asyncio.Event()  # the old coordinator dies before any marker is written
    init = await begin(old, A0, B1)
    answer = await old.handle(EndTxn(TID, init.producer_id, init.producer_epoch, commit=True))
    assert answer.error is TxnError.NONE
    await old.close()
    assert old_markers.calls == [] and await state(store) is TxnState.PREPARE_COMMIT

    new, markers, _ = make_driver(store, clock)
    assert await new.recover() == [TID]
    assert markers.marked() == {(1000, 0, True, A0), (1000, 0, True, B1)}
    assert await state(store) is TxnState.COMPLETE_COMMIT


@pytest.mark.asyncio
async def test_recover_leaves_ids_another_coordinator_owns() -> None:
    store = MemoryStore()
    old, old_markers, _ = make_driver(store, Clock())
    old_markers.gate = asyncio.Event()
    init = await begin(old, A0)
    await old.handle(EndTxn(TID, init.producer_id, init.producer_epoch, commit=False))
    await old.close()
    other = TransactionDriver(store, Markers(), ProducerIds(), clock=Clock(), owns=lambda tid: tid != TID)
    assert await other.recover() == []
    assert await state(store) is TxnState.PREPARE_ABORT


@pytest.mark.asyncio
async def test_two_drivers_racing_on_one_id_give_one_outcome() -> None:
    store = YieldingStore()
    clock = Clock()
    first, first_markers, _ = make_driver(store, clock)
    init = await begin(first, A0)
    second, second_markers, _ = make_driver(store, clock)
    commit, abort = await asyncio.gather(
        first.handle(EndTxn(TID, init.producer_id, init.producer_epoch, commit=True)),
        second.handle(EndTxn(TID, init.producer_id, init.producer_epoch, commit=False)),
    )
    await first.drain()
    await second.drain()
    # Both read Ongoing; the swap lets the first decide, the second re-reads and refuses.
    assert commit.error is TxnError.NONE
    assert abort.error is TxnError.INVALID_TXN_STATE, abort
    assert await state(store) is TxnState.COMPLETE_COMMIT
    assert {commit for _, _, commit, _ in first_markers.calls + second_markers.calls} == {True}


@pytest.mark.asyncio
async def test_a_swap_lost_every_time_answers_concurrent_transactions() -> None:
    store = AlwaysRacedStore()
    driver, _, _ = make_driver(store, Clock())
    # The first init creates the key without a race (nothing to touch yet); the next one races.
    assert (await driver.handle(InitProducerId(TID, TIMEOUT_MS))).error is TxnError.NONE
    bumped = await driver.handle(InitProducerId(TID, TIMEOUT_MS))
    assert bumped.error is TxnError.CONCURRENT_TRANSACTIONS
    assert "retry" in bumped.message
    assert store.lost == limits.TRANSACTION_CAS_ATTEMPTS_MAX


@pytest.mark.asyncio
async def test_tick_aborts_a_timed_out_transaction_and_fences_its_producer() -> None:
    store = MemoryStore()
    clock = Clock(1_000)
    driver, markers, _ = make_driver(store, clock)
    init = await begin(driver, A0)
    timeouts_before = metrics.TRANSACTION_TIMEOUTS._value.get()
    aborts_before = metrics.TRANSACTIONS_COMPLETED.labels("abort")._value.get()
    assert (await driver.tick(1_000 + TIMEOUT_MS)).aborted == ()
    clock.now_ms = 1_000 + TIMEOUT_MS + 1
    report = await driver.tick(clock.now_ms)
    assert report.aborted == (TID,)
    await driver.drain()
    assert metrics.TRANSACTION_TIMEOUTS._value.get() == timeouts_before + 1
    assert metrics.TRANSACTIONS_COMPLETED.labels("abort")._value.get() == aborts_before + 1
    assert markers.marked() == {(1000, 1, False, A0)}  # the fence epoch, one past the producer's
    assert await state(store) is TxnState.COMPLETE_ABORT
    late = await driver.handle(EndTxn(TID, init.producer_id, init.producer_epoch, commit=True))
    assert late.error is TxnError.PRODUCER_FENCED


@pytest.mark.asyncio
async def test_tick_expires_an_idle_id() -> None:
    store = MemoryStore()
    clock = Clock(1_000)
    driver, _, _ = make_driver(store, clock)
    await driver.handle(InitProducerId(TID, TIMEOUT_MS))
    assert (await driver.tick(1_000 + limits.TRANSACTIONAL_ID_EXPIRATION_MS)).expired == ()
    report = await driver.tick(1_001 + limits.TRANSACTIONAL_ID_EXPIRATION_MS)
    assert report.expired == (TID,)
    assert await state(store) is None


@pytest.mark.asyncio
async def test_markers_are_retried_for_failed_partitions_only() -> None:
    store = MemoryStore()
    driver, markers, _ = make_driver(store, Clock())
    markers.failing[B1] = 1
    init = await begin(driver, A0, B1)
    await driver.handle(EndTxn(TID, init.producer_id, init.producer_epoch, commit=True))
    await driver.drain()
    assert [tps for _, _, _, tps in markers.calls] == [frozenset({A0, B1}), frozenset({B1})]
    assert await state(store) is TxnState.COMPLETE_COMMIT


@pytest.mark.asyncio
async def test_unwritable_markers_stay_prepared_until_a_tick(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(limits, "TRANSACTION_MARKER_ROUNDS_MAX", 2)
    monkeypatch.setattr(limits, "TRANSACTION_MARKER_RETRY_BACKOFF_MS", 0)
    store = MemoryStore()
    clock = Clock()
    driver, markers, _ = make_driver(store, clock)
    markers.failing[A0] = 2
    init = await begin(driver, A0)
    await driver.handle(EndTxn(TID, init.producer_id, init.producer_epoch, commit=False))
    await driver.drain()
    assert await state(store) is TxnState.PREPARE_ABORT
    assert (await driver.tick(clock.now_ms)).resumed == (TID,)
    await driver.drain()
    assert await state(store) is TxnState.COMPLETE_ABORT


def test_placement_is_classic_groups() -> None:
    brokers = [3, 1, 2]
    for tid in ("a", "b", TID, "x" * 100):
        assert transaction_coordinator_of(tid, brokers) == coordinator_of(tid, brokers)
        assert transaction_coordinator_of(tid, brokers) == transaction_coordinator_of(tid, [1, 2, 3])
    assert transaction_coordinator_of(TID, []) is None


@pytest.mark.asyncio
async def test_producer_ids_come_from_the_controllers_init_producer_id() -> None:
    sent: list[tuple[str, Any]] = []

    async def call(rpc: str, request: Any) -> Any:
        sent.append((rpc, request))
        return common_pb2.InitProducerIdResponse(producer_id=77, producer_epoch=0)

    assert await ControllerProducerIds(call).allocate_producer_id() == 77
    assert sent[0][0] == "InitProducerId" and sent[0][1].producer_id == -1

    async def refused(rpc: str, request: Any) -> Any:
        return common_pb2.InitProducerIdResponse(error_code=common_pb2.NOT_CONTROLLER)

    with pytest.raises(ProducerIdUnavailable, match="NOT_CONTROLLER"):
        await ControllerProducerIds(refused).allocate_producer_id()

    async def down(rpc: str, request: Any) -> Any:
        raise BackendUnavailable("no active controller registered in etcd")

    with pytest.raises(ProducerIdUnavailable, match="no active controller"):
        await ControllerProducerIds(down).allocate_producer_id()


@pytest.mark.asyncio
async def test_no_producer_id_now_is_a_retriable_answer() -> None:
    class NoIds:
        async def allocate_producer_id(self) -> int:
            raise ProducerIdUnavailable("no active controller")

    driver = TransactionDriver(MemoryStore(), Markers(), NoIds(), clock=Clock())
    answer = await driver.handle(InitProducerId(TID, TIMEOUT_MS))
    assert answer.error is TxnError.CONCURRENT_TRANSACTIONS and "retry" in answer.message


@pytest.mark.asyncio
async def test_a_commit_of_offsets_only_completes_without_markers() -> None:
    store = MemoryStore()
    driver, markers, _ = make_driver(store, Clock())
    init = await driver.handle(InitProducerId(TID, TIMEOUT_MS))
    pid, epoch = init.producer_id, init.producer_epoch
    assert (await driver.handle(AddOffsetsToTxn(TID, pid, epoch, "g"))).error is TxnError.NONE
    offsets = {("in", 3): PendingOffset(7)}
    assert (await driver.handle(TxnOffsetCommit(TID, pid, epoch, "g", offsets))).error is TxnError.NONE
    assert (await driver.handle(EndTxn(TID, pid, epoch, commit=True))).error is TxnError.NONE
    await driver.drain()
    assert markers.calls == []
    assert await state(store) is TxnState.COMPLETE_COMMIT
    assert await store.get(store.keys.consumer_offset("g", "in", 3)) is not None


@pytest.mark.asyncio
async def test_init_over_an_ongoing_transaction_aborts_it_then_bumps() -> None:
    """A new producer instance with the same id: the zombie's transaction is aborted with a
    fenced epoch (CONCURRENT_TRANSACTIONS until done), then the retry gets the next epoch."""
    store = MemoryStore()
    driver, markers, _ = make_driver(store, Clock())
    zombie = await begin(driver, A0)
    busy = await driver.handle(InitProducerId(TID, TIMEOUT_MS))
    assert busy.error is TxnError.CONCURRENT_TRANSACTIONS
    await driver.drain()
    assert markers.marked() == {(1000, 1, False, A0)}
    fresh = await driver.handle(InitProducerId(TID, TIMEOUT_MS))
    assert (fresh.error, fresh.producer_id, fresh.producer_epoch) == (TxnError.NONE, 1000, 2)
    late = await driver.handle(AddPartitionsToTxn(TID, 1000, zombie.producer_epoch, frozenset({B1})))
    assert late.error is TxnError.PRODUCER_FENCED


@pytest.mark.asyncio
async def test_a_request_during_its_ids_completion_waits_for_it_instead_of_being_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    store = MemoryStore()
    driver, markers, _ = make_driver(store, Clock())
    init = await begin(driver, A0)
    markers.gate = asyncio.Event()  # the markers hang: the completion cannot finish
    answer = await driver.handle(EndTxn(TID, init.producer_id, init.producer_epoch, commit=True))
    assert answer.error is TxnError.NONE
    next_txn = asyncio.create_task(driver.handle(AddPartitionsToTxn(TID, 1000, 0, frozenset({B1}))))
    await asyncio.sleep(0.05)
    assert not next_txn.done(), "waits for the completion"
    markers.gate.set()
    assert (await next_txn).error is TxnError.NONE, "begun once the commit completed"
    # A completion that does not finish in time: the request is answered, retriable.
    monkeypatch.setattr(limits, "TRANSACTION_COMPLETION_WAIT_MS", 50)
    markers.gate = asyncio.Event()
    await driver.handle(EndTxn(TID, 1000, 0, commit=True))
    late = await driver.handle(AddPartitionsToTxn(TID, 1000, 0, frozenset({A0})))
    assert late.error is TxnError.CONCURRENT_TRANSACTIONS
    markers.gate.set()
    await driver.drain()


@pytest.mark.asyncio
async def test_an_id_no_producer_can_have_is_answered_before_etcd_is_read() -> None:
    """Empty or over-long ids name no etcd key: every request and the operator's abort answer
    INVALID_REQUEST instead of raising (found by tests/integration/test_fuzz.py at the gateway)."""
    store = MemoryStore()
    driver, _, pids = make_driver(store, Clock())
    for tid in ("", "x" * 1_001):
        for request in (
            InitProducerId(tid, TIMEOUT_MS),
            AddPartitionsToTxn(tid, 1, 0, frozenset({A0})),
            EndTxn(tid, 1, 0, commit=True),
        ):
            answer = await driver.handle(request)
            assert answer.error is TxnError.INVALID_REQUEST, (tid[:5], request, answer)
        assert (await driver.abort_by_operator(tid)).error is TxnError.INVALID_REQUEST
    assert pids.allocated == []


class CountingStore(MemoryStore):
    """MemoryStore that counts reads of the transaction key."""

    def __init__(self) -> None:
        super().__init__()
        self.reads = 0

    async def get(self, key: str) -> KeyValue | None:
        self.reads += key == self.keys.transaction_state(TID)
        return await super().get(key)


@pytest.mark.asyncio
async def test_a_step_after_the_drivers_own_write_swaps_without_reading_first() -> None:
    store = CountingStore()
    driver, _, _ = make_driver(store, Clock())
    init = await begin(driver, A0)
    pid, epoch = init.producer_id, init.producer_epoch
    reads = store.reads
    assert (await driver.handle(AddPartitionsToTxn(TID, pid, epoch, frozenset({B1})))).error is TxnError.NONE
    assert (await driver.handle(EndTxn(TID, pid, epoch, commit=True))).error is TxnError.NONE
    assert store.reads == reads  # both swapped on the state the driver wrote last
    await driver.drain()
    # The completion reads once before its markers (never from memory), then swaps on that read.
    assert store.reads == reads + 1
    assert await state(store) is TxnState.COMPLETE_COMMIT


async def fenced_behind_ours_back(
    store: MemoryStore,
) -> tuple[TransactionDriver, TransactionDriver, TxnAnswer]:
    """Ours begins a transaction on a0 and remembers it; then another coordinator (a new
    producer's InitProducerId there) fences that epoch and aborts the transaction (telling the
    new producer to retry meanwhile). Returns (ours, theirs, ours' InitProducerId answer)."""
    ours, _, _ = make_driver(store, Clock())
    theirs, _, _ = make_driver(store, Clock())
    init = await begin(ours, A0)
    bumped = await theirs.handle(InitProducerId(TID, TIMEOUT_MS))
    assert bumped.error is TxnError.CONCURRENT_TRANSACTIONS
    return ours, theirs, init


@pytest.mark.asyncio
async def test_a_remembered_state_another_coordinator_changed_costs_one_lost_swap_then_a_read() -> None:
    store = MemoryStore()
    ours, theirs, init = await fenced_behind_ours_back(store)
    # Ours decides on its memory (Ongoing at the old epoch: a commit), loses the swap, reads, and
    # answers from what etcd holds.
    late = await ours.handle(EndTxn(TID, init.producer_id, init.producer_epoch, commit=True))
    assert late.error is TxnError.PRODUCER_FENCED
    await ours.drain()
    await theirs.drain()
    assert await state(store) is TxnState.COMPLETE_ABORT


@pytest.mark.asyncio
async def test_an_answer_that_writes_nothing_is_never_taken_from_memory() -> None:
    ours, _, init = await fenced_behind_ours_back(MemoryStore())
    # On ours' memory a0 is already added (no write, so no swap to prove it): it must read.
    again = await ours.handle(AddPartitionsToTxn(TID, init.producer_id, init.producer_epoch, frozenset({A0})))
    assert again.error is TxnError.PRODUCER_FENCED
