"""The producer's I/O task: drains ready batches into Produce requests and settles the answers
(Kafka's Sender, aiokafka's producer/sender.py).

One asyncio task per producer runs `Sender.run`. Each pass it:
1. fails batches that waited longer than delivery_timeout_ms;
2. gets a producer id (InitProducerId) when idempotence needs one or a new epoch;
3. drains the ready partitions, numbers and encodes each batch once, and sends one
   Produce request per destination (below). An idempotent producer keeps up to
   max_in_flight_requests batches of a partition in flight, full ones (a partial batch
   keeps taking records until the one ahead is answered; the leader orders them by
   sequence number: one that overtakes its predecessor is refused OUT_OF_ORDER and sent
   again after it; a batch sent again goes alone); without idempotence one, so that a
   retry cannot reorder records;
4. sleeps until the next batch is due (linger, back-off) or someone wakes it.

Where a request goes: straight to each partition's leader, as Metadata names it
(`direct_to_leaders`, the default; one request per leader, at most
`max_in_flight_requests` in flight to each), or through a gateway, which routes it:
when direct_to_leaders is off, and for partitions whose leader is not known now (no
leader in the last Metadata, or the topic marked stale by an error: a background
refresh is started and the gateway, which follows the controller, routes meanwhile).

Answers: success resolves every record's future; a retriable error puts the batch
back at the head of its queue with exponential back-off (the same bytes and
sequence numbers go again, so the leader drops a duplicate) while the delivery
timeout allows; anything else fails the batch whole. DUPLICATE_SEQUENCE_NUMBER
means an earlier attempt was written: success, offset unknown (-1).

Threads: the sync Producer appends from its caller's thread, so every touch of
the accumulator holds `lock`. Futures and callbacks are settled on this task's
thread, outside the lock.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from bisect import bisect_right
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, overload

from clients.accumulator import ProducerBatch, RecordAccumulator
from clients.common import limits, records
from clients.common.errors import InvariantViolation
from clients.config import (
    EXPIRY_TIMER_MARGIN_MS,
    IDEMPOTENT_BATCHES_IN_FLIGHT_MAX,
    RPC_DEADLINE_MARGIN_MS,
    ProducerConfig,
)
from clients.connection import GatewayConnection
from clients.errors import (
    ClientClosed,
    HighwaterError,
    LeaderMoved,
    RequestTimedOut,
    TransactionAbortRequired,
    error_for_code,
)
from clients.idempotence import IdempotenceState
from clients.leaders import LeaderConnections, unless_leader_moves
from clients.metadata import ClusterMetadata, now_ms
from clients.transactions import TransactionManager
from clients.types import FailedRecord, RecordMetadata, TopicPartition
from protos.highwater.v1 import common_pb2

log = logging.getLogger("highwater.client.producer")

# The destination of requests that go through a gateway (a leader's is its "host:port").
VIA_GATEWAY = ""

# Errors after which the batch's sequence numbers cannot be trusted: fail and renumber.
_SEQUENCE_ERRORS = (common_pb2.OUT_OF_ORDER_SEQUENCE_NUMBER, common_pb2.INVALID_PRODUCER_EPOCH)


def backoff_ms(attempts: int, retry_backoff_ms: int, retry_backoff_max_ms: int) -> int:
    """Kafka's exponential retry back-off: retry_backoff_ms * 2^(attempts-1), capped."""
    return min(retry_backoff_max_ms, retry_backoff_ms * (1 << min(max(attempts - 1, 0), 20)))


_NO_HEADERS: list[tuple[str, bytes]] = []


def with_headers(
    batch: ProducerBatch,
) -> list[tuple[bytes | None, bytes | None, list[tuple[str, bytes]], int]]:
    """The batch's records as records.encode_batch takes them: (key, value, headers, timestamp_ms).

    Built just before encoding, so these tuples (which hold lists) never linger in memory.
    """
    headers = batch.headers
    if not headers:
        return [(key, value, _NO_HEADERS, timestamp_ms) for key, value, timestamp_ms in batch.records]
    return [
        (key, value, headers.get(index, _NO_HEADERS), timestamp_ms)
        for index, (key, value, timestamp_ms) in enumerate(batch.records)
    ]


def encode_producer_batch(batch: ProducerBatch, compression: str, transactional: bool = False) -> bytes:
    """The batch as one RecordBatch, with its producer id, epoch and first sequence (and the
    transactional flag for a transactional producer's).

    Bulk runs (each one key and timestamp, no headers) are encoded straight from the
    caller's values; other batches from a tuple per record.
    """
    if batch.runs is not None:
        return records.encode_runs(
            batch.runs,
            compression=compression,
            producer_id=batch.producer_id,
            producer_epoch=batch.producer_epoch,
            base_sequence=batch.base_sequence,
            # size_bytes bounds keys and framing too: close enough to pick the faster encoder.
            large_values=batch.size_bytes >= batch.record_count * records.LARGE_VALUE_BYTES_MIN,
            transactional=transactional,
        )
    return records.encode_batch(
        with_headers(batch),
        compression=compression,
        producer_id=batch.producer_id,
        producer_epoch=batch.producer_epoch,
        base_sequence=batch.base_sequence,
        transactional=transactional,
    )


def settle_batch(
    batch: ProducerBatch, base_offset: int, log_append_time_ms: int, error: HighwaterError | None
) -> None:
    """Resolve every record future, run every callback and tell every bulk sink of a completed batch.

    A callback that raises is logged and does not stop the others (as Kafka's). On failure a
    callback gets the record itself (FailedRecord: topic, partition, key, value...) so that it
    can tell which one failed; the future gets the error alone.
    """
    topic, partition = batch.tp
    # Single records have completions (a bulk run only sinks): only they need a tuple each.
    records_ = batch.materialize() if batch.completions else batch.records
    headers = batch.headers
    for index, future, callback in batch.completions:
        metadata: RecordMetadata | FailedRecord | None = None
        if error is None:
            timestamp_ms = log_append_time_ms if log_append_time_ms >= 0 else records_[index][2]
            metadata = RecordMetadata(
                topic, partition, base_offset + index if base_offset >= 0 else -1, timestamp_ms
            )
        elif callback is not None:
            key, value, timestamp_ms = records_[index]
            metadata = FailedRecord(
                topic, partition, -1, timestamp_ms, key, value, headers.get(index, []) if headers else []
            )
        if future is not None and not future.done():
            try:
                if error is None:
                    future.set_result(metadata)
                else:
                    future.set_exception(error)
            except Exception:  # cancelled by its owner between done() and here
                pass
        if callback is not None:
            try:
                callback(metadata, error)
            except Exception:
                log.exception("a delivery callback for %s raised", batch.tp)
    for index, count, sink, input_start in batch.sinks:
        sink.settle(
            input_start,
            batch.tp,
            base_offset + index if base_offset >= 0 else -1,
            count,
            batch.timestamp_ms(index),
            log_append_time_ms,
            error,
        )


class SentRecords(Sequence[RecordMetadata]):
    """RecordMetadata of every record of a bulk send, in input order, built on access.

    A bulk send of a million records would otherwise build a million tuples nobody reads.
    Holds one entry per batch: (first input index, count, partition, base offset, timestamp).
    """

    __slots__ = ("_runs", "_starts", "_topic", "count")
    # The number of records (public since the first release); it hides Sequence.count(value).
    count: int  # type: ignore[assignment]

    def __init__(self, topic: str, count: int, runs: list[tuple[int, int, int, int, int]]) -> None:
        self._topic = topic
        self.count = count
        self._runs = sorted(runs)
        self._starts = [run[0] for run in self._runs]

    def __len__(self) -> int:
        return self.count

    @overload
    def __getitem__(self, index: int) -> RecordMetadata: ...

    @overload
    def __getitem__(self, index: slice) -> list[RecordMetadata]: ...

    def __getitem__(self, index: int | slice) -> RecordMetadata | list[RecordMetadata]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(self.count))]
        if index < 0:
            index += self.count
        if not 0 <= index < self.count:
            raise IndexError(f"record {index} of a bulk send of {self.count}")
        start, _count, partition, base_offset, timestamp_ms = self._runs[
            bisect_right(self._starts, index) - 1
        ]
        offset = base_offset + index - start if base_offset >= 0 else -1
        return RecordMetadata(self._topic, partition, offset, timestamp_ms)

    def __repr__(self) -> str:
        return f"SentRecords({self._topic!r}, {self.count} records in {len(self._runs)} batches)"


class BulkSendResult:
    """Collects the outcome of one bulk send (many batches) and resolves its future once.

    The future gets SentRecords (every RecordMetadata in input order), or the first error
    (records in other batches of the same call may have been written). Settled on the
    sender's thread.
    """

    __slots__ = ("error", "future", "pending", "runs", "topic")

    def __init__(self, topic: str, count: int, future: Any) -> None:
        self.topic = topic
        self.runs: list[tuple[int, int, int, int, int]] = []
        self.pending = count
        self.error: HighwaterError | None = None
        self.future = future
        if count == 0:
            future.set_result(SentRecords(topic, 0, []))

    def settle(
        self,
        input_start: int,
        tp: TopicPartition,
        base_offset: int,
        count: int,
        timestamp_ms: int,
        log_append_time_ms: int,
        error: HighwaterError | None,
    ) -> None:
        """`count` records from input index `input_start` went to tp (created at timestamp_ms)."""
        if error is not None:
            self.error = self.error or error
        elif count:
            if log_append_time_ms >= 0:
                timestamp_ms = log_append_time_ms
            self.runs.append((input_start, count, tp.partition, base_offset, timestamp_ms))
        self.pending -= count
        if self.pending == 0 and not self.future.done():
            count = sum(run_[1] for run_ in self.runs)
            try:
                if self.error is not None:
                    self.future.set_exception(self.error)
                else:
                    self.future.set_result(SentRecords(self.topic, count, self.runs))
            except Exception:  # cancelled by its owner
                pass


class Sender:
    """The task that moves batches from the accumulator to the partition leaders (or a gateway)."""

    def __init__(
        self,
        config: ProducerConfig,
        accumulator: RecordAccumulator,
        lock: threading.Lock,
        connection: GatewayConnection,
        metadata: ClusterMetadata,
        on_batch_done: Callable[[], None],
        *,
        leaders: LeaderConnections | None = None,
        refresh_topic: Callable[[str], None] | None = None,
    ) -> None:
        self.config = config
        self.accumulator = accumulator
        self.lock = lock
        self.connection = connection
        self.metadata = metadata
        self.on_batch_done = on_batch_done
        # None: every request goes through a gateway (direct_to_leaders off).
        self.leaders = leaders
        # Starts a background Metadata refresh of a topic whose leaders are not known now.
        self.refresh_topic = refresh_topic
        # Requests in flight per destination (a leader's address, or VIA_GATEWAY).
        self._in_flight_to: dict[str, int] = {}
        self.idempotence = IdempotenceState() if config.enable_idempotence else None
        # A transactional producer's transactions (clients/transactions.py): its producer id
        # comes from init_transactions(), and each partition joins the transaction before its
        # first batch goes out.
        self.transactions = (
            TransactionManager(config, connection, self.idempotence)
            if config.transactional and self.idempotence is not None
            else None
        )
        self.fatal_error: HighwaterError | None = None
        # Batches in flight per partition, and the partitions at their limit (not drained):
        # max_in_flight_requests with idempotence (the leader puts them back in order by
        # their sequence numbers, and keeps the last five to spot a resent one) once the
        # leader has acknowledged one of this producer's batches, else one, so that a retry
        # cannot overtake the batch after it.
        self._per_partition_limit = (
            min(config.max_in_flight_requests, IDEMPOTENT_BATCHES_IN_FLIGHT_MAX)
            if self.idempotence is not None
            else 1
        )
        self._in_flight_of: dict[TopicPartition, int] = {}
        self._muted: set[TopicPartition] = set()
        self._in_flight: dict[asyncio.Task[None], list[ProducerBatch]] = {}
        self._init_task: asyncio.Task[None] | None = None
        self._init_retry_at_ms = 0
        self._wake = asyncio.Event()
        self._stopping = False
        self._init_attempts = 0

    # --- control -----------------------------------------------------------------

    def wake(self) -> None:
        """Look again now (must run on the sender's loop)."""
        self._wake.set()

    def stop_when_idle(self) -> None:
        """End `run` once nothing is queued or in flight."""
        self._stopping = True
        self._wake.set()

    async def abort(self, error: HighwaterError) -> None:
        """Fail every queued and in-flight batch with `error` (close without waiting)."""
        with self.lock:
            queued = self.accumulator.abort_queued()
        for batch in queued:
            self._fail(batch, error)
        in_flight = list(self._in_flight.items())
        for task, _batches in in_flight:
            task.cancel()
        if in_flight:
            await asyncio.gather(*(task for task, _ in in_flight), return_exceptions=True)
        for _task, batches in in_flight:
            for batch in batches:
                with self.lock:
                    pending = self.accumulator.is_incomplete(batch)
                if pending:
                    self._fail(batch, error)
        self._stopping = True
        self._wake.set()

    # --- the loop --------------------------------------------------------------------

    async def run(self) -> None:
        """Run passes until stopped and idle. Owns the muted set and the in-flight tasks."""
        while True:
            self._wake.clear()
            now = now_ms()
            delay_ms = self._run_once(now)
            # Wake for the next queued batch's delivery timeout too, whatever else is going on
            # (waiting for a producer id, every partition muted): it fails on time, not late.
            with self.lock:
                expiry_ms = self.accumulator.next_expiry_ms(self.config.delivery_timeout_ms)
            if expiry_ms is not None:
                until_expiry_ms = max(0, expiry_ms - now_ms()) + EXPIRY_TIMER_MARGIN_MS
                delay_ms = until_expiry_ms if delay_ms is None else min(delay_ms, until_expiry_ms)
            if self._stopping and not self._in_flight and self._init_task is None:
                with self.lock:
                    idle = self.accumulator.incomplete_count == 0
                if idle:
                    return
            if delay_ms == 0:
                await asyncio.sleep(0)
                continue
            try:
                await asyncio.wait_for(self._wake.wait(), None if delay_ms is None else delay_ms / 1000)
            except TimeoutError:
                pass

    def _run_once(self, now: int) -> int | None:
        """One pass; ms until the next is due (None: only when woken)."""
        config = self.config
        with self.lock:
            expired = self.accumulator.expire(now, config.delivery_timeout_ms)
        for batch in expired:
            self._fail(batch, self._timeout_error(batch))
        if self.fatal_error is not None:
            with self.lock:
                queued = self.accumulator.abort_queued()
            for batch in queued:
                self._fail(batch, self.fatal_error)
            return None
        if self.idempotence is not None and not self.idempotence.has_producer_id:
            with self.lock:
                waiting = self.accumulator.has_queued()
            if not waiting:
                return None
            if self.transactions is not None:
                # The epoch of a transactional producer changes only through its transactions
                # (init_transactions, abort_transaction): what waits here cannot be sent in this
                # transaction, which must be aborted.
                with self.lock:
                    queued = self.accumulator.abort_queued()
                doubt = TransactionAbortRequired(
                    "the producer's sequence numbers are in doubt after a failed batch"
                )
                for batch in queued:
                    self._fail(batch, doubt)
                return None
            if self._init_task is None and not self._in_flight:
                if now < self._init_retry_at_ms:
                    return self._init_retry_at_ms - now
                self._init_task = asyncio.get_running_loop().create_task(self._init_producer_id())
            return None
        with self.lock:
            ready, next_ms = self.accumulator.ready(now, self._muted)
            if self._in_flight_of:
                # Behind a batch in flight, only a full one follows at once: a partial batch
                # keeps taking records until the one ahead is answered (each request costs
                # the leader far more than its bytes, so at low rates fewer, fuller requests
                # are also faster). A batch sent again goes alone, once nothing of its
                # partition is in flight: the batches after it must not reach the leader first.
                accumulator = self.accumulator
                ready = [
                    tp
                    for tp in ready
                    if tp not in self._in_flight_of
                    or (accumulator.head_is_full(tp) and not accumulator.head_is_retry(tp))
                ]
        if not ready:
            return next_ms
        sent = False
        for destination, tps in self._destinations(ready).items():
            if self._in_flight_to.get(destination, 0) >= config.max_in_flight_requests:
                continue  # woken when one of its requests ends
            with self.lock:
                batches = self.accumulator.drain(tps, config.max_request_bytes)
            if not batches:
                continue
            sent = True
            request = self._build_request(batches)
            if request is None:
                continue
            task = asyncio.get_running_loop().create_task(self._send(destination, request, batches))
            self._in_flight[task] = batches
            self._in_flight_to[destination] = self._in_flight_to.get(destination, 0) + 1
            idempotence = self.idempotence
            for batch in batches:
                if idempotence is not None:
                    idempotence.note_sent(batch)
                count = self._in_flight_of[batch.tp] = self._in_flight_of.get(batch.tp, 0) + 1
                if count >= self._per_partition_limit or (
                    idempotence is not None and not idempotence.leader_knows(batch.tp)
                ):
                    self._muted.add(batch.tp)
        return 0 if sent else next_ms

    def _destinations(self, ready: list[TopicPartition]) -> dict[str, list[TopicPartition]]:
        """Ready partitions by where their request goes: their leader's address, or VIA_GATEWAY."""
        if self.leaders is None:
            return {VIA_GATEWAY: ready}
        by_destination: dict[str, list[TopicPartition]] = {}
        leader_address = self.metadata.leader_address
        for tp in ready:
            address = leader_address(tp)
            if address is None:
                address = VIA_GATEWAY
                if self.refresh_topic is not None:
                    self.refresh_topic(tp.topic)
            by_destination.setdefault(address, []).append(tp)
        return by_destination

    def _build_request(self, batches: list[ProducerBatch]) -> common_pb2.ProduceRequest | None:
        """Number and encode each batch (once; retries reuse the bytes) into one request.

        A batch that cannot be encoded fails whole and is left out; None when none is left.
        """
        config = self.config
        # Built in place: a finished sub-message handed to a constructor is serialised and parsed
        # again, a copy of every batch at each level (12% of the Producer's CPU at 10 KB records).
        request = common_pb2.ProduceRequest(
            acks=config.acks_wire,
            timeout_ms=min(config.request_timeout_ms, limits.PRODUCE_TIMEOUT_MS_MAX),
            transactional_id=config.transactional_id or "",
        )
        by_topic: dict[str, common_pb2.ProduceTopicData] = {}
        for batch in list(batches):
            if self.idempotence is not None and self.idempotence.assign(batch):
                batch.encoded = None
            if batch.encoded is None:
                try:
                    batch.encoded = encode_producer_batch(batch, config.compression, config.transactional)
                except HighwaterError as error:
                    batches.remove(batch)
                    self._fail(batch, error)
                    continue
                except (TypeError, ValueError, OverflowError) as error:
                    batches.remove(batch)
                    self._fail(
                        batch, error_for_code(common_pb2.CORRUPT_MESSAGE, f"cannot encode batch: {error}")
                    )
                    continue
            topic = by_topic.get(batch.tp.topic)
            if topic is None:
                topic = by_topic[batch.tp.topic] = request.topics.add(topic=batch.tp.topic)
            topic.partitions.add(partition=batch.tp.partition, records=batch.encoded)
        if not by_topic:
            return None
        return request

    async def _send(
        self, destination: str, request: common_pb2.ProduceRequest, batches: list[ProducerBatch]
    ) -> None:
        # No batch may outlive its delivery_timeout_ms in flight: the call (connecting, failing
        # over and the RPC) ends by the oldest batch's deadline, which then fails as timed out.
        delivery_deadline_s = (
            min(batch.created_ms for batch in batches) + self.config.delivery_timeout_ms
        ) / 1000
        try:
            try:
                if self.transactions is not None:
                    # Partitions with batches still queued ride along: as Kafka's producer adds a
                    # partition when a record is appended, not when its batch is sent, so a
                    # transaction's partitions take one AddPartitionsToTxn, not one each.
                    with self.lock:
                        queued = self.accumulator.queued_partitions()
                    await self.transactions.add_partitions(
                        [batch.tp for batch in batches], delivery_deadline_s, also=queued
                    )
                if destination == VIA_GATEWAY or self.leaders is None:
                    response = await self.connection.call(
                        "Produce",
                        request,
                        timeout_ms=request.timeout_ms + RPC_DEADLINE_MARGIN_MS,
                        deadline=delivery_deadline_s,
                    )
                else:
                    leaders = self.leaders

                    def call() -> Awaitable[common_pb2.ProduceResponse]:
                        return leaders.call(
                            destination,
                            "Produce",
                            request,
                            timeout_ms=request.timeout_ms + RPC_DEADLINE_MARGIN_MS,
                            deadline=delivery_deadline_s,
                        )

                    if all(batch.producer_id >= 0 for batch in batches):
                        # Idempotent: resent with the same sequence numbers, a batch the old
                        # leader had replicated is a duplicate at the new one, never written twice.
                        response = await unless_leader_moves(
                            call,
                            rpc="Produce",
                            destination=destination,
                            partitions=[batch.tp for batch in batches],
                            leader_address=self.metadata.leader_address,
                            refresh_topic=self.refresh_topic,
                        )
                    else:
                        response = await call()
            except HighwaterError as error:
                if destination != VIA_GATEWAY and not isinstance(error, LeaderMoved):
                    # As Kafka's client after a failed connection: is this broker still the leader?
                    for topic in {batch.tp.topic for batch in batches}:
                        self.metadata.mark_stale(topic)
                for batch in batches:
                    self._retry_or_fail(batch, error)
                return
            answers: dict[tuple[str, int], common_pb2.ProducePartitionResponse] = {}
            for topic in response.topics:
                for part in topic.partitions:
                    answers[(topic.topic, part.partition)] = part
            for batch in batches:
                answer = answers.get(batch.tp)
                if answer is None:
                    self._retry_or_fail(
                        batch,
                        RequestTimedOut(
                            f"the Produce answer of {destination or 'the gateway'} left out {batch.tp}"
                        ),
                    )
                elif answer.error_code == common_pb2.NONE:
                    base_offset = answer.base_offset if self.config.acks_wire != 0 else -1
                    self._succeed(
                        batch, base_offset, answer.log_append_time_ms if answer.log_append_time_ms > 0 else -1
                    )
                elif answer.error_code == common_pb2.DUPLICATE_SEQUENCE_NUMBER:
                    self._succeed(batch, -1, -1)
                else:
                    answer_error = error_for_code(
                        answer.error_code, answer.error_message or f"producing to {batch.tp}"
                    )
                    if (
                        answer.error_code == common_pb2.OUT_OF_ORDER_SEQUENCE_NUMBER
                        and self.idempotence is not None
                        and self.idempotence.waits_for_earlier(batch)
                    ):
                        # It overtook an earlier batch of its partition (or followed one that
                        # failed): sent again once that one is settled.
                        self._retry_or_fail(batch, answer_error, retriable=True)
                    elif answer.error_code in _SEQUENCE_ERRORS:
                        self._fail(batch, answer_error)
                    else:
                        self._retry_or_fail(batch, answer_error)
        finally:
            for batch in batches:
                left = self._in_flight_of.get(batch.tp, 0) - 1
                if left > 0:
                    self._in_flight_of[batch.tp] = left
                else:
                    self._in_flight_of.pop(batch.tp, None)
                self._muted.discard(batch.tp)
            task = asyncio.current_task()
            if task is not None and self._in_flight.pop(task, None) is not None:
                left = self._in_flight_to.get(destination, 0) - 1
                if left > 0:
                    self._in_flight_to[destination] = left
                else:
                    self._in_flight_to.pop(destination, None)
            self._wake.set()

    async def _init_producer_id(self) -> None:
        """InitProducerId: a new id, or a new epoch of ours when sequences must restart."""
        state = self.idempotence
        if state is None:
            raise InvariantViolation("InitProducerId started without idempotence")
        bump = state.producer_id >= 0
        request = common_pb2.InitProducerIdRequest(
            producer_id=state.producer_id if bump else -1,
            producer_epoch=state.producer_epoch if bump else -1,
        )
        try:
            response = await self.connection.call("InitProducerId", request)
            if response.error_code != common_pb2.NONE:
                raise error_for_code(response.error_code, response.error_message or "InitProducerId")
            state.set_producer(response.producer_id, response.producer_epoch)
            self._init_attempts = 0
            log.debug("producer id %d epoch %d", response.producer_id, response.producer_epoch)
        except HighwaterError as error:
            self._init_attempts += 1
            if error.retriable:
                self._init_retry_at_ms = now_ms() + backoff_ms(
                    self._init_attempts, self.config.retry_backoff_ms, self.config.retry_backoff_max_ms
                )
                log.info("InitProducerId failed (%s); retrying", error)
            else:
                self.fatal_error = type(error)(
                    f"the idempotent producer cannot get a producer id: {error.message}"
                )
        finally:
            self._init_task = None
            self._wake.set()

    # --- settling batches ----------------------------------------------------------

    def _retry_or_fail(
        self, batch: ProducerBatch, error: HighwaterError, *, retriable: bool | None = None
    ) -> None:
        """Queue `batch` again if `error` (or the caller, by `retriable`) allows, else fail it."""
        if retriable is None:
            retriable = error.retriable
        batch.last_error = error
        if error.refresh_metadata:
            self.metadata.mark_stale(batch.tp.topic)
        now = now_ms()
        retry_at = now + backoff_ms(
            batch.attempts, self.config.retry_backoff_ms, self.config.retry_backoff_max_ms
        )
        # A retriable error never fails a batch before its delivery timeout: it waits queued
        # (for its back-off, or the timeout if that comes first), and expire() fails it then.
        if (
            retriable
            and not self._stopping_hard()
            and now - batch.created_ms < self.config.delivery_timeout_ms
        ):
            log.debug(
                "retrying %d records to %s after %s (attempt %d)",
                batch.record_count,
                batch.tp,
                error,
                batch.attempts,
            )
            with self.lock:
                self.accumulator.reenqueue(batch, retry_at)
            return
        self._fail(batch, self._timeout_error(batch) if retriable else error)

    def _stopping_hard(self) -> bool:
        return self.fatal_error is not None

    def _timeout_error(self, batch: ProducerBatch) -> HighwaterError:
        last = f"; last error: {batch.last_error}" if batch.last_error is not None else ""
        return RequestTimedOut(
            f"{batch.record_count} record(s) to {batch.tp} not acknowledged within delivery_timeout_ms="
            f"{self.config.delivery_timeout_ms} after {batch.attempts} attempt(s){last}"
        )

    def _succeed(self, batch: ProducerBatch, base_offset: int, log_append_time_ms: int) -> None:
        if self.idempotence is not None:
            self.idempotence.on_batch_acked(batch)
        with self.lock:
            self.accumulator.complete(batch)
        settle_batch(batch, base_offset, log_append_time_ms, None)
        self.on_batch_done()

    def _fail(self, batch: ProducerBatch, error: HighwaterError) -> None:
        if self.idempotence is not None:
            self.idempotence.on_batch_lost(batch)
        if self.transactions is not None:
            self.transactions.on_batch_failed(error)
        with self.lock:
            self.accumulator.complete(batch)
        settle_batch(batch, -1, -1, error)
        self.on_batch_done()


def closed_error(pending_records: int) -> ClientClosed:
    return ClientClosed(f"the producer was closed with {pending_records} record(s) not yet acknowledged")
