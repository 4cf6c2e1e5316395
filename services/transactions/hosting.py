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

from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import grpc

from protos.highwater.v1 import common_pb2
from services.kafka.classic_groups import coordinator_of
from services.kafka.handler_common import BackendUnavailable
from services.transactions.driver import ProducerIdUnavailable

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
