"""Idempotent producer rules on the leader (services/broker/producer_state.py via Partition)."""

from __future__ import annotations

import pytest

from clients.common.errors import InvalidProducerEpoch, OutOfOrderSequenceNumber
from clients.common.records import Record, encode_batch
from services.broker.log import Log, LogConfig, MemoryStorage
from services.broker.partition import LeaderAndIsrState, Partition


def batch(producer_id: int, epoch: int, first_seq: int, n: int = 2) -> bytes:
    return encode_batch(
        [Record(None, f"s{first_seq + i}".encode(), [], 1_000) for i in range(n)],
        producer_id=producer_id,
        producer_epoch=epoch,
        base_sequence=first_seq,
    )


def leader() -> Partition:
    log = Log.open("/p/t-0", LogConfig(), storage=MemoryStorage(), now_ms=0)
    p = Partition("t", 0, 1, log)
    p.become_leader(LeaderAndIsrState(1, 0, (1,), (1,), 1, 1), now_ms=0)
    return p


def test_a_retried_batch_is_not_written_twice_and_gets_its_original_offset():
    p = leader()
    first = p.append_as_leader(batch(7, 0, 0), acks=1, now_ms=0)
    p.append_as_leader(batch(8, 0, 0), acks=1, now_ms=0)
    retry = p.append_as_leader(batch(7, 0, 0), acks=1, now_ms=0)
    assert retry.duplicate and (retry.first_offset, retry.next_offset) == (
        first.first_offset,
        first.next_offset,
    )
    assert p.log.log_end_offset == 4


def test_a_sequence_gap_is_out_of_order_and_writes_nothing():
    p = leader()
    p.append_as_leader(batch(7, 0, 0), acks=1, now_ms=0)
    with pytest.raises(OutOfOrderSequenceNumber, match="expected 2"):
        p.append_as_leader(batch(7, 0, 5), acks=1, now_ms=0)
    assert p.log.log_end_offset == 2
    p.append_as_leader(batch(7, 0, 2), acks=1, now_ms=0)
    assert p.log.log_end_offset == 4


def test_an_older_producer_epoch_is_fenced_and_a_new_epoch_starts_at_sequence_zero():
    p = leader()
    p.append_as_leader(batch(7, 1, 0), acks=1, now_ms=0)
    with pytest.raises(InvalidProducerEpoch):
        p.append_as_leader(batch(7, 0, 2), acks=1, now_ms=0)
    with pytest.raises(OutOfOrderSequenceNumber, match="expected 0"):
        p.append_as_leader(batch(7, 2, 4), acks=1, now_ms=0)
    p.append_as_leader(batch(7, 2, 0), acks=1, now_ms=0)


def test_producer_state_is_rebuilt_from_the_log_after_truncation_and_restart():
    p = leader()
    p.append_as_leader(batch(7, 0, 0), acks=1, now_ms=0)
    p.append_as_leader(batch(7, 0, 2), acks=1, now_ms=0)
    p.truncate_to(2)
    # The batch at sequence 2 is gone: sending it again is not a duplicate but the next in order.
    again = p.append_as_leader(batch(7, 0, 2), acks=1, now_ms=0)
    assert not again.duplicate and again.first_offset == 2
    fresh = Partition("t", 0, 1, p.log)
    fresh.rebuild_producer_state()
    assert fresh.producers.check([]) is None
    assert fresh.producers.producers[7].last_sequence == 3


def test_batches_without_a_producer_id_are_never_deduplicated():
    p = leader()
    plain = encode_batch([Record(None, b"x", [], 1)])
    p.append_as_leader(plain, acks=1, now_ms=0)
    assert not p.append_as_leader(plain, acks=1, now_ms=0).duplicate
    assert p.log.log_end_offset == 2
