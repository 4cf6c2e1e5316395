"""Producer id, epoch and per-partition sequence numbers of the idempotent producer.

DESIGN.md section 6: the leader keeps the last sequences of each producer and
drops a batch it has already appended. For that the producer numbers its
records per partition (the batch header carries producer id, epoch and the
first record's sequence) and sends a retried batch with the numbers it had the
first time. Kafka's TransactionManager does this bookkeeping; so does this class.

When a batch that took sequence numbers is lost for good (delivery timeout, a
non-retriable error), the leader would refuse every later batch of that
partition as out of order. Kafka's answer, taken here: bump the producer epoch
(InitProducerId with the current id and epoch) and start every partition's
sequence at 0 again; batches not yet acknowledged are renumbered.

Pure: no I/O. Owned by the producer's sender task.
"""

from __future__ import annotations

from clients.accumulator import ProducerBatch
from clients.types import TopicPartition

# Sequence numbers are int32 and wrap to 0 after 2**31 - 1 (Kafka's incrementSequence).
SEQUENCE_MODULUS = 2**31


def next_sequence(sequence: int, increment: int) -> int:
    return (sequence + increment) % SEQUENCE_MODULUS


class IdempotenceState:
    """The producer's identity and the next sequence number of each partition."""

    def __init__(self) -> None:
        self.producer_id = -1
        self.producer_epoch = -1
        self.needs_new_epoch = False
        self._next_sequence: dict[TopicPartition, int] = {}
        # The sequence the leader expects next per partition (the end of the last acknowledged
        # batch): with several batches in flight, an OUT_OF_ORDER answer to a batch that does
        # not start there means an earlier one is still on its way (retry), not a gap.
        self._acked_end: dict[TopicPartition, int] = {}

    @property
    def has_producer_id(self) -> bool:
        return self.producer_id >= 0 and not self.needs_new_epoch

    def set_producer(self, producer_id: int, producer_epoch: int) -> None:
        """A new identity from InitProducerId: every partition starts again at sequence 0."""
        self.producer_id = producer_id
        self.producer_epoch = producer_epoch
        self.needs_new_epoch = False
        self._next_sequence.clear()
        self._acked_end.clear()

    def assign(self, batch: ProducerBatch) -> bool:
        """Give `batch` its sequence numbers unless it already has them under the current identity.

        Returns True when the batch was (re)numbered and must be (re)encoded.
        """
        if (
            batch.base_sequence >= 0
            and batch.producer_id == self.producer_id
            and batch.producer_epoch == self.producer_epoch
        ):
            return False
        base = self._next_sequence.get(batch.tp, 0)
        self._next_sequence[batch.tp] = next_sequence(base, batch.record_count)
        batch.producer_id = self.producer_id
        batch.producer_epoch = self.producer_epoch
        batch.base_sequence = base
        return True

    def on_batch_lost(self, batch: ProducerBatch) -> None:
        """A numbered batch failed for good: later numbers of its partition would leave a gap."""
        if (
            batch.base_sequence >= 0
            and batch.producer_id == self.producer_id
            and batch.producer_epoch == self.producer_epoch
        ):
            self.needs_new_epoch = True

    def _current(self, batch: ProducerBatch) -> bool:
        return (
            batch.base_sequence >= 0
            and batch.producer_id == self.producer_id
            and batch.producer_epoch == self.producer_epoch
        )

    def on_batch_acked(self, batch: ProducerBatch) -> None:
        """The leader has `batch` (written, or a duplicate of what it had): it expects what follows."""
        if self._current(batch):
            self._acked_end[batch.tp] = next_sequence(batch.base_sequence, batch.record_count)

    def leader_knows(self, tp: TopicPartition) -> bool:
        """Whether tp's leader has acknowledged a batch of this producer id and epoch. Until it
        has, it knows no sequence to expect (it takes a new producer's first batch at any
        sequence), so only one batch of tp may be in flight: a second could be written first."""
        return tp in self._acked_end

    def _behind(self, batch: ProducerBatch) -> bool:
        """Whether `batch` does not start where the last acknowledged batch of its partition ended."""
        return self._current(batch) and batch.base_sequence != self._acked_end.get(batch.tp, 0)

    def note_sent(self, batch: ProducerBatch) -> None:
        """`batch` leaves now: remember whether an earlier batch of its partition is still
        unacknowledged, for waits_for_earlier."""
        batch.sent_behind = self._behind(batch)

    def waits_for_earlier(self, batch: ProducerBatch) -> bool:
        """Whether an OUT_OF_ORDER answer to `batch` means it reached the leader before an
        earlier batch of its partition (so it is sent again after that one), rather than a gap
        nothing will fill. Kafka's producer asks only whether the batch is next now, which is
        enough on its one connection per broker, where requests are handled in the order
        sent; ours go on several streams, so the earlier batch can be handled after this one
        and acknowledged before this one's refusal comes back: a batch sent behind another is
        one that may have overtaken it."""
        return self._current(batch) and (batch.sent_behind or self._behind(batch))

    def next_sequence_for(self, tp: TopicPartition) -> int:
        return self._next_sequence.get(tp, 0)
