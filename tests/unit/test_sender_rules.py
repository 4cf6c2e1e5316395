"""When the controller sends a control request again (services/controller/sender_rules.py)."""

from __future__ import annotations

from protos.highwater.v1 import common_pb2
from services.controller.sender_rules import (
    CONTROL_RPC_ATTEMPTS_MAX,
    CONTROL_RPC_RETRY_BACKOFF_MS_MAX,
    retry_after_ms,
)


def test_an_answer_without_error_ends_the_request() -> None:
    assert retry_after_ms(1, error_code=common_pb2.NONE) is None


def test_a_broker_not_registered_yet_is_asked_again_for_as_long_as_it_takes() -> None:
    pauses = [retry_after_ms(n, error_code=common_pb2.BROKER_NOT_AVAILABLE) for n in range(1, 200)]
    assert all(p is not None and p > 0 for p in pauses), "a refusal as not ready never ends the request"
    assert max(p for p in pauses if p is not None) == CONTROL_RPC_RETRY_BACKOFF_MS_MAX


def test_a_stale_broker_epoch_refusal_is_asked_again() -> None:
    """The broker knows a newer incarnation than the request: the controller replaces the sender
    when it sees the registration; until then the request is not counted as delivered."""
    assert retry_after_ms(7, error_code=common_pb2.STALE_BROKER_EPOCH) is not None


def test_other_refusals_end_the_request() -> None:
    for code in (
        common_pb2.STALE_CONTROLLER_EPOCH,
        common_pb2.INVALID_REQUEST,
        common_pb2.FENCED_LEADER_EPOCH,
    ):
        assert retry_after_ms(1, error_code=code) is None


def test_a_transport_failure_is_tried_a_bounded_number_of_times_with_growing_pauses() -> None:
    pauses = [retry_after_ms(n, error_code=None) for n in range(1, CONTROL_RPC_ATTEMPTS_MAX + 1)]
    assert pauses[-1] is None, "the last attempt gives up (the broker's lease decides what follows)"
    waits = [p for p in pauses[:-1] if p is not None]
    assert len(waits) == CONTROL_RPC_ATTEMPTS_MAX - 1 and waits == sorted(waits) and waits[0] < waits[-1]
