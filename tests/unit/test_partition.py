"""One partition's replication rules (services/broker/partition.py, fetch_state.py)."""

from __future__ import annotations

import pytest

from clients.common.errors import InvariantViolation, NotEnoughReplicas, NotLeaderOrFollower
from clients.common.records import Record, encode_batch
from services.broker.fetch_state import FetchPhase, PartitionFetchState, truncation_offset
from services.broker.log import Log, LogConfig, MemoryStorage
from services.broker.partition import LeaderAndIsrState, Partition, Role


def batch(n: int = 1) -> bytes:
    return encode_batch([Record(None, f"v{i}".encode(), [], 1_000) for i in range(n)])


def partition(broker_id: int = 1, min_isr: int = 1) -> Partition:
    log = Log.open("/p/t-0", LogConfig(), storage=MemoryStorage(), now_ms=0)
    return Partition("t", 0, broker_id, log, min_insync_replicas=min_isr)


def state(
    leader: int,
    epoch: int,
    isr: tuple[int, ...],
    replicas: tuple[int, ...] = (1, 2, 3),
    partition_epoch: int = 1,
) -> LeaderAndIsrState:
    return LeaderAndIsrState(leader, epoch, isr, replicas, partition_epoch, 1)


def test_high_watermark_is_the_minimum_leo_over_the_isr_and_never_moves_back():
    p = partition()
    p.become_leader(state(1, 0, (1, 2, 3)), now_ms=0)
    p.append_as_leader(batch(5), acks=-1, now_ms=0)
    assert p.high_watermark == 0
    p.record_follower_fetch(2, 5, now_ms=1)
    assert p.high_watermark == 0, "follower 3 has not fetched yet"
    p.record_follower_fetch(3, 3, now_ms=1)
    assert p.high_watermark == 3
    p.record_follower_fetch(3, 1, now_ms=2)  # a stale, reordered fetch offset
    assert p.high_watermark == 3
    p.record_follower_fetch(3, 5, now_ms=3)
    assert p.high_watermark == 5


def test_acks_all_is_refused_when_the_isr_is_below_min_insync_replicas():
    p = partition(min_isr=2)
    p.become_leader(state(1, 0, (1,)), now_ms=0)
    with pytest.raises(NotEnoughReplicas, match=r"min\.insync\.replicas=2"):
        p.append_as_leader(batch(), acks=-1, now_ms=0)
    assert p.log.log_end_offset == 0, "nothing was written"
    p.append_as_leader(batch(), acks=1, now_ms=0)
    assert p.log.log_end_offset == 1


def test_a_follower_refuses_produce():
    p = partition(broker_id=2)
    p.become_follower(state(1, 0, (1, 2, 3)))
    with pytest.raises(NotLeaderOrFollower, match="leader is 1"):
        p.append_as_leader(batch(), acks=1, now_ms=0)


def test_follower_lagging_longer_than_replica_lag_time_max_is_shrunk_out_of_the_isr():
    p = partition()
    p.become_leader(state(1, 0, (1, 2, 3)), now_ms=0)
    p.append_as_leader(batch(), acks=1, now_ms=0)
    p.record_follower_fetch(2, 1, now_ms=5_000)
    assert p.check_isr_shrink(now_ms=9_000, replica_lag_time_max_ms=10_000) is None
    change = p.check_isr_shrink(now_ms=10_001, replica_lag_time_max_ms=10_000)
    assert change is not None and change.new_isr == (1, 2)
    assert p.check_isr_shrink(now_ms=20_000, replica_lag_time_max_ms=10_000) is None, "one proposal at a time"


def test_follower_joins_the_isr_once_it_reaches_the_high_watermark():
    p = partition()
    p.become_leader(state(1, 0, (1, 2)), now_ms=0)
    p.append_as_leader(batch(3), acks=1, now_ms=0)
    p.record_follower_fetch(2, 3, now_ms=1)
    assert p.high_watermark == 3
    assert p.record_follower_fetch(3, 2, now_ms=2) is None
    change = p.record_follower_fetch(3, 3, now_ms=3)
    assert change is not None and change.new_isr == (1, 2, 3)
    # While the expansion is in flight, the new member counts for the HW (maximal ISR).
    p.append_as_leader(batch(), acks=1, now_ms=4)
    p.record_follower_fetch(2, 4, now_ms=5)
    assert p.high_watermark == 3
    p.update_isr((1, 2, 3), partition_epoch=2, leader_epoch=0)
    assert p.isr == (1, 2, 3) and p.pending_isr is None


def test_leader_epoch_never_goes_back():
    p = partition()
    p.become_leader(state(1, 4, (1, 2, 3)), now_ms=0)
    with pytest.raises(InvariantViolation, match="would go back"):
        p.become_follower(state(2, 3, (2,)))


def test_new_leader_records_its_epoch_start_at_its_leo():
    p = partition()
    p.become_leader(state(1, 0, (1,), replicas=(1,)), now_ms=0)
    p.append_as_leader(batch(2), acks=1, now_ms=0)
    p.become_follower(state(2, 1, (1, 2), replicas=(1, 2)))
    p.become_leader(state(1, 2, (1, 2), replicas=(1, 2)), now_ms=0)
    assert p.log.leader_epoch_cache.end_offset_for_epoch(0) == (0, 2)
    assert p.log.leader_epoch_cache.latest_epoch() == 2
    assert p.role is Role.LEADER


def test_follower_truncates_to_leader_epoch_end_offset_after_double_failover():
    """KIP-279: the follower's latest epoch is unknown to the new leader; truncate to min of both ends."""
    # Follower holds epoch 1 entries [2, 5) that the leader (which went from epoch 0 to 2) never had.
    # The leader answers for epoch 1 with its largest epoch <= 1, which is 0, ending at offset 3.
    offset = truncation_offset(
        local_leo=5,
        requested_epoch=1,
        leader_epoch=0,
        leader_end_offset=3,
        local_end_offset_for_leader_epoch=2,
    )
    assert offset == 2


def test_follower_keeps_its_log_when_the_leader_knows_its_epoch_and_has_more():
    assert (
        truncation_offset(
            local_leo=5,
            requested_epoch=3,
            leader_epoch=3,
            leader_end_offset=9,
            local_end_offset_for_leader_epoch=5,
        )
        == 5
    )
    assert (
        truncation_offset(
            local_leo=5,
            requested_epoch=3,
            leader_epoch=3,
            leader_end_offset=4,
            local_end_offset_for_leader_epoch=5,
        )
        == 4
    )


def test_fetch_state_transitions_are_data_and_illegal_ones_fail_loudly():
    st = PartitionFetchState("t", 0, fetch_offset=0, current_leader_epoch=1)
    assert st.phase is FetchPhase.TRUNCATING
    st.move(FetchPhase.FETCHING)
    st.delay(now_ms=100, backoff_ms=50, resume=FetchPhase.TRUNCATING)
    assert not st.ready(now_ms=120)
    assert st.ready(now_ms=150) and st.phase is FetchPhase.TRUNCATING
    import services.broker.fetch_state as fs

    original = fs.LEGAL_TRANSITIONS[FetchPhase.TRUNCATING]
    fs.LEGAL_TRANSITIONS[FetchPhase.TRUNCATING] = frozenset({FetchPhase.FETCHING})
    try:
        with pytest.raises(InvariantViolation, match="illegal fetch transition"):
            st.move(FetchPhase.DELAYED)
    finally:
        fs.LEGAL_TRANSITIONS[FetchPhase.TRUNCATING] = original
