"""Placeholder replaced by the transactions admin helper (ListTransactions, DescribeTransactions,
AbortTransaction); until then every call answers UNKNOWN_SERVER_ERROR."""

from __future__ import annotations

from typing import Any

from coordinator.store import MetadataStore


class TransactionsAdmin:
    def __init__(self, store: MetadataStore) -> None:
        self._store = store

    async def list_transactions(self, request: Any) -> Any:
        raise NotImplementedError

    async def describe_transactions(self, request: Any) -> Any:
        raise NotImplementedError

    async def abort_transaction(self, request: Any) -> Any:
        raise NotImplementedError
