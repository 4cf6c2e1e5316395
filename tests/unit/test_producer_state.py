"""Idempotent producer rules on the leader (services/broker/producer_state.py via Partition)."""

from __future__ import annotations

import dataclasses
import logging

import pytest

from clients.common.errors import InvalidProducerEpoch, OutOfOrderSequenceNumber
from clients.common.records import Record, encode_batch
from services.broker.log import Log, LogConfig, MemoryStorage
from services.broker.log.log import close_logs
from services.broker.partition import LeaderAndIsrState, Partition
from services.broker.producer_state import decode_snapshot, encode_snapshot


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


# ---- snapshots: the state outlives the log's retention (KIP-360) ------------------------------


def restarted(p: Partition, storage: MemoryStorage) -> Partition:
    """The same log reopened by a new process, and its producer state rebuilt as at start-up."""
    p.log.close()
    log = Log.open(p.log.directory, p.log.config, storage=storage, now_ms=0)
    fresh = Partition("t", 0, 1, log)
    fresh.rebuild_producer_state()
    fresh.become_leader(LeaderAndIsrState(1, 1, (1,), (1,), 2, 2), now_ms=0)
    return fresh


def small_segments_leader(storage: MemoryStorage) -> Partition:
    log = Log.open("/p/t-0", LogConfig(segment_bytes=200), storage=storage, now_ms=0)
    p = Partition("t", 0, 1, log)
    p.become_leader(LeaderAndIsrState(1, 0, (1,), (1,), 1, 1), now_ms=0)
    return p


def test_a_retry_after_retention_deleted_the_producers_only_batch_and_a_restart_is_still_a_duplicate():
    # Simulation seed 1422: the retry was written twice.
    storage = MemoryStorage()
    p = small_segments_leader(storage)
    first = p.append_as_leader(batch(7, 0, 0), acks=1, now_ms=0)
    p.log.roll(0)
    p.append_as_leader(batch(8, 0, 0), acks=1, now_ms=0)
    p.high_watermark = p.log.log_end_offset
    p.log.advance_log_start_offset(first.next_offset)  # DeleteRecords (or retention) took producer 7's batch
    assert p.log.log_start_offset == 2
    p = restarted(p, storage)
    retry = p.append_as_leader(batch(7, 0, 0), acks=1, now_ms=0)
    assert retry.duplicate and retry.first_offset == first.first_offset
    assert p.log.log_end_offset == 4
    p.append_as_leader(batch(7, 0, 2), acks=1, now_ms=0)  # and the producer goes on in order


def test_retention_by_size_snapshots_before_deleting_segments():
    storage = MemoryStorage()
    p = small_segments_leader(storage)
    p.append_as_leader(batch(7, 0, 0), acks=1, now_ms=0)
    p.log.roll(0)
    p.append_as_leader(batch(8, 0, 0), acks=1, now_ms=0)
    p.log.roll(0)
    p.high_watermark = p.log.log_end_offset
    p.log.set_config(dataclasses.replace(p.log.config, retention_bytes=1))
    assert p.log.delete_old_segments(0, p.high_watermark) == 1  # producer 7's segment
    p = restarted(p, storage)
    assert sorted(p.producers.producers) == [7, 8]
    with pytest.raises(OutOfOrderSequenceNumber, match="expected 2"):
        p.append_as_leader(batch(7, 0, 5), acks=1, now_ms=0)


def test_a_snapshot_above_a_truncation_keeps_only_what_is_left_and_batches_written_later_replay():
    storage = MemoryStorage()
    p = small_segments_leader(storage)
    p.append_as_leader(batch(7, 0, 0), acks=1, now_ms=0)
    p.log.roll(0)
    p.append_as_leader(batch(9, 0, 0), acks=1, now_ms=0)
    p.append_as_leader(batch(7, 0, 2), acks=1, now_ms=0)  # offsets 4, 5
    p.high_watermark = 2
    p.log.advance_log_start_offset(2)  # snapshot at log end 6: producer 7 up to sequence 3
    p.become_follower(LeaderAndIsrState(2, 1, (1, 2), (1, 2), 2, 2))
    p.truncate_to(4)  # the new leader never had producer 7's second batch
    assert p.producers.producers[7].last_sequence == 1
    p.become_leader(LeaderAndIsrState(1, 2, (1,), (1, 2), 3, 3), now_ms=0)
    again = p.append_as_leader(batch(7, 0, 2, n=3), acks=1, now_ms=0)  # other records at 2..4
    assert not again.duplicate and again.first_offset == 4
    p = restarted(p, storage)
    assert p.producers.producers[7].last_sequence == 4
    # The truncated batch (sequences 2-3) is not remembered: its retry is out of order, not a duplicate.
    with pytest.raises(OutOfOrderSequenceNumber):
        p.append_as_leader(batch(7, 0, 2), acks=1, now_ms=0)


def test_a_snapshot_below_the_log_start_is_stale_and_not_used():
    storage = MemoryStorage()
    p = small_segments_leader(storage)
    p.append_as_leader(batch(7, 0, 0), acks=1, now_ms=0)
    p.log.roll(0)
    p.append_as_leader(batch(8, 0, 0), acks=1, now_ms=0)
    p.high_watermark = p.log.log_end_offset
    p.log.advance_log_start_offset(2)  # snapshot at 4: producer 7 at sequence 1
    # A follower far behind its leader restarts its log past everything it had; producer 7 went on
    # elsewhere meanwhile, so the old snapshot would refuse its next batch as out of order.
    p.become_follower(LeaderAndIsrState(2, 1, (1, 2), (1, 2), 2, 2))
    p.log.truncate_fully_and_start_at(50)
    p.rebuild_producer_state()
    assert p.producers.producers == {}
    p.become_leader(LeaderAndIsrState(1, 2, (1,), (1, 2), 3, 3), now_ms=0)
    assert not p.append_as_leader(batch(7, 0, 30), acks=1, now_ms=0).duplicate


@pytest.mark.parametrize(
    "snapshot", [b'{"version": 99, "offset": 0, "producers": []}', b"\x00garbage"], ids=["newer", "garbage"]
)
def test_an_unreadable_or_newer_snapshot_falls_back_to_the_log(
    snapshot: bytes, caplog: pytest.LogCaptureFixture
):
    storage = MemoryStorage()
    p = small_segments_leader(storage)
    p.append_as_leader(batch(7, 0, 0), acks=1, now_ms=0)
    p.log.close()
    storage.write_atomic("/p/t-0/producer-state-snapshot", snapshot)
    fresh = Partition("t", 0, 1, Log.open("/p/t-0", p.log.config, storage=storage, now_ms=0))
    with caplog.at_level(logging.WARNING, logger="highwater.partition"):
        fresh.rebuild_producer_state()
    assert fresh.producers.producers[7].last_sequence == 1
    assert ("rebuilding it from the log alone" in caplog.text) == (b"garbage" in snapshot)


def test_the_snapshot_round_trips_in_eviction_order():
    p = leader()
    for pid in (9, 3, 5):
        p.append_as_leader(batch(pid, 2, 0), acks=1, now_ms=0)
    p.append_as_leader(batch(9, 2, 2), acks=1, now_ms=0)
    snapshot = decode_snapshot(encode_snapshot(p.producers, p.log.log_end_offset))
    assert snapshot is not None and snapshot.offset == 8
    assert [e.producer_id for e in snapshot.producers] == [3, 5, 9]
    assert [list(e.batches) for e in snapshot.producers] == [
        list(e.batches) for e in p.producers.producers.values()
    ]


@pytest.mark.parametrize("batched", [False, True], ids=["close", "close_logs"])
def test_a_clean_close_snapshots_at_the_log_end_so_a_restart_replays_no_batch(batched: bool):
    storage = MemoryStorage()
    p = small_segments_leader(storage)
    p.append_as_leader(batch(7, 0, 0), acks=1, now_ms=0)
    p.append_as_leader(batch(7, 0, 2), acks=1, now_ms=0)
    if batched:
        assert close_logs([p.log], storage=storage, sync_root="/p") == []
    else:
        p.log.close()
    log = Log.open("/p/t-0", p.log.config, storage=storage, now_ms=0)
    data = log.read_producer_snapshot()
    snapshot = decode_snapshot(data) if data is not None else None
    assert snapshot is not None and snapshot.offset == log.log_end_offset == 4
    fresh = Partition("t", 0, 1, log)
    fresh.rebuild_producer_state()
    assert fresh.producers.producers[7].last_sequence == 3


def test_a_log_no_producer_wrote_to_gets_no_snapshot():
    storage = MemoryStorage()
    p = small_segments_leader(storage)
    p.append_as_leader(encode_batch([Record(None, b"x", [], 1)]), acks=1, now_ms=0)
    p.high_watermark = 1
    p.log.advance_log_start_offset(1)
    p.log.close()
    assert p.log.read_producer_snapshot() is None
