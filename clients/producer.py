"""Producers: `Producer` (synchronous, thread-safe) and `AsyncProducer` (asyncio).

Both share `_ProducerCore`: argument checks, the partitioner, the accumulator and
the sender task (clients/sender.py). A record goes

    send() -> checks, partition -> accumulator (per-partition batch)
           -> sender: drain, number, encode once per batch, Produce -> futures resolved

Defaults are Kafka's: acks="all", idempotence on (a retried batch carries the
same producer id, epoch and sequence numbers, so the leader drops a duplicate),
linger_ms=5, delivery_timeout_ms=120 s; but batch_size_bytes=64 KiB (Kafka's is 16 KiB:
a batch costs our Python more than its bytes; clients/common/limits.py says what it gains).

Delivery is reported through futures resolving to RecordMetadata(topic,
partition, offset, timestamp_ms) — concurrent.futures.Future from Producer,
asyncio.Future from AsyncProducer — and optional callbacks
`callback(metadata, error)`, run on the producer's I/O thread; keep them short. On failure
the callback gets a FailedRecord (topic, partition, offset -1, timestamp, key, value,
headers) with the error, so it can tell which record failed.

Timeouts are keyword arguments in milliseconds (`flush(timeout_ms=10_000)`): a positional
value is refused, since confluent-kafka's flush(10.0) means seconds.

The synchronous Producer runs its sender on a private event-loop thread; `send`
appends from the caller's thread under a lock without crossing to that thread
(a wake-up is posted once per batch, not per record, and not again while one
is pending). `produce` is the same without a future (about 3x cheaper per
record: no Future to create and settle). `send_batch` takes a list of values
and does its per-record work in C loops; its values are queued as slices of
the caller's list (no tuple per record) and encoded straight from them, with
one wake-up per call: the way to load millions of records per second (one
future per call).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import threading
import time
import weakref
from bisect import bisect_right
from collections.abc import Callable, Generator, Iterable, Iterator, Mapping, Sequence
from itertools import accumulate
from time import monotonic, time_ns
from typing import Any

from clients.accumulator import Headers, RecordAccumulator, RecordTuple, Run
from clients.common.errors import UnknownTopicOrPartition
from clients.common.partitioner import StickyPartitioner, partition_for_key
from clients.config import (
    BATCH_OVERHEAD_BYTES,
    CLOSE_SHUTDOWN_TIMEOUT_MS,
    DEFAULT_BOOTSTRAP,
    DELIVERY_TIMEOUT_SPREAD_PERCENT,
    FLUSH_CHECK_INTERVAL_S,
    HEADER_OVERHEAD_BYTES_MAX,
    PRODUCER_CLOSE_AT_EXIT_TIMEOUT_MS,
    RECORD_OVERHEAD_BYTES_MAX,
    SENDER_STOP_WAIT_S,
    ProducerConfig,
    build_config,
    check_int,
    check_topic_name,
)
from clients.connection import GatewayConnection
from clients.errors import (
    ClientClosed,
    HighwaterError,
    InvalidArgument,
    MessageTooLarge,
    RequestTimedOut,
    check_no_positional_timeout,
)
from clients.leaders import LeaderConnections
from clients.loop_thread import LoopThread
from clients.metadata import ClusterMetadata, MetadataFetcher, TopicInfo, now_ms
from clients.sender import BulkSendResult, Sender, SentRecords, closed_error
from clients.transactions import GroupMetadata, TransactionManager
from clients.types import FailedRecord, RecordMetadata, TopicPartition

log = logging.getLogger("highwater.client.producer")

# callback(metadata, error): (RecordMetadata, None) once acknowledged, (FailedRecord, error)
# when the record failed (FailedRecord carries its topic, partition, key and value).
Callback = Callable[[RecordMetadata | FailedRecord, HighwaterError | None], Any]
HeadersArg = Iterable[tuple[str, bytes]] | Mapping[str, bytes] | None
# A record checked and placed but not yet appended (no buffer room): (tp, record, headers, size).
Pending = tuple[TopicPartition, RecordTuple, Headers | None, int]

_NO_HEADERS: Headers = []


def _check_bytes(name: str, value: object) -> bytes | None:
    if value is None or type(value) is bytes:
        return value
    if isinstance(value, (bytearray, memoryview)):
        return bytes(value)
    if isinstance(value, bytes):
        return bytes(value)
    raise InvalidArgument(
        f"{name} must be bytes or None, got {type(value).__name__}"
        + (" (encode it first, e.g. .encode())" if isinstance(value, str) else "")
    )


def _check_headers(headers: HeadersArg) -> tuple[Headers, int]:
    """(headers as a list, their size bound in bytes); InvalidArgument for a bad one."""
    if headers is None:
        return _NO_HEADERS, 0
    items = list(headers.items()) if isinstance(headers, Mapping) else list(headers)
    size = 0
    checked: Headers = []
    for item in items:
        if not isinstance(item, tuple) or len(item) != 2:
            raise InvalidArgument(f"a header must be a (str, bytes) pair, got {item!r}")
        name, value = item
        if not isinstance(name, str) or not name:
            raise InvalidArgument(f"a header name must be a non-empty str, got {name!r}")
        value_bytes = _check_bytes(f"header {name!r} value", value)
        size += (
            len(name.encode())
            + (len(value_bytes) if value_bytes is not None else 0)
            + HEADER_OVERHEAD_BYTES_MAX
        )
        # A None value (Kafka's null header) encodes fine, but clients/common/records.py types
        # header values as bytes only.
        checked.append((name, value_bytes))  # type: ignore[arg-type]
    return checked, size


def _log_sender_end(task: asyncio.Task[None]) -> None:
    """A sender that ends with an exception is a bug: say so (sends then raise ClientClosed)."""
    if not task.cancelled() and task.exception() is not None:
        log.error("the producer's sender task failed", exc_info=task.exception())


class _ProducerCore:
    """What both producers share. Appends may come from any thread; the rest runs on `loop`."""

    def __init__(
        self,
        config: ProducerConfig,
        loop: asyncio.AbstractEventLoop,
        wake: Callable[[], None],
        on_batch_done: Callable[[], None],
    ) -> None:
        self.config = config
        self.loop = loop
        self.wake = wake
        self.lock = threading.Lock()
        # Notified after every completed batch: flush() and appends waiting for memory wait on it.
        self.batch_done = threading.Condition(self.lock)
        self.metadata = ClusterMetadata(metadata_max_age_ms=config.metadata_max_age_ms)
        self.connection = GatewayConnection.from_config(config)
        self.fetcher = MetadataFetcher(self.connection, self.metadata)
        self.accumulator = RecordAccumulator(
            batch_size_bytes=config.batch_size_bytes,
            linger_ms=config.linger_ms,
            max_batch_bytes=config.max_request_bytes,
            buffer_memory_bytes=config.buffer_memory_bytes,
            age_spread_ms=config.delivery_timeout_ms * DELIVERY_TIMEOUT_SPREAD_PERCENT // 100,
        )
        self.partitioner = StickyPartitioner(config.batch_size_bytes)
        self.leaders = (
            LeaderConnections.from_config(config, self.connection.tls) if config.direct_to_leaders else None
        )
        self.sender = Sender(
            config,
            self.accumulator,
            self.lock,
            self.connection,
            self.metadata,
            on_batch_done,
            leaders=self.leaders,
            refresh_topic=self.refresh_in_background,
        )
        self.sender_task: asyncio.Task[None] | None = None
        self.closed = False
        self._valid_topics: set[str] = set()
        self._refreshing: dict[str, asyncio.Task[None]] = {}
        # When each topic may be refreshed in the background again (now_ms()).
        self._refresh_not_before_ms: dict[str, int] = {}
        # The largest record (key + value + headers bound) that fits one request.
        self.record_bytes_max = config.max_request_bytes - BATCH_OVERHEAD_BYTES

    # --- on the loop -------------------------------------------------------------

    def start(self) -> None:
        self.sender_task = self.loop.create_task(self.sender.run(), name="highwater-producer-sender")
        self.sender_task.add_done_callback(_log_sender_end)

    def refresh_in_background(self, topic: str) -> None:
        """Refresh a stale topic without blocking senders (they use the old answer meanwhile).

        At most one refresh per topic per retry_backoff_ms: the sender asks on every pass
        while a partition has no known leader (an election under way), and Metadata would
        otherwise be asked as fast as records arrive."""
        if topic in self._refreshing:
            return
        now = now_ms()
        if now < self._refresh_not_before_ms.get(topic, 0):
            return
        self._refresh_not_before_ms[topic] = now + self.config.retry_backoff_ms

        async def _refresh() -> None:
            try:
                await self.fetcher.refresh([topic])
            except HighwaterError:
                pass  # the next send or error tries again
            finally:
                self._refreshing.pop(topic, None)

        self._refreshing[topic] = self.loop.create_task(_refresh())

    async def topic_info(self, topic: str) -> TopicInfo:
        return await self.fetcher.topic(
            topic,
            wait_ms=self.config.max_block_ms,
            backoff_ms=self.config.retry_backoff_ms,
            wait_setting="max_block_ms",
        )

    async def shutdown(self, pending_records: int) -> None:
        """Fail what is left, stop the sender, close the channels."""
        await self.sender.abort(closed_error(pending_records))
        if self.sender_task is not None:
            self.sender.stop_when_idle()
            try:
                await asyncio.wait_for(self.sender_task, SENDER_STOP_WAIT_S)
            except (TimeoutError, asyncio.CancelledError):
                self.sender_task.cancel()
        if self.leaders is not None:
            await self.leaders.close()
        await self.connection.close()

    # --- from any thread -------------------------------------------------------------

    def check_open(self) -> None:
        if self.closed:
            raise ClientClosed("the producer is closed")
        if self.sender.fatal_error is not None:
            raise self.sender.fatal_error
        if self.sender_task is not None and self.sender_task.done():
            raise ClientClosed("the producer's sender task has stopped; close and create a new producer")

    def check_send(self) -> None:
        """check_open, and for a transactional producer that a transaction is open."""
        self.check_open()
        if self.sender.transactions is not None:
            self.sender.transactions.check_send()

    @property
    def transactions(self) -> TransactionManager:
        txn = self.sender.transactions
        if txn is None:
            raise InvalidArgument(
                "this producer is not transactional: create it with transactional_id=... (docs/CLIENTS.md)"
            )
        return txn

    async def start_end(self, commit: bool) -> None:
        """Enter the commit or abort (on the loop, where the sender reads the phase)."""
        self.transactions.start_end(commit)

    async def begin(self) -> None:
        await self.transactions.begin()

    def call_timeout_ms(self, timeout_ms: int | None) -> int:
        """A transaction call's bound: the caller's, else max_block_ms (Kafka's)."""
        if timeout_ms is None:
            return self.config.max_block_ms
        return check_int("timeout_ms", timeout_ms, minimum=1)

    def cached_topic(self, topic: str) -> tuple[TopicInfo | None, bool]:
        """(cached info or None, whether it is stale)."""
        info = self.metadata.get(topic)
        return info, info is None or self.metadata.needs_refresh(topic, now_ms())

    def append_one(
        self,
        info: TopicInfo,
        value: object,
        key: object,
        headers: HeadersArg,
        partition: object,
        timestamp_ms: object,
        future: Any,
        callback: Callback | None,
    ) -> Pending | None:
        """Check one record, choose its partition and append it: None when done, or (when the
        buffer is full) what to pass to `try_append` once there is room.

        Raises InvalidArgument for a wrong type or range and MessageTooLarge for a
        record that can never fit a batch; nothing is queued then. Runs once per
        record, so it is one flat function with the common case tested first.
        """
        if type(value) is not bytes and value is not None:
            value = _check_bytes("value", value)
        if type(key) is not bytes and key is not None:
            key = _check_bytes("key", key)
        size = RECORD_OVERHEAD_BYTES_MAX
        if value is not None:
            size += len(value)
        if key is not None:
            size += len(key)
        header_list = None
        if headers is not None:
            header_list, header_bytes = _check_headers(headers)
            size += header_bytes
        if size > self.record_bytes_max or (
            info.max_message_bytes and size + BATCH_OVERHEAD_BYTES > info.max_message_bytes
        ):
            raise self._too_large(info, size, "record")
        if timestamp_ms is None:
            timestamp = time_ns() // 1_000_000
        elif type(timestamp_ms) is int and timestamp_ms >= 0:
            timestamp = timestamp_ms
        else:
            timestamp = check_int("timestamp_ms", timestamp_ms, minimum=0)
        record: RecordTuple = (key, value, timestamp)
        tps = info.tps
        if partition is not None or key is not None:
            tp = self._choose(info, key, partition, size)
        accumulator = self.accumulator
        with self.lock:
            if partition is None and key is None:
                tp = tps[self.partitioner.partition(info.name, len(tps), info.available, size)]
            if (
                accumulator.buffered_bytes
                and accumulator.buffered_bytes + size > accumulator.buffer_memory_bytes
            ):
                return tp, record, header_list, size
            created, full = accumulator.append(
                tp,
                record,
                header_list,
                size,
                future,
                callback,
                int(monotonic() * 1000),
            )
        if created or full:
            self.wake()
        return None

    def _choose(self, info: TopicInfo, key: bytes | None, partition: object, size: int) -> TopicPartition:
        """The partition: the caller's, the key's (murmur2) or the sticky one for keyless records."""
        tps = info.tps
        if partition is None:
            if key is not None:
                return tps[partition_for_key(key, len(tps))]
            with self.lock:
                return tps[self.partitioner.partition(info.name, len(tps), info.available, size)]
        if type(partition) is not int or not 0 <= partition < len(tps):
            check_int("partition", partition, minimum=0)
            raise UnknownTopicOrPartition(
                f"partition {partition} of {info.name!r} does not exist (it has {len(tps)})"
            )
        return tps[partition]

    def _too_large(self, info: TopicInfo, size: int, what: str) -> HighwaterError:
        """A MessageTooLarge naming the limits (typed by its base: MessageTooLarge is made at run time)."""
        limit = min(self.config.max_request_bytes, info.max_message_bytes or self.config.max_request_bytes)
        return MessageTooLarge(
            f"{what} of about {size} bytes (key + value + headers) to {info.name!r} cannot fit a batch: "
            f"max_request_bytes={self.config.max_request_bytes}"
            + (f", topic max.message.bytes={info.max_message_bytes}" if info.max_message_bytes else "")
            + f" (a batch adds {BATCH_OVERHEAD_BYTES} bytes; limit {limit})"
        )

    def check_topic(self, topic: str) -> str:
        """`topic` if it is a legal name (checked once per name), else InvalidArgument."""
        if topic not in self._valid_topics:
            check_topic_name(topic)
            self._valid_topics.add(topic)
        return topic

    def try_append(
        self,
        tp: TopicPartition,
        record: RecordTuple,
        headers: Headers | None,
        size: int,
        future: Any,
        callback: Callback | None,
    ) -> bool:
        """Append if the buffer has room (caller holds no lock). False: no room, wait and retry."""
        accumulator = self.accumulator
        with self.lock:
            if not accumulator.has_room(size):
                return False
            created, full = accumulator.append(tp, record, headers, size, future, callback, now_ms())
        if created or full:
            self.wake()
        return True

    def prepare_runs(
        self,
        info: TopicInfo,
        values: object,
        key: object,
        headers: HeadersArg,
        partition: object,
        timestamp_ms: object,
    ) -> tuple[int, list[tuple[TopicPartition, int, int, int]], Run, Headers]:
        """Check a bulk send and cut it into runs of about batch_size_bytes.

        Returns (record count, [(tp, start, end, size_bytes)], the whole input as one Run
        (key, values, timestamp_ms) to slice runs from, headers). Per-record work is done by
        C loops (map, accumulate) and no tuple is built per record, so bulk loads run at
        encoder speed.
        """
        if isinstance(values, (bytes, str)) or not isinstance(values, Sequence):
            raise InvalidArgument(f"values must be a list of bytes, got {type(values).__name__}")
        if type(values) is not list and type(values) is not tuple:
            values = list(values)  # slices of it must be copies: the caller may reuse its sequence
        count = len(values)
        types = set(map(type, values))
        if types - {bytes}:
            bad = next(i for i, v in enumerate(values) if type(v) is not bytes)
            raise InvalidArgument(f"values[{bad}] must be bytes, got {type(values[bad]).__name__}")
        if type(key) is not bytes and key is not None:
            key = _check_bytes("key", key)
        header_list, header_bytes = _check_headers(headers)
        if timestamp_ms is None:
            stamp = time_ns() // 1_000_000
        else:
            stamp = check_int("timestamp_ms", timestamp_ms, minimum=0)
        fixed = RECORD_OVERHEAD_BYTES_MAX + header_bytes + (len(key) if key is not None else 0)
        lengths = list(map(len, values))
        if count and max(lengths) + fixed > self.record_bytes_max:
            index = lengths.index(max(lengths))
            raise self._too_large(info, lengths[index] + fixed, f"values[{index}]")
        if (
            info.max_message_bytes
            and count
            and max(lengths) + fixed + BATCH_OVERHEAD_BYTES > info.max_message_bytes
        ):
            index = lengths.index(max(lengths))
            raise self._too_large(info, lengths[index] + fixed, f"values[{index}]")
        cumulative = list(accumulate(lengths))
        run_bytes = max(self.config.batch_size_bytes - BATCH_OVERHEAD_BYTES, 1)
        runs: list[tuple[TopicPartition, int, int, int]] = []
        start = 0
        while start < count:
            before = cumulative[start - 1] if start else 0
            # The longest run from `start` whose bytes stay within a batch (at least one record).

            def bytes_up_to(end: int, before: int = before, start: int = start) -> int:
                return cumulative[end - 1] - before + fixed * (end - start)

            fit = bisect_right(range(start + 1, count + 1), run_bytes, key=bytes_up_to)
            end = start + max(fit, 1)
            size = cumulative[end - 1] - before + fixed * (end - start)
            runs.append((self._choose(info, key, partition, size), start, end, size))
            start = end
        return count, runs, (key, values, stamp), header_list

    def try_append_run(
        self,
        tp: TopicPartition,
        run: Run,
        headers: Headers,
        size: int,
        sink: BulkSendResult,
        sink_start: int,
    ) -> bool:
        """Queue a run if the buffer has room; the caller wakes the sender (once per call)."""
        accumulator = self.accumulator
        with self.lock:
            if not accumulator.has_room(size):
                return False
            accumulator.append_run(tp, run, headers, size, sink, sink_start, now_ms())
        return True

    def pending_records(self) -> int:
        with self.lock:
            return self.accumulator.incomplete_records()

    # --- waiting, for both front ends -----------------------------------------------
    # One implementation of flush() and of the wait for buffer space. Producer waits on
    # `batch_done` (a threading.Condition), AsyncProducer on an asyncio.Event; the
    # generators say what to wait for and when to give up, and yield how long to wait
    # next. They take no lock, so Producer drives them holding `batch_done` (whose lock is
    # `lock`); the context managers take `lock` briefly, so enter them before `batch_done`.

    @contextlib.contextmanager
    def flushing(self) -> Iterator[int]:
        """A flush in progress (the sender ignores linger_ms meanwhile); yields the id of the
        last batch queued now, which the flush waits for."""
        with self.lock:
            target = self.accumulator.last_batch_id
            self.accumulator.flushes_in_progress += 1
        self.wake()
        try:
            yield target
        finally:
            with self.lock:
                self.accumulator.flushes_in_progress -= 1

    def flush_waits(self, target: int, timeout_ms: int | None) -> Iterator[float]:
        """Seconds to wait for a completed batch, until every batch up to `target` is done.

        RequestTimedOut after timeout_ms (None: no limit); ClientClosed if the sender task ends.
        """
        deadline = None if timeout_ms is None else time.monotonic() + timeout_ms / 1000
        while not self.accumulator.done_up_to(target):
            wait_s = FLUSH_CHECK_INTERVAL_S
            if deadline is not None:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise RequestTimedOut(
                        f"flush: {self.accumulator.incomplete_records(target)} record(s) not yet "
                        f"acknowledged after {timeout_ms} ms"
                    )
                wait_s = min(wait_s, remaining)
            yield wait_s
            if self.sender_task is not None and self.sender_task.done():
                raise ClientClosed("the producer's sender task has stopped")

    @contextlib.contextmanager
    def waiting_for_room(self) -> Iterator[None]:
        """A send blocked on buffer_memory_bytes: the sender sends at once while one waits."""
        with self.lock:
            self.accumulator.memory_waiters += 1
        self.wake()
        try:
            yield
        finally:
            with self.lock:
                self.accumulator.memory_waiters -= 1

    def room_waits(self, size: int) -> Iterator[float]:
        """Seconds to wait for a completed batch, until the buffer has room for `size` bytes.

        RequestTimedOut after max_block_ms; the producer's error if it closes or fails meanwhile.
        """
        deadline = time.monotonic() + self.config.max_block_ms / 1000
        while not self.accumulator.has_room(size):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise RequestTimedOut(
                    f"buffer_memory_bytes={self.config.buffer_memory_bytes} stayed full for "
                    f"max_block_ms={self.config.max_block_ms}: the gateway is not keeping up"
                )
            yield min(remaining, FLUSH_CHECK_INTERVAL_S)
            self.check_open()

    # --- queuing, for both front ends -----------------------------------------------
    # Both generators yield a size in bytes each time the buffer has no room for it; the
    # front end waits for room its own way (see `room_waits`), then resumes the generator.

    def append_pending(self, pending: Pending, future: Any, callback: Callback | None) -> Iterator[int]:
        """Append a record `append_one` found no room for, yielding its size while there is none.

        Only this slow path is a generator: `append_one` stays a plain call per record.
        """
        tp, record, header_list, size = pending
        while not self.try_append(tp, record, header_list, size, future, callback):
            yield size

    def queue_bulk(
        self,
        info: TopicInfo,
        values: object,
        key: object,
        headers: HeadersArg,
        partition: object,
        timestamp_ms: object,
        future: Any,
    ) -> Generator[int, None, None]:
        """Check and queue a bulk send (see `prepare_runs`) whose result settles `future`,
        yielding a run's size while there is no room for it.

        A HighwaterError thrown in at a yield (the front end gave up waiting) fails that run
        and every later one with it, then propagates; runs already queued still complete.
        """
        count, runs, whole, header_list = self.prepare_runs(
            info, values, key, headers, partition, timestamp_ms
        )
        sink = BulkSendResult(info.name, count, future)
        run_key, all_values, run_timestamp_ms = whole
        queued = False
        for number, (tp, start, end, size) in enumerate(runs):
            run = (run_key, all_values[start:end], run_timestamp_ms)
            try:
                while not self.try_append_run(tp, run, header_list, size, sink, start):
                    if queued:
                        self.wake()  # what is queued can go while this call waits for room
                        queued = False
                    yield size
            except HighwaterError as error:
                self.fail_runs(sink, runs[number:], run_timestamp_ms, error)
                raise
            queued = True
        if queued:
            self.wake()  # once per call: a wake-up per batch cost 11% of the client's time

    @staticmethod
    def fail_runs(
        sink: BulkSendResult,
        runs: list[tuple[TopicPartition, int, int, int]],
        timestamp_ms: int,
        error: HighwaterError,
    ) -> None:
        """Settle the runs of a bulk send that were never queued with `error`."""
        for tp, start, end, _ in runs:
            sink.settle(start, tp, -1, end - start, timestamp_ms, -1, error)


class Producer:
    """Synchronous, thread-safe producer. Use as a context manager or call close().

    Example::

        with Producer("127.0.0.1:9092") as producer:
            future = producer.send("orders", b"payload", key=b"customer-7")
            print(future.result().offset)
    """

    def __init__(self, bootstrap: str | list[str] = DEFAULT_BOOTSTRAP, **settings: Any) -> None:
        self.config: ProducerConfig = build_config(ProducerConfig, bootstrap, settings)
        self._thread = LoopThread("highwater-producer")
        # A wake-up posted to the sender's loop and not yet run: another would find nothing new
        # (the sender's next pass reads everything queued before this flag was seen set), and
        # each post is a write to the loop's self-pipe (11% of the client's time at 600k/s).
        self._wake_posted = False
        self._core = _ProducerCore(
            self.config,
            self._thread.loop,
            wake=self._post_wake,
            on_batch_done=self._on_batch_done,
        )
        self._thread.loop.call_soon_threadsafe(self._core.start)
        # A producer never closed is closed at interpreter exit (weakref.finalize runs at
        # exit; the core holds this object through its callbacks, so not sooner): otherwise
        # its loop thread dies mid-task and asyncio prints "Task was destroyed but it is
        # pending!", and what is queued is dropped without a word.
        self._close_at_exit = weakref.finalize(
            self, _close_producer, self._thread, self._core, PRODUCER_CLOSE_AT_EXIT_TIMEOUT_MS, at_exit=True
        )

    def _post_wake(self) -> None:
        if not self._wake_posted:
            self._wake_posted = True
            self._thread.call_soon(self._run_wake)

    def _run_wake(self) -> None:
        self._wake_posted = False  # before the sender looks: what is queued later posts again
        self._core.sender.wake()

    def _on_batch_done(self) -> None:
        with self._core.batch_done:
            self._core.batch_done.notify_all()

    def _topic_info(self, topic: str) -> TopicInfo:
        info, stale = self._core.cached_topic(topic)
        if info is None:
            return self._thread.run(self._core.topic_info(topic), None, f"metadata for topic {topic!r}")
        if stale:
            self._thread.call_soon(self._core.refresh_in_background, topic)
        return info

    def send(
        self,
        topic: str,
        value: bytes | None = None,
        key: bytes | None = None,
        *,
        headers: HeadersArg = None,
        partition: int | None = None,
        timestamp_ms: int | None = None,
        callback: Callback | None = None,
    ) -> concurrent.futures.Future[RecordMetadata]:
        """Queue one record; the future resolves to its RecordMetadata or fails with a HighwaterError.

        Blocks only when the topic's metadata is not cached yet or the buffer is full
        (at most max_block_ms). Raises at once, queuing nothing, for bad arguments
        (InvalidArgument), a record that cannot fit (MessageTooLarge) or a closed producer.
        """
        future: concurrent.futures.Future[RecordMetadata] = concurrent.futures.Future()
        self._append(topic, value, key, headers, partition, timestamp_ms, future, callback)
        return future

    def produce(
        self,
        topic: str,
        value: bytes | None = None,
        key: bytes | None = None,
        *,
        headers: HeadersArg = None,
        partition: int | None = None,
        timestamp_ms: int | None = None,
        callback: Callback | None = None,
    ) -> None:
        """`send` without a future: the fast path for bulk loads. Errors reach `callback` only."""
        self._append(topic, value, key, headers, partition, timestamp_ms, None, callback)

    def send_batch(
        self,
        topic: str,
        values: Sequence[bytes],
        *,
        key: bytes | None = None,
        partition: int | None = None,
        headers: HeadersArg = None,
        timestamp_ms: int | None = None,
    ) -> concurrent.futures.Future[SentRecords]:
        """Queue many values at once (all with one key, headers and timestamp): the bulk path.

        Checks and batching run in C loops and each batch is encoded once, so this goes
        at the record encoder's speed (over a million 100-byte records/s on one thread).
        Keyless values spread over partitions a batch at a time (sticky); with a key or a
        partition they all go to one partition, in order. The future resolves to SentRecords,
        a sequence of every record's RecordMetadata in input order, or fails with the first error.
        """
        core = self._core
        core.check_send()
        info = self._topic_info(core.check_topic(topic))
        future: concurrent.futures.Future[SentRecords] = concurrent.futures.Future()
        queuing = core.queue_bulk(info, values, key, headers, partition, timestamp_ms, future)
        for size in queuing:
            try:
                self._wait_for_room(size)
            except HighwaterError as error:
                queuing.throw(error)
        return future

    def _append(
        self,
        topic: str,
        value: object,
        key: object,
        headers: HeadersArg,
        partition: int | None,
        timestamp_ms: int | None,
        future: Any,
        callback: Callback | None,
    ) -> None:
        core = self._core
        core.check_send()
        info = self._topic_info(core.check_topic(topic))
        pending = core.append_one(info, value, key, headers, partition, timestamp_ms, future, callback)
        if pending is not None:
            for size in core.append_pending(pending, future, callback):
                self._wait_for_room(size)

    def _wait_for_room(self, size: int) -> None:
        """Block until completed batches free room for `size` bytes; RequestTimedOut after max_block_ms."""
        core = self._core
        with core.waiting_for_room(), core.batch_done:
            for wait_s in core.room_waits(size):
                core.batch_done.wait(wait_s)

    def flush(self, *args: object, timeout_ms: int | None = None) -> None:
        """Send everything queued now, ignoring linger_ms, and wait until each record sent
        before this call is acknowledged or has failed (see its future or callback).

        Raises RequestTimedOut if that takes longer than timeout_ms (keyword only, in
        milliseconds; None: no limit); the records stay queued and still complete within
        delivery_timeout_ms.
        """
        check_no_positional_timeout("flush", args)
        core = self._core
        with core.flushing() as target, core.batch_done:
            for wait_s in core.flush_waits(target, timeout_ms):
                core.batch_done.wait(wait_s)

    def partitions_for(self, topic: str) -> list[int]:
        """The topic's partition ids (from the gateway's metadata)."""
        self._core.check_open()
        return list(self._topic_info(self._core.check_topic(topic)).partitions)

    # ---- transactions (transactional_id set; docs/CLIENTS.md, Transactions) --------------------

    def init_transactions(self, *args: object, timeout_ms: int | None = None) -> None:
        """Get the transactional id's producer id and a new epoch, once, before the first
        transaction: any older producer with the id is fenced and its open transaction aborted.
        Retriable trouble is retried for up to timeout_ms (default max_block_ms)."""
        check_no_positional_timeout("init_transactions", args)
        core = self._core
        core.check_open()
        self._thread.run(
            core.transactions.init(core.call_timeout_ms(timeout_ms)), None, "init_transactions()"
        )

    def begin_transaction(self) -> None:
        """Open a transaction: records sent until commit or abort belong to it."""
        self._core.check_open()
        self._thread.run(self._core.begin(), None, "begin_transaction()")

    def send_offsets_to_transaction(
        self,
        offsets: Mapping[TopicPartition, int],
        group_metadata: GroupMetadata,
        *,
        timeout_ms: int | None = None,
    ) -> None:
        """Commit a consumer group's offsets (the next offset to read, as Consumer.commit takes
        them) with the transaction: the group sees them only if it commits. `group_metadata`
        is the consumer's (Consumer.group_metadata()), so a consumer that lost its partitions
        cannot commit (KIP-447)."""
        core = self._core
        core.check_open()
        self._thread.run(
            core.transactions.send_offsets(dict(offsets), group_metadata, core.call_timeout_ms(timeout_ms)),
            None,
            "send_offsets_to_transaction()",
        )

    def commit_transaction(self, *args: object, timeout_ms: int | None = None) -> None:
        """Send what is queued, then commit: every record and offset of the transaction becomes
        visible to read_committed consumers at once. TransactionAbortRequired when a record of
        it failed (abort_transaction() then); RequestTimedOut after timeout_ms (default
        max_block_ms), after which calling it again resumes the commit."""
        self._end(True, args, timeout_ms)

    def abort_transaction(self, *args: object, timeout_ms: int | None = None) -> None:
        """Abort the transaction: its records are never seen by read_committed consumers and
        its offsets never committed. Records still queued fail with TransactionAbortRequired."""
        self._end(False, args, timeout_ms)

    def _end(self, commit: bool, args: tuple[object, ...], timeout_ms: int | None) -> None:
        what = "commit_transaction()" if commit else "abort_transaction()"
        check_no_positional_timeout(what.rstrip("()"), args)
        core = self._core
        core.check_open()
        bound_ms = core.call_timeout_ms(timeout_ms)
        started = monotonic()
        self._thread.run(core.start_end(commit), None, what)
        self.flush(timeout_ms=bound_ms)
        left_ms = max(1, bound_ms - int((monotonic() - started) * 1000))
        self._thread.run(core.transactions.end(commit, left_ms), None, what)

    def close(self, *args: object, timeout_ms: int | None = None) -> None:
        """Deliver what is queued (within timeout_ms, keyword only, in milliseconds; default:
        wait), then fail whatever is still pending with ClientClosed and release the thread
        and channels. Idempotent.
        """
        check_no_positional_timeout("close", args)
        self._close_at_exit.detach()
        _close_producer(self._thread, self._core, timeout_ms)

    def __enter__(self) -> Producer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def _close_producer(
    thread: LoopThread, core: _ProducerCore, timeout_ms: int | None, *, at_exit: bool = False
) -> None:
    """Producer.close() (and the close at interpreter exit of a producer never closed):
    deliver what is queued within timeout_ms, fail the rest with ClientClosed, stop the thread.
    Holds no reference to the Producer, so a finalizer can call it."""
    if core.closed:
        return
    core.closed = True
    try:
        with core.flushing() as target, core.batch_done:
            for wait_s in core.flush_waits(target, timeout_ms):
                core.batch_done.wait(wait_s)
    except HighwaterError:
        pass  # what is left fails below
    pending = core.pending_records()
    if at_exit and pending:
        log.warning(
            "a Producer was never closed: at interpreter exit %d record(s) were still undelivered "
            "after %d ms and failed with CLIENT_CLOSED; call producer.close() (or use `with "
            "Producer(...) as producer:`) so the program waits for them",
            pending,
            timeout_ms,
        )
    try:
        thread.run(core.shutdown(pending), timeout_ms=CLOSE_SHUTDOWN_TIMEOUT_MS, what="closing the producer")
    except HighwaterError:
        pass
    finally:
        thread.stop()


class AsyncProducer:
    """asyncio producer. `async with AsyncProducer(...) as producer:` or start()/close().

    Example::

        async with AsyncProducer("127.0.0.1:9092") as producer:
            metadata = await producer.send_and_wait("orders", b"payload", key=b"customer-7")
    """

    def __init__(self, bootstrap: str | list[str] = DEFAULT_BOOTSTRAP, **settings: Any) -> None:
        self.config: ProducerConfig = build_config(ProducerConfig, bootstrap, settings)
        self._core: _ProducerCore | None = None
        self._batch_done = asyncio.Event()
        self._closed = False

    async def start(self) -> None:
        """Start the sender task on the running loop (send() does it on first use)."""
        if self._core is not None:
            return
        if self._closed:
            raise ClientClosed("the producer is closed")
        loop = asyncio.get_running_loop()
        core = _ProducerCore(
            self.config, loop, wake=lambda: core.sender.wake(), on_batch_done=self._batch_done.set
        )
        core.start()
        self._core = core

    async def _ready_core(self) -> _ProducerCore:
        if self._core is None:
            await self.start()
        core = self._core
        if core is None:  # pragma: no cover - start() sets it or raises
            raise ClientClosed("the producer is closed")
        core.check_open()
        return core

    async def _topic_info(self, core: _ProducerCore, topic: str) -> TopicInfo:
        info, stale = core.cached_topic(topic)
        if info is None:
            return await core.topic_info(topic)
        if stale:
            core.refresh_in_background(topic)
        return info

    async def send(
        self,
        topic: str,
        value: bytes | None = None,
        key: bytes | None = None,
        *,
        headers: HeadersArg = None,
        partition: int | None = None,
        timestamp_ms: int | None = None,
        callback: Callback | None = None,
    ) -> asyncio.Future[RecordMetadata]:
        """Queue one record; await the returned future for its RecordMetadata.

        Awaits only for metadata or buffer space (at most max_block_ms). Raises at once,
        queuing nothing, for bad arguments or a record that cannot fit.
        """
        core = await self._ready_core()
        core.check_send()
        info = await self._topic_info(core, core.check_topic(topic))
        future: asyncio.Future[RecordMetadata] = core.loop.create_future()
        pending = core.append_one(info, value, key, headers, partition, timestamp_ms, future, callback)
        if pending is not None:
            for size in core.append_pending(pending, future, callback):
                await self._wait_for_room(core, size)
        return future

    async def _wait_for_room(self, core: _ProducerCore, size: int) -> None:
        """Wait until completed batches free room for `size` bytes; RequestTimedOut after max_block_ms."""
        with core.waiting_for_room():
            for wait_s in core.room_waits(size):
                await self._wait_batch_done(wait_s)

    async def _wait_batch_done(self, timeout_s: float) -> None:
        """Wait until the sender completes a batch, or `timeout_s` passes."""
        self._batch_done.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._batch_done.wait(), timeout_s)

    async def send_batch(
        self,
        topic: str,
        values: Sequence[bytes],
        *,
        key: bytes | None = None,
        partition: int | None = None,
        headers: HeadersArg = None,
        timestamp_ms: int | None = None,
    ) -> asyncio.Future[SentRecords]:
        """As Producer.send_batch: queue many values at once; await the future for their metadata."""
        core = await self._ready_core()
        core.check_send()
        info = await self._topic_info(core, core.check_topic(topic))
        future: asyncio.Future[SentRecords] = core.loop.create_future()
        queuing = core.queue_bulk(info, values, key, headers, partition, timestamp_ms, future)
        for size in queuing:
            try:
                await self._wait_for_room(core, size)
            except HighwaterError as error:
                queuing.throw(error)
        return future

    async def send_and_wait(
        self,
        topic: str,
        value: bytes | None = None,
        key: bytes | None = None,
        *,
        headers: HeadersArg = None,
        partition: int | None = None,
        timestamp_ms: int | None = None,
    ) -> RecordMetadata:
        """send() and wait for the acknowledgement."""
        future = await self.send(
            topic, value, key, headers=headers, partition=partition, timestamp_ms=timestamp_ms
        )
        return await future

    async def flush(self, *args: object, timeout_ms: int | None = None) -> None:
        """As Producer.flush: send everything now and wait for every record sent before
        (timeout_ms keyword only, in milliseconds)."""
        check_no_positional_timeout("flush", args)
        core = self._core
        if core is None:
            return
        with core.flushing() as target:
            for wait_s in core.flush_waits(target, timeout_ms):
                await self._wait_batch_done(wait_s)

    async def partitions_for(self, topic: str) -> list[int]:
        core = await self._ready_core()
        return list((await self._topic_info(core, core.check_topic(topic))).partitions)

    # ---- transactions (as Producer's) -------------------------------------------------------

    async def init_transactions(self, *args: object, timeout_ms: int | None = None) -> None:
        """As Producer.init_transactions."""
        check_no_positional_timeout("init_transactions", args)
        core = await self._ready_core()
        await core.transactions.init(core.call_timeout_ms(timeout_ms))

    async def begin_transaction(self) -> None:
        """As Producer.begin_transaction."""
        core = await self._ready_core()
        await core.begin()

    async def send_offsets_to_transaction(
        self,
        offsets: Mapping[TopicPartition, int],
        group_metadata: GroupMetadata,
        *,
        timeout_ms: int | None = None,
    ) -> None:
        """As Producer.send_offsets_to_transaction."""
        core = await self._ready_core()
        await core.transactions.send_offsets(dict(offsets), group_metadata, core.call_timeout_ms(timeout_ms))

    async def commit_transaction(self, *args: object, timeout_ms: int | None = None) -> None:
        """As Producer.commit_transaction."""
        await self._end(True, args, timeout_ms)

    async def abort_transaction(self, *args: object, timeout_ms: int | None = None) -> None:
        """As Producer.abort_transaction."""
        await self._end(False, args, timeout_ms)

    async def _end(self, commit: bool, args: tuple[object, ...], timeout_ms: int | None) -> None:
        check_no_positional_timeout("commit_transaction" if commit else "abort_transaction", args)
        core = await self._ready_core()
        bound_ms = core.call_timeout_ms(timeout_ms)
        started = monotonic()
        await core.start_end(commit)
        await self.flush(timeout_ms=bound_ms)
        left_ms = max(1, bound_ms - int((monotonic() - started) * 1000))
        await core.transactions.end(commit, left_ms)

    async def close(self, *args: object, timeout_ms: int | None = None) -> None:
        """As Producer.close: deliver within timeout_ms (keyword only, in milliseconds), fail
        the rest, release the channels."""
        check_no_positional_timeout("close", args)
        if self._closed:
            return
        self._closed = True
        core = self._core
        if core is None:
            return
        core.closed = True
        try:
            await self.flush(timeout_ms=timeout_ms)
        except HighwaterError:
            pass
        await core.shutdown(core.pending_records())

    async def __aenter__(self) -> AsyncProducer:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()
