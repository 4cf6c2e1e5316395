"""Broker and gateway registration: an ephemeral `/brokers/ids/{id}` (or `/gateways/ids/{id}`) key.

The key is created in one transaction, only if missing, with a lease the returned
Registration keeps alive; it disappears within the TTL of the process going away,
which is how the controller learns of a broker failure (DESIGN.md section 7).

The **broker epoch** is the key's create_revision: every registration of a broker
id gets a new, larger one, so control requests meant for an earlier incarnation can
be fenced (STALE_BROKER_EPOCH).

The rules (the order of the steps, waiting out an old incarnation's lease, re-registering
after a lost lease within its deadline, revoking a lease whose registration had an unknown
outcome) are pure, in coordinator/broker_life.py; `run_registration` is their asyncio driver,
`RegistrationLife` serve()'s registration and lease watch for a broker or a gateway, and
`perform_registration_step` turns their transaction into an etcd call in values.py's
format for both drivers (this one and the simulation's, tests/sim/sim_broker.py).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import Any

from coordinator import broker_life, values
from coordinator.lease import LeaseKeeper, OnLost
from coordinator.store import CoordinatorError, Get, KeyValue, MetadataStore, Put, compare_missing

log = logging.getLogger("highwater.coordinator")


class BrokerIdInUse(CoordinatorError):
    """Another live process holds this broker id's registration."""


class GatewayIdInUse(CoordinatorError):
    """Another live process holds this gateway id's registration."""


@dataclass(slots=True)
class Registration:
    """A live registration. broker_epoch: the key's create_revision (for a gateway, its
    registration epoch). Watch `lease.lost`: once set, the key is gone (or about to be)
    and the process must re-register or stop."""

    lease: LeaseKeeper
    broker_epoch: int
    key: str

    @property
    def lease_id(self) -> int:
        return self.lease.lease_id

    async def close(self, *, revoke: bool = True) -> None:
        """Deregister: stop keep-alives and (with revoke) delete the key now."""
        await self.lease.stop(revoke=revoke)


@dataclass(frozen=True, slots=True)
class LeaseSettings:
    """How a registration's lease is kept: the keep-alive interval (None: the LeaseKeeper's
    default) and what to call when it is lost. They travel together from the register_*
    calls to each LeaseKeeper the registration grants."""

    keepalive_interval_s: float | None = None
    on_lost: OnLost | None = None


def _holder_address(existing: KeyValue | None) -> str:
    if existing is None:
        return "an unknown address"
    try:
        return values.registration_address(existing.value)
    except (ValueError, TypeError, KeyError):
        return "an unknown address"


async def perform_registration_step(store: MetadataStore, step: broker_life.Register) -> broker_life.Created:
    """The registration transaction of coordinator/broker_life.py as an etcd call, in etcd's value
    format (values.py). Both drivers use it: run_registration here, and the simulation on its
    simulated etcd. Raises whatever the store raises (CoordinatorUnavailable when etcd could not
    be reached)."""
    result = await store.txn(
        [compare_missing(step.key)],
        [Put(step.key, values.encode_registration(dict(step.value)), lease=step.lease_id), Get(step.key)],
        [Get(step.key)],
    )
    kvs = result.gets[0]
    if result.succeeded:
        return broker_life.Created(succeeded=True, create_revision=kvs[0].create_revision, holder="")
    return broker_life.Created(
        succeeded=False, create_revision=0, holder=_holder_address(kvs[0] if kvs else None)
    )


RegistrationOutcome = (
    broker_life.Registered | broker_life.InUse | broker_life.Unreachable | broker_life.GaveUp
)


async def run_registration(
    store: MetadataStore,
    steps: Generator[broker_life.RegistrationStep, Any, RegistrationOutcome],
    lease: LeaseSettings,
    *,
    name: str,
    etcd_failures_are_answers: bool,
) -> Registration | broker_life.InUse | broker_life.Unreachable | broker_life.GaveUp:
    """Drive broker_life's `attempt`, `register` or `reregister` with etcd, LeaseKeepers and
    asyncio.sleep; a Registration once registered, else the rules' final outcome.

    etcd_failures_are_answers: a CoordinatorError of an etcd step is answered `Unreachable`
    (the rules try again); without it, it is raised out (after revoking a lease of unknown
    outcome), as any other failure is."""
    granted: dict[int, LeaseKeeper] = {}
    key = ""
    step = next(steps)
    while True:
        if isinstance(step, broker_life.Register):
            key = step.key
        try:
            answer = await _perform(store, step, granted, lease, name)
        except CoordinatorError as exc:
            if not etcd_failures_are_answers:
                step = steps.throw(exc)
                continue
            answer = broker_life.Unreachable(f"{type(exc).__name__}: {exc}")
        except BaseException as exc:
            step = steps.throw(exc)  # the rules revoke a lease of unknown outcome, then re-raise
            continue
        try:
            step = steps.send(answer)
        except StopIteration as done:
            outcome: RegistrationOutcome = done.value
            break
    if not isinstance(outcome, broker_life.Registered):
        return outcome
    log.info("%s registered at %s (epoch %d, lease %x)", name, key, outcome.broker_epoch, outcome.lease_id)
    return Registration(lease=granted.pop(outcome.lease_id), broker_epoch=outcome.broker_epoch, key=key)


async def _perform(
    store: MetadataStore,
    step: broker_life.RegistrationStep,
    granted: dict[int, LeaseKeeper],
    lease: LeaseSettings,
    name: str,
) -> object:
    if isinstance(step, broker_life.GrantLease):
        keeper = LeaseKeeper(on_lost=lease.on_lost, name=name)
        lease_id = await keeper.start(store, step.ttl_s, keepalive_interval_s=lease.keepalive_interval_s)
        granted[lease_id] = keeper
        return lease_id
    if isinstance(step, broker_life.RevokeLease):
        await granted.pop(step.lease_id).stop(revoke=True)
        return None
    if isinstance(step, broker_life.Pause):
        log.info("%s: %s; trying again in %.2f s", name, step.why, step.seconds)
        await asyncio.sleep(step.seconds)
        return None
    if isinstance(step, broker_life.ReadClock):
        return asyncio.get_running_loop().time()
    return await perform_registration_step(store, step)


async def _register_id(
    store: MetadataStore,
    key: str,
    info: dict[str, Any],
    *,
    ttl_s: int,
    lease: LeaseSettings,
    wait_for_old_lease: bool,
    kind: str,
    ident: int,
    in_use: type[CoordinatorError],
) -> Registration:
    """Register the `kind` ("broker", "gateway") numbered `ident` at `key`; `in_use` when a
    live process holds it, naming that process's address and the `--{kind}-id` option."""
    rules = broker_life.register if wait_for_old_lease else broker_life.attempt
    outcome = await run_registration(
        store, rules(key, info, ttl_s), lease, name=f"{kind} {ident}", etcd_failures_are_answers=False
    )
    if isinstance(outcome, Registration):
        return outcome
    if isinstance(outcome, broker_life.InUse):
        raise in_use(
            f"{kind} id {ident} is already registered by a live process at {outcome.holder}; "
            f"pick another --{kind}-id or stop that one"
        )
    # Unreachable and GaveUp are answers only when etcd failures are (not here).
    raise RuntimeError(f"{kind} {ident}: registration ended with {outcome!r}")


async def register_broker(
    store: MetadataStore,
    broker_id: int,
    info: dict[str, Any],
    *,
    ttl_s: int,
    keepalive_interval_s: float | None = None,
    on_lost: OnLost | None = None,
    wait_for_old_lease: bool = False,
) -> Registration:
    """Register broker_id with info (host, port, rack, metrics port) under a fresh lease.

    The lease keeper is running when this returns. With wait_for_old_lease, a key still held
    (by a previous incarnation that died without revoking its lease) is tried again for up to
    the TTL plus a margin (broker_life.register). Raises BrokerIdInUse when a live process
    holds the id, ValueError for a bad TTL/interval or id, CoordinatorUnavailable when etcd
    cannot be reached.
    """
    return await _register_id(
        store,
        store.keys.broker(broker_id),
        info,
        ttl_s=ttl_s,
        lease=LeaseSettings(keepalive_interval_s, on_lost),
        wait_for_old_lease=wait_for_old_lease,
        kind="broker",
        ident=broker_id,
        in_use=BrokerIdInUse,
    )


async def register_gateway(
    store: MetadataStore,
    gateway_id: int,
    info: dict[str, Any],
    *,
    ttl_s: int,
    keepalive_interval_s: float | None = None,
    on_lost: OnLost | None = None,
    wait_for_old_lease: bool = False,
) -> Registration:
    """Register gateway_id with info (host, port) under a fresh lease; as register_broker.

    Raises GatewayIdInUse when a live process already holds the id.
    """
    return await _register_id(
        store,
        store.keys.gateway(gateway_id),
        info,
        ttl_s=ttl_s,
        lease=LeaseSettings(keepalive_interval_s, on_lost),
        wait_for_old_lease=wait_for_old_lease,
        kind="gateway",
        ident=gateway_id,
        in_use=GatewayIdInUse,
    )


class RegistrationLife:
    """One registered process's registration and lease watch: serve()'s asyncio driver of
    coordinator/broker_life.py, the same for a broker and a gateway. Owned by serve():
    `register` once at start, `watch_lease` as a task, `shutting_down` when the process begins
    to stop, `stopped` once closed.

    The first registration waits out the lease of a previous incarnation (broker_life.register);
    a lost lease (a pause past the TTL, an etcd partition, a revoked lease) registers the same
    id with the same info again as a new incarnation (broker_life.reregister); a
    re-registration that does not succeed within LEASE_REREGISTER_TTLS_MAX TTLs stops the
    process. The state moves through `life`'s table (broker_life.ProcessLife).
    """

    def __init__(
        self,
        store: MetadataStore,
        life: broker_life.ProcessLife,
        key: str,
        info: dict[str, Any],
        *,
        ttl_s: int,
        in_use: type[CoordinatorError],
        on_registered: Callable[[Registration], None],
        on_lease_lost: Callable[[], None],
        stop_process: Callable[[], None],
        unregistered_means: str,
        log: logging.Logger,
    ) -> None:
        self.store = store
        self.life = life
        self.key = key
        # Read at every registration: the owner may change it in on_registered (a broker's
        # unclean_shutdown holds for its first registration only).
        self.info = info
        self.ttl_s = ttl_s
        self.in_use = in_use
        self.on_registered = on_registered
        self.on_lease_lost = on_lease_lost
        self.stop_process = stop_process
        # What a process left without a registration means, for the log line when it stops.
        self.unregistered_means = unregistered_means
        self.log = log
        self._registration: Registration | None = None

    @property
    def name(self) -> str:
        return f"{self.life.kind} {self.life.ident}"

    @property
    def registration(self) -> Registration:
        if self._registration is None:
            raise RuntimeError(f"{self.name} is not registered yet ({self.life.state.value})")
        return self._registration

    @property
    def current(self) -> Registration | None:
        """The registration to revoke on close (None before the first one)."""
        return self._registration

    async def register(self) -> Registration:
        """The start-up registration. Raises `in_use` when the id stays held past the old
        lease's TTL and a margin, CoordinatorUnavailable when etcd cannot be reached: the
        process does not start."""
        try:
            registration = await _register_id(
                self.store,
                self.key,
                self.info,
                ttl_s=self.ttl_s,
                lease=LeaseSettings(),
                wait_for_old_lease=True,
                kind=self.life.kind,
                ident=self.life.ident,
                in_use=self.in_use,
            )
        except BaseException:
            self.life.stopped()
            raise
        self._registered(registration)
        return registration

    def _registered(self, registration: Registration) -> None:
        self.life.registered(registration.broker_epoch)
        self._registration = registration
        self.log.info("%s registered with %s epoch %d", self.name, self.life.kind, registration.broker_epoch)
        self.on_registered(registration)

    async def watch_lease(self) -> None:
        """Register again whenever the lease is lost; stop the process if that fails for
        LEASE_REREGISTER_TTLS_MAX TTLs. Ends when the process stops (cancel it)."""
        while True:
            await self.registration.lease.lost.wait()
            if not self.life.lease_lost():
                return
            self.on_lease_lost()
            self.log.warning(
                "%s lost its etcd lease (its key %s is gone or going); registering again as a new "
                "incarnation with the same id and info",
                self.name,
                self.key,
            )
            outcome = await run_registration(
                self.store,
                broker_life.reregister(self.key, self.info, self.ttl_s),
                LeaseSettings(),
                name=self.name,
                etcd_failures_are_answers=True,
            )
            if isinstance(outcome, Registration):
                self._registered(outcome)
                continue
            self.log.error(
                "%s could not register again within %.0f s (last: %s); stopping: %s",
                self.name,
                outcome.deadline_s if isinstance(outcome, broker_life.GaveUp) else 0.0,
                outcome.last if isinstance(outcome, broker_life.GaveUp) else outcome,
                self.unregistered_means,
            )
            self.life.shutting_down()
            self.stop_process()
            return

    def shutting_down(self) -> None:
        self.life.shutting_down()

    def stopped(self) -> None:
        self.life.shutting_down()
        self.life.stopped()


async def revoke_registration_lease(store: MetadataStore, key: str) -> bool:
    """Revoke the lease holding the registration at `key` (a broker's or a gateway's), as etcd
    does when the lease expires: the key goes at once. For tests and operators simulating a
    lost lease. Returns whether a lease was revoked (False: no key, or a key without a lease)."""
    kv = await store.get(key)
    if kv is None or not kv.lease:
        return False
    await store.revoke_lease(kv.lease)
    return True


async def revoke_broker_incarnation(store: MetadataStore, broker_id: int, broker_epoch: int) -> bool:
    """Revoke the lease of broker_id's registration if it is still the incarnation broker_epoch.

    The controller's fast path for a broker whose connection closed (BrokerHeartbeat): its key
    then goes at once, and the controller's watch handles that as a broker failure. Reading the
    key and then revoking its lease cannot hit another incarnation: the lease revoked is the one
    the key of this incarnation names, and a re-registered broker holds a lease of its own.
    Returns whether a lease was revoked (False: the key is gone or names another incarnation).
    """
    kv = await store.get(store.keys.broker(broker_id))
    if kv is None or kv.create_revision != broker_epoch or not kv.lease:
        return False
    await store.revoke_lease(kv.lease)
    return True
