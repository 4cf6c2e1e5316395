"""The partition leader's check of a transactional Produce over etcd (KIP-890 part 1; issue 41):
a partition where the producer already has its transaction open (the leader's producer state, same
epoch) needs nothing more; for the others the coordinator's durable state says whether they were
added (`rules.verify_partitions`), so a late or stray batch cannot open a transaction the
coordinator will never end. produce_check.py holds the pure parts both doors share.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence

from clients.common.types import TopicPartitionKey
from coordinator.store import MetadataStore
from protos.highwater.v1 import common_pb2
from services.transactions import coordinator as rules
from services.transactions.coordinator import TxnError
from services.transactions.produce_check import transactional_batches
from services.transactions.state import read_transaction

# Whether the producer (id, epoch) has a transaction open on a partition in the leader's producer
# state: that epoch, or None when it has none open there.
OpenTransactionEpoch = Callable[[TopicPartitionKey, int], int | None]


class ProduceVerifier:
    """The check over etcd, one producer's checks in the order its requests came. Owned by one
    event loop (a broker's)."""

    def __init__(self, store: MetadataStore) -> None:
        self._store = store
        # Checks in progress per producer id: a producer's later Produce waits for its earlier
        # one's check, so its batches reach the log in the order it sent them.
        self._checking: dict[int, asyncio.Future[None]] = {}

    async def check(
        self,
        transactional_id: str,
        producer_id: int,
        producer_epoch: int,
        partitions: Sequence[TopicPartitionKey],
        open_epoch: OpenTransactionEpoch,
    ) -> dict[TopicPartitionKey, TxnError]:
        """Refusals for the partitions (absent: may be appended). Returns without waiting when
        nothing needs etcd and no earlier check of the producer is in progress: the Produce then
        appends in its first step, as every pipelined Kafka request must
        (services/kafka/protocol.py). Raises coordinator.store.CoordinatorError when etcd cannot
        be read."""
        problem = rules.transactional_id_problem(transactional_id)
        if problem is not None:
            return dict.fromkeys(partitions, TxnError.INVALID_REQUEST)
        earlier = self._checking.get(producer_id)
        unopened = [tp for tp in partitions if open_epoch(tp, producer_id) != producer_epoch]
        if earlier is None and not unopened:
            return {}
        mine: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._checking[producer_id] = mine
        try:
            if earlier is not None:
                await asyncio.shield(earlier)
                unopened = [tp for tp in partitions if open_epoch(tp, producer_id) != producer_epoch]
            if not unopened:
                return {}
            meta, _ = await read_transaction(self._store, transactional_id)
            verdicts = rules.verify_partitions(meta, producer_id, producer_epoch, frozenset(unopened))
            return {tp: error for tp, error in verdicts.items() if error is not TxnError.NONE}
        finally:
            mine.set_result(None)
            if self._checking.get(producer_id) is mine:
                del self._checking[producer_id]

    async def refusals(
        self, transactional_id: str, req: common_pb2.ProduceRequest, open_epoch: OpenTransactionEpoch
    ) -> dict[TopicPartitionKey, TxnError]:
        """Refusals for every transactional batch of a Produce, checked per producer (absent:
        may be appended). Raises coordinator.store.CoordinatorError when etcd cannot be read."""
        refused: dict[TopicPartitionKey, TxnError] = {}
        for (producer_id, producer_epoch), tps in transactional_batches(req).items():
            refused.update(await self.check(transactional_id, producer_id, producer_epoch, tps, open_epoch))
        return refused
