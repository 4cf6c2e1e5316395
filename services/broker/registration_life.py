"""The broker process's registration life: serve()'s asyncio driver of coordinator/broker_life.py.

The first registration waits out the lease of a previous incarnation (broker_life.register);
a lost lease (a pause past the TTL, etcd expired it) registers again as a new incarnation
with a new broker epoch (broker_life.reregister), so requests meant for the old one are
fenced; a re-registration that does not succeed within LEASE_REREGISTER_TTLS_MAX TTLs stops
the process (without a registration the controller ignores it). The state moves through
broker_life.BrokerLife's table; the simulation drives the same rules (tests/sim/sim_broker.py).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from coordinator import broker_life
from coordinator.registration import LeaseSettings, Registration, register_broker, run_registration
from coordinator.store import MetadataStore

log = logging.getLogger("highwater.broker")


class BrokerRegistrationLife:
    """One broker process's registration and lease watch. Owned by serve(): `register` once at
    start, `watch_lease` as a task, `shutting_down` when the process begins to stop."""

    def __init__(
        self,
        store: MetadataStore,
        broker_id: int,
        info: dict[str, Any],
        *,
        ttl_s: int,
        on_registered: Callable[[Registration], None],
        stop_process: Callable[[], None],
    ) -> None:
        self.store = store
        self.broker_id = broker_id
        # Mutable: only the first registration says whether the previous run shut down uncleanly.
        self.info = info
        self.ttl_s = ttl_s
        self.on_registered = on_registered
        self.stop_process = stop_process
        self.life = broker_life.BrokerLife(broker_id)
        self._registration: Registration | None = None

    @property
    def registration(self) -> Registration:
        if self._registration is None:
            raise RuntimeError(f"broker {self.broker_id} is not registered yet ({self.life.state.value})")
        return self._registration

    @property
    def current(self) -> Registration | None:
        """The registration to revoke on close (None before the first one)."""
        return self._registration

    async def register(self) -> Registration:
        """The start-up registration. Raises BrokerIdInUse when the id stays held past the old
        lease's TTL and a margin, CoordinatorUnavailable when etcd cannot be reached: the
        process does not start."""
        try:
            registration = await register_broker(
                self.store, self.broker_id, self.info, ttl_s=self.ttl_s, wait_for_old_lease=True
            )
        except BaseException:
            self.life.stopped()
            raise
        self._registered(registration)
        return registration

    def _registered(self, registration: Registration) -> None:
        self.life.registered(registration.broker_epoch)
        self._registration = registration
        log.info("broker %d registered with broker epoch %d", self.broker_id, registration.broker_epoch)
        # A later registration of this process (the lease was lost) lost nothing on disk since.
        self.info["unclean_shutdown"] = False
        self.on_registered(registration)

    async def watch_lease(self) -> None:
        """Register again whenever the lease is lost; stop the process if that fails for
        LEASE_REREGISTER_TTLS_MAX TTLs. Ends when the process stops (cancel it)."""
        while True:
            await self.registration.lease.lost.wait()
            if not self.life.lease_lost():
                return
            log.warning(
                "broker %d lost its etcd lease; registering again as a new incarnation", self.broker_id
            )
            key = self.store.keys.broker(self.broker_id)
            outcome = await run_registration(
                self.store,
                broker_life.reregister(key, self.info, self.ttl_s),
                LeaseSettings(),
                name=f"broker {self.broker_id}",
                etcd_failures_are_answers=True,
            )
            if isinstance(outcome, Registration):
                self._registered(outcome)
                continue
            log.error(
                "broker %d could not register again within %.0f s (last: %s); stopping: "
                "without a registration the controller ignores this broker",
                self.broker_id,
                outcome.deadline_s if isinstance(outcome, broker_life.GaveUp) else 0.0,
                outcome.last if isinstance(outcome, broker_life.GaveUp) else outcome,
            )
            self.life.shutting_down()
            self.stop_process()
            return

    def shutting_down(self) -> None:
        self.life.shutting_down()

    def stopped(self) -> None:
        self.life.shutting_down()
        self.life.stopped()
