"""The gateway's transaction coordinator (issue 41): InitProducerId with a transactional id,
AddPartitionsToTxn, AddOffsetsToTxn, TxnOffsetCommit and EndTxn for our gRPC clients
(docs/CLIENTS.md, Transactions).

The rules and their driver are the brokers' (services/transactions/): every decision is a
compare-and-swap of the id's state in etcd, so whichever process answers a request, a broker's
Kafka listener or a gateway, decides as the others would, and two racing on one id never both
decide. What a gateway adds is a door, not a second coordinator: it turns the protobuf requests
into the rules' requests and their answers (TxnError, named as common.proto's codes) back.

The gateway's driver writes the markers of the transactions it ends (through the partition
leaders its metadata cache names) and runs the coordinator's own steps for every id: timeouts,
idle expiry, and prepared transactions left by a process that died (`recover` at start,
`tick` every TRANSACTION_TIMEOUT_CHECK_INTERVAL_MS). A cluster served only through gateways
(no broker with a Kafka listener, whose hosts do the same for the ids they own) still times
transactions out; where both run, the compare-and-swap keeps their steps from deciding twice,
and a marker written twice is harmless.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from clients.common import limits as client_limits
from clients.common.topics import group_id_problem
from clients.common.types import TopicPartitionKey
from coordinator.store import CoordinatorError, MetadataStore
from protos.highwater.v1 import common_pb2, gateway_pb2
from services.common import limits
from services.gateway.cluster_view import ClusterView
from services.gateway.controller_calls import ControllerCalls
from services.groups.errors import GroupError
from services.transactions import coordinator as rules
from services.transactions.coordinator import PendingOffset, TxnAnswer, TxnError
from services.transactions.driver import TransactionDriver
from services.transactions.hosting import ControllerProducerIds
from services.transactions.marker_writer import GrpcMarkerWriter
from services.transactions.state import txn_offset_commit_member_check

log = logging.getLogger("highwater.gateway.transactions")

# A call's response message type.
R = TypeVar("R")


def error_code(name: str) -> common_pb2.ErrorCode:
    """A coordinator or group error's gRPC code, by name (UNKNOWN_SERVER_ERROR for a name
    common.proto does not carry, which would be a bug in this table's upkeep)."""
    known = name in _CODE_NAMES
    code: common_pb2.ErrorCode = common_pb2.ErrorCode.Value(name if known else "UNKNOWN_SERVER_ERROR")
    return code


_CODE_NAMES = frozenset(common_pb2.ErrorCode.keys())


class GatewayTransactions:
    """The transaction calls of one gateway, over its own driver."""

    def __init__(self, store: MetadataStore, view: ClusterView, controller: ControllerCalls) -> None:
        self._store = store
        self._view = view

        async def call_controller(rpc: str, request: Any) -> Any:
            return await controller.call(rpc, request, common_pb2.InitProducerIdResponse)

        self.driver = TransactionDriver(
            store,
            GrpcMarkerWriter(view.cache, view.peers),
            ControllerProducerIds(call_controller),
            owns=lambda transactional_id: True,
        )
        self._timer: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Finish what a dead process left prepared, then run the timeout checks (on the running
        event loop)."""
        self._timer = asyncio.create_task(self._run(), name="gateway-transactions")

    async def _run(self) -> None:
        try:
            recovered = await self.driver.recover()
            if recovered:
                log.info("completed %d prepared transactions at start", len(recovered))
        except CoordinatorError as exc:
            log.warning("prepared transactions not recovered at start (%s); the next tick tries", exc)
        await self.driver.run_timer()

    async def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._timer
        await self.driver.close()

    # ---- the calls ----------------------------------------------------------------------------

    async def _handle(self, request: rules.TxnRequest) -> TxnAnswer:
        try:
            return await asyncio.wait_for(self.driver.handle(request), limits.TRANSACTION_CALL_TIMEOUT_S)
        except (CoordinatorError, TimeoutError) as exc:
            log.warning("transactional id %r: etcd did not answer (%s)", request.transactional_id, exc)
            return TxnAnswer(TxnError.COORDINATOR_NOT_AVAILABLE, f"etcd could not be reached ({exc}): retry")

    async def _decided(self, request: rules.TxnRequest, response_cls: Callable[..., R]) -> R:
        """The rules' answer to `request`, as `response_cls` (error code and message)."""
        answer = await self._handle(request)
        return response_cls(error_code=error_code(answer.error.value), error_message=answer.message)

    async def _unknown(self, partitions: Iterable[TopicPartitionKey]) -> list[str]:
        """The partitions (as "topic-p") the cluster does not have, after a refresh if needed."""
        await self._view.refresh_unless_known({topic for topic, _ in partitions})
        return sorted(f"{t}-{p}" for t, p in partitions if (t, p) not in self._view.cache.partitions)

    async def init_producer_id(
        self, request: common_pb2.InitProducerIdRequest
    ) -> common_pb2.InitProducerIdResponse:
        # A new producer sends -1/-1 (common.proto); one that left both unset means the same.
        recovering = request.producer_id != 0 or request.producer_epoch != 0
        answer = await self._handle(
            rules.InitProducerId(
                request.transactional_id,
                request.transaction_timeout_ms or client_limits.TRANSACTION_TIMEOUT_MS_DEFAULT,
                request.producer_id if recovering else rules.NO_PRODUCER_ID,
                request.producer_epoch if recovering else rules.NO_PRODUCER_EPOCH,
            )
        )
        return common_pb2.InitProducerIdResponse(
            error_code=error_code(answer.error.value),
            error_message=answer.message,
            producer_id=answer.producer_id,
            producer_epoch=answer.producer_epoch,
        )

    async def add_partitions(
        self, request: gateway_pb2.AddPartitionsToTxnRequest
    ) -> gateway_pb2.AddPartitionsToTxnResponse:
        asked = frozenset((tp.topic, tp.partition) for tp in request.partitions)
        if not asked:
            return gateway_pb2.AddPartitionsToTxnResponse(
                error_code=common_pb2.INVALID_REQUEST, error_message="no partitions to add"
            )
        unknown = await self._unknown(asked)
        if unknown:
            return gateway_pb2.AddPartitionsToTxnResponse(
                error_code=common_pb2.UNKNOWN_TOPIC_OR_PARTITION,
                error_message=f"no such partitions: {', '.join(unknown)}; nothing was added",
            )
        txn = rules.AddPartitionsToTxn(
            request.transactional_id, request.producer_id, request.producer_epoch, asked
        )
        return await self._decided(txn, gateway_pb2.AddPartitionsToTxnResponse)

    async def add_offsets(
        self, request: gateway_pb2.AddOffsetsToTxnRequest
    ) -> gateway_pb2.AddOffsetsToTxnResponse:
        if (problem := group_id_problem(request.group_id)) is not None:
            return gateway_pb2.AddOffsetsToTxnResponse(
                error_code=common_pb2.INVALID_REQUEST, error_message=problem
            )
        txn = rules.AddOffsetsToTxn(
            request.transactional_id, request.producer_id, request.producer_epoch, request.group_id
        )
        return await self._decided(txn, gateway_pb2.AddOffsetsToTxnResponse)

    async def txn_offset_commit(
        self, request: gateway_pb2.TxnOffsetCommitRequest
    ) -> gateway_pb2.TxnOffsetCommitResponse:
        """KIP-447 first (a member id must be a current member at its epoch), then the offsets
        are pending in the transaction: the group sees them when it commits."""
        if (problem := group_id_problem(request.group_id)) is not None:
            return gateway_pb2.TxnOffsetCommitResponse(
                error_code=common_pb2.INVALID_REQUEST, error_message=problem
            )
        if request.member_id:
            try:
                member = await asyncio.wait_for(
                    txn_offset_commit_member_check(
                        self._store, request.group_id, request.member_id, request.member_epoch
                    ),
                    limits.TRANSACTION_CALL_TIMEOUT_S,
                )
            except (CoordinatorError, TimeoutError) as exc:
                return gateway_pb2.TxnOffsetCommitResponse(
                    error_code=common_pb2.COORDINATOR_NOT_AVAILABLE,
                    error_message=f"the group's state could not be read from etcd ({exc}): retry",
                )
            if member is not GroupError.NONE:
                return gateway_pb2.TxnOffsetCommitResponse(
                    error_code=error_code(member.value),
                    error_message=f"member {request.member_id!r} at epoch {request.member_epoch} may not "
                    f"commit for group {request.group_id!r} ({member.value}): rejoin the group",
                )
        offsets = {
            (t.topic, p.partition): PendingOffset(p.offset, p.metadata, p.leader_epoch)
            for t in request.topics
            for p in t.partitions
        }
        bad = sorted(f"{t}-{p}" for (t, p), o in offsets.items() if o.offset < 0)
        if bad or not offsets:
            return gateway_pb2.TxnOffsetCommitResponse(
                error_code=common_pb2.INVALID_COMMIT_OFFSET if bad else common_pb2.INVALID_REQUEST,
                error_message=f"negative offsets for {', '.join(bad)}" if bad else "no offsets to commit",
            )
        unknown = await self._unknown(offsets)
        if unknown:
            return gateway_pb2.TxnOffsetCommitResponse(
                error_code=common_pb2.UNKNOWN_TOPIC_OR_PARTITION,
                error_message=f"no such partitions: {', '.join(unknown)}; no offset was taken",
            )
        txn = rules.TxnOffsetCommit(
            request.transactional_id, request.producer_id, request.producer_epoch, request.group_id, offsets
        )
        return await self._decided(txn, gateway_pb2.TxnOffsetCommitResponse)

    async def end_txn(self, request: gateway_pb2.EndTxnRequest) -> gateway_pb2.EndTxnResponse:
        txn = rules.EndTxn(
            request.transactional_id, request.producer_id, request.producer_epoch, request.commit
        )
        return await self._decided(txn, gateway_pb2.EndTxnResponse)
