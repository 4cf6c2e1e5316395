"""A registered process's life as pure rules: register, lose the lease, register again.

Brokers (`/brokers/ids/{id}`) and gateways (`/gateways/ids/{id}`) live by the same rules;
only the key, the info stored in it and what the process does with a registration differ.

No etcd client, no asyncio, no clock: a registration is a generator that yields steps
(grant a lease, the registration transaction, revoke, pause, read the clock) and is
resumed with their answers, in the shape of coordinator/controller_life.py, whose lease
and pause steps it shares. Two drivers run the same rules:

- the asyncio one: coordinator/registration.py `run_registration` (etcd through
  `perform_registration_step` in values.py's formats, a LeaseKeeper per granted lease,
  asyncio.sleep, the event loop's clock) and `RegistrationLife` (serve()'s registration and
  lease watch), used by services/broker/registration_life.py and
  services/gateway/registration_life.py;
- the simulation's: tests/sim/sim_registration.py (the same `perform_registration_step` on the
  simulated etcd, a SimLease, timers and the simulated clock).

An etcd step whose etcd could not be reached is answered with `Unreachable` (the rules
decide whether to try again); any other failure is thrown into the generator, which
revokes a lease whose registration had an unknown outcome before letting it out.

`ProcessLife` (`BrokerLife` for a broker) holds the process's registration state; it moves
only along `LEGAL_TRANSITIONS` (h11's `_state.py`, STYLE.md practice 7), and an illegal move raises
with both states.
"""

from __future__ import annotations

import enum
from collections.abc import Generator, Mapping
from dataclasses import dataclass
from typing import Any

from clients.common.errors import InvariantViolation
from coordinator.controller_life import GrantLease, Pause, RevokeLease, Unreachable
from coordinator.limits import (
    LEASE_REREGISTER_BACKOFF_S,
    LEASE_REREGISTER_TTLS_MAX,
    REGISTRATION_RETRY_INTERVAL_S,
    REGISTRATION_RETRY_MARGIN_S,
)

__all__ = [
    "LEGAL_TRANSITIONS",
    "BrokerLife",
    "Created",
    "GaveUp",
    "GrantLease",
    "InUse",
    "Pause",
    "ProcessLife",
    "ReadClock",
    "Register",
    "Registered",
    "RegistrationStep",
    "RevokeLease",
    "State",
    "Unreachable",
    "attempt",
    "register",
    "reregister",
]

# ---- the steps a registration yields, and their answers ------------------------------------------


@dataclass(frozen=True, slots=True)
class Register:
    """The registration's one transaction: if `key` is missing, put it (value, under lease_id).
    Answered with a Created."""

    key: str
    value: Mapping[str, Any]
    lease_id: int


@dataclass(frozen=True, slots=True)
class Created:
    succeeded: bool
    # The key's create_revision when it was created: the broker epoch of this incarnation.
    create_revision: int
    # Who holds the key when it was not created ("host:port" from its value), for the error.
    holder: str


@dataclass(frozen=True, slots=True)
class ReadClock:
    """Answered with the driver's monotonic time in seconds (the rules' deadlines are on it)."""


RegistrationStep = GrantLease | Register | RevokeLease | Pause | ReadClock


@dataclass(frozen=True, slots=True)
class Registered:
    lease_id: int
    # The key's create_revision: larger for every registration of the id.
    broker_epoch: int


@dataclass(frozen=True, slots=True)
class InUse:
    """A live process (or a dead one whose lease has not expired yet) holds the key."""

    holder: str


@dataclass(frozen=True, slots=True)
class GaveUp:
    """Re-registration did not succeed within its deadline: the process must stop."""

    deadline_s: float
    last: InUse | Unreachable


Attempt = Generator[RegistrationStep, Any, Registered | InUse | Unreachable]


def attempt(key: str, info: Mapping[str, Any], ttl_s: int) -> Attempt:
    """One try: a fresh lease, then the key if missing; the lease is revoked unless it holds the key."""
    lease_id = yield GrantLease(ttl_s)
    if isinstance(lease_id, Unreachable):
        return lease_id
    try:
        created = yield Register(key, info, lease_id)
    except GeneratorExit:
        raise
    except BaseException:
        # Unknown outcome (the driver was cancelled, etcd failed oddly): revoking the lease
        # deletes the key if we did write it.
        yield RevokeLease(lease_id)
        raise
    if isinstance(created, Unreachable):
        yield RevokeLease(lease_id)
        return created
    if not created.succeeded:
        yield RevokeLease(lease_id)
        return InUse(created.holder)
    return Registered(lease_id, created.create_revision)


def register(key: str, info: Mapping[str, Any], ttl_s: int) -> Attempt:
    """Register, waiting out the lease of a previous incarnation that died without revoking it.

    A process restarted right after a crash finds its own old key still held by a lease
    etcd has not expired yet; Kafka's broker waits for the old session the same way. Tries
    again every REGISTRATION_RETRY_INTERVAL_S while the key is held, for at most the TTL
    plus REGISTRATION_RETRY_MARGIN_S; returns the last InUse then, and an Unreachable at once.
    """
    started_s = yield ReadClock()
    deadline_s = started_s + ttl_s + REGISTRATION_RETRY_MARGIN_S
    while True:
        outcome = yield from attempt(key, info, ttl_s)
        if not isinstance(outcome, InUse):
            return outcome
        now_s = yield ReadClock()
        if now_s >= deadline_s:
            return outcome
        yield Pause(
            REGISTRATION_RETRY_INTERVAL_S,
            f"{key} still held by {outcome.holder}; waiting for the old lease to expire",
        )


def reregister(
    key: str, info: Mapping[str, Any], ttl_s: int
) -> Generator[RegistrationStep, Any, Registered | GaveUp]:
    """After the lease was lost: register again as a new incarnation (a new broker epoch),
    pausing LEASE_REREGISTER_BACKOFF_S after each failed try (etcd unreachable, or the old
    key still held past `register`'s wait), for at most LEASE_REREGISTER_TTLS_MAX TTLs."""
    started_s = yield ReadClock()
    deadline_s = started_s + ttl_s * LEASE_REREGISTER_TTLS_MAX
    while True:
        outcome = yield from register(key, info, ttl_s)
        if isinstance(outcome, Registered):
            return outcome
        now_s = yield ReadClock()
        if now_s >= deadline_s:
            return GaveUp(deadline_s - started_s, outcome)
        why = outcome.reason if isinstance(outcome, Unreachable) else f"{key} held by {outcome.holder}"
        yield Pause(LEASE_REREGISTER_BACKOFF_S, why)


# ---- the registration state of the process -------------------------------------------------------


class State(enum.Enum):
    # Starting: the first registration (waiting out an old incarnation's lease).
    REGISTERING = "registering"
    # The key is held under a live lease: the controller counts this broker in (or pushes
    # metadata to this gateway, and clients find it).
    REGISTERED = "registered"
    # The lease was lost (a pause past the TTL, etcd expired it): the key is gone or going.
    LEASE_LOST = "lease lost"
    # Registering again as a new incarnation, within LEASE_REREGISTER_TTLS_MAX TTLs.
    REREGISTERING = "re-registering"
    # Controlled shutdown and close: a lost lease is not registered again.
    SHUTTING_DOWN = "shutting down"
    # Closed, the lease revoked (or gone with the process).
    STOPPED = "stopped"


# A start-up registration that fails stops the process; any state but STOPPED may begin the
# shutdown (a re-registration that gave up does, as does an operator's stop). Only a
# registered process can lose its lease: a lease of a failed try is revoked by the try itself.
LEGAL_TRANSITIONS: dict[State, frozenset[State]] = {
    State.REGISTERING: frozenset({State.REGISTERED, State.SHUTTING_DOWN, State.STOPPED}),
    State.REGISTERED: frozenset({State.LEASE_LOST, State.SHUTTING_DOWN}),
    State.LEASE_LOST: frozenset({State.REREGISTERING, State.SHUTTING_DOWN}),
    State.REREGISTERING: frozenset({State.REGISTERED, State.SHUTTING_DOWN}),
    State.SHUTTING_DOWN: frozenset({State.STOPPED}),
    State.STOPPED: frozenset(),
}


@dataclass
class ProcessLife:
    """The registration state of one registered process: a broker (`/brokers/ids/{id}`) or a
    gateway (`/gateways/ids/{id}`); `kind` and `ident` name it in errors. Owned by the task that
    registers and watches the lease."""

    kind: str
    ident: int
    state: State = State.REGISTERING
    # The key's create_revision of the current registration (a broker's broker epoch).
    epoch: int | None = None
    # Only the process's first registration speaks for the previous run's shutdown: a later
    # one (the lease was lost) lost nothing on disk since.
    registrations: int = 0

    def move(self, state: State) -> None:
        if state not in LEGAL_TRANSITIONS[self.state]:
            raise InvariantViolation(
                f"{self.kind} {self.ident} ({self.kind} epoch {self.epoch}) cannot move from "
                f"{self.state.value} to {state.value}: legal from there: "
                f"{sorted(s.value for s in LEGAL_TRANSITIONS[self.state])}"
            )
        self.state = state

    def registered(self, epoch: int) -> None:
        self.move(State.REGISTERED)
        self.epoch = epoch
        self.registrations += 1

    def lease_lost(self) -> bool:
        """The registered lease was lost: register again? Not while shutting down (the key
        would go with the process anyway)."""
        if self.state in (State.SHUTTING_DOWN, State.STOPPED):
            return False
        self.move(State.LEASE_LOST)
        self.move(State.REREGISTERING)
        return True

    def shutting_down(self) -> None:
        """The process begins to stop (an operator's stop, or a re-registration that gave up)."""
        if self.state not in (State.SHUTTING_DOWN, State.STOPPED):
            self.move(State.SHUTTING_DOWN)

    def stopped(self) -> None:
        self.move(State.STOPPED)

    @property
    def stopping(self) -> bool:
        return self.state in (State.SHUTTING_DOWN, State.STOPPED)


class BrokerLife(ProcessLife):
    """A broker process's registration state: its epoch is the broker epoch."""

    def __init__(self, broker_id: int) -> None:
        super().__init__("broker", broker_id)

    @property
    def broker_id(self) -> int:
        return self.ident

    @property
    def broker_epoch(self) -> int | None:
        return self.epoch
