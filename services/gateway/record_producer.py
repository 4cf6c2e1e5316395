"""ProduceRecords' I/O: the gateway as an idempotent producer on its clients' behalf.

The gateway holds a producer id (InitProducerId from the controller, taken at the first
ProduceRecords) and one sequence number per partition, as our Python Producer does for
itself (clients/idempotence.py). One sender task per partition writes its batches, one
Produce at a time, so the leader always sees them in sequence order; requests that
queue meanwhile go out together in the next Produce. A retry of the gateway's own after
a leader change (the Produce path's routing retries) carries the same numbers and is
written once.

A batch that failed for good (or whose outcome is unknown once the request's time ran
out) leaves a gap or an unknown in that partition's numbering; Kafka's producer bumps its
epoch then. Here the partition takes a fresh producer id instead, starting again at
sequence 0, which the leader accepts as a new producer: the other partitions keep theirs.

A client's own retry is recognised by its request id: the first request's answer (or
the task still computing it) is kept for PRODUCE_REQUEST_ID_KEPT_MS and at most
PRODUCE_REQUEST_IDS_KEPT finished ones (one still running is never forgotten; each ends
within its timeout_ms, at most PRODUCE_TIMEOUT_MS_MAX). The write itself runs as a task
of its own so a client that goes away mid-request does not cut it short (its retry
would otherwise find half a write, and the partition's numbering an unknown).

Owned by the gateway's event loop.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict, deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from clients.common.limits import BATCH_SIZE_BYTES_DEFAULT
from clients.common.partitioner import StickyPartitioner
from protos.highwater.v1 import common_pb2, gateway_pb2
from services.common import limits
from services.common.metadata_cache import MetadataCache
from services.gateway import record_level
from services.gateway.record_transaction import produce_in_transaction
from services.gateway.transaction_calls import GatewayTransactions
from services.security.interceptor import CURRENT_CALLER

# A Produce's bytes besides its batches: topic name, field tags and lengths (a topic name is
# at most 249 characters).
SEND_OVERHEAD_BYTES = 1024

SendProduce = Callable[[common_pb2.ProduceRequest], Awaitable[common_pb2.ProduceResponse]]
InitProducerId = Callable[[common_pb2.InitProducerIdRequest], Awaitable[common_pb2.InitProducerIdResponse]]


@dataclass
class PendingWrite:
    """One request's records for one partition, cut into batches, waiting for the partition's sender."""

    request: gateway_pb2.ProduceRecordsRequest
    partition: int
    batches: list[list[int]]  # request indexes, batch by batch; shrinks as batches are sent
    now_ms: int  # the timestamp of records without one
    deadline: float  # time.monotonic() by which the request must be answered
    done: asyncio.Future[dict[int, gateway_pb2.RecordResult]]
    results: dict[int, gateway_pb2.RecordResult] = field(default_factory=dict)
    failed: tuple[common_pb2.ErrorCode, str] | None = None


@dataclass
class PartitionSequence:
    """The producer identity and next sequence number the gateway uses for one partition.

    Owned by the partition's sender task (`sender`) while it runs: only it numbers batches.
    """

    producer_id: int = -1
    producer_epoch: int = -1
    next_sequence: int = 0
    # After a failed batch: the next batch goes under a new producer id, from sequence 0.
    needs_fresh_id: bool = False
    queue: deque[PendingWrite] = field(default_factory=deque)
    sender: asyncio.Future[None] | None = None


def _take_group(queue: deque[PendingWrite]) -> list[tuple[PendingWrite, list[list[int]]]]:
    """The batches of the next send, from the head of the queue, in order.

    At most PRODUCER_BATCHES_KEPT batches: the leader recognises a resent Produce (the
    gateway's routing retry) only if it still remembers every batch of it. A request
    whose earlier batches failed has its remaining ones failed here, unsent, so what a
    request wrote to a partition is always a prefix of what it sent.
    """
    group: list[tuple[PendingWrite, list[list[int]]]] = []
    count = 0
    while queue and count < limits.PRODUCER_BATCHES_KEPT:
        head = queue[0]
        if head.failed is not None:
            code, message = head.failed
            for batch in head.batches:
                head.results.update(
                    record_level.failed_results(
                        batch,
                        head.partition,
                        code,
                        f"not sent: an earlier batch of this partition in this request failed ({message})",
                    )
                )
            head.batches = []
            queue.popleft()
            _settle([(head, [])])
            continue
        room = limits.PRODUCER_BATCHES_KEPT - count
        chunk, rest = head.batches[:room], head.batches[room:]
        group.append((head, chunk))
        count += len(chunk)
        head.batches = rest
        if rest:
            break
        queue.popleft()
    return group


def _fail(
    group: list[tuple[PendingWrite, list[list[int]]]], code: common_pb2.ErrorCode, message: str
) -> None:
    for pending, batches in group:
        for batch in batches:
            pending.results.update(record_level.failed_results(batch, pending.partition, code, message))
        pending.failed = (code, message)
    _settle(group)


def _settle(group: list[tuple[PendingWrite, list[list[int]]]]) -> None:
    """Answer the requests of `group` that have no batch left to send."""
    for pending, _ in group:
        if not pending.batches and not pending.done.done():
            pending.done.set_result(pending.results)


class RecordProducer:
    """ProduceRecords for one gateway: plan (record_level.py), queue per partition, send, answer.

    `send` is the gateway's Produce path (routing and its retries), `init_producer_id` its
    InitProducerId pass-through to the controller. Raises nothing for operating errors:
    they are answered per record.
    """

    def __init__(
        self,
        cache: MetadataCache,
        send: SendProduce,
        init_producer_id: InitProducerId,
        refresh_metadata: Callable[[], Awaitable[None]],
        *,
        records_per_batch_max: int = limits.RECORDS_PER_BATCH_MAX,
        request_bytes_max: int = limits.GRPC_MAX_MESSAGE_BYTES,
        transactions: GatewayTransactions | None = None,
    ) -> None:
        """`records_per_batch_max` and `request_bytes_max`: what the brokers accept (their
        --max-batch-records and --max-request-bytes, which the gateway shares)."""
        self.cache = cache
        self._records_per_batch_max = records_per_batch_max
        # A send carries up to PRODUCER_BATCHES_KEPT batches; each gets a share of the request bound.
        self._send_batch_bytes_max = (request_bytes_max - SEND_OVERHEAD_BYTES) // limits.PRODUCER_BATCHES_KEPT
        self._send = send
        # A request with a transactional_id is written as one transaction (record_transaction.py).
        self._transactions = transactions
        self._init_producer_id = init_producer_id
        self._refresh_metadata = refresh_metadata
        # Keyless records stick to a partition for the Producer's batch size, as clients/producer.py does.
        self._sticky = StickyPartitioner(BATCH_SIZE_BYTES_DEFAULT)
        self._sequences: dict[tuple[str, int], PartitionSequence] = {}
        self._shared_identity: tuple[int, int] | None = None
        self._identity_lock = asyncio.Lock()
        # (principal, topic, request id) -> (monotonic ms when it started, the task answering it)
        self._requests: OrderedDict[
            tuple[str, str, str], tuple[float, asyncio.Task[gateway_pb2.ProduceRecordsResponse]]
        ] = OrderedDict()

    async def produce(self, request: gateway_pb2.ProduceRecordsRequest) -> gateway_pb2.ProduceRecordsResponse:
        """Write the request's records (its checks passed); the same request id gets the same answer."""
        if not request.request_id:
            return await asyncio.shield(asyncio.ensure_future(self._produce(request)))
        caller = CURRENT_CALLER.get()
        key = (caller.principal if caller is not None else "", request.topic, request.request_id)
        now_ms = time.monotonic() * 1000
        self._forget_old_requests(now_ms)
        entry = self._requests.get(key)
        if entry is None:
            entry = (now_ms, asyncio.ensure_future(self._produce(request)))
            self._requests[key] = entry
        return await asyncio.shield(entry[1])

    def _forget_old_requests(self, now_ms: float) -> None:
        while self._requests:
            started_ms, task = next(iter(self._requests.values()))
            too_many = len(self._requests) >= limits.PRODUCE_REQUEST_IDS_KEPT
            if not task.done() or (not too_many and now_ms - started_ms < limits.PRODUCE_REQUEST_ID_KEPT_MS):
                return
            self._requests.popitem(last=False)

    async def _produce(
        self, request: gateway_pb2.ProduceRecordsRequest
    ) -> gateway_pb2.ProduceRecordsResponse:
        timeout_ms = min(
            request.timeout_ms or limits.PRODUCE_TIMEOUT_MS_DEFAULT, limits.PRODUCE_TIMEOUT_MS_MAX
        )
        deadline = time.monotonic() + timeout_ms / 1000
        topic = request.topic
        if topic not in self.cache.topics():
            await self._refresh_metadata()
        states = self.cache.partitions_of(topic)
        if not states:
            return gateway_pb2.ProduceRecordsResponse(
                topic=topic,
                results=record_level.failed_results(
                    range(len(request.records)),
                    -1,
                    common_pb2.UNKNOWN_TOPIC_OR_PARTITION,
                    f"topic {topic!r} does not exist",
                ).values(),
            )
        available = [s.partition for s in states if s.leader >= 0 and s.leader in self.cache.brokers]
        plan = record_level.plan_produce(topic, request.records, len(states), available, self._sticky)
        results: dict[int, gateway_pb2.RecordResult] = {}
        for index, (code, message) in plan.refused.items():
            results.update(record_level.failed_results([index], -1, code, message))
        config = self.cache.topic_configs.get(topic)
        batch_bytes_max = min(limits.RECORD_BATCH_BYTES_TARGET, self._send_batch_bytes_max)
        if config is not None and config.max_message_bytes > 0:
            batch_bytes_max = min(batch_bytes_max, config.max_message_bytes)
        if request.transactional_id and self._transactions is not None:
            results.update(
                await produce_in_transaction(
                    request,
                    plan,
                    transactions=self._transactions,
                    send=self._send,
                    batch_bytes_max=batch_bytes_max,
                    records_per_batch_max=self._records_per_batch_max,
                    deadline=deadline,
                )
            )
            return gateway_pb2.ProduceRecordsResponse(
                topic=topic, results=[results[i] for i in range(len(request.records))]
            )
        writes = [
            self._write_partition(request, partition, indexes, batch_bytes_max, deadline)
            for partition, indexes in plan.by_partition.items()
        ]
        for written in await asyncio.gather(*writes):
            results.update(written)
        return gateway_pb2.ProduceRecordsResponse(
            topic=topic, results=[results[i] for i in range(len(request.records))]
        )

    async def _write_partition(
        self,
        request: gateway_pb2.ProduceRecordsRequest,
        partition: int,
        indexes: list[int],
        batch_bytes_max: int,
        deadline: float,
    ) -> dict[int, gateway_pb2.RecordResult]:
        """Queue one request's records for their partition's sender and wait for their results."""
        tp = (request.topic, partition)
        state = self._sequences.setdefault(tp, PartitionSequence())
        batches = record_level.cut_batches(
            request.records, indexes, batch_bytes_max, self._records_per_batch_max
        )
        pending = PendingWrite(
            request,
            partition,
            batches,
            int(time.time() * 1000),
            deadline,
            asyncio.get_running_loop().create_future(),
        )
        state.queue.append(pending)
        if state.sender is None or state.sender.done():
            state.sender = asyncio.ensure_future(self._send_queued(partition, state))
        return await pending.done

    async def _send_queued(self, partition: int, state: PartitionSequence) -> None:
        """The partition's sender: one Produce at a time, each carrying what queued meanwhile.

        Requests that arrive while a send is in flight go out together in the next one, so
        concurrent requests to one partition share its round trips (a Kafka producer's
        accumulator does the same) while the leader still sees the sequence numbers in order.
        """
        try:
            while state.queue:
                group = _take_group(state.queue)
                if group:
                    await self._send_group(partition, state, group)
        except BaseException as exc:
            for pending in state.queue:
                if not pending.done.done():
                    pending.done.set_exception(exc)
            state.queue.clear()
            raise

    async def _send_group(
        self, partition: int, state: PartitionSequence, group: list[tuple[PendingWrite, list[list[int]]]]
    ) -> None:
        topic = group[0][0].request.topic
        if state.producer_id < 0:
            problem = await self._take_identity(state)
            if problem is not None:
                _fail(group, *problem)
                return
        remaining_ms = int((min(pending.deadline for pending, _ in group) - time.monotonic()) * 1000)
        if remaining_ms <= 0:
            _fail(
                group,
                common_pb2.REQUEST_TIMED_OUT,
                "the request's timeout_ms ran out before these records could be sent",
            )
            return
        encoded = []
        sequence = state.next_sequence
        for pending, batches in group:
            for batch in batches:
                encoded.append(
                    record_level.encode_records(
                        pending.request.records,
                        batch,
                        now_ms=pending.now_ms,
                        compression=pending.request.compression,
                        producer_id=state.producer_id,
                        producer_epoch=state.producer_epoch,
                        base_sequence=sequence,
                    )
                )
                sequence = record_level.next_sequence(sequence, len(batch))
        # Built in place: finished sub-messages handed to a constructor are copied once per level.
        request = common_pb2.ProduceRequest(acks=-1, timeout_ms=remaining_ms)
        request.topics.add(topic=topic).partitions.add(partition=partition, records=b"".join(encoded))
        answer = await self._send(request)
        p = answer.topics[0].partitions[0]
        if p.error_code != common_pb2.NONE:
            # A gap or an unknown in this partition's numbering: start afresh (module docstring).
            state.producer_id, state.producer_epoch, state.next_sequence = -1, -1, 0
            state.needs_fresh_id = True
            _fail(group, p.error_code, p.error_message)
            return
        state.next_sequence = sequence
        offset = p.base_offset
        for pending, batches in group:
            records = pending.request.records
            flat = [i for batch in batches for i in batch]
            timestamps = [
                records[i].timestamp_ms if records[i].HasField("timestamp_ms") else pending.now_ms
                for i in flat
            ]
            pending.results.update(
                record_level.written_results(flat, partition, offset, timestamps, p.log_append_time_ms)
            )
            offset += len(flat)
        _settle(group)

    async def _take_identity(self, state: PartitionSequence) -> tuple[common_pb2.ErrorCode, str] | None:
        """Give `state` a producer id: the gateway's shared one at first, a fresh one after a failure."""
        async with self._identity_lock:
            if self._shared_identity is not None and not state.needs_fresh_id:
                identity = self._shared_identity
            else:
                resp = await self._init_producer_id(
                    common_pb2.InitProducerIdRequest(producer_id=-1, producer_epoch=-1)
                )
                if resp.error_code != common_pb2.NONE:
                    return resp.error_code, f"the gateway could not get a producer id: {resp.error_message}"
                identity = (resp.producer_id, resp.producer_epoch)
                if self._shared_identity is None:
                    self._shared_identity = identity
        state.producer_id, state.producer_epoch = identity
        state.next_sequence = 0
        state.needs_fresh_id = False
        return None
