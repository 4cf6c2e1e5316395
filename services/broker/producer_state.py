"""Idempotent producer state of one partition: pure (Kafka's ProducerStateManager).

For each producer id the leader keeps its epoch and the sequence ranges and
offsets of its last few batches. A retried batch that was already written is
recognised by its sequence range and answered with the offset it got the first
time (DUPLICATE_SEQUENCE_NUMBER, reported to the client as success), so no
record is written twice (invariant 8). A gap in the sequence is
OUT_OF_ORDER_SEQUENCE_NUMBER; an older epoch is INVALID_PRODUCER_EPOCH (a
newer incarnation of the producer fenced it).

Followers keep the same state from the batches they replicate, so a new leader
needs no rebuild; after a restart or a truncation the state is rebuilt from the
log's batch headers.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

from clients.common.errors import InvalidProducerEpoch, OutOfOrderSequenceNumber
from clients.common.record_batch import BatchHeader
from services.common.limits import PRODUCER_BATCHES_KEPT, PRODUCER_IDS_PER_PARTITION_MAX

NO_PRODUCER_ID = -1
# Sequences wrap around after 2**31 - 1 as Kafka's.
SEQUENCE_MODULUS = 2**31


@dataclass(frozen=True, slots=True)
class BatchMetadata:
    first_sequence: int
    last_sequence: int
    first_offset: int
    last_offset: int


@dataclass(slots=True)
class ProducerEntry:
    producer_id: int
    producer_epoch: int
    batches: deque[BatchMetadata] = field(default_factory=lambda: deque(maxlen=PRODUCER_BATCHES_KEPT))

    @property
    def last_sequence(self) -> int:
        return self.batches[-1].last_sequence if self.batches else -1


@dataclass(frozen=True, slots=True)
class Duplicate:
    """The batch was written before: answer with its original offsets."""

    first_offset: int
    last_offset: int


def _last_sequence(header: BatchHeader) -> int:
    return (header.base_sequence + header.last_offset_delta) % SEQUENCE_MODULUS


class ProducerStateManager:
    def __init__(self, producer_ids_max: int = PRODUCER_IDS_PER_PARTITION_MAX) -> None:
        # In order of last write: the first one is the least recently written, forgotten first.
        self.producers: dict[int, ProducerEntry] = {}
        self.producer_ids_max = producer_ids_max

    def check(self, headers: Iterable[BatchHeader]) -> Duplicate | None:
        """Check a request's batches before they are written.

        Returns Duplicate when every batch was already written (the first one's
        original offsets), None when all are new and in order. Raises
        OutOfOrderSequenceNumber / InvalidProducerEpoch otherwise; nothing is written then.
        """
        duplicates: list[Duplicate] = []
        fresh = 0
        pending: dict[int, tuple[int, int]] = {}  # producer id -> (epoch, last sequence) within this request
        for h in headers:
            if h.producer_id == NO_PRODUCER_ID:
                fresh += 1
                continue
            entry = self.producers.get(h.producer_id)
            epoch, last = pending.get(
                h.producer_id,
                (entry.producer_epoch, entry.last_sequence) if entry else (h.producer_epoch, -1),
            )
            if h.producer_epoch < epoch:
                raise InvalidProducerEpoch(
                    f"producer {h.producer_id} epoch {h.producer_epoch} is older than {epoch}: "
                    "a newer instance of this producer is running"
                )
            dup = (
                self._find_duplicate(entry, h) if entry and h.producer_epoch == entry.producer_epoch else None
            )
            if dup is not None:
                duplicates.append(dup)
                continue
            if h.producer_epoch > epoch or entry is None:
                if entry is not None and h.base_sequence != 0:
                    raise OutOfOrderSequenceNumber(
                        f"producer {h.producer_id} started epoch {h.producer_epoch} at sequence "
                        f"{h.base_sequence}, expected 0"
                    )
            elif h.base_sequence != (last + 1) % SEQUENCE_MODULUS:
                raise OutOfOrderSequenceNumber(
                    f"producer {h.producer_id} sent sequence {h.base_sequence}, expected "
                    f"{(last + 1) % SEQUENCE_MODULUS}"
                )
            pending[h.producer_id] = (h.producer_epoch, _last_sequence(h))
            fresh += 1
        if duplicates and fresh:
            raise OutOfOrderSequenceNumber("a request mixed already-written and new batches of one producer")
        return duplicates[0] if duplicates else None

    @staticmethod
    def _find_duplicate(entry: ProducerEntry, h: BatchHeader) -> Duplicate | None:
        last = _last_sequence(h)
        for b in entry.batches:
            if b.first_sequence == h.base_sequence and b.last_sequence == last:
                return Duplicate(b.first_offset, b.last_offset)
        return None

    def update(self, headers: Iterable[BatchHeader]) -> None:
        """Record batches as written (offsets assigned): on the leader after append, on followers too."""
        for h in headers:
            if h.producer_id == NO_PRODUCER_ID:
                continue
            entry = self.producers.pop(h.producer_id, None)  # back in last: the latest written
            if entry is None or h.producer_epoch > entry.producer_epoch:
                entry = ProducerEntry(h.producer_id, h.producer_epoch)
            self.producers[h.producer_id] = entry
            if len(self.producers) > self.producer_ids_max:
                del self.producers[next(iter(self.producers))]
            entry.batches.append(
                BatchMetadata(h.base_sequence, _last_sequence(h), h.base_offset, h.last_offset)
            )

    def rebuild(self, headers: Iterable[BatchHeader]) -> None:
        """Start over from the log's batches (after a restart or a truncation)."""
        self.producers.clear()
        self.update(headers)
