"""coordinator/controller_life.py: the campaign's steps and the role table, without etcd or asyncio."""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import pytest

from clients.common.errors import InvariantViolation
from coordinator import controller_life as life
from coordinator.limits import ELECTION_RETRY_BACKOFF_S_MAX, ELECTION_RETRY_BACKOFF_S_MIN

INFO = {"host": "h", "port": 1}


def _view(holder: dict[str, Any] | None = None, epoch: int = 0, revision: int = 10) -> life.ElectionView:
    return life.ElectionView(holder=holder, epoch=epoch, epoch_mod_revision=epoch and 7, revision=revision)


def _start() -> Generator[life.ElectionStep, Any, life.Won]:
    return life.campaign(controller_id=2, info=INFO, ttl_s=3)


def test_a_free_role_is_claimed_with_the_next_epoch_under_a_fresh_lease() -> None:
    steps = _start()
    assert next(steps) == life.ReadElection()
    assert steps.send(_view(epoch=4)) == life.GrantLease(3)
    claim = steps.send(99)
    assert claim == life.Claim(5, 7, {**INFO, "controller_id": 2, "epoch": 5}, 99)
    with pytest.raises(StopIteration) as done:
        steps.send(life.Claimed(succeeded=True, revision=20))
    assert done.value.value == life.Won(epoch=5, revision=20, lease_id=99)


def test_a_held_role_is_waited_for_from_after_the_snapshot_then_read_again() -> None:
    steps = _start()
    next(steps)
    holder = {"controller_id": 1, "epoch": 4}
    assert steps.send(_view(holder=holder, epoch=4, revision=10)) == life.AwaitControllerGone(11, holder)
    assert steps.send(None) == life.ReadElection()


def test_a_lost_race_revokes_its_lease_and_reads_again_at_once() -> None:
    steps = _start()
    next(steps)
    steps.send(_view())
    steps.send(99)
    assert steps.send(life.Claimed(succeeded=False, revision=21)) == life.RevokeLease(99)
    assert steps.send(None) == life.ReadElection()


def test_unreachable_etcd_backs_off_doubling_up_to_the_cap_and_resets_after_a_read() -> None:
    steps = _start()
    next(steps)
    pauses = []
    for _ in range(8):
        pause = steps.send(life.Unreachable("partitioned"))
        assert isinstance(pause, life.Pause) and pause.why == "partitioned"
        pauses.append(pause.seconds)
        assert steps.send(None) == life.ReadElection()
    assert pauses[0] == ELECTION_RETRY_BACKOFF_S_MIN and pauses[1] == 2 * ELECTION_RETRY_BACKOFF_S_MIN
    assert max(pauses) == ELECTION_RETRY_BACKOFF_S_MAX == pauses[-1]
    # A lost race proves etcd answers: the next failure pauses from the minimum again.
    steps.send(_view())
    steps.send(99)
    steps.send(life.Claimed(succeeded=False, revision=3))
    steps.send(None)
    assert steps.send(life.Unreachable("x")) == life.Pause(ELECTION_RETRY_BACKOFF_S_MIN, "x")


def test_a_claim_of_unknown_outcome_revokes_its_lease_before_the_failure_goes_out() -> None:
    steps = _start()
    next(steps)
    steps.send(_view())
    steps.send(99)
    assert steps.send(life.Unreachable("timeout")) == life.RevokeLease(99)  # it may have committed
    assert isinstance(steps.send(None), life.Pause)

    steps = _start()
    next(steps)
    steps.send(_view())
    steps.send(98)
    assert steps.throw(RuntimeError("cancelled")) == life.RevokeLease(98)
    with pytest.raises(RuntimeError, match="cancelled"):
        steps.send(None)


def test_roles_move_only_along_the_table() -> None:
    run = life.ControllerLife(controller_id=1)
    assert run.won(3, stopping=False)
    run.started()
    assert run.acting
    assert run.end_term(life.TermEnd.LEASE_LOST)
    assert not run.end_term(life.TermEnd.RESIGNED), "a term ends once"
    assert run.ended_by is life.TermEnd.LEASE_LOST
    run.stood_down(stopping=False)
    assert run.role is life.Role.STANDING_BY


def test_an_epoch_won_while_stopping_is_handed_back_and_stopped_is_final() -> None:
    run = life.ControllerLife(controller_id=1)
    assert not run.won(4, stopping=True)
    assert run.ended_by is life.TermEnd.STOPPING
    run.stood_down(stopping=True)
    assert run.role is life.Role.STOPPED
    with pytest.raises(InvariantViolation, match="cannot move from stopped to starting"):
        run.move(life.Role.STARTING)


def test_every_role_is_in_the_table_and_stopped_is_final() -> None:
    assert set(life.LEGAL_TRANSITIONS) == set(life.Role)
    assert life.LEGAL_TRANSITIONS[life.Role.STOPPED] == frozenset()
    assert all(role not in moves for role, moves in life.LEGAL_TRANSITIONS.items())
