"""A partition leader's transactional Produce in the simulation (issue 41): the Kafka listener's
order, on the real code. First the KIP-890 check (services/transactions/produce_verifier.py
`ProduceVerifier.refusals`: a partition not in the producer's ongoing transaction, as etcd holds
it, is refused, answered by `split_refused_produce` as the brokers answer it), then
`BrokerCore.produce(..., transactional=True)` for the rest.

The request body is (transactional id, ProduceRequest of one partition). The check is asyncio
code that never waits here (one check per producer at a time: a producer has one batch in
flight), so it runs to completion on a private asyncio loop inside the broker's event.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from coordinator.store import CoordinatorError
from services.broker.purgatory import produce_response
from services.transactions.coordinator import TxnError
from services.transactions.produce_check import split_refused_produce, transactional_batches
from services.transactions.produce_verifier import ProduceVerifier
from tests.sim.network import Envelope

if TYPE_CHECKING:
    from tests.sim.sim_broker import SimBroker

# The check's asyncio loop: it runs only inside one broker event at a time, to completion.
_CHECK_LOOP = asyncio.new_event_loop()


def produce_transactional(broker: SimBroker, env: Envelope) -> None:
    transactional_id, req = env.body
    # The check reads etcd only: the client serves it (it has no watches or close of its own).
    store: Any = broker.etcd_client
    verifier = ProduceVerifier(store)
    try:
        refused = _CHECK_LOOP.run_until_complete(
            verifier.refusals(transactional_id, req, broker.core.open_transaction_epoch)
        )
    except CoordinatorError:
        refused = {
            tp: TxnError.COORDINATOR_NOT_AVAILABLE
            for tps in transactional_batches(req).values()
            for tp in tps
        }
    kept, answers = split_refused_produce(req, refused)
    if not kept.topics:
        broker.reply(env, produce_response(answers))
        return
    broker.core.produce(kept, lambda resp: broker.reply(env, resp), transactional=True)
