"""Batch and streaming writers: each Spark task writes its rows as idempotent record batches.

Input columns, as Spark's Kafka sink takes them: `value` (binary or string, required),
`key` (binary or string), `topic` (string; the `topic` option overrides it),
`partition` (int; else murmur2 of the key as Kafka's producer, else round-robin) and
`headers` (array<struct<key string, value binary>>). Other columns are ignored. The
schema is checked at planning, so a wrong one fails before any task runs.

No duplicates on replay. A task numbers its batches itself instead of asking the
controller for a producer id: the producer id is derived from

    (scope, Spark partition id, batchId // 32767, batch group)

where scope is the streaming query's id (kept in the checkpoint, the same after a
restart) or, for a batch write, an id drawn once at planning; the producer epoch is
batchId % 32767 (0 for batch writes). Per topic-partition, the task's record batches
are numbered with sequences from 0, and every BATCHES_PER_PRODUCER_ID (5) batches
move to the next batch group, i.e. a fresh producer id, because a leader remembers only
the last 5 batches of a producer per partition. When Spark runs a task again (a retry,
or the whole micro-batch replayed after a crash), the attempt cuts the same rows into
the same batches with the same producer ids and sequences, and the leader answers each
batch it already has with the original offsets instead of appending it again
(DESIGN.md invariant 8). So a replay writes only what the earlier attempt did not.
That holds when the replayed task sees the same rows in the same order, which Spark
gives for deterministic sources and plans (this connector's reader, Kafka, files);
docs/SPARK.md states the guarantee. A newer micro-batch's epoch also fences a task
left over from an older one (INVALID_PRODUCER_EPOCH).

Batching is deterministic on purpose: a batch closes at batch.size.bytes or
WRITE_BATCH_RECORDS_MAX, computed from the rows alone, never from timing. Sending
keeps one Produce in flight (several partitions' next batch each) while the next
batches are encoded; a partition's batches leave strictly in order, retried with the
same bytes after retriable errors.
"""

from __future__ import annotations

import hashlib
import itertools
import logging
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSourceArrowWriter, DataSourceStreamArrowWriter, WriterCommitMessage
from pyspark.sql.types import ArrayType, BinaryType, IntegerType, LongType, StringType, StructType

from clients.common.partitioner import partition_for_key
from clients.common.records import encode_batch
from protos.highwater.v1 import common_pb2
from spark_connector import limits
from spark_connector.gateway import (
    RETRIABLE_CODES,
    GatewayClient,
    HighwaterSparkError,
    code_name,
    not_authorized,
)
from spark_connector.options import OptionError, WriteOptions, check_topic
from spark_connector.schema import HEADER_TYPE
from spark_connector.transactions import (
    TaskTransaction,
    TransactionalNumbering,
    add_partition,
    batch_committed,
    commit_marker,
    end_transactions,
    init_transaction,
    transactional_id,
)

log = logging.getLogger("highwater.spark")

# Spark puts these on every task of a micro-batch (MicroBatchExecution / StreamExecution).
BATCH_ID_PROPERTY = "streaming.sql.batchId"
QUERY_ID_PROPERTY = "sql.streaming.queryId"
# Per-record bytes the varint framing adds, for closing batches near batch.size.bytes.
_RECORD_FRAMING_BYTES = 16
# Bytes a Produce request and a record batch add around the records (request and batch
# headers), kept free when a batch must fit under max.request.size.
_REQUEST_FRAMING_BYTES = 512


# --- planning (driver) --------------------------------------------------------------------------


@dataclass(frozen=True)
class InputColumns:
    """Which input columns the writer uses and whether string columns need encoding."""

    value_is_string: bool
    key: bool
    key_is_string: bool
    topic: bool
    partition: bool
    headers: bool


def check_input_schema(schema: StructType, options: WriteOptions) -> InputColumns:
    """The DataFrame's columns checked against what the sink takes; OptionError names the column."""
    fields = {f.name: f.dataType for f in schema.fields}
    text_or_bytes = (BinaryType(), StringType())

    def kind(name: str, allowed: tuple[Any, ...], what: str) -> Any:
        data_type = fields.get(name)
        if data_type is not None and data_type not in allowed:
            raise OptionError(f"column {name!r} must be {what}, got {data_type.simpleString()}")
        return data_type

    value = kind("value", text_or_bytes, "binary or string")
    if value is None:
        raise OptionError(
            f"the DataFrame has no 'value' column (binary or string), which a Highwater write "
            f"needs; its columns are {', '.join(fields) or 'none'}"
        )
    key = kind("key", text_or_bytes, "binary or string")
    topic = kind("topic", (StringType(),), "string")
    partition = kind("partition", (IntegerType(), LongType()), "int")
    headers = fields.get("headers")
    # Nullability aside, the element must be struct<key string, value binary>.
    wanted = [(f.name, f.dataType) for f in HEADER_TYPE.fields]
    if headers is not None and (
        not isinstance(headers, ArrayType)
        or not isinstance(headers.elementType, StructType)
        or [(f.name, f.dataType) for f in headers.elementType.fields] != wanted
    ):
        raise OptionError(
            f"column 'headers' must be array<struct<key: string, value: binary>>, "
            f"got {headers.simpleString()}"
        )
    if topic is None and options.topic is None:
        raise OptionError("no 'topic' option and no 'topic' column: say which topic to write to")
    return InputColumns(
        value_is_string=value == StringType(),
        key=key is not None,
        key_is_string=key == StringType(),
        topic=topic is not None and options.topic is None,
        partition=partition is not None,
        headers=headers is not None,
    )


def check_topic_exists(options: WriteOptions) -> None:
    """Fail at planning when the `topic` option names a topic that does not exist."""
    if options.topic is None:
        return
    with GatewayClient(options.bootstrap, options.client) as client:
        if client.partitions([options.topic]).get(options.topic) is None:
            raise HighwaterSparkError(
                f"option 'topic': topic {options.topic!r} does not exist (gateway {options.bootstrap})"
            )


# --- producer identity ------------------------------------------------------------------------------


def derived_producer_id(scope: str, task: int, era: int, group: int) -> int:
    """A producer id in [2**62, 2**63) from the writer's identity; the controller's ids stay far below."""
    digest = hashlib.blake2b(f"{scope}|{task}|{era}|{group}".encode(), digest_size=8).digest()
    return limits.DERIVED_PRODUCER_ID_BASE | (
        int.from_bytes(digest, "big") & (limits.DERIVED_PRODUCER_ID_BASE - 1)
    )


@dataclass
class _PartitionSequencer:
    batches: int = 0  # record batches this task has cut for the partition
    next_sequence: int = 0


class BatchNumbering:
    """Producer id, epoch and base sequence for each batch a task cuts, derived as the module says."""

    def __init__(self, scope: str, task: int, batch_id: int) -> None:
        self.scope = scope
        self.task = task
        self.epoch = batch_id % limits.PRODUCER_EPOCH_MODULUS
        self.era = batch_id // limits.PRODUCER_EPOCH_MODULUS
        self._partitions: dict[tuple[str, int], _PartitionSequencer] = {}
        self._ids: dict[int, int] = {}

    def number(self, tp: tuple[str, int], record_count: int) -> tuple[int, int, int]:
        """(producer id, epoch, base sequence) of the next batch of `record_count` records to `tp`."""
        state = self._partitions.setdefault(tp, _PartitionSequencer())
        group, index = divmod(state.batches, limits.BATCHES_PER_PRODUCER_ID)
        if index == 0:
            state.next_sequence = 0  # a fresh producer id starts its sequences at 0
        producer_id = self._ids.get(group)
        if producer_id is None:
            producer_id = self._ids[group] = derived_producer_id(self.scope, self.task, self.era, group)
        base = state.next_sequence
        state.next_sequence += record_count
        state.batches += 1
        return producer_id, self.epoch, base


# --- sending -----------------------------------------------------------------------------------------


@dataclass
class _Chunk:
    tp: tuple[str, int]
    data: bytes
    records: int
    first_failure: float | None = None


@dataclass
class WriteStats:
    records: int = 0
    batches: int = 0
    offsets: dict[str, list[int]] = field(default_factory=dict)  # "topic-p" -> [first offset, next offset]


class ChunkSender:
    """Sends record batches in per-partition order with one Produce in flight.

    Owned by one task. A partition's next batch joins a request only once the one before
    it is acknowledged; retriable errors put the batch back at the head of its queue.
    """

    def __init__(
        self, client: GatewayClient, acks: int, stats: WriteStats, transactional_id: str = ""
    ) -> None:
        self.client = client
        self.acks = acks
        self.stats = stats
        self.transactional_id = transactional_id  # set: the task's batches are transactional
        self.queues: dict[tuple[str, int], deque[_Chunk]] = {}
        self.queued_bytes = 0
        self.request_bytes_max = client.settings.max_request_bytes
        self.linger_ms = client.settings.linger_ms
        self._oldest_queued: float | None = None  # monotonic time the oldest waiting batch was queued
        self._in_flight: tuple[Callable[[], Any], list[_Chunk]] | None = None

    def add(self, chunk: _Chunk) -> None:
        self.queues.setdefault(chunk.tp, deque()).append(chunk)
        self.queued_bytes += len(chunk.data)
        now = time.monotonic()
        if self._oldest_queued is None:
            self._oldest_queued = now
        # linger.ms (Kafka's meaning): a closed batch waits at most this long for others to join
        # its Produce. It only decides when requests leave, never how batches are cut, so a
        # replayed task still numbers the same batches (see the module docstring).
        lingered = self.linger_ms is not None and (now - self._oldest_queued) * 1000 >= self.linger_ms
        if self.queued_bytes >= self.request_bytes_max or lingered:
            self._complete()
            self._send()

    def flush(self) -> None:
        while self.queued_bytes or self._in_flight is not None:
            self._complete()
            self._send()

    def _send(self) -> None:
        chunks: list[_Chunk] = []
        size = 0
        for queue in self.queues.values():
            if queue and (not chunks or size + len(queue[0].data) <= self.request_bytes_max):
                chunk = queue.popleft()
                chunks.append(chunk)
                size += len(chunk.data)
        if not chunks:
            return
        self.queued_bytes -= size
        self._oldest_queued = time.monotonic() if self.queued_bytes else None
        by_topic: dict[str, list[common_pb2.ProducePartitionData]] = {}
        for c in chunks:
            by_topic.setdefault(c.tp[0], []).append(
                common_pb2.ProducePartitionData(partition=c.tp[1], records=c.data)
            )
        request = common_pb2.ProduceRequest(
            acks=self.acks,
            timeout_ms=self.client.settings.request_timeout_ms,
            topics=[common_pb2.ProduceTopicData(topic=t, partitions=ps) for t, ps in by_topic.items()],
            transactional_id=self.transactional_id,
        )
        self._in_flight = (self.client.call_future("Produce", request), chunks)

    def _complete(self) -> None:
        if self._in_flight is None:
            return
        result, chunks = self._in_flight
        self._in_flight = None
        response = result()
        answers = {(t.topic, p.partition): p for t in response.topics for p in t.partitions}
        retry: list[_Chunk] = []
        for chunk in chunks:
            answer = answers.get(chunk.tp)
            code = answer.error_code if answer is not None else common_pb2.UNKNOWN_SERVER_ERROR
            if code == common_pb2.NONE:
                self._acknowledged(chunk, answer.base_offset if answer is not None else -1)
            elif code in RETRIABLE_CODES or code == common_pb2.UNKNOWN_TOPIC_OR_PARTITION:
                now = time.monotonic()
                chunk.first_failure = chunk.first_failure or now
                if now - chunk.first_failure > self.client.settings.retry_timeout_ms / 1000:
                    raise HighwaterSparkError(
                        f"writing to {chunk.tp[0]}-{chunk.tp[1]}: {code_name(code)} for longer than "
                        f"highwater.retry.timeout.ms={self.client.settings.retry_timeout_ms} ms: "
                        f"{answer.error_message if answer is not None else ''}"
                    )
                retry.append(chunk)
            else:
                raise HighwaterSparkError(self._explain(chunk, code, answer.error_message if answer else ""))
        for chunk in reversed(retry):
            self.queues[chunk.tp].appendleft(chunk)
            self.queued_bytes += len(chunk.data)
        if retry:
            time.sleep(limits.RETRY_BACKOFF_MS / 1000)

    def _acknowledged(self, chunk: _Chunk, base_offset: int) -> None:
        self.stats.records += chunk.records
        self.stats.batches += 1
        if base_offset >= 0:
            span = self.stats.offsets.setdefault(f"{chunk.tp[0]}-{chunk.tp[1]}", [base_offset, base_offset])
            span[0] = min(span[0], base_offset)
            span[1] = max(span[1], base_offset + chunk.records)

    @staticmethod
    def _explain(chunk: _Chunk, code: int, message: str) -> str:
        where = f"writing to {chunk.tp[0]}-{chunk.tp[1]}"
        if code == common_pb2.OUT_OF_ORDER_SEQUENCE_NUMBER:
            return (
                f"{where}: {message}. A replayed task cut its rows into batches that differ from the "
                "attempt that wrote before (its input was not the same rows in the same order), so "
                "duplicates cannot be ruled out; failing instead"
            )
        if code in (common_pb2.PRODUCER_FENCED, common_pb2.INVALID_TXN_STATE):
            return (
                f"{where}: {message}. Another attempt of this task started its transaction since "
                "(a retry or a speculative copy): this attempt stops, and the other one's is the write"
            )
        if code == common_pb2.INVALID_PRODUCER_EPOCH:
            return (
                f"{where}: {message}. A later micro-batch has already written with this task's "
                "producer id: this is a leftover attempt of an older batch"
            )
        if code == common_pb2.TOPIC_AUTHORIZATION_FAILED:
            return str(not_authorized(chunk.tp[0], "Write", f"{where}: {message}" if message else where))
        if code == common_pb2.MESSAGE_TOO_LARGE:
            return (
                f"{where}: {message}. Lower highwater.batch.size.bytes, or raise the topic's "
                "max.message.bytes if a single record is that large"
            )
        return f"{where}: {code_name(code)} {message}"


# --- the task ------------------------------------------------------------------------------------------


def write_task(
    rows: Iterator[pa.RecordBatch],
    options: WriteOptions,
    columns: InputColumns,
    numbering: BatchNumbering | TransactionalNumbering,
    client: GatewayClient | None = None,
) -> WriteStats:
    """Write every row of one Spark task; returns what was acknowledged. With a transactional
    numbering (TransactionalNumbering), the batches are its transaction's."""
    if client is None:
        with GatewayClient(options.bootstrap, options.client) as own:
            return write_task(rows, options, columns, numbering, own)
    stats = WriteStats()
    settings = options.client
    # A batch must fit in one Produce (kafka.max.request.size / highwater.max.request.size).
    batch_bytes_max = min(settings.batch_size_bytes, settings.max_request_bytes - _REQUEST_FRAMING_BYTES)
    txn = numbering.txn if isinstance(numbering, TransactionalNumbering) else None
    sender = ChunkSender(client, settings.acks, stats, txn.transactional_id if txn is not None else "")
    partition_counts: dict[str, int] = {}
    keyless_counter: dict[str, int] = {}
    open_batches: dict[tuple[str, int], tuple[list[Any], list[int]]] = {}  # tp -> (records, [bytes])

    def partitions_of(topic: str, source: str) -> int:
        count = partition_counts.get(topic)
        if count is None:
            check_topic(topic, source)
            found = client.partitions([topic]).get(topic)
            if found is None:
                raise HighwaterSparkError(f"{source}: topic {topic!r} does not exist")
            count = partition_counts[topic] = len(found)
        return count

    def close(tp: tuple[str, int]) -> None:
        records, _ = open_batches.pop(tp)
        producer_id, epoch, base_sequence = numbering.number(tp, len(records))
        data = encode_batch(
            records,
            compression=settings.compression,
            producer_id=producer_id,
            producer_epoch=epoch,
            base_sequence=base_sequence,
            transactional=txn is not None,
        )
        sender.add(_Chunk(tp, data, len(records)))

    for batch in rows:
        count = batch.num_rows
        if not count:
            continue
        now_ms = time.time_ns() // 1_000_000
        values = _bytes_column(batch, "value", columns.value_is_string)
        keys = _bytes_column(batch, "key", columns.key_is_string) if columns.key else [None] * count
        topics = batch.column("topic").to_pylist() if columns.topic else [options.topic] * count
        partitions = batch.column("partition").to_pylist() if columns.partition else [None] * count
        headers = _headers_column(batch) if columns.headers else None
        for i in range(count):
            topic = topics[i]
            if topic is None:
                raise HighwaterSparkError("column 'topic' is null in a row and no 'topic' option is set")
            n = partitions_of(topic, "option 'topic'" if options.topic else "column 'topic'")
            partition = partitions[i]
            key = keys[i]
            if partition is None:
                if key is not None:
                    partition = partition_for_key(key, n)
                else:
                    # Round-robin from the task's own start: deterministic, so a replay cuts the
                    # same batches (see the module docstring).
                    k = keyless_counter.get(topic, 0)
                    keyless_counter[topic] = k + 1
                    partition = (numbering.task + k) % n
            elif not 0 <= partition < n:
                raise HighwaterSparkError(
                    f"column 'partition': {partition} is not a partition of {topic!r} (it has {n})"
                )
            tp = (topic, partition)
            value = values[i]
            record_headers = headers[i] if headers is not None else []
            size = _RECORD_FRAMING_BYTES + (len(value) if value else 0) + (len(key) if key else 0)
            if size > batch_bytes_max and size + _REQUEST_FRAMING_BYTES > settings.max_request_bytes:
                raise HighwaterSparkError(
                    f"a record of {size} bytes for {topic}-{partition} is larger than the request size "
                    f"limit of {settings.max_request_bytes} bytes (kafka.max.request.size / "
                    "highwater.max.request.size), as Kafka's producer refuses it too"
                )
            pending = open_batches.get(tp)
            if pending is None:
                pending = open_batches[tp] = ([], [0])
            pending[0].append((key, value, record_headers, now_ms))
            pending[1][0] += size
            if pending[1][0] >= batch_bytes_max or len(pending[0]) >= limits.WRITE_BATCH_RECORDS_MAX:
                close(tp)
    for tp in list(open_batches):
        close(tp)
    sender.flush()
    return stats


def _bytes_column(batch: pa.RecordBatch, name: str, is_string: bool) -> list[bytes | None]:
    column = batch.column(name)
    if is_string:
        column = column.cast(pa.binary())  # UTF-8 bytes, as Spark's Kafka sink writes strings
    values: list[bytes | None] = column.to_pylist()
    return values


def _headers_column(batch: pa.RecordBatch) -> list[list[tuple[str, bytes | None]]]:
    out: list[list[tuple[str, bytes | None]]] = []
    for row in batch.column("headers").to_pylist():
        headers = []
        for h in row or ():
            if h is None or h["key"] is None:
                raise HighwaterSparkError("column 'headers': a header or its key is null")
            headers.append((h["key"], h["value"]))
        out.append(headers)
    return out


def exactly_once_task(
    rows: Iterator[pa.RecordBatch],
    options: WriteOptions,
    columns: InputColumns,
    scope: str,
    partition_id: int,
    batch_id: int | None,
) -> tuple[WriteStats, TaskTransaction | None]:
    """Write one task's rows in its transaction (spark_connector/transactions.py), left open
    for the driver to commit; None for the transaction when there was nothing to write, or when
    this is a replay of a micro-batch (`batch_id`) the task's transaction committed already."""
    first = next((batch for batch in rows if batch.num_rows), None)
    if first is None:
        return WriteStats(), None
    marker_topic = options.topic if options.topic is not None else first.column("topic")[0].as_py()
    if marker_topic is None:
        raise HighwaterSparkError("column 'topic' is null in a row and no 'topic' option is set")
    marker = (marker_topic, 0)
    tid = transactional_id(options.transactional_id_prefix, scope, partition_id)
    with GatewayClient(options.bootstrap, options.client) as client:
        txn = init_transaction(client, tid, options.transaction_timeout_ms)
        if batch_id is not None and batch_committed(client, tid, marker, batch_id):
            log.info(
                "micro-batch %d: task %d committed it before; nothing written again", batch_id, partition_id
            )
            return WriteStats(), None
        numbering = TransactionalNumbering(txn, partition_id, lambda tp: add_partition(client, txn, tp))
        stats = write_task(itertools.chain([first], rows), options, columns, numbering, client)
        if batch_id is not None:
            commit_marker(client, txn, marker, batch_id)
    return stats, txn


def end_task_transactions(
    options: WriteOptions, messages: list[WriterCommitMessage | None], commit: bool
) -> None:
    """The driver's half of an exactly-once write: end every task's transaction."""
    txns = [m.transaction for m in messages if isinstance(m, HighwaterCommitMessage) and m.transaction]
    if not txns:
        return
    with GatewayClient(options.bootstrap, options.client) as client:
        end_transactions(client, txns, commit)


@dataclass
class HighwaterCommitMessage(WriterCommitMessage):
    """What one task wrote: for logs and tests, and with deliveryGuarantee=exactly-once the
    transaction the driver ends."""

    partition_id: int
    attempt: int
    records: int
    batches: int
    offsets: dict[str, list[int]]
    transaction: TaskTransaction | None = None


def _task_context() -> tuple[int, int, Any]:
    from pyspark import TaskContext

    context = TaskContext.get()
    if context is None:  # pragma: no cover - write() always runs in a task
        raise HighwaterSparkError("write() must run inside a Spark task")
    return context.partitionId(), context.attemptNumber(), context


class HighwaterBatchWriter(DataSourceArrowWriter):
    """df.write.format("highwater"): every task writes with producer ids derived from `write_id`."""

    def __init__(self, options: WriteOptions, columns: InputColumns) -> None:
        self.options = options
        self.columns = columns
        # Drawn once at planning and pickled into every task, so a retried task reuses it.
        self.write_id = f"write:{uuid.uuid4()}"

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        partition_id, attempt, _ = _task_context()
        if self.options.exactly_once:
            stats, txn = exactly_once_task(
                iterator, self.options, self.columns, self.write_id, partition_id, None
            )
            return HighwaterCommitMessage(
                partition_id, attempt, stats.records, stats.batches, stats.offsets, txn
            )
        stats = write_task(
            iterator, self.options, self.columns, BatchNumbering(self.write_id, partition_id, 0)
        )
        return HighwaterCommitMessage(partition_id, attempt, stats.records, stats.batches, stats.offsets)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        if self.options.exactly_once:
            end_task_transactions(self.options, messages, commit=True)
        done = [m for m in messages if isinstance(m, HighwaterCommitMessage)]
        log.info(
            "Highwater write %s: %d records in %d batches from %d tasks",
            self.write_id,
            sum(m.records for m in done),
            sum(m.batches for m in done),
            len(done),
        )

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        if self.options.exactly_once:
            end_task_transactions(self.options, messages, commit=False)
            log.warning("Highwater write %s aborted: its transactions are aborted", self.write_id)
            return
        # A log cannot take records back: what tasks wrote stays (at-least-once for a failed job).
        log.warning(
            "Highwater write %s aborted; records already acknowledged stay in the topics", self.write_id
        )


class HighwaterStreamWriter(DataSourceStreamArrowWriter):
    """writeStream.format("highwater"): producer ids derived from (query id, task, batch id)."""

    def __init__(self, options: WriteOptions, columns: InputColumns) -> None:
        self.options = options
        self.columns = columns
        self.fallback_scope = f"write:{uuid.uuid4()}"

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        partition_id, attempt, context = _task_context()
        query_id = context.getLocalProperty(QUERY_ID_PROPERTY)
        batch_text = context.getLocalProperty(BATCH_ID_PROPERTY)
        if self.options.exactly_once:
            if not query_id or batch_text is None:  # pragma: no cover - Spark sets both
                raise HighwaterSparkError(
                    "deliveryGuarantee=exactly-once needs Spark's query id and batch id"
                )
            stats, txn = exactly_once_task(
                iterator, self.options, self.columns, f"query:{query_id}", partition_id, int(batch_text)
            )
            return HighwaterCommitMessage(
                partition_id, attempt, stats.records, stats.batches, stats.offsets, txn
            )
        if query_id and batch_text is not None:
            numbering = BatchNumbering(f"query:{query_id}", partition_id, int(batch_text))
        else:  # pragma: no cover - Spark sets both on every micro-batch task
            log.warning(
                "no streaming query id / batch id on this task: a replayed batch may be written twice"
            )
            numbering = BatchNumbering(self.fallback_scope, partition_id, 0)
        stats = write_task(iterator, self.options, self.columns, numbering)
        return HighwaterCommitMessage(partition_id, attempt, stats.records, stats.batches, stats.offsets)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        if self.options.exactly_once:
            end_task_transactions(self.options, messages, commit=True)
        done = [m for m in messages if isinstance(m, HighwaterCommitMessage)]
        log.info(
            "Highwater micro-batch %d: %d records in %d batches from %d tasks",
            batchId,
            sum(m.records for m in done),
            sum(m.batches for m in done),
            len(done),
        )

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        if self.options.exactly_once:
            end_task_transactions(self.options, messages, commit=False)
            log.warning("Highwater micro-batch %d aborted: its transactions are aborted", batchId)
            return
        log.warning(
            "Highwater micro-batch %d aborted; what tasks wrote stays, and the replay of batch %d "
            "will not write it again",
            batchId,
            batchId,
        )
