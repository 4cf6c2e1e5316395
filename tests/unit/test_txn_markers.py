"""WriteTxnMarkers and read_committed reads on the broker core (issue 41), driven through its seams
(tests/unit/broker_seams.py). Clients cannot send transactional batches yet, so each test lays
down its log as a replica that replicated them would have it, then starts the broker on it."""

from __future__ import annotations

from clients.admin import log_description
from protos.highwater.v1 import broker_pb2, common_pb2
from services.broker import metrics
from services.broker.log import Log, LogConfig, MemoryStorage
from services.broker.log_dirs import describe_log_dirs
from services.broker.partition import LeaderAndIsrState, Partition
from tests.unit.broker_seams import Broker, lone_leader, run_slices
from tests.unit.test_broker_core import consumer_fetch
from tests.unit.test_transaction_state import ControlType, marker, txn_batch


def replicated_log(storage: MemoryStorage) -> None:
    """t-0 of broker 1: producer 7 aborted [0, 2]; producer 8 open since 3; producer 9 open since 5."""
    log = Log.open("/data/b1/t-0", LogConfig(), storage=storage, now_ms=0)
    p = Partition("t", 0, 1, log)
    p.become_follower(LeaderAndIsrState(2, 0, (1, 2), (1, 2), 1, 1))
    p.append_as_follower(txn_batch(7, 0, 0, base_offset=0), now_ms=0)
    p.append_as_follower(marker(ControlType.ABORT, 7, 0, base_offset=2), now_ms=0)
    p.append_as_follower(txn_batch(8, 0, 0, base_offset=3), now_ms=0)
    p.append_as_follower(txn_batch(9, 3, 0, base_offset=5), now_ms=0)
    log.close()


def write_markers(b: Broker, *markers: broker_pb2.TxnMarker) -> list[broker_pb2.WriteTxnMarkersResponse]:
    answers: list[broker_pb2.WriteTxnMarkersResponse] = []
    b.core.write_txn_markers(
        broker_pb2.WriteTxnMarkersRequest(markers=markers, timeout_ms=1_000), answers.append
    )
    return answers


def txn_marker(
    producer_id: int, epoch: int, *, committed: bool, partitions: tuple[int, ...] = (0,)
) -> broker_pb2.TxnMarker:
    return broker_pb2.TxnMarker(
        producer_id=producer_id,
        producer_epoch=epoch,
        committed=committed,
        coordinator_epoch=1,
        topics=[broker_pb2.TxnMarkerTopic(topic="t", partitions=partitions)],
    )


def codes(resp: broker_pb2.WriteTxnMarkersResponse) -> list[list[int]]:
    return [[p.error_code for t in m.topics for p in t.partitions] for m in resp.markers]


def read_committed(offset: int) -> common_pb2.FetchRequest:
    req = consumer_fetch(offset)
    req.isolation_level = 1
    return req


def test_markers_end_transactions_move_the_lso_and_read_committed_stops_there():
    storage = MemoryStorage()
    replicated_log(storage)
    b = lone_leader(storage)
    p = b.core.partitions[("t", 0)]
    assert (p.high_watermark, p.last_stable_offset) == (7, 3)
    committed = b.fetch_now(read_committed(0)).topics[0].partitions[0]
    assert committed.last_stable_offset == 3 and committed.high_watermark == 7
    assert [(a.producer_id, a.first_offset) for a in committed.aborted_transactions] == [(7, 0)]
    assert committed.records  # offsets 0-2: producer 7's aborted batch and its marker
    uncommitted = b.fetch_now(consumer_fetch(3)).topics[0].partitions[0]
    assert uncommitted.records and not uncommitted.aborted_transactions
    waiting: list[common_pb2.FetchResponse] = []
    b.core.fetch(read_committed(3), waiting.append)
    assert waiting[0].topics[0].partitions[0].records == b""  # nothing committed past the LSO yet

    (answer,) = write_markers(b, txn_marker(8, 0, committed=True), txn_marker(9, 3, committed=False))
    assert codes(answer) == [[common_pb2.NONE], [common_pb2.NONE]]
    assert p.log.log_end_offset == 9 and p.high_watermark == 9
    assert p.last_stable_offset == 9
    after = b.fetch_now(read_committed(3)).topics[0].partitions[0]
    assert after.records and [(a.producer_id, a.first_offset) for a in after.aborted_transactions] == [(9, 5)]
    resp = b.core.list_offsets(
        common_pb2.ListOffsetsRequest(
            replica_id=-1,
            isolation_level=1,
            topics=[
                common_pb2.ListOffsetsTopic(
                    topic="t",
                    partitions=[
                        common_pb2.ListOffsetsPartition(partition=0, timestamp=-1, current_leader_epoch=-1)
                    ],
                )
            ],
        )
    )
    assert resp.topics[0].partitions[0].offset == 9


def test_a_marker_from_before_the_producers_epoch_is_refused_and_writes_nothing():
    storage = MemoryStorage()
    replicated_log(storage)
    b = lone_leader(storage)
    p = b.core.partitions[("t", 0)]
    (answer,) = write_markers(b, txn_marker(9, 2, committed=True))
    assert codes(answer) == [[common_pb2.INVALID_PRODUCER_EPOCH]]
    assert "seen epoch 3" in answer.markers[0].topics[0].partitions[0].error_message
    assert p.log.log_end_offset == 7 and p.producers.first_unstable_offset() == 3


def test_markers_answer_once_the_isr_has_them_and_name_partitions_not_led_here():
    b = Broker(1)
    b.register(10)
    b.leader_and_isr(leader=1, leader_epoch=0, isr=(1, 2), replicas=(1, 2), live=[b.node], min_isr=2)
    answers = write_markers(b, txn_marker(5, 0, committed=True, partitions=(0, 7)))
    assert answers == []  # waiting for broker 2 to fetch the marker
    p = b.core.partitions[("t", 0)]
    assert p.log.log_end_offset == 1 and p.high_watermark == 0
    b.clock.now_ms += 1_000
    b.io.fire_due()
    (answer,) = answers
    assert codes(answer) == [[common_pb2.REQUEST_TIMED_OUT, common_pb2.UNKNOWN_TOPIC_OR_PARTITION]]


def test_an_unknown_isolation_level_is_refused():
    b = lone_leader()
    req = consumer_fetch(0)
    req.isolation_level = 2
    part = b.fetch_now(req).topics[0].partitions[0]
    assert part.error_code == common_pb2.INVALID_REQUEST and "isolation_level 2" in part.error_message


def test_describe_log_dirs_and_the_gauges_show_the_open_transactions():
    storage = MemoryStorage()
    replicated_log(storage)
    b = lone_leader(storage)
    answer = describe_log_dirs(
        common_pb2.DescribeLogDirsRequest(
            topics=[
                common_pb2.DescribeLogDirsTopic(topic="t", partitions=[common_pb2.DescribeLogDirsPartition()])
            ]
        ),
        broker_id=1,
        partitions=b.core.partitions,
        topics=b.core.metadata.topics(),
        cleaner_view=lambda tp, log: None,
        now_ms=0,
    )
    (part,) = [p for t in answer.topics for p in t.partitions]
    assert (part.high_watermark, part.last_stable_offset) == (7, 3)
    assert log_description("t", part).last_stable_offset == 3
    run_slices(b.core.update_gauges())
    assert metrics.OPEN_TRANSACTIONS._value.get() == 2  # producers 8 and 9
    assert metrics.LAST_STABLE_OFFSET_MAX_LAG._value.get() == 4
