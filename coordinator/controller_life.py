"""A controller process's life as pure rules: the campaign, the term, what ends it.

No etcd client, no asyncio, no clock: the campaign is a generator that yields steps
(read the election keys, grant a lease, claim the role, revoke, wait for `/controller`
to go, pause) and is resumed with their answers, in the shape of
services/broker/steps.py. Two drivers run the same rules:

- the asyncio one: coordinator/election.py `ControllerElection.campaign` (etcd through
  `perform_step`, a LeaseKeeper per granted lease, an etcd watch, asyncio.sleep), with
  services/controller/candidacy.py (serve()'s task) moving `ControllerLife` through a term;
- the simulation's: tests/sim/sim_controller.py (the same `perform_step` on the
  simulated etcd, a SimLease, timers and the simulated watch).

An etcd step whose etcd could not be reached is answered with `Unreachable` (the
campaign backs off and tries again); any other failure is thrown into the generator,
which revokes a lease whose claim had an unknown outcome before letting it out.

`ControllerLife` holds the process's role; it moves only along `LEGAL_TRANSITIONS`
(h11's `_state.py`, STYLE.md practice 7), and an illegal move raises with both roles.
"""

from __future__ import annotations

import enum
from collections.abc import Generator, Mapping
from dataclasses import dataclass
from typing import Any

from clients.common.errors import InvariantViolation
from coordinator.limits import ELECTION_RETRY_BACKOFF_S_MAX, ELECTION_RETRY_BACKOFF_S_MIN

# ---- the steps a campaign yields, and their answers ----------------------------------------------


@dataclass(frozen=True, slots=True)
class ReadElection:
    """Read `/controller` and `/controller_epoch` in one snapshot; answered with an ElectionView."""


@dataclass(frozen=True, slots=True)
class ElectionView:
    # The decoded `/controller` value, None when no controller holds the role.
    holder: Mapping[str, Any] | None
    # `/controller_epoch`, 0 when it was never written (the first election of the cluster).
    epoch: int
    # Its mod revision (0 when missing): the claim requires that it did not move since.
    epoch_mod_revision: int
    # The snapshot's revision: a watch for the holder's going starts after it.
    revision: int


@dataclass(frozen=True, slots=True)
class AwaitControllerGone:
    """Resume once `/controller` is deleted at or after start_revision (holder: who holds it now)."""

    start_revision: int
    holder: Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class GrantLease:
    """Grant a lease of ttl_s and keep it alive; answered with its id."""

    ttl_s: int


@dataclass(frozen=True, slots=True)
class Claim:
    """The election's one transaction: if `/controller` is missing and `/controller_epoch` is
    unchanged since it was read (epoch_mod_revision; 0: still missing), put `/controller`
    (value, under lease_id) and `/controller_epoch` = epoch. Answered with a Claimed."""

    epoch: int
    epoch_mod_revision: int
    value: Mapping[str, Any]
    lease_id: int


@dataclass(frozen=True, slots=True)
class Claimed:
    succeeded: bool
    revision: int


@dataclass(frozen=True, slots=True)
class RevokeLease:
    """Stop keeping lease_id alive and revoke it (deleting `/controller` if it holds it)."""

    lease_id: int


@dataclass(frozen=True, slots=True)
class Pause:
    """Resume after seconds; why: the failure that caused it, for the log."""

    seconds: float
    why: str


@dataclass(frozen=True, slots=True)
class Unreachable:
    """The answer to an etcd step when etcd could not be reached (retriable)."""

    reason: str


@dataclass(frozen=True, slots=True)
class Won:
    epoch: int
    # The revision of the winning transaction: every write of the previous controller is at
    # or below it (a warm standby catches up to it before it acts).
    revision: int
    lease_id: int


@dataclass(frozen=True, slots=True)
class LostRace:
    """Another candidate claimed epoch first: read the election again at once."""

    epoch: int


ElectionStep = ReadElection | AwaitControllerGone | GrantLease | Claim | RevokeLease | Pause
Attempt = Generator[ElectionStep, Any, "Won | LostRace | Unreachable | None"]


def campaign(controller_id: int, info: Mapping[str, Any], ttl_s: int) -> Generator[ElectionStep, Any, Won]:
    """Until this candidate is the controller: one attempt after another, backing off (doubling,
    capped) while etcd is unreachable, at once after a lost race or the holder's going."""
    backoff_s = ELECTION_RETRY_BACKOFF_S_MIN
    while True:
        outcome = yield from attempt(controller_id, info, ttl_s)
        if isinstance(outcome, Won):
            return outcome
        if isinstance(outcome, Unreachable):
            yield Pause(backoff_s, outcome.reason)
            backoff_s = min(backoff_s * 2, ELECTION_RETRY_BACKOFF_S_MAX)
            continue
        backoff_s = ELECTION_RETRY_BACKOFF_S_MIN


def attempt(controller_id: int, info: Mapping[str, Any], ttl_s: int) -> Attempt:
    """One try: None when another controller held the role until it went (try again)."""
    view = yield ReadElection()
    if isinstance(view, Unreachable):
        return view
    if view.holder is not None:
        gone = yield AwaitControllerGone(view.revision + 1, view.holder)
        return gone if isinstance(gone, Unreachable) else None
    new_epoch = view.epoch + 1
    lease_id = yield GrantLease(ttl_s)
    if isinstance(lease_id, Unreachable):
        return lease_id
    value = {**info, "controller_id": controller_id, "epoch": new_epoch}
    try:
        claimed = yield Claim(new_epoch, view.epoch_mod_revision, value, lease_id)
    except GeneratorExit:
        raise
    except BaseException:
        # Unknown outcome (the driver was cancelled, etcd failed oddly): revoking the lease
        # deletes /controller if we did write it.
        yield RevokeLease(lease_id)
        raise
    if isinstance(claimed, Unreachable):
        yield RevokeLease(lease_id)
        return claimed
    if not claimed.succeeded:
        yield RevokeLease(lease_id)
        return LostRace(new_epoch)
    return Won(new_epoch, claimed.revision, lease_id)


# ---- the role of the process ---------------------------------------------------------------------


class Role(enum.Enum):
    # Following the metadata (a warm standby) and campaigning.
    STANDING_BY = "standing by"
    # Won an epoch: catching up to the election's revision, starting the event loop.
    STARTING = "starting"
    # Deciding, committing (fenced) and sending.
    ACTIVE = "active"
    # The term ended: the event loop stops, the lease is revoked so a standby takes over at once.
    STEPPING_DOWN = "stepping down"
    # The process is stopping: it campaigns no more.
    STOPPED = "stopped"


# A standby that wins starts (or, when the process is stopping, hands the epoch straight
# back). A start that fails steps down like a term that ends; a stepped-down controller
# stands by again (a fresh copy of the metadata, a new campaign) unless it is stopping.
LEGAL_TRANSITIONS: dict[Role, frozenset[Role]] = {
    Role.STANDING_BY: frozenset({Role.STARTING, Role.STEPPING_DOWN, Role.STOPPED}),
    Role.STARTING: frozenset({Role.ACTIVE, Role.STEPPING_DOWN}),
    Role.ACTIVE: frozenset({Role.STEPPING_DOWN}),
    Role.STEPPING_DOWN: frozenset({Role.STANDING_BY, Role.STOPPED}),
    Role.STOPPED: frozenset(),
}


class TermEnd(enum.Enum):
    """Why a controller stopped acting (each ends the term the same way: step down, resign)."""

    # The lease holding /controller was lost: another candidate may already have won.
    LEASE_LOST = "lease lost"
    # A write failed ControllerFenced, or reloading the context after a failed event failed:
    # the event loop resigned.
    RESIGNED = "fenced or failed to reload"
    # Catching up, starting the event loop or waiting on it failed unexpectedly.
    FAILED = "failed"
    # The process is stopping and hands the epoch over.
    STOPPING = "stopping"


@dataclass
class ControllerLife:
    """One controller process's role and term. Owned by the task that campaigns and acts."""

    controller_id: int
    role: Role = Role.STANDING_BY
    epoch: int | None = None
    ended_by: TermEnd | None = None

    def move(self, role: Role) -> None:
        if role not in LEGAL_TRANSITIONS[self.role]:
            raise InvariantViolation(
                f"controller {self.controller_id} (epoch {self.epoch}) cannot move from {self.role.value} "
                f"to {role.value}: legal from there: {sorted(r.value for r in LEGAL_TRANSITIONS[self.role])}"
            )
        self.role = role

    def won(self, epoch: int, *, stopping: bool) -> bool:
        """Act on the epoch just won? Not while the process stops (it won again before a standby
        campaigned): the epoch is handed straight back instead of loading the cluster."""
        self.epoch = epoch
        self.ended_by = None
        if stopping:
            self.move(Role.STEPPING_DOWN)
            self.ended_by = TermEnd.STOPPING
            return False
        self.move(Role.STARTING)
        return True

    def started(self) -> None:
        self.move(Role.ACTIVE)

    def end_term(self, why: TermEnd) -> bool:
        """The term ends (step down, then resign). False when it had already ended."""
        if self.role not in (Role.STARTING, Role.ACTIVE):
            return False
        self.move(Role.STEPPING_DOWN)
        self.ended_by = why
        return True

    def stood_down(self, *, stopping: bool) -> None:
        """Stepped down and resigned: stand by again, or stop."""
        self.move(Role.STOPPED if stopping else Role.STANDING_BY)

    def stop(self) -> None:
        """The process stops while standing by."""
        if self.role is Role.STANDING_BY:
            self.move(Role.STOPPED)

    @property
    def acting(self) -> bool:
        return self.role is Role.ACTIVE
