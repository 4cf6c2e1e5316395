"""coordinator/broker_life.py: the broker's registration rules, stepped by hand, and its state table.

Each test drives a generator as a driver does (send the answer of each step it yields) with a
script of answers, so the order of the steps, the waits and the deadlines are read off
directly. `run_registration` (the asyncio driver) is tested against the in-memory store too.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import pytest

from clients.common.errors import InvariantViolation
from coordinator import broker_life as life
from coordinator.limits import (
    LEASE_REREGISTER_BACKOFF_S,
    LEASE_REREGISTER_TTLS_MAX,
    REGISTRATION_RETRY_INTERVAL_S,
    REGISTRATION_RETRY_MARGIN_S,
)
from coordinator.memory_store import MemoryStore
from coordinator.registration import (
    BrokerIdInUse,
    LeaseSettings,
    Registration,
    register_broker,
    run_registration,
)

KEY = "/highwater/brokers/ids/1"
INFO = {"broker_id": 1, "host": "h", "port": 9092}
TTL_S = 2


class Script:
    """Answers a registration's steps: leases numbered from 1, the clock moved by each pause,
    the registration transaction answered from `created` in turn (or Unreachable)."""

    def __init__(self, created: list[Any], *, grant: list[Any] | None = None) -> None:
        self.created = created
        self.grant = grant or []
        self.now_s = 100.0
        self.steps: list[Any] = []
        self.next_lease = 1

    def answer(self, step: Any) -> Any:
        self.steps.append(step)
        if isinstance(step, life.ReadClock):
            return self.now_s
        if isinstance(step, life.Pause):
            self.now_s += step.seconds
            return None
        if isinstance(step, life.GrantLease):
            if self.grant:
                return self.grant.pop(0)
            self.next_lease += 1
            return self.next_lease - 1
        if isinstance(step, life.Register):
            return self.created.pop(0) if self.created else life.Created(False, 0, "h2:9")
        return None  # RevokeLease

    def run(self, steps: Generator[Any, Any, Any]) -> Any:
        answer = None
        while True:
            try:
                step = steps.send(answer)
            except StopIteration as done:
                return done.value
            answer = self.answer(step)

    def kinds(self) -> list[str]:
        return [type(s).__name__ for s in self.steps]


def test_a_registration_is_a_lease_then_the_key_if_missing() -> None:
    script = Script([life.Created(True, 42, "")])
    outcome = script.run(life.register(KEY, INFO, TTL_S))
    assert outcome == life.Registered(lease_id=1, broker_epoch=42)
    assert script.kinds() == ["ReadClock", "GrantLease", "Register"]
    register = script.steps[2]
    assert register == life.Register(KEY, INFO, 1) and script.steps[1] == life.GrantLease(TTL_S)


def test_a_held_key_is_waited_out_for_the_ttl_and_a_margin_revoking_each_lease() -> None:
    # The old incarnation's key goes after 1 s: four pauses of 0.25 s, the fifth try wins.
    script = Script([life.Created(False, 0, "h:1")] * 4 + [life.Created(True, 50, "")])
    outcome = script.run(life.register(KEY, INFO, TTL_S))
    assert outcome == life.Registered(lease_id=5, broker_epoch=50)
    assert [s.lease_id for s in script.steps if isinstance(s, life.RevokeLease)] == [1, 2, 3, 4]
    pauses = [s for s in script.steps if isinstance(s, life.Pause)]
    assert [p.seconds for p in pauses] == [REGISTRATION_RETRY_INTERVAL_S] * 4
    assert "h:1" in pauses[0].why


def test_a_key_held_past_the_deadline_is_in_use() -> None:
    script = Script([])  # held by h2:9 forever
    outcome = script.run(life.register(KEY, INFO, TTL_S))
    assert outcome == life.InUse("h2:9")
    waited_s = script.now_s - 100.0
    assert TTL_S + REGISTRATION_RETRY_MARGIN_S <= waited_s < TTL_S + REGISTRATION_RETRY_MARGIN_S + 0.5
    assert script.kinds()[-1] == "ReadClock"  # no pause after the last try


def test_an_unreachable_etcd_ends_a_start_up_registration_at_once() -> None:
    script = Script([life.Unreachable("down")])
    assert script.run(life.register(KEY, INFO, TTL_S)) == life.Unreachable("down")
    assert script.kinds() == ["ReadClock", "GrantLease", "Register", "RevokeLease"]
    script = Script([], grant=[life.Unreachable("no lease")])
    assert script.run(life.register(KEY, INFO, TTL_S)) == life.Unreachable("no lease")
    assert "RevokeLease" not in script.kinds()


def test_a_failure_of_unknown_outcome_revokes_the_lease_before_it_is_raised() -> None:
    steps = life.attempt(KEY, INFO, TTL_S)
    assert next(steps) == life.GrantLease(TTL_S)
    assert steps.send(7) == life.Register(KEY, INFO, 7)
    assert steps.throw(TimeoutError("cancelled")) == life.RevokeLease(7)
    with pytest.raises(TimeoutError):
        steps.send(None)


def test_reregistration_backs_off_while_etcd_is_unreachable_then_registers() -> None:
    script = Script([life.Unreachable("down")] * 3 + [life.Created(True, 90, "")])
    outcome = script.run(life.reregister(KEY, INFO, TTL_S))
    assert outcome == life.Registered(lease_id=4, broker_epoch=90)
    pauses = [s.seconds for s in script.steps if isinstance(s, life.Pause)]
    assert pauses == [LEASE_REREGISTER_BACKOFF_S] * 3


def test_reregistration_gives_up_after_its_ttls() -> None:
    script = Script([life.Unreachable("down")] * 10_000)
    outcome = script.run(life.reregister(KEY, INFO, TTL_S))
    assert isinstance(outcome, life.GaveUp) and outcome.last == life.Unreachable("down")
    assert outcome.deadline_s == TTL_S * LEASE_REREGISTER_TTLS_MAX
    waited_s = script.now_s - 100.0
    assert TTL_S * LEASE_REREGISTER_TTLS_MAX <= waited_s < TTL_S * LEASE_REREGISTER_TTLS_MAX + 1


def test_the_state_table_moves_a_broker_through_its_life() -> None:
    broker = life.BrokerLife(1)
    states = [broker.state]
    broker.registered(10)
    states.append(broker.state)
    assert broker.registrations == 1
    assert broker.lease_lost()
    states.append(broker.state)
    assert states == [life.State.REGISTERING, life.State.REGISTERED, life.State.REREGISTERING]
    broker.registered(20)
    assert broker.broker_epoch == 20
    broker.shutting_down()
    assert not broker.lease_lost()  # a lease lost while stopping is not registered again
    broker.stopped()
    assert broker.state is life.State.STOPPED and broker.stopping


def test_an_illegal_move_raises_with_both_states() -> None:
    broker = life.BrokerLife(3)
    with pytest.raises(InvariantViolation, match=r"broker 3 .* from registering to lease lost"):
        broker.lease_lost()
    broker.registered(5)
    broker.shutting_down()
    with pytest.raises(InvariantViolation, match="from shutting down to registered"):
        broker.registered(6)


def test_every_state_can_reach_stopped() -> None:
    for state in life.State:
        seen, frontier = {state}, [state]
        while frontier:
            for nxt in life.LEGAL_TRANSITIONS[frontier.pop()]:
                if nxt not in seen:
                    seen.add(nxt)
                    frontier.append(nxt)
        assert life.State.STOPPED in seen, state


@pytest.mark.asyncio
async def test_run_registration_refuses_a_held_id_and_registers_a_new_incarnation() -> None:
    store = MemoryStore(now_ms=0)
    old = await register_broker(store, 1, {"host": "old", "port": 1}, ttl_s=TTL_S)
    with pytest.raises(BrokerIdInUse, match="old:1"):
        await register_broker(store, 1, INFO, ttl_s=TTL_S)
    await old.lease.stop(revoke=True)
    key = store.keys.broker(1)
    outcome = await run_registration(
        store,
        life.reregister(key, INFO, TTL_S),
        LeaseSettings(),
        name="broker 1",
        etcd_failures_are_answers=True,
    )
    assert isinstance(outcome, Registration) and outcome.key == key
    assert outcome.broker_epoch > old.broker_epoch
    await outcome.close()
