"""Producers: `Producer` (synchronous, thread-safe) and `AsyncProducer` (asyncio).

Both share `_ProducerCore`: argument checks, the partitioner, the accumulator and
the sender task (clients/sender.py). A record goes

    send() -> checks, partition -> accumulator (per-partition batch)
           -> sender: drain, number, encode once per batch, Produce -> futures resolved

Defaults are Kafka's: acks="all", idempotence on (a retried batch carries the
same producer id, epoch and sequence numbers, so the leader drops a duplicate),
linger_ms=5, batch_size_bytes=16 KiB, delivery_timeout_ms=120 s.

Delivery is reported through futures resolving to RecordMetadata(topic,
partition, offset, timestamp_ms) — concurrent.futures.Future from Producer,
asyncio.Future from AsyncProducer — and optional callbacks
`callback(metadata, error)`, run on the producer's I/O thread; keep them short.

The synchronous Producer runs its sender on a private event-loop thread; `send`
appends from the caller's thread under a lock without crossing to that thread
(a wake-up is posted once per batch, not per record). `produce` is the same
without a future, the fastest way in.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from clients.accumulator import RecordAccumulator
from clients.config import (
    BATCH_OVERHEAD_BYTES,
    DEFAULT_BOOTSTRAP,
    HEADER_OVERHEAD_BYTES_MAX,
    RECORD_OVERHEAD_BYTES_MAX,
    ProducerConfig,
    build_config,
    check_int,
    check_topic_name,
)
from clients.connection import GatewayConnection
from clients.errors import ClientClosed, HighwaterError, InvalidArgument, MessageTooLarge, RequestTimedOut
from clients.loop_thread import LoopThread
from clients.metadata import ClusterMetadata, MetadataFetcher, TopicInfo, now_ms
from clients.partitioner import StickyPartitioner, partition_for_key
from clients.sender import Sender, closed_error
from clients.types import RecordMetadata, TopicPartition
from services.common.errors import UnknownTopicOrPartition

Callback = Callable[[RecordMetadata | None, HighwaterError | None], Any]
HeadersArg = Iterable[tuple[str, bytes]] | Mapping[str, bytes] | None

_NO_HEADERS: list[tuple[str, bytes]] = []
# How often a blocked flush() checks that the sender task is still alive.
_FLUSH_CHECK_INTERVAL_S = 0.5


def _check_bytes(name: str, value: object) -> bytes | None:
    if value is None or type(value) is bytes:
        return value  # type: ignore[return-value]
    if isinstance(value, (bytearray, memoryview)):
        return bytes(value)
    if isinstance(value, bytes):
        return bytes(value)
    raise InvalidArgument(
        f"{name} must be bytes or None, got {type(value).__name__}"
        + (" (encode it first, e.g. .encode())" if isinstance(value, str) else "")
    )


def _check_headers(headers: HeadersArg) -> tuple[list[tuple[str, bytes]], int]:
    """(headers as a list, their size bound in bytes); InvalidArgument for a bad one."""
    if headers is None:
        return _NO_HEADERS, 0
    items = list(headers.items()) if isinstance(headers, Mapping) else list(headers)
    size = 0
    checked: list[tuple[str, bytes]] = []
    for item in items:
        if not isinstance(item, tuple) or len(item) != 2:
            raise InvalidArgument(f"a header must be a (str, bytes) pair, got {item!r}")
        name, value = item
        if not isinstance(name, str) or not name:
            raise InvalidArgument(f"a header name must be a non-empty str, got {name!r}")
        value_bytes = _check_bytes(f"header {name!r} value", value)
        size += len(name.encode()) + (len(value_bytes) if value_bytes is not None else 0) + HEADER_OVERHEAD_BYTES_MAX
        checked.append((name, value_bytes))  # type: ignore[arg-type]
    return checked, size


class _ProducerCore:
    """What both producers share. Appends may come from any thread; the rest runs on `loop`."""

    def __init__(self, config: ProducerConfig, loop: asyncio.AbstractEventLoop,
                 future_factory: Callable[[], Any], wake: Callable[[], None],
                 on_batch_done: Callable[[], None]) -> None:
        self.config = config
        self.loop = loop
        self.future_factory = future_factory
        self.wake = wake
        self.lock = threading.Lock()
        # Notified after every completed batch: flush() and appends waiting for memory wait on it.
        self.batch_done = threading.Condition(self.lock)
        self.metadata = ClusterMetadata(metadata_max_age_ms=config.metadata_max_age_ms)
        self.connection = GatewayConnection(
            config.bootstrap,
            request_timeout_ms=config.request_timeout_ms,
            connect_timeout_ms=config.connect_timeout_ms,
            retry_backoff_ms=config.retry_backoff_ms,
        )
        self.fetcher = MetadataFetcher(self.connection, self.metadata)
        self.accumulator = RecordAccumulator(
            batch_size_bytes=config.batch_size_bytes,
            linger_ms=config.linger_ms,
            max_batch_bytes=config.max_request_bytes,
            buffer_memory_bytes=config.buffer_memory_bytes,
        )
        self.partitioner = StickyPartitioner(config.batch_size_bytes)
        self.sender = Sender(config, self.accumulator, self.lock, self.connection, self.metadata, on_batch_done)
        self.sender_task: asyncio.Task[None] | None = None
        self.closed = False
        self._valid_topics: set[str] = set()
        self._refreshing: set[str] = set()

    # --- on the loop -------------------------------------------------------------

    def start(self) -> None:
        self.sender_task = self.loop.create_task(self.sender.run(), name="highwater-producer-sender")

    def refresh_in_background(self, topic: str) -> None:
        """Refresh a stale topic without blocking senders (they use the old answer meanwhile)."""
        if topic in self._refreshing:
            return
        self._refreshing.add(topic)

        async def _refresh() -> None:
            try:
                await self.fetcher.refresh([topic])
            except HighwaterError:
                pass  # the next send or error tries again
            finally:
                self._refreshing.discard(topic)

        self.loop.create_task(_refresh())

    async def topic_info(self, topic: str) -> TopicInfo:
        return await self.fetcher.topic(topic, wait_ms=self.config.max_block_ms,
                                        backoff_ms=self.config.retry_backoff_ms)

    async def shutdown(self, pending_records: int) -> None:
        """Fail what is left, stop the sender, close the channels."""
        await self.sender.abort(closed_error(pending_records))
        if self.sender_task is not None:
            self.sender.stop_when_idle()
            try:
                await asyncio.wait_for(self.sender_task, 5.0)
            except (TimeoutError, asyncio.CancelledError):
                self.sender_task.cancel()
        await self.connection.close()

    # --- from any thread -------------------------------------------------------------

    def check_open(self) -> None:
        if self.closed:
            raise ClientClosed("the producer is closed")
        if self.sender.fatal_error is not None:
            raise self.sender.fatal_error
        if self.sender_task is not None and self.sender_task.done():
            raise ClientClosed("the producer's sender task has stopped; close and create a new producer")

    def cached_topic(self, topic: str) -> tuple[TopicInfo | None, bool]:
        """(cached info or None, whether it is stale)."""
        info = self.metadata.get(topic)
        return info, info is None or self.metadata.needs_refresh(topic, now_ms())

    def prepare(self, info: TopicInfo, value: object, key: object, headers: HeadersArg,
                partition: int | None, timestamp_ms: int | None) -> tuple[TopicPartition, tuple[Any, ...], int]:
        """Check one record and choose its partition: (tp, record tuple, size bound in bytes).

        Raises InvalidArgument for a wrong type or range and MessageTooLarge for a
        record that can never fit a request; nothing is queued then.
        """
        value_bytes = _check_bytes("value", value)
        key_bytes = _check_bytes("key", key)
        header_list, header_bytes = _check_headers(headers)
        if timestamp_ms is None:
            timestamp_ms = time.time_ns() // 1_000_000
        else:
            check_int("timestamp_ms", timestamp_ms, minimum=0)
        size = RECORD_OVERHEAD_BYTES_MAX + header_bytes
        if key_bytes is not None:
            size += len(key_bytes)
        if value_bytes is not None:
            size += len(value_bytes)
        limit = self.config.max_request_bytes
        if size + BATCH_OVERHEAD_BYTES > limit:
            raise MessageTooLarge(
                f"record of about {size} bytes (key + value + headers) to {info.name!r} exceeds "
                f"max_request_bytes={limit}"
            )
        topic_limit = info.metadata.config.max_message_bytes
        if topic_limit > 0 and size + BATCH_OVERHEAD_BYTES > topic_limit:
            raise MessageTooLarge(
                f"record of about {size} bytes exceeds topic {info.name!r} max.message.bytes={topic_limit}"
            )
        num_partitions = len(info.partitions)
        if partition is None:
            if key_bytes is not None:
                partition = partition_for_key(key_bytes, num_partitions)
            else:
                with self.lock:
                    partition = self.partitioner.partition(info.name, num_partitions, info.available, size)
        else:
            check_int("partition", partition, minimum=0)
            if partition >= num_partitions:
                raise UnknownTopicOrPartition(
                    f"partition {partition} of {info.name!r} does not exist (it has {num_partitions})")
        return TopicPartition(info.name, partition), (key_bytes, value_bytes, header_list, timestamp_ms), size

    def check_topic(self, topic: object) -> str:
        if topic not in self._valid_topics:
            check_topic_name(topic)
            self._valid_topics.add(topic)  # type: ignore[arg-type]
        return topic  # type: ignore[return-value]

    def try_append(self, tp: TopicPartition, record: tuple[Any, ...], size: int, future: Any,
                   callback: Callback | None) -> bool:
        """Append if the buffer has room (caller holds no lock). False: no room, wait and retry."""
        with self.lock:
            if not self.accumulator.has_room(size):
                return False
            created, full = self.accumulator.append(tp, record, size, future, callback, now_ms())  # type: ignore[arg-type]
        if created or full:
            self.wake()
        return True

    def pending_records(self) -> int:
        with self.lock:
            return self.accumulator.incomplete_records()


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
        self._core = _ProducerCore(
            self.config,
            self._thread.loop,
            concurrent.futures.Future,
            wake=lambda: self._thread.call_soon(self._core.sender.wake),
            on_batch_done=self._on_batch_done,
        )
        self._thread.loop.call_soon_threadsafe(self._core.start)

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

    def send(self, topic: str, value: bytes | None = None, key: bytes | None = None, *,
             headers: HeadersArg = None, partition: int | None = None, timestamp_ms: int | None = None,
             callback: Callback | None = None) -> concurrent.futures.Future[RecordMetadata]:
        """Queue one record; the future resolves to its RecordMetadata or fails with a HighwaterError.

        Blocks only when the topic's metadata is not cached yet or the buffer is full
        (at most max_block_ms). Raises at once, queuing nothing, for bad arguments
        (InvalidArgument), a record that cannot fit (MessageTooLarge) or a closed producer.
        """
        future: concurrent.futures.Future[RecordMetadata] = concurrent.futures.Future()
        self._append(topic, value, key, headers, partition, timestamp_ms, future, callback)
        return future

    def produce(self, topic: str, value: bytes | None = None, key: bytes | None = None, *,
                headers: HeadersArg = None, partition: int | None = None, timestamp_ms: int | None = None,
                callback: Callback | None = None) -> None:
        """`send` without a future: the fast path for bulk loads. Errors reach `callback` only."""
        self._append(topic, value, key, headers, partition, timestamp_ms, None, callback)

    def _append(self, topic: str, value: object, key: object, headers: HeadersArg, partition: int | None,
                timestamp_ms: int | None, future: Any, callback: Callback | None) -> None:
        core = self._core
        core.check_open()
        info = self._topic_info(core.check_topic(topic))
        tp, record, size = core.prepare(info, value, key, headers, partition, timestamp_ms)
        if core.try_append(tp, record, size, future, callback):
            return
        self._wait_for_room(size)
        if not core.try_append(tp, record, size, future, callback):
            raise RequestTimedOut("no buffer space after waiting for it")  # pragma: no cover - see _wait_for_room

    def _wait_for_room(self, size: int) -> None:
        core = self._core
        deadline = time.monotonic() + self.config.max_block_ms / 1000
        with core.batch_done:
            core.accumulator.memory_waiters += 1
            try:
                self._thread.call_soon(core.sender.wake)
                while not core.accumulator.has_room(size):
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        raise RequestTimedOut(
                            f"buffer_memory_bytes={self.config.buffer_memory_bytes} stayed full for "
                            f"max_block_ms={self.config.max_block_ms}: the gateway is not keeping up"
                        )
                    core.batch_done.wait(min(remaining, _FLUSH_CHECK_INTERVAL_S))
                    core.check_open()
            finally:
                core.accumulator.memory_waiters -= 1

    def flush(self, timeout_ms: int | None = None) -> None:
        """Send everything queued now, ignoring linger_ms, and wait until each record sent
        before this call is acknowledged or has failed (see its future or callback).

        Raises RequestTimedOut if that takes longer than timeout_ms; the records stay
        queued and still complete within delivery_timeout_ms.
        """
        core = self._core
        with core.lock:
            target = core.accumulator.last_batch_id
            core.accumulator.flushes_in_progress += 1
        self._thread.call_soon(core.sender.wake)
        deadline = None if timeout_ms is None else time.monotonic() + timeout_ms / 1000
        try:
            with core.batch_done:
                while not core.accumulator.done_up_to(target):
                    wait_s = _FLUSH_CHECK_INTERVAL_S
                    if deadline is not None:
                        remaining = deadline - time.monotonic()
                        if remaining <= 0:
                            raise RequestTimedOut(
                                f"flush: {core.accumulator.incomplete_records(target)} record(s) not yet "
                                f"acknowledged after {timeout_ms} ms"
                            )
                        wait_s = min(wait_s, remaining)
                    core.batch_done.wait(wait_s)
                    if core.sender_task is not None and core.sender_task.done():
                        raise ClientClosed("the producer's sender task has stopped")
        finally:
            with core.lock:
                core.accumulator.flushes_in_progress -= 1

    def partitions_for(self, topic: str) -> list[int]:
        """The topic's partition ids (from the gateway's metadata)."""
        self._core.check_open()
        return list(self._topic_info(self._core.check_topic(topic)).partitions)

    def close(self, timeout_ms: int | None = None) -> None:
        """Deliver what is queued (within timeout_ms, default: wait), then fail whatever is
        still pending with ClientClosed and release the thread and channels. Idempotent.
        """
        core = self._core
        if core.closed:
            return
        core.closed = True
        try:
            self.flush(timeout_ms)
        except HighwaterError:
            pass  # what is left fails below
        try:
            self._thread.run(core.shutdown(core.pending_records()), timeout_ms=10_000, what="closing the producer")
        except HighwaterError:
            pass
        finally:
            self._thread.stop()

    def __enter__(self) -> Producer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


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
        core = _ProducerCore(self.config, loop, loop.create_future, wake=lambda: core.sender.wake(),
                             on_batch_done=self._batch_done.set)
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

    async def send(self, topic: str, value: bytes | None = None, key: bytes | None = None, *,
                   headers: HeadersArg = None, partition: int | None = None, timestamp_ms: int | None = None,
                   callback: Callback | None = None) -> asyncio.Future[RecordMetadata]:
        """Queue one record; await the returned future for its RecordMetadata.

        Awaits only for metadata or buffer space (at most max_block_ms). Raises at once,
        queuing nothing, for bad arguments or a record that cannot fit.
        """
        core = await self._ready_core()
        info = await self._topic_info(core, core.check_topic(topic))
        tp, record, size = core.prepare(info, value, key, headers, partition, timestamp_ms)
        future: asyncio.Future[RecordMetadata] = core.loop.create_future()
        if core.try_append(tp, record, size, future, callback):
            return future
        deadline = time.monotonic() + self.config.max_block_ms / 1000
        with core.lock:
            core.accumulator.memory_waiters += 1
        core.sender.wake()
        try:
            while not core.try_append(tp, record, size, future, callback):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise RequestTimedOut(
                        f"buffer_memory_bytes={self.config.buffer_memory_bytes} stayed full for "
                        f"max_block_ms={self.config.max_block_ms}: the gateway is not keeping up"
                    )
                self._batch_done.clear()
                try:
                    await asyncio.wait_for(self._batch_done.wait(), min(remaining, _FLUSH_CHECK_INTERVAL_S))
                except TimeoutError:
                    pass
                core.check_open()
        finally:
            with core.lock:
                core.accumulator.memory_waiters -= 1
        return future

    async def send_and_wait(self, topic: str, value: bytes | None = None, key: bytes | None = None, *,
                            headers: HeadersArg = None, partition: int | None = None,
                            timestamp_ms: int | None = None) -> RecordMetadata:
        """send() and wait for the acknowledgement."""
        future = await self.send(topic, value, key, headers=headers, partition=partition, timestamp_ms=timestamp_ms)
        return await future

    async def flush(self, timeout_ms: int | None = None) -> None:
        """As Producer.flush: send everything now and wait for every record sent before."""
        core = self._core
        if core is None:
            return
        with core.lock:
            target = core.accumulator.last_batch_id
            core.accumulator.flushes_in_progress += 1
        core.sender.wake()
        deadline = None if timeout_ms is None else time.monotonic() + timeout_ms / 1000
        try:
            while not core.accumulator.done_up_to(target):
                wait_s = _FLUSH_CHECK_INTERVAL_S
                if deadline is not None:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        raise RequestTimedOut(
                            f"flush: {core.accumulator.incomplete_records(target)} record(s) not yet "
                            f"acknowledged after {timeout_ms} ms"
                        )
                    wait_s = min(wait_s, remaining)
                self._batch_done.clear()
                try:
                    await asyncio.wait_for(self._batch_done.wait(), wait_s)
                except TimeoutError:
                    pass
                if core.sender_task is not None and core.sender_task.done():
                    raise ClientClosed("the producer's sender task has stopped")
        finally:
            with core.lock:
                core.accumulator.flushes_in_progress -= 1

    async def partitions_for(self, topic: str) -> list[int]:
        core = await self._ready_core()
        return list((await self._topic_info(core, core.check_topic(topic))).partitions)

    async def close(self, timeout_ms: int | None = None) -> None:
        """As Producer.close: deliver within timeout_ms, fail the rest, release the channels."""
        if self._closed:
            return
        self._closed = True
        core = self._core
        if core is None:
            return
        core.closed = True
        try:
            await self.flush(timeout_ms)
        except HighwaterError:
            pass
        await core.shutdown(core.pending_records())

    async def __aenter__(self) -> AsyncProducer:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()
