"""Pure planning: offset ranges, their split into Spark tasks, and admission control.

No Spark, no gRPC, no clock: offsets in, offsets out, so every rule here is unit
tested on its own. Ranges are half-open, [start, end), as everywhere in Highwater.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from clients.common.types import TopicPartitionKey


@dataclass(frozen=True, slots=True)
class OffsetRange:
    """Records [start, end) of one partition: what one Spark task reads."""

    topic: str
    partition: int
    start: int
    end: int

    @property
    def size(self) -> int:
        """Offsets in the range: its records at most (a compacted log has holes), so planning
        by size splits and admits offsets, as Spark's Kafka source does, not a row count."""
        return max(self.end - self.start, 0)


def split_ranges(
    ranges: list[OffsetRange], min_partitions: int | None, max_records: int | None = None
) -> list[OffsetRange]:
    """Split ranges into Spark tasks as Spark's KafkaOffsetRangeCalculator does.

    `max_records` (maxRecordsPerPartition): first cut every range into the fewest
    near-equal pieces of at most that many records. `min_partitions`: then, if there are
    fewer pieces than that, each non-empty piece gets max(1, round(size / total *
    min_partitions)) near-equal pieces, so a large partition spreads over several tasks
    while small ones stay whole. With neither, ranges are returned as they are (one task
    per topic-partition). Empty ranges are dropped.
    """
    non_empty = [r for r in ranges if r.size > 0]
    if max_records:
        non_empty = [piece for r in non_empty for piece in _cut(r, math.ceil(r.size / max_records))]
    if not min_partitions or len(non_empty) >= min_partitions:
        return non_empty
    total = sum(r.size for r in non_empty)
    out: list[OffsetRange] = []
    for r in non_empty:
        out.extend(_cut(r, min(max(round(r.size / total * min_partitions), 1), r.size)))
    return out


def _cut(r: OffsetRange, pieces: int) -> list[OffsetRange]:
    """`r` in `pieces` contiguous ranges whose sizes differ by at most one."""
    step, extra = divmod(r.size, pieces)
    out: list[OffsetRange] = []
    start = r.start
    for i in range(pieces):
        end = start + step + (1 if i < extra else 0)
        out.append(OffsetRange(r.topic, r.partition, start, end))
        start = end
    return out


def allocate(sizes: Mapping[TopicPartitionKey, int], limit: int) -> dict[TopicPartitionKey, int]:
    """Share `limit` units over partitions in proportion to what each has (largest remainder).

    Returns the units each partition gets: never more than it has, summing to exactly
    min(limit, total). Spark's Kafka source rounds each share on its own and can
    overshoot by up to one per partition; exact sums make batch sizes predictable.
    """
    total = sum(max(s, 0) for s in sizes.values())
    if total <= limit:
        return {tp: max(s, 0) for tp, s in sizes.items()}
    shares = {tp: max(s, 0) * limit / total for tp, s in sizes.items()}
    out = {tp: min(math.floor(share), sizes[tp]) for tp, share in shares.items()}
    left = limit - sum(out.values())
    # Largest fractional parts first; ties broken by topic-partition so planning is deterministic.
    for tp in sorted(shares, key=lambda k: (out[k] - shares[k], k)):
        if left <= 0:
            break
        if out[tp] < sizes[tp]:
            out[tp] += 1
            left -= 1
    return out


def limit_by_rows(
    start: Mapping[TopicPartitionKey, int], latest: Mapping[TopicPartitionKey, int], max_rows: int
) -> dict[TopicPartitionKey, int]:
    """End offsets of a micro-batch reading at most `max_rows` records (maxOffsetsPerTrigger)."""
    available = {tp: max(latest[tp] - start.get(tp, latest[tp]), 0) for tp in latest}
    granted = allocate(available, max_rows)
    return {tp: start.get(tp, latest[tp]) + granted[tp] for tp in latest}


def limit_by_bytes(
    start: Mapping[TopicPartitionKey, int],
    latest: Mapping[TopicPartitionKey, int],
    bytes_per_record: Mapping[TopicPartitionKey, float],
    max_bytes: int,
) -> dict[TopicPartitionKey, int]:
    """End offsets of a micro-batch reading about `max_bytes` (maxBytesPerTrigger, a soft limit).

    Bytes per record come from a sample of each partition; a partition without a
    sample counts 1 byte per record. At least one record is admitted when any is
    available, so a limit below one record's size never stalls the stream.
    """
    available = {tp: max(latest[tp] - start.get(tp, latest[tp]), 0) for tp in latest}
    cost = {tp: max(bytes_per_record.get(tp, 1.0), 1.0) for tp in latest}
    granted_bytes = allocate({tp: math.ceil(n * cost[tp]) for tp, n in available.items()}, max_bytes)
    granted = {tp: min(available[tp], int(granted_bytes[tp] // cost[tp])) for tp in latest}
    if not any(granted.values()):
        first = next((tp for tp in sorted(available) if available[tp] > 0), None)
        if first is not None:
            granted[first] = 1
    return {tp: start.get(tp, latest[tp]) + granted[tp] for tp in latest}


def cap(
    offsets: Mapping[TopicPartitionKey, int], ceiling: Mapping[TopicPartitionKey, int]
) -> dict[TopicPartitionKey, int]:
    """Offsets no higher than `ceiling` where it has the partition (Trigger.AvailableNow's target)."""
    return {tp: min(o, ceiling[tp]) if tp in ceiling else o for tp, o in offsets.items()}
