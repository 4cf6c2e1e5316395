"""Batch and streaming readers: plan offset ranges on the driver, fetch them in tasks.

Planning (driver, in Spark's planner Python worker): resolve the subscription to
topic-partitions with Metadata, turn startingOffsets / endingOffsets / timestamps into
offsets with ListOffsets, check them, and cut [start, end) ranges into input
partitions (one per topic-partition, split further by minPartitions). Reading (a
task): raw Fetch from the range's start (at the partition's leader, or through a
gateway: GatewayClient.fetch_future), one Fetch kept in flight while the previous
answer is decoded straight into Arrow columns (spark_connector.columnar.decode_columns: no
Python object per record; records outside the range dropped by the decoder) and
handed to Spark as a batch of the exact read schema. Only records below the high
watermark are ever returned (consumer fetches use replica_id -1), and each task stops
at its range's end, so a micro-batch reads exactly what its offsets say, however often
it is replayed.

kafka.isolation.level=read_committed (ReadOptions.read_committed): Fetches and ListOffsets
ask for read_committed, so "latest" is the last stable offset (LSO) at planning and a task
reads below the LSO where it would read below the high watermark; each Fetch answer's
records lose the batches of the aborted transactions it names
(clients/common/control_records.drop_aborted, Kafka's consumer rule) before they are
decoded. Transaction markers are control batches, which the decoder skips either way; their
offsets stay gaps in the `offset` column.

Data loss (failOnDataLoss, default true): offsets the range needs were deleted by
retention (OFFSET_OUT_OF_RANGE, or a start below the log start offset) or the topic
was deleted. true: the query fails with a message naming the partition, the offsets
and the option; false: the lost part is skipped and a warning is logged.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSourceReader,
    DataSourceStreamReader,
    EqualTo,
    Filter,
    GreaterThan,
    GreaterThanOrEqual,
    In,
    InputPartition,
    LessThan,
    LessThanOrEqual,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxBytes,
    ReadMaxRows,
    ReadMinRows,
    SupportsTriggerAvailableNow,
)

from clients.common.control_records import drop_aborted
from clients.common.record_batch import next_fetch_offset
from clients.common.types import TopicPartitionKey
from protos.highwater.v1 import common_pb2, gateway_pb2
from spark_connector import limits, planning
from spark_connector.columnar import decode_columns
from spark_connector.fetch_response import FetchedPartition
from spark_connector.gateway import (
    RETRIABLE_CODES,
    GatewayClient,
    HighwaterSparkError,
    code_name,
    not_authorized,
)
from spark_connector.options import (
    EARLIEST,
    LATEST,
    OffsetSpec,
    ReadOptions,
    offsets_from_json,
    offsets_to_json,
)
from spark_connector.planning import OffsetRange
from spark_connector.schema import ConstantColumns, columns_to_arrow
from spark_connector.worker import prepare_python_worker

log = logging.getLogger("highwater.spark")


class HighwaterInputPartition(InputPartition):
    """One Spark task's share: records [start, end) of one topic-partition.

    `leader`: the partition's leader address as the driver's metadata named it when it
    planned, so the task fetches from it without asking a gateway first (one connection
    and one Metadata call less per task); a stale one costs one NOT_LEADER answer, after
    which the task looks the leader up as usual.
    """

    def __init__(self, index: int, offset_range: OffsetRange, leader: str | None = None) -> None:
        super().__init__(index)
        self.range = offset_range
        self.leader = leader

    def __repr__(self) -> str:
        r = self.range
        return f"HighwaterInputPartition({r.topic}-{r.partition} [{r.start}, {r.end}))"


# --- planning (driver) ------------------------------------------------------------------------


def resolve_partitions(
    client: GatewayClient, options: ReadOptions, *, allow_empty: bool, missing_ok: bool = False
) -> list[TopicPartitionKey]:
    """The topic-partitions the subscription selects now; failures name the option.

    `missing_ok`: a subscribed topic that does not exist (any more) selects nothing instead
    of failing; a running stream decides about that with failOnDataLoss.
    """
    sub = options.subscription
    if sub.pattern is not None:
        found = client.partitions()
        tps = [(t, p) for t, ps in sorted(found.items()) if ps and sub.matches(t) for p in ps]
        if not tps and not allow_empty:
            raise HighwaterSparkError(f"option 'subscribePattern': {sub.pattern!r} matches no topic")
        return tps
    topics = list(sub.topics) or list(dict.fromkeys(t for t, _ in sub.assigned))
    found = client.partitions(topics)
    missing = [t for t in topics if found.get(t) is None]
    if missing and not missing_ok:
        raise HighwaterSparkError(
            f"option {sub.option!r}: topic {', '.join(map(repr, missing))} does not exist "
            f"(gateway {options.bootstrap})"
        )
    if sub.assigned:
        absent = [f"{t}-{p}" for t, p in sub.assigned if p not in (found[t] or [])]
        if absent and not missing_ok:
            raise HighwaterSparkError(f"option 'assign': partition {', '.join(absent)} does not exist")
        return [(t, p) for t, p in sub.assigned if p in (found[t] or [])]
    return [(t, p) for t in topics for p in (found[t] or [])]


def check_group(client: GatewayClient, options: ReadOptions) -> None:
    """kafka.group.id / groupIdPrefix: the query's principal must be allowed to use the group.

    Spark's Kafka source names its consumers' group with these options (for group-based
    ACLs) and commits no offsets to it; nor does this reader. What the group means here is
    that check, made once when a query is planned or started: a FetchCommittedOffsets of the
    group, which the authorizer allows only with Describe on it (Read implies Describe). With
    groupIdPrefix the group is the prefix and a suffix unique to the query, as Spark's.
    Raises HighwaterSparkError naming the option when the principal may not.
    """
    if options.group_id is not None:
        option, group = "kafka.group.id", options.group_id
    elif options.group_id_prefix is not None:
        option, group = "groupIdPrefix", f"{options.group_id_prefix}-{uuid.uuid4()}"
    else:
        return
    try:
        answer = client.call(
            "FetchCommittedOffsets", gateway_pb2.FetchCommittedOffsetsRequest(group_id=group)
        )
    except HighwaterSparkError as exc:
        if "PERMISSION_DENIED" not in str(exc):  # not the authorizer's refusal: its own message says what
            raise
        raise HighwaterSparkError(
            f"option {option!r}: the principal of this query's credentials may not use group {group!r} "
            f"({exc}); an operator grants it with `highwater acl add --principal User:<name> --operation "
            f"Read --group {group if option == 'kafka.group.id' else options.group_id_prefix}"
            f"{'' if option == 'kafka.group.id' else ' --prefixed'}`, or remove the option"
        ) from None
    if answer.error_code != common_pb2.NONE:
        raise HighwaterSparkError(
            f"option {option!r}: group {group!r}: {code_name(answer.error_code)} {answer.error_message}"
        )


def _unknown(tps: Iterable[TopicPartitionKey]) -> str:
    return ", ".join(f"{t}-{p}" for t, p in sorted(tps))


def list_offsets(
    client: GatewayClient, timestamps: dict[TopicPartitionKey, int], what: str
) -> dict[TopicPartitionKey, int]:
    answers = client.list_offsets(timestamps)
    gone = [tp for tp, (_, code) in answers.items() if code == common_pb2.UNKNOWN_TOPIC_OR_PARTITION]
    if gone:
        raise HighwaterSparkError(f"{what}: {_unknown(gone)} does not exist (was the topic deleted?)")
    refused = sorted(tp for tp, (_, code) in answers.items() if code == common_pb2.TOPIC_AUTHORIZATION_FAILED)
    if refused:
        raise not_authorized(refused[0][0], "Describe", f"ListOffsets for {what}")
    failed = {tp: code for tp, (_, code) in answers.items() if code != common_pb2.NONE}
    if failed:
        raise HighwaterSparkError(
            f"{what}: ListOffsets failed for "
            + ", ".join(f"{t}-{p} ({code_name(c)})" for (t, p), c in sorted(failed.items()))
        )
    return {tp: offset for tp, (offset, _) in answers.items()}


def check_every_partition_named(spec: OffsetSpec, tps: Sequence[TopicPartitionKey]) -> None:
    """Per-partition offsets or timestamps must name exactly the partitions the query reads.

    Spark's Kafka source refuses JSON that leaves a partition out ("you must specify all
    TopicPartitions"); taking a default for the rest would start them somewhere the job
    did not say. Partitions that appear later, in a running stream, start at earliest.
    """
    if spec.kind not in ("offsets", "timestamps") or spec.timestamp_all is not None:
        return
    named = set(spec.offsets) if spec.kind == "offsets" else set(spec.timestamps)
    missing = [tp for tp in tps if tp not in named]
    extra = [tp for tp in named if tp not in set(tps)]
    if missing or extra:
        use = "-2 for earliest, -1 for latest" if spec.kind == "offsets" else "a timestamp in ms"
        problems = ([f"leaves out {_unknown(missing)}"] if missing else []) + (
            [f"names {_unknown(extra)}, which the query does not read (no such partition?)"] if extra else []
        )
        raise HighwaterSparkError(
            f"option {spec.option!r} {' and '.join(problems)}: per-partition JSON must give every partition "
            f"of the subscribed topics ({use}), as Spark's Kafka source requires; partitions: {_unknown(tps)}"
        )


def resolve_offsets(
    client: GatewayClient,
    spec: OffsetSpec,
    tps: Sequence[TopicPartitionKey],
    *,
    default: int,
    timestamp_strategy: str = "error",
) -> dict[TopicPartitionKey, int]:
    """Concrete offsets for `tps` from an OffsetSpec (ListOffsets for earliest, latest, timestamps).

    Per-partition JSON must name every partition (the caller checks that first, with
    check_every_partition_named); `default` is what the others would get.
    """
    if spec.kind in ("earliest", "latest"):
        ts = EARLIEST if spec.kind == "earliest" else LATEST
        return list_offsets(client, dict.fromkeys(tps, ts), f"option {spec.option!r}")
    if spec.kind == "offsets":
        wanted = {tp: spec.offsets.get(tp, default) for tp in tps}
        special = {tp: o for tp, o in wanted.items() if o in (EARLIEST, LATEST)}
        resolved = list_offsets(client, special, f"option {spec.option!r}") if special else {}
        return {tp: resolved.get(tp, o) for tp, o in wanted.items()}
    # Timestamps: the first offset whose timestamp is >= the one asked.
    asked = {
        tp: spec.timestamps.get(tp, spec.timestamp_all if spec.timestamp_all is not None else -1)
        for tp in tps
    }
    missing_ts = [tp for tp, ts in asked.items() if ts < 0]
    if missing_ts:
        raise HighwaterSparkError(f"option {spec.option!r} gives no timestamp for {_unknown(missing_ts)}")
    found = list_offsets(client, asked, f"option {spec.option!r}")
    none = [tp for tp, o in found.items() if o < 0]
    if none:
        starting = spec.option.startswith("starting")
        if starting and timestamp_strategy == "error":
            raise HighwaterSparkError(
                f"option {spec.option!r}: no record at or after the timestamp in {_unknown(none)} "
                "(set startingOffsetsByTimestampStrategy=latest to start at the end instead)"
            )
        latest = list_offsets(client, dict.fromkeys(none, LATEST), f"option {spec.option!r}")
        found.update(latest)
    return found


def check_ranges(
    client: GatewayClient,
    starts: dict[TopicPartitionKey, int],
    ends: dict[TopicPartitionKey, int],
    options: ReadOptions,
    starting_option: str,
) -> dict[TopicPartitionKey, int]:
    """Starts checked against each partition's [log start, high watermark]; returns usable starts.

    A start below the log start offset means records were deleted by retention
    (failOnDataLoss decides); a start past the end is an error naming the option.
    """
    earliest = list_offsets(client, dict.fromkeys(starts, EARLIEST), "log start offsets")
    out: dict[TopicPartitionKey, int] = {}
    for tp, start in starts.items():
        end = ends[tp]
        if start > end:
            raise HighwaterSparkError(
                f"option {starting_option!r}: start offset {start} of {tp[0]}-{tp[1]} is "
                f"past its end offset {end}"
            )
        if start < earliest[tp]:
            lost = f"records [{start}, {earliest[tp]}) of {tp[0]}-{tp[1]} were deleted by retention"
            if options.fail_on_data_loss:
                raise HighwaterSparkError(f"{lost}; set failOnDataLoss=false to skip them")
            log.warning("%s; skipping them (failOnDataLoss=false)", lost)
            start = min(earliest[tp], end)
        out[tp] = start
    return out


# --- filter pushdown ---------------------------------------------------------------------------


@dataclass
class PushedBounds:
    """What pushed filters on partition, offset and timestamp allow (AND of them)."""

    partitions: set[int] | None = None
    partition_min: int = 0
    partition_max: int = 2**31 - 1
    offset_min: int = 0
    offset_end: int = 2**63 - 1  # exclusive
    timestamp_min_ms: int | None = None
    applied: list[str] = field(default_factory=list)

    def allows_partition(self, partition: int) -> bool:
        return self.partition_min <= partition <= self.partition_max and (
            self.partitions is None or partition in self.partitions
        )

    def narrow(self, r: OffsetRange) -> OffsetRange:
        return OffsetRange(r.topic, r.partition, max(r.start, self.offset_min), min(r.end, self.offset_end))


def _as_int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _timestamp_ms(value: Any) -> int | None:
    if isinstance(value, datetime):
        return int(value.timestamp() * 1000)
    return None


def push_filter(bounds: PushedBounds, f: Filter) -> bool:
    """Fold one filter into `bounds`. True: handled exactly (Spark need not evaluate it again).

    partition and offset filters are exact (they only narrow ranges); a timestamp lower
    bound moves each partition's start to the first offset at that time, but record
    timestamps are not ordered by offset, so Spark still evaluates timestamp filters.
    """
    # pyspark's Filter base declares no `attribute`; every concrete filter has one.
    column = f.attribute[0] if len(f.attribute) == 1 else None  # type: ignore[attr-defined]
    value = getattr(f, "value", None)
    if column == "partition":
        if isinstance(f, In):
            values = {v for v in f.value if _as_int(v) is not None}
            bounds.partitions = values if bounds.partitions is None else bounds.partitions & values
        elif (v := _as_int(value)) is None:
            return False
        elif isinstance(f, EqualTo):
            bounds.partitions = {v} if bounds.partitions is None else bounds.partitions & {v}
        elif isinstance(f, GreaterThan):
            bounds.partition_min = max(bounds.partition_min, v + 1)
        elif isinstance(f, GreaterThanOrEqual):
            bounds.partition_min = max(bounds.partition_min, v)
        elif isinstance(f, LessThan):
            bounds.partition_max = min(bounds.partition_max, v - 1)
        elif isinstance(f, LessThanOrEqual):
            bounds.partition_max = min(bounds.partition_max, v)
        else:
            return False
        bounds.applied.append(repr(f))
        return True
    if column == "offset":
        v = _as_int(value)
        if v is None:
            return False
        if isinstance(f, EqualTo):
            bounds.offset_min, bounds.offset_end = max(bounds.offset_min, v), min(bounds.offset_end, v + 1)
        elif isinstance(f, GreaterThan):
            bounds.offset_min = max(bounds.offset_min, v + 1)
        elif isinstance(f, GreaterThanOrEqual):
            bounds.offset_min = max(bounds.offset_min, v)
        elif isinstance(f, LessThan):
            bounds.offset_end = min(bounds.offset_end, v)
        elif isinstance(f, LessThanOrEqual):
            bounds.offset_end = min(bounds.offset_end, v + 1)
        else:
            return False
        bounds.applied.append(repr(f))
        return True
    if column == "timestamp" and isinstance(f, (GreaterThan, GreaterThanOrEqual, EqualTo)):
        ms = _timestamp_ms(value)
        if ms is not None:
            # Rounded down to the ms: the moved start may include a few records Spark then drops.
            bounds.timestamp_min_ms = max(bounds.timestamp_min_ms or 0, ms)
            bounds.applied.append(repr(f))
    return False


# --- reading (tasks) ---------------------------------------------------------------------------


def read_range(client: GatewayClient, r: OffsetRange, options: ReadOptions) -> Iterator[pa.RecordBatch]:
    """Arrow batches of every record in [r.start, r.end) of one partition, in offset order.

    A compacted topic's range holds fewer than end - start records (its cleaner leaves
    offset holes): the range is read once the fetch position reaches r.end, that is past
    a batch whose last offset is r.end - 1 or later, or past a hole that reaches the HW
    (never once end - start records came back).

    Raises HighwaterSparkError when the partition makes no progress (retriable errors,
    or no records where the plan says there are) for highwater.retry.timeout.ms.
    """
    tp = (r.topic, r.partition)
    max_bytes = options.client.fetch_max_bytes
    bound_name = _bound_name(options)
    constants = ConstantColumns(r.topic, r.partition)
    offset = r.start
    pending = client.fetch_future(tp, offset, max_bytes)
    stalled: _Stall | None = None
    while offset < r.end:
        part = pending()
        code = part.error_code
        if code != common_pb2.NONE:
            before = offset
            offset = _after_fetch_error(client, r, offset, part, options)
            if offset >= r.end:
                return
            if offset == before:
                stalled = _Stall.check(stalled, client, r, offset, f"{code_name(code)} {part.error_message}")
            pending = client.fetch_future(tp, offset, max_bytes)
            continue
        data = part.records
        # The first offset this Fetch could not read: read_committed stops at the LSO.
        bound = part.last_stable_offset if options.read_committed else part.high_watermark
        next_offset = next_fetch_offset(data, offset) if data else None
        if not data and part.location is None and offset < bound:
            # A compacted log's hole up to the bound: the Fetch asked for this partition alone, so
            # a leader with any batch in [offset, bound) had to send one (its first batch always
            # goes). No record lies there; the range is read as far as the bound.
            stalled = None
            offset = bound
            if offset < r.end:
                pending = client.fetch_future(tp, offset, max_bytes)
            continue
        if next_offset is None or next_offset <= offset:
            # Nothing below the bound yet at `offset` though the plan says there is: a new leader
            # whose high watermark (and so LSO) lags, briefly. Long-poll, within the retry timeout.
            stalled = _Stall.check(stalled, client, r, offset, f"no records ({bound_name} {bound})")
            pending = client.fetch_future(tp, offset, max_bytes, limits.FETCH_EMPTY_WAIT_MS)
            continue
        stalled = None
        if next_offset < r.end:
            pending = client.fetch_future(tp, next_offset, max_bytes)
        # The first batch may start before `offset` and the last may run past the end: the
        # decoder keeps only [offset, r.end).
        # A located read covers up to LOCAL_READ_BYTES: decoded in fetch.max.bytes groups, so
        # Spark's Arrow batches are the size a fetched answer gives.
        committed: bytes | bytearray | memoryview = data
        if options.read_committed and part.aborted_transactions:
            # A copy only when a batch is dropped (drop_aborted returns `data` itself otherwise).
            committed = drop_aborted(data, part.aborted_transactions)
        for columns in decode_columns(
            committed,
            start_offset=offset,
            end_offset=r.end,
            include_headers=options.include_headers,
            group_bytes_max=max_bytes,
        ):
            if len(columns):
                yield columns_to_arrow(columns, constants, options.include_headers)
        offset = next_offset


def _bound_name(options: ReadOptions) -> str:
    """What a read stops at, for messages: read_committed reads below the last stable offset."""
    return "last stable offset" if options.read_committed else "high watermark"


@dataclass(frozen=True)
class _Stall:
    """Since when a partition has made no progress, and until when that is tolerated."""

    deadline: float

    @staticmethod
    def check(stall: _Stall | None, client: GatewayClient, r: OffsetRange, offset: int, why: str) -> _Stall:
        now = time.monotonic()
        if stall is None:
            return _Stall(now + client.settings.retry_timeout_ms / 1000)
        if now >= stall.deadline:
            raise HighwaterSparkError(
                f"{r.topic}-{r.partition}: no progress at offset {offset} (the plan reads to {r.end}) for "
                f"highwater.retry.timeout.ms={client.settings.retry_timeout_ms} ms; last: {why}"
            )
        return stall


def _after_fetch_error(
    client: GatewayClient, r: OffsetRange, offset: int, part: FetchedPartition, options: ReadOptions
) -> int:
    """Where to go on after a per-partition Fetch error: the same offset, a later one, or raise."""
    code = part.error_code
    name = f"{r.topic}-{r.partition}"
    if code in RETRIABLE_CODES:
        time.sleep(limits.RETRY_BACKOFF_MS / 1000)
        return offset
    if code == common_pb2.OFFSET_OUT_OF_RANGE:
        earliest, _ = client.list_offsets({(r.topic, r.partition): EARLIEST}).get(
            (r.topic, r.partition), (-1, 0)
        )
        if earliest <= offset:
            raise HighwaterSparkError(f"{name}: offset {offset} is out of range: {part.error_message}")
        lost = (
            f"{name}: records [{offset}, {min(earliest, r.end)}) were deleted by retention "
            "before they were read"
        )
        if options.fail_on_data_loss:
            raise HighwaterSparkError(f"{lost}; set failOnDataLoss=false to skip them")
        log.warning("%s; skipping them (failOnDataLoss=false)", lost)
        return earliest
    if code == common_pb2.UNKNOWN_TOPIC_OR_PARTITION:
        lost = f"{name} no longer exists (topic deleted?); records [{offset}, {r.end}) cannot be read"
        if options.fail_on_data_loss:
            raise HighwaterSparkError(f"{lost}; set failOnDataLoss=false to skip them")
        log.warning("%s; skipping them (failOnDataLoss=false)", lost)
        return r.end
    if code == common_pb2.TOPIC_AUTHORIZATION_FAILED:
        raise not_authorized(r.topic, "Read", f"Fetch of {name}")
    raise HighwaterSparkError(
        f"Fetch of {name} at offset {offset} failed: {code_name(code)} {part.error_message}"
    )


def _input_partitions(
    ranges: list[OffsetRange], options: ReadOptions, leaders: Mapping[TopicPartitionKey, str]
) -> list[HighwaterInputPartition]:
    """Spark's tasks for the ranges, split as minPartitions and maxRecordsPerPartition ask."""
    split = planning.split_ranges(ranges, options.min_partitions, options.max_records_per_partition)
    return [HighwaterInputPartition(i, r, leaders.get((r.topic, r.partition))) for i, r in enumerate(split)]


def _read_partition(partition: InputPartition, options: ReadOptions) -> Iterator[pa.RecordBatch]:
    """A task's records: its range read through a gateway client of its own."""
    if not isinstance(partition, HighwaterInputPartition):
        return  # partitions() found nothing to read: Spark still runs one task with a placeholder
    prepare_python_worker()
    with GatewayClient(options.bootstrap, options.client, read_committed=options.read_committed) as client:
        if partition.leader is not None:
            client.hint_leader((partition.range.topic, partition.range.partition), partition.leader)
        yield from read_range(client, partition.range, options)


# --- batch reader --------------------------------------------------------------------------------


class HighwaterBatchReader(DataSourceReader):
    """Reads [startingOffsets, endingOffsets) of every selected partition, once."""

    def __init__(self, options: ReadOptions) -> None:
        self.options = options
        self.bounds = PushedBounds()

    def partitions(self) -> Sequence[InputPartition]:
        options = self.options
        with GatewayClient(
            options.bootstrap, options.client, read_committed=options.read_committed
        ) as client:
            check_group(client, options)
            # A pattern that matches no topic reads nothing, as Spark's Kafka source does.
            selected = resolve_partitions(
                client, options, allow_empty=options.subscription.pattern is not None
            )
            for spec in (options.starting, options.ending):
                if spec is not None:
                    check_every_partition_named(spec, selected)
            tps = [tp for tp in selected if self.bounds.allows_partition(tp[1])]
            if not tps:
                return []
            if options.ending is None:  # pragma: no cover - batch options always have one
                raise HighwaterSparkError("a batch read needs ending offsets")
            ends = resolve_offsets(client, options.ending, tps, default=LATEST)
            bound_name = _bound_name(options)
            latest = list_offsets(client, dict.fromkeys(tps, LATEST), f"{bound_name}s")
            for tp, end in ends.items():
                if end > latest[tp]:
                    raise HighwaterSparkError(
                        f"option {options.ending.option!r}: end offset {end} of "
                        f"{tp[0]}-{tp[1]} is past its {bound_name} {latest[tp]}"
                        + (
                            " (kafka.isolation.level=read_committed reads below it)"
                            if options.read_committed
                            else ""
                        )
                    )
            starts = resolve_offsets(
                client, options.starting, tps, default=EARLIEST, timestamp_strategy=options.timestamp_strategy
            )
            if self.bounds.timestamp_min_ms is not None:
                by_time = list_offsets(
                    client, dict.fromkeys(tps, self.bounds.timestamp_min_ms), "timestamp filter"
                )
                starts = {
                    tp: max(s, by_time[tp] if by_time[tp] >= 0 else ends[tp]) for tp, s in starts.items()
                }
                starts = {tp: min(s, ends[tp]) for tp, s in starts.items()}
            starts = check_ranges(client, starts, ends, options, options.starting.option)
            leaders = client.known_leaders()
        ranges = [self.bounds.narrow(OffsetRange(t, p, starts[(t, p)], ends[(t, p)])) for t, p in tps]
        return _input_partitions(ranges, options, leaders)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        yield from _read_partition(partition, self.options)


class HighwaterFilteringBatchReader(HighwaterBatchReader):
    """The batch reader plus filter pushdown (pushFilters), used with option pushFilters=true.

    A separate class because PySpark refuses a reader that implements pushFilters
    unless spark.sql.python.filterPushdown.enabled is true, and the data source cannot
    see Spark's configuration: the option says the user turned both on.
    """

    def pushFilters(self, filters: list[Filter]) -> Iterable[Filter]:
        for f in filters:
            if not push_filter(self.bounds, f):
                yield f


# --- streaming reader ------------------------------------------------------------------------------


class HighwaterStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Micro-batch reader. Offsets are Kafka's per-partition JSON: {"topic": {"0": next offset}}.

    The driver-side object lives as long as the query (Spark keeps it in one planner
    worker) and keeps one gateway client; it is pickled without it for the tasks.
    Partitions that appear later (new partitions, new topics matching subscribePattern)
    are read from their earliest offset, as Spark's Kafka source does.
    """

    def __init__(self, options: ReadOptions) -> None:
        self.options = options
        self._client: GatewayClient | None = None
        self._available_now_target: dict[TopicPartitionKey, int] | None = None
        # minOffsetsPerTrigger / maxTriggerDelay: when the last micro-batch was admitted
        # (time.monotonic()). None, like Spark's Kafka source's 0, makes the first trigger after
        # a (re)start never delayed.
        self._last_trigger_s: float | None = None

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_client"] = None  # channels are not picklable; tasks make their own
        return state

    @property
    def client(self) -> GatewayClient:
        if self._client is None:
            client = GatewayClient(
                self.options.bootstrap, self.options.client, read_committed=self.options.read_committed
            )
            check_group(client, self.options)  # once per start of the query (this object's life)
            self._client = client
        return self._client

    def _current_partitions(self) -> list[TopicPartitionKey]:
        return resolve_partitions(self.client, self.options, allow_empty=True, missing_ok=True)

    def initialOffset(self) -> dict[str, dict[str, int]]:
        tps = resolve_partitions(
            self.client, self.options, allow_empty=self.options.subscription.pattern is not None
        )
        check_every_partition_named(self.options.starting, tps)
        starts = resolve_offsets(
            self.client,
            self.options.starting,
            tps,
            default=LATEST,
            timestamp_strategy=self.options.timestamp_strategy,
        )
        latest = list_offsets(self.client, dict.fromkeys(tps, LATEST), "high watermarks")
        starts = check_ranges(self.client, starts, latest, self.options, self.options.starting.option)
        return offsets_to_json(starts)

    def getDefaultReadLimit(self) -> ReadLimit:
        # PySpark has no composite limit: minOffsetsPerTrigger is applied in latestOffset from
        # the options whenever Spark does not ask for everything (ReadAllAvailable: Trigger.Once).
        if self.options.max_offsets_per_trigger is not None:
            return ReadMaxRows(self.options.max_offsets_per_trigger)
        if self.options.max_bytes_per_trigger is not None:
            return ReadMaxBytes(self.options.max_bytes_per_trigger)
        if self.options.min_offsets_per_trigger is not None:
            return ReadMinRows(self.options.min_offsets_per_trigger)
        return ReadAllAvailable()

    def _delay_batch(
        self, current: dict[TopicPartitionKey, int], latest: dict[TopicPartitionKey, int]
    ) -> bool:
        """Spark's rule (KafkaMicroBatchStream.delayBatch): skip this trigger while fewer than
        minOffsetsPerTrigger offsets are available, unless maxTriggerDelay has passed since the
        last batch was admitted."""
        minimum = self.options.min_offsets_per_trigger
        if minimum is None:
            return False
        now = time.monotonic()
        last = self._last_trigger_s
        if last is None or (now - last) * 1000 >= self.options.max_trigger_delay_ms:
            self._last_trigger_s = now
            return False
        available = sum(latest[tp] - current.get(tp, 0) for tp in latest)
        if available < minimum:
            log.debug("trigger skipped: %d offsets available, minOffsetsPerTrigger=%d", available, minimum)
            return True
        self._last_trigger_s = now
        return False

    def prepareForTriggerAvailableNow(self) -> None:
        tps = self._current_partitions()
        self._available_now_target = list_offsets(self.client, dict.fromkeys(tps, LATEST), "high watermarks")

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, dict[str, int]]:
        begin = offsets_from_json(start, "start offset")
        tps = self._current_partitions()
        latest = self._latest(tps)
        tps = [tp for tp in tps if tp in latest]
        gone = [tp for tp in begin if tp not in tps]
        if gone:
            lost = f"{_unknown(gone)} no longer exist(s) (topic deleted?)"
            if self.options.fail_on_data_loss:
                raise HighwaterSparkError(f"{lost}; set failOnDataLoss=false to go on without them")
            log.warning("%s; going on without them (failOnDataLoss=false)", lost)
        if self._available_now_target is not None:
            # Trigger.AvailableNow reads what existed when the query started, nothing newer.
            tps = [tp for tp in tps if tp in self._available_now_target]
            latest = planning.cap(latest, self._available_now_target)
        new = [tp for tp in tps if tp not in begin]
        base = dict(begin)
        if new:
            base.update(list_offsets(self.client, dict.fromkeys(new, EARLIEST), "log start offsets"))
        for tp in tps:
            if latest[tp] < base[tp]:
                lost = (
                    f"{tp[0]}-{tp[1]}: high watermark {latest[tp]} is below the next offset to read "
                    f"{base[tp]} (topic re-created, or an unclean leader election lost records)"
                )
                if self.options.fail_on_data_loss:
                    raise HighwaterSparkError(f"{lost}; set failOnDataLoss=false to go on from there")
                log.warning("%s; going on from %d (failOnDataLoss=false)", lost, latest[tp])
                base[tp] = latest[tp]
        current = {tp: base[tp] for tp in tps}
        latest = {tp: latest[tp] for tp in tps}
        # Trigger.AvailableNow reads to its target whatever minOffsetsPerTrigger says (waiting for
        # more could wait forever), and ReadAllAvailable (Trigger.Once) asks for everything.
        if (
            self._available_now_target is None
            and not isinstance(limit, ReadAllAvailable)
            and self._delay_batch(current, latest)
        ):
            return offsets_to_json(current)
        if isinstance(limit, ReadMaxRows):
            end = planning.limit_by_rows(current, latest, limit.max_rows)
            if self.options.max_bytes_per_trigger is not None:
                end = self._limit_bytes(current, end, self.options.max_bytes_per_trigger)
        elif isinstance(limit, ReadMaxBytes):
            end = self._limit_bytes(current, latest, limit.max_bytes)
        else:
            end = latest
        # New partitions with nothing admitted yet are still recorded, at their start, so the
        # next batch knows where they begin.
        return offsets_to_json(end)

    def _limit_bytes(
        self, start: dict[TopicPartitionKey, int], latest: dict[TopicPartitionKey, int], max_bytes: int
    ) -> dict[TopicPartitionKey, int]:
        """Sample each partition's record size from its start (a soft limit, see planning.limit_by_bytes)."""
        per_record: dict[TopicPartitionKey, float] = {}
        for tp, s in start.items():
            if latest[tp] <= s:
                continue
            part = (
                self.client.call("Fetch", self.client.fetch_request(tp, s, limits.BYTES_SAMPLE_MAX_BYTES))
                .topics[0]
                .partitions[0]
            )
            end = (
                next_fetch_offset(part.records, s)
                if part.error_code == common_pb2.NONE and part.records
                else None
            )
            if end is not None and end > s:
                per_record[tp] = len(part.records) / (end - s)
        return planning.limit_by_bytes(start, latest, per_record, max_bytes)

    def _latest(self, tps: list[TopicPartitionKey]) -> dict[TopicPartitionKey, int]:
        """High watermarks of the partitions that still exist (a topic being deleted may still be in
        the metadata while its leaders already answer UNKNOWN_TOPIC_OR_PARTITION)."""
        answers = self.client.list_offsets(dict.fromkeys(tps, LATEST))
        refused = sorted(
            tp for tp, (_, code) in answers.items() if code == common_pb2.TOPIC_AUTHORIZATION_FAILED
        )
        if refused:
            raise not_authorized(refused[0][0], "Describe", "ListOffsets for high watermarks")
        failed = {
            tp: code
            for tp, (_, code) in answers.items()
            if code not in (common_pb2.NONE, common_pb2.UNKNOWN_TOPIC_OR_PARTITION)
        }
        if failed:
            raise HighwaterSparkError(
                "high watermarks: ListOffsets failed for "
                + ", ".join(f"{t}-{p} ({code_name(c)})" for (t, p), c in sorted(failed.items()))
            )
        return {tp: offset for tp, (offset, code) in answers.items() if code == common_pb2.NONE}

    def reportLatestOffset(self) -> dict[str, dict[str, int]] | None:
        # Progress reporting only: never fail the query from here (latestOffset decides).
        try:
            latest = self._latest(self._current_partitions())
        except HighwaterSparkError as exc:
            log.info("latest offsets not reported: %s", exc)
            return None
        return offsets_to_json(latest) if latest else None

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        begin = offsets_from_json(start, "start offset")
        finish = offsets_from_json(end, "end offset")
        new = [tp for tp in finish if tp not in begin]
        if new:
            begin.update(list_offsets(self.client, dict.fromkeys(new, EARLIEST), "log start offsets"))
        ranges = [OffsetRange(t, p, min(begin[(t, p)], e), e) for (t, p), e in sorted(finish.items())]
        return _input_partitions(ranges, self.options, self.client.known_leaders())

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        yield from _read_partition(partition, self.options)

    def commit(self, end: dict[str, Any]) -> None:
        log.debug("micro-batch up to %s committed", end)

    def stop(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None
