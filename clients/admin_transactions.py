"""The admin client's transaction calls (issue 41; `highwater transactions`): list the
transactional ids, describe them, abort a hanging transaction (Kafka's kafka-transactions.sh).
AsyncAdmin, clients/admin.py."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from clients.admin_calls import AdminCalls
from clients.config import check_int
from clients.errors import InvalidArgument, error_for_code
from clients.types import TopicPartition
from protos.highwater.v1 import common_pb2, gateway_pb2

# Kafka's transaction states, as the coordinator names them (ListTransactions' filters).
TRANSACTION_STATES = ("Empty", "Ongoing", "PrepareCommit", "PrepareAbort", "CompleteCommit", "CompleteAbort")


@dataclass(frozen=True)
class TransactionListing:
    transactional_id: str
    producer_id: int
    state: str


@dataclass(frozen=True)
class TransactionDescription:
    transactional_id: str
    state: str
    producer_id: int
    producer_epoch: int
    transaction_timeout_ms: int
    transaction_start_time_ms: int  # -1: no transaction open
    partitions: tuple[TopicPartition, ...]
    groups: tuple[str, ...]  # groups whose offsets wait in the transaction


@dataclass(frozen=True)
class AbortedTransaction:
    transactional_id: str
    producer_id: int
    producer_epoch: int  # the epoch the producer is now fenced at


class TransactionAdmin(AdminCalls):
    """Transactions: AsyncAdmin's transaction calls."""

    async def list_transactions(
        self, states: Iterable[str] = (), producer_ids: Iterable[int] = (), older_than_ms: int = -1
    ) -> list[TransactionListing]:
        """Every transactional id matching all filters given (empty: all): states (Kafka's names,
        TRANSACTION_STATES), producer ids, and open for longer than `older_than_ms`."""
        wanted = list(states)
        unknown = sorted(set(wanted) - set(TRANSACTION_STATES))
        if unknown:
            raise InvalidArgument(
                f"unknown transaction states {unknown}; the states are {', '.join(TRANSACTION_STATES)}"
            )
        ids = [check_int("producer id", p, minimum=0) for p in producer_ids]
        response = await self._call(
            "ListTransactions",
            gateway_pb2.ListTransactionsRequest(
                states=wanted,
                producer_ids=ids,
                older_than_ms=check_int("older_than_ms", older_than_ms, minimum=-1),
            ),
        )
        return [TransactionListing(t.transactional_id, t.producer_id, t.state) for t in response.transactions]

    async def describe_transactions(self, transactional_ids: Iterable[str]) -> list[TransactionDescription]:
        """Each id's state; raises the first id's error (TransactionalIdNotFound for an unknown
        one) after reading the whole answer."""
        ids = list(transactional_ids)
        if not ids or not all(isinstance(t, str) and t for t in ids):
            raise InvalidArgument(f"name one or more transactional ids (non-empty strings), got {ids!r}")
        response = await self._call(
            "DescribeTransactions", gateway_pb2.DescribeTransactionsRequest(transactional_ids=ids)
        )
        failed = [t for t in response.transactions if t.error_code != common_pb2.NONE]
        if failed:
            raise error_for_code(
                failed[0].error_code, f"{failed[0].transactional_id}: {failed[0].error_message}"
            )
        return [
            TransactionDescription(
                t.transactional_id,
                t.state,
                t.producer_id,
                t.producer_epoch,
                t.transaction_timeout_ms,
                t.transaction_start_time_ms,
                tuple(TopicPartition(p.topic, p.partition) for p in t.partitions),
                tuple(t.groups),
            )
            for t in response.transactions
        ]

    async def abort_transaction(self, transactional_id: str) -> AbortedTransaction:
        """Abort the id's open transaction now: its producer is fenced (its next call fails
        PRODUCER_FENCED) and its records are never read at read_committed. InvalidTxnState when
        it has none open (or one already completing); TransactionalIdNotFound for an unknown id."""
        if not isinstance(transactional_id, str) or not transactional_id:
            raise InvalidArgument(f"transactional id must be a non-empty str, got {transactional_id!r}")
        response = await self._call(
            "AbortTransaction", gateway_pb2.AbortTransactionRequest(transactional_id=transactional_id)
        )
        return AbortedTransaction(transactional_id, response.producer_id, response.producer_epoch)
