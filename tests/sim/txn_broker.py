"""A partition leader's transactional Produce in the simulation (issue 41): the Kafka listener's
order, on the real code. First the KIP-890 check (services/transactions/hosting.py
`TransactionHost.check_produce`: a partition not in the producer's ongoing transaction, as etcd
holds it, is refused), then `BrokerCore.produce(..., transactional=True)`.

The request body is (transactional id, ProduceRequest of one partition). The check is asyncio
code that never waits here (one check per producer at a time: a producer has one batch in
flight), so it runs to completion on a private asyncio loop inside the broker's event.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from clients.common.record_batch import parse_header
from clients.common.types import TopicPartitionKey
from protos.highwater.v1 import common_pb2
from services.broker.producer_state import NO_OFFSET
from services.broker.purgatory import produce_response
from services.kafka.handler_common import BackendUnavailable
from services.transactions.coordinator import TxnError
from services.transactions.hosting import TransactionHost
from tests.sim.network import Envelope

if TYPE_CHECKING:
    from tests.sim.sim_broker import SimBroker

# The check's asyncio loop: it runs only inside one broker event at a time, to completion.
_CHECK_LOOP = asyncio.new_event_loop()


class _Unused:
    """The host's driver is not used by the check (it needs only etcd)."""

    async def write_markers(self, *args: Any) -> dict[TopicPartitionKey, str]:
        raise AssertionError("the KIP-890 check writes no markers")

    async def allocate_producer_id(self) -> int:
        raise AssertionError("the KIP-890 check allocates no producer id")


async def _no_brokers() -> list[int]:
    return []


def produce_transactional(broker: SimBroker, env: Envelope) -> None:
    transactional_id, req = env.body
    pd = req.topics[0].partitions[0]
    tp = (req.topics[0].topic, pd.partition)
    header = parse_header(pd.records)
    unused = _Unused()
    # The check reads etcd only: the client serves it (it has no watches or close of its own).
    store: Any = broker.etcd_client
    host = TransactionHost(broker.broker_id, store, unused, unused, _no_brokers)

    def open_epoch(tp: TopicPartitionKey, producer_id: int) -> int | None:
        p = broker.core.partitions.get(tp)
        entry = None if p is None else p.producers.producers.get(producer_id)
        open_here = entry is not None and entry.current_txn_first_offset != NO_OFFSET
        return entry.producer_epoch if entry is not None and open_here else None

    try:
        verdicts = _CHECK_LOOP.run_until_complete(
            host.check_produce(transactional_id, header.producer_id, header.producer_epoch, [tp], open_epoch)
        )
    except BackendUnavailable:
        verdicts = {tp: TxnError.CONCURRENT_TRANSACTIONS}
    if verdicts:
        code = (
            common_pb2.INVALID_PRODUCER_EPOCH
            if verdicts[tp] is TxnError.PRODUCER_FENCED
            else common_pb2.INVALID_REQUEST
        )
        if verdicts[tp] is TxnError.CONCURRENT_TRANSACTIONS:
            code = common_pb2.REQUEST_TIMED_OUT
        broker.reply(
            env,
            produce_response(
                {
                    tp: common_pb2.ProducePartitionResponse(
                        partition=tp[1], error_code=code, error_message=verdicts[tp].value, base_offset=-1
                    )
                }
            ),
        )
        return
    broker.core.produce(req, lambda resp: broker.reply(env, resp), transactional=True)
