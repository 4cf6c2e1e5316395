"""The operators' side of transactions on the gateway (issue 41; `highwater transactions`):
ListTransactions, DescribeTransactions and AbortTransaction, Kafka's kafka-transactions.sh.

List and Describe read every transactional id's state from etcd (services/transactions/state.py)
and answer with the coordinator's pure views (`rules.list_transactions`, `rules.describe`): a
gateway is every id's door, so it lists them all, where a Kafka broker lists those it
coordinates. Abort is the coordinator's own step for a hanging transaction, through the
gateway's driver (`TransactionDriver.abort_by_operator`): the producer's epoch is bumped (it is
fenced) and PrepareAbort stored by compare-and-swap, and the same driver writes the ABORT
markers at once, releasing the partitions' last stable offset.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

from coordinator.store import CoordinatorError, MetadataStore
from protos.highwater.v1 import common_pb2, gateway_pb2
from services.common import limits
from services.gateway.transaction_calls import error_code
from services.transactions import coordinator as rules
from services.transactions.coordinator import TxnError
from services.transactions.driver import TransactionDriver, wall_clock_ms
from services.transactions.state import read_transaction, read_transactions

T = TypeVar("T")

ETCD_UNAVAILABLE = "the transactions' state could not be read from etcd ({}): retry"


class TransactionsAdmin:
    def __init__(
        self, store: MetadataStore, driver: TransactionDriver, *, clock: Callable[[], int] = wall_clock_ms
    ) -> None:
        """`clock`: wall-clock ms, as the coordinator stores its start times."""
        self._store = store
        self._driver = driver
        self._clock = clock

    async def list_transactions(
        self, request: gateway_pb2.ListTransactionsRequest
    ) -> gateway_pb2.ListTransactionsResponse:
        try:
            stored = await _etcd(read_transactions(self._store))
        except (CoordinatorError, TimeoutError) as exc:
            return gateway_pb2.ListTransactionsResponse(
                error_code=common_pb2.COORDINATOR_NOT_AVAILABLE, error_message=ETCD_UNAVAILABLE.format(exc)
            )
        listed, unknown = rules.list_transactions(
            [meta for meta, _ in stored.values()],
            request.states,
            request.producer_ids,
            request.older_than_ms if request.older_than_ms > 0 else -1,
            self._clock(),
        )
        return gateway_pb2.ListTransactionsResponse(
            transactions=[
                gateway_pb2.TransactionListing(
                    transactional_id=t.transactional_id, producer_id=t.producer_id, state=t.state
                )
                for t in listed
            ],
            unknown_state_filters=unknown,
        )

    async def describe_transactions(
        self, request: gateway_pb2.DescribeTransactionsRequest
    ) -> gateway_pb2.DescribeTransactionsResponse:
        answers = []
        for tid in request.transactional_ids:
            problem = rules.transactional_id_problem(tid)
            if problem is not None:
                answers.append(
                    gateway_pb2.TransactionDescription(
                        transactional_id=tid, error_code=common_pb2.INVALID_REQUEST, error_message=problem
                    )
                )
                continue
            try:
                meta, _ = await _etcd(read_transaction(self._store, tid))
            except (CoordinatorError, TimeoutError) as exc:
                answers.append(
                    gateway_pb2.TransactionDescription(
                        transactional_id=tid,
                        error_code=common_pb2.COORDINATOR_NOT_AVAILABLE,
                        error_message=ETCD_UNAVAILABLE.format(exc),
                    )
                )
                continue
            if meta is None:
                answers.append(
                    gateway_pb2.TransactionDescription(
                        transactional_id=tid,
                        error_code=common_pb2.TRANSACTIONAL_ID_NOT_FOUND,
                        error_message=f"no transactional id {tid!r} is stored (never used, or expired)",
                    )
                )
                continue
            d = rules.describe(meta)
            answers.append(
                gateway_pb2.TransactionDescription(
                    transactional_id=tid,
                    state=d.state,
                    producer_id=d.producer_id,
                    producer_epoch=d.producer_epoch,
                    transaction_timeout_ms=d.transaction_timeout_ms,
                    transaction_start_time_ms=d.transaction_start_time_ms,
                    partitions=[common_pb2.TopicPartition(topic=t, partition=p) for t, p in d.partitions],
                    groups=sorted(meta.groups),
                )
            )
        return gateway_pb2.DescribeTransactionsResponse(transactions=answers)

    async def abort_transaction(
        self, request: gateway_pb2.AbortTransactionRequest
    ) -> gateway_pb2.AbortTransactionResponse:
        tid = request.transactional_id
        problem = rules.transactional_id_problem(tid)
        if problem is not None:
            return gateway_pb2.AbortTransactionResponse(
                error_code=common_pb2.INVALID_REQUEST, error_message=problem
            )
        try:
            answer = await _etcd(self._driver.abort_by_operator(tid))
        except (CoordinatorError, TimeoutError) as exc:
            return gateway_pb2.AbortTransactionResponse(
                error_code=common_pb2.COORDINATOR_NOT_AVAILABLE, error_message=ETCD_UNAVAILABLE.format(exc)
            )
        if answer.error is not TxnError.NONE:
            return gateway_pb2.AbortTransactionResponse(
                error_code=error_code(answer.error.value), error_message=answer.message
            )
        return gateway_pb2.AbortTransactionResponse(
            error_message=f"aborted: producer {answer.producer_id} is fenced at epoch "
            f"{answer.producer_epoch}; the ABORT markers follow at once",
            producer_id=answer.producer_id,
            producer_epoch=answer.producer_epoch,
        )


async def _etcd(call: Awaitable[T]) -> T:
    return await asyncio.wait_for(call, limits.TRANSACTION_CALL_TIMEOUT_S)
