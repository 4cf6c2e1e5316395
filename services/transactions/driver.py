"""The transaction coordinator's asyncio driver (issue 41): runs the pure rules of
services/transactions/coordinator.py over the durable state in etcd (services/transactions/state.py, its
bytes moved by coordinator/transactions.py).

For each request or own step it reads the transactional id's state and mod revision, applies
the rule, and writes the new state by compare-and-swap on that revision. A lost swap (another
coordinator, or another call of the same producer, wrote first) is not an error: the step starts
over from a fresh read, at most `limits.TRANSACTION_CAS_ATTEMPTS_MAX` times, then answers
CONCURRENT_TRANSACTIONS (retriable). So two drivers racing on one id never both decide: the
etcd revision picks one, and the other re-applies the rule to what the first wrote.

The first attempt of a step may start from the state this driver last wrote or read for the id
(with its revision) instead of a read: a commit every 100 ms otherwise paid a read before each of
its compare-and-swaps (AddPartitionsToTxn, EndTxn, the completion), each on the path of the
producer's next batch. Only a compare-and-swap proves a remembered state current, so an answer
is never taken from memory alone: a step whose decision on the remembered state writes nothing,
or whose swap is lost, decides again on a fresh read.

Once a prepared decision (PrepareCommit, PrepareAbort) is in etcd the answer goes out and a
completion task per id writes the markers through a `MarkerWriter` (WriteTxnMarkers on the
partition leaders), then applies the rule `complete` (PrepareX -> CompleteX, publishing a
commit's group offsets in the same etcd transaction), again by compare-and-swap. Nothing about a
completion lives only in memory: a driver dropped at any point is replaced by one whose
`recover()` reads every stored id and finishes each prepared transaction, and markers are
idempotent, so writing them twice is harmless.

`tick(now_ms)`, every `limits.TRANSACTION_TIMEOUT_CHECK_INTERVAL_MS` (`run_timer`), aborts
transactions past their timeout (`abort_timed_out`, which fences the producer's epoch), deletes
ids idle past their expiration (`expire_if_idle`) and resumes prepared transactions whose
markers could not all be written yet.

Time comes from the injected `clock` (wall-clock milliseconds by default: start and update
times are stored in etcd and read by the next coordinator, possibly on another host, so a
monotonic clock would not do). Producer ids come from a `ProducerIdSource`, the controller's
block allocation that idempotent producers use (services/transactions/hosting.py adapts it).

Owned by one event loop (a broker's). Operating errors: `CoordinatorUnavailable` from the store
propagates from `handle` (the adapter answers COORDINATOR_NOT_AVAILABLE) and is logged by the
background steps, which the next tick retries. An `InvariantViolation` is a bug: it propagates
from `handle`, and from a completion task it is kept and raised by the next `tick` or `drain`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Protocol

from clients.common.errors import InvariantViolation, check
from clients.common.types import TopicPartitionKey
from coordinator.store import CoordinatorUnavailable, MetadataStore
from services.common import limits
from services.transactions import coordinator as rules
from services.transactions import metrics
from services.transactions.coordinator import (
    COMPLETION,
    AllocateProducerId,
    DeleteState,
    TopicPartitions,
    TxnAnswer,
    TxnError,
    TxnMetadata,
    TxnRequest,
    TxnResult,
    TxnState,
    WriteMarkers,
    WriteState,
)
from services.transactions.state import (
    delete_transaction,
    read_transaction,
    read_transactions,
    write_transaction,
)

log = logging.getLogger("highwater.transactions")

# A MarkerWriter's answer for a partition whose marker is appended and replicated (the name of
# ErrorCode 0 in protos/highwater/v1/common.proto).
MARKER_WRITTEN = "NONE"


class MarkerWriter(Protocol):
    async def write_markers(
        self, producer_id: int, producer_epoch: int, commit: bool, partitions: TopicPartitions
    ) -> Mapping[TopicPartitionKey, str]:
        """Write a COMMIT (commit=True) or ABORT marker for (producer_id, producer_epoch) to each
        partition; each partition's error name, MARKER_WRITTEN once its leader's ISR has the
        marker. A partition missing from the answer counts as not written. Raises nothing for
        operating errors (a leader down is an error name for its partitions)."""
        ...


class ProducerIdSource(Protocol):
    async def allocate_producer_id(self) -> int:
        """A producer id nobody else holds (the controller's block in etcd). Raises
        ProducerIdUnavailable when none can be had now (retriable)."""
        ...


class ProducerIdUnavailable(Exception):
    """No producer id could be allocated now (no active controller, etcd down): `handle`
    answers CONCURRENT_TRANSACTIONS, which every Kafka client retries."""


class TransactionConflict(Exception):
    """Every compare-and-swap of one step lost to another writer of the same id."""


def wall_clock_ms() -> int:
    return int(time.time() * 1000)


@dataclass(frozen=True)
class TickReport:
    """What one `tick` did, by transactional id (sorted)."""

    aborted: tuple[str, ...] = ()
    expired: tuple[str, ...] = ()
    resumed: tuple[str, ...] = ()


# A decision for one read: (state read or None, now_ms) -> the rule's result, or None when
# there is nothing to do for what was read.
Decide = Callable[[TxnMetadata | None, int], Awaitable[TxnResult | None]]


class TransactionDriver:
    def __init__(
        self,
        store: MetadataStore,
        markers: MarkerWriter,
        producer_ids: ProducerIdSource,
        *,
        clock: Callable[[], int] = wall_clock_ms,
        owns: Callable[[str], bool] = lambda transactional_id: True,
    ) -> None:
        """`owns`: whether this driver coordinates a transactional id (hosting.py's placement);
        `recover` and `tick` leave the others to their own coordinator."""
        self._store = store
        self._markers = markers
        self._producer_ids = producer_ids
        self._clock = clock
        self._owns = owns
        # One completion task per prepared id at most: the ids are bounded by what etcd holds.
        self._completing: dict[str, asyncio.Task[None]] = {}
        # The last state this driver wrote or read per id, and its mod revision (see above).
        self._remembered: dict[str, tuple[TxnMetadata, int]] = {}
        self._broken: BaseException | None = None

    # ---- requests -----------------------------------------------------------------------------

    async def handle(self, request: TxnRequest) -> TxnAnswer:
        """Answer one request (InitProducerId, AddPartitionsToTxn, AddOffsetsToTxn,
        TxnOffsetCommit, EndTxn) once its decision is stored; markers go on afterwards."""
        allocated: list[int] = []  # kept across lost swaps: an id is never allocated twice

        async def decide(meta: TxnMetadata | None, now_ms: int) -> TxnResult:
            result = rules.handle(meta, request, now_ms)
            if not any(isinstance(e, AllocateProducerId) for e in result.effects):
                return result
            if not isinstance(request, rules.InitProducerId):
                raise InvariantViolation(f"AllocateProducerId answering {request!r}")
            if not allocated:
                allocated.append(await self._producer_ids.allocate_producer_id())
            return rules.init_producer_id(meta, request, now_ms, allocated[0])

        problem = rules.transactional_id_problem(request.transactional_id)
        if problem is not None:
            # An id no producer can have names no etcd key: answered before any read.
            return TxnAnswer(TxnError.INVALID_REQUEST, problem)
        completing = self._completing.get(request.transactional_id)
        if completing is not None:
            # The id's previous transaction is being completed here: wait for it (bounded)
            # rather than answer CONCURRENT_TRANSACTIONS at once, which a client meets by backing
            # off, a wait longer than the completion itself (its markers and one etcd write).
            await asyncio.wait({completing}, timeout=limits.TRANSACTION_COMPLETION_WAIT_MS / 1000)
        try:
            result = await self._decide(request.transactional_id, decide)
        except TransactionConflict as exc:
            return TxnAnswer(TxnError.CONCURRENT_TRANSACTIONS, str(exc))
        except ProducerIdUnavailable as exc:
            return TxnAnswer(
                TxnError.CONCURRENT_TRANSACTIONS, f"no producer id can be allocated now ({exc}): retry"
            )
        if result is None:
            raise InvariantViolation(f"no decision for {request!r}")
        return result.answer

    # ---- the coordinator's own steps -------------------------------------------------------------

    async def abort_by_operator(self, tid: str) -> TxnAnswer:
        """An operator's abort of a hanging transaction (`highwater transactions abort`): the
        id's producer is fenced and its open transaction aborted now (`rules.abort_by_operator`),
        its markers written by this driver's completion. The rule's refusal when nothing is
        open; TRANSACTIONAL_ID_NOT_FOUND for an id with no state."""
        problem = rules.transactional_id_problem(tid)
        if problem is not None:
            return TxnAnswer(TxnError.INVALID_REQUEST, problem)

        async def decide(meta: TxnMetadata | None, now_ms: int) -> TxnResult:
            if meta is None:
                return TxnResult(
                    None,
                    TxnAnswer(TxnError.TRANSACTIONAL_ID_NOT_FOUND, f"no transactional id {tid!r} is stored"),
                )
            return rules.abort_by_operator(meta, now_ms)

        try:
            result = await self._decide(tid, decide)
        except TransactionConflict as exc:
            return TxnAnswer(TxnError.CONCURRENT_TRANSACTIONS, str(exc))
        if result is None:
            raise InvariantViolation(f"no decision for the abort of {tid!r}")
        if result.answer.error is not TxnError.NONE or result.metadata is None:
            return result.answer
        return TxnAnswer(TxnError.NONE, "", result.metadata.producer_id, result.metadata.producer_epoch)

    async def recover(self) -> list[str]:
        """Finish every prepared transaction this driver owns (a predecessor died before its
        markers or its completion were stored); returns their ids once all are complete or
        have given up for now (the next tick retries those)."""
        prepared = sorted(
            tid
            for tid, (meta, _) in (await read_transactions(self._store)).items()
            if meta.state in COMPLETION and self._owns(tid)
        )
        for tid in prepared:
            self._start_completion(tid)
        await self.drain()
        return prepared

    async def tick(self, now_ms: int) -> TickReport:
        """Abort owned transactions past their timeout, delete owned ids idle past their
        expiration, resume prepared ones not being completed. Raises a completion task's bug."""
        self._raise_if_broken()
        stored = {
            tid: meta for tid, (meta, _) in (await read_transactions(self._store)).items() if self._owns(tid)
        }
        aborted: list[str] = []
        expired: list[str] = []
        for tid in rules.timed_out(stored.values(), now_ms):
            if await self._own_step(tid, lambda current: rules.abort_timed_out(current, now_ms)):
                aborted.append(tid)
                metrics.TRANSACTION_TIMEOUTS.inc()
        for tid, meta in sorted(stored.items()):
            # The stale read only picks candidates; the step re-reads before it deletes.
            idle = rules.expire_if_idle(meta, now_ms).effects
            if idle and await self._own_step(tid, lambda current: rules.expire_if_idle(current, now_ms)):
                expired.append(tid)
        resumed = [
            tid
            for tid, meta in sorted(stored.items())
            if meta.state in COMPLETION and tid not in self._completing
        ]
        for tid in resumed:
            self._start_completion(tid)
        return TickReport(tuple(aborted), tuple(expired), tuple(resumed))

    async def run_timer(self) -> None:
        """`tick` every TRANSACTION_TIMEOUT_CHECK_INTERVAL_MS until cancelled; etcd trouble is
        logged and the next tick tries again."""
        while True:
            await asyncio.sleep(limits.TRANSACTION_TIMEOUT_CHECK_INTERVAL_MS / 1000)
            try:
                await self.tick(self._clock())
            except CoordinatorUnavailable as exc:
                log.warning("transaction timeout check: etcd unavailable (%s); retrying next interval", exc)

    async def drain(self) -> None:
        """Wait for every completion in progress; raises a completion task's bug."""
        while self._completing:
            await asyncio.wait(list(self._completing.values()))
        self._raise_if_broken()

    async def close(self) -> None:
        """Stop the completions in progress; what they had not stored, the next coordinator's
        `recover` does."""
        tasks = list(self._completing.values())
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._completing.clear()

    # ---- internals ---------------------------------------------------------------------------------

    async def _own_step(self, tid: str, step: Callable[[TxnMetadata], TxnResult]) -> bool:
        """Apply one of the coordinator's own rules to the id's current state; True if it wrote."""

        async def decide(meta: TxnMetadata | None, now_ms: int) -> TxnResult | None:
            if meta is None:
                return None
            result = step(meta)
            return result if result.effects else None

        try:
            return await self._decide(tid, decide) is not None
        except TransactionConflict as exc:
            log.warning("transactional id %r: %s; the next tick tries again", tid, exc)
            return False

    async def _decide(self, tid: str, decide: Decide) -> TxnResult | None:
        """Read, decide, write by compare-and-swap; on a lost swap read again. The result whose
        state write succeeded (or that wrote nothing); None when `decide` had nothing to do.
        Starts the completion of a prepared state it stored. Raises TransactionConflict.

        The first decision may be made on the remembered state: kept only when its swap wins."""
        remembered = self._remembered.pop(tid, None)
        meta: TxnMetadata | None
        swaps_lost = 0
        while True:
            if remembered is not None:
                (meta, revision), remembered, from_memory = remembered, None, True
            else:
                meta, revision = await read_transaction(self._store, tid)
                from_memory = False
            now_ms = self._clock()
            result = await decide(meta, now_ms)
            if from_memory and (result is None or _state_write(result) is None):
                continue  # nothing to prove it current by: decide on what etcd holds
            if result is None:
                self._remember(tid, meta, revision)
                return None
            new_revision = await self._write(tid, result, revision, now_ms)
            if new_revision is None:
                swaps_lost += 1
                if swaps_lost >= limits.TRANSACTION_CAS_ATTEMPTS_MAX:
                    raise TransactionConflict(
                        f"transactional id {tid!r} changed under {limits.TRANSACTION_CAS_ATTEMPTS_MAX} "
                        "writes in a row (another coordinator or call of this producer is writing it): retry"
                    )
                continue
            write = _state_write(result)
            if write is None:
                self._remember(tid, meta, revision)
            elif isinstance(write, WriteState):
                self._remember(tid, write.metadata, new_revision)
            if result.metadata is not None and result.metadata.state in COMPLETION:
                self._start_completion(tid)
            return result

    def _remember(self, tid: str, meta: TxnMetadata | None, revision: int) -> None:
        if meta is None:
            return
        self._remembered.pop(tid, None)
        self._remembered[tid] = (meta, revision)
        if len(self._remembered) > limits.TRANSACTION_STATES_REMEMBERED_MAX:
            del self._remembered[next(iter(self._remembered))]  # the least recently stored

    async def _write(self, tid: str, result: TxnResult, revision: int, now_ms: int) -> int | None:
        """Apply the result's state write (at most one) on `revision`. The key's new mod revision
        (0: nothing written, or a delete); None: lost the swap."""
        write = _state_write(result)
        check(
            not any(isinstance(e, AllocateProducerId) for e in result.effects),
            "transactional id %r: a producer id left to allocate",
            tid,
        )
        if write is None:
            return 0
        if isinstance(write, DeleteState):
            return 0 if await delete_transaction(self._store, write.transactional_id, revision) else None
        written = await write_transaction(self._store, write.metadata, revision, write.publish, now_ms)
        return written or None

    def _start_completion(self, tid: str) -> None:
        if tid in self._completing:
            return  # the running one reads the state afresh; it completes this one too
        task = asyncio.create_task(self._complete(tid), name=f"txn-complete-{tid}")
        self._completing[tid] = task
        task.add_done_callback(lambda done: self._completion_done(tid, done))

    def _completion_done(self, tid: str, task: asyncio.Task[None]) -> None:
        if self._completing.get(tid) is task:
            del self._completing[tid]
        if task.cancelled():
            return
        exc = task.exception()
        if exc is not None:
            log.error("completion of transactional id %r failed", tid, exc_info=exc)
            self._broken = self._broken or exc

    def _raise_if_broken(self) -> None:
        if self._broken is not None:
            raise self._broken

    async def _complete(self, tid: str) -> None:
        """Write the prepared transaction's markers, then store its completion."""
        try:
            # Always a fresh read, never the remembered state: markers written for a transaction
            # another coordinator has since completed could end this producer's next one.
            meta, revision = await read_transaction(self._store, tid)
            if meta is None or meta.state not in COMPLETION:
                return
            self._remember(tid, meta, revision)
            for effect in rules.completion_effects(meta):
                if not isinstance(effect, WriteMarkers):
                    raise InvariantViolation(f"transactional id {tid!r}: completion effect {effect!r}")
                if not await self._write_all_markers(tid, effect):
                    return  # still prepared in etcd: the next tick resumes it
            prepared = meta

            async def decide(current: TxnMetadata | None, now_ms: int) -> TxnResult | None:
                if current is None or not _same_prepared(current, prepared):
                    return None  # completed meanwhile (by another coordinator)
                return rules.complete(current, now_ms)

            if await self._decide(tid, decide) is not None:
                outcome = "commit" if prepared.state is TxnState.PREPARE_COMMIT else "abort"
                metrics.TRANSACTIONS_COMPLETED.labels(outcome).inc()
        except (CoordinatorUnavailable, TransactionConflict) as exc:
            log.warning("completion of transactional id %r stopped (%s); the next tick resumes it", tid, exc)

    async def _write_all_markers(self, tid: str, markers: WriteMarkers) -> bool:
        """Rounds of WriteTxnMarkers for the partitions not yet marked; True once all are."""
        left: TopicPartitions = markers.partitions
        for round_number in range(limits.TRANSACTION_MARKER_ROUNDS_MAX):
            if round_number:
                await asyncio.sleep(limits.TRANSACTION_MARKER_RETRY_BACKOFF_MS / 1000)
            errors = await self._markers.write_markers(
                markers.producer_id, markers.producer_epoch, markers.commit, left
            )
            left = frozenset(tp for tp in left if errors.get(tp) != MARKER_WRITTEN)
            if not left:
                return True
        log.warning(
            "transactional id %r: %s markers not yet written to %s after %d rounds; the next tick retries",
            tid,
            "COMMIT" if markers.commit else "ABORT",
            _names(left),
            limits.TRANSACTION_MARKER_ROUNDS_MAX,
        )
        return False


def _state_write(result: TxnResult) -> WriteState | DeleteState | None:
    """The result's one state write, if any (two in one step is a bug)."""
    writes = [e for e in result.effects if isinstance(e, WriteState | DeleteState)]
    check(len(writes) <= 1, "%d state writes in one step: %r", len(writes), result)
    return writes[0] if writes else None


def _same_prepared(current: TxnMetadata, prepared: TxnMetadata) -> bool:
    """Still the prepared transaction whose markers were written (a prepared state changes only
    by its completion, so the same state and producer mean the same transaction)."""
    return (current.state, current.producer_id, current.producer_epoch) == (
        prepared.state,
        prepared.producer_id,
        prepared.producer_epoch,
    )


def _names(partitions: Iterable[TopicPartitionKey]) -> str:
    return ", ".join(f"{t}-{p}" for t, p in sorted(partitions))


__all__ = [
    "MARKER_WRITTEN",
    "MarkerWriter",
    "ProducerIdSource",
    "ProducerIdUnavailable",
    "TickReport",
    "TransactionConflict",
    "TransactionDriver",
    "wall_clock_ms",
]
