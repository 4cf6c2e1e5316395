"""A partition keeps the state of a bounded number of idempotent producers (issue 43).

Every short-lived producer (open, one send, close) gets a new producer id; bench/soak.py found
each one's state kept for the broker's life. Past PRODUCER_IDS_PER_PARTITION_MAX the least
recently written producer is forgotten, so a producer that keeps writing keeps its duplicate
check however many others come and go.
"""

from __future__ import annotations

from clients.common.records import Record, encode_batch
from services.broker.log import Log, LogConfig, MemoryStorage
from services.broker.partition import LeaderAndIsrState, Partition
from services.broker.producer_state import ProducerStateManager
from services.common.limits import PRODUCER_IDS_PER_PARTITION_MAX


def batch(producer_id: int, first_seq: int) -> bytes:
    return encode_batch(
        [Record(None, f"s{first_seq}".encode(), [], 1_000)],
        producer_id=producer_id,
        producer_epoch=0,
        base_sequence=first_seq,
    )


def leader() -> Partition:
    log = Log.open("/p/t-0", LogConfig(), storage=MemoryStorage(), now_ms=0)
    p = Partition("t", 0, 1, log)
    p.become_leader(LeaderAndIsrState(1, 0, (1,), (1,), 1, 1), now_ms=0)
    return p


def test_short_lived_producers_do_not_pile_up() -> None:
    p = leader()
    for producer_id in range(PRODUCER_IDS_PER_PARTITION_MAX + 50):
        p.append_as_leader(batch(producer_id, 0), acks=1, now_ms=0)
    assert len(p.producers.producers) == PRODUCER_IDS_PER_PARTITION_MAX
    assert 0 not in p.producers.producers  # the least recently written went first


def test_a_producer_that_keeps_writing_keeps_its_duplicate_check() -> None:
    p = leader()
    p.producers = ProducerStateManager(producer_ids_max=3)
    seq = 0
    first = p.append_as_leader(batch(7, seq), acks=1, now_ms=0)
    for short_lived in range(100, 110):
        p.append_as_leader(batch(short_lived, 0), acks=1, now_ms=0)
        retry = p.append_as_leader(batch(7, seq), acks=1, now_ms=0)  # its last batch again
        assert retry.duplicate, f"producer 7 forgotten after producer {short_lived}"
        seq += 1
        first = p.append_as_leader(batch(7, seq), acks=1, now_ms=0)
        assert not first.duplicate
    assert len(p.producers.producers) == 3
