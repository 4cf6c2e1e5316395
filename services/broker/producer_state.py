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

The log's batches alone are not enough: retention or DeleteRecords may delete a
producer's last batches while the producer still retries one of them, and a
replica that rebuilt its state from what is left would then take the retry as new
and write it twice. So, as Kafka's producer snapshots (and KIP-360: producer state
outlives the log's retention), the state is written to a snapshot before the log
start moves (encode_snapshot), and a rebuild starts from the snapshot and replays
only the batches after it (ProducerStateManager.restore).
"""

from __future__ import annotations

import json
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from clients.common.control_records import ControlType
from clients.common.errors import InvalidProducerEpoch, OutOfOrderSequenceNumber, check
from clients.common.record_batch import BatchHeader
from services.common.limits import PRODUCER_BATCHES_KEPT, PRODUCER_IDS_PER_PARTITION_MAX

NO_PRODUCER_ID = -1
NO_OFFSET = -1
# Sequences wrap around after 2**31 - 1 as Kafka's.
SEQUENCE_MODULUS = 2**31
# The snapshot's format (encode_snapshot). A snapshot of another version is not read: the
# state is rebuilt from the log alone, as before snapshots existed (docs/UPGRADING.md).
PRODUCER_SNAPSHOT_VERSION = 1
NO_MARKERS: Mapping[int, ControlType] = {}


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
    # The offset of the first batch of the producer's open transaction; -1 when none is open.
    current_txn_first_offset: int = NO_OFFSET

    @property
    def last_sequence(self) -> int:
        return self.batches[-1].last_sequence if self.batches else -1


@dataclass(frozen=True, slots=True)
class CompletedTransaction:
    """A transaction a marker ended: its offsets [first_offset, last_offset], the marker last.

    An aborted one goes to the aborted-transaction index, which tells a read_committed
    consumer which of the producer's batches in that range to drop."""

    producer_id: int
    first_offset: int
    last_offset: int
    aborted: bool


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
        # Transactions a marker ended while the marker may still be above the high watermark:
        # (first offset, marker offset) in log order, so markers ascend (Kafka's unreplicatedTxns).
        # Until the HW passes its marker a transaction still holds the LSO back: a marker not yet
        # replicated can be truncated away by a leader change, and the transaction then end the
        # other way. (A zombie leader wrote ABORT above its HW and served read_committed readers
        # its aborted list; the new leader wrote COMMIT: simulation seed 60184, transactions.)
        self.unreplicated: deque[tuple[int, int]] = deque()

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

    def update(
        self, headers: Iterable[BatchHeader], markers: Mapping[int, ControlType] = NO_MARKERS
    ) -> list[CompletedTransaction]:
        """Record batches as written (offsets assigned): on the leader after append, on followers
        too. `markers` has each control batch's type by base offset (control_types). Returns the
        transactions the markers among them ended, in offset order."""
        completed: list[CompletedTransaction] = []
        for h in headers:
            if h.producer_id == NO_PRODUCER_ID:
                continue
            entry = self.producers.pop(h.producer_id, None)  # back in last: the latest written
            if entry is None or h.producer_epoch > entry.producer_epoch:
                # A newer epoch keeps the open transaction: the coordinator that bumped the
                # epoch (fencing a zombie) ends it with a marker of the new epoch.
                open_txn = entry.current_txn_first_offset if entry is not None else NO_OFFSET
                entry = ProducerEntry(h.producer_id, h.producer_epoch, current_txn_first_offset=open_txn)
            self.producers[h.producer_id] = entry
            if len(self.producers) > self.producer_ids_max:
                self._evict_one(keep=h.producer_id)
            if h.is_control:
                check(
                    h.base_offset in markers,
                    "control batch at offset %d of producer %d was given without its type",
                    h.base_offset,
                    h.producer_id,
                )
                first = entry.current_txn_first_offset
                completed.append(
                    CompletedTransaction(
                        h.producer_id,
                        first if first != NO_OFFSET else h.base_offset,
                        h.last_offset,
                        aborted=markers[h.base_offset] is ControlType.ABORT,
                    )
                )
                self.unreplicated.append((completed[-1].first_offset, h.last_offset))
                entry.current_txn_first_offset = NO_OFFSET
                continue  # a marker has no sequence
            if h.is_transactional and entry.current_txn_first_offset == NO_OFFSET:
                entry.current_txn_first_offset = h.base_offset
            if entry.batches and h.last_offset <= entry.batches[-1].last_offset:
                continue  # known from a snapshot already: a replay after a truncation meets it again
            entry.batches.append(
                BatchMetadata(h.base_sequence, _last_sequence(h), h.base_offset, h.last_offset)
            )
        return completed

    def _evict_one(self, keep: int = NO_PRODUCER_ID) -> bool:
        """Forget the least recently written producer without an open transaction (one with
        an open transaction holds the last stable offset back until its marker: forgetting it
        would let read_committed consumers read its uncommitted records). False when every
        producer has one: the bound is then exceeded until markers come."""
        for producer_id, entry in self.producers.items():
            if entry.current_txn_first_offset == NO_OFFSET and producer_id != keep:
                del self.producers[producer_id]
                return True
        return False

    @property
    def open_transactions(self) -> int:
        return self.open_transactions_and_first_offset()[0]

    def open_transactions_and_first_offset(self) -> tuple[int, int | None]:
        """How many transactions are open here, and the first offset of the oldest (None: none),
        in one walk of the producers (the broker's gauges ask both of every partition it leads)."""
        count = 0
        first: int | None = None
        for e in self.producers.values():
            offset = e.current_txn_first_offset
            if offset != NO_OFFSET:
                count += 1
                if offset >= 0 and (first is None or offset < first):
                    first = offset
        return count, first

    def last_stable_offset(self, high_watermark: int) -> int:
        """Where a read_committed consumer stops (Kafka's LSO): the first offset of the oldest
        transaction that is open or whose marker is not below the high watermark yet, or the
        high watermark when that is lower."""
        first_unstable = self.first_unstable_offset()
        for first, marker in self.unreplicated:
            if marker >= high_watermark and (first_unstable is None or first < first_unstable):
                first_unstable = first
        return high_watermark if first_unstable is None else min(first_unstable, high_watermark)

    def high_watermark_moved(self, high_watermark: int) -> None:
        """Forget the ended transactions whose marker the HW passed: replicated to the ISR, such
        a marker is never truncated. Called at every HW rise, leader or follower, so the list
        holds only markers between the HW and the log end. (The HW falls only with a
        truncation, which rebuilds this state.)"""
        unreplicated = self.unreplicated
        while unreplicated and unreplicated[0][1] < high_watermark:
            unreplicated.popleft()

    def first_unstable_offset(self) -> int | None:
        """The first offset of the oldest open transaction (None: none is open). Transactions
        ended by a marker above the HW also hold the LSO back (last_stable_offset); the
        aborted-transaction index's LSO entries, as Kafka's, count only the open ones."""
        return min(
            (e.current_txn_first_offset for e in self.producers.values() if e.current_txn_first_offset >= 0),
            default=None,
        )

    def rebuild(self, headers: Iterable[BatchHeader]) -> None:
        """Start over from the log's batches (after a restart or a truncation)."""
        self.producers.clear()
        self.unreplicated.clear()
        self.update(headers)

    def restore(
        self, snapshot: ProducerSnapshot, below_offset: int, *, with_transactions: bool = True
    ) -> None:
        """Start over from a snapshot, keeping only batches that end below `below_offset` (the
        log end now, when the log was truncated below the snapshot's offset); a producer with
        no batch left is dropped. The caller then replays the log's batches from there (update).

        Without `with_transactions` no transaction is open: after a truncation below the
        snapshot a transaction it saw ended may be open again (its marker was cut), which only
        a replay of the log tells: the replay then also finds every marker again."""
        self.producers.clear()
        self.unreplicated = deque(
            (first, marker)
            for first, marker in snapshot.unreplicated
            if with_transactions and marker < below_offset
        )
        for e in snapshot.producers:
            kept = [b for b in e.batches if b.last_offset < below_offset]
            open_txn = e.current_txn_first_offset if e.current_txn_first_offset < below_offset else NO_OFFSET
            if not with_transactions:
                open_txn = NO_OFFSET
            if kept or open_txn != NO_OFFSET:
                entry = ProducerEntry(e.producer_id, e.producer_epoch, current_txn_first_offset=open_txn)
                entry.batches.extend(kept)
                self.producers[e.producer_id] = entry
        while len(self.producers) > self.producer_ids_max and self._evict_one():
            pass


class UnreadableSnapshot(ValueError):
    """A snapshot file that is not one (written atomically, so a crash cannot tear it: the disk did)."""


@dataclass(frozen=True, slots=True)
class ProducerSnapshot:
    """The producer state as it was at `offset` (the log end then): every batch below it."""

    offset: int
    producers: tuple[ProducerEntry, ...]
    # Transactions ended by a marker that was above the HW when the snapshot was taken
    # (ProducerStateManager.unreplicated): the replay after the snapshot does not meet their
    # markers again. Snapshots of earlier releases have none: read as empty.
    unreplicated: tuple[tuple[int, int], ...] = ()


def encode_snapshot(state: ProducerStateManager, offset: int) -> bytes:
    """The state at log end `offset`, least recently written producer first (eviction order)."""
    producers = [
        [
            e.producer_id,
            e.producer_epoch,
            [[b.first_sequence, b.last_sequence, b.first_offset, b.last_offset] for b in e.batches],
            e.current_txn_first_offset,
        ]
        for e in state.producers.values()
    ]
    body = {
        "version": PRODUCER_SNAPSHOT_VERSION,
        "offset": offset,
        "producers": producers,
        "unreplicated": [[first, marker] for first, marker in state.unreplicated],
    }
    return json.dumps(body, separators=(",", ":")).encode()


def decode_snapshot(data: bytes) -> ProducerSnapshot | None:
    """The snapshot in `data`; None for another version. Raises UnreadableSnapshot."""
    try:
        body = json.loads(data)
        if body.get("version") != PRODUCER_SNAPSHOT_VERSION:
            return None
        entries = []
        for producer_id, epoch, batches, txn_first_offset in body["producers"]:
            entry = ProducerEntry(
                int(producer_id), int(epoch), current_txn_first_offset=int(txn_first_offset)
            )
            entry.batches.extend(BatchMetadata(*(int(v) for v in b)) for b in batches)
            entries.append(entry)
        unreplicated = tuple((int(first), int(marker)) for first, marker in body.get("unreplicated", ()))
        return ProducerSnapshot(int(body["offset"]), tuple(entries), unreplicated)
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise UnreadableSnapshot(f"producer state snapshot is unreadable: {exc}") from exc
