"""Where the transaction coordinator runs and what it borrows (issue 41): the placement of a
transactional id on a broker, and producer ids from the controller.

Placement is classic groups' (`services.kafka.classic_groups.coordinator_of`, a stable hash over
the live brokers), so FindCoordinator with key_type 1 (transaction) is answered as key_type 0
(group) is, and every broker reading the same registrations names the same coordinator. When
the broker set changes an id moves; the new host's `TransactionDriver.recover()` finishes what
the old one left prepared, and the compare-and-swap in etcd fences the old host's late writes.

Producer ids are the controller's, the same InitProducerId call (with no producer id, so a
fresh id at epoch 0) that idempotent producers make: one allocator, blocks reserved in etcd
(`services.controller.event_loop.ControllerLoop.next_producer_id`), so a transactional and an
idempotent producer never share an id.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

import grpc

from clients.common.types import TopicPartitionKey
from coordinator.store import CoordinatorError, CoordinatorUnavailable, MetadataStore
from protos.highwater.v1 import common_pb2
from services.common import limits
from services.kafka.classic_groups import coordinator_of
from services.kafka.handler_common import BackendUnavailable
from services.transactions import coordinator as rules
from services.transactions.coordinator import (
    DescribedTransaction,
    TransactionListing,
    TxnAnswer,
    TxnError,
    TxnRequest,
)
from services.transactions.driver import (
    MarkerWriter,
    ProducerIdSource,
    ProducerIdUnavailable,
    TransactionDriver,
    wall_clock_ms,
)
from services.transactions.produce_verifier import OpenTransactionEpoch, ProduceVerifier
from services.transactions.state import read_transaction, read_transactions

log = logging.getLogger("highwater.transactions")

T = TypeVar("T")

# The controller call the Kafka listener's backend makes (services/kafka/backend.py
# `call_controller`): rpc name and request -> response; raises on an unreachable controller.
ControllerCall = Callable[[str, Any], Awaitable[Any]]


def transaction_coordinator_of(transactional_id: str, broker_ids: Sequence[int]) -> int | None:
    """The broker that coordinates a transactional id (None: no live broker)."""
    return coordinator_of(transactional_id, broker_ids)


class ControllerProducerIds:
    """`ProducerIdSource` over the controller's InitProducerId."""

    def __init__(self, call_controller: ControllerCall) -> None:
        self._call = call_controller

    async def allocate_producer_id(self) -> int:
        try:
            response = await self._call(
                "InitProducerId", common_pb2.InitProducerIdRequest(producer_id=-1, producer_epoch=-1)
            )
        except (BackendUnavailable, grpc.aio.AioRpcError) as exc:
            raise ProducerIdUnavailable(f"InitProducerId to the controller failed: {exc}") from exc
        if response.error_code != common_pb2.NONE:
            raise ProducerIdUnavailable(
                f"the controller refused a producer id: {common_pb2.ErrorCode.Name(response.error_code)} "
                f"{response.error_message}"
            )
        producer_id: int = response.producer_id
        return producer_id


class TransactionHost:
    """The transaction coordinator on one broker (issue 41): the driver over etcd, which ids it
    owns, the views (DescribeTransactions, ListTransactions) and the partition leader's KIP-890
    check of a transactional Produce. Owned by the broker's event loop.

    Ownership follows the placement of FindCoordinator (`transaction_coordinator_of` over the
    brokers `broker_ids` returns, the registered Kafka listeners). It matters for the
    coordinator's own steps only (timeouts, expiry, resuming prepared transactions): a request
    is answered by whichever broker receives it, since every decision is a compare-and-swap in
    etcd; clients send them to the coordinator FindCoordinator names, as Kafka's do.

    `run()` re-reads the broker set every TRANSACTION_OWNERSHIP_CHECK_INTERVAL_MS and, when this
    broker gained ids (another broker left), completes their prepared transactions at once
    (`recover`), so a coordinator's death holds a commit back for about that interval, not the
    timeout check's; every TRANSACTION_TIMEOUT_CHECK_INTERVAL_MS it runs the driver's `tick`.
    """

    def __init__(
        self,
        broker_id: int,
        store: MetadataStore,
        markers: MarkerWriter,
        producer_ids: ProducerIdSource,
        broker_ids: Callable[[], Awaitable[Sequence[int]]],
        *,
        clock: Callable[[], int] = wall_clock_ms,
    ) -> None:
        self._broker_id = broker_id
        self._store = store
        self._broker_ids = broker_ids
        self._clock = clock
        self._live: tuple[int, ...] = ()
        self.driver = TransactionDriver(store, markers, producer_ids, clock=clock, owns=self.owns)
        self._verifier = ProduceVerifier(store)

    def owns(self, transactional_id: str) -> bool:
        return transaction_coordinator_of(transactional_id, self._live) == self._broker_id

    async def handle(self, request: TxnRequest) -> TxnAnswer:
        """The driver's answer; raises BackendUnavailable when etcd cannot be reached."""
        return await _etcd(self.driver.handle(request))

    # ---- the coordinator's own steps -----------------------------------------------------------

    async def refresh_ownership(self) -> bool:
        """Read the broker set again; True when this broker's share of the ids may have grown."""
        live = tuple(sorted(await self._broker_ids()))
        grew = live != self._live and self._broker_id in live
        self._live = live
        return grew

    async def run(self) -> None:
        """The coordinator's timers, until cancelled. etcd or a broker list that cannot be read
        is logged and tried again at the next interval."""
        interval_s = limits.TRANSACTION_OWNERSHIP_CHECK_INTERVAL_MS / 1000
        ticks_every = max(
            1, limits.TRANSACTION_TIMEOUT_CHECK_INTERVAL_MS // limits.TRANSACTION_OWNERSHIP_CHECK_INTERVAL_MS
        )
        rounds = 0
        while True:
            try:
                if await self.refresh_ownership():
                    recovered = await self.driver.recover()
                    if recovered:
                        log.info(
                            "transaction coordinator: completed %d prepared transactions", len(recovered)
                        )
                if rounds % ticks_every == 0:
                    report = await self.driver.tick(self._clock())
                    if report.aborted:
                        log.info("transactions aborted at their timeout: %s", ", ".join(report.aborted))
            except (CoordinatorUnavailable, BackendUnavailable) as exc:
                log.warning("transaction coordinator: %s; trying again in %.1f s", exc, interval_s)
            rounds += 1
            await asyncio.sleep(interval_s)

    async def close(self) -> None:
        await self.driver.close()

    # ---- views -----------------------------------------------------------------------------------

    async def describe(self, transactional_ids: Sequence[str]) -> list[DescribedTransaction]:
        answers: list[DescribedTransaction] = []
        for tid in transactional_ids:
            if rules.transactional_id_problem(tid) is not None:
                # An id no producer can have (empty, over-long) names nothing in etcd.
                answers.append(DescribedTransaction(tid, TxnError.TRANSACTIONAL_ID_NOT_FOUND))
                continue
            if not self.owns(tid):
                answers.append(DescribedTransaction(tid, TxnError.NOT_COORDINATOR))
                continue
            meta, _ = await _etcd(read_transaction(self._store, tid))
            if meta is None:
                answers.append(DescribedTransaction(tid, TxnError.TRANSACTIONAL_ID_NOT_FOUND))
            else:
                answers.append(DescribedTransaction(tid, TxnError.NONE, rules.describe(meta)))
        return answers

    async def listing(
        self, states: Sequence[str], producer_ids: Sequence[int], duration_ms: int
    ) -> tuple[list[TransactionListing], list[str]]:
        """ListTransactions of the ids this broker coordinates (a client asks every broker)."""
        stored = await _etcd(read_transactions(self._store))
        owned = [meta for tid, (meta, _) in stored.items() if self.owns(tid)]
        return rules.list_transactions(owned, states, producer_ids, duration_ms, self._clock())

    # ---- the partition leader's check (KIP-890 part 1) -------------------------------------------

    async def produce_refusals(
        self, transactional_id: str, req: common_pb2.ProduceRequest, open_epoch: OpenTransactionEpoch
    ) -> dict[TopicPartitionKey, TxnError]:
        """Refusals for a transactional Produce's partitions (absent: may be appended): the
        leader's check (produce_check.py). Raises BackendUnavailable when etcd cannot be read."""
        return await _etcd(self._verifier.refusals(transactional_id, req, open_epoch))


async def _etcd(call: Awaitable[T]) -> T:
    """`call`, with etcd's failures and a wait past KAFKA_BACKEND_CALL_TIMEOUT_S as
    BackendUnavailable, which the Kafka calls answer with a retriable code."""
    try:
        return await asyncio.wait_for(call, limits.KAFKA_BACKEND_CALL_TIMEOUT_S)
    except (CoordinatorError, TimeoutError) as exc:
        raise BackendUnavailable(f"etcd did not answer ({exc})") from exc
