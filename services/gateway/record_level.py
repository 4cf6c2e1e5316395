"""The record-level calls' logic: which partition each record goes to, how records become
batches, and how answers are put together. Pure: no grpc, no asyncio, no clock.

ProduceRecords lets a client in any language send plain records; the gateway then does
what our Python Producer does on the client side (clients/producer.py): the same
partitioner (clients/common/partitioner.py, Kafka's murmur2 for keyed records, sticky for
keyless ones), the same codec (clients/common/records.py) and idempotent batches.
record_producer.py owns that I/O: producer ids, per-partition sequence numbers, sending.
ConsumeRecords (its loop in record_streams.py) turns fetched batches back into records
(`consumed_records`, one answer at a time in `take_fetched`) and, with
`stop_at_end`, cuts them at each partition's high watermark as of the call. A compacted
log has offset holes: positions follow the batches' offsets (a batch's last offset + 1,
whatever records are left in it), never a count of records (`hole_end`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from clients.common.control_records import drop_aborted
from clients.common.errors import CorruptMessage, check
from clients.common.partitioner import StickyPartitioner, partition_for_key
from clients.common.record_batch import iter_batch_headers
from clients.common.records import COMPRESSION_CODES, Record, decode_batches, encode_batch
from protos.highwater.v1 import common_pb2, gateway_pb2
from services.common import limits
from services.gateway.routing import RETRIABLE_ROUTING_CODES

# Bytes a record adds to a batch beyond its protobuf size: its length, attributes,
# timestamp and offset deltas and header count (varints, at most ~25 together).
# Overestimated so a cut batch stays under the cap.
RECORD_OVERHEAD_BYTES_MAX = 32
# The RecordBatch v2 header (61 bytes), rounded up.
BATCH_OVERHEAD_BYTES = 64
# Kafka's sequence numbers are int32 and wrap to 0 (clients/idempotence.py).
SEQUENCE_MODULUS = 2**31


def produce_records_problem(request: gateway_pb2.ProduceRecordsRequest) -> str | None:
    """What makes a ProduceRecords unanswerable as a whole (INVALID_ARGUMENT), or None."""
    if not request.topic:
        return "topic is empty; name the topic to write to"
    count = len(request.records)
    if count == 0:
        return "records is empty; send at least one record"
    if count > limits.PRODUCE_RECORDS_PER_REQUEST_MAX:
        return (
            f"{count} records in one request; the limit is {limits.PRODUCE_RECORDS_PER_REQUEST_MAX} "
            "(send several requests)"
        )
    if len(request.request_id) > limits.PRODUCE_REQUEST_ID_MAX_CHARS:
        return (
            f"request_id is {len(request.request_id)} characters; the limit is "
            f"{limits.PRODUCE_REQUEST_ID_MAX_CHARS}"
        )
    if request.timeout_ms < 0:
        return (
            f"timeout_ms must be >= 0 (0: the default, {limits.PRODUCE_TIMEOUT_MS_DEFAULT} ms), got "
            f"{request.timeout_ms}"
        )
    if len(request.transactional_id) > limits.TRANSACTIONAL_ID_MAX_CHARS:
        return (
            f"transactional_id is {len(request.transactional_id)} characters; the limit is "
            f"{limits.TRANSACTIONAL_ID_MAX_CHARS}"
        )
    if request.compression and request.compression not in COMPRESSION_CODES:
        return f"unknown compression {request.compression!r}; expected one of {sorted(COMPRESSION_CODES)}"
    for index, record in enumerate(request.records):
        if record.HasField("timestamp_ms") and record.timestamp_ms < 0:
            return (
                f"record {index}: timestamp_ms must be >= 0 (ms since the Unix epoch), "
                f"got {record.timestamp_ms}"
            )
    return None


@dataclass
class ProducePlan:
    """Where each record of a request goes.

    `by_partition` keeps request order within each partition; `refused` holds the records
    that go nowhere (a partition number the topic does not have), with their answer.
    """

    by_partition: dict[int, list[int]] = field(default_factory=dict)
    refused: dict[int, tuple[common_pb2.ErrorCode, str]] = field(default_factory=dict)


def record_size_bytes(record: gateway_pb2.ProducerRecord) -> int:
    """An upper bound of the record's encoded size inside a batch (before compression).

    The protobuf size (one C call) already counts every key, value and header byte with a
    length prefix at least as long as the batch's varints; the record's own fields (length,
    attributes, deltas, header count) add at most RECORD_OVERHEAD_BYTES_MAX.
    """
    size_bytes: int = record.ByteSize()  # protobuf's Message base class is untyped here
    return size_bytes + RECORD_OVERHEAD_BYTES_MAX


def plan_produce(
    topic: str,
    records: Sequence[gateway_pb2.ProducerRecord],
    partition_count: int,
    available: Sequence[int],
    sticky: StickyPartitioner,
) -> ProducePlan:
    """The partition of every record, as our Producer would choose it.

    A record naming a partition goes there (if the topic has it); a keyed record to
    murmur2(key) % partition_count; a keyless one to the sticky partition of `topic`,
    which moves on after the Producer's batch size, as it does in clients/producer.py.
    `available` are the partitions with a live leader (sticky choices prefer them).
    """
    check(partition_count > 0, "plan_produce for %s with %s partitions", topic, partition_count)
    plan = ProducePlan()
    for index, record in enumerate(records):
        if record.HasField("partition"):
            partition = record.partition
            if not 0 <= partition < partition_count:
                plan.refused[index] = (
                    common_pb2.UNKNOWN_TOPIC_OR_PARTITION,
                    f"topic {topic!r} has partitions 0..{partition_count - 1}; there is no "
                    f"partition {partition}",
                )
                continue
        elif record.HasField("key"):
            partition = partition_for_key(record.key, partition_count)
        else:
            partition = sticky.partition(topic, partition_count, available, record_size_bytes(record))
        plan.by_partition.setdefault(partition, []).append(index)
    return plan


def cut_batches(
    records: Sequence[gateway_pb2.ProducerRecord],
    indexes: Sequence[int],
    batch_bytes_max: int,
    records_max: int = limits.RECORDS_PER_BATCH_MAX,
) -> list[list[int]]:
    """Split one partition's records (by request index) into batches under `batch_bytes_max`
    and of at most `records_max` records.

    A record larger than the cap gets a batch of its own, which the leader then refuses
    with MESSAGE_TOO_LARGE and the sentence saying the topic's limit.
    """
    batches: list[list[int]] = []
    current: list[int] = []
    size = BATCH_OVERHEAD_BYTES
    for index in indexes:
        record_bytes = record_size_bytes(records[index])
        if current and (size + record_bytes > batch_bytes_max or len(current) >= records_max):
            batches.append(current)
            current, size = [], BATCH_OVERHEAD_BYTES
        current.append(index)
        size += record_bytes
    if current:
        batches.append(current)
    return batches


def encode_records(
    records: Sequence[gateway_pb2.ProducerRecord],
    indexes: Sequence[int],
    *,
    now_ms: int,
    compression: str,
    producer_id: int,
    producer_epoch: int,
    base_sequence: int,
    transactional: bool = False,
) -> bytes:
    """One RecordBatch v2 of these records, numbered from `base_sequence` for the idempotent
    producer (and flagged transactional for a transactional request's)."""
    tuples = []
    for index in indexes:
        record = records[index]
        tuples.append(
            (
                record.key if record.HasField("key") else None,
                record.value if record.HasField("value") else None,
                [(h.key, h.value) for h in record.headers],
                record.timestamp_ms if record.HasField("timestamp_ms") else now_ms,
            )
        )
    return encode_batch(
        tuples,
        compression=compression or "none",
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        base_sequence=base_sequence,
        transactional=transactional,
    )


def next_sequence(sequence: int, increment: int) -> int:
    return (sequence + increment) % SEQUENCE_MODULUS


def consumed_records(
    topic: str, partition: int, data: bytes, from_offset: int
) -> list[gateway_pb2.ConsumedRecord]:
    """The records of fetched batches at or past `from_offset` (a fetch may start mid-batch).

    Raises CorruptMessage (clients/common/errors.py) for bytes a consumer cannot decode.
    """
    out = []
    for record in decode_batches(data):
        if record.offset < from_offset:
            continue
        out.append(_consumed(topic, partition, record))
    return out


def _consumed(topic: str, partition: int, record: Record) -> gateway_pb2.ConsumedRecord:
    message = gateway_pb2.ConsumedRecord(
        topic=topic,
        partition=partition,
        offset=record.offset,
        timestamp_ms=record.timestamp_ms,
        timestamp_type=record.timestamp_type,
        headers=[gateway_pb2.RecordHeader(key=k, value=v or b"") for k, v in record.headers],
    )
    if record.key is not None:
        message.key = record.key
    if record.value is not None:
        message.value = record.value
    return message


def failed_results(
    indexes: Iterable[int], partition: int, code: common_pb2.ErrorCode, message: str
) -> dict[int, gateway_pb2.RecordResult]:
    return {
        i: gateway_pb2.RecordResult(
            partition=partition, offset=-1, error_code=code, error_message=message, timestamp_ms=-1
        )
        for i in indexes
    }


def written_results(
    indexes: Sequence[int],
    partition: int,
    base_offset: int,
    timestamps_ms: Sequence[int],
    log_append_time_ms: int,
) -> dict[int, gateway_pb2.RecordResult]:
    """Results of records written together: consecutive offsets from `base_offset`."""
    return {
        index: gateway_pb2.RecordResult(
            partition=partition,
            offset=base_offset + position,
            timestamp_ms=log_append_time_ms if log_append_time_ms >= 0 else timestamps_ms[position],
        )
        for position, index in enumerate(indexes)
    }


def positions_before_end(positions: dict[int, int], ends: dict[int, int]) -> dict[int, int]:
    """ConsumeRecords' positions (stop_at_end) without the partitions that reached their end
    offset, or that have none (its lookup failed and was reported): nothing is left to send."""
    return {p: offset for p, offset in positions.items() if offset < ends.get(p, offset)}


def records_before(
    records: list[gateway_pb2.ConsumedRecord], end_offset: int
) -> list[gateway_pb2.ConsumedRecord]:
    """The records below `end_offset`: a fetch past the high watermark read at the call's
    start may bring records written since, which a stop_at_end stream does not send."""
    if not records or records[-1].offset < end_offset:
        return records
    return [r for r in records if r.offset < end_offset]


def hole_end(
    position: int, answer: common_pb2.FetchPartitionResponse, read_committed: bool = False
) -> int | None:
    """Where a read at `position` goes on after `answer` brought no records: its high watermark
    (its last stable offset when `read_committed`: a read_committed Fetch never reads past it)
    when [position, that end) may hold no record at all, else None (nothing to skip).

    A compacted log has holes, and one may reach the HW: then no Fetch at `position` brings
    a batch until more is written, yet the offsets below the HW are all read. That is proven
    only by an answer to a Fetch of the partition alone (a leader sends the first batch of an
    answer whatever its size, and the gateway keeps it whole): in a Fetch of several
    partitions one may come back empty because the answer's byte budget went to the others.
    So ConsumeRecords asks such a partition alone before it moves past the hole.
    """
    if answer.error_code != common_pb2.NONE or answer.records or answer.HasField("records_location"):
        return None
    end = answer.high_watermark
    if read_committed and answer.HasField("last_stable_offset"):
        end = min(end, answer.last_stable_offset)
    return end if end > position else None


@dataclass
class ConsumeRound:
    """What one Fetch answer gives a ConsumeRecords stream (`take_fetched`)."""

    records: list[gateway_pb2.ConsumedRecord] = field(default_factory=list)
    # Partitions that failed for good: reported once, and no longer read.
    errors: list[gateway_pb2.ConsumePartitionError] = field(default_factory=list)
    # Partitions answered with no records below their HW: maybe a compacted log's hole (`hole_end`).
    empty_below_hw: list[int] = field(default_factory=list)


def take_fetched(
    topic: str,
    answers: Iterable[common_pb2.FetchPartitionResponse],
    positions: dict[int, int],
    ends: dict[int, int] | None,
    left: int,
    read_committed: bool = False,
) -> ConsumeRound:
    """ConsumeRecords' step over one Fetch answer of `topic`: the records to send and the
    partitions that failed for good; `positions` (partition -> next offset to read) move past
    what was taken and lose the failed partitions. With `ends` (stop_at_end), records at or past
    a partition's end are not taken; with `left` > 0, at most `left` records are (0 or less: no
    limit), the position then stopping after the last one taken. Routing errors (a leader
    moving) leave the partition to be read again."""
    taken = ConsumeRound()
    for pr in answers:
        position = positions[pr.partition]
        if pr.error_code in RETRIABLE_ROUTING_CODES:
            continue
        if hole_end(position, pr, read_committed) is not None:
            taken.empty_below_hw.append(pr.partition)
            continue
        if pr.error_code == common_pb2.NONE:
            data = pr.records
            if read_committed and pr.aborted_transactions:
                aborted = [(a.producer_id, a.first_offset) for a in pr.aborted_transactions]
                data = bytes(drop_aborted(pr.records, aborted))
            try:
                got = consumed_records(topic, pr.partition, data, position)
            except CorruptMessage as exc:
                pr = common_pb2.FetchPartitionResponse(
                    partition=pr.partition, error_code=exc.code, error_message=str(exc)
                )
            else:
                headers = list(iter_batch_headers(pr.records))
                if headers:
                    positions[pr.partition] = max(position, headers[-1].next_offset)
                if ends is not None:
                    got = records_before(got, ends[pr.partition])
                if 0 < left < len(taken.records) + len(got):
                    got = got[: left - len(taken.records)]
                    positions[pr.partition] = got[-1].offset + 1 if got else position
                taken.records.extend(got)
                continue
        taken.errors.append(
            gateway_pb2.ConsumePartitionError(
                partition=pr.partition,
                error_code=pr.error_code,
                error_message=pr.error_message,
                next_offset=position,
            )
        )
        del positions[pr.partition]
    return taken


def consume_records_problem(request: gateway_pb2.ConsumeRecordsRequest) -> str | None:
    """What makes a ConsumeRecords unanswerable as a whole (INVALID_ARGUMENT), or None."""
    if not request.topic:
        return "topic is empty; name the topic to read"
    if request.max_records < 0:
        return f"max_records must be >= 0 (0: no limit), got {request.max_records}"
    if not 0 <= request.max_records_per_message <= limits.CONSUME_RECORDS_PER_MESSAGE_MAX:
        return (
            f"max_records_per_message must be 0..{limits.CONSUME_RECORDS_PER_MESSAGE_MAX} (0: "
            f"{limits.CONSUME_RECORDS_PER_MESSAGE_DEFAULT}), got {request.max_records_per_message}"
        )
    if request.partition_max_bytes < 0:
        return f"partition_max_bytes must be >= 0 (0: 1 MiB), got {request.partition_max_bytes}"
    seen: set[int] = set()
    for p in request.partitions:
        if p.partition in seen:
            return f"partition {p.partition} is listed twice"
        seen.add(p.partition)
        if p.start_offset < -2:
            return f"partition {p.partition}: start_offset must be -2 (earliest), -1 (latest) or >= 0"
    if request.default_start_offset < -2:
        return "default_start_offset must be -2 (earliest), -1 (latest) or >= 0"
    if request.isolation_level not in (0, 1):
        level = request.isolation_level
        return f"isolation_level must be 0 (read_uncommitted) or 1 (read_committed), got {level}"
    return None


def consume_messages(
    records: Sequence[gateway_pb2.ConsumedRecord], records_max: int, bytes_max: int
) -> list[list[gateway_pb2.ConsumedRecord]]:
    """ConsumeRecords' records of one poll cut into stream messages of at most records_max records
    and about bytes_max bytes of keys, values and headers each (a larger record goes alone).

    One poll decodes up to a whole Fetch answer, more once decompressed: cut by count alone, a
    message of large records could pass the gRPC message bound and end the client's stream.
    """
    check(records_max > 0 and bytes_max > 0, "consume_messages(%s, %s)", records_max, bytes_max)
    messages: list[list[gateway_pb2.ConsumedRecord]] = []
    current: list[gateway_pb2.ConsumedRecord] = []
    size = 0
    for record in records:
        record_bytes = _record_bytes(record)
        if current and (len(current) >= records_max or size + record_bytes > bytes_max):
            messages.append(current)
            current, size = [], 0
        current.append(record)
        size += record_bytes
    if current:
        messages.append(current)
    return messages


def _record_bytes(record: gateway_pb2.ConsumedRecord) -> int:
    """A record's share of its stream message: its bytes fields, plus what the rest may take."""
    headers = sum(len(h.key) + len(h.value) + RECORD_OVERHEAD_BYTES_MAX for h in record.headers)
    return len(record.key) + len(record.value) + headers + len(record.topic) + RECORD_OVERHEAD_BYTES_MAX
