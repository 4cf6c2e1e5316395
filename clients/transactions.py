"""A transactional producer's side of Kafka's transactions (KIP-98, KIP-447; issue 41): the
state of its transactions and the calls it makes to the transaction coordinator through the
gateway (protos/highwater/v1/gateway.proto: InitProducerId with a transactional id,
AddPartitionsToTxn, AddOffsetsToTxn, TxnOffsetCommit, EndTxn). Kafka's TransactionManager.

A producer with `transactional_id` set runs one transaction at a time:

    init_transactions()   once: the id's producer id and a new epoch, which fences any older
                          producer with the id and aborts its open transaction
    begin_transaction()   then send() as usual: before a partition's first batch the sender
                          adds the partition to the transaction (`add_partitions`)
    send_offsets_to_transaction(offsets, group_metadata)
                          a consumer group's offsets, committed only with the transaction
    commit_transaction()  flush, then EndTxn(commit): every record and offset becomes visible
                          to read_committed consumers at once
    abort_transaction()   flush what was added, then EndTxn(abort): none of it ever will

Errors, as Kafka's: ProducerFenced is fatal (another producer took the id over: close this
one). A record or call of the transaction that failed makes it abortable: commit raises
TransactionAbortRequired, and after abort_transaction() (which also bumps the producer's epoch
when its sequence numbers are in doubt, KIP-360) the next transaction starts clean. Retriable
answers (CONCURRENT_TRANSACTIONS, COORDINATOR_NOT_AVAILABLE, a gateway failing over) are
retried with back-off until the call's timeout; a commit or abort that timed out may be
called again and resumes.

Runs on the producer's event loop, except `check_send`, which the synchronous Producer calls
from its callers' threads (it reads one attribute).
"""

from __future__ import annotations

import asyncio
import enum
import logging
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from clients.common.errors import InvalidProducerEpoch, ProducerFenced, error_for_code
from clients.config import ProducerConfig
from clients.connection import GatewayConnection
from clients.errors import HighwaterError, InvalidArgument, RequestTimedOut, TransactionAbortRequired
from clients.idempotence import IdempotenceState
from clients.types import TopicPartition
from protos.highwater.v1 import common_pb2, gateway_pb2

log = logging.getLogger("highwater.client.transactions")


class TxnPhase(enum.Enum):
    UNINITIALIZED = "uninitialized"  # init_transactions() not called yet
    READY = "ready"  # no transaction open
    IN_TRANSACTION = "in transaction"
    COMMITTING = "committing"
    ABORTING = "aborting"
    ABORTABLE = "abortable"  # a record or call failed: only abort_transaction() is allowed
    FATAL = "fatal"  # fenced: the producer must be closed


# What each call may start from (Kafka's TransactionManager transitions); anything else is an
# error naming the phase. A commit or abort that timed out is resumed by calling it again.
ALLOWED: dict[str, frozenset[TxnPhase]] = {
    "init_transactions": frozenset({TxnPhase.UNINITIALIZED}),
    "begin_transaction": frozenset({TxnPhase.READY}),
    "send": frozenset({TxnPhase.IN_TRANSACTION}),
    "send_offsets_to_transaction": frozenset({TxnPhase.IN_TRANSACTION}),
    "commit_transaction": frozenset({TxnPhase.IN_TRANSACTION, TxnPhase.COMMITTING}),
    "abort_transaction": frozenset({TxnPhase.IN_TRANSACTION, TxnPhase.ABORTABLE, TxnPhase.ABORTING}),
}
# The phase a finished commit or abort leaves.
ENDED = TxnPhase.READY
# Where batches may still be added to the coordinator's transaction: the records sent before a
# commit are flushed by it.
ADDING = frozenset({TxnPhase.IN_TRANSACTION, TxnPhase.COMMITTING})

# Back-off between retries of a retriable answer: start, cap (ms).
RETRY_BACKOFF_MS = 20
RETRY_BACKOFF_MAX_MS = 1_000


@dataclass(frozen=True)
class GroupMetadata:
    """A consumer's group as a transaction's offsets name it (Consumer.group_metadata()): with a
    member id and epoch the coordinator refuses the commit of a consumer that is no longer the
    member (KIP-447), so a zombie cannot commit its stale progress."""

    group_id: str
    member_id: str = ""
    member_epoch: int = -1


class TransactionManager:
    def __init__(
        self, config: ProducerConfig, connection: GatewayConnection, idempotence: IdempotenceState
    ) -> None:
        if config.transactional_id is None:
            raise InvalidArgument("a TransactionManager needs transactional_id")
        self.transactional_id: str = config.transactional_id
        self._config = config
        self._connection = connection
        self._idempotence = idempotence
        self.phase = TxnPhase.UNINITIALIZED
        # Why the transaction must be aborted (ABORTABLE) or the producer closed (FATAL).
        self._error: HighwaterError | None = None
        # Partitions the coordinator holds in the open transaction; the one AddPartitionsToTxn in
        # flight (done when it ends, either way) and the partitions callers wait to add next.
        self._added: set[TopicPartition] = set()
        self._adding: asyncio.Future[None] | None = None
        self._to_add_next: set[TopicPartition] = set()
        # The last transaction's partitions, added again when the next one begins (see begin()).
        self._last_partitions: frozenset[TopicPartition] = frozenset()
        self._early_add: asyncio.Task[None] | None = None
        self._offsets_added = False
        # A batch of this transaction failed: its sequence numbers are in doubt after the abort.
        self._failed_batches = False

    # ---- phases ---------------------------------------------------------------------------------

    def check(self, call: str) -> None:
        """Raise unless `call` may run in the current phase: the fatal or abortable error when
        there is one, else InvalidTxnState-like TransactionAbortRequired naming the phase."""
        if self.phase in ALLOWED[call]:
            return
        if self.phase is TxnPhase.FATAL and self._error is not None:
            raise self._error
        if self.phase is TxnPhase.ABORTABLE and self._error is not None:
            raise TransactionAbortRequired(f"{call}: the transaction must be aborted: {self._error}")
        hint = {
            TxnPhase.UNINITIALIZED: "call init_transactions() first",
            TxnPhase.READY: "call begin_transaction() first",
        }.get(self.phase, "finish the current transaction first")
        raise _invalid_state(f"{call} is not allowed while the producer is {self.phase.value}: {hint}")

    def check_send(self) -> None:
        """A record may be sent only inside a transaction (from any thread)."""
        if self.phase is not TxnPhase.IN_TRANSACTION:
            self.check("send")

    def on_batch_failed(self, error: HighwaterError) -> None:
        """A batch of the open transaction failed: fenced is fatal, anything else abortable
        (an abort in progress expects its unsent batches to fail)."""
        self._failed_batches = True
        if isinstance(error, ProducerFenced | InvalidProducerEpoch):
            self._fatal(error)
        elif self.phase in (TxnPhase.IN_TRANSACTION, TxnPhase.COMMITTING):
            self.phase, self._error = TxnPhase.ABORTABLE, error

    def _fatal(self, error: HighwaterError) -> None:
        if not isinstance(error, ProducerFenced):
            error = ProducerFenced(
                f"{error.message}: another producer took over transactional id {self.transactional_id!r}"
            )
        self.phase, self._error = TxnPhase.FATAL, error

    # ---- the calls ------------------------------------------------------------------------------

    async def init(self, timeout_ms: int) -> None:
        """InitProducerId with the transactional id: a producer id and a new epoch."""
        self.check("init_transactions")
        await self._new_epoch(_deadline(timeout_ms))
        self.phase = TxnPhase.READY

    async def _new_epoch(self, deadline: float) -> None:
        state = self._idempotence
        known = state.producer_id >= 0
        response = await self._call(
            "InitProducerId",
            common_pb2.InitProducerIdRequest(
                transactional_id=self.transactional_id,
                transaction_timeout_ms=self._config.transaction_timeout_ms,
                # KIP-360: the current id and epoch, so the coordinator bumps ours.
                producer_id=state.producer_id if known else -1,
                producer_epoch=state.producer_epoch if known else -1,
            ),
            deadline,
        )
        state.set_producer(response.producer_id, response.producer_epoch)

    async def begin(self) -> None:
        self.check("begin_transaction")
        self._added.clear()
        self._to_add_next.clear()
        self._offsets_added = False
        self._failed_batches = False
        self.phase = TxnPhase.IN_TRANSACTION
        if self._last_partitions:
            # The partitions the last transaction wrote are added now, while the application
            # appends, rather than by its first batches: their add waits for the coordinator to
            # finish the last transaction (its markers), and a producer that commits every
            # 100 ms otherwise stalled each partition's first batch that long, then again for
            # partitions its first add did not yet name. A partition added and left unwritten
            # costs one marker at the end; nothing a reader sees changes.
            self._early_add = asyncio.ensure_future(self._add_early(self._last_partitions))

    async def _add_early(self, partitions: frozenset[TopicPartition]) -> None:
        if self.phase is not TxnPhase.IN_TRANSACTION:
            return  # ended before this ran: nothing was sent, nothing needs adding
        try:
            await self.add_partitions(partitions, _deadline(self._config.request_timeout_ms))
        except HighwaterError as error:
            # Not this call's to report: the first batch of such a partition adds it again and
            # fails with the error if it persists.
            log.debug("adding the last transaction's partitions early: %s", error)

    async def _settle_early_add(self) -> None:
        """Wait for an early add still in flight: EndTxn must not overtake it."""
        early, self._early_add = self._early_add, None
        if early is not None:
            await asyncio.wait({early})

    async def add_partitions(
        self,
        partitions: Iterable[TopicPartition],
        deadline: float | None,
        *,
        also: Iterable[TopicPartition] = (),
    ) -> None:
        """Have the coordinator add the partitions before their batches go out (once each per
        transaction). Raises the error that must fail them. Partitions in `also` (batches still
        queued) are added by the same call if one is made, and waited for by nobody.

        One AddPartitionsToTxn at a time: callers that find one in flight name their partitions
        for the next, which adds all of them at once. Concurrent calls would each read and
        compare-and-swap the same transactional id, and all but one lose the swap and go again
        (a commit every 100 ms met six such calls per transaction, 32 ms each at the median).
        """
        wanted = set(partitions)
        while True:
            if self.phase not in ADDING:
                if self.phase is TxnPhase.ABORTING:
                    raise TransactionAbortRequired(
                        "the transaction is being aborted: the record was not sent"
                    )
                self.check("send")
            missing = wanted - self._added
            if not missing:
                return
            if self._adding is not None:
                self._to_add_next |= missing
                await asyncio.wait({self._adding})
                continue  # added, or failed: then this caller tries itself
            adding = sorted(missing | ((self._to_add_next | set(also)) - self._added))
            self._to_add_next.clear()
            done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._adding = done
            try:
                await self._call(
                    "AddPartitionsToTxn",
                    gateway_pb2.AddPartitionsToTxnRequest(
                        transactional_id=self.transactional_id,
                        producer_id=self._idempotence.producer_id,
                        producer_epoch=self._idempotence.producer_epoch,
                        partitions=[
                            common_pb2.TopicPartition(topic=tp.topic, partition=tp.partition) for tp in adding
                        ],
                    ),
                    deadline if deadline is not None else _deadline(self._config.request_timeout_ms),
                )
                self._added.update(adding)
            finally:
                done.set_result(None)
                self._adding = None

    async def send_offsets(
        self, offsets: Mapping[TopicPartition, int], group: GroupMetadata, timeout_ms: int
    ) -> None:
        """The group's offsets (the next offset to read, as Consumer.commit takes them), pending
        in the transaction until it commits."""
        self.check("send_offsets_to_transaction")
        if not offsets:
            return
        deadline = _deadline(timeout_ms)
        tid, pid, epoch = (
            self.transactional_id,
            self._idempotence.producer_id,
            self._idempotence.producer_epoch,
        )
        try:
            await self._call(
                "AddOffsetsToTxn",
                gateway_pb2.AddOffsetsToTxnRequest(
                    transactional_id=tid, producer_id=pid, producer_epoch=epoch, group_id=group.group_id
                ),
                deadline,
            )
            self._offsets_added = True
            by_topic: dict[str, list[gateway_pb2.OffsetCommitPartition]] = {}
            for tp, offset in sorted(offsets.items()):
                by_topic.setdefault(tp.topic, []).append(
                    gateway_pb2.OffsetCommitPartition(partition=tp.partition, offset=offset, leader_epoch=-1)
                )
            await self._call(
                "TxnOffsetCommit",
                gateway_pb2.TxnOffsetCommitRequest(
                    group_id=group.group_id,
                    member_id=group.member_id,
                    member_epoch=group.member_epoch,
                    topics=[
                        gateway_pb2.OffsetCommitTopic(topic=t, partitions=ps) for t, ps in by_topic.items()
                    ],
                    transactional_id=tid,
                    producer_id=pid,
                    producer_epoch=epoch,
                ),
                deadline,
                # A consumer's stale epoch is retried by its next heartbeat, not by sending the
                # same offsets again: the consumer has lost (or is losing) its partitions.
                final=frozenset({common_pb2.STALE_MEMBER_EPOCH}),
            )
        except HighwaterError as error:
            self._abortable_unless_fatal(error)
            raise

    def start_end(self, commit: bool) -> None:
        """Enter COMMITTING or ABORTING before the flush that precedes EndTxn: no record may be
        sent meanwhile, and an abort's unsent batches fail at once."""
        self.check("commit_transaction" if commit else "abort_transaction")
        self.phase = TxnPhase.COMMITTING if commit else TxnPhase.ABORTING

    async def end(self, commit: bool, timeout_ms: int) -> None:
        """EndTxn, once the flush is done. A commit of a transaction with a failed record raises
        TransactionAbortRequired (its phase is ABORTABLE then); a timeout leaves the phase for
        a second call to resume."""
        self.check("commit_transaction" if commit else "abort_transaction")
        deadline = _deadline(timeout_ms)
        await self._settle_early_add()
        if self._added or self._offsets_added:
            try:
                await self._call(
                    "EndTxn",
                    gateway_pb2.EndTxnRequest(
                        transactional_id=self.transactional_id,
                        producer_id=self._idempotence.producer_id,
                        producer_epoch=self._idempotence.producer_epoch,
                        commit=commit,
                    ),
                    deadline,
                )
            except RequestTimedOut:
                raise
            except HighwaterError as error:
                self._abortable_unless_fatal(error)
                raise
        if not commit and (self._failed_batches or self._idempotence.needs_new_epoch):
            # KIP-360: a failed batch's sequence numbers are in doubt; a new epoch restarts them.
            await self._new_epoch(deadline)
        self._last_partitions = frozenset(self._added) if commit else frozenset()
        self._added.clear()
        self._to_add_next.clear()
        self._offsets_added = False
        self._failed_batches = False
        self.phase, self._error = ENDED, None

    def _abortable_unless_fatal(self, error: HighwaterError) -> None:
        if isinstance(error, ProducerFenced | InvalidProducerEpoch):
            self._fatal(error)
        elif self.phase is not TxnPhase.ABORTING:
            self.phase, self._error = TxnPhase.ABORTABLE, error

    async def _call(
        self, rpc: str, request: Any, deadline: float, final: frozenset[int] = frozenset()
    ) -> Any:
        """`rpc` through the gateway, retrying retriable answers with back-off until
        `deadline` (time.monotonic() s): then RequestTimedOut naming the last error. Codes in
        `final` are raised at once even when retriable elsewhere."""
        attempts = 0
        while True:
            try:
                response = await self._connection.call(rpc, request, deadline=deadline)
                if response.error_code == common_pb2.NONE:
                    return response
                error = error_for_code(response.error_code, response.error_message or rpc)
            except HighwaterError as raised:  # no gateway answered, the call timed out, closed
                error = raised
            if isinstance(error, ProducerFenced | InvalidProducerEpoch):
                self._fatal(error)
                raise self._error or error
            attempts += 1
            pause_s = min(RETRY_BACKOFF_MAX_MS, RETRY_BACKOFF_MS << min(attempts, 10)) / 1000
            if not error.retriable or error.code in final:
                raise error
            if time.monotonic() + pause_s >= deadline:
                raise RequestTimedOut(
                    f"{rpc} for transactional id {self.transactional_id!r} did not succeed in time: {error}"
                )
            await asyncio.sleep(pause_s)


def _deadline(timeout_ms: int) -> float:
    return time.monotonic() + timeout_ms / 1000


def _invalid_state(message: str) -> HighwaterError:
    return error_for_code(common_pb2.INVALID_TXN_STATE, message)
