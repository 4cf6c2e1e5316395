"""Per-partition batching of records waiting to be sent (Kafka's RecordAccumulator, aiokafka's
message_accumulator.py).

`send()` appends a record to the open batch of its partition; the sender asks
which partitions are `ready` (a batch is full, has lingered `linger_ms`, or
someone flushes, closes or waits for memory), `drain`s their batches into one
request and, after the answer, `complete`s or `reenqueue`s them.

Records stay Python tuples here and are encoded once per batch when drained
(records.encode_batch), never per record: that is what lets one thread encode
millions of records per second. A bulk send's runs stay slices of the caller's
values (`ProducerBatch.runs`, encoded by records.encode_runs): a tuple per
record cost more than the encoding itself.

Invariants:
- A partition's batches leave in the order they were created, and a retried
  batch goes back to the head of its queue, so records of a partition are
  delivered in send order (the sender keeps at most one batch per partition in
  flight).
- A batch is immutable once drained: its records, sequence numbers and bytes
  are what every retry sends again, so the leader can drop a duplicate.
- `buffered_bytes` is the estimated size of every batch not yet completed;
  appends beyond `buffer_memory_bytes` are refused until batches complete.

Pure: no I/O, no clock (time is passed in), no locks. The producer serialises
calls with its own lock (the sync Producer appends from the caller's thread).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from itertools import repeat
from typing import Any

from clients.common.errors import HighwaterError, check
from clients.config import BATCH_OVERHEAD_BYTES
from clients.types import TopicPartition

# (key, value, timestamp_ms): only atomic values, so the garbage collector stops tracking
# the tuple after its first collection. Headers (lists, always tracked) live apart in
# ProducerBatch.headers; with hundreds of thousands of records buffered this keeps full
# collections cheap (measured: bulk appends 4x faster than with headers inside the tuple).
RecordTuple = tuple[bytes | None, bytes | None, int]
# A bulk send's run of values sharing one key and timestamp, without headers: (key, values,
# timestamp_ms), kept as the caller's values (a slice of its list) rather than a tuple per record.
Run = tuple[bytes | None, Sequence[bytes], int]
Headers = list[tuple[str, bytes]]
# (index of the record in its batch, future or None, callback or None)
Completion = tuple[int, Any, Callable[..., Any] | None]
# RecordAccumulator's age_spread_ms when not bounded: any batch takes records.
AGE_SPREAD_MS_UNBOUNDED = 1 << 62


@dataclass(eq=False, slots=True)
class ProducerBatch:
    """Records bound for one partition, sent and acknowledged together."""

    batch_id: int
    tp: TopicPartition
    created_ms: int
    records: list[RecordTuple] = field(default_factory=list)
    # Headers of the records that have any, by index in `records` (None: no record has).
    headers: dict[int, Headers] | None = None
    completions: list[Completion] = field(default_factory=list)
    # Upper bound of the encoded size: the header plus every record's bound.
    size_bytes: int = BATCH_OVERHEAD_BYTES
    # No more appends: the batch is full or has been drained.
    closed: bool = False
    # Requests that carried this batch; > 0 once drained.
    attempts: int = 0
    retry_at_ms: int = 0
    # Idempotence: the identity and first sequence the batch was encoded with.
    producer_id: int = -1
    producer_epoch: int = -1
    base_sequence: int = -1
    # Whether the last attempt left while an earlier batch of its partition was unacknowledged
    # (IdempotenceState.note_sent): an OUT_OF_ORDER answer to it then means it overtook.
    sent_behind: bool = False
    encoded: bytes | None = None
    last_error: HighwaterError | None = None
    # Batches merged into this one at drain; they complete with it.
    absorbed_ids: list[int] = field(default_factory=list)
    # Bulk sends: (index of the first record in this batch, record count, sink, index of that
    # record in the sender's input); the sink hears about the whole run at once.
    sinks: list[tuple[int, int, Any, int]] = field(default_factory=list)
    # A batch made of bulk runs (one, or several merged at drain) keeps them here, in order,
    # and `records` empty until something needs a tuple per record (a merge with single
    # records): building the tuples cost more than encoding the batch.
    runs: list[Run] | None = None
    run_records: int = 0

    @property
    def record_count(self) -> int:
        return self.run_records if self.runs is not None else len(self.records)

    def timestamp_ms(self, index: int) -> int:
        """The create time of the record at `index`."""
        if self.runs is None:
            return self.records[index][2]
        for _, values, timestamp_ms in self.runs:
            if index < len(values):
                return timestamp_ms
            index -= len(values)
        raise IndexError(f"record {index} past the end of a batch of {self.run_records}")

    def materialize(self) -> list[RecordTuple]:
        """`records` as one tuple per record (runs are expanded once)."""
        if self.runs is not None:
            self.records = [
                record
                for key, values, timestamp_ms in self.runs
                for record in zip(repeat(key), values, repeat(timestamp_ms), strict=False)
            ]
            self.runs = None
            self.run_records = 0
        return self.records


class RecordAccumulator:
    """Queues of batches per partition, with the sizing and timing rules of Kafka's producer."""

    def __init__(
        self,
        *,
        batch_size_bytes: int,
        linger_ms: int,
        max_batch_bytes: int,
        buffer_memory_bytes: int,
        age_spread_ms: int = AGE_SPREAD_MS_UNBOUNDED,
    ) -> None:
        check(
            0 < batch_size_bytes <= max_batch_bytes <= buffer_memory_bytes,
            "need 0 < batch_size_bytes (%d) <= max_batch_bytes (%d) <= buffer_memory_bytes (%d)",
            batch_size_bytes,
            max_batch_bytes,
            buffer_memory_bytes,
        )
        self.batch_size_bytes = batch_size_bytes
        self.linger_ms = linger_ms
        self.max_batch_bytes = max_batch_bytes
        self.buffer_memory_bytes = buffer_memory_bytes
        # A batch times out by its creation (delivery_timeout_ms), so no record may join one
        # created more than this before it (appended or merged): a record fails at most this
        # much before its own delivery timeout. Normally the open batch is milliseconds old;
        # only a partition stuck behind an in-flight request (an outage) keeps one open longer.
        self.age_spread_ms = age_spread_ms
        self.buffered_bytes = 0
        self.flushes_in_progress = 0
        # Appenders blocked on buffer memory: while > 0 every batch is ready at once.
        self.memory_waiters = 0
        self.closing = False
        self._queues: dict[TopicPartition, deque[ProducerBatch]] = {}
        # Every batch created and not yet completed, in creation (= id) order.
        self._incomplete: dict[int, ProducerBatch | None] = {}
        self._next_batch_id = 0
        self._drain_start = 0

    # --- appending (caller's side) -------------------------------------------

    def has_room(self, size_bytes: int) -> bool:
        """Whether a record of size_bytes fits the buffer (an empty buffer always takes one)."""
        return self.buffered_bytes == 0 or self.buffered_bytes + size_bytes <= self.buffer_memory_bytes

    def append(
        self,
        tp: TopicPartition,
        record: RecordTuple,
        headers: Headers | None,
        size_bytes: int,
        completion_future: Any,
        completion_callback: Callable[..., Any] | None,
        now_ms: int,
    ) -> tuple[bool, bool]:
        """Add a record to tp's open batch (a new batch when it would not fit).

        Returns (new_batch_created, batch_now_full): either means the sender should
        look again. The caller checked `has_room` and that the record fits max_batch_bytes.
        Called once per record: keep it short.
        """
        queue = self._queues.get(tp)
        batch = queue[-1] if queue else None
        created = False
        if (
            batch is None
            or batch.closed
            or batch.size_bytes + size_bytes > self.batch_size_bytes
            or now_ms - batch.created_ms > self.age_spread_ms
        ):
            batch = self._open_batch(tp, queue, now_ms)
            created = True
        if completion_future is not None or completion_callback is not None:
            batch.completions.append((len(batch.records), completion_future, completion_callback))
        if headers:
            if batch.headers is None:
                batch.headers = {}
            batch.headers[len(batch.records)] = headers
        batch.records.append(record)
        batch.size_bytes += size_bytes
        self.buffered_bytes += size_bytes
        if batch.size_bytes >= self.batch_size_bytes:
            batch.closed = True
            return created, True
        return created, False

    def append_run(
        self,
        tp: TopicPartition,
        run: Run,
        headers: Headers | None,
        size_bytes: int,
        sink: Any,
        sink_start: int,
        now_ms: int,
    ) -> None:
        """Queue `run` (a run of a bulk send, about a batch in size) as one closed batch.

        `sink.settle(...)` hears how they went (see ProducerBatch.sinks); `sink_start`
        is the position of the first record in the caller's input.
        """
        batch = self._open_batch(tp, self._queues.get(tp), now_ms)
        count = len(run[1])
        batch.runs, batch.run_records = [run], count
        if headers:
            batch.materialize()
            batch.headers = dict.fromkeys(range(count), headers)
        batch.sinks.append((0, count, sink, sink_start))
        batch.size_bytes += size_bytes
        batch.closed = True
        self.buffered_bytes += size_bytes

    def _open_batch(
        self, tp: TopicPartition, queue: deque[ProducerBatch] | None, now_ms: int
    ) -> ProducerBatch:
        if queue is None:
            queue = self._queues[tp] = deque()
        elif queue:
            queue[-1].closed = True
        batch = ProducerBatch(self._next_batch_id, tp, now_ms)
        self._incomplete[batch.batch_id] = batch
        self._next_batch_id += 1
        self.buffered_bytes += BATCH_OVERHEAD_BYTES
        queue.append(batch)
        return batch

    # --- the sender's side -----------------------------------------------------

    def ready(self, now_ms: int, muted: set[TopicPartition]) -> tuple[list[TopicPartition], int | None]:
        """Partitions whose first batch should be sent now, and ms until the next one will be
        (None: nothing is waiting). Muted partitions (a batch in flight) are skipped.
        """
        ready: list[TopicPartition] = []
        next_ms: int | None = None
        hurry = self.flushes_in_progress > 0 or self.closing or self.memory_waiters > 0
        for tp, queue in self._queues.items():
            if not queue or tp in muted:
                continue
            first = queue[0]
            if first.attempts > 0:
                wait_ms = first.retry_at_ms - now_ms
            elif hurry or len(queue) > 1 or first.closed:
                wait_ms = 0
            else:
                wait_ms = first.created_ms + self.linger_ms - now_ms
            if wait_ms <= 0:
                ready.append(tp)
            elif next_ms is None or wait_ms < next_ms:
                next_ms = wait_ms
        return ready, next_ms

    def drain(self, ready: list[TopicPartition], max_request_bytes: int) -> list[ProducerBatch]:
        """Take the first batch of each ready partition, up to max_request_bytes in all.

        A partition's never-sent batches are merged into one (up to max_batch_bytes):
        a producer that falls behind sends fewer, bigger batches, since per-request
        cost dominates (FACTS.md). Only batches created within `age_spread_ms` of the
        first are merged: a merged batch times out by its oldest record. Partitions are
        visited from a rotating start so none starves when the request fills up.
        """
        drained: list[ProducerBatch] = []
        if not ready:
            return drained
        request_bytes = 0
        start = self._drain_start % len(ready)
        self._drain_start += 1
        for tp in ready[start:] + ready[:start]:
            queue = self._queues[tp]
            first = queue[0]
            if drained and request_bytes + first.size_bytes > max_request_bytes:
                continue
            batch = queue.popleft()
            if batch.attempts == 0:
                limit = min(self.max_batch_bytes, max_request_bytes - request_bytes)
                while (
                    queue
                    and queue[0].attempts == 0
                    and batch.size_bytes + queue[0].size_bytes - BATCH_OVERHEAD_BYTES <= limit
                    and queue[0].created_ms - batch.created_ms <= self.age_spread_ms
                ):
                    self._merge(batch, queue.popleft())
            batch.closed = True
            batch.attempts += 1
            request_bytes += batch.size_bytes
            drained.append(batch)
            if not queue:
                del self._queues[tp]
        return drained

    def _merge(self, into: ProducerBatch, other: ProducerBatch) -> None:
        if into.runs is not None and other.runs is not None:
            shift = into.run_records
            into.runs.extend(other.runs)
            into.run_records += other.run_records
        else:
            shift = len(into.materialize())
            into.records.extend(other.materialize())
        if other.headers:
            if into.headers is None:
                into.headers = {}
            into.headers.update((index + shift, headers) for index, headers in other.headers.items())
        into.completions.extend(
            (index + shift, future, callback) for index, future, callback in other.completions
        )
        into.sinks.extend((index + shift, count, sink, start) for index, count, sink, start in other.sinks)
        into.size_bytes += other.size_bytes - BATCH_OVERHEAD_BYTES
        self.buffered_bytes -= BATCH_OVERHEAD_BYTES
        into.absorbed_ids.append(other.batch_id)
        into.absorbed_ids.extend(other.absorbed_ids)
        # Still incomplete (flush waits for it) but only through `into` now.
        self._incomplete[other.batch_id] = None

    def reenqueue(self, batch: ProducerBatch, retry_at_ms: int) -> None:
        """Put a batch that failed with a retriable error back at the head of its queue, in
        creation (sequence) order among other batches waiting to be retried: with several in
        flight, their answers may come back in any order."""
        check(batch.batch_id in self._incomplete, "reenqueue of completed batch %d", batch.batch_id)
        batch.retry_at_ms = retry_at_ms
        queue = self._queues.setdefault(batch.tp, deque())
        index = 0
        while index < len(queue) and queue[index].attempts > 0 and queue[index].batch_id < batch.batch_id:
            index += 1
        queue.insert(index, batch)

    def head_is_full(self, tp: TopicPartition) -> bool:
        """Whether tp's next batch takes no more records (full or closed), or must go now
        (a flush, close or a send waiting for memory)."""
        queue = self._queues.get(tp)
        if queue is None or not queue:
            return False
        hurry = self.flushes_in_progress > 0 or self.closing or self.memory_waiters > 0
        return hurry or len(queue) > 1 or queue[0].closed

    def head_is_retry(self, tp: TopicPartition) -> bool:
        """Whether tp's next batch to send is one being sent again."""
        queue = self._queues.get(tp)
        return queue is not None and bool(queue) and queue[0].attempts > 0

    def expire(self, now_ms: int, delivery_timeout_ms: int) -> list[ProducerBatch]:
        """Remove and return queued (not in-flight) batches older than delivery_timeout_ms."""
        expired: list[ProducerBatch] = []
        for tp in list(self._queues):
            queue = self._queues[tp]
            while queue and now_ms - queue[0].created_ms >= delivery_timeout_ms:
                batch = queue.popleft()
                batch.closed = True
                expired.append(batch)
            if not queue:
                del self._queues[tp]
        return expired

    def next_expiry_ms(self, delivery_timeout_ms: int) -> int | None:
        """When the next queued batch reaches delivery_timeout_ms (None: nothing queued).

        A queue's head is its oldest batch (new batches go to the tail, retried ones back
        to the head), so only heads are looked at.
        """
        heads = [queue[0].created_ms for queue in self._queues.values() if queue]
        return min(heads) + delivery_timeout_ms if heads else None

    def abort_queued(self) -> list[ProducerBatch]:
        """Remove and return every queued batch (close without waiting)."""
        batches = [batch for queue in self._queues.values() for batch in queue]
        for batch in batches:
            batch.closed = True
        self._queues.clear()
        return batches

    def complete(self, batch: ProducerBatch) -> None:
        """The batch is acknowledged or failed for good: release its memory."""
        check(batch.batch_id in self._incomplete, "batch %d completed twice", batch.batch_id)
        del self._incomplete[batch.batch_id]
        for absorbed_id in batch.absorbed_ids:
            del self._incomplete[absorbed_id]
        self.buffered_bytes -= batch.size_bytes
        check(self.buffered_bytes >= 0, "buffered_bytes went negative (%d)", self.buffered_bytes)

    # --- flush bookkeeping -----------------------------------------------------

    @property
    def last_batch_id(self) -> int:
        """Id of the newest batch created so far (-1 before the first)."""
        return self._next_batch_id - 1

    def done_up_to(self, batch_id: int) -> bool:
        """Whether every batch with an id <= batch_id has completed."""
        return not self._incomplete or next(iter(self._incomplete)) > batch_id

    def incomplete_records(self, up_to_batch_id: int | None = None) -> int:
        return sum(
            batch.record_count
            for batch_id, batch in self._incomplete.items()
            if batch is not None and (up_to_batch_id is None or batch_id <= up_to_batch_id)
        )

    def is_incomplete(self, batch: ProducerBatch) -> bool:
        return batch.batch_id in self._incomplete

    def has_queued(self) -> bool:
        return any(self._queues.values())

    @property
    def incomplete_count(self) -> int:
        return len(self._incomplete)

    def queued_partitions(self) -> Iterable[TopicPartition]:
        return list(self._queues)
