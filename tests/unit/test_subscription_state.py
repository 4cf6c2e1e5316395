"""The consumer's SubscriptionState (clients/subscription_state.py): plain state, so its rules
are checked here without a gateway: an assignment keeps only its own partitions' state, a
seek ends a pending reset, and a partition without a position starts from its reset, else
auto_offset_reset."""

from __future__ import annotations

import pytest

from clients.common.errors import OffsetOutOfRange
from clients.errors import InvalidArgument
from clients.subscription_state import EARLIEST, LATEST, SubscriptionState, check_partitions
from clients.types import TopicPartition

TP0 = TopicPartition("t", 0)
TP1 = TopicPartition("t", 1)


def test_an_assignment_drops_the_state_of_the_partitions_given_up_and_keeps_the_rest() -> None:
    state = SubscriptionState("earliest")
    state.assign([TP0, TP1])
    state.seek(TP0, 5)
    state.reset(TP1, LATEST)
    state.paused |= {TP0, TP1}
    state.high_watermarks.update({TP0: 9, TP1: 9})
    state.assign([TP0])
    assert state.positions == {TP0: 5} and state.fetch_offsets == {TP0: 5}
    assert state.resets == {} and state.paused == {TP0} and state.high_watermarks == {TP0: 9}


def test_a_seek_ends_a_pending_reset_and_a_reset_forgets_the_position() -> None:
    state = SubscriptionState("earliest")
    state.assign([TP0])
    state.reset(TP0, EARLIEST)
    assert state.missing_positions() == [TP0]
    state.seek(TP0, 3)
    assert state.resets == {} and state.positions[TP0] == 3 and state.missing_positions() == []
    state.reset(TP0, LATEST)
    assert TP0 not in state.positions and TP0 not in state.fetch_offsets


def test_a_partition_without_a_position_starts_from_its_reset_else_auto_offset_reset() -> None:
    state = SubscriptionState("latest")
    state.assign([TP0, TP1])
    state.reset(TP0, EARLIEST)
    assert state.reset_timestamps([TP0, TP1]) == {TP0: EARLIEST, TP1: LATEST}
    strict = SubscriptionState("none")
    strict.assign([TP0])
    with pytest.raises(OffsetOutOfRange, match="auto_offset_reset is 'none'"):
        strict.reset_timestamps([TP0])


def test_only_assigned_partitions_may_be_named() -> None:
    state = SubscriptionState("earliest")
    state.assign([TP0])
    assert state.targets(()) == [TP0]
    with pytest.raises(InvalidArgument, match="not assigned"):
        state.targets((TP1,))
    with pytest.raises(InvalidArgument, match="list of TopicPartition"):
        check_partitions("t")
