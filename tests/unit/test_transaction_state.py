"""A partition's open transactions and last stable offset (services/broker/producer_state.py via
Partition), and the markers that end them (clients/common/control_records.py)."""

from __future__ import annotations

import json
import struct

import pytest
from aiokafka.record.default_records import DefaultRecordBatchBuilder

from clients.common.control_records import (
    ControlType,
    control_type,
    control_types,
    drop_aborted,
    encode_marker,
)
from clients.common.errors import CorruptMessage, InvariantViolation
from clients.common.fetch_request import consumer_fetch_request, last_stable_offset
from clients.common.record_batch import CRC_POS, batch_crc, iter_batch_headers
from clients.common.records import Record, decode_batches, encode_batch
from clients.config import ConsumerConfig
from clients.errors import InvalidArgument
from protos.highwater.v1 import common_pb2
from services.broker.log import Log, LogConfig, MemoryStorage
from services.broker.log.txn_index import AbortedTxn, AbortedTxnIndex, UnreadableTxnIndex
from services.broker.partition import LeaderAndIsrState, Partition
from services.broker.producer_state import (
    CompletedTransaction,
    ProducerStateManager,
    decode_snapshot,
    encode_snapshot,
)


def txn_batch(producer_id: int, epoch: int, first_seq: int, base_offset: int, n: int = 2) -> bytes:
    builder = DefaultRecordBatchBuilder(2, 0, 1, producer_id, epoch, first_seq, 1 << 20)
    for i in range(n):
        builder.append(i, 1_000, None, f"v{first_seq + i}".encode(), [])
    buf = builder.build()
    buf[0:8] = base_offset.to_bytes(8, "big")
    return bytes(buf)


def plain_batch(base_offset: int) -> bytes:
    buf = bytearray(encode_batch([Record(None, b"plain", [], 1_000)]))
    buf[0:8] = base_offset.to_bytes(8, "big")
    return bytes(buf)


def marker(control: ControlType, producer_id: int, epoch: int, base_offset: int) -> bytes:
    return encode_marker(
        control,
        producer_id=producer_id,
        producer_epoch=epoch,
        coordinator_epoch=3,
        timestamp_ms=2_000,
        base_offset=base_offset,
    )


def follower(storage: MemoryStorage | None = None) -> Partition:
    log = Log.open("/p/t-0", LogConfig(), storage=storage or MemoryStorage(), now_ms=0)
    p = Partition("t", 0, 2, log)
    p.become_follower(LeaderAndIsrState(1, 0, (1, 2), (1, 2), 1, 1))
    return p


def test_a_marker_round_trips_and_is_skipped_by_consumers():
    m = marker(ControlType.COMMIT, 7, 4, base_offset=10)
    (header,) = iter_batch_headers(m)
    assert header.is_control and header.is_transactional and header.base_offset == 10
    assert (header.producer_id, header.producer_epoch, header.base_sequence) == (7, 4, -1)
    assert control_type(m, header) is ControlType.COMMIT
    assert control_types(m, [header]) == {10: ControlType.COMMIT}
    assert list(decode_batches(m)) == []  # the batch's CRC is right and it holds no data record
    assert control_type(marker(ControlType.ABORT, 7, 4, 0), header) is ControlType.ABORT


def test_an_unknown_control_record_is_refused_and_a_follower_writes_nothing():
    m = bytearray(marker(ControlType.COMMIT, 7, 4, base_offset=0))
    (header,) = iter_batch_headers(m)
    key_type_position = len(m) - 10  # after it: value length (1 byte), value (6), header count (1)
    assert m[key_type_position : key_type_position + 2] == b"\x00\x01"
    m[key_type_position + 1] = 9
    struct.pack_into(">I", m, CRC_POS, batch_crc(m, 0, len(m)))  # a well-formed batch otherwise
    with pytest.raises(CorruptMessage, match="unknown control record"):
        control_type(m, header)
    p = follower()
    with pytest.raises(CorruptMessage, match="unknown control record"):
        p.append_as_follower(bytes(m), now_ms=0)
    assert p.log.log_end_offset == 0


def test_the_last_stable_offset_stops_at_the_oldest_open_transaction_until_its_marker_is_replicated():
    p = follower()
    p.append_as_follower(txn_batch(7, 0, 0, base_offset=0), now_ms=0)  # 0-1, producer 7 opens
    p.append_as_follower(txn_batch(8, 0, 0, base_offset=2), now_ms=0)  # 2-3, producer 8 opens
    p.append_as_follower(txn_batch(7, 0, 2, base_offset=4), now_ms=0)  # 4-5
    p.update_follower_high_watermark(6)
    assert p.last_stable_offset == 0
    p.append_as_follower(marker(ControlType.COMMIT, 7, 0, base_offset=6), now_ms=0)
    assert p.last_stable_offset == 0  # the marker is above the HW: a new leader may not have it
    p.update_follower_high_watermark(7)
    assert p.last_stable_offset == 2  # producer 8's transaction is still open
    p.append_as_follower(marker(ControlType.ABORT, 8, 0, base_offset=7), now_ms=0)
    assert p.producers.first_unstable_offset() is None  # no transaction is open...
    assert p.last_stable_offset == 2  # ...but the ABORT at 7 is not below the HW 7 yet
    p.update_follower_high_watermark(8)
    assert p.last_stable_offset == p.high_watermark == 8
    assert not p.producers.unreplicated  # forgotten once the HW passed them


def test_the_last_stable_offset_never_passes_the_high_watermark():
    p = follower()
    p.append_as_follower(txn_batch(7, 0, 0, base_offset=0), now_ms=0)
    p.append_as_follower(marker(ControlType.COMMIT, 7, 0, base_offset=2), now_ms=0)
    p.append_as_follower(plain_batch(3), now_ms=0)
    p.update_follower_high_watermark(1)
    assert p.last_stable_offset == 0
    p.update_follower_high_watermark(3)
    assert p.last_stable_offset == 3
    p.update_follower_high_watermark(4)
    assert p.last_stable_offset == 4


def test_a_marker_a_truncation_cuts_never_counted_and_the_transaction_ends_as_the_new_leader_says():
    # Simulation seed 60184 (transactions): a leader cut off from its followers wrote an ABORT above
    # its HW; a read_committed reader took the aborted list from it and dropped records the new
    # leader then committed. While the marker is above the HW the transaction still holds the LSO.
    p = follower()
    p.append_as_follower(txn_batch(7, 0, 0, base_offset=0), now_ms=0)  # 0-1
    p.update_follower_high_watermark(2)
    p.append_as_follower(marker(ControlType.ABORT, 7, 0, base_offset=2), now_ms=0)
    assert p.last_stable_offset == 0
    assert p.log.aborted_txns(0, 3) == [AbortedTxn(7, 0, 2, 3)]  # read_committed reads nothing of it yet
    p.become_follower(LeaderAndIsrState(3, 1, (3, 2), (3, 2), 2, 2))
    p.truncate_to(2)  # the new leader never had the ABORT
    assert p.producers.first_unstable_offset() == 0 and p.last_stable_offset == 0
    assert p.log.aborted_txns(0, 3) == []
    p.append_as_follower(marker(ControlType.COMMIT, 7, 0, base_offset=2), now_ms=0)
    p.update_follower_high_watermark(3)
    assert p.last_stable_offset == 3 and p.log.aborted_txns(0, 3) == []


def test_a_marker_above_the_high_watermark_still_holds_the_lso_after_a_restart_from_the_snapshot():
    storage = MemoryStorage()
    p = follower(storage)
    p.append_as_follower(txn_batch(7, 0, 0, base_offset=0), now_ms=0)  # 0-1
    p.update_follower_high_watermark(2)
    p.append_as_follower(marker(ControlType.COMMIT, 7, 0, base_offset=2), now_ms=0)
    p.append_as_follower(plain_batch(3), now_ms=0)
    p.log.close()  # the clean close writes a snapshot at the log end, 4: past the marker
    again = Partition("t", 0, 2, Log.open("/p/t-0", LogConfig(), storage=storage, now_ms=0))
    again.high_watermark = 2  # as the HW checkpoint had it
    again.rebuild_producer_state()
    assert again.producers.first_unstable_offset() is None
    assert again.last_stable_offset == 0  # the snapshot carried the unreplicated marker
    again.become_follower(LeaderAndIsrState(1, 1, (1, 2), (1, 2), 2, 2))
    again.update_follower_high_watermark(4)
    assert again.last_stable_offset == 4


def test_a_snapshot_keeps_unreplicated_markers_below_its_cut_and_an_older_snapshot_has_none():
    state = ProducerStateManager()
    state.update(iter_batch_headers(txn_batch(7, 0, 0, base_offset=0)))
    state.update(iter_batch_headers(marker(ControlType.COMMIT, 7, 0, 2)), {2: ControlType.COMMIT})
    state.update(iter_batch_headers(txn_batch(8, 0, 0, base_offset=3)))
    state.update(iter_batch_headers(marker(ControlType.ABORT, 8, 0, 5)), {5: ControlType.ABORT})
    snapshot = decode_snapshot(encode_snapshot(state, 6))
    assert snapshot is not None and snapshot.unreplicated == ((0, 2), (3, 5))
    again = ProducerStateManager()
    again.restore(snapshot, below_offset=6)
    assert list(again.unreplicated) == [(0, 2), (3, 5)] and again.last_stable_offset(2) == 0
    again.restore(snapshot, below_offset=5)  # truncated below the ABORT: the replay decides
    assert list(again.unreplicated) == [(0, 2)]
    again.restore(snapshot, below_offset=6, with_transactions=False)
    assert not again.unreplicated
    older = json.loads(encode_snapshot(state, 6))
    del older["unreplicated"]
    assert decode_snapshot(json.dumps(older).encode()).unreplicated == ()  # type: ignore[union-attr]


def test_an_empty_transaction_completes_at_its_marker_and_a_newer_epoch_keeps_the_open_one():
    state = ProducerStateManager()
    assert state.update(iter_batch_headers(marker(ControlType.ABORT, 7, 0, 5)), {5: ControlType.ABORT}) == [
        CompletedTransaction(7, 5, 5, aborted=True)
    ]
    state.update(iter_batch_headers(txn_batch(7, 0, 0, base_offset=6)))
    # The coordinator fenced the producer: it bumps the epoch and aborts with a marker of the new epoch.
    assert state.update(iter_batch_headers(marker(ControlType.ABORT, 7, 1, 8)), {8: ControlType.ABORT}) == [
        CompletedTransaction(7, 6, 8, aborted=True)
    ]
    assert state.producers[7].producer_epoch == 1


def test_open_transactions_survive_a_restart_and_a_truncation_reopens_what_it_cut_the_marker_of():
    storage = MemoryStorage()
    p = follower(storage)
    p.append_as_follower(txn_batch(9, 0, 0, base_offset=0, n=1), now_ms=0)
    p.append_as_follower(txn_batch(7, 0, 0, base_offset=1), now_ms=0)  # 1-2, stays open
    p.update_follower_high_watermark(3)
    p.append_as_follower(marker(ControlType.COMMIT, 9, 0, base_offset=3), now_ms=0)
    p.log.close()  # the clean close's snapshot has producer 7's open transaction
    again = Partition("t", 0, 2, Log.open("/p/t-0", LogConfig(), storage=storage, now_ms=0))
    again.rebuild_producer_state()
    again.high_watermark = 4
    assert again.last_stable_offset == 1
    again.become_follower(LeaderAndIsrState(1, 1, (1, 2), (1, 2), 2, 2))
    again.truncate_to(1)  # the new leader never had producer 7's batch nor producer 9's marker
    assert 7 not in again.producers.producers
    assert again.producers.first_unstable_offset() == 0  # producer 9's transaction is open again
    assert again.last_stable_offset == 0


def test_a_rebuild_from_the_log_alone_reads_the_markers():
    storage = MemoryStorage()
    p = follower(storage)
    p.append_as_follower(txn_batch(7, 0, 0, base_offset=0), now_ms=0)
    p.append_as_follower(marker(ControlType.ABORT, 7, 0, base_offset=2), now_ms=0)
    p.append_as_follower(txn_batch(8, 0, 0, base_offset=3), now_ms=0)
    p.log.abandon()  # a crash: no snapshot
    again = Partition("t", 0, 2, Log.open("/p/t-0", LogConfig(), storage=storage, now_ms=0))
    assert again.log.read_producer_snapshot() is None
    again.rebuild_producer_state()
    assert again.producers.first_unstable_offset() == 3


def test_a_producer_with_an_open_transaction_is_never_evicted():
    state = ProducerStateManager(producer_ids_max=2)
    state.update(iter_batch_headers(txn_batch(1, 0, 0, base_offset=0)))
    state.update(iter_batch_headers(txn_batch(2, 0, 0, base_offset=2)))
    state.update(iter_batch_headers(txn_batch(3, 0, 0, base_offset=4)))
    assert sorted(state.producers) == [1, 2, 3]  # all three open: the bound waits for markers
    state.update(iter_batch_headers(marker(ControlType.COMMIT, 2, 0, 6)), {6: ControlType.COMMIT})
    state.update(iter_batch_headers(txn_batch(4, 0, 0, base_offset=7)))
    assert sorted(state.producers) == [1, 3, 4]
    assert state.first_unstable_offset() == 0


# ---- the aborted-transaction index (services/broker/log/txn_index.py) ---------------------------


def test_the_index_answers_the_aborted_transactions_a_read_overlaps():
    index = AbortedTxnIndex()
    for entry in (AbortedTxn(1, 0, 5, 6), AbortedTxn(2, 3, 9, 10), AbortedTxn(1, 12, 14, 15)):
        assert index.append(entry)
    assert not index.append(AbortedTxn(2, 3, 9, 10))  # met again by a replay
    with pytest.raises(InvariantViolation):
        index.append(AbortedTxn(3, 4, 7, 8))  # below the last marker and not there: a bug
    assert index.collect(0, 3) == [AbortedTxn(1, 0, 5, 6)]
    assert index.collect(6, 12) == [AbortedTxn(2, 3, 9, 10)]
    assert index.collect(6, 13) == [AbortedTxn(2, 3, 9, 10), AbortedTxn(1, 12, 14, 15)]
    assert index.collect(15, 100) == []
    assert AbortedTxnIndex.decode(index.encode()).entries() == index.entries()
    assert len(index.encode()) == 3 * 34  # Kafka's entry size
    with pytest.raises(UnreadableTxnIndex):
        AbortedTxnIndex.decode(index.encode()[:-1])
    assert index.truncate_from(9) and index.entries() == [AbortedTxn(1, 0, 5, 6)]
    assert index.drop_below(6) and len(index) == 0


def aborted_log(storage: MemoryStorage) -> Partition:
    """Producer 7 aborts [0, 2], producer 8 commits [3, 5], producer 7 aborts [6, 8]."""
    p = follower(storage)
    p.append_as_follower(txn_batch(7, 0, 0, base_offset=0), now_ms=0)
    p.append_as_follower(marker(ControlType.ABORT, 7, 0, base_offset=2), now_ms=0)
    p.append_as_follower(txn_batch(8, 0, 0, base_offset=3), now_ms=0)
    p.append_as_follower(marker(ControlType.COMMIT, 8, 0, base_offset=5), now_ms=0)
    p.log.roll(0)
    p.append_as_follower(txn_batch(7, 0, 2, base_offset=6), now_ms=0)
    p.append_as_follower(marker(ControlType.ABORT, 7, 0, base_offset=8), now_ms=0)
    return p


def test_abort_markers_fill_the_index_which_survives_a_restart_and_follows_truncation_and_retention():
    storage = MemoryStorage()
    p = aborted_log(storage)
    assert p.log.aborted_txns(0, 9) == [AbortedTxn(7, 0, 2, 3), AbortedTxn(7, 6, 8, 9)]
    p.log.close()
    log = Log.open("/p/t-0", LogConfig(), storage=storage, now_ms=0)
    assert log.aborted_txns(0, 9) == [AbortedTxn(7, 0, 2, 3), AbortedTxn(7, 6, 8, 9)]
    p = Partition("t", 0, 2, log)
    p.rebuild_producer_state()
    p.become_follower(LeaderAndIsrState(1, 1, (1, 2), (1, 2), 2, 2))
    p.truncate_to(8)  # the second abort's marker is cut
    assert p.log.aborted_txns(0, 9) == [AbortedTxn(7, 0, 2, 3)]
    assert p.producers.first_unstable_offset() == 6  # its transaction is open again
    p.update_follower_high_watermark(8)
    p.log.advance_log_start_offset(6)  # the segment with the first abort goes
    assert p.log.aborted_txns(0, 9) == []
    p.log.close()
    assert not storage.exists("/p/t-0/aborted-transactions.txnindex")


def test_a_crash_that_loses_the_marker_drops_its_entry_and_one_that_loses_the_index_rebuilds_it():
    storage = MemoryStorage()
    p = aborted_log(storage)
    p.log.abandon()
    storage.write_atomic("/p/t-0/aborted-transactions.txnindex", b"\x00\x00garbage")
    log = Log.open("/p/t-0", LogConfig(), storage=storage, now_ms=0)
    assert log.aborted_txns(0, 9) == []
    rebuilt = Partition("t", 0, 2, log)
    rebuilt.rebuild_producer_state()  # no snapshot left: every batch replayed, every marker met
    assert log.aborted_txns(0, 9) == [AbortedTxn(7, 0, 2, 3), AbortedTxn(7, 6, 8, 9)]
    # Power loss: the index was written (atomically) but the last marker was not flushed.
    storage2 = MemoryStorage()
    q = follower(storage2)
    q.append_as_follower(txn_batch(7, 0, 0, base_offset=0), now_ms=0)
    q.append_as_follower(marker(ControlType.ABORT, 7, 0, base_offset=2), now_ms=0)
    q.append_as_follower(txn_batch(8, 0, 0, base_offset=3), now_ms=0)
    q.log.flush(0)
    q.append_as_follower(marker(ControlType.ABORT, 8, 0, base_offset=5), now_ms=0)
    assert len(q.log.aborted_txns(0, 6)) == 2
    storage2.crash()
    log2 = Log.open("/p/t-0", LogConfig(), storage=storage2, now_ms=0)
    assert log2.log_end_offset == 5
    assert log2.aborted_txns(0, 6) == [AbortedTxn(7, 0, 2, 3)]


# ---- what a read_committed reader keeps (clients/common/control_records.drop_aborted) -------------


def test_a_read_committed_reader_drops_the_batches_of_aborted_transactions_only():
    plain = encode_batch([Record(None, b"plain", [], 1_000)], base_offset=6)
    buf = b"".join(
        [
            txn_batch(7, 0, 0, base_offset=0),  # aborted at 4
            txn_batch(8, 0, 0, base_offset=2),  # committed at 5
            marker(ControlType.ABORT, 7, 0, base_offset=4),
            marker(ControlType.COMMIT, 8, 0, base_offset=5),
            plain,
            txn_batch(7, 0, 2, base_offset=7),  # aborted at 9
            marker(ControlType.ABORT, 7, 0, base_offset=9),
            txn_batch(7, 0, 4, base_offset=10),  # open: not in the aborted list, read once committed
        ]
    )
    kept = drop_aborted(buf, [(7, 0), (7, 7)])
    assert [r.value for r in decode_batches(kept)] == [b"v0", b"v1", b"plain", b"v4", b"v5"]
    assert [h.base_offset for h in iter_batch_headers(kept)] == [2, 4, 5, 6, 9, 10]
    assert drop_aborted(buf, []) is buf
    assert drop_aborted(buf, [(99, 0)]) is buf  # no batch of that producer: nothing copied
    torn = buf + plain[:20]
    assert drop_aborted(torn, [(7, 0)]).endswith(plain[:20])  # a torn tail is left for the reader


def test_a_consumer_reads_uncommitted_by_default_as_kafkas_and_asks_for_the_level_it_was_given():
    assert ConsumerConfig(bootstrap="127.0.0.1:1").isolation_level == "read_uncommitted"
    config = ConsumerConfig(bootstrap="127.0.0.1:1", isolation_level="read_committed")
    assert config.read_committed
    with pytest.raises(
        InvalidArgument, match="isolation_level must be one of read_uncommitted, read_committed"
    ):
        ConsumerConfig(bootstrap="127.0.0.1:1", isolation_level="committed")
    request = consumer_fetch_request(
        {("t", 0): 5}, max_wait_ms=0, min_bytes=1, max_bytes=1, partition_max_bytes=1, read_committed=True
    )
    assert request.isolation_level == 1


def test_an_answer_from_a_broker_before_transactions_is_stable_up_to_its_high_watermark():
    old = common_pb2.FetchPartitionResponse(partition=0, high_watermark=9)  # no last_stable_offset sent
    assert last_stable_offset(old) == 9
    open_at_zero = common_pb2.FetchPartitionResponse(partition=0, high_watermark=9, last_stable_offset=0)
    assert last_stable_offset(open_at_zero) == 0
